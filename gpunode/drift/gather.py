"""Gather one fact from every host of an inventory in parallel, through pyinfra.

Hosts that cannot be reached, that stop answering mid-check, that answer more than the
check reads or not in time (``HOST_LIMITS``, enforced while reading: gpunode.remote_script,
and a deadline per host around the whole of it) are recorded with the reason and the others
are still gathered: a nightly check must not lose the fleet to one node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gevent
from pyinfra.api import Config, State, StringCommand
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.api.facts import get_fact
from pyinfra.context import ctx_host, ctx_state

from gpunode import pyinfra_patches, remote_script, ssh_kex
from gpunode.reach import detect_dead_peer
from gpunode.remote_script import Limits, NodeOutputRefused

# What one host's answer may be. A node's whole fact set is some 50 kB in 700 lines, a few
# hundred kB with 8 GPUs (the GPU probe's JSON, about 100 kB, is its longest line): 8 MiB
# and 200 000 lines are read, no more, so 64 hosts read at once fit the drift unit's
# MemoryMax (gpunode.expected.timers.DRIFT_MEMORY_MAX_MIB, measured: bench/drift_memory.py).
# A node on a slow disk or a loaded CPU answers in tens of seconds; one that has not after
# five minutes is not going to.
HOST_LIMITS = Limits(max_bytes=8 << 20, max_lines=200_000, deadline_s=300)
# Beyond the read's deadline: the login, sudo, the channel's opening and its closing.
CONNECT_GRACE_S = 60


def make_state(inventory: Any, parallel: int = 64, connect_timeout: int = 10) -> State:
    # A hardened Debian 13 node speaks post-quantum key exchanges only.
    ssh_kex.install()
    config = Config(PARALLEL=parallel, CONNECT_TIMEOUT=connect_timeout)
    state = State(inventory, config)
    return state


class FactCommandFailed(RuntimeError):
    pass


def read_fact(
    state: State,
    host: Any,
    fact: type,
    fact_kwargs: dict[str, Any],
    limits: Limits = HOST_LIMITS,
) -> Any:
    """The fact's value on ``host``, its command sent on stdin (gpunode.remote_script: the
    drift check's command is ~100 kB, which sudo would log in some two hundred pieces) and its
    answer read within ``limits`` (NodeOutputRefused past them). A fact that requires a
    program is read by pyinfra itself (its check of the program)."""
    instance = fact()
    own_kwargs, global_kwargs = pyinfra_patches.fact_arguments(
        state, host, fact, None, dict(fact_kwargs)
    )
    own_kwargs = {name: value for name, value in own_kwargs.items() if name != "self"}
    if pyinfra_patches.make_command(instance.requires_command, own_kwargs):
        return get_fact(state, host, fact, kwargs=fact_kwargs, apply_failed_hosts=False)
    made = pyinfra_patches.make_command(instance.command, own_kwargs)
    script = made.get_raw_value() if isinstance(made, StringCommand) else str(made)
    connector = {k: v for k, v in global_kwargs.items() if k in CONNECTOR_ARGUMENT_KEYS}
    output = remote_script.run(
        host,
        script,
        connector,
        limits,
        print_input=state.print_fact_input,
        print_output=state.print_fact_output,
    )
    if output.exit_status != 0:
        detail = " ".join(output.stderr_lines[:3])[:300]
        raise FactCommandFailed(f"the fact command failed: {detail or 'no message'}")
    lines = output.stdout_lines
    return instance.process(lines) if lines else instance.default()


def gather_fact(
    state: State,
    fact: type,
    hosts: list[Any],
    progress: Callable[[str], None] | None = None,
    limits: Limits = HOST_LIMITS,
    **fact_kwargs: Any,
) -> tuple[dict[str, Any], dict[str, str]]:
    """({host: fact value}, {host: why it could not be checked}). Each host has
    ``limits.deadline_s`` (plus CONNECT_GRACE_S for its login) from its start: one that
    stalls anywhere, the login included, is not checked and the others go on."""
    values: dict[str, Any] = {}
    unreachable: dict[str, str] = {}
    host_deadline_s = limits.deadline_s + CONNECT_GRACE_S

    def check(host: Any) -> None:
        deadline = gevent.Timeout(host_deadline_s)
        deadline.start()
        with ctx_state.use(state), ctx_host.use(host):
            try:
                host.connect(show_errors=False, raise_exceptions=True)
                detect_dead_peer(host)  # a node that stops answering fails, never hangs
                values[host.name] = read_fact(state, host, fact, fact_kwargs, limits)
            except gevent.Timeout as error:
                if error is not deadline:
                    raise
                unreachable[host.name] = f"no whole answer within {host_deadline_s:g} s"
            except NodeOutputRefused as error:
                unreachable[host.name] = str(error)
            except Exception as error:  # every failure is reported per host, never fatal
                unreachable[host.name] = f"{type(error).__name__}: {error}".strip()
            finally:
                deadline.close()
                if host.connected:
                    _disconnect(host)
                if progress is not None:
                    progress(host.name)

    greenlets = [state.pool.spawn(check, host) for host in hosts]
    gevent.joinall(greenlets)
    for host in hosts:
        if host.name not in values and host.name not in unreachable:
            unreachable[host.name] = "no answer"
    return values, unreachable


def _disconnect(host: Any) -> None:
    """Close ``host``'s connection within CONNECT_GRACE_S: a stalled node may not take even
    the close (its value or why it was not checked is recorded already)."""
    try:
        with gevent.Timeout(CONNECT_GRACE_S):
            host.disconnect()
    except (gevent.Timeout, Exception):  # the node is reported already; nothing to add
        pass

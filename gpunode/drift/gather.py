"""Gather one fact from every host of an inventory in parallel, through pyinfra.

Hosts that cannot be reached, or that stop answering mid-check, are recorded with the reason
and the others are still gathered: a nightly check must not lose the fleet to one node.
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


def make_state(inventory: Any, parallel: int = 64, connect_timeout: int = 10) -> State:
    # A hardened Debian 13 node speaks post-quantum key exchanges only.
    ssh_kex.install()
    config = Config(PARALLEL=parallel, CONNECT_TIMEOUT=connect_timeout)
    state = State(inventory, config)
    return state


class FactCommandFailed(RuntimeError):
    pass


def read_fact(state: State, host: Any, fact: type, fact_kwargs: dict[str, Any]) -> Any:
    """The fact's value on ``host``, its command sent on stdin (gpunode.remote_script: the
    drift check's command is ~100 kB, which sudo would log in some two hundred pieces). A
    fact that requires a program is read by pyinfra itself (its check of the program)."""
    instance = fact()
    own_kwargs, global_kwargs = pyinfra_patches.fact_arguments(
        state, host, fact, None, dict(fact_kwargs)
    )
    own_kwargs = {name: value for name, value in own_kwargs.items() if name != "self"}
    if pyinfra_patches.make_command(instance.requires_command, own_kwargs):
        return get_fact(state, host, fact, kwargs=fact_kwargs, apply_failed_hosts=False)
    made = pyinfra_patches.make_command(instance.command, own_kwargs)
    script = made.get_raw_value() if isinstance(made, StringCommand) else str(made)
    command, stdin = remote_script.script_command(script)
    connector = {k: v for k, v in global_kwargs.items() if k in CONNECTOR_ARGUMENT_KEYS}
    connector["_stdin"] = stdin
    ok, output = host.run_shell_command(
        command,
        print_output=state.print_fact_output,
        print_input=state.print_fact_input,
        **connector,
    )
    if not ok:
        detail = " ".join(output.stderr_lines[:3])[:300] if output else ""
        raise FactCommandFailed(f"the fact command failed: {detail or 'no message'}")
    lines = output.stdout_lines
    return instance.process(lines) if lines else instance.default()


def gather_fact(
    state: State,
    fact: type,
    hosts: list[Any],
    progress: Callable[[str], None] | None = None,
    **fact_kwargs: Any,
) -> tuple[dict[str, Any], dict[str, str]]:
    """({host: fact value}, {host: why it could not be checked})."""
    values: dict[str, Any] = {}
    unreachable: dict[str, str] = {}

    def check(host: Any) -> None:
        with ctx_state.use(state), ctx_host.use(host):
            try:
                host.connect(show_errors=False, raise_exceptions=True)
                detect_dead_peer(host)  # a node that stops answering fails, never hangs
                values[host.name] = read_fact(state, host, fact, fact_kwargs)
            except Exception as error:  # every failure is reported per host, never fatal
                unreachable[host.name] = f"{type(error).__name__}: {error}".strip()
            finally:
                if host.connected:
                    host.disconnect()
                if progress is not None:
                    progress(host.name)

    greenlets = [state.pool.spawn(check, host) for host in hosts]
    gevent.joinall(greenlets)
    for host in hosts:
        if host.name not in values and host.name not in unreachable:
            unreachable[host.name] = "no answer"
    return values, unreachable

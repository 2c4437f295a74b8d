"""Gather one fact from every host of an inventory in parallel, through pyinfra.

Hosts that cannot be reached, or that stop answering mid-check, are recorded with the reason
and the others are still gathered: a nightly check must not lose the fleet to one node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gevent
from pyinfra.api import Config, State
from pyinfra.api.facts import get_fact
from pyinfra.context import ctx_host, ctx_state

from gpunode import ssh_kex
from gpunode.reach import detect_dead_peer


def make_state(inventory: Any, parallel: int = 64, connect_timeout: int = 10) -> State:
    # A hardened Debian 13 node speaks post-quantum key exchanges only.
    ssh_kex.install()
    config = Config(PARALLEL=parallel, CONNECT_TIMEOUT=connect_timeout)
    state = State(inventory, config)
    return state


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
                values[host.name] = get_fact(
                    state, host, fact, kwargs=fact_kwargs, apply_failed_hosts=False
                )
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

"""One line at the end of a deploy that names every node that failed, and where.

pyinfra reports a host's failure where it happens, somewhere in a long log, and its exit
code says only that something failed. An operator running against a fleet wants the list:
which nodes, at which operation, so that a re-run with ``--limit`` can follow.
"""

from __future__ import annotations

import atexit
import sys
from typing import Any

from pyinfra.api.state import BaseStateCallback

_failed_at: dict[str, str] = {}
_states: list[Any] = []


def record_failure(host_name: str, where: str) -> None:
    """Note why a host failed where no pyinfra callback sees it (a refusal while preparing)."""
    _failed_at.setdefault(host_name, where)


class FailureRecorder(BaseStateCallback):
    @staticmethod
    def operation_host_error(
        state: Any, host: Any, op_hash: Any, retry_count: int = 0, max_retries: int = 0
    ) -> None:
        names = sorted(state.get_op_meta(op_hash).names)
        _failed_at.setdefault(host.name, f"at {', '.join(names) or 'an operation'}")

    @staticmethod
    def host_connect_error(state: Any, host: Any, error: Any) -> None:
        _failed_at.setdefault(host.name, f"could not connect: {error}")


def summary_line(failed: list[str], total: int, failed_at: dict[str, str]) -> str | None:
    if not failed:
        return None
    details = "; ".join(f"{name} ({failed_at.get(name, 'failed')})" for name in sorted(failed))
    return (
        f"gpunode: {len(failed)} of {total} host(s) failed: {details}. "
        f"Re-run them with --limit {','.join(sorted(failed))}"
    )


def _print_summary() -> None:
    for state in _states:
        failed = [host.name for host in state.failed_hosts]
        total = state.inventory.len_activated_hosts() or len(state.inventory)
        line = summary_line(failed, total, _failed_at)
        if line:
            print(line, file=sys.stderr)


def install(state: Any) -> None:
    """Record failures of this run and print the summary when the process ends (once)."""
    if state in _states:
        return
    if not _states:
        atexit.register(_print_summary)
    _states.append(state)
    state.add_callback_handler(FailureRecorder())

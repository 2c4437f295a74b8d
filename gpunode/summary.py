"""One line at the end of a deploy that names every node that failed, and why.

pyinfra reports a host's failure where it happens, somewhere in a long log, and its exit
code says only that something failed. An operator running against a fleet wants the list:
which nodes, and why (could not connect, refused, failed at which operation), counted
against every host of the run, so that a re-run with ``--limit`` can follow.
"""

from __future__ import annotations

import atexit
import sys
from typing import Any

from pyinfra.api.state import BaseStateCallback

from gpunode.control.exits import plural

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
        _failed_at.setdefault(host.name, f"failed at operation {', '.join(names) or '?'}")

    @staticmethod
    def host_connect_error(state: Any, host: Any, error: Any) -> None:
        _failed_at.setdefault(host.name, f"could not connect: {error}")


def summary_line(
    failed: list[str], total: int, failed_at: dict[str, str], inventory_total: int | None = None
) -> str | None:
    """``failed`` of the ``total`` hosts this run was for, each with why; ``inventory_total``:
    the inventory's hosts where ``--limit`` chose fewer."""
    if not failed:
        return None
    details = "; ".join(f"{name} ({failed_at.get(name, 'failed')})" for name in sorted(failed))
    counted = f"{len(failed)} of {plural(total, 'host')}"
    if inventory_total is not None and inventory_total != total:
        counted += f" in this run ({inventory_total} in the inventory)"
    return (
        f"gpunode: {counted} failed: {details}. Re-run them with --limit {','.join(sorted(failed))}"
    )


def failure_reasons(state: Any) -> dict[str, str]:
    """Why each failed host of ``state`` failed. A host that failed to connect did so before
    any deploy file (and so this module's callback) was loaded: pyinfra logged its error
    where it happened, and here it is named for what it is."""
    reasons = {}
    for host in state.failed_hosts:
        reason = _failed_at.get(host.name)
        if reason is None:
            reason = "could not connect; its error is above" if not host.connected else "failed"
        reasons[host.name] = reason
    return reasons


def dry_line(host_name: str, operations: list[Any]) -> str:
    """One line per host of a ``--dry`` run: what will change, what might and why, so that
    "nothing to do" shows at a glance (``operations``: pyinfra_patches.PredictedOperation)."""
    will = [op for op in operations if op.change]
    might = [op for op in operations if op.change is None]
    waiting = [op for op in operations if op.conditional and op.change is False]
    if not will and not might:
        line = f"gpunode --dry: {host_name}: nothing will change"
        if waiting:
            line += (
                f" ({plural(len(waiting), 'conditional operation')} whose condition, an "
                "earlier change, will not come)"
            )
        return line
    parts = []
    if will:
        names = "; ".join(
            op.name + (" (its condition: an earlier change)" if op.conditional else "")
            for op in will
        )
        parts.append(f"{plural(len(will), 'operation')} will change: {names}")
    if might:
        names = "; ".join(op.name for op in might)
        parts.append(f"{len(might)} might, depending on what the run finds: {names}")
    return f"gpunode --dry: {host_name}: " + "; and ".join(parts)


def _is_dry_run() -> bool:
    """Whether the running pyinfra command was given --dry (read as inventory.py reads the
    inventory argument: pyinfra's own parser on the command line, no side effects)."""
    from pyinfra_cli.cli import cli

    try:
        context = cli.make_context("pyinfra", sys.argv[1:], resilient_parsing=True)
    except Exception:  # an embedding program's argv need not be pyinfra's
        return False
    return bool(context.params.get("dry"))


def _print_dry_summary(state: Any) -> None:
    from gpunode import pyinfra_patches

    failed = {host.name for host in state.failed_hosts}
    for host in state.inventory.iter_activated_hosts():
        if host.name not in failed:
            # stderr, as pyinfra's own log: stdout may be pyinfra's --json plan
            line = dry_line(host.name, pyinfra_patches.predicted_operations(state, host))
            print(line, file=sys.stderr)


def _print_summary() -> None:
    for state in _states:
        if not state.is_executing and _is_dry_run():
            _print_dry_summary(state)
        failed = [host.name for host in state.failed_hosts]
        inventory = list(state.inventory)
        in_run = [host for host in inventory if state.is_host_in_limit(host)]
        line = summary_line(failed, len(in_run), failure_reasons(state), len(inventory))
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

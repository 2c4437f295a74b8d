"""A node that cannot be converged fails alone, with a clear message; the others go on.

pyinfra ends the whole run, every host with it, on an exception from one host: an
OperationError while it executes, any error while it prepares. For a fleet that is wrong when
the cause is the node's own state (it is locked, its mirror is down, it lacks a declared
interface or drive, a change would cut its SSH login): that node must fail, be named in the
summary, and the others must finish. Three means, one outcome:

- ``refusal(message)``: an operation's command that prints the message on stderr, where
  pyinfra shows it under the host's name, and exits non-zero.
- ``NodeRefused``: raised by a role while pyinfra prepares; inside
  ``refusals_fail_this_node`` the node leaves the active hosts before any of its operations
  has run.
- ``install_per_node_failures()``: an OperationError raised by one host's operation while
  pyinfra executes fails that host at that operation, as a failed command would.

Validation of the inventory is not a node's refusal: it still stops every host before any is
touched.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any

import pyinfra.api.operations as pyinfra_operations
from pyinfra.api import DeployError, OperationError, StringCommand
from pyinfra.connectors.util import CommandOutput
from pyinfra.context import ctx_host, ctx_state

from gpunode import summary

REFUSED_EXIT = 75  # EX_TEMPFAIL: nothing was done, try again once the cause is gone
NOTHING_CHANGED = "Nothing was changed."

logger = logging.getLogger("pyinfra")


def refusal(message: str) -> StringCommand:
    return StringCommand(f"echo {shlex.quote(message)} >&2; exit {REFUSED_EXIT}")


class NodeRefused(DeployError):
    """This node's own state forbids the declared change; the message says why and what to do."""


def _log_for_host(node: Any, message: str) -> None:
    for line in message.splitlines():
        logger.error(f"{node.print_prefix}{line}")


@contextmanager
def refusals_fail_this_node() -> Iterator[None]:
    """Around a deploy's roles: a refusal while preparing fails this node alone.

    The node leaves pyinfra's active hosts, so none of its operations, including those
    already prepared, is executed: nothing is changed on it. The run's exit code is 1 and the
    summary names the node. pyinfra's own "No hosts remaining!" ends the run when every node
    is refused.
    """
    try:
        yield
    except (NodeRefused, OperationError) as error:
        message = str(error)
        if not re.search(r"nothing (was )?changed", message, re.IGNORECASE):
            message += f"\n{NOTHING_CHANGED}"
        node = ctx_host.get()  # the Host itself: pyinfra's context proxy is not a set member
        _log_for_host(node, message)
        summary.record_failure(node.name, "refused before any change")
        ctx_state.get().fail_hosts({node})


def _failing_only_this_host(run_host_op: Callable[..., bool]) -> Callable[..., bool]:
    @wraps(run_host_op)
    def run(current: Any, node: Any, op_hash: str) -> bool:
        try:
            return run_host_op(current, node, op_hash)
        except OperationError as error:
            # What pyinfra records for an operation whose command failed.
            _log_for_host(node, str(error))
            current.get_results_for_host(node).error_ops += 1
            meta = current.get_op_data_for_host(node, op_hash).operation_meta
            if not meta.is_complete():
                meta.set_complete(False, [], CommandOutput([]))
            current.trigger_callbacks("operation_host_error", node, op_hash)
            return False

    run.gpunode_wrapped = True  # type: ignore[attr-defined]
    return run


def install_per_node_failures() -> None:
    """An operation that raises OperationError while executing fails its host only (idempotent)."""
    current = pyinfra_operations._run_host_op
    if not getattr(current, "gpunode_wrapped", False):
        pyinfra_operations._run_host_op = _failing_only_this_host(current)

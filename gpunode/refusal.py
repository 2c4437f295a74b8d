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
  has run. Its message is the role's reason followed by NOTHING_CHANGED; an OperationError
  raised while preparing gets the same last line there. No role says it itself.
- ``install_per_node_failures()``: an OperationError raised by one host's operation while
  pyinfra executes fails that host at that operation, as a failed command would.

Validation of the inventory is not a node's refusal: it still stops every host before any is
touched. How pyinfra is patched for this lives in gpunode.pyinfra_patches.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any

from pyinfra.api import DeployError, OperationError, StringCommand
from pyinfra.context import ctx_host, ctx_state

from gpunode import pyinfra_patches, summary

REFUSED_EXIT = 75  # EX_TEMPFAIL: nothing was done, try again once the cause is gone
# The last line of every refusal while pyinfra prepares: the node left before anything ran.
NOTHING_CHANGED = "Nothing was changed."

logger = logging.getLogger("pyinfra")


def refusal(message: str) -> StringCommand:
    return StringCommand(f"echo {shlex.quote(message)} >&2; exit {REFUSED_EXIT}")


class NodeRefused(DeployError):
    """This node's own state forbids the declared change; ``reason`` says why and what to do.

    The message is the reason and, on a line of its own, NOTHING_CHANGED.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason}\n{NOTHING_CHANGED}")
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[str]]:  # a copy says it once too
        return type(self), (self.reason,)


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
    except NodeRefused as error:
        _fail_this_node(str(error))
    except OperationError as error:
        _fail_this_node(f"{error}\n{NOTHING_CHANGED}")


def _fail_this_node(message: str) -> None:
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
            _log_for_host(node, str(error))
            pyinfra_patches.record_failed_operation(current, node, op_hash)
            return False

    return run


def install_per_node_failures() -> None:
    """An operation that raises OperationError while executing fails its host only (idempotent)."""
    pyinfra_patches.wrap_run_host_op(_failing_only_this_host)

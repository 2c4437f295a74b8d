"""How every deploy starts and ends on a node, in one place."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from gpunode import factcache, pyinfra_patches
from gpunode.inventory import desired_state
from gpunode.model import DesiredState
from gpunode.refusal import refusals_fail_this_node
from gpunode.run_lock import node_run_lock


@contextmanager
def converging(
    early: Callable[[DesiredState], None] | None = None,
) -> Iterator[DesiredState]:
    """This node's validated desired state, for the roles of a deploy.

    Facts are cached for the run, the whole inventory is validated (one bad host stops every
    host), the node's run lock is taken before any role reads or changes it, and a node a role
    refuses fails alone, before anything changes on it. ``early`` is called with the desired
    state before the node is first read (work a role will wait for, started sooner).
    """
    factcache.install()
    pyinfra_patches.replace_operation_order()
    pyinfra_patches.remember_global_arguments()
    desired = desired_state()
    if early is not None:
        early(desired)
    node_run_lock()
    with refusals_fail_this_node():
        yield desired

"""How every deploy starts and ends on a node, in one place."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from pyinfra import host
from pyinfra.api import DeployError

from gpunode import factcache, pyinfra_patches, ssh_kex
from gpunode.distributions import (
    Architecture,
    Distribution,
    UnsupportedNode,
    fill_url,
    platform_of,
)
from gpunode.inventory import desired_state
from gpunode.model import DesiredState
from gpunode.reach import detect_dead_peer
from gpunode.refusal import NodeRefused, refusals_fail_this_node
from gpunode.run_lock import node_run_lock


class RefusedNode:
    """Stands in for the desired state of a node refused before its roles run: the first
    role that reads it raises the refusal, inside ``refusals_fail_this_node``, so that the
    deploy file's roles end there for this node alone and nothing is read beyond its release
    or changed on it (a ``with`` body cannot be skipped; an exception from entering it would
    end the run for every node)."""

    def __init__(self, reason: str) -> None:
        self._reason = reason

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and friends probe for these
            raise AttributeError(name)
        raise NodeRefused(self._reason)


def for_platform(
    desired: DesiredState, distribution: Distribution, architecture: Architecture
) -> DesiredState:
    """``desired`` for a node of this release and architecture: the NVIDIA repository URLs'
    ``{distro}`` / ``{arch}`` / ``{dpkg_arch}`` filled in (a URL naming another release is
    refused: UnsupportedNode, as is a driver source the release does not offer, e.g. the
    ubuntu source on Debian, and a pin of Debian's driver that this release does not ship)."""
    driver = desired.nvidia_driver
    if driver.source != "none" and driver.source not in distribution.driver_sources:
        raise UnsupportedNode(
            f"nvidia_driver.source is {driver.source!r}, which {distribution.pretty_name} "
            f"does not offer; use one of {', '.join(distribution.driver_sources)} for this node"
        )
    pinned = driver.branch or (driver.driver_version or "").split(".")[0] or None
    if driver.source == "debian" and pinned not in (None, distribution.distribution_driver_branch):
        raise UnsupportedNode(
            f"nvidia_driver.source is 'debian' and pins branch {pinned}, but "
            f"{distribution.pretty_name} ships Debian's driver branch "
            f"{distribution.distribution_driver_branch}; pin that branch for this node, or "
            "use source: nvidia"
        )
    apt = desired.apt
    filled = dataclasses.replace(
        apt,
        cuda_repo_url=fill_url(apt.cuda_repo_url, distribution, architecture),
        container_toolkit_repo_url=fill_url(
            apt.container_toolkit_repo_url, distribution, architecture
        ),
    )
    return dataclasses.replace(desired, apt=filled)


def this_node() -> tuple[Distribution, Architecture]:
    """This node's release and architecture (its NodeOs fact, read once per run)."""
    from facts.node import NodeOs

    return platform_of(host.get_fact(NodeOs))


def checkout_config_unread() -> str | None:
    """Why this run lacks what the checkout's ``config.py`` sets, or None when pyinfra read
    it. pyinfra 3 reads ``config.py`` from its working directory (``--chdir``, or the
    directory it was started in), never from beside the deploy file: run from elsewhere, it
    connects without the key exchange Debian 13's hardened sshd requires and uploads through
    a temporary directory libpam-tmpdir makes unwritable."""
    from pyinfra import config

    if ssh_kex.installed() and config.TEMP_DIR is not None:
        return None
    checkout = Path(__file__).resolve().parents[1]
    return (
        f"pyinfra did not read {checkout / 'config.py'}: it reads config.py from its working "
        f"directory ({Path.cwd()}); run pyinfra in {checkout}, or give it "
        f"--chdir {checkout} (paths then relative to it) or --config {checkout / 'config.py'}. "
        "Nothing was changed"
    )


@contextmanager
def converging() -> Iterator[DesiredState]:
    """This node's validated desired state, for the roles of a deploy.

    Facts are cached for the run, the whole inventory is validated (one bad host stops every
    host), the node's operating system must be one gpunode supports (else the node alone is
    refused, before anything is read beyond its release or changed on it), the node's run
    lock is taken before any role reads or changes it, and a node a role refuses fails alone,
    before anything changes on it. The desired state handed to the roles is this node's: the
    repository URLs name its release and architecture. A run without the checkout's
    ``config.py`` stops here, before any node is read or changed.
    """
    unread = checkout_config_unread()
    if unread is not None:
        raise DeployError(unread)
    factcache.install()
    pyinfra_patches.replace_operation_order()
    pyinfra_patches.remember_global_arguments()
    desired = desired_state()
    # Before the first read of the node: the fact cache reads everything the run needs in
    # that one command (its GPUs too), and a node that stops answering must fail, not hang.
    detect_dead_peer(host)
    try:
        on_node = for_platform(desired, *this_node())
    except UnsupportedNode as error:
        with refusals_fail_this_node():
            yield cast(DesiredState, RefusedNode(f"{host.name}: not converged: {error}"))
        return
    node_run_lock()
    with refusals_fail_this_node():
        yield on_node

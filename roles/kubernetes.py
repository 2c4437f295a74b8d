"""A node prepared to join a Kubernetes cluster as a GPU worker (``kubernetes``).

gpunode prepares the host; it installs no cluster, joins nothing and runs no kubelet
configuration. What results where ``kubernetes.enabled``:

* cgroup v2 (the unified hierarchy at /sys/fs/cgroup): read, never changed. A node on v1 or
  the hybrid layout is refused before anything changes on it (changing it takes a kernel
  command line and a reboot, which is the operator's call).
* Swap off: active swap that /etc/fstab does not declare (a ``swapon`` by hand) is turned off
  with ``swapoff -a``. Swap that /etc/fstab declares is refused, naming the entries: editing
  fstab is the operator's call, and kubelet refuses to start with swap on by default.
* ``overlay`` and ``br_netfilter`` loaded now and at every boot
  (``/etc/modules-load.d/gpunode-kubernetes.conf``), before the kernel role applies the
  bridge sysctls (``kubernetes_host`` runs before the hardening roles).
* The sysctls (forwarding, bridged traffic through iptables) and the forward chain of
  gpunode's nftables table come from the model (``DesiredState.ip_forward``,
  ``DesiredState.forward_networks``), written by the kernel and firewall roles.
* containerd with the NVIDIA runtime and CDI: the container toolkit role, which validation
  requires to be declared (``container_runtime.engines`` with containerd, ``cdi: true``).
* ``kubernetes.packages`` from ``kubernetes.repository_url`` (signed by
  ``kubernetes.repository_keyring``), at ``kubernetes.version`` where pinned, held where
  ``kubernetes.hold``.
"""

from __future__ import annotations

import shlex
from io import StringIO
from typing import Any

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.operations import apt, files

from facts.container_runtime import DpkgPackageState
from facts.kubernetes import KubernetesNode
from gpunode.expected import kubernetes as expected
from gpunode.model import DesiredState
from gpunode.refusal import NodeRefused
from roles.nvidia_driver import APT_INSTALL
from roles.nvidia_repos import NvidiaRepository, _local_keyring


def refusal_reason(state: dict[str, Any]) -> str | None:
    """Why this node cannot be prepared as it is, or None."""
    if state["cgroup"] != "v2":
        found = state["cgroup"] or "unknown"
        return (
            f"kubernetes.enabled: the node runs cgroup {found}, not the unified v2 hierarchy "
            "that kubelet's and containerd's systemd cgroup driver expect; boot it with "
            "systemd.unified_cgroup_hierarchy=1 (Debian 11+ and Ubuntu 22.04+ default to "
            "v2), then run again"
        )
    if state["fstab_swap"]:
        entries = ", ".join(state["fstab_swap"])
        return (
            f"kubernetes.enabled: /etc/fstab declares swap ({entries}): kubelet does not start "
            "with swap on by default, and gpunode does not edit fstab; remove or comment out "
            "those lines (and swapoff them), then run again"
        )
    return None


@operation()
def swap_off():
    """No swap is active (swap fstab declares was refused before: ``refusal_reason``)."""
    active = host.get_fact(KubernetesNode)["swap_active"]
    if not active:
        host.noop("no swap active")
        return
    yield "swapoff -a"


@operation()
def modules_loaded():
    """overlay and br_netfilter are loaded (or built in)."""
    loaded = set(host.get_fact(KubernetesNode)["modules"])
    missing = [module for module in expected.KUBERNETES_MODULES if module not in loaded]
    if not missing:
        host.noop(f"{' and '.join(expected.KUBERNETES_MODULES)} loaded")
        return
    for module in missing:
        yield f"modprobe {shlex.quote(module)}"


@operation()
def packages_installed(packages: tuple[str, ...], version: str | None = None, hold: bool = True):
    """The Kubernetes packages are installed (at ``version`` where pinned) and held if asked.

    + packages: kubelet, kubeadm, kubectl (``kubernetes.packages``)
    + version: the apt version every package is pinned to, or None for the repository's newest
    + hold: apt-mark hold them, as the NVIDIA stack is held
    """
    states = host.get_fact(DpkgPackageState, packages=list(packages))
    wrong = [
        name for name in packages
        if states[name]["installed"] is None
        or (version is not None and states[name]["installed"] != version)
    ]  # fmt: skip
    if wrong:
        pinned = [f"{name}={version}" if version else name for name in wrong]
        yield f"{APT_INSTALL} " + " ".join(shlex.quote(word) for word in pinned)
    unheld = [name for name in packages if hold and (name in wrong or not states[name]["held"])]
    if unheld:
        yield "apt-mark hold " + " ".join(shlex.quote(name) for name in unheld)
    if not wrong and not unheld:
        host.noop(f"{', '.join(packages)} installed" + (" and held" if hold else ""))


def repository(desired: DesiredState) -> NvidiaRepository:
    """The declared Kubernetes repository, as apt's other flat repositories are written."""
    wanted = desired.kubernetes
    return NvidiaRepository(
        expected.REPOSITORY_NAME, wanted.repository_url or "", wanted.repository_keyring,
        "kubernetes.repository_keyring", "kubernetes.repository_url", bool(wanted.packages),
    )  # fmt: skip


@deploy("Kubernetes worker: host")
def kubernetes_host(desired: DesiredState) -> None:
    """Before the hardening roles: the modules the bridge sysctls need, swap, cgroup v2."""
    if not desired.kubernetes.enabled:
        return
    reason = refusal_reason(host.get_fact(KubernetesNode))
    if reason:
        raise NodeRefused(reason)
    files.put(
        name=f"{expected.MODULES_LOAD_PATH}: overlay and br_netfilter at boot",
        src=StringIO(expected.render_modules_load()),
        dest=expected.MODULES_LOAD_PATH,
        mode="644",
        user="root",
        group="root",
    )
    modules_loaded(name="overlay and br_netfilter loaded")
    swap_off(name="Swap off (kubelet)")


@deploy("Kubernetes worker: packages")
def kubernetes_packages(desired: DesiredState) -> None:
    """After the container toolkit: the declared Kubernetes packages from their repository."""
    wanted = desired.kubernetes
    source = repository(desired)
    if not (wanted.enabled and wanted.packages):
        files.file(
            name="No Kubernetes package source (none declared)", path=source.sources_path,
            present=False,
        )  # fmt: skip
        return
    keyring = files.put(
        name=f"{source.name} signing keyring", src=str(_local_keyring(source)),
        dest=source.keyring_path, mode="644",
    )  # fmt: skip
    sources = files.put(
        name=f"{source.name} source (kubernetes.repository_url)",
        src=StringIO(source.render_sources()), dest=source.sources_path, mode="644",
    )  # fmt: skip
    apt.update(
        name="Refresh package lists after the Kubernetes source changed",
        _if=lambda: keyring.did_change() or sources.did_change(),
    )
    packages_installed(
        name=f"{', '.join(wanted.packages)} from kubernetes.repository_url",
        packages=tuple(wanted.packages), version=wanted.version, hold=wanted.hold,
    )  # fmt: skip

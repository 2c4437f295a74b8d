"""What ``kubernetes`` means on a node: the modules loaded at boot, the sysctls, the package
repository's name, and the checks the role and the drift rules share.

Used by ``roles.kubernetes`` (which writes them), ``facts.kubernetes`` (the names it reads)
and the drift rules.
"""

from __future__ import annotations

from gpunode.model import KUBERNETES_MODULES, KUBERNETES_PACKAGES, KUBERNETES_SYSCTLS, DesiredState

MODULES_LOAD_PATH = "/etc/modules-load.d/gpunode-kubernetes.conf"
REPOSITORY_NAME = "kubernetes"
FORWARD_SYSCTL = "net.ipv4.ip_forward"
__all__ = [
    "KUBERNETES_MODULES", "KUBERNETES_PACKAGES", "KUBERNETES_SYSCTLS", "MODULES_LOAD_PATH",
    "REPOSITORY_NAME",
]  # fmt: skip


def render_modules_load() -> str:
    """systemd-modules-load's file: the modules, one a line, loaded before systemd-sysctl
    applies the bridge sysctls at boot."""
    return "# Managed by gpunode (kubernetes): containerd's overlayfs, bridged pod traffic\n" + (
        "".join(f"{module}\n" for module in KUBERNETES_MODULES)
    )


def wanted_sysctls(desired: DesiredState) -> dict[str, str]:
    """The sysctls a Kubernetes worker must hold (validation refuses data that contradicts
    them; roles.kernel writes them)."""
    return {FORWARD_SYSCTL: "1", **KUBERNETES_SYSCTLS} if desired.kubernetes.enabled else {}

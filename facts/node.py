"""Everything the drift check compares, gathered in ONE SSH round trip per host."""

from __future__ import annotations

import re
import shlex
from typing import Any, ClassVar

from pyinfra.api import FactBase

from facts.audit import FileIntegrityState
from facts.auditd import AuditdState
from facts.batch import FactBatch
from facts.container_runtime import ContainerRuntimeConfig
from facts.fabric import Mounts, NcclSettings
from facts.firewall import FirewallState
from facts.hardware import GpuReport, InfinibandCounters, InfinibandPorts, NvmeDevices
from facts.kubernetes import KubernetesNode
from facts.lynis import LynisReport
from facts.malware_scan import MalwareScanState
from facts.mps import MpsState
from facts.nvidia_packages import NvidiaPackages
from facts.registry_access import RegistryAccess
from facts.secure_boot import SecureBootState
from facts.shared_data import NetworkMountAnswers
from facts.slurm import SlurmGres
from facts.sshd import SshdState
from facts.tls import NodeCertificate
from gpunode import framing

# /etc/os-release (os-release(5)): KEY=value lines, the value optionally quoted. Only the
# keys a release is known by are kept, each to a sane length: node output is untrusted.
OS_RELEASE_KEYS = ("ID", "VERSION_ID", "VERSION_CODENAME", "PRETTY_NAME", "ID_LIKE")
_OS_RELEASE_LINE = re.compile(r"([A-Z_][A-Z0-9_]*)=(.*)")
_OS_RELEASE_VALUE = re.compile(r"[A-Za-z0-9 ._:/()+,~-]{0,128}")
_ARCHITECTURE = re.compile(r"[a-z0-9-]{1,32}")
OS_PARTS = ("os-release", "architecture")


def parse_os_release(lines: list[str]) -> tuple[dict[str, str], list[str]]:
    """os-release text -> the known keys' values, and what could not be read."""
    fields: dict[str, str] = {}
    problems: list[str] = []
    for line in lines:
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        match = _OS_RELEASE_LINE.fullmatch(text)
        if match is None or match[1] not in OS_RELEASE_KEYS:
            continue
        raw = match[2]
        try:
            words = shlex.split(raw)
        except ValueError:
            problems.append(f"{match[1]}: unreadable value")
            continue
        value = " ".join(words)
        if not _OS_RELEASE_VALUE.fullmatch(value):
            problems.append(f"{match[1]}: value of unexpected characters or length")
            continue
        fields[match[1]] = value
    return fields, problems


class NodeOs(FactBase):
    """The node's release and architecture: /etc/os-release's ID, VERSION_ID,
    VERSION_CODENAME, PRETTY_NAME and ID_LIKE, and dpkg's architecture.

    .. code:: python

        {"os_release": {"ID": "debian", "VERSION_ID": "13", "VERSION_CODENAME": "trixie",
                        "PRETTY_NAME": "Debian GNU/Linux 13 (trixie)"},
         "architecture": "amd64", "problems": []}
    """

    def command(self) -> str:
        # os-release(5): /etc/os-release, else /usr/lib/os-release.
        return framing.command(
            [
                framing.Part(
                    "os-release", "cat /etc/os-release 2>/dev/null || cat /usr/lib/os-release",
                    stderr="drop",
                ),
                framing.Part(
                    "architecture", "dpkg --print-architecture", requires="dpkg", stderr="drop"
                ),
            ]
        )  # fmt: skip

    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_node_os(output)


def parse_node_os(output: list[str]) -> dict[str, Any]:
    frame = framing.parse(output, OS_PARTS)
    release = frame.part("os-release")
    fields, problems = parse_os_release(release.lines if release.exit_status == 0 else [])
    if release.exit_status != 0:
        problems.append(f"os-release: {release.problem or 'no /etc/os-release'}")
    arch_part = frame.part("architecture")
    architecture = None
    if arch_part.absent:
        problems.append("architecture: dpkg is not installed")
    elif arch_part.exit_status == 0 and len(arch_part.lines) == 1:
        candidate = arch_part.lines[0].strip()
        if _ARCHITECTURE.fullmatch(candidate):
            architecture = candidate
    if architecture is None and not arch_part.absent:
        problems.append(f"architecture: {arch_part.problem or 'unreadable'}")
    return {"os_release": fields, "architecture": architecture, "problems": problems}


class NodeState(FactBatch):
    """The node's release, GPU, InfiniBand (ports and their error counters), NVMe, sshd,
    firewall, TLS, NVIDIA packages, Secure Boot, container runtimes, NCCL settings, mounts,
    Slurm GRES, the file integrity check, the malware scan, auditd, the last lynis report,
    MPS (compute modes, the daemon), a Kubernetes worker's host (cgroup, swap, modules,
    sysctls, forward chain), root's Docker registry logins (the registries, never the
    secrets) and whether each NFS or Lustre mount answers."""

    FACTS: ClassVar[dict[str, type[FactBase]]] = {
        "os": NodeOs,
        "gpu": GpuReport,
        "infiniband": InfinibandPorts,
        "ib_counters": InfinibandCounters,
        "nvme": NvmeDevices,
        "sshd": SshdState,
        "firewall": FirewallState,
        "tls": NodeCertificate,
        "packages": NvidiaPackages,
        "secure_boot": SecureBootState,
        "container_runtime": ContainerRuntimeConfig,
        "nccl": NcclSettings,
        "mounts": Mounts,
        "slurm": SlurmGres,
        "file_integrity": FileIntegrityState,
        "malware_scan": MalwareScanState,
        "auditd": AuditdState,
        "lynis": LynisReport,
        "mps": MpsState,
        "kubernetes": KubernetesNode,
        "registry_access": RegistryAccess,
        "network_mounts": NetworkMountAnswers,
    }

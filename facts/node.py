"""Everything the drift check compares, gathered in ONE SSH round trip per host."""

from __future__ import annotations

from typing import ClassVar

from pyinfra.api import FactBase

from facts.batch import FactBatch
from facts.container_runtime import ContainerRuntimeConfig
from facts.fabric import Mounts, NcclSettings
from facts.firewall import FirewallState
from facts.hardware import GpuReport, InfinibandPorts, NvmeDevices
from facts.nvidia_packages import NvidiaPackages
from facts.sshd import SshdState
from facts.tls import NodeCertificate


class NodeState(FactBatch):
    """GPU, InfiniBand, NVMe, sshd, firewall, TLS, NVIDIA packages, container runtimes, NCCL
    settings and mounts."""

    FACTS: ClassVar[dict[str, type[FactBase]]] = {
        "gpu": GpuReport,
        "infiniband": InfinibandPorts,
        "nvme": NvmeDevices,
        "sshd": SshdState,
        "firewall": FirewallState,
        "tls": NodeCertificate,
        "packages": NvidiaPackages,
        "container_runtime": ContainerRuntimeConfig,
        "nccl": NcclSettings,
        "mounts": Mounts,
    }

"""Converge a GPU node to the desired state declared in the inventory.

    pyinfra inventories/prod.py deploys/gpu_node.py

The whole inventory is validated before anything runs; one bad host stops every host. A node
whose own state a role refuses (a login that would be cut, a drive that holds data) fails
alone, with nothing changed on it; the others are converged.
"""

import sys
from pathlib import Path

# Roles and facts live at the project root; pyinfra only adds the working directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpunode.converge import converging
from roles.audit import file_integrity
from roles.base import base_system
from roles.container_toolkit import container_toolkit
from roles.cuda import cuda_toolkits
from roles.dcgm import dcgm
from roles.fabric_manager import fabric_manager
from roles.gpu_metrics import gpu_metrics
from roles.gpu_settings import gpu_settings
from roles.hardening import node_hardening
from roles.imex import imex
from roles.infiniband import infiniband
from roles.kubernetes import kubernetes_host, kubernetes_packages
from roles.malware_scan import malware_scan
from roles.mps import mps
from roles.nccl import nccl
from roles.node_exporter import node_exporter
from roles.nvidia_driver import nvidia_driver
from roles.nvidia_repos import nvidia_repositories
from roles.nvme_cache import nvme_cache
from roles.registry_access import registry_access
from roles.shared_data import shared_data
from roles.slurm import slurm

with converging() as desired:
    base_system(desired=desired)
    # Before the hardening roles: br_netfilter loaded, so the kernel role's bridge sysctls
    # exist when it applies them.
    kubernetes_host(desired=desired)
    node_hardening(desired)
    nvidia_repositories(desired=desired)
    nvidia_driver(desired=desired)
    fabric_manager(desired=desired)
    imex(desired=desired)
    cuda_toolkits(desired=desired)
    container_toolkit(desired=desired)
    registry_access(desired=desired)
    kubernetes_packages(desired=desired)
    dcgm(desired=desired)
    nccl(desired=desired)
    infiniband(desired=desired)
    nvme_cache(desired=desired)
    # After the NVMe cache: an fsc mount follows the cachefilesd it runs there.
    shared_data(desired=desired)
    gpu_settings(desired=desired)
    # After the GPU settings: they set the compute mode MPS's GPUs need.
    mps(desired=desired)
    gpu_metrics(desired=desired)
    node_exporter(desired=desired)
    slurm(desired=desired)
    malware_scan(desired=desired)
    # Last: AIDE's database built, or this run's changes taken into it (where it is on).
    file_integrity(desired=desired)

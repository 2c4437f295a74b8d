"""Stand-in NVIDIA packages for the lab's local apt repositories (``lab.aptrepo``).

Each stand-in carries the real package name, version and dependency structure of NVIDIA's
CUDA repository (Debian 12 and 13; Ubuntu 24.04 less the driver) or of the libnvidia-container
repository, and ships only tiny placeholders: scripts that answer ``--version`` like the real
tools, systemd units whose daemons are harmless processes that stay running, and the
stand-in ``nvidia-ctk`` (``nvidia_ctk.py``) that really edits Docker, containerd and CDI
configuration. Nothing here loads a kernel module or runs DKMS.

``catalogue()`` lists every package, generated from the data file ``world.toml`` (every release
and package template, with where its fields come from and where the stand-in departs);
``catalogue.py`` documents what each one ships.

``ubuntu.py`` does the same for Ubuntu's own NVIDIA driver packages (the ``ubuntu`` driver
source), from ``ubuntu_world.toml``: the stand-in Ubuntu archive's ``noble-updates``
``restricted``, with Canonical's prebuilt ``linux-modules-nvidia-*`` for one kernel.
"""

from __future__ import annotations

from .catalogue import (
    CDI_REFRESH_FROM,
    CONTAINER_TOOLKIT_VERSIONS,
    CUDA_REPO,
    CUDA_REPOSITORY_PATHS,
    CUDA_TOOLKITS,
    DCGM4_VERSIONS,
    DCGM_EXPORTER_VERSIONS,
    DCGM_VERSIONS,
    DRIVER_BRANCHES,
    DRIVER_VERSIONS,
    INSTALLED_DRIVER_VERSION_PATH,
    INSTALLED_KERNEL_MODULE_FLAVOUR_PATH,
    LIBNVIDIA_CONTAINER_REPO,
    NCCL_VERSIONS,
    NVLSM_VERSIONS,
    PackageFile,
    StandinPackage,
    catalogue,
    in_cuda_tree,
)

__all__ = [
    "CDI_REFRESH_FROM",
    "CONTAINER_TOOLKIT_VERSIONS",
    "CUDA_REPO",
    "CUDA_REPOSITORY_PATHS",
    "CUDA_TOOLKITS",
    "DCGM4_VERSIONS",
    "DCGM_EXPORTER_VERSIONS",
    "DCGM_VERSIONS",
    "DRIVER_BRANCHES",
    "DRIVER_VERSIONS",
    "INSTALLED_DRIVER_VERSION_PATH",
    "INSTALLED_KERNEL_MODULE_FLAVOUR_PATH",
    "LIBNVIDIA_CONTAINER_REPO",
    "NCCL_VERSIONS",
    "NVLSM_VERSIONS",
    "PackageFile",
    "StandinPackage",
    "catalogue",
    "in_cuda_tree",
]

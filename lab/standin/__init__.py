"""Stand-in NVIDIA packages for the lab's local apt repositories (``lab.aptrepo``).

Each stand-in carries the real package name, version and dependency structure of NVIDIA's
Debian 12 CUDA repository or of the libnvidia-container repository, and ships only tiny
placeholders: scripts that answer ``--version`` like the real tools, systemd units whose daemons
are harmless processes that stay running, and the stand-in ``nvidia-ctk`` (``nvidia_ctk.py``)
that really edits Docker, containerd and CDI configuration. Nothing here loads a kernel module
or runs DKMS.

``catalogue()`` lists every package; ``catalogue.py`` documents what each one ships and where it
departs from the real package.
"""

from __future__ import annotations

from .catalogue import (
    CONTAINER_TOOLKIT_VERSIONS,
    CUDA_REPO,
    CUDA_TOOLKITS,
    DCGM_VERSIONS,
    DRIVER_VERSIONS,
    INSTALLED_DRIVER_VERSION_PATH,
    INSTALLED_KERNEL_MODULE_FLAVOUR_PATH,
    LIBNVIDIA_CONTAINER_REPO,
    NCCL_VERSIONS,
    PackageFile,
    StandinPackage,
    catalogue,
)

__all__ = [
    "CONTAINER_TOOLKIT_VERSIONS",
    "CUDA_REPO",
    "CUDA_TOOLKITS",
    "DCGM_VERSIONS",
    "DRIVER_VERSIONS",
    "INSTALLED_DRIVER_VERSION_PATH",
    "INSTALLED_KERNEL_MODULE_FLAVOUR_PATH",
    "LIBNVIDIA_CONTAINER_REPO",
    "NCCL_VERSIONS",
    "PackageFile",
    "StandinPackage",
    "catalogue",
]

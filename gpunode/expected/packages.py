"""The NVIDIA packages the data pins: the driver's and the container toolkit's apt packages.

The roles (roles/nvidia_driver.py, roles/container_toolkit.py) install and hold them; the drift
check compares the installed versions and holds with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpunode.model import NvidiaDriver

# The container toolkit's packages, all at container_runtime.toolkit_version.
TOOLKIT_PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)


# --- the driver's packages ----------------------------------------------------------------


@dataclass(frozen=True)
class DriverPackages:
    """The driver as apt packages: what to install, at which version, what must go."""

    source: Literal["debian", "nvidia"]
    flavour: Literal["open", "proprietary"]
    branch: str | None
    version: str | None  # exact apt version; None: the newest of ``branch`` (apt pin)
    module: str  # the kernel module package
    versioned: tuple[str, ...]  # installed at exactly ``version``
    unversioned: tuple[str, ...] = ()  # from other source packages, with their own versions
    conflicting: tuple[str, ...] = ()  # the other flavour's

    @property
    def pin(self) -> str:
        return self.version or f"{self.branch}.*"

    def describe(self, version: str | None = None) -> str:
        shown = version or self.version or f"newest of branch {self.branch}"
        return f"NVIDIA driver {shown} ({self.flavour} kernel module, {self.source} source)"


def module_package(wanted: NvidiaDriver) -> str:
    if wanted.source == "nvidia":
        return "nvidia-kernel-open-dkms" if wanted.flavour == "open" else "nvidia-kernel-dkms"
    return "nvidia-open-kernel-dkms" if wanted.flavour == "open" else "nvidia-kernel-dkms"


def driver_packages_for(wanted: NvidiaDriver, version: str | None) -> DriverPackages:
    """The packages for ``wanted`` at ``version`` (the resolved one for the debian source)."""
    module = module_package(wanted)
    source: Literal["debian", "nvidia"] = "nvidia" if wanted.source == "nvidia" else "debian"
    if source == "nvidia":
        common = (module, "nvidia-driver", "nvidia-driver-cuda")
        if wanted.flavour == "open":
            return DriverPackages(
                source, "open", wanted.branch, version, module, ("nvidia-open", *common),
                conflicting=("cuda-drivers", f"cuda-drivers-{wanted.branch}",
                             "nvidia-kernel-dkms"),
            )  # fmt: skip
        return DriverPackages(
            source, "proprietary", wanted.branch, version, module,
            ("cuda-drivers", f"cuda-drivers-{wanted.branch}", *common),
            conflicting=("nvidia-open", "nvidia-kernel-open-dkms"),
        )  # fmt: skip
    # Debian: the headless compute set; nvidia-persistenced has its own source and version.
    other = "nvidia-kernel-dkms" if wanted.flavour == "open" else "nvidia-open-kernel-dkms"
    return DriverPackages(
        source, wanted.flavour, wanted.branch, version, module,
        (module, "nvidia-smi", "libcuda1"),
        unversioned=("nvidia-persistenced",) if wanted.persistence_daemon else (),
        conflicting=(other,),
    )  # fmt: skip

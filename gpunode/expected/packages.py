"""The NVIDIA packages the data pins: the driver's, Fabric Manager's, the NVLink subnet
manager's, IMEX's, DCGM's and its exporter's, and the container toolkit's apt packages.

The roles install and hold them; the drift check compares the installed versions and holds
with ``held_packages`` (what every role holds, with the version each must be at).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import gpunode.nvidia_releases as nvidia_releases
from gpunode.expected import ubuntu_driver
from gpunode.model import DesiredState, NvidiaDriver

# The container toolkit's packages, all at container_runtime.toolkit_version.
TOOLKIT_PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)


def toolkit_keeps_cdi_spec(pinned: str | None, installed_ctk: str | None) -> bool:
    """Whether the Container Toolkit keeps the CDI spec itself (1.18 and later: the
    ``nvidia-cdi-refresh`` units write ``/var/run/cdi/nvidia.yaml``): by the pinned version,
    else the installed ``nvidia-ctk``'s; with neither, the newest toolkit, which does."""
    version = pinned or installed_ctk
    return version is None or nvidia_releases.toolkit_refreshes_cdi(version)


# --- the driver's packages ----------------------------------------------------------------


@dataclass(frozen=True)
class DriverPackages:
    """The driver as apt packages: what to install, at which version, what must go."""

    source: Literal["debian", "nvidia", "ubuntu"]
    flavour: Literal["open", "proprietary"]
    branch: str | None
    version: str | None  # exact apt version; None: the newest of ``branch`` (apt pin)
    module: str  # the kernel module package
    versioned: tuple[str, ...]  # installed at exactly ``version``
    unversioned: tuple[str, ...] = ()  # from other source packages, with their own versions
    conflicting: tuple[str, ...] = ()  # the other flavour's
    stack: Literal["compute", "full"] = "compute"
    # NVIDIA's branch lock (from 590), installed before the driver and held with it.
    pinning: str | None = None
    # False for Canonical's prebuilt module package: it is at its kernel's version, not the
    # driver's, so the driver's version is read from ``versioned[0]`` instead.
    module_versioned: bool = True

    @property
    def anchor(self) -> str:
        """The package whose installed version is the driver's."""
        return self.module if self.module_versioned else self.versioned[0]

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


def pinning_package(branch: str | None) -> str | None:
    """NVIDIA's branch lock package for ``branch``, where its packaging era has one."""
    if branch is None or nvidia_releases.packaging_era(branch) != "pinning-package":
        return None
    return f"nvidia-driver-pinning-{branch}"


def full_stack_metapackages(flavour: str, branch: str | None) -> tuple[str, ...]:
    """NVIDIA's full-install metapackages: ``nvidia-open`` or ``cuda-drivers``, and up to the
    branch-suffixed era the proprietary one's ``cuda-drivers-<branch>`` too."""
    if flavour == "open":
        return ("nvidia-open",)
    if branch is not None and nvidia_releases.packaging_era(branch) == "branch-suffixed":
        return ("cuda-drivers", f"cuda-drivers-{branch}")
    return ("cuda-drivers",)


def ubuntu_driver_packages(
    wanted: NvidiaDriver,
    version: str | None,
    kernel: ubuntu_driver.UbuntuKernel | None,
    offered: set[str],
) -> DriverPackages:
    """The ubuntu source's compute set for ``wanted``: Canonical's signed prebuilt module for
    ``kernel`` where ``offered`` (what apt offers) has it, else the DKMS one. The prebuilt
    module has the kernel's version and is held apart; a DKMS module of the same driver
    would be loaded in its place, so it goes."""
    branch, series = str(wanted.branch), wanted.ubuntu_series
    flavour = wanted.flavour
    other: ubuntu_driver.Flavour = "proprietary" if flavour == "open" else "open"
    kind, module = ubuntu_driver.module_choice(branch, series, flavour, kernel, offered)
    compute = ubuntu_driver.compute_packages(branch, series)
    conflicting = [ubuntu_driver.dkms_package(branch, series, other)]
    if kernel is not None:
        conflicting.append(ubuntu_driver.prebuilt_module_package(branch, series, other, kernel))
    if kind == "prebuilt":
        conflicting.append(ubuntu_driver.dkms_package(branch, series, flavour))
    return DriverPackages(
        "ubuntu", flavour, wanted.branch, version, module,
        versioned=compute if kind == "prebuilt" else (*compute, module),
        unversioned=(module,) if kind == "prebuilt" else (),
        conflicting=tuple(conflicting),
        module_versioned=kind == "dkms",
    )  # fmt: skip


def driver_packages_for(wanted: NvidiaDriver, version: str | None) -> DriverPackages:
    """The packages for ``wanted`` at ``version`` (the resolved one for the debian source);
    the ubuntu source's depend on the node's kernel: ``ubuntu_driver_packages``."""
    if wanted.source == "ubuntu":
        raise ValueError(
            "the ubuntu source's packages depend on the kernel: ubuntu_driver_packages"
        )
    module = module_package(wanted)
    source: Literal["debian", "nvidia"] = "nvidia" if wanted.source == "nvidia" else "debian"
    if source == "nvidia":
        open_flavour = wanted.flavour == "open"
        other_module = "nvidia-kernel-dkms" if open_flavour else "nvidia-kernel-open-dkms"
        other_flavour = "proprietary" if open_flavour else "open"
        # The other flavour's metapackages would pull the other kernel module back in.
        conflicting = (*full_stack_metapackages(other_flavour, wanted.branch), other_module)
        if wanted.stack == "full":
            versioned: tuple[str, ...] = (
                *full_stack_metapackages(wanted.flavour, wanted.branch),
                module, "nvidia-driver", "nvidia-driver-cuda",
            )  # fmt: skip
        else:
            # NVIDIA's compute-only (headless) install: no X, no desktop libraries.
            versioned = ("nvidia-driver-cuda", module)
        return DriverPackages(
            source, wanted.flavour, wanted.branch, version, module, versioned,
            conflicting=conflicting, stack=wanted.stack,
            pinning=pinning_package(wanted.branch),
        )  # fmt: skip
    # Debian: the headless compute set; nvidia-persistenced has its own source and version.
    other = "nvidia-kernel-dkms" if wanted.flavour == "open" else "nvidia-open-kernel-dkms"
    return DriverPackages(
        source, wanted.flavour, wanted.branch, version, module,
        (module, "nvidia-smi", "libcuda1"),
        unversioned=("nvidia-persistenced",) if wanted.persistence_daemon else (),
        conflicting=(other,),
    )  # fmt: skip


# --- Fabric Manager, DCGM ---------------------------------------------------------------------


def fabric_manager_packages(branch: str, source: str = "nvidia") -> tuple[str, ...]:
    """Fabric Manager's packages for ``branch`` from the driver's ``source``, all at the
    driver's version. Ubuntu's archive keeps the branch in every name, with NSCQ beside it
    (``nvidia-fabricmanager-580``, ``libnvidia-nscq-580``: packages.ubuntu.com, source packages
    fabric-manager-580 and libnvidia-nscq-580 in multiverse, read 2026-12-07); NVIDIA's
    repository dropped the suffix from 580 on."""
    if source == "ubuntu":
        return (f"nvidia-fabricmanager-{branch}", f"libnvidia-nscq-{branch}")
    if nvidia_releases.fabric_manager_suffixed(branch):
        return (f"nvidia-fabricmanager-{branch}",)
    return ("nvidia-fabricmanager", "libnvidia-nscq")


# Password quality checks for the PAM stack (dev-sec's choice; roles/kernel.py): only password
# changes meet it, SSH keys are unaffected.
PASSWORD_QUALITY_PACKAGE = "libpam-passwdqc"
# The NVLink Subnet Manager (Blackwell NVSwitch systems): a calendar-versioned package of its
# own, not at the driver's version.
NVLSM_PACKAGE = "nvlsm"
DCGM3_PACKAGE = "datacenter-gpu-manager"
DCGM_EXPORTER_PACKAGE = "datacenter-gpu-manager-exporter"


def dcgm_packages(major: int, cuda_major: int | None) -> tuple[str, ...]:
    """DCGM's packages: DCGM 3's one package, or DCGM 4's core and its CUDA-major part."""
    if major == 3:
        return (DCGM3_PACKAGE,)
    core = f"datacenter-gpu-manager-{major}-core"
    return (core, f"datacenter-gpu-manager-{major}-cuda{cuda_major}") if cuda_major else (core,)


def imex_packages(branch: str) -> tuple[str, ...]:
    """IMEX's package for ``branch``, at the driver's version (suffixed like Fabric Manager's
    up to 575)."""
    if nvidia_releases.fabric_manager_suffixed(branch):
        return (f"nvidia-imex-{branch}",)
    return ("nvidia-imex",)


def held_packages(desired: DesiredState) -> dict[str, str | None]:
    """Every package a role installs and holds for ``desired``, with the exact apt version it
    must be at (None: any version, held where the role first installed it: no pin in data).

    Mirrors the roles' conditions: the driver (with a pinned version), Fabric Manager where
    NVSwitch is expected (at its own pin, else the driver's), the NVLink subnet manager where
    it is needed, IMEX on multi-node NVLink systems, DCGM and its exporter when enabled, and
    the container toolkit when its version is pinned.
    """
    held: dict[str, str | None] = {}
    driver = desired.nvidia_driver
    if driver.source == "ubuntu" and driver.branch and driver.version:
        # The kernel module package depends on the node's kernel (prebuilt or DKMS): the
        # compute set is what every Ubuntu node holds at the driver's version.
        compute = ubuntu_driver.compute_packages(driver.branch, driver.ubuntu_series)
        held.update(dict.fromkeys(compute, driver.version))
    elif driver.source != "none" and driver.branch and driver.version:
        spec = driver_packages_for(driver, driver.version)
        held.update(dict.fromkeys(spec.versioned, driver.version))
    if driver.source != "none" and driver.branch:
        if desired.needs_fabric_manager:
            version = desired.fabric_manager.version or driver.version
            names = fabric_manager_packages(str(driver.branch), driver.source)
            held.update(dict.fromkeys(names, version))
            if desired.needs_nvlsm:
                held[NVLSM_PACKAGE] = desired.fabric_manager.nvlsm_version
        if desired.needs_imex:
            held.update(dict.fromkeys(imex_packages(str(driver.branch)), driver.version))
    dcgm = desired.dcgm
    if dcgm.enabled:
        packages = dcgm_packages(dcgm.release_major, desired.dcgm_cuda_major)
        held.update(dict.fromkeys(packages, dcgm.version))
        if dcgm.exporter:
            held[DCGM_EXPORTER_PACKAGE] = dcgm.exporter_version
    toolkit = desired.container_runtime.toolkit_version
    if toolkit:
        held.update(dict.fromkeys(TOOLKIT_PACKAGES, toolkit))
    return held

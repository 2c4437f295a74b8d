"""What NVIDIA publishes about its driver branches and CUDA releases, as data with its source.

Standard library only: the model validates against it, and nothing here knows the model.
Every table names where it comes from and when it was read; when NVIDIA publishes a new
branch or toolkit, the row is added here (and its source beside it), and nothing else changes.

Read on 2026-12-01 from:

- ``BRANCHES``: NVIDIA Data Center Drivers, "Supported Drivers and CUDA Toolkit Versions",
  Table 2 "CUDA and Drivers", https://docs.nvidia.com/datacenter/tesla/drivers/620/
  supported-drivers-and-cuda-toolkit-versions.html (R580, R595, R620), the same page of the
  615 documentation (R535, R610) and its earlier, unversioned edition (R570: Production
  Branch, end of life February 2026). Where editions disagree (R580: August 2028 in the
  earlier one, June 2028 in 615 and 620) the newest wins. "Only Long Term Support and
  Production branches are listed. New Feature Branches are short-lived and do not have an
  end-of-life date." The earlier edition: "All other previous driver branches not listed in
  the table above (such as R575, R565, R560, R550, R525, ...) are end of life."
- ``TOOLKIT_DRIVER``: CUDA Toolkit release notes (13.2 GA edition, with the 13.2 Update 1
  and 13.3 rows of the 13.3 Update 1 edition), Table 3 "CUDA Toolkit and Corresponding
  Driver Versions", Linux x86_64: the driver each toolkit release bundles.
- ``MINOR_VERSION_COMPATIBILITY``: the same release notes, Table 2 "CUDA Toolkit and Minimum
  Required Driver Version for CUDA Minor Version Compatibility", and NVIDIA's CUDA
  Compatibility guide, Table 1 (12.x: ">= 525", "< 580"; 13.x: ">= 580"). The 12.x floor is
  the 12.0 GA toolkit driver, 525.60.13; for 13.x NVIDIA names the branch only.
- Kernel module flavours: NVIDIA Driver Installation Guide, "Kernel Modules"
  (https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/kernel-modules.html
  and its 610 edition): "Proprietary - ... is required for older GPUs from the Maxwell,
  Pascal, or Volta architectures. The open-source GPU kernel modules are not compatible with
  these platforms"; open "are only for Turing and newer architectures". The 620 edition
  ships open modules only ("The kernel modules are open source and dual licensed
  MIT/GPLv2"). Blackwell is supported by the open modules only (NVIDIA technical blog,
  "NVIDIA Transitions Fully Towards Open-Source GPU Kernel Modules", July 2024).
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Literal

Designation = Literal["long-term support", "production", "new feature"]


@dataclass(frozen=True)
class Branch:
    designation: Designation
    end_of_life: datetime.date | None  # None: a new feature branch, short-lived by design
    max_cuda_major: int  # without the forward-compatibility package


def _month_end(year: int, month: int) -> datetime.date:
    # NVIDIA gives a month ("June 2028"); the branch is supported through that month.
    following = datetime.date(year + month // 12, month % 12 + 1, 1)
    return following - datetime.timedelta(days=1)


BRANCHES: dict[str, Branch] = {
    "535": Branch("long-term support", _month_end(2026, 6), 12),
    "570": Branch("production", _month_end(2026, 2), 12),
    "580": Branch("long-term support", _month_end(2028, 6), 13),
    "590": Branch("new feature", None, 13),
    "595": Branch("production", _month_end(2027, 3), 13),
    "610": Branch("new feature", None, 13),
    "615": Branch("new feature", None, 13),
    "620": Branch("long-term support", _month_end(2029, 9), 13),
}

# CUDA toolkit release -> the driver it bundles (its "Toolkit Driver Version"), per update.
TOOLKIT_DRIVER: dict[str, str] = {
    "12.0.0": "525.60.13",
    "12.0.1": "525.85.12",
    "12.1.0": "530.30.02",
    "12.1.1": "530.30.02",
    "12.2.0": "535.54.03",
    "12.2.1": "535.86.09",
    "12.2.2": "535.104.05",
    "12.3.0": "545.23.06",
    "12.3.1": "545.23.08",
    "12.4.0": "550.54.14",
    "12.4.1": "550.54.15",
    "12.5.0": "555.42.02",
    "12.5.1": "555.42.06",
    "12.6.0": "560.28.03",
    "12.6.1": "560.35.03",
    "12.6.2": "560.35.03",
    "12.6.3": "560.35.05",
    "12.8.0": "570.26",
    "12.8.1": "570.124.06",
    "12.9.0": "575.51.03",
    "12.9.1": "575.57.08",
    "13.0.0": "580.65.06",
    "13.0.1": "580.82.07",
    "13.0.2": "580.95.05",
    "13.1.0": "590.44.01",
    "13.1.1": "590.48.01",
    "13.2.0": "595.45.04",
    "13.2.1": "595.58.03",
    "13.3.0": "610.43.02",
    "13.3.1": "610.43.02",
}

# CUDA major -> the oldest driver that runs any of its minor releases (with the limits of
# minor-version compatibility: no PTX JIT of newer PTX, some APIs missing).
MINOR_VERSION_COMPATIBILITY: dict[int, str] = {12: "525.60.13", 13: "580"}


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"[0-9]+", version))


def releases() -> list[str]:
    """CUDA releases (major.minor) NVIDIA published a driver minimum for, oldest first."""
    seen: dict[str, None] = {}
    for release in sorted(TOOLKIT_DRIVER, key=version_key):
        seen[".".join(release.split(".")[:2])] = None
    return list(seen)


def bundled_driver(release: str) -> str:
    """The driver the GA toolkit of ``release`` (major.minor) bundles: it runs fully there."""
    return TOOLKIT_DRIVER[f"{release}.0"]


def driver_cuda_version(driver: str) -> str | None:
    """The CUDA version a driver reports (``nvidia-smi``'s "CUDA Version", NVML's
    ``nvmlSystemGetCudaDriverVersion``): the newest release whose GA toolkit's bundled driver
    it reaches, e.g. 13.0 for 580.105.08 (13.1's GA toolkit needs 590.44.01). None: older than
    every release listed."""
    reached = [
        release
        for release in releases()
        if version_key(driver) >= version_key(bundled_driver(release))
    ]
    return reached[-1] if reached else None


def compatibility_floor(release: str) -> str | None:
    """The oldest driver ``release`` runs on at all (minor-version compatibility)."""
    return MINOR_VERSION_COMPATIBILITY.get(int(release.split(".")[0]))


def driver_runs(release: str, driver: str) -> Literal["fully", "minor-version compatibility", "no"]:
    """How CUDA ``release`` (major.minor) runs on ``driver`` (a version, or a branch + '.999')."""
    if version_key(driver) >= version_key(bundled_driver(release)):
        return "fully"
    floor = compatibility_floor(release)
    if floor is not None and version_key(driver) >= version_key(floor):
        return "minor-version compatibility"
    return "no"


def lifecycle_notice(branch: str, today: datetime.date) -> str | None:
    """What an operator should know about pinning ``branch`` today, or None when nothing."""
    known = BRANCHES.get(branch)
    if known is None:
        # Unlisted and older than the newest listed: NVIDIA dropped it from its tables.
        if version_key(branch) < version_key(max(BRANCHES, key=version_key)):
            return (
                f"driver branch {branch} is past its end of life: NVIDIA no longer lists it "
                "(supported: " + ", ".join(supported_branches(today)) + ")"
            )
        return f"driver branch {branch} is newer than gpunode's table of NVIDIA's branches"
    if known.end_of_life is None:
        return (
            f"driver branch {branch} is a new feature branch: short-lived, without an end of "
            "life date; production fleets pin a long-term support or production branch ("
            + ", ".join(supported_branches(today))
            + ")"
        )
    if today > known.end_of_life:
        return (
            f"driver branch {branch} ({known.designation}) reached its end of life in "
            f"{known.end_of_life:%B %Y} (supported: " + ", ".join(supported_branches(today)) + ")"
        )
    return None


def supported_branches(today: datetime.date) -> list[str]:
    """Long-term support and production branches still within their life on ``today``."""
    return [
        branch
        for branch, known in sorted(BRANCHES.items(), key=lambda item: version_key(item[0]))
        if known.end_of_life is not None and today <= known.end_of_life
    ]


# Kernel module flavours by GPU architecture (see the module docstring).
PRE_TURING_MODELS = ("V100", "P100", "P40", "P4", "M60", "M40", "M10", "TITAN V", "Quadro GV100")
BLACKWELL_MODELS = ("B100", "B200", "B300", "GB200", "GB300", "RTX PRO 6000 Blackwell")
# From this branch on NVIDIA ships the open kernel modules only.
OPEN_ONLY_FROM_BRANCH = "620"


def _names(model: str, names: tuple[str, ...]) -> bool:
    # Whole words: "B200" is in "NVIDIA B200", not in "NVIDIA GB2000"; "P4" is not in "P40".
    upper = model.upper()
    return any(
        re.search(rf"(?<![A-Z0-9]){re.escape(name.upper())}(?![A-Z0-9])", upper) for name in names
    )


def architecture_of(model: str) -> Literal["pre-turing", "blackwell", "other"]:
    """The architecture class a GPU model name (``nvidia-smi``'s product name) belongs to."""
    if _names(model, BLACKWELL_MODELS):
        return "blackwell"
    if _names(model, PRE_TURING_MODELS):
        return "pre-turing"
    return "other"


# --- how NVIDIA's apt repositories name the packages, by era -------------------------------
#
# Read on 2026-12-01 from:
#
# - Driver: NVIDIA Driver Installation Guide, "Recent Updates" ("Version locking packages for
#   Ubuntu / Debian ... Driver pinning packages have been introduced for Debian and Ubuntu to
#   track specific driver branches", "we suggest to install the pinning package prior to
#   installing the driver"; "Starting with branch 590, the Ubuntu packages will be renamed by
#   removing the branch designation from the package name", Table 4: "cuda-drivers-580 ->
#   will be removed") and "Version locking" (https://docs.nvidia.com/datacenter/tesla/
#   driver-installation-guide/version-locking.html, examples for branch 590); its Debian
#   section installs ``nvidia-open`` or ``cuda-drivers`` (full), and ``nvidia-driver-cuda``
#   with ``nvidia-kernel-open-dkms`` or ``nvidia-kernel-dkms`` (compute-only, headless).
# - Fabric Manager: the CUDA repositories' package lists as captured in public build scripts
#   (branch-suffixed ``nvidia-fabricmanager-<branch>`` up to 575; from 580 the unsuffixed
#   ``nvidia-fabricmanager`` with ``libnvidia-nscq``, whose version is the driver's).
# - DCGM: NVIDIA DCGM documentation, "Install DCGM" (DCGM 4: ``datacenter-gpu-manager-4-core``
#   and ``datacenter-gpu-manager-4-cuda<major>`` for the CUDA major of the driver; DCGM 3 was
#   ``datacenter-gpu-manager``), "Install DCGM Exporter" (https://docs.nvidia.com/datacenter/
#   dcgm/latest/installation/install-dcgm-exporter.html: the package
#   ``datacenter-gpu-manager-exporter``; "DCGM Exporter releases pair a DCGM version with an
#   exporter version ... Run DCGM Exporter with the DCGM version paired with that exporter
#   release"; metrics on port 9400).
# - Exporter pairs: DCGM Exporter 4.9.0 release notes (github.com/NVIDIA/dcgm-exporter,
#   mirrored at newreleases.io: "tested with DCGM 4.7.0 and 4.7.1 and ships with DCGM 4.7.0");
#   4.8.3 with DCGM 4.6.0 (the exporter's package build for Ubuntu 24.04 at
#   packages.microsoft.com, Build-Depends "datacenter-gpu-manager-4-core (= 1:4.6.0-1)").
# - Container Toolkit: "Support for Container Device Interface", toolkit documentation 1.20.1
#   (https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/1.20.1/cdi-support.html):
#   "As of NVIDIA Container Toolkit v1.18.0, the CDI specification is automatically generated
#   and updated by a systemd service called nvidia-cdi-refresh ... at /var/run/cdi/nvidia.yaml";
#   the units ship in ``nvidia-container-toolkit-base`` (NVIDIA/nvidia-container-toolkit
#   pull request 1229, packaging/debian/nvidia-container-toolkit-base.postinst).

# From this branch on a branch is locked with ``nvidia-driver-pinning-<branch>`` and the
# metapackages carry no branch in their names.
PINNING_PACKAGE_FROM_BRANCH = "590"
# From this branch on Fabric Manager is ``nvidia-fabricmanager`` + ``libnvidia-nscq``.
UNSUFFIXED_FABRIC_MANAGER_FROM_BRANCH = "580"
# From this release on the toolkit writes and refreshes the CDI spec itself.
CDI_REFRESH_FROM_TOOLKIT = "1.18.0"
CDI_REFRESH_SPEC = "/var/run/cdi/nvidia.yaml"
CDI_REFRESH_UNITS = ("nvidia-cdi-refresh.path", "nvidia-cdi-refresh.service")
# DCGM Exporter release -> the DCGM releases it is paired with.
DCGM_EXPORTER_PAIRS: dict[str, tuple[str, ...]] = {
    "4.8.3": ("4.6.0",),
    "4.9.0": ("4.7.0", "4.7.1"),
}
DCGM_EXPORTER_PORT = 9400

PackagingEra = Literal["branch-suffixed", "pinning-package"]


def packaging_era(branch: str) -> PackagingEra:
    """How NVIDIA's repository names ``branch``'s driver packages."""
    if version_key(branch) >= version_key(PINNING_PACKAGE_FROM_BRANCH):
        return "pinning-package"
    return "branch-suffixed"


def fabric_manager_suffixed(branch: str) -> bool:
    return version_key(branch) < version_key(UNSUFFIXED_FABRIC_MANAGER_FROM_BRANCH)


def toolkit_refreshes_cdi(version: str) -> bool:
    """Whether Container Toolkit ``version`` (an apt version) keeps the CDI spec itself."""
    return version_key(version.split(":", 1)[-1].split("-", 1)[0]) >= version_key(
        CDI_REFRESH_FROM_TOOLKIT
    )


def exporter_pairs_with(exporter: str, dcgm: str) -> bool | None:
    """Whether exporter release ``exporter`` is paired with DCGM release ``dcgm`` (upstream
    versions, e.g. 4.9.0 and 4.7.0); None when gpunode's table does not know the exporter."""
    paired = DCGM_EXPORTER_PAIRS.get(exporter)
    return None if paired is None else dcgm in paired


# --- NVLink fabric services by hardware generation ------------------------------------------
#
# Read on 2026-12-01: NVIDIA Fabric Manager User Guide (Blackwell-generation NVSwitch systems
# run the NVLink Subnet Manager, package ``nvlsm``, beside Fabric Manager); NVIDIA IMEX Guide,
# "Getting Started" (https://docs.nvidia.com/multi-node-nvlink-systems/imex-guide/
# gettingstarted.html: "The IMEX installation package will install the required core
# components and register the service as a systemd service called nvidia-imex"; supported:
# "NVIDIA GB200 NVL72") and "IMEX Channels" (imexchannels.html: "Users are expected to create
# the IMEX channels, as they are not created by default"; "IMEX channels will not persist
# through a reboot"; created with mknod on the major of ``nvidia-caps-imex-channels`` in
# /proc/devices). The nodes file is /etc/nvidia-imex/nodes_config.cfg, one address a line.

# Multi-node NVLink (NVL72) compute trays: each node runs IMEX for its NVLink domain.
MULTI_NODE_NVLINK_MODELS = ("GB200", "GB300")
IMEX_NODES_CONFIG = "/etc/nvidia-imex/nodes_config.cfg"
IMEX_CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"


def needs_nvlsm(model: str | None, nvswitch: bool | None) -> bool:
    """NVSwitch systems of the Blackwell generation run the NVLink Subnet Manager."""
    return bool(nvswitch) and model is not None and architecture_of(model) == "blackwell"


def multi_node_nvlink(model: str | None) -> bool:
    return model is not None and _names(model, MULTI_NODE_NVLINK_MODELS)

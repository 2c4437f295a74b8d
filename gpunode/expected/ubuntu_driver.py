"""Ubuntu's NVIDIA driver packages (nvidia_driver.source "ubuntu"), as name rules.

Ubuntu's restricted archive names every driver package after its branch, its series
(``-server``: the data-centre branches) and its kernel module flavour (``-open``), and ships
the kernel module two ways:

* prebuilt and signed by Canonical, one package per kernel:
  ``linux-modules-nvidia-<branch>[-server][-open]-<uname -r>``, at the kernel's own version
  (e.g. 6.8.0-64.67+1), with a meta package per kernel flavour that follows the flavour's
  kernels (``linux-modules-nvidia-<branch>[-server][-open]-<flavour>``: generic,
  generic-64k, generic-hwe-24.04, nvidia, aws, azure, gcp, lowlatency, oracle, ...). Its
  signature is Canonical's, which the shim and kernel of a Secure Boot machine trust: no
  machine owner key is needed;
* built on the node by DKMS: ``nvidia-dkms-<branch>[-server][-open]``, where no prebuilt
  package exists for the running kernel (a kernel Canonical does not build them for).

The compute-only set is ``libnvidia-compute-<branch>[-server]``,
``nvidia-utils-<branch>[-server]`` (nvidia-smi), ``nvidia-compute-utils-<branch>[-server]``
(nvidia-persistenced) and ``nvidia-kernel-common-<branch>[-server]``; the full driver is
``nvidia-driver-<branch>[-server][-open]``; ``nvidia-headless-<branch>[-server][-open]``
is the headless set with DKMS. Sources: packages.ubuntu.com pages of the noble, jammy,
resolute and tenacious indexes (tests/fixtures/ubuntu-packages, PROVENANCE.md), read
2026-12-07.

Standard library only, as all of gpunode/expected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Series = Literal["server", "desktop"]
Flavour = Literal["open", "proprietary"]

# `uname -r` of an Ubuntu kernel: upstream version, ABI number, flavour
# (6.8.0-49-generic, 6.8.0-1015-aws, 5.15.0-1063-nvidia, 6.8.0-1021-nvidia-64k).
_UBUNTU_KERNEL = re.compile(r"([0-9]+\.[0-9]+\.[0-9]+)-([0-9]+)-([a-z][a-z0-9]*(?:-[a-z0-9.]+)*)")


@dataclass(frozen=True)
class UbuntuKernel:
    """An Ubuntu kernel release as ``uname -r`` prints it."""

    version: str  # 6.8.0
    abi: str  # 49
    flavour: str  # generic, aws, nvidia-64k, ...

    @property
    def release(self) -> str:
        return f"{self.version}-{self.abi}-{self.flavour}"


def parse_kernel_release(text: str) -> UbuntuKernel | None:
    """``uname -r`` -> its parts; None for a release not named as Ubuntu names kernels."""
    match = _UBUNTU_KERNEL.fullmatch(text.strip())
    if match is None:
        return None
    return UbuntuKernel(match[1], match[2], match[3])


def suffix(branch: str, series: Series, flavour: Flavour | None = None) -> str:
    """``<branch>[-server][-open]``: what every Ubuntu driver package name ends in; without
    ``flavour`` the flavour-neutral name (the libraries and tools)."""
    text = branch + ("-server" if series == "server" else "")
    return text + ("-open" if flavour == "open" else "")


def prebuilt_module_package(
    branch: str, series: Series, flavour: Flavour, kernel: UbuntuKernel
) -> str:
    """Canonical's signed prebuilt module package for exactly this kernel."""
    return f"linux-modules-nvidia-{suffix(branch, series, flavour)}-{kernel.release}"


def prebuilt_module_meta(branch: str, series: Series, flavour: Flavour, kernel_flavour: str) -> str:
    """The meta package that follows a kernel flavour's kernels (generic, nvidia, aws, ...)."""
    return f"linux-modules-nvidia-{suffix(branch, series, flavour)}-{kernel_flavour}"


def dkms_package(branch: str, series: Series, flavour: Flavour) -> str:
    return f"nvidia-dkms-{suffix(branch, series, flavour)}"


def compute_packages(branch: str, series: Series) -> tuple[str, ...]:
    """The headless compute set without a kernel module: CUDA's library, nvidia-smi,
    nvidia-persistenced and the module's shared files, all at the driver's version."""
    name = suffix(branch, series)
    return (
        f"libnvidia-compute-{name}",
        f"nvidia-utils-{name}",
        f"nvidia-compute-utils-{name}",
        f"nvidia-kernel-common-{name}",
    )


def full_driver_package(branch: str, series: Series, flavour: Flavour) -> str:
    return f"nvidia-driver-{suffix(branch, series, flavour)}"


def headless_package(branch: str, series: Series, flavour: Flavour) -> str:
    return f"nvidia-headless-{suffix(branch, series, flavour)}"


ModuleKind = Literal["prebuilt", "dkms"]


def module_choice(
    branch: str,
    series: Series,
    flavour: Flavour,
    kernel: UbuntuKernel | None,
    offered: set[str],
) -> tuple[ModuleKind, str]:
    """Which kernel module package the node gets: Canonical's signed prebuilt one for the
    running kernel where apt offers it, else the DKMS one (built on the node, and signed
    with the node's machine owner key where Secure Boot is on)."""
    if kernel is not None:
        prebuilt = prebuilt_module_package(branch, series, flavour, kernel)
        if prebuilt in offered:
            return "prebuilt", prebuilt
    return "dkms", dkms_package(branch, series, flavour)


# The families whose names carry the kernel module flavour.
_FLAVOURED = ("nvidia-dkms", "nvidia-driver", "nvidia-headless", "linux-modules-nvidia")
# Every Ubuntu driver package gpunode installs or removes, by family, with its suffix.
_FAMILY = re.compile(
    r"(?P<family>libnvidia-compute|nvidia-utils|nvidia-compute-utils|nvidia-kernel-common|"
    r"nvidia-dkms|nvidia-driver|nvidia-headless|linux-modules-nvidia)-"
    r"(?P<branch>[0-9]{3})(?P<server>-server)?(?P<open>-open)?(?P<rest>-.+)?"
)


def other_driver_packages(
    installed: list[str], branch: str, series: Series, flavour: Flavour
) -> list[str]:
    """Installed Ubuntu driver packages of another branch, series or module flavour: what a
    change of any of them removes (a prebuilt module of the same driver for another kernel
    stays: it belongs to that kernel)."""
    stale = []
    for name in installed:
        match = _FAMILY.fullmatch(name)
        if match is None:
            continue
        if match["rest"] and match["family"] != "linux-modules-nvidia":
            continue  # e.g. nvidia-kernel-common-580-server-580.178.04 is a virtual name
        other_driver = match["branch"] != branch or bool(match["server"]) != (series == "server")
        other_flavour = match["family"] in _FLAVOURED and bool(match["open"]) != (flavour == "open")
        if other_driver or other_flavour:
            stale.append(name)
    return sorted(stale)

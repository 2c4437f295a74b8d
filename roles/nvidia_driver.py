"""The NVIDIA driver, pinned and held, from Debian non-free, Ubuntu's archive or NVIDIA's
repository.

What results on a node whose ``nvidia_driver.source`` is not ``none``:

* nouveau is blacklisted (``/etc/modprobe.d/gpunode-nouveau.conf``); the initramfs is rebuilt
  when that file changed and ``update-initramfs`` exists.
* ``/etc/apt/preferences.d/gpunode-nvidia-driver`` pins every driver package to the exact
  ``nvidia_driver.version`` (or, without one, to the newest release of ``branch``) at priority
  1001: NVIDIA's metapackages depend with ``>=``, so naming a version alone is not enough.
* The driver's packages are installed at that version, the other kernel module flavour's
  packages are removed, and every driver package is held (``apt-mark hold``), so neither
  ``apt upgrade`` nor unattended-upgrades moves it. Only a changed version (or branch, or
  flavour) in data changes it: unhold, install the exact versions, hold again. Without a
  version in data, an installed release of the branch stays until data names one.
* Sources: ``nvidia`` installs, as NVIDIA's Debian guide does, the compute-only (headless) set
  ``nvidia-driver-cuda`` with the kernel module (``stack: compute``, the default), or the full
  stack ``nvidia-open`` (open modules) / ``cuda-drivers`` (proprietary) with ``nvidia-driver``
  and ``nvidia-driver-cuda`` (``stack: full``). From branch 590 on NVIDIA locks a branch with
  ``nvidia-driver-pinning-<branch>``: it is installed before the driver, held with it, and
  another branch's is removed; the exact pin below still decides the version. ``debian``
  installs the headless
  compute set of Debian non-free (kernel module, ``nvidia-smi``, ``libcuda1``, and
  ``nvidia-persistenced`` when wanted), never Debian's X11 ``nvidia-driver`` metapackage. For
  the ``debian`` source a missing version resolves at prepare time to the installed one, else
  to the newest Debian offers for the flavour's kernel module (Debian's open module can lag the
  driver, so the whole set is pinned to the module's version).
* ``ubuntu`` (Ubuntu nodes only) installs Ubuntu's compute set of the branch and series
  (gpunode/expected/ubuntu_driver.py: ``libnvidia-compute-<branch>[-server]``,
  ``nvidia-utils-``, ``nvidia-compute-utils-``, ``nvidia-kernel-common-``) at the pinned
  version, with Canonical's signed prebuilt module for the running kernel
  (``linux-modules-nvidia-<branch>[-server][-open]-$(uname -r)``) where apt offers it: it is at
  the kernel's version, held apart, needs no headers and no machine owner key; a DKMS module
  of the same driver goes (it would be loaded instead). Where no prebuilt module exists for
  the kernel, ``nvidia-dkms-<branch>[-server][-open]`` builds it (headers as below). Another
  branch's, series' or flavour's packages go with a change. The prebuilt module is
  whichever build the archive has for the kernel: it depends on the driver's shared files
  at least at its own version, so an exact ``version`` older than that is refused by apt.
  The desktop series with a branch pin alone is refused while NVIDIA's repository is
  configured (its builds carry the same names).
* A driver the mirror does not offer is refused before anything changes on the node: when
  packages are to be installed, each must be offered at the exact version (or, with a branch
  alone, at a version of the branch), the pinning package at all. The nvidia source's come
  from apt's lists of ``apt.cuda_repo_url`` only (Debian's build of a name counts for
  nothing), the debian and ubuntu sources' from any list apt has. Where apt has no lists of
  NVIDIA's repository yet (it is added in this run), or for the ubuntu source of Ubuntu's
  archive (``apt.ubuntu_mirror``, whose sources this run writes), the node is asked once its
  lists are fetched, before the nouveau blacklist and the pin; the ubuntu source then plans
  Canonical's prebuilt module for the running kernel, which that check requires (the next
  run, reading the lists, picks DKMS where the archive has none). The pin is never written
  for a package apt cannot install.
* Secure Boot (facts/secure_boot.py): where the kernel module is to change and the node
  boots with Secure Boot on, a module built by DKMS (every source's but Canonical's
  prebuilt ones) loads only if a machine owner key DKMS signs with is enrolled; otherwise
  the node is refused at prepare time, before anything changes, naming the enrolment step
  (``mokutil --import <key>``, confirmed at the console on the next boot).
* Kernel headers: before a kernel module that builds with DKMS is installed,
  ``linux-headers-$(uname -r)`` must be installed or installable (it is then installed with the
  driver); otherwise the run stops with an error naming the package, at prepare time, before
  anything changes. Whether the module builds with DKMS is read from the package (Depends:
  dkms); where apt does not know the package yet, Debian's are assumed to (all of them do) and
  NVIDIA's are checked again when the operation runs, after the repository was added.
  apt is asked (``AptPackageVersions``) only when the kernel module package is to change:
  a converged node's run never loads apt's cache for the driver.
* nvidia-persistenced is enabled (``persistence_daemon``) and started once the installed module
  is the loaded one; or disabled and stopped.
* Reboot: "reboot required" (loaded kernel module differs from the installed one) is always
  reported. With ``reboot: if-needed`` the node is rebooted and the run waits for it to
  return; with ``never`` it is not. Where ``reboot.command`` is set, that command
  performs the reboot instead (a node whose GPUs are simulated reboots its simulator).
  A rolling change (``gpunode rollout``) defers that reboot (``GPUNODE_DRIVER_REBOOT=defer``
  in the deploy's environment, which no inventory can set): the run only says the node needs
  it, and the rollout reboots the node in a second run once it has read the node's drain
  again (see gpunode/rollout.py).
"""

from __future__ import annotations

import os
import re
import shlex
from io import StringIO
from typing import Any, Literal

from pyinfra import host
from pyinfra.api import OperationError, deploy, operation
from pyinfra.facts.server import Which
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus
from pyinfra.operations import files, server

from facts.apt import AptIndexedRepositories
from facts.container_runtime import (
    AptPackagePolicy,
    is_indexed,
    normalise_url,
    package_state,
    versions_from,
)
from facts.nvidia_packages import AptPackageVersions, NvidiaPackages
from facts.secure_boot import SecureBootState
from gpunode.expected import secure_boot, ubuntu_driver
from gpunode.expected.packages import (
    DriverPackages,
    driver_packages_for,
    module_package,
    ubuntu_driver_packages,
)
from gpunode.model import DesiredState, NvidiaDriver, upstream_version, version_tuple
from gpunode.pyinfra_patches import inner
from gpunode.refusal import REFUSED_EXIT, NodeRefused
from roles.cuda import select_version_shell
from roles.nvidia_repos import nvidia_repositories_for

PREFERENCES_PATH = "/etc/apt/preferences.d/gpunode-nvidia-driver"
NOUVEAU_PATH = "/etc/modprobe.d/gpunode-nouveau.conf"
NOUVEAU_CONF = (
    "# Managed by gpunode (nvidia_driver): the NVIDIA kernel module needs nouveau kept out.\n"
    "blacklist nouveau\n"
    "options nouveau modeset=0\n"
)
PERSISTENCED_UNIT = "nvidia-persistenced.service"

# Names the apt pin covers (apt_preferences globs): NVIDIA's and Debian's driver packages.
# A pinned version that a package does not have (the container toolkit's) has no effect.
PINNED_PACKAGES = (
    "nvidia-*", "libnvidia-*", "libcuda*", "libnv*", "firmware-nvidia-gsp*", "cuda-drivers*",
    "xserver-xorg-video-nvidia*", "libgl1-nvidia-*", "libglx-nvidia*", "libegl-nvidia*",
    "libgles-nvidia*",
)  # fmt: skip
# Driver packages (ERE on the name); held when at the driver's version. Fabric Manager's
# packages share that version but belong to roles/fabric_manager.py.
DRIVER_FAMILY = (
    r"^(nvidia-|libnvidia-|libcuda|libnv|firmware-nvidia-gsp|cuda-drivers|"
    r"xserver-xorg-video-nvidia|lib(gl1|glx|egl|gles)[a-z0-9-]*-nvidia)"
)
FABRIC_MANAGER_FAMILY = r"^(nvidia-fabricmanager|libnvidia-nscq|cuda-drivers-fabricmanager)"
# NVIDIA's branch lock packages (from 590 on; see gpunode/nvidia_releases.py).
PINNING_PACKAGE = re.compile(r"nvidia-driver-pinning-[0-9]{3}")
# Every kernel module package either source ships (proprietary and open).
KERNEL_MODULE_PACKAGES = (
    "nvidia-kernel-dkms",
    "nvidia-kernel-open-dkms",
    "nvidia-open-kernel-dkms",
)

APT_INSTALL = (
    "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
    "--allow-downgrades --allow-change-held-packages "
    "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"
)


# --- which packages ------------------------------------------------------------------------


def render_preferences(spec: DriverPackages) -> str:
    return (
        "# Managed by gpunode (nvidia_driver): the driver stays at this version until the\n"
        "# inventory names another; apt never picks a different one by itself.\n"
        f"Package: {' '.join(PINNED_PACKAGES)}\n"
        f"Pin: version {spec.pin}\n"
        "Pin-Priority: 1001\n"
    )


def in_branch(version: str, branch: str | None) -> bool:
    return branch is None or upstream_version(version).startswith(branch + ".")


def resolve_version(
    wanted: NvidiaDriver, packages: dict[str, str], available: dict[str, list[dict[str, Any]]]
) -> str | None:
    """The exact version to pin: data's; for the debian source without one, the installed
    module's, else the newest Debian offers (in ``branch``). None: the nvidia source's branch
    pin decides. Raises NodeRefused when the debian source has nothing to offer."""
    if wanted.version or wanted.source in ("nvidia", "ubuntu"):
        return wanted.version
    module = module_package(wanted)
    installed = packages.get(module)
    if installed and in_branch(installed, wanted.branch):
        return installed
    offered = [
        entry["version"]
        for entry in available.get(module, [])
        if in_branch(entry["version"], wanted.branch)
    ]
    if not offered:
        branch = f" in branch {wanted.branch}" if wanted.branch else ""
        raise NodeRefused(
            f"{host.name}: apt offers no {module}{branch}; enable Debian's non-free component "
            "(apt.debian_components) and refresh the package lists, or set nvidia_driver.version"
        )
    return max(offered, key=version_tuple)


# --- kernel headers ------------------------------------------------------------------------

HeadersNeed = Literal["not-needed", "present", "install", "missing", "unknown"]


def spec_matches(spec: DriverPackages, entry: dict[str, Any]) -> bool:
    if spec.version:
        return bool(entry["version"] == spec.version)
    return in_branch(entry["version"], spec.branch)


def headers_need(
    spec: DriverPackages, facts: dict[str, Any], available: dict[str, list[dict[str, Any]]]
) -> HeadersNeed:
    """What the kernel module install needs from the running kernel's headers.

    "unknown": apt does not know the module package yet (NVIDIA's repository is being added by
    this run); the operation asks again once it runs.
    """
    if not spec.module_versioned:
        return "not-needed"  # Canonical's prebuilt module: nothing is built on the node
    offered = [entry for entry in available.get(spec.module, []) if spec_matches(spec, entry)]
    if offered:
        builds_with_dkms = any(entry["dkms"] for entry in offered)
    elif spec.source == "debian":
        builds_with_dkms = True  # every Debian NVIDIA kernel module package is a DKMS one
    else:
        return "unknown"
    if not builds_with_dkms:
        return "not-needed"
    headers = facts["headers"]
    if headers["installed"] or headers["build_dir"]:
        return "present"
    return "install" if headers["package"] and available.get(headers["package"]) else "missing"


def apt_offers(module: str, facts: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """What apt offers for the kernel module package and the running kernel's headers, in one
    read. Asked only when the module is to be (re)installed: loading apt's cache costs the
    node more than everything else a converged node's run reads."""
    headers = facts["headers"]["package"]
    return host.get_fact(AptPackageVersions, packages=[module, *([headers] if headers else [])])


def headers_error(facts: dict[str, Any]) -> str:
    package = facts["headers"]["package"] or f"linux-headers-{facts['kernel']}"
    message = (
        f"{host.name}: {package} is not installed and not installable from the configured "
        "repositories; the NVIDIA kernel module cannot be built (install it or use a kernel "
        "with headers)"
    )
    if not facts["package_lists"]:
        message += "; note that apt has no package lists at all: run apt update first"
    return message


@operation()
def kernel_headers(spec: DriverPackages):
    """The running kernel's headers are there (or come with the driver) wherever the driver's
    kernel module must be built with DKMS; otherwise the host stops here, before the nouveau
    blacklist, the apt pin or any package changes. Changes nothing itself.

    + spec: the driver as apt packages (``driver_packages_for``): its kernel module package
      and version decide whether a module is to be built
    """
    facts = host.get_fact(NvidiaPackages)
    package = facts["headers"]["package"]
    if not module_pending(spec, facts["packages"]):
        host.noop(f"{spec.module} already installed: nothing to build")
        return
    need = headers_need(spec, facts, apt_offers(spec.module, facts))
    if need == "missing":
        raise OperationError(headers_error(facts))
    host.noop(
        {
            "not-needed": f"{spec.module} ships a built module (no DKMS): no headers needed",
            "present": f"{package} installed",
            "install": f"{package} is installed with the driver",
            "unknown": f"apt does not know {spec.module} yet: checked again at the install",
        }[need]
    )
    yield from ()


# --- offered by the mirror ------------------------------------------------------------------


def packages_to_fetch(spec: DriverPackages, packages: dict[str, str]) -> list[str]:
    """The driver's packages apt must find for this run: those not installed as ``spec``
    wants them (the pinning package at any version)."""

    def wanted(installed: str | None) -> bool:
        if installed is None:
            return False
        return installed == spec.version if spec.version else in_branch(installed, spec.branch)

    fetch = [name for name in spec.versioned if not wanted(packages.get(name))]
    fetch += [name for name in spec.unversioned if name not in packages]
    if spec.pinning and spec.pinning not in packages:
        fetch.append(spec.pinning)
    return fetch


def unoffered(spec: DriverPackages, fetch: list[str], offered: dict[str, list[str]]) -> list[str]:
    """Which of ``fetch`` apt cannot install as ``spec`` wants: no version of the branch, or
    not the exact version (the pinning package and packages of their own version: none)."""
    missing = []
    for name in fetch:
        versions = offered.get(name, [])
        if name in spec.versioned:
            versions = [version for version in versions if spec_matches(spec, {"version": version})]
        if not versions:
            missing.append(name)
    return missing


def not_offered_message(
    spec: DriverPackages, missing: list[str], offered: dict[str, list[str]], where: str
) -> str:
    wanted = spec.version or f"of branch {spec.branch}"
    shown = [
        f"{name} ({', '.join(offered.get(name, [])) or 'nothing'})"
        if name in spec.versioned
        else name
        for name in missing
    ]
    return (
        f"{host.name}: NVIDIA driver {wanted} is not offered by {where}: missing "
        f"{'; '.join(shown)}; check the repository or mirror, then apt update, or set "
        "nvidia_driver.branch / nvidia_driver.version to a release it offers"
    )


def require_driver_offered(spec: DriverPackages, packages: dict[str, str], url: str) -> bool:
    """Prepare-time check, before the pin or any package changes: refuse a driver the mirror
    does not offer (as ``roles.cuda.require_offered`` does for CUDA, DCGM and the container
    toolkit): the pin is never written for packages apt cannot install.

    The nvidia source's versions come from apt's lists of ``url`` only; the debian and ubuntu
    sources' from any list apt has (the ubuntu source's from the graphics-drivers PPA too,
    where one is configured). False: apt has no lists of ``url`` yet (NVIDIA's repository is
    added in this run; Ubuntu's archive, ``url`` for the ubuntu source, is written by this
    run's base role), so ``driver_offered`` asks the node once they are there."""
    fetch = packages_to_fetch(spec, packages)
    if not fetch:
        return True
    if spec.source == "ubuntu" and not archive_indexed(url):
        return False
    if spec.source == "nvidia":
        policy = host.get_fact(AptPackagePolicy, packages=fetch)
        if not is_indexed(policy, url):
            return False
        offered = {name: versions_from(package_state(policy, name), url) for name in fetch}
        where = url
    else:
        known = host.get_fact(AptPackageVersions, packages=fetch)
        offered = {name: [entry["version"] for entry in known.get(name, [])] for name in fetch}
        where = f"apt's package lists ({spec.source.capitalize()})"
    missing = unoffered(spec, fetch, offered)
    if missing:
        raise NodeRefused(not_offered_message(spec, missing, offered, where))
    return True


def archive_indexed(url: str) -> bool:
    """apt has package lists of the archive at ``url`` (it was in sources at the last update)."""
    return normalise_url(url) in host.get_fact(AptIndexedRepositories)


def offered_check_shell(spec: DriverPackages, fetch: list[str], url: str) -> str:
    """Shell that fails the node, before the pin is written, when apt's lists of ``url`` (fetched
    by this run's update) lack a package of ``fetch`` as ``spec`` wants it."""
    checks = []
    for name in fetch:
        versioned = name in spec.versioned
        select = select_version_shell(
            name,
            url,
            version=spec.version if versioned else None,
            branch=spec.branch if versioned and not spec.version else None,
        )
        message = f"gpunode: {not_offered_message(spec, [name], {}, url)}"
        checks.append(
            f'if [ -z "$({select})" ]; then echo {shlex.quote(message)} >&2; '
            f"exit {REFUSED_EXIT}; fi"
        )
    return "; ".join(checks)


@operation()
def driver_offered(spec: DriverPackages, repository_url: str, fetch: list[str]):
    """The mirror offers the driver ``spec`` names, asked of the node once this run's apt
    update has fetched the repository's lists (they were not there to ask at prepare time);
    otherwise the host stops here, before the nouveau blacklist, the apt pin or any package.
    Changes nothing itself.

    + spec: the driver as apt packages (``driver_packages_for``)
    + repository_url: NVIDIA's repository (``apt.cuda_repo_url``) the packages must come from;
      for the ubuntu source Ubuntu's archive (``apt.ubuntu_mirror``)
    + fetch: the packages this run installs (``packages_to_fetch``)
    """
    yield offered_check_shell(spec, fetch, repository_url)


# --- installed, pinned, held ---------------------------------------------------------------


def installed_driver_version(
    packages: dict[str, str], spec: DriverPackages | None = None
) -> str | None:
    """The apt version of whichever kernel module package is installed; on Ubuntu, of the
    installed compute library (its module package is named per branch, or per kernel)."""
    if spec is not None and spec.source == "ubuntu":
        found = [
            version
            for name, version in sorted(packages.items())
            if re.fullmatch(r"libnvidia-compute-[0-9]{3}(-server)?", name)
        ]
        return found[0] if found else None
    for name in KERNEL_MODULE_PACKAGES:
        if name in packages:
            return packages[name]
    return None


def driver_family(packages: dict[str, str], version: str | None) -> set[str]:
    """Installed driver packages at ``version`` (not Fabric Manager's)."""
    if version is None:
        return set()
    return {
        name
        for name, installed in packages.items()
        if installed == version
        and re.match(DRIVER_FAMILY, name)
        and not re.match(FABRIC_MANAGER_FAMILY, name)
    }


def module_pending(spec: DriverPackages, packages: dict[str, str]) -> bool:
    """Whether the kernel module package is to be (re)installed: only then is a module built,
    so only then do headers matter. Canonical's prebuilt module is at its kernel's version:
    pending while it is not installed, or while the driver it goes with is to change."""
    version = packages.get(spec.anchor)
    if version is None or spec.module not in packages:
        return True
    return version != spec.version if spec.version else not in_branch(version, spec.branch)


def driver_in_place(spec: DriverPackages, packages: dict[str, str], held: set[str]) -> str | None:
    """The installed version when the driver is exactly as ``spec`` wants it, else None."""
    version = packages.get(spec.anchor)
    if version is None or spec.module not in packages:
        return None
    wanted = version == spec.version if spec.version else in_branch(version, spec.branch)
    if not wanted:
        return None
    if any(packages.get(name) != version for name in spec.versioned):
        return None
    if any(name not in packages for name in spec.unversioned):
        return None
    if any(name in packages for name in stale_packages(spec, packages)):
        return None
    if spec.pinning and spec.pinning not in packages:
        return None
    to_hold = driver_family(packages, version) | set(spec.unversioned)
    if spec.pinning:
        to_hold.add(spec.pinning)
    return version if to_hold <= held else None


def stale_packages(spec: DriverPackages, packages: dict[str, str]) -> list[str]:
    """Installed packages of the other flavour, other branches' cuda-drivers-NNN, and other
    branches' pinning packages (they would lock apt onto their branch)."""
    stale = [name for name in spec.conflicting if name in packages]
    if spec.source == "nvidia":
        stale += sorted(
            name
            for name in packages
            if re.fullmatch(r"cuda-drivers-[0-9]{3}", name)
            and name != f"cuda-drivers-{spec.branch}"
        )
        stale += stale_pinning(spec, packages)
    if spec.source == "ubuntu":
        stale += [
            name
            for name in ubuntu_driver.other_driver_packages(
                sorted(packages), str(spec.branch), series_of(spec), spec.flavour
            )
            if name not in stale
        ]
    return stale


def fabric_manager_left_behind(spec: DriverPackages, packages: dict[str, str]) -> list[str]:
    """Ubuntu's Fabric Manager packages the driver change leaves behind: each depends on the
    kernel common files at exactly its own version (packages.ubuntu.com, fabric-manager-580,
    2026-12-07), which this change replaces, so they go in the driver's own transaction (apt
    could not otherwise move the held driver); the Fabric Manager role installs the new
    driver's right after. Not another source's: NVIDIA's repository states no such tie."""
    if spec.source != "ubuntu":
        return []
    return sorted(
        name
        for name, version in packages.items()
        if re.match(FABRIC_MANAGER_FAMILY, name)
        and (version != spec.version if spec.version else not in_branch(version, spec.branch))
    )


def series_of(spec: DriverPackages) -> ubuntu_driver.Series:
    """The Ubuntu series of ``spec``'s packages (their names end in -server, or do not)."""
    return "server" if spec.anchor.endswith(("-server", "-server-open")) else "desktop"


def stale_pinning(spec: DriverPackages, packages: dict[str, str]) -> list[str]:
    return sorted(
        name for name in packages if PINNING_PACKAGE.fullmatch(name) and name != spec.pinning
    )


def hold_command(spec: DriverPackages) -> str:
    """Hold every installed driver package at the module's version, computed on the node
    (NVIDIA's metapackages pull in packages that are not named here)."""
    hold = (
        f"version=$(dpkg-query -W -f='${{Version}}' {spec.anchor}) && "
        "dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n' | "
        "awk -v version=\"$version\" '$1 ~ /^.i/ && $3 == version {print $2}' | "
        f"grep -E {shlex.quote(DRIVER_FAMILY)} | grep -vE {shlex.quote(FABRIC_MANAGER_FAMILY)} | "
        "xargs -r apt-mark hold"
    )
    own_versions = (*spec.unversioned, *([spec.pinning] if spec.pinning else []))
    if own_versions:
        hold += f" && apt-mark hold {' '.join(own_versions)}"
    return hold


def plan_driver(
    spec: DriverPackages,
    facts: dict[str, Any],
    available: dict[str, list[dict[str, Any]]],
    persistence_daemon: bool,
) -> tuple[list[str], str]:
    """(commands, what they do or why none are needed)."""
    packages: dict[str, str] = facts["packages"]
    held = set(facts["held"])
    in_place = driver_in_place(spec, packages, held)
    if in_place:
        return [], f"{spec.describe(in_place)} installed, pinned and held"
    commands = []
    current = installed_driver_version(packages, spec)
    to_unhold = sorted(
        held
        & (
            driver_family(packages, current)
            | set(spec.versioned)
            | set(spec.unversioned)
            | set(spec.conflicting)
            | set(stale_packages(spec, packages))
            | set(fabric_manager_left_behind(spec, packages))
            | ({spec.pinning} if spec.pinning else set())
        )
    )
    if to_unhold:
        commands.append(f"apt-mark unhold {' '.join(map(shlex.quote, to_unhold))}")
    if spec.pinning and spec.pinning not in packages:
        # NVIDIA: install the pinning package before the driver, so that apt resolves the
        # driver inside the branch from the start. It replaces another branch's.
        removals = [f"{name}-" for name in stale_pinning(spec, packages)]
        commands.append(f"{APT_INSTALL} {' '.join(map(shlex.quote, [spec.pinning, *removals]))}")
    suffix = f"={spec.version}" if spec.version else ""
    names = [f"{name}{suffix}" for name in spec.versioned] + list(spec.unversioned)
    module_change = module_pending(spec, packages)
    if module_change and headers_need(spec, facts, available) == "install":
        names.append(facts["headers"]["package"])
    names += [f"{name}-" for name in stale_packages(spec, packages)]
    names += [f"{name}-" for name in fabric_manager_left_behind(spec, packages)]
    commands.append(f"{APT_INSTALL} {' '.join(map(shlex.quote, names))}")
    commands.append(hold_command(spec))
    # The package's own scripts may enable or start it; data decides.
    if persistence_daemon:
        commands.append(f"systemctl enable {PERSISTENCED_UNIT}")
    else:
        commands.append(
            f"if systemctl cat {PERSISTENCED_UNIT} >/dev/null 2>&1; then "
            f"systemctl disable --now {PERSISTENCED_UNIT}; fi"
        )
    action = "upgrade to" if current else "install"
    return commands, f"{action} {spec.describe()}"


@operation()
def driver_packages(spec: DriverPackages, persistence_daemon: bool = True):
    """The driver's packages are installed at ``spec``'s version, the other flavour's are gone,
    and every driver package is held. Refuses, before apt runs, a DKMS module without headers.

    + spec: the driver as apt packages (``driver_packages_for``): source, flavour, branch,
      exact version (None: the newest of the branch), packages to install and to remove
    + persistence_daemon: whether the install leaves nvidia-persistenced enabled, or disables
      and stops it, whatever the package's own scripts do (``nvidia_driver.persistence_daemon``)
    """
    facts = host.get_fact(NvidiaPackages)
    pending = module_pending(spec, facts["packages"])
    available = apt_offers(spec.module, facts) if pending else {}
    commands, summary = plan_driver(spec, facts, available, persistence_daemon)
    if not commands:
        host.noop(summary)
        if facts["installed_module"] is None:
            # E.g. a new kernel for which DKMS could not build the module.
            host.noop(
                f"warning: no NVIDIA kernel module is installed for the running kernel "
                f"{facts['kernel']}; is {facts['headers']['package']} installed?"
            )
        return
    if pending and headers_need(spec, facts, available) == "missing":
        raise OperationError(headers_error(facts))
    yield from commands


# --- after the install ---------------------------------------------------------------------


def persistenced_package(spec: DriverPackages) -> str:
    """The package that ships nvidia-persistenced: its own on Debian and in NVIDIA's
    repository, nvidia-compute-utils-<branch>[-server] on Ubuntu."""
    if spec.source == "ubuntu":
        return next(name for name in spec.versioned if name.startswith("nvidia-compute-utils-"))
    return "nvidia-persistenced"


@operation()
def persistence_daemon(enabled: bool = True, package: str = "nvidia-persistenced"):
    """nvidia-persistenced is enabled and running (once its module is loaded), or neither.

    + enabled: whether it is enabled and running, or disabled and stopped
      (``nvidia_driver.persistence_daemon``)
    + package: the package that ships it (``persistenced_package``)
    """
    facts = host.get_fact(NvidiaPackages)
    if package not in facts["packages"]:
        host.noop(f"{package} is not installed yet: the driver install sets it up")
        return
    is_enabled = host.get_fact(SystemdEnabled, services=[PERSISTENCED_UNIT]).get(
        PERSISTENCED_UNIT, False
    )
    is_running = host.get_fact(SystemdStatus, services=[PERSISTENCED_UNIT]).get(
        PERSISTENCED_UNIT, False
    )
    if enabled:
        if not is_enabled:
            yield f"systemctl enable {PERSISTENCED_UNIT}"
        if is_running:
            if is_enabled:
                host.noop("nvidia-persistenced is enabled and running")
        elif facts["reboot_required"]:
            host.noop(
                "nvidia-persistenced is enabled; it starts with the new kernel module "
                "(reboot pending)"
            )
        else:
            yield f"systemctl start {PERSISTENCED_UNIT}"
        return
    if is_enabled:
        yield f"systemctl disable {PERSISTENCED_UNIT}"
    if is_running:
        yield f"systemctl stop {PERSISTENCED_UNIT}"
    if not is_enabled and not is_running:
        host.noop("nvidia-persistenced is disabled and stopped")


def module_after_install(
    facts: dict[str, Any], install_pending: bool, pending_version: str | None, branch: str | None
) -> str | None:
    """The kernel module version installed once the driver install has run (None: unknown).

    ``pending_version`` is the exact version a pending install brings; without one (branch
    pin, first install) the installed module only counts once it is in the branch."""
    if install_pending and pending_version:
        return upstream_version(pending_version)
    installed = facts["installed_module"]
    if installed is None:
        return None
    if install_pending and not in_branch(installed["version"], branch):
        return None
    return str(installed["version"])


def reboot_needed(
    facts: dict[str, Any],
    install_pending: bool,
    pending_version: str | None,
    branch: str | None,
    flavour: str | None,
) -> tuple[bool, str | None]:
    """(whether the loaded module differs from the one installed after this run, that one)."""
    installed = module_after_install(facts, install_pending, pending_version, branch)
    if not install_pending:
        return bool(facts["reboot_required"]), installed
    loaded = facts["loaded_module"]
    if installed is None or loaded is None or loaded["version"] != installed:
        return True, installed
    return bool(loaded["flavour"] and flavour and loaded["flavour"] != flavour), installed


# The rollout's way to keep the reboot for itself: an environment variable of the deploy's
# process, which an inventory cannot set. Its one value is "defer"; anything else refuses.
REBOOT_DEFERRAL_VARIABLE = "GPUNODE_DRIVER_REBOOT"
REBOOT_DEFERRAL_VALUE = "defer"
# The operation that says a reboot was deferred; gpunode/rollout.py reads its hosts from
# pyinfra's --json results (its REBOOT_DEFERRED_OPERATION).
REBOOT_DEFERRED_NAME = "Driver reboot deferred to the rollout"


def reboot_deferred() -> bool:
    """Whether this run leaves the driver's reboot to the rollout (GPUNODE_DRIVER_REBOOT)."""
    value = os.environ.get(REBOOT_DEFERRAL_VARIABLE)
    if value is None or value == "":
        return False
    if value != REBOOT_DEFERRAL_VALUE:
        raise NodeRefused(
            f"environment variable {REBOOT_DEFERRAL_VARIABLE} is {value[:40]!r}: its one value "
            f"is {REBOOT_DEFERRAL_VALUE!r} (set by gpunode rollout); unset it"
        )
    return True


def driver_reboots_in_this_run(policy: str) -> bool:
    """Whether the driver role of this run reboots a node whose module changes (the Fabric
    Manager and IMEX roles start their services after that reboot, or wait for it)."""
    return policy == "if-needed" and not reboot_deferred()


@operation()
def driver_reboot(
    policy: Literal["never", "if-needed"] = "never",
    install_pending: bool = False,
    pending_version: str | None = None,
    branch: str | None = None,
    flavour: str | None = None,
    reboot_command: tuple[str, ...] = (),
    deferred: bool = False,
):
    """
    Make the loaded NVIDIA kernel module the installed one: reboot when it is not.

    + policy: ``if-needed`` reboots; ``never`` only reports the pending reboot
    + install_pending: the driver install of this run changes the installed module
    + pending_version: the version that install brings (else the newest of ``branch``)
    + branch: the pinned driver branch
    + flavour: the kernel module flavour that install brings
    + reboot_command: argv that performs the reboot instead of the system's own; the run
      does not wait for the node then
    + deferred: the rollout reboots the node itself, after reading its drain again: the
      operation only marks the node as needing its reboot (a change, so that pyinfra's
      results name it)
    """
    facts = host.get_fact(NvidiaPackages)
    loaded = facts["loaded_module"]
    required, installed = reboot_needed(facts, install_pending, pending_version, branch, flavour)
    if installed is None and not install_pending:
        host.noop("no NVIDIA kernel module is installed for the running kernel")
        return
    loaded_text = loaded["version"] if loaded else "none"
    if not required:
        host.noop(f"the loaded NVIDIA kernel module is the installed one ({loaded_text})")
        return
    host.noop(
        f"reboot required: loaded NVIDIA kernel module {loaded_text}, installed "
        f"{installed or 'the new driver'}"
    )
    if policy == "never":
        host.noop("not rebooting: nvidia_driver.reboot is 'never'")
        return
    if deferred:
        # A command, not a no-op: pyinfra's --json results list a host under an operation's
        # "success" only where it changed (pyinfra 3.10.0's pyinfra_cli/prints.py, read
        # 2026-12-07), and that list is how the rollout learns which nodes wait for their
        # reboot. It changes nothing on the node.
        yield "true"
        return
    if reboot_command:
        yield shlex.join(reboot_command)
    else:
        yield from inner(server.reboot)(delay=10, interval=2, reboot_timeout=900)


@operation()
def driver_left_alone():
    """Nothing: the driver is not gpunode's to manage on this host."""
    host.noop("NVIDIA driver left alone: nvidia_driver.source is 'none'")
    yield from ()


# --- the role ------------------------------------------------------------------------------


@deploy("NVIDIA driver")
def nvidia_driver(desired: DesiredState) -> None:
    wanted = desired.nvidia_driver
    if wanted.source == "none":
        driver_left_alone(name="NVIDIA driver (source: none)")
        return
    facts = host.get_fact(NvidiaPackages)
    if wanted.source == "ubuntu":
        mixed = ubuntu_pin_problem(wanted, nvidia_repositories_for(desired)[0].needed)
        if mixed:
            raise NodeRefused(f"{host.name}: {mixed}")
        spec = ubuntu_spec(wanted, facts, desired.apt.ubuntu_mirror)
        _converge_driver(desired, wanted, spec, facts)
        return
    # The headers verdict for the debian source does not depend on the version resolved
    # below, so a node without headers gets that message rather than a version problem.
    early = driver_packages_for(wanted, wanted.version)
    # Without a pending module change nothing below reads apt: the installed module is the
    # wanted one, and the debian source's version resolves to it.
    available: dict[str, list[dict[str, Any]]] = {}
    if module_pending(early, facts["packages"]):
        available = apt_offers(module_package(wanted), facts)
        if headers_need(early, facts, available) == "missing":
            raise NodeRefused(headers_error(facts))
    spec = driver_packages_for(wanted, resolve_version(wanted, facts["packages"], available))
    _converge_driver(desired, wanted, spec, facts, available)


def module_kind(spec: DriverPackages) -> secure_boot.ModuleKind:
    """Canonical's signed prebuilt module, or one built (and signed) on the node by DKMS;
    a module from NVIDIA's or Debian's packages counts as the latter: no key the firmware
    trusts out of the box signs it."""
    return "prebuilt" if not spec.module_versioned else "dkms"


def require_loadable_under_secure_boot(spec: DriverPackages) -> None:
    """Prepare-time, before anything changes: a kernel module change that would not load
    under the node's Secure Boot (a DKMS module without an enrolled machine owner key) is
    refused, naming the enrolment step; the node would otherwise reboot without its GPUs."""
    reason = secure_boot.unloadable_reason(host.get_fact(SecureBootState), module_kind(spec))
    if reason:
        raise NodeRefused(f"{host.name}: {spec.describe()} not installed: {reason}")


def ubuntu_pin_problem(wanted: NvidiaDriver, cuda_repository_needed: bool) -> str | None:
    """Why a branch-only pin of Ubuntu's desktop series is unsafe here, or None.

    NVIDIA's Ubuntu tree builds the desktop series' names too (libnvidia-compute-<branch>,
    nvidia-dkms-<branch>-open: research anchors §27), at other versions than Ubuntu's; with
    its repository configured (CUDA toolkits, DCGM, NCCL) a pin to ``<branch>.*`` lets apt
    take NVIDIA's builds beside Canonical's module. The -server series is Ubuntu's alone,
    and an exact version is one archive's."""
    if wanted.ubuntu_series != "desktop" or wanted.version or not cuda_repository_needed:
        return None
    return (
        f"nvidia_driver.source 'ubuntu' pins branch {wanted.branch} of the desktop series "
        "only, while NVIDIA's repository is configured too: its builds of the same package "
        "names would win; set nvidia_driver.version to Ubuntu's exact version, or "
        "ubuntu_series: server"
    )


def ubuntu_spec(wanted: NvidiaDriver, facts: dict[str, Any], archive_url: str) -> DriverPackages:
    """The ubuntu source's packages for this node: Canonical's signed prebuilt module for the
    running kernel where apt offers it, else DKMS (apt is asked only while the module
    package is not installed: a converged node's run never loads apt's cache).

    Where apt has no lists of Ubuntu's archive (``archive_url``) yet, its sources being
    written by this run's base role (a node whose archive was another mirror), what it
    offers is not known at prepare time: the prebuilt module is assumed, and
    ``driver_offered`` fails the node after this run's apt update, before the pin or any
    package, if the archive has none for the running kernel; DKMS is then chosen by the next
    run, which reads the lists. Choosing DKMS here instead would be replaced by the prebuilt
    module on the next run: the first converge would not be the last."""
    kernel = ubuntu_driver.parse_kernel_release(facts["kernel"] or "")
    if kernel is None:
        raise NodeRefused(
            f"{host.name}: the running kernel {str(facts['kernel'])[:80]!r} is not named as "
            "Ubuntu names its kernels (6.8.0-49-generic): no prebuilt NVIDIA module can be "
            "matched to it"
        )
    branch, series = str(wanted.branch), wanted.ubuntu_series
    prebuilt = ubuntu_driver.prebuilt_module_package(branch, series, wanted.flavour, kernel)
    if prebuilt in facts["packages"] or not archive_indexed(archive_url):
        offered = {prebuilt}
    else:
        offered = set(host.get_fact(AptPackageVersions, packages=[prebuilt]))
    return ubuntu_driver_packages(wanted, wanted.version, kernel, offered)


def _converge_driver(
    desired: DesiredState,
    wanted: NvidiaDriver,
    spec: DriverPackages,
    facts: dict[str, Any],
    available: dict[str, list[dict[str, Any]]] | None = None,
) -> None:
    available = available or {}
    if module_pending(spec, facts["packages"]):
        require_loadable_under_secure_boot(spec)
        available = available or apt_offers(spec.module, facts)
        if headers_need(spec, facts, available) == "missing":
            raise NodeRefused(headers_error(facts))
    install_pending = bool(plan_driver(spec, facts, available, wanted.persistence_daemon)[0])
    url = desired.apt.ubuntu_mirror if spec.source == "ubuntu" else desired.apt.cuda_repo_url
    if install_pending and not require_driver_offered(spec, facts["packages"], url):
        driver_offered(
            name="NVIDIA driver offered by the repository (asked once its lists are fetched)",
            spec=spec,
            repository_url=url,
            fetch=packages_to_fetch(spec, facts["packages"]),
        )

    kernel_headers(name="Kernel headers for the NVIDIA kernel module", spec=spec)
    blacklist = files.put(
        name="nouveau blacklisted",
        src=StringIO(NOUVEAU_CONF),
        dest=NOUVEAU_PATH,
        mode="644",
    )
    # Decided at prepare time (not with _if) so that --dry shows it as a definite change.
    if host.get_fact(Which, command="update-initramfs") and blacklist.will_change:
        server.shell(name="initramfs without nouveau", commands=["update-initramfs -u"])
    files.put(
        name=f"apt pin: driver packages at {spec.pin}",
        src=StringIO(render_preferences(spec)),
        dest=PREFERENCES_PATH,
        mode="644",
    )
    driver_packages(
        name=f"{spec.describe()}: installed and held",
        spec=spec,
        persistence_daemon=wanted.persistence_daemon,
    )
    persistence_daemon(
        name="nvidia-persistenced " + ("enabled" if wanted.persistence_daemon else "disabled"),
        enabled=wanted.persistence_daemon,
        package=persistenced_package(spec),
    )
    deferred = reboot_deferred()
    driver_reboot(
        # Its own name when deferred: the rollout reads the deferral apart from a reboot in
        # pyinfra's results (every host of a run shares the environment, so the name).
        name=REBOOT_DEFERRED_NAME
        if deferred
        else f"Loaded kernel module is the installed one (reboot: {wanted.reboot})",
        policy=wanted.reboot,
        install_pending=install_pending,
        pending_version=spec.version,
        branch=spec.branch,
        flavour=spec.flavour,
        reboot_command=desired.reboot.command,
        deferred=deferred,
    )

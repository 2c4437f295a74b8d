"""NVIDIA Fabric Manager: on NVSwitch nodes only, at exactly the driver's version, held.

What results:

* Nodes that need it (``DesiredState.needs_fabric_manager``; the ``nvidia`` or ``ubuntu``
  driver source, as validation enforces): Fabric Manager's packages from the driver's own
  source installed at exactly the driver's version (``fabric_manager.version``, else
  ``nvidia_driver.version``, else the installed driver's), held, and covered by the driver
  role's apt pin. NVIDIA's repository: ``nvidia-fabricmanager-<branch>`` up to 575,
  ``nvidia-fabricmanager`` with ``libnvidia-nscq`` from 580. Ubuntu's archive (multiverse):
  ``nvidia-fabricmanager-<branch>`` with ``libnvidia-nscq-<branch>`` for every branch, which
  need the server series' kernel common files at their own version. The ``nvidia-fabricmanager``
  service is enabled, so it comes up with the boot that loads the matching module, and started
  only while the loaded driver is that version: Fabric Manager refuses any other. Until then it
  is reported as pending a reboot.
* Blackwell-generation NVSwitch systems (``expected_hardware.gpu_model`` a Blackwell GPU and
  ``nvswitch`` true) also get the NVLink Subnet Manager, ``nvlsm``: its own (calver) version,
  ``fabric_manager.nvlsm_version`` or held at the version first installed.
* Nodes that do not need it: never installed. An installed one is removed (with its hold) only
  where data says so for certain: ``fabric_manager.mode: never``, or ``auto`` with
  ``expected_hardware.nvswitch: false``. With ``nvswitch`` unknown it is reported and left, as
  removing Fabric Manager from an NVSwitch system leaves its GPUs unusable.
* ``nvidia_driver.source: none``: nothing (the driver, and so the version, is not gpunode's).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from typing import Any

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from facts.nvidia_packages import NvidiaPackages
from gpunode.expected import ubuntu_driver
from gpunode.expected.packages import NVLSM_PACKAGE, fabric_manager_packages
from gpunode.model import DesiredState, upstream_version
from roles.cuda import held_packages
from roles.nvidia_driver import APT_INSTALL, driver_reboots_in_this_run, installed_driver_version

SERVICE = "nvidia-fabricmanager.service"
# Fabric Manager packages of every branch (NSCQ and the combined metapackages too).
FABRIC_MANAGER_PACKAGE = re.compile(
    r"(nvidia-fabricmanager(-[0-9]{3})?|libnvidia-nscq(-[0-9]{3})?|"
    r"cuda-drivers-fabricmanager(-[0-9]{3})?)"
)
# Fabric Manager's own packages (not the combined metapackages), either naming era.
OWN_PACKAGE = re.compile(r"(nvidia-fabricmanager|libnvidia-nscq)(-[0-9]{3})?")
# The driver's apt version on the node, for a first install whose version data leaves open:
# the driver role installs it earlier in the run. NVIDIA's repository: nvidia-driver (both
# flavours have it); Ubuntu's archive: the branch's compute library (every Ubuntu install has
# it, whatever its kernel module package).
INSTALLED_DRIVER_VERSION = "$(dpkg-query -W -f='${{Version}}' {package})"
NVIDIA_DRIVER_PACKAGE = "nvidia-driver"


def driver_version_package(
    branch: str, source: str, ubuntu_series: ubuntu_driver.Series = "server"
) -> str:
    """The package whose installed version is the driver's, for ``source``."""
    if source == "ubuntu":
        return ubuntu_driver.compute_packages(branch, ubuntu_series)[0]
    return NVIDIA_DRIVER_PACKAGE


def _words(names: Iterable[str]) -> str:
    """Package names (read from the node, too) as shell words."""
    return " ".join(shlex.quote(name) for name in names)


def package_name(branch: str, source: str = "nvidia") -> str:
    """The package that ships the ``nv-fabricmanager`` daemon for ``branch`` from ``source``."""
    return fabric_manager_packages(branch, source)[0]


def installed_fabric_manager(packages: dict[str, str]) -> dict[str, str]:
    return {name: v for name, v in packages.items() if FABRIC_MANAGER_PACKAGE.fullmatch(name)}


def loaded_after_driver(
    facts: dict[str, Any], driver_reboots: bool, driver_version: str | None
) -> str | None:
    """The driver loaded once the driver role has run. With ``reboot: if-needed`` that role
    reboots into the installed driver, so a --dry run can predict what follows the reboot
    (not where a rollout defers that reboot: ``driver_reboots`` is false then)."""
    loaded = facts["loaded_module"]
    if driver_reboots:
        if driver_version:
            return upstream_version(driver_version)
        if facts["installed_module"]:
            return str(facts["installed_module"]["version"])
    return str(loaded["version"]) if loaded else None


def plan_fabric_manager(
    branch: str,
    version: str | None,
    facts: dict[str, Any],
    running: bool,
    loaded: str | None,
    source: str = "nvidia",
    ubuntu_series: ubuntu_driver.Series = "server",
) -> tuple[list[str], list[str]]:
    """(commands, notes) that install ``branch``'s Fabric Manager from the driver's
    ``source`` at ``version`` (None: the installed driver's), hold it, enable it and start it
    once the loaded driver matches."""
    packages: dict[str, str] = facts["packages"]
    held = set(facts["held"])
    names = fabric_manager_packages(branch, source)
    version_package = driver_version_package(branch, source, ubuntu_series)
    version = version or (
        packages.get(version_package) if source == "ubuntu" else installed_driver_version(packages)
    )
    # Another branch's, or the other naming era's (580 moved to unsuffixed names).
    others = sorted(
        other for other in packages if OWN_PACKAGE.fullmatch(other) and other not in names
    )
    matches = version is not None and loaded == upstream_version(version)
    in_place = all(packages.get(name) == version and name in held for name in names)
    if version is not None and in_place and not others:
        return [], []
    to_unhold = sorted(held & (set(names) | set(others)))
    commands = [f"apt-mark unhold {_words(to_unhold)}"] if to_unhold else []
    # The installed driver's version is read on the node when no version is pinned.
    wanted = (
        shlex.quote(version)
        if version
        else INSTALLED_DRIVER_VERSION.format(package=shlex.quote(version_package))
    )
    removals = _words(f"{other}-" for other in others)
    installs = " ".join(f"{shlex.quote(name)}={wanted}" for name in names)
    commands.append(f"{APT_INSTALL} {installs}" + (f" {removals}" if removals else ""))
    commands.append(f"apt-mark hold {_words(names)}")
    commands.append(f"systemctl enable {SERVICE}")
    notes = []
    if matches:
        # A running Fabric Manager of the old version must give way to the new one.
        commands.append(f"systemctl {'restart' if running else 'start'} {SERVICE}")
    else:
        notes.append(pending_note(version, loaded))
    return commands, notes


def pending_note(version: str | None, loaded: str | None) -> str:
    wanted = upstream_version(version) if version else "the installed driver's version"
    return (
        f"nvidia-fabricmanager {wanted} not started: pending a reboot into the matching driver "
        f"(loaded: {loaded or 'none'})"
    )


@operation()
def fabric_manager_package(
    branch: str,
    version: str | None = None,
    driver_reboots: bool = False,
    driver_version: str | None = None,
    source: str = "nvidia",
    ubuntu_series: ubuntu_driver.Series = "server",
):
    """``branch``'s Fabric Manager packages from the driver's source (NVIDIA's repository:
    ``nvidia-fabricmanager-<branch>`` up to 575, ``nvidia-fabricmanager`` and
    ``libnvidia-nscq`` from 580; Ubuntu's archive: ``nvidia-fabricmanager-<branch>`` and
    ``libnvidia-nscq-<branch>``) are installed at exactly ``version`` (None: the installed
    driver's) and held; no other branch's are; the service is enabled, and started when the
    loaded driver is that version.

    + branch: the driver branch (``nvidia_driver.branch``, e.g. ``550``) whose package is installed
    + version: the exact apt version (``fabric_manager.version``, else
      ``nvidia_driver.version``); None: the installed driver's
    + driver_reboots: the driver role reboots into its ``driver_version`` if needed
      (``nvidia_driver.reboot: if-needed``), so the driver loaded after it is that version
    + driver_version: the driver's declared apt version (``nvidia_driver.version``), or None
    + source: the driver's source (``nvidia_driver.source``: ``nvidia`` or ``ubuntu``)
    + ubuntu_series: the Ubuntu driver series (``nvidia_driver.ubuntu_series``)
    """
    facts = host.get_fact(NvidiaPackages)
    running = _service_running()
    loaded = loaded_after_driver(facts, driver_reboots, driver_version)
    commands, notes = plan_fabric_manager(
        branch, version, facts, running, loaded, source, ubuntu_series
    )
    for note in notes:
        host.noop(note)
    if not commands:
        name = package_name(branch, source)
        host.noop(f"{name} {facts['packages'][name]} installed and held")
    yield from commands


def _service_running() -> bool:
    return bool(host.get_fact(SystemdStatus, services=[SERVICE]).get(SERVICE, False))


@operation()
def fabric_manager_service(
    branch: str,
    driver_reboots: bool = False,
    driver_version: str | None = None,
    source: str = "nvidia",
):
    """nvidia-fabricmanager is enabled, and running while the loaded driver is its version;
    otherwise it is reported as pending a reboot.

    + branch: the driver branch whose Fabric Manager package provides the service
    + driver_reboots: as for the package: the driver role reboots into ``driver_version`` if
      needed
    + driver_version: the driver's declared apt version (``nvidia_driver.version``), or None
    + source: the driver's source, whose Fabric Manager package provides the service
    """
    facts = host.get_fact(NvidiaPackages)
    installed = facts["packages"].get(package_name(branch, source))
    if installed is None:
        host.noop("nvidia-fabricmanager is not installed yet: its install sets the service up")
        return
    enabled = host.get_fact(SystemdEnabled, services=[SERVICE]).get(SERVICE, False)
    running = _service_running()
    if not enabled:
        yield f"systemctl enable {SERVICE}"
    loaded = loaded_after_driver(facts, driver_reboots, driver_version)
    if loaded != upstream_version(installed):
        host.noop(pending_note(installed, loaded))
        return
    if not running:
        yield f"systemctl start {SERVICE}"
    elif enabled:
        host.noop(f"nvidia-fabricmanager {upstream_version(installed)} enabled and running")


@operation()
def fabric_manager_absent(remove: bool):
    """No Fabric Manager package is installed (``remove``), or any that is, is reported.

    + remove: whether data says for certain that the node has no NVSwitch
      (``fabric_manager.mode: never``, or ``expected_hardware.nvswitch: false``): only then
      are installed packages removed, with their holds
    """
    facts = host.get_fact(NvidiaPackages)
    installed = installed_fabric_manager(facts["packages"])
    if not installed:
        host.noop("no Fabric Manager package installed (this node does not need one)")
        return
    names = sorted(installed)
    if not remove:
        host.noop(
            f"Fabric Manager installed ({', '.join(names)}) but not declared; left in place "
            "because expected_hardware.nvswitch is unknown (set it, or fabric_manager.mode)"
        )
        return
    held = sorted(set(facts["held"]) & set(names))
    if held:
        yield f"apt-mark unhold {_words(held)}"
    yield f"DEBIAN_FRONTEND=noninteractive apt-get remove -y -q {_words(names)}"


@operation()
def fabric_manager_left_alone():
    """Nothing: without a managed driver there is no version for Fabric Manager to match."""
    host.noop("Fabric Manager left alone: nvidia_driver.source is 'none'")
    yield from ()


@deploy("NVIDIA Fabric Manager")
def fabric_manager(desired: DesiredState) -> None:
    driver = desired.nvidia_driver
    if driver.source == "none":
        fabric_manager_left_alone(name="Fabric Manager (nvidia_driver.source: none)")
        return
    if not desired.needs_fabric_manager:
        certain = desired.fabric_manager.mode == "never" or (
            desired.expected_hardware.nvswitch is False
        )
        fabric_manager_absent(name="No Fabric Manager (no NVSwitch)", remove=certain)
        return
    branch = str(driver.branch)
    version = desired.fabric_manager.version or driver.version
    reboots = driver_reboots_in_this_run(driver.reboot)
    fabric_manager_package(
        name=f"{package_name(branch, driver.source)} at the driver's version, held",
        branch=branch,
        version=version,
        driver_reboots=reboots,
        driver_version=driver.version,
        source=driver.source,
        ubuntu_series=driver.ubuntu_series,
    )
    fabric_manager_service(
        name="nvidia-fabricmanager enabled, running with its driver",
        branch=branch,
        driver_reboots=reboots,
        driver_version=driver.version,
        source=driver.source,
    )
    if desired.needs_nvlsm:
        # Blackwell NVSwitch systems: the NVLink Subnet Manager, a calver package of its own.
        held_packages(
            name=f"{NVLSM_PACKAGE} {desired.fabric_manager.nvlsm_version or '(unpinned)'}, held",
            packages=[NVLSM_PACKAGE],
            repository_url=desired.apt.cuda_repo_url,
            version=desired.fabric_manager.nvlsm_version,
        )

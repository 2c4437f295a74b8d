"""Fabric Manager role: the driver's version exactly, held, started only with its driver."""

from __future__ import annotations

from typing import Any

from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from facts.nvidia_packages import NvidiaPackages
from roles.fabric_manager import (
    INSTALLED_DRIVER_VERSION,
    fabric_manager_absent,
    fabric_manager_left_alone,
    fabric_manager_package,
    fabric_manager_service,
)
from roles.nvidia_driver import APT_INSTALL

from .fakehost import commands_of

UNIT = "nvidia-fabricmanager.service"
FM = "nvidia-fabricmanager-550"


def node(
    installed: dict[str, str] | None = None,
    held: tuple[str, ...] = (),
    loaded: str | None = "550.127.08",
) -> dict[str, Any]:
    """A NvidiaPackages fact value (only what this role reads)."""
    return {
        "packages": {"nvidia-kernel-open-dkms": "550.127.08-1", **(installed or {})},
        "held": sorted(held),
        "loaded_module": {"version": loaded, "flavour": None, "source": "simulator"}
        if loaded
        else None,
        "installed_module": {"version": "550.127.08", "flavour": "open", "source": "lab"},
    }


def package(facts: dict[str, Any], running: bool = False, **kwargs: Any):
    return commands_of(
        fabric_manager_package,
        {NvidiaPackages: facts, SystemdStatus: {UNIT: running}},
        branch="550",
        **kwargs,
    )


def service(facts: dict[str, Any], enabled: bool, running: bool, **kwargs: Any):
    return commands_of(
        fabric_manager_service,
        {NvidiaPackages: facts, SystemdEnabled: {UNIT: enabled}, SystemdStatus: {UNIT: running}},
        branch="550",
        **kwargs,
    )


# --- the package ----------------------------------------------------------------------------


def test_first_install_at_the_driver_version_held_enabled_started_with_its_driver() -> None:
    commands, noops = package(node(), version="550.127.08-1")
    assert commands == [
        f"{APT_INSTALL} {FM}=550.127.08-1",
        f"apt-mark hold {FM}",
        f"systemctl enable {UNIT}",
        f"systemctl start {UNIT}",
    ]
    assert noops == []


def test_not_started_while_another_driver_is_loaded() -> None:
    commands, noops = package(node(loaded="590.48.01"), version="550.127.08-1")
    assert f"systemctl start {UNIT}" not in commands
    assert commands[-1] == f"systemctl enable {UNIT}"
    assert noops == [
        "nvidia-fabricmanager 550.127.08 not started: pending a reboot into the matching driver "
        "(loaded: 590.48.01)"
    ]


def test_a_driver_reboot_in_the_same_run_counts_as_loaded() -> None:
    # reboot: if-needed: the driver role reboots into its version before this runs.
    facts = node(loaded="590.48.01")
    commands, noops = package(
        facts, version="550.127.08-1", driver_reboots=True, driver_version="550.127.08-1"
    )
    assert commands[-1] == f"systemctl start {UNIT}"
    assert noops == []


def test_installed_at_the_version_and_held_is_left_alone() -> None:
    facts = node({FM: "550.127.08-1"}, held=(FM,))
    commands, noops = package(facts, running=True, version="550.127.08-1")
    assert commands == []
    assert noops == [f"{FM} 550.127.08-1 installed and held"]


def test_upgrade_unholds_installs_holds_and_restarts_a_running_one() -> None:
    facts = node({FM: "550.127.08-1"}, held=(FM,), loaded="550.144.03")
    commands, _ = package(facts, running=True, version="550.144.03-1")
    assert commands == [
        f"apt-mark unhold {FM}",
        f"{APT_INSTALL} {FM}=550.144.03-1",
        f"apt-mark hold {FM}",
        f"systemctl enable {UNIT}",
        f"systemctl restart {UNIT}",
    ]


def test_without_a_version_in_data_the_installed_driver_decides() -> None:
    commands, _ = package(node())
    assert commands[0] == f"{APT_INSTALL} {FM}=550.127.08-1"
    # Before the driver is installed (a --dry run), the node works it out after the driver.
    nothing: dict[str, Any] = {
        "packages": {},
        "held": [],
        "loaded_module": None,
        "installed_module": None,
    }
    commands, noops = package(nothing)
    read_on_node = INSTALLED_DRIVER_VERSION.format(package="nvidia-driver")
    assert commands[0] == f"{APT_INSTALL} {FM}={read_on_node}"
    assert "pending a reboot" in noops[0]


def test_another_branchs_fabric_manager_is_replaced() -> None:
    facts = node({"nvidia-fabricmanager-570": "570.124.06-1"}, held=("nvidia-fabricmanager-570",))
    commands, _ = package(facts, version="550.127.08-1")
    assert commands[0] == "apt-mark unhold nvidia-fabricmanager-570"
    assert commands[1] == f"{APT_INSTALL} {FM}=550.127.08-1 nvidia-fabricmanager-570-"


# --- the service ----------------------------------------------------------------------------


def test_service_enabled_and_running_with_its_driver_is_left_alone() -> None:
    facts = node({FM: "550.127.08-1"})
    assert service(facts, enabled=True, running=True) == (
        [],
        ["nvidia-fabricmanager 550.127.08 enabled and running"],
    )


def test_stopped_service_is_started_when_its_driver_is_loaded() -> None:
    facts = node({FM: "550.127.08-1"})
    assert service(facts, enabled=False, running=False) == (
        [f"systemctl enable {UNIT}", f"systemctl start {UNIT}"],
        [],
    )


def test_service_is_reported_pending_a_reboot_when_another_driver_is_loaded() -> None:
    facts = node({FM: "550.127.08-1"}, loaded="590.48.01")
    commands, noops = service(facts, enabled=True, running=False)
    assert commands == []
    assert noops == [
        "nvidia-fabricmanager 550.127.08 not started: pending a reboot into the matching driver "
        "(loaded: 590.48.01)"
    ]


def test_service_starts_after_the_driver_roles_reboot() -> None:
    facts = node({FM: "550.127.08-1"}, loaded="590.48.01")
    assert service(facts, enabled=True, running=False, driver_reboots=True) == (
        [f"systemctl start {UNIT}"],
        [],
    )


def test_service_of_a_package_not_installed_yet_is_the_installs_business() -> None:
    commands, noops = service(node(), enabled=False, running=False)
    assert commands == []
    assert noops == ["nvidia-fabricmanager is not installed yet: its install sets the service up"]


# --- nodes without NVSwitches ----------------------------------------------------------------


def test_nothing_installed_nothing_to_remove() -> None:
    commands, noops = commands_of(fabric_manager_absent, {NvidiaPackages: node()}, remove=True)
    assert commands == []
    assert noops == ["no Fabric Manager package installed (this node does not need one)"]


def test_declared_absent_fabric_manager_is_removed_with_its_hold() -> None:
    facts = node({FM: "550.127.08-1", "libnvidia-nscq-550": "550.127.08-1"}, held=(FM,))
    commands, _ = commands_of(fabric_manager_absent, {NvidiaPackages: facts}, remove=True)
    assert commands == [
        f"apt-mark unhold {FM}",
        f"DEBIAN_FRONTEND=noninteractive apt-get remove -y -q libnvidia-nscq-550 {FM}",
    ]


def test_fabric_manager_is_left_where_nvswitch_presence_is_unknown() -> None:
    facts = node({FM: "550.127.08-1"}, held=(FM,))
    commands, noops = commands_of(fabric_manager_absent, {NvidiaPackages: facts}, remove=False)
    assert commands == []
    assert noops == [
        f"Fabric Manager installed ({FM}) but not declared; left in place because "
        "expected_hardware.nvswitch is unknown (set it, or fabric_manager.mode)"
    ]


def test_source_none_leaves_fabric_manager_alone() -> None:
    assert commands_of(fabric_manager_left_alone, {}) == (
        [],
        ["Fabric Manager left alone: nvidia_driver.source is 'none'"],
    )


# --- from 580: unsuffixed nvidia-fabricmanager with libnvidia-nscq ----------------------------


def node_580(installed: dict[str, str] | None = None, held: tuple[str, ...] = ()) -> dict[str, Any]:
    facts = node(installed=installed, held=held, loaded="580.95.05")
    facts["packages"]["nvidia-kernel-open-dkms"] = "580.95.05-1"
    facts["installed_module"] = {"version": "580.95.05", "flavour": "open", "source": "modinfo"}
    return facts


def test_from_580_fabric_manager_is_unsuffixed_with_nscq_at_the_driver_version() -> None:
    commands, _ = commands_of(
        fabric_manager_package,
        {NvidiaPackages: node_580(), SystemdStatus: {UNIT: False}},
        branch="580",
        version="580.95.05-1",
    )
    assert commands[:2] == [
        f"{APT_INSTALL} nvidia-fabricmanager=580.95.05-1 libnvidia-nscq=580.95.05-1",
        "apt-mark hold nvidia-fabricmanager libnvidia-nscq",
    ]


def test_moving_from_570_to_580_replaces_the_suffixed_packages() -> None:
    old = {"nvidia-fabricmanager-570": "570.195.03-1", "libnvidia-nscq-570": "570.195.03-1"}
    commands, _ = commands_of(
        fabric_manager_package,
        {NvidiaPackages: node_580(installed=old, held=tuple(old)), SystemdStatus: {UNIT: True}},
        branch="580",
        version="580.95.05-1",
    )
    assert commands[0] == "apt-mark unhold libnvidia-nscq-570 nvidia-fabricmanager-570"
    assert commands[1].endswith(
        "libnvidia-nscq=580.95.05-1 libnvidia-nscq-570- nvidia-fabricmanager-570-"
    )


def test_unsuffixed_fabric_manager_at_its_version_and_held_is_left_alone() -> None:
    installed = {"nvidia-fabricmanager": "580.95.05-1", "libnvidia-nscq": "580.95.05-1"}
    commands, noops = commands_of(
        fabric_manager_package,
        {NvidiaPackages: node_580(installed, held=tuple(installed)), SystemdStatus: {UNIT: True}},
        branch="580",
        version="580.95.05-1",
    )
    assert commands == []
    assert noops == ["nvidia-fabricmanager 580.95.05-1 installed and held"]
    # nscq unheld (by hand): the pair is installed and held again.
    commands, _ = commands_of(
        fabric_manager_package,
        {
            NvidiaPackages: node_580(installed, held=("nvidia-fabricmanager",)),
            SystemdStatus: {UNIT: True},
        },
        branch="580",
        version="580.95.05-1",
    )
    assert "apt-mark hold nvidia-fabricmanager libnvidia-nscq" in commands


# --- Ubuntu's archive (nvidia_driver.source: ubuntu) ---------------------------------------

UBUNTU_580 = "580.173.02-0ubuntu0.24.04.1"


def ubuntu_node(
    installed: dict[str, str] | None = None, held: tuple[str, ...] = (), loaded: str = "580.173.02"
) -> dict[str, Any]:
    """An Ubuntu node with the 580 server compute set and Canonical's prebuilt module."""
    return {
        "packages": {
            "libnvidia-compute-580-server": UBUNTU_580,
            "linux-modules-nvidia-580-server-open-6.8.0-64-generic": "6.8.0-64.67+1",
            **(installed or {}),
        },
        "held": sorted(held),
        "loaded_module": {"version": loaded, "flavour": "open", "source": "simulator"},
        "installed_module": {"version": "580.173.02", "flavour": "open", "source": "modinfo"},
    }


def ubuntu_package(facts: dict[str, Any], running: bool = False, **kwargs: Any):
    return commands_of(
        fabric_manager_package,
        {NvidiaPackages: facts, SystemdStatus: {UNIT: running}},
        branch="580",
        source="ubuntu",
        **kwargs,
    )


def test_ubuntus_fabric_manager_keeps_the_branch_in_both_names_at_the_driver_version() -> None:
    commands, noops = ubuntu_package(ubuntu_node(), version=UBUNTU_580)
    pair = "nvidia-fabricmanager-580 libnvidia-nscq-580"
    assert commands == [
        f"{APT_INSTALL} nvidia-fabricmanager-580={UBUNTU_580} libnvidia-nscq-580={UBUNTU_580}",
        f"apt-mark hold {pair}",
        f"systemctl enable {UNIT}",
        f"systemctl start {UNIT}",
    ]
    assert noops == []
    installed = dict.fromkeys(pair.split(), UBUNTU_580)
    commands, noops = ubuntu_package(
        ubuntu_node(installed, held=tuple(installed)), running=True, version=UBUNTU_580
    )
    assert commands == []
    assert noops == [f"nvidia-fabricmanager-580 {UBUNTU_580} installed and held"]


def test_on_ubuntu_without_a_version_the_compute_library_decides() -> None:
    commands, _ = ubuntu_package(ubuntu_node())
    assert commands[0] == (
        f"{APT_INSTALL} nvidia-fabricmanager-580={UBUNTU_580} libnvidia-nscq-580={UBUNTU_580}"
    )
    # Before the driver is installed (a --dry run): read on the node after the driver role.
    nothing = {**ubuntu_node(), "packages": {}, "installed_module": None}
    commands, _ = ubuntu_package(nothing)
    read_on_node = INSTALLED_DRIVER_VERSION.format(package="libnvidia-compute-580-server")
    assert commands[0] == (
        f"{APT_INSTALL} nvidia-fabricmanager-580={read_on_node} libnvidia-nscq-580={read_on_node}"
    )


def test_on_ubuntu_nvidias_unsuffixed_fabric_manager_gives_way_to_ubuntus() -> None:
    # A node moved from NVIDIA's repository to Ubuntu's archive: NVIDIA's pair goes.
    nvidias = {"nvidia-fabricmanager": "580.95.05-1", "libnvidia-nscq": "580.95.05-1"}
    commands, _ = ubuntu_package(ubuntu_node(nvidias, held=tuple(nvidias)), version=UBUNTU_580)
    assert commands[0] == "apt-mark unhold libnvidia-nscq nvidia-fabricmanager"
    assert commands[1].endswith(
        f"libnvidia-nscq-580={UBUNTU_580} libnvidia-nscq- nvidia-fabricmanager-"
    )


def test_on_ubuntu_the_service_is_the_branch_packages() -> None:
    installed = {"nvidia-fabricmanager-580": UBUNTU_580, "libnvidia-nscq-580": UBUNTU_580}
    commands, noops = commands_of(
        fabric_manager_service,
        {
            NvidiaPackages: ubuntu_node(installed),
            SystemdEnabled: {UNIT: True},
            SystemdStatus: {UNIT: False},
        },
        branch="580",
        source="ubuntu",
    )
    assert commands == [f"systemctl start {UNIT}"]
    assert noops == []

"""NVIDIA driver role: package sets, pins, holds, headers, reboots; facts in, commands out."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import DeployError, OperationError
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from facts.container_runtime import AptPackagePolicy
from facts.nvidia_packages import (
    AptPackageVersions,
    NvidiaPackages,
    parse_apt_show,
    parse_nvidia_packages,
    parse_proc_version,
)
from gpunode import framing
from gpunode.expected.packages import DriverPackages, driver_packages_for
from gpunode.model import NvidiaDriver, build_desired_state
from gpunode.refusal import REFUSED_EXIT, NodeRefused
from lab import REBOOT_COMMAND
from lab.hwsim import hwstate
from roles.nvidia_driver import (
    APT_INSTALL,
    REBOOT_DEFERRAL_VARIABLE,
    driver_left_alone,
    driver_offered,
    driver_packages,
    driver_reboot,
    driver_reboots_in_this_run,
    headers_need,
    kernel_headers,
    packages_to_fetch,
    persistence_daemon,
    reboot_deferred,
    render_preferences,
    require_driver_offered,
    resolve_version,
)

from .fakehost import commands_of, fake_host

# The lab's reboot command, as its group data declares it (reboot.command).
SIMULATED_REBOOT = " ".join(REBOOT_COMMAND)

OPEN_550 = (
    "nvidia-open", "nvidia-kernel-open-dkms", "nvidia-driver", "nvidia-driver-cuda",
    "nvidia-driver-libs", "libcuda1", "libnvidia-ml1", "nvidia-smi", "nvidia-persistenced",
    "nvidia-modprobe", "nvidia-kernel-support", "firmware-nvidia-gsp",
)  # fmt: skip
HOLD_PREFIX = "version=$(dpkg-query -W -f='${Version}' "


def driver(**data: Any) -> NvidiaDriver:
    state, problems = build_desired_state({"nvidia_driver": data})
    assert problems == []
    return state.nvidia_driver


def nvidia_550(version: str | None = "550.127.08-1", **more: Any) -> DriverPackages:
    """NVIDIA's full stack of branch 550 (the compute-only default has tests of its own)."""
    wanted = driver(source="nvidia", branch="550", version=version, **{"stack": "full", **more})
    return driver_packages_for(wanted, wanted.version)


def node(
    installed: dict[str, str] | None = None,
    held: tuple[str, ...] = (),
    loaded: str | None = "590.48.01",
    module: str | None = None,
    headers: str = "missing",
) -> dict[str, Any]:
    """A NvidiaPackages fact value (``headers="available"``: see ``HEADERS``)."""
    loaded_module = {"version": loaded, "flavour": None, "source": "nvidia-smi"} if loaded else None
    installed_module = (
        {"version": module, "flavour": "open", "source": "modinfo"} if module else None
    )
    return {
        "packages": dict(installed or {}),
        "held": sorted(held),
        "loaded_module": loaded_module,
        "installed_module": installed_module,
        "reboot_required": bool(module and module != loaded),
        "kernel": "6.18.44-fc-v857",
        "headers": {
            "package": "linux-headers-6.18.44-fc-v857",
            "installed": headers == "installed",
            "build_dir": False,
        },
        "package_lists": True,
    }


def offered(module: str, *versions: str, dkms: bool = False) -> dict[str, list[dict[str, Any]]]:
    """An AptPackageVersions fact value for one kernel module package."""
    return {
        module: [{"version": v, "upstream": v.rsplit("-", 1)[0], "dkms": dkms} for v in versions]
    }


def at(version: str, names: tuple[str, ...] = OPEN_550) -> dict[str, str]:
    return {name: version for name in names}


# What apt offers for the running kernel's headers (AptPackageVersions): installable.
HEADERS = offered("linux-headers-6.18.44-fc-v857", "6.18.44-1")
STANDIN_OPEN = offered("nvidia-kernel-open-dkms", "550.127.08-1", "550.144.03-1")
DKMS_OPEN = offered("nvidia-kernel-open-dkms", "550.127.08-1", "550.144.03-1", dkms=True)


# --- facts --------------------------------------------------------------------------------


def packages_output(parts: dict[str, list[str]]) -> list[str]:
    """What NvidiaPackages' command prints when each part printed these lines."""
    return framing.output_of(parts)


def test_proc_version_gives_the_loaded_version_and_flavour() -> None:
    assert parse_proc_version(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.127.08  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Tue Oct  8 00:13:24 UTC 2024"
    ) == {"version": "550.127.08", "flavour": "open"}
    assert parse_proc_version(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03  Tue Jun  6 22:20:39 UTC 2023"
    ) == {"version": "535.54.03", "flavour": "proprietary"}
    assert parse_proc_version("garbage") is None


def test_packages_fact_reads_holds_modules_kernel_and_headers() -> None:
    facts = parse_nvidia_packages(
        packages_output(
            {
                "installed": [
                    "hi |nvidia-open|550.127.08-1",
                    "ii |libcuda1|550.127.08-1",
                    "rc |nvidia-kernel-dkms|550.127.08-1",
                    "hn |nvidia-kernel-open-dkms|",
                ],
                "loaded": [
                    "proc|NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.127.08  "
                    "Release",
                ],
                "installed-module": [
                    "modinfo|550.144.03|Dual MIT/GPL",
                ],
                "kernel": [
                    "6.1.0-28-amd64",
                ],
                "headers": [
                    "status|ii ",
                ],
                "lists": [
                    "12",
                ],
            }
        )
    )
    assert facts["packages"] == {"nvidia-open": "550.127.08-1", "libcuda1": "550.127.08-1"}
    # Held: what dpkg's selections say, installed or not (as `apt-mark showhold` lists them).
    assert facts["held"] == ["nvidia-kernel-open-dkms", "nvidia-open"]
    assert facts["loaded_module"] == {"version": "550.127.08", "flavour": "open", "source": "proc"}
    assert facts["installed_module"] == {
        "version": "550.144.03",
        "flavour": "open",
        "source": "modinfo",
    }
    assert facts["reboot_required"] is True
    assert facts["headers"] == {
        "package": "linux-headers-6.1.0-28-amd64",
        "installed": True,
        "build_dir": False,
    }
    assert facts["package_lists"] is True


def test_nvidia_smi_stands_in_where_procfs_does_not_show_the_driver() -> None:
    facts = parse_nvidia_packages(
        packages_output(
            {
                "loaded": [
                    "nvidia-smi|590.48.01",
                ],
                "installed-module": [
                    "modinfo|590.48.01|Dual MIT/GPL",
                ],
                "kernel": [
                    "6.18.44-fc-v857",
                ],
                "headers": [
                    "status|",
                ],
                "lists": [
                    "0",
                ],
            }
        )
    )
    assert facts["loaded_module"] == {
        "version": "590.48.01",
        "flavour": None,
        "source": "nvidia-smi",
    }
    assert facts["installed_module"] == {
        "version": "590.48.01",
        "flavour": "open",
        "source": "modinfo",
    }
    assert facts["reboot_required"] is False
    assert facts["headers"]["installed"] is False and facts["headers"]["build_dir"] is False
    assert facts["package_lists"] is False


def test_nvidia_smi_without_a_driver_to_talk_to_means_none_is_loaded() -> None:
    failed = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    facts = parse_nvidia_packages(
        packages_output({"loaded": [f"nvidia-smi|{failed}"], "kernel": ["6.1.0-28"]})
    )
    assert facts["loaded_module"] is None


def test_packages_fact_command_runs_here_and_reads_the_running_kernel() -> None:
    import os
    import subprocess

    done = subprocess.run(
        ["sh", "-c", NvidiaPackages().command()], capture_output=True, text=True, check=True
    )
    facts = parse_nvidia_packages(done.stdout.splitlines())
    assert facts["kernel"] == os.uname().release
    assert facts["headers"]["package"] == f"linux-headers-{os.uname().release}"


def test_a_flavour_change_alone_needs_a_reboot_and_no_module_needs_none() -> None:
    loaded = {"loaded": ["proc|NVIDIA UNIX x86_64 Kernel Module  550.127.08  Tue"]}
    swapped = parse_nvidia_packages(
        packages_output(loaded | {"installed-module": ["modinfo|550.127.08|Dual MIT/GPL"]})
    )
    assert swapped["reboot_required"] is True
    assert parse_nvidia_packages(packages_output(loaded))["reboot_required"] is False


def test_apt_show_says_which_versions_build_with_dkms() -> None:
    available = parse_apt_show(
        [
            "Package: nvidia-kernel-dkms",
            "Version: 535.309.01-0+deb12u1",
            "Depends: firmware-nvidia-gsp (= 535.309.01) | firmware-nvidia-gsp-535.309.01,",
            " nvidia-kernel-support--v1, dkms (>= 3.0.3-4~)",
            "",
            "Package: nvidia-kernel-open-dkms",
            "Version: 550.127.08-1",
            "Depends: nvidia-kernel-support (= 550.127.08-1), firmware-nvidia-gsp (= 550.127.08-1)",
            "",
        ]
    )
    assert available == {
        "nvidia-kernel-dkms": [
            {"version": "535.309.01-0+deb12u1", "upstream": "535.309.01", "dkms": True}
        ],
        "nvidia-kernel-open-dkms": [
            {"version": "550.127.08-1", "upstream": "550.127.08", "dkms": False}
        ],
    }


# --- packages and pins ----------------------------------------------------------------------


def test_nvidia_source_packages_per_flavour() -> None:
    open_driver = nvidia_550()
    assert open_driver.module == "nvidia-kernel-open-dkms"
    assert open_driver.versioned == (
        "nvidia-open", "nvidia-kernel-open-dkms", "nvidia-driver", "nvidia-driver-cuda",
    )  # fmt: skip
    assert set(open_driver.conflicting) == {
        "cuda-drivers",
        "cuda-drivers-550",
        "nvidia-kernel-dkms",
    }
    proprietary = nvidia_550(flavour="proprietary")
    assert proprietary.versioned[:3] == ("cuda-drivers", "cuda-drivers-550", "nvidia-kernel-dkms")
    assert set(proprietary.conflicting) == {"nvidia-open", "nvidia-kernel-open-dkms"}


def test_debian_source_installs_the_headless_compute_set() -> None:
    spec = driver_packages_for(driver(source="debian", flavour="open"), "535.261.03-1")
    assert spec.versioned == ("nvidia-open-kernel-dkms", "nvidia-smi", "libcuda1")
    assert spec.unversioned == ("nvidia-persistenced",)
    assert spec.conflicting == ("nvidia-kernel-dkms",)
    quiet = driver_packages_for(
        driver(source="debian", flavour="proprietary", persistence_daemon=False), "1-1"
    )
    assert quiet.module == "nvidia-kernel-dkms" and quiet.unversioned == ()


def test_preferences_pin_the_exact_version_or_else_the_branch() -> None:
    exact = render_preferences(nvidia_550()).splitlines()
    assert exact[-2:] == ["Pin: version 550.127.08-1", "Pin-Priority: 1001"]
    assert exact[2].startswith("Package: nvidia-* libnvidia-* libcuda* ")
    assert "cuda-drivers*" in exact[2]
    assert render_preferences(nvidia_550(version=None)).splitlines()[-2] == "Pin: version 550.*"


def test_version_resolution() -> None:
    assert resolve_version(driver(source="nvidia", branch="550"), {}, {}) is None
    assert resolve_version(driver(source="debian", version="535.261.03-1"), {}, {}) == (
        "535.261.03-1"
    )
    debian = driver(source="debian", flavour="proprietary")
    both = offered("nvidia-kernel-dkms", "535.261.03-1", "535.309.01-0+deb12u1", dkms=True)
    with fake_host({}):
        # Kept: the installed release; else the newest on offer.
        assert resolve_version(debian, {"nvidia-kernel-dkms": "535.261.03-1"}, both) == (
            "535.261.03-1"
        )
        assert resolve_version(debian, {}, both) == "535.309.01-0+deb12u1"
        with pytest.raises(DeployError, match="node-1: apt offers no nvidia-kernel-dkms"):
            resolve_version(debian, {}, {})


# --- kernel headers -------------------------------------------------------------------------


def test_headers_matter_only_for_a_module_built_with_dkms() -> None:
    spec = nvidia_550()
    dkms = offered(spec.module, "550.127.08-1", dkms=True)
    assert headers_need(spec, node(headers="missing"), STANDIN_OPEN) == "not-needed"
    assert headers_need(spec, node(headers="missing"), dkms) == "missing"
    assert headers_need(spec, node(headers="available"), dkms | HEADERS) == "install"
    assert headers_need(spec, node(headers="installed"), dkms) == "present"
    # NVIDIA's repository not fetched yet: asked again when the operation runs.
    assert headers_need(spec, node(headers="missing"), {}) == "unknown"
    # Every Debian NVIDIA kernel module builds with DKMS.
    debian = driver_packages_for(driver(source="debian"), None)
    assert headers_need(debian, node(headers="missing"), {}) == "missing"


def test_missing_headers_stop_the_install_before_apt_runs() -> None:
    spec = nvidia_550()
    dkms = offered(spec.module, "550.127.08-1", dkms=True)
    with pytest.raises(OperationError) as raised:
        commands_of(
            driver_packages,
            {NvidiaPackages: node(headers="missing"), AptPackageVersions: dkms},
            spec=spec,
        )
    assert str(raised.value) == (
        "node-1: linux-headers-6.18.44-fc-v857 is not installed and not installable from the "
        "configured repositories; the NVIDIA kernel module cannot be built (install it or use "
        "a kernel with headers)"
    )


def test_headers_check_stops_the_host_before_anything_changes() -> None:
    spec = nvidia_550()
    dkms = offered(spec.module, "550.127.08-1", dkms=True)
    with pytest.raises(OperationError, match=r"linux-headers-6\.18\.44-fc-v857 is not installed"):
        commands_of(kernel_headers, {NvidiaPackages: node(), AptPackageVersions: dkms}, spec=spec)


@pytest.mark.parametrize(
    ("headers", "available", "said"),
    [
        ("missing", STANDIN_OPEN, "nvidia-kernel-open-dkms ships a built module (no DKMS): "
                                  "no headers needed"),
        ("installed", DKMS_OPEN, "linux-headers-6.18.44-fc-v857 installed"),
        ("available", DKMS_OPEN | HEADERS,
         "linux-headers-6.18.44-fc-v857 is installed with the driver"),
        ("missing", {}, "apt does not know nvidia-kernel-open-dkms yet: checked again at the "
                        "install"),
    ],
)  # fmt: skip
def test_headers_check_says_what_it_found(
    headers: str, available: dict[str, Any], said: str
) -> None:
    facts = {NvidiaPackages: node(headers=headers), AptPackageVersions: available}
    assert commands_of(kernel_headers, facts, spec=nvidia_550()) == ([], [said])


def test_headers_and_module_are_asked_of_apt_in_one_read() -> None:
    asked: list[list[str]] = []

    def versions(packages: list[str]) -> dict[str, Any]:
        asked.append(packages)
        return DKMS_OPEN | HEADERS

    facts = {NvidiaPackages: node(headers="available"), AptPackageVersions: versions}
    commands_of(kernel_headers, facts, spec=nvidia_550())
    assert asked == [["nvidia-kernel-open-dkms", "linux-headers-6.18.44-fc-v857"]]


def test_a_converged_driver_never_asks_apt() -> None:
    # No AptPackageVersions in the table: asking it would fail the test.
    facts = node(installed=at("550.127.08-1"), held=OPEN_550, module="550.127.08")
    assert commands_of(kernel_headers, {NvidiaPackages: facts}, spec=nvidia_550())[0] == []
    commands, noops = commands_of(driver_packages, {NvidiaPackages: facts}, spec=nvidia_550())
    assert commands == [] and noops[0].endswith("installed, pinned and held")


def test_a_kernel_release_that_is_no_package_name_names_no_headers_package() -> None:
    facts = parse_nvidia_packages(
        packages_output({"kernel": ["6.1.0-28-amd64; rm -rf /"], "headers": ["status|"]})
    )
    assert facts["headers"]["package"] is None
    assert headers_need(nvidia_550(), facts, DKMS_OPEN) == "missing"


def test_headers_are_not_checked_for_an_installed_driver() -> None:
    facts = node(installed=at("550.127.08-1"), held=OPEN_550, module="550.127.08")
    assert commands_of(
        kernel_headers, {NvidiaPackages: facts, AptPackageVersions: DKMS_OPEN}, spec=nvidia_550()
    ) == ([], ["nvidia-kernel-open-dkms already installed: nothing to build"])


def test_rehold_of_an_installed_module_needs_no_headers() -> None:
    held = tuple(name for name in OPEN_550 if name != "libcuda1")
    facts = node(installed=at("550.127.08-1"), held=held, module="550.127.08")
    commands, _ = commands_of(
        driver_packages, {NvidiaPackages: facts, AptPackageVersions: DKMS_OPEN}, spec=nvidia_550()
    )
    assert commands[1].startswith(APT_INSTALL) and "linux-headers" not in commands[1]


def test_installable_headers_come_with_the_driver() -> None:
    spec = nvidia_550()
    dkms = offered(spec.module, "550.127.08-1", dkms=True)
    commands, _ = commands_of(
        driver_packages,
        {NvidiaPackages: node(headers="available"), AptPackageVersions: dkms | HEADERS},
        spec=spec,
    )
    assert commands[0].endswith(" linux-headers-6.18.44-fc-v857")


# --- install, upgrade, hold -----------------------------------------------------------------


def test_first_install_names_exact_versions_then_holds_and_enables_persistenced() -> None:
    commands, noops = commands_of(
        driver_packages,
        {NvidiaPackages: node(), AptPackageVersions: STANDIN_OPEN},
        spec=nvidia_550(),
    )
    assert commands[0] == (
        f"{APT_INSTALL} nvidia-open=550.127.08-1 nvidia-kernel-open-dkms=550.127.08-1 "
        "nvidia-driver=550.127.08-1 nvidia-driver-cuda=550.127.08-1"
    )
    assert commands[1].startswith(HOLD_PREFIX + "nvidia-kernel-open-dkms) && ")
    assert commands[1].endswith("| xargs -r apt-mark hold")
    assert commands[2] == "systemctl enable nvidia-persistenced.service"
    assert len(commands) == 3 and noops == []


def test_installed_pinned_and_held_driver_is_left_alone() -> None:
    facts = node(installed=at("550.127.08-1"), held=OPEN_550, module="550.127.08")
    commands, noops = commands_of(
        driver_packages,
        {NvidiaPackages: facts, AptPackageVersions: STANDIN_OPEN},
        spec=nvidia_550(),
    )
    assert commands == []
    assert noops == [
        "NVIDIA driver 550.127.08-1 (open kernel module, nvidia source) installed, pinned and held"
    ]


def test_installed_driver_without_a_module_for_the_running_kernel_is_reported() -> None:
    facts = node(installed=at("550.127.08-1"), held=OPEN_550, module=None)
    commands, noops = commands_of(
        driver_packages,
        {NvidiaPackages: facts, AptPackageVersions: STANDIN_OPEN},
        spec=nvidia_550(),
    )
    assert commands == []
    assert noops[1] == (
        "warning: no NVIDIA kernel module is installed for the running kernel 6.18.44-fc-v857; "
        "is linux-headers-6.18.44-fc-v857 installed?"
    )


def test_fabric_manager_and_other_tools_need_not_be_held_by_the_driver() -> None:
    installed = {
        **at("550.127.08-1"),
        "nvidia-fabricmanager-550": "550.127.08-1",
        "nvidia-container-toolkit": "1.17.4-1",
    }
    facts = node(installed=installed, held=OPEN_550, module="550.127.08")
    commands, _ = commands_of(
        driver_packages,
        {NvidiaPackages: facts, AptPackageVersions: STANDIN_OPEN},
        spec=nvidia_550(),
    )
    assert commands == []


def test_an_unheld_driver_package_is_held_again() -> None:
    held = tuple(name for name in OPEN_550 if name != "libcuda1")
    facts = node(installed=at("550.127.08-1"), held=held, module="550.127.08")
    commands, _ = commands_of(
        driver_packages,
        {NvidiaPackages: facts, AptPackageVersions: STANDIN_OPEN},
        spec=nvidia_550(),
    )
    assert commands[0] == f"apt-mark unhold {' '.join(sorted(held))}"
    assert any(command.startswith(HOLD_PREFIX) for command in commands)


def test_version_change_in_data_unholds_installs_exact_versions_and_holds() -> None:
    facts = node(installed=at("550.127.08-1"), held=OPEN_550, module="550.127.08")
    commands, _ = commands_of(
        driver_packages,
        {NvidiaPackages: facts, AptPackageVersions: STANDIN_OPEN},
        spec=nvidia_550("550.144.03-1"),
    )
    assert commands[0] == f"apt-mark unhold {' '.join(sorted(OPEN_550))}"
    assert commands[1] == (
        f"{APT_INSTALL} nvidia-open=550.144.03-1 nvidia-kernel-open-dkms=550.144.03-1 "
        "nvidia-driver=550.144.03-1 nvidia-driver-cuda=550.144.03-1"
    )
    assert commands[2].startswith(HOLD_PREFIX)


def test_flavour_switch_removes_the_other_flavour() -> None:
    facts = node(installed=at("550.144.03-1"), held=OPEN_550, module="550.144.03")
    spec = nvidia_550("550.144.03-1", flavour="proprietary")
    commands, _ = commands_of(
        driver_packages,
        {NvidiaPackages: facts, AptPackageVersions: offered(spec.module, "550.144.03-1")},
        spec=spec,
    )
    install = commands[1]
    assert install.startswith(f"{APT_INSTALL} cuda-drivers=550.144.03-1 cuda-drivers-550=")
    assert install.endswith(" nvidia-open- nvidia-kernel-open-dkms-")
    assert commands[2].startswith(HOLD_PREFIX + "nvidia-kernel-dkms) && ")


def test_another_branchs_metapackage_goes_with_a_branch_change() -> None:
    names = ("cuda-drivers", "cuda-drivers-550", "nvidia-kernel-dkms", "nvidia-driver")
    facts = node(installed=at("550.144.03-1", names), held=names, module="550.144.03")
    wanted = driver(source="nvidia", branch="570", flavour="proprietary", stack="full")
    spec = driver_packages_for(wanted, None)
    commands, _ = commands_of(
        driver_packages, {NvidiaPackages: facts, AptPackageVersions: {}}, spec=spec
    )
    assert commands[1] == (
        f"{APT_INSTALL} cuda-drivers cuda-drivers-570 nvidia-kernel-dkms nvidia-driver "
        "nvidia-driver-cuda cuda-drivers-550-"
    )


def test_branch_pin_keeps_an_installed_release_of_the_branch() -> None:
    facts = node(installed=at("550.127.08-1"), held=OPEN_550, module="550.127.08")
    spec = nvidia_550(version=None)
    commands, noops = commands_of(
        driver_packages, {NvidiaPackages: facts, AptPackageVersions: STANDIN_OPEN}, spec=spec
    )
    assert commands == []
    assert noops == [
        "NVIDIA driver 550.127.08-1 (open kernel module, nvidia source) installed, pinned and held"
    ]


def test_debian_source_holds_persistenced_of_its_own_version_and_can_disable_it() -> None:
    wanted = driver(source="debian", flavour="proprietary", version="535.309.01-0+deb12u1")
    spec = driver_packages_for(wanted, wanted.version)
    commands, _ = commands_of(
        driver_packages,
        {NvidiaPackages: node(headers="installed"), AptPackageVersions: {}},
        spec=spec,
    )
    assert commands[0] == (
        f"{APT_INSTALL} nvidia-kernel-dkms=535.309.01-0+deb12u1 nvidia-smi=535.309.01-0+deb12u1 "
        "libcuda1=535.309.01-0+deb12u1 nvidia-persistenced"
    )
    assert commands[1].endswith(" && apt-mark hold nvidia-persistenced")
    off = driver_packages_for(driver(source="debian", persistence_daemon=False), "1-1")
    commands, _ = commands_of(
        driver_packages,
        {NvidiaPackages: node(headers="installed"), AptPackageVersions: {}},
        spec=off,
        persistence_daemon=False,
    )
    assert commands[-1] == (
        "if systemctl cat nvidia-persistenced.service >/dev/null 2>&1; then "
        "systemctl disable --now nvidia-persistenced.service; fi"
    )


def test_source_none_does_nothing() -> None:
    commands, noops = commands_of(driver_left_alone, {})
    assert commands == []
    assert noops == ["NVIDIA driver left alone: nvidia_driver.source is 'none'"]


# --- nvidia-persistenced --------------------------------------------------------------------

UNIT = "nvidia-persistenced.service"


def persistenced(is_enabled: bool, is_running: bool, reboot_pending: bool = False, **kwargs: Any):
    facts = node(
        installed=at("550.127.08-1"),
        module="550.127.08",
        loaded="590.48.01" if reboot_pending else "550.127.08",
    )
    return commands_of(
        persistence_daemon,
        {
            NvidiaPackages: facts,
            SystemdEnabled: {UNIT: is_enabled},
            SystemdStatus: {UNIT: is_running},
        },
        **kwargs,
    )


def test_persistenced_enabled_and_running_is_left_alone() -> None:
    assert persistenced(True, True) == ([], ["nvidia-persistenced is enabled and running"])


def test_persistenced_is_enabled_and_started() -> None:
    assert persistenced(False, False) == (
        [
            "systemctl enable nvidia-persistenced.service",
            "systemctl start nvidia-persistenced.service",
        ],
        [],
    )


def test_persistenced_waits_for_the_new_module() -> None:
    assert persistenced(True, False, reboot_pending=True) == (
        [],
        ["nvidia-persistenced is enabled; it starts with the new kernel module (reboot pending)"],
    )


def test_persistenced_is_disabled_and_stopped_when_not_wanted() -> None:
    assert persistenced(True, True, enabled=False)[0] == [
        "systemctl disable nvidia-persistenced.service",
        "systemctl stop nvidia-persistenced.service",
    ]
    assert persistenced(False, False, enabled=False) == (
        [],
        ["nvidia-persistenced is disabled and stopped"],
    )


def test_persistenced_not_yet_installed_is_the_installs_business() -> None:
    commands, noops = commands_of(persistence_daemon, {NvidiaPackages: node()})
    assert commands == []
    assert noops == ["nvidia-persistenced is not installed yet: the driver install sets it up"]


# --- reboot ---------------------------------------------------------------------------------


def test_matching_module_needs_no_reboot() -> None:
    facts = node(installed=at("550.127.08-1"), module="550.127.08", loaded="550.127.08")
    commands, noops = commands_of(driver_reboot, {NvidiaPackages: facts}, policy="if-needed")
    assert commands == []
    assert noops == ["the loaded NVIDIA kernel module is the installed one (550.127.08)"]


def test_reboot_required_is_reported_and_never_performed_with_never() -> None:
    facts = node(installed=at("550.127.08-1"), module="550.127.08", loaded="590.48.01")
    commands, noops = commands_of(driver_reboot, {NvidiaPackages: facts}, policy="never")
    assert commands == []
    assert noops == [
        "reboot required: loaded NVIDIA kernel module 590.48.01, installed 550.127.08",
        "not rebooting: nvidia_driver.reboot is 'never'",
    ]


def test_a_declared_reboot_command_performs_the_reboot_instead() -> None:
    facts = node(installed=at("550.127.08-1"), module="550.127.08", loaded="590.48.01")
    commands, _ = commands_of(
        driver_reboot, {NvidiaPackages: facts}, policy="if-needed", reboot_command=REBOOT_COMMAND
    )
    assert commands == [SIMULATED_REBOOT]


def test_real_host_reboots_and_waits_for_it() -> None:
    facts = node(installed=at("550.127.08-1"), module="550.127.08", loaded="535.54.03")
    commands, noops = commands_of(driver_reboot, {NvidiaPackages: facts}, policy="if-needed")
    assert SIMULATED_REBOOT not in commands
    assert "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &" in commands
    assert noops[0] == (
        "reboot required: loaded NVIDIA kernel module 535.54.03, installed 550.127.08"
    )


def test_pending_install_predicts_the_reboot() -> None:
    # At prepare time the old driver is installed and loaded; the install will change it.
    facts = node(installed=at("550.127.08-1"), module="550.127.08", loaded="550.127.08")
    commands, _ = commands_of(
        driver_reboot,
        {NvidiaPackages: facts},
        policy="if-needed",
        install_pending=True,
        pending_version="550.144.03-1",
        reboot_command=REBOOT_COMMAND,
    )
    assert commands == [SIMULATED_REBOOT]
    # Installing the version that is already loaded needs none.
    commands, _ = commands_of(
        driver_reboot,
        {NvidiaPackages: node(loaded="550.144.03")},
        policy="if-needed",
        install_pending=True,
        pending_version="550.144.03-1",
    )
    assert commands == []


def test_pending_branch_install_counts_the_installed_module_only_inside_the_branch() -> None:
    old_branch = node(installed=at("550.144.03-1"), module="550.144.03", loaded="550.144.03")
    commands, _ = commands_of(
        driver_reboot, {NvidiaPackages: old_branch}, policy="if-needed",
        install_pending=True, branch="570", reboot_command=REBOOT_COMMAND,
    )  # fmt: skip
    assert commands == [SIMULATED_REBOOT]
    new_branch = node(installed=at("570.195.03-1"), module="570.195.03", loaded="570.195.03")
    commands, _ = commands_of(
        driver_reboot, {NvidiaPackages: new_branch}, policy="if-needed",
        install_pending=True, branch="570",
    )  # fmt: skip
    assert commands == []


def test_a_reboot_deferred_to_the_rollout_only_marks_the_node() -> None:
    facts = node(installed=at("550.127.08-1"), module="550.127.08", loaded="590.48.01")
    commands, noops = commands_of(
        driver_reboot, {NvidiaPackages: facts}, policy="if-needed",
        reboot_command=REBOOT_COMMAND, deferred=True,
    )  # fmt: skip
    # A change that changes nothing, so that pyinfra's results name the node; no reboot.
    assert commands == ["true"]
    assert noops == ["reboot required: loaded NVIDIA kernel module 590.48.01, installed 550.127.08"]
    # Nothing to mark where nothing would reboot: 'never', or the module loaded already.
    loaded = node(installed=at("550.127.08-1"), module="550.127.08", loaded="550.127.08")
    for state, policy in ((facts, "never"), (loaded, "if-needed")):
        commands, _ = commands_of(
            driver_reboot, {NvidiaPackages: state}, policy=policy, deferred=True
        )
        assert commands == [], policy


def test_the_deferral_comes_from_the_rollouts_variable_and_refuses_any_other_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(REBOOT_DEFERRAL_VARIABLE, raising=False)
    assert not reboot_deferred() and driver_reboots_in_this_run("if-needed")
    monkeypatch.setenv(REBOOT_DEFERRAL_VARIABLE, "defer")
    assert reboot_deferred()
    # Deferred, the Fabric Manager and IMEX roles do not count on a reboot in this run.
    assert not driver_reboots_in_this_run("if-needed")
    for bad in ("now", "defer\n; reboot", "DEFER"):
        monkeypatch.setenv(REBOOT_DEFERRAL_VARIABLE, bad)
        with pytest.raises(NodeRefused, match=f"environment variable {REBOOT_DEFERRAL_VARIABLE}"):
            reboot_deferred()
    assert not driver_reboots_in_this_run("never")


def test_no_module_installed_needs_no_reboot() -> None:
    commands, noops = commands_of(driver_reboot, {NvidiaPackages: node()}, policy="if-needed")
    assert commands == []
    assert noops == ["no NVIDIA kernel module is installed for the running kernel"]


# --- the lab's reboot -----------------------------------------------------------------------


def test_simulated_reboot_loads_the_driver_the_standin_package_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(hwstate.STATE_ENV, str(tmp_path / "hardware.json"))
    state: dict[str, Any] = {"driver_version": "590.48.01", "gpus": []}
    hwstate.reboot(state)
    assert state["driver_version"] == "590.48.01"  # nothing recorded: unchanged
    (tmp_path / "installed-driver-version").write_text("550.144.03\n")
    hwstate.reboot(state)
    assert json.loads(json.dumps(state))["driver_version"] == "550.144.03"


# --- packaging eras: compute-only by default, NVIDIA's pinning packages from 590 -------------

COMPUTE_595 = ("nvidia-driver-cuda", "nvidia-kernel-open-dkms", "libcuda1", "nvidia-smi")


def test_the_default_is_nvidias_compute_only_install() -> None:
    spec = driver_packages_for(driver(source="nvidia", branch="580"), "580.95.05-1")
    assert spec.stack == "compute"
    assert spec.versioned == ("nvidia-driver-cuda", "nvidia-kernel-open-dkms")
    # 580 is the last branch of the branch-suffixed era: no pinning package.
    assert spec.pinning is None
    assert set(spec.conflicting) == {"cuda-drivers", "cuda-drivers-580", "nvidia-kernel-dkms"}


def test_from_590_the_branch_is_locked_with_its_pinning_package() -> None:
    spec = driver_packages_for(driver(source="nvidia", branch="595"), "595.71.05-1")
    assert spec.pinning == "nvidia-driver-pinning-595"
    full = driver_packages_for(
        driver(source="nvidia", branch="595", stack="full", flavour="proprietary"), None
    )
    # No branch-suffixed metapackage exists from 590 on.
    assert full.versioned[:2] == ("cuda-drivers", "nvidia-kernel-dkms")
    assert full.pinning == "nvidia-driver-pinning-595"


def test_first_install_of_the_new_era_installs_the_pinning_package_first() -> None:
    spec = driver_packages_for(driver(source="nvidia", branch="595"), "595.71.05-1")
    facts = node(headers="available")
    commands, _ = commands_of(
        driver_packages,
        {
            NvidiaPackages: facts,
            AptPackageVersions: {**HEADERS, **offered(spec.module, "595.71.05-1")},
        },
        spec=spec,
    )
    assert commands[0] == f"{APT_INSTALL} nvidia-driver-pinning-595"
    assert commands[1] == (
        f"{APT_INSTALL} nvidia-driver-cuda=595.71.05-1 nvidia-kernel-open-dkms=595.71.05-1"
    )
    assert commands[2].endswith(
        "| xargs -r apt-mark hold && apt-mark hold nvidia-driver-pinning-595"
    )


def test_crossing_from_580_to_595_upgrades_in_one_run_and_holds_again() -> None:
    installed = at("580.95.05-1", COMPUTE_595)
    facts = node(installed=installed, held=tuple(installed), module="580.95.05")
    spec = driver_packages_for(driver(source="nvidia", branch="595"), "595.71.05-1")
    commands, _ = commands_of(
        driver_packages,
        {NvidiaPackages: facts, AptPackageVersions: offered(spec.module, "595.71.05-1")},
        spec=spec,
    )
    assert commands[0].startswith("apt-mark unhold ") and "nvidia-kernel-open-dkms" in commands[0]
    assert commands[1] == f"{APT_INSTALL} nvidia-driver-pinning-595"
    assert commands[2].startswith(f"{APT_INSTALL} nvidia-driver-cuda=595.71.05-1 ")
    assert "apt-mark hold nvidia-driver-pinning-595" in commands[3]


def test_going_back_to_580_removes_the_595_pinning_package() -> None:
    installed = {**at("595.71.05-1", COMPUTE_595), "nvidia-driver-pinning-595": "595.71.05-1"}
    facts = node(installed=installed, held=tuple(installed), module="595.71.05")
    spec = driver_packages_for(driver(source="nvidia", branch="580"), "580.95.05-1")
    commands, _ = commands_of(
        driver_packages,
        {NvidiaPackages: facts, AptPackageVersions: offered(spec.module, "580.95.05-1")},
        spec=spec,
    )
    assert "nvidia-driver-pinning-595" in commands[0]  # unheld
    assert commands[1].endswith(" nvidia-driver-pinning-595-")
    assert "nvidia-driver-pinning" not in commands[2]  # the hold: 580 has none


def test_a_pinned_held_595_driver_with_its_pinning_package_is_left_alone() -> None:
    installed = {**at("595.71.05-1", COMPUTE_595), "nvidia-driver-pinning-595": "595.71.05-1"}
    facts = node(installed=installed, held=tuple(installed), module="595.71.05")
    spec = driver_packages_for(driver(source="nvidia", branch="595"), "595.71.05-1")
    commands, noops = commands_of(
        driver_packages, {NvidiaPackages: facts, AptPackageVersions: {}}, spec=spec
    )
    assert commands == []
    assert noops[0].endswith("installed, pinned and held")
    unheld = node(installed=installed, held=tuple(set(installed) - {"nvidia-driver-pinning-595"}),
                  module="595.71.05")  # fmt: skip
    commands, _ = commands_of(
        driver_packages, {NvidiaPackages: unheld, AptPackageVersions: {}}, spec=spec
    )
    assert "apt-mark hold nvidia-driver-pinning-595" in commands[-2]


# --- a driver the mirror does not offer: refused before the pin ------------------------------

CUDA_URL = "http://mirror.example:8089/cuda/debian12/x86_64"
DEBIAN_URL = "http://deb.debian.org/debian"


def mirror(indexed: bool = True, **versions: tuple[str, ...]) -> dict[type, Any]:
    """An AptPackagePolicy fact value: each package's versions, all from the NVIDIA mirror
    (nvidia-kernel-dkms also from Debian, at a version of its own)."""
    known = {}
    for name, offered_versions in versions.items():
        name = name.replace("_", "-")
        entries = [{"version": v, "urls": [CUDA_URL]} for v in offered_versions]
        if name == "nvidia-kernel-dkms":
            entries.append({"version": "550.163.01-2", "urls": [DEBIAN_URL]})
        known[name] = {"installed": None, "held": False, "candidate": None, "versions": entries}

    def value(packages: list[str]) -> dict[str, Any]:
        return {
            "indexed_urls": [CUDA_URL, DEBIAN_URL] if indexed else [DEBIAN_URL],
            "packages": {name: known[name] for name in packages if name in known},
        }

    return {AptPackagePolicy: value}


STANDIN_550 = {
    name.replace("-", "_"): ("550.144.03-1", "550.127.08-1")
    for name in ("nvidia-open", "nvidia-kernel-open-dkms", "nvidia-driver", "nvidia-driver-cuda",
                 "cuda-drivers", "cuda-drivers-550", "nvidia-kernel-dkms")
}  # fmt: skip


def test_a_version_the_mirror_does_not_offer_is_refused_naming_what_it_offers() -> None:
    spec = nvidia_550("550.163.01-2")
    with fake_host(mirror(**STANDIN_550)), pytest.raises(NodeRefused) as refused:
        require_driver_offered(spec, {}, CUDA_URL)
    message = refused.value.reason
    assert message.startswith(f"node-1: NVIDIA driver 550.163.01-2 is not offered by {CUDA_URL}")
    assert "nvidia-kernel-open-dkms (550.144.03-1, 550.127.08-1)" in message
    assert "set nvidia_driver.branch / nvidia_driver.version" in message


def test_debians_build_of_a_name_does_not_count_for_the_nvidia_source() -> None:
    # Debian offers nvidia-kernel-dkms 550.163.01-2; NVIDIA's mirror does not.
    spec = nvidia_550("550.163.01-2", flavour="proprietary")
    with fake_host(mirror(**STANDIN_550)), pytest.raises(NodeRefused, match="not offered by"):
        require_driver_offered(spec, {}, CUDA_URL)


def test_a_branch_the_mirror_does_not_carry_is_refused_with_its_pinning_package() -> None:
    spec = driver_packages_for(driver(source="nvidia", branch="590"), None)
    with fake_host(mirror(**STANDIN_550)), pytest.raises(NodeRefused) as refused:
        require_driver_offered(spec, {}, CUDA_URL)
    message = refused.value.reason
    assert f"NVIDIA driver of branch 590 is not offered by {CUDA_URL}" in message
    assert "nvidia-driver-cuda (550.144.03-1, 550.127.08-1)" in message
    assert "nvidia-driver-pinning-590" in message


def test_a_driver_the_mirror_offers_passes() -> None:
    with fake_host(mirror(**STANDIN_550)):
        assert require_driver_offered(nvidia_550("550.144.03-1"), {}, CUDA_URL)
        assert require_driver_offered(nvidia_550(None), {}, CUDA_URL)


def test_an_installed_driver_needs_no_word_from_apt() -> None:
    # No AptPackagePolicy in the table: asking apt would fail the test.
    with fake_host({}):
        assert require_driver_offered(nvidia_550(), at("550.127.08-1"), CUDA_URL)


def test_only_the_packages_to_fetch_must_be_offered() -> None:
    # Installed at the wanted version: the mirror may have dropped them since.
    installed = at("550.127.08-1", ("nvidia-open", "nvidia-kernel-open-dkms"))
    spec = nvidia_550()
    assert packages_to_fetch(spec, installed) == ["nvidia-driver", "nvidia-driver-cuda"]
    versions = {"nvidia_driver": ("550.127.08-1",), "nvidia_driver_cuda": ("550.127.08-1",)}
    with fake_host(mirror(**versions)):
        assert require_driver_offered(spec, installed, CUDA_URL)


def test_without_the_mirrors_lists_the_node_is_asked_once_they_are_fetched() -> None:
    with fake_host(mirror(indexed=False)):
        assert require_driver_offered(nvidia_550("550.163.01-2"), {}, CUDA_URL) is False


def test_debian_source_version_apt_does_not_know_is_refused() -> None:
    spec = driver_packages_for(driver(source="debian", version="535.216.01-1"), "535.216.01-1")
    known = offered("nvidia-kernel-dkms", "550.163.01-2") | offered("nvidia-smi", "550.163.01-2")
    with fake_host({AptPackageVersions: known}), pytest.raises(NodeRefused) as refused:
        require_driver_offered(spec, {}, CUDA_URL)
    assert "NVIDIA driver 535.216.01-1 is not offered by apt's package lists (Debian)" in (
        refused.value.reason
    )
    assert "libcuda1 (nothing)" in refused.value.reason


MADISON_DRIVER = f"""\
nvidia-driver-cuda | 550.144.03-1 | {CUDA_URL}  Packages
nvidia-driver-cuda | 550.127.08-1 | {CUDA_URL}  Packages
nvidia-driver-cuda | 535.216.01-1 | {DEBIAN_URL} bookworm/non-free amd64 Packages
"""


def run_check(
    tmp_path: Path, spec: DriverPackages, fetch: list[str]
) -> subprocess.CompletedProcess:
    """The node-side check, run against a fake apt-cache that knows nvidia-driver-cuda only."""
    fake = tmp_path / "apt-cache"
    fake.write_text(
        f"#!/bin/sh\n[ \"$2\" = nvidia-driver-cuda ] || exit 0\ncat <<'EOF'\n{MADISON_DRIVER}EOF\n"
    )
    fake.chmod(0o755)
    commands, _ = commands_of(
        driver_offered, {}, spec=spec, repository_url=CUDA_URL + "/", fetch=fetch
    )
    return subprocess.run(
        ["sh", "-c", commands[0]],
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )


def test_the_node_side_check_stops_the_host_before_the_pin(tmp_path: Path) -> None:
    compute = driver_packages_for(driver(source="nvidia", branch="550"), None)
    assert run_check(tmp_path, compute, ["nvidia-driver-cuda"]).returncode == 0
    exact = driver_packages_for(driver(source="nvidia", branch="550"), "550.127.08-1")
    assert run_check(tmp_path, exact, ["nvidia-driver-cuda"]).returncode == 0

    missing = driver_packages_for(driver(source="nvidia", branch="550"), "550.163.01-2")
    refused = run_check(tmp_path, missing, ["nvidia-driver-cuda"])
    assert refused.returncode == REFUSED_EXIT
    assert f"NVIDIA driver 550.163.01-2 is not offered by {CUDA_URL}/: missing " in refused.stderr
    # Another source's build of the name counts for nothing; nor does an absent package.
    debian_only = driver_packages_for(driver(source="nvidia", branch="535"), None)
    assert run_check(tmp_path, debian_only, ["nvidia-driver-cuda"]).returncode == REFUSED_EXIT
    assert run_check(tmp_path, compute, ["nvidia-kernel-open-dkms"]).returncode == REFUSED_EXIT

"""The ubuntu driver source: Ubuntu's package names against excerpts of its real package
index, the prebuilt-or-DKMS choice per kernel, and the driver role installing, pinning and
holding them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from facts.apt import AptIndexedRepositories
from facts.nvidia_packages import AptPackageVersions, NvidiaPackages
from gpunode.expected import ubuntu_driver
from gpunode.expected.packages import DriverPackages, held_packages, ubuntu_driver_packages
from gpunode.expected.ubuntu_driver import (
    UbuntuKernel,
    compute_packages,
    dkms_package,
    full_driver_package,
    headless_package,
    module_choice,
    other_driver_packages,
    parse_kernel_release,
    prebuilt_module_meta,
    prebuilt_module_package,
)
from gpunode.model import NvidiaDriver, build_desired_state
from gpunode.refusal import NodeRefused
from roles.nvidia_driver import (
    APT_INSTALL,
    driver_packages,
    headers_need,
    kernel_headers,
    offered_check_shell,
    packages_to_fetch,
    persistence_daemon,
    persistenced_package,
    require_driver_offered,
    ubuntu_pin_problem,
    ubuntu_spec,
)

from .fakehost import commands_of, fake_host

INDEX = Path(__file__).parents[1] / "fixtures" / "ubuntu-packages"
NOBLE_GENERIC = UbuntuKernel("6.8.0", "64", "generic")
VERSION = "550.163.01-0ubuntu0.24.04.1"


def names_in(excerpt: str) -> set[str]:
    """Every package name an excerpt of Ubuntu's package index shows."""
    text = (INDEX / excerpt).read_text()
    return set(re.findall(r"(?<![a-z0-9.+-])[a-z0-9][a-z0-9.+-]*[a-z0-9]", text))


def driver(**data: Any) -> NvidiaDriver:
    state, problems = build_desired_state({"nvidia_driver": {"source": "ubuntu", **data}})
    assert problems == []
    return state.nvidia_driver


# --- names, against Ubuntu's index ----------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "parts"),
    [
        ("6.8.0-49-generic", ("6.8.0", "49", "generic")),
        ("6.8.0-1015-aws", ("6.8.0", "1015", "aws")),
        ("5.15.0-1063-nvidia", ("5.15.0", "1063", "nvidia")),
        ("6.8.0-1021-nvidia-64k", ("6.8.0", "1021", "nvidia-64k")),
        ("7.0.0-1016-nvidia\n", ("7.0.0", "1016", "nvidia")),
    ],
)
def test_an_ubuntu_kernel_release_gives_its_flavour(release: str, parts: tuple[str, ...]) -> None:
    kernel = parse_kernel_release(release)
    assert kernel == UbuntuKernel(*parts)
    assert kernel is not None and kernel.release == release.strip()


@pytest.mark.parametrize("release", ["6.18.44-fc-v857", "6.8.0-49", "", "6.8.0-49-generic x"])
def test_a_kernel_not_named_as_ubuntu_names_them_has_no_flavour(release: str) -> None:
    assert parse_kernel_release(release) is None


def test_prebuilt_module_packages_are_named_after_the_running_kernel() -> None:
    index = names_in("noble-updates_linux-modules-nvidia-575-6.8.0-64-generic.txt")
    assert prebuilt_module_package("575", "desktop", "proprietary", NOBLE_GENERIC) in index
    server_open = prebuilt_module_package("535", "server", "open", NOBLE_GENERIC)
    assert server_open == "linux-modules-nvidia-535-server-open-6.8.0-64-generic"
    assert server_open in index
    lowlatency = UbuntuKernel("6.8.0", "64", "lowlatency")
    assert prebuilt_module_package("535", "desktop", "open", lowlatency) in index
    nvidia = UbuntuKernel("7.0.0", "1016", "nvidia")
    flavour = names_in("resolute-updates_linux-modules-nvidia-580-server-open-nvidia.txt")
    assert prebuilt_module_package("580", "server", "open", nvidia) in flavour


def test_each_kernel_flavour_has_a_meta_package_that_follows_its_kernels() -> None:
    nvidia = names_in("resolute-updates_linux-modules-nvidia-580-server-open-nvidia.txt")
    for flavour in ("nvidia", "aws", "azure", "gcp", "generic", "lowlatency", "oracle"):
        assert prebuilt_module_meta("580", "server", "open", flavour) in nvidia
    generic = names_in("noble_linux-modules-nvidia-550-open-generic.txt")
    for flavour in ("generic", "generic-64k", "generic-hwe-24.04"):
        assert prebuilt_module_meta("550", "desktop", "open", flavour) in generic
    # The meta package depends on the versioned one of the flavour's current kernel.
    arm64_kernel = UbuntuKernel("6.8.0", "31", "generic")
    assert prebuilt_module_package("550", "desktop", "open", arm64_kernel) in generic


def test_the_compute_set_and_the_dkms_module_are_the_server_driver_s_packages() -> None:
    source = names_in("noble_nvidia-graphics-drivers-550-server.txt")
    libraries, utils, compute_utils, kernel_common = compute_packages("550", "server")
    assert {libraries, compute_utils} <= source
    assert utils in names_in("noble_nvidia-utils.txt")
    assert compute_packages("580", "server")[1] in names_in("noble_nvidia-utils.txt")
    assert compute_packages("580", "desktop")[1] == "nvidia-utils-580"
    # nvidia-utils depends on the module's shared files at exactly its version.
    utils_580 = names_in("tenacious_nvidia-utils-580-server.txt")
    assert f"{compute_packages('580', 'server')[3]}-580.178.04" in utils_580
    assert compute_packages("580", "server")[0] in utils_580
    assert kernel_common == "nvidia-kernel-common-550-server"
    assert dkms_package("550", "server", "open") in source
    assert dkms_package("550", "server", "proprietary") in source
    assert full_driver_package("550", "server", "proprietary") in source


def test_headless_metapackages_are_named_per_series_and_flavour() -> None:
    headless = names_in("jammy_nvidia-headless.txt")
    assert headless_package("535", "server", "open") in headless
    assert headless_package("570", "desktop", "open") in headless
    assert headless_package("550", "server", "proprietary") in headless
    assert headless_package("550", "desktop", "open") not in headless  # jammy has none


# --- prebuilt or DKMS -------------------------------------------------------------------------


def test_the_prebuilt_module_is_chosen_where_apt_offers_it_for_this_kernel() -> None:
    prebuilt = "linux-modules-nvidia-550-server-open-6.8.0-64-generic"
    assert module_choice("550", "server", "open", NOBLE_GENERIC, {prebuilt}) == (
        "prebuilt",
        prebuilt,
    )
    # A kernel Canonical builds no module for (or one apt does not offer): DKMS.
    assert module_choice("550", "server", "open", NOBLE_GENERIC, set()) == (
        "dkms",
        "nvidia-dkms-550-server-open",
    )
    assert module_choice("550", "server", "open", None, {prebuilt})[0] == "dkms"


def test_a_prebuilt_spec_holds_the_module_apart_and_drops_a_dkms_one() -> None:
    wanted = driver(branch="550", version=VERSION)
    prebuilt = "linux-modules-nvidia-550-server-open-6.8.0-64-generic"
    spec = ubuntu_driver_packages(wanted, VERSION, NOBLE_GENERIC, {prebuilt})
    assert spec.module == prebuilt and not spec.module_versioned
    assert spec.versioned == compute_packages("550", "server")
    assert spec.unversioned == (prebuilt,)
    assert spec.anchor == "libnvidia-compute-550-server"
    assert "nvidia-dkms-550-server-open" in spec.conflicting  # it would load instead
    assert "nvidia-dkms-550-server" in spec.conflicting
    dkms = ubuntu_driver_packages(wanted, VERSION, NOBLE_GENERIC, set())
    assert dkms.module == "nvidia-dkms-550-server-open" and dkms.module_versioned
    assert dkms.versioned == (*compute_packages("550", "server"), dkms.module)
    assert "nvidia-dkms-550-server-open" not in dkms.conflicting


def test_other_branches_series_and_flavours_go_but_other_kernels_modules_stay() -> None:
    installed = [
        "libnvidia-compute-535-server", "nvidia-utils-535-server", "nvidia-dkms-535-server",
        "libnvidia-compute-550", "nvidia-dkms-550-server",
        "linux-modules-nvidia-550-server-open-6.8.0-60-generic",
        "linux-modules-nvidia-550-server-6.8.0-64-generic",
        "nvidia-utils-550-server", "libnvidia-compute-550-server",
        "nvidia-kernel-common-550-server-550.163.01", "nvidia-driver-pinning-590",
        "nvidia-container-toolkit",
    ]  # fmt: skip
    assert other_driver_packages(installed, "550", "server", "open") == [
        "libnvidia-compute-535-server",
        "libnvidia-compute-550",
        "linux-modules-nvidia-550-server-6.8.0-64-generic",
        "nvidia-dkms-535-server",
        "nvidia-dkms-550-server",
        "nvidia-utils-535-server",
    ]


# --- the model -------------------------------------------------------------------------------


def test_the_ubuntu_source_needs_a_branch_and_installs_the_compute_set() -> None:
    _, problems = build_desired_state({"nvidia_driver": {"source": "ubuntu"}})
    assert [(p.key, p.reason) for p in problems] == [
        ("nvidia_driver.branch", "missing for source 'ubuntu'")
    ]
    _, problems = build_desired_state(
        {"nvidia_driver": {"source": "ubuntu", "branch": "580", "stack": "full"}}
    )
    assert [p.key for p in problems] == ["nvidia_driver.stack"]
    _, problems = build_desired_state(
        {"nvidia_driver": {"source": "nvidia", "branch": "580", "ubuntu_series": "desktop"}}
    )
    assert [p.key for p in problems] == ["nvidia_driver.ubuntu_series"]
    # Blackwell's open-only rule holds for the ubuntu source as for the others.
    _, problems = build_desired_state(
        {
            "nvidia_driver": {"source": "ubuntu", "branch": "570", "flavour": "proprietary"},
            "expected_hardware": {"gpu_model": "NVIDIA B200"},
        }
    )
    assert [p.key for p in problems] == ["nvidia_driver.flavour"]


def test_an_ubuntu_node_holds_the_compute_set_at_the_pinned_version() -> None:
    state, problems = build_desired_state(
        {"nvidia_driver": {"source": "ubuntu", "branch": "550", "version": VERSION}}
    )
    assert problems == []
    assert held_packages(state) == dict.fromkeys(compute_packages("550", "server"), VERSION)


def test_an_ubuntu_nvswitch_node_holds_ubuntus_fabric_manager_at_the_driver_version() -> None:
    state, problems = build_desired_state(
        {
            "nvidia_driver": {"source": "ubuntu", "branch": "550", "version": VERSION},
            "expected_hardware": {"nvswitch": True},
        }
    )
    assert problems == []
    assert held_packages(state) == {
        **dict.fromkeys(compute_packages("550", "server"), VERSION),
        "nvidia-fabricmanager-550": VERSION,
        "libnvidia-nscq-550": VERSION,
    }


# --- the role --------------------------------------------------------------------------------


def ubuntu_node(
    installed: dict[str, str] | None = None,
    held: tuple[str, ...] = (),
    kernel: str = "6.8.0-64-generic",
    module: str | None = None,
) -> dict[str, Any]:
    return {
        "packages": dict(installed or {}),
        "held": sorted(held),
        "loaded_module": None,
        "installed_module": {"version": module, "flavour": "open", "source": "modinfo"}
        if module
        else None,
        "reboot_required": bool(module),
        "kernel": kernel,
        "headers": {"package": f"linux-headers-{kernel}", "installed": False, "build_dir": False},
        "package_lists": True,
    }


PREBUILT = "linux-modules-nvidia-550-server-open-6.8.0-64-generic"
PREBUILT_OFFERED = {PREBUILT: [{"version": "6.8.0-64.67+1", "upstream": "6.8.0", "dkms": False}]}


ARCHIVE = "http://archive.ubuntu.com/ubuntu"


def spec_for(
    facts: dict[str, Any],
    offered: dict[str, Any],
    indexed: tuple[str, ...] = (ARCHIVE,),
    **data: Any,
) -> DriverPackages:
    known = {NvidiaPackages: facts, AptPackageVersions: offered, AptIndexedRepositories: indexed}
    with fake_host(known):
        return ubuntu_spec(driver(**{"branch": "550", "version": VERSION, **data}), facts, ARCHIVE)


def test_the_role_picks_the_prebuilt_module_apt_offers_for_the_running_kernel() -> None:
    spec = spec_for(ubuntu_node(), PREBUILT_OFFERED)
    assert spec.module == PREBUILT
    assert spec_for(ubuntu_node(), {}).module == "nvidia-dkms-550-server-open"
    # Installed already: apt is not asked.
    installed = ubuntu_node(installed={PREBUILT: "6.8.0-64.67+1"})
    assert spec_for(installed, {}).module == PREBUILT
    with pytest.raises(NodeRefused, match=r"'6\.18\.44-fc-v857' is not named as Ubuntu"):
        spec_for(ubuntu_node(kernel="6.18.44-fc-v857"), {})


def test_before_apt_has_lists_of_ubuntus_archive_the_prebuilt_module_is_assumed() -> None:
    """A node whose archive sources this run writes: what the archive offers is known only
    after its apt update, so the prebuilt module is planned (and asked for then, by
    driver_offered), never DKMS that the next run would replace."""
    elsewhere = ("http://old-mirror.example/ubuntu",)
    assert spec_for(ubuntu_node(), {}, indexed=elsewhere).module == PREBUILT
    assert spec_for(ubuntu_node(), {}).module == "nvidia-dkms-550-server-open"
    spec = spec_for(ubuntu_node(), {}, indexed=elsewhere)
    with fake_host({AptIndexedRepositories: elsewhere}):
        assert require_driver_offered(spec, {}, ARCHIVE) is False
    shell = offered_check_shell(spec, packages_to_fetch(spec, {}), ARCHIVE)
    assert f"apt-cache madison {PREBUILT} |" in shell
    assert f"url=' {ARCHIVE} '" in shell


def test_first_install_pins_the_compute_set_adds_the_prebuilt_module_and_holds_both() -> None:
    spec = spec_for(ubuntu_node(), PREBUILT_OFFERED)
    facts = ubuntu_node()
    commands, noops = commands_of(
        driver_packages, {NvidiaPackages: facts, AptPackageVersions: PREBUILT_OFFERED}, spec=spec
    )
    compute = " ".join(f"{name}={VERSION}" for name in compute_packages("550", "server"))
    assert commands[0] == f"{APT_INSTALL} {compute} {PREBUILT}"  # no headers: nothing is built
    assert commands[1].startswith(
        "version=$(dpkg-query -W -f='${Version}' libnvidia-compute-550-server) && "
    )
    assert commands[1].endswith(f"| xargs -r apt-mark hold && apt-mark hold {PREBUILT}")
    assert commands[2] == "systemctl enable nvidia-persistenced.service"
    assert noops == []
    assert headers_need(spec, facts, {}) == "not-needed"
    _, notes = commands_of(
        kernel_headers, {NvidiaPackages: facts, AptPackageVersions: PREBUILT_OFFERED}, spec=spec
    )
    assert notes == [f"{PREBUILT} ships a built module (no DKMS): no headers needed"]


def test_an_installed_pinned_and_held_ubuntu_driver_is_left_alone() -> None:
    installed = dict.fromkeys(compute_packages("550", "server"), VERSION) | {
        PREBUILT: "6.8.0-64.67+1"
    }
    facts = ubuntu_node(installed=installed, held=tuple(installed), module="550.163.01")
    spec = spec_for(facts, {})
    commands, noops = commands_of(
        driver_packages, {NvidiaPackages: facts, AptPackageVersions: {}}, spec=spec
    )
    assert commands == []
    assert noops == [
        f"NVIDIA driver {VERSION} (open kernel module, ubuntu source) installed, pinned and held"
    ]
    # The prebuilt module at its kernel's version is no reason to reinstall.
    assert spec.module_versioned is False


def test_a_branch_change_unholds_installs_the_new_names_and_removes_the_old() -> None:
    old = "550.163.01-0ubuntu0.24.04.1"
    installed = dict.fromkeys(compute_packages("550", "server"), old) | {PREBUILT: "6.8.0-64.67+1"}
    facts = ubuntu_node(installed=installed, held=tuple(installed), module="550.163.01")
    new = "580.173.02-0ubuntu0.24.04.1"
    prebuilt_580 = "linux-modules-nvidia-580-server-open-6.8.0-64-generic"
    offered = {prebuilt_580: [{"version": "6.8.0-64.67+1", "upstream": "6.8.0", "dkms": False}]}
    spec = spec_for(facts, offered, branch="580", version=new)
    commands, _ = commands_of(
        driver_packages, {NvidiaPackages: facts, AptPackageVersions: offered}, spec=spec
    )
    assert commands[0].startswith("apt-mark unhold ")
    assert set(commands[0].split()[2:]) == set(installed)
    install = commands[1].split()
    assert f"libnvidia-compute-580-server={new}" in install and prebuilt_580 in install
    assert {f"{name}-" for name in installed} <= set(install)


def test_a_driver_change_takes_ubuntus_fabric_manager_of_the_old_driver_with_it() -> None:
    """Ubuntu's Fabric Manager depends on the kernel common files at exactly its version: a
    held one of the old driver would stop apt from moving the driver. It goes in the driver's
    transaction (the Fabric Manager role installs the new one next); one already at the new
    version stays."""
    old = "580.159.03-0ubuntu0.24.04.1"
    new = "580.173.02-0ubuntu0.24.04.1"
    prebuilt_580 = "linux-modules-nvidia-580-server-open-6.8.0-64-generic"
    fabric = {"nvidia-fabricmanager-580": old, "libnvidia-nscq-580": old}
    installed = (
        dict.fromkeys(compute_packages("580", "server"), old)
        | {prebuilt_580: "6.8.0-64.67+1"}
        | fabric
    )
    facts = ubuntu_node(installed=installed, held=tuple(installed), module="580.159.03")
    offered = {prebuilt_580: [{"version": "6.8.0-64.67+1", "upstream": "6.8.0", "dkms": False}]}
    spec = spec_for(facts, offered, branch="580", version=new)
    commands, _ = commands_of(
        driver_packages, {NvidiaPackages: facts, AptPackageVersions: offered}, spec=spec
    )
    assert set(fabric) <= set(commands[0].split()[2:])
    install = commands[1].split()
    assert {"libnvidia-nscq-580-", "nvidia-fabricmanager-580-"} <= set(install)
    assert f"libnvidia-compute-580-server={new}" in install
    # Fabric Manager already at the new version (installed with it before) is left in place.
    moved = installed | dict.fromkeys(fabric, new)
    facts = ubuntu_node(installed=moved, held=tuple(moved), module="580.159.03")
    commands, _ = commands_of(
        driver_packages, {NvidiaPackages: facts, AptPackageVersions: offered}, spec=spec
    )
    assert not any(word.startswith(tuple(fabric)) for word in " ".join(commands).split())


def test_without_a_prebuilt_module_dkms_builds_it_with_the_kernel_s_headers() -> None:
    dkms = {
        "nvidia-dkms-550-server-open": [{"version": VERSION, "upstream": "550", "dkms": True}],
        "linux-headers-6.8.0-64-generic": [{"version": "6.8.0-64.67", "upstream": "6.8.0"}],
    }
    facts = ubuntu_node()
    spec = spec_for(facts, {})
    commands, _ = commands_of(
        driver_packages, {NvidiaPackages: facts, AptPackageVersions: dkms}, spec=spec
    )
    assert commands[0].endswith(
        f"nvidia-dkms-550-server-open={VERSION} linux-headers-6.8.0-64-generic"
    )


def test_persistenced_comes_with_ubuntu_s_compute_utils() -> None:
    spec = spec_for(ubuntu_node(), PREBUILT_OFFERED)
    assert persistenced_package(spec) == "nvidia-compute-utils-550-server"
    commands, noops = commands_of(
        persistence_daemon, {NvidiaPackages: ubuntu_node()}, package=persistenced_package(spec)
    )
    assert commands == []
    assert noops == [
        "nvidia-compute-utils-550-server is not installed yet: the driver install sets it up"
    ]


def test_the_debian_rules_refuse_the_ubuntu_source() -> None:
    from gpunode.expected.packages import driver_packages_for

    with pytest.raises(ValueError, match="ubuntu_driver_packages"):
        driver_packages_for(driver(branch="550"), None)
    assert ubuntu_driver.suffix("550", "server", "open") == "550-server-open"


def test_a_desktop_branch_pin_beside_nvidia_s_repository_is_refused() -> None:
    desktop = driver(branch="580", ubuntu_series="desktop")
    problem = ubuntu_pin_problem(desktop, cuda_repository_needed=True)
    assert problem is not None
    assert "set nvidia_driver.version to Ubuntu's exact version" in problem
    # Without NVIDIA's repository, with an exact version, or the -server series: no mix.
    assert ubuntu_pin_problem(desktop, cuda_repository_needed=False) is None
    exact = driver(branch="580", ubuntu_series="desktop", version="580.95.05-0ubuntu0.24.04.2")
    assert ubuntu_pin_problem(exact, cuda_repository_needed=True) is None
    assert ubuntu_pin_problem(driver(branch="580"), cuda_repository_needed=True) is None

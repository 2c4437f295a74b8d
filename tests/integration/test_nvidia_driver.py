"""deploys/nvidia.py on lab nodes: the NVIDIA driver pinned, held, upgraded only by data.

The ``debian`` source uses Debian's real non-free packages: the lab's container kernel has no
headers package, so the role must refuse before apt is asked for anything. The ``nvidia``
source uses the lab's signed stand-in repository (real names, versions and dependency shapes):
install 550.127.08-1 (open), change data to 550.144.03-1, reboot the GPU simulator into it,
switch to the proprietary flavour (NVIDIA's full stack); then today's branches with the
compute-only default: 580 (the last branch-suffixed release) and across the 590 packaging
boundary to 595, locked by its pinning package. lab-1 (HGX H100) is declared to have
NVSwitches, so it gets Fabric Manager; lab-2 (A100 data without NVSwitch) must not.

Secure Boot (lab.hwsim.firmware: the nodes' simulated UEFI firmware, read by Debian's real
mokutil, installed from Debian's archive for the module): the switch to the proprietary flavour
is a DKMS module change under Secure Boot, refused while DKMS's signing key is not enrolled and
done once it is (``mokutil --import``, then the console step); the change to 580 is one with
Secure Boot off. The drift check says a DKMS module would not load while the key is not
enrolled.

The module leaves the nodes as it found them: no driver, no NVIDIA source, simulator as before.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import Lab, LabNode, hwsim
from lab.standin import catalogue

from .conftest import (
    GPUNODE,
    ROOT,
    PyinfraRun,
    cuda_path,
    run_pyinfra,
    ssh,
    write_inventory,
)

pytestmark = pytest.mark.lab

DEPLOY = "deploys/nvidia.py"
OURS = ("NVIDIA driver | ", "NVIDIA Fabric Manager | ")
PREFERENCES = "/etc/apt/preferences.d/gpunode-nvidia-driver"
NOUVEAU = "/etc/modprobe.d/gpunode-nouveau.conf"
HARDWARE = "/var/lib/gpunode-lab/hardware.json"
HARDWARE_BACKUP = "/root/hardware.json.before-test-nvidia-driver"
# Lab nodes have no initramfs-tools: a stand-in records each call.
FAKE_INITRAMFS = "/usr/local/sbin/update-initramfs"
INITRAMFS_CALLS = "/root/update-initramfs.calls"
OPEN_DRIVER = (
    "nvidia-open", "nvidia-kernel-open-dkms", "nvidia-driver", "nvidia-driver-cuda",
    "nvidia-driver-libs", "libcuda1", "libnvidia-ml1", "nvidia-smi", "nvidia-persistenced",
    "nvidia-modprobe", "nvidia-kernel-support", "firmware-nvidia-gsp",
)  # fmt: skip
PROPRIETARY_DRIVER = (
    "cuda-drivers", "cuda-drivers-550", "nvidia-kernel-dkms",
    *(name for name in OPEN_DRIVER if name not in ("nvidia-open", "nvidia-kernel-open-dkms")),
)  # fmt: skip
# What the module adds, and what it leaves as it found it.
SNAPSHOT = (
    "dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n' | awk '$1 !~ /^.n/' | sort; "
    "apt-mark showhold; ls /etc/apt/sources.list.d /etc/apt/preferences.d /etc/modprobe.d "
    "/usr/share/keyrings"
)


def run(lab: Lab, node: LabNode, command: str) -> str:
    """A root shell command on the node; fails the test with its output if it fails."""
    result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def versions(lab: Lab, node: LabNode) -> dict[str, str]:
    listing = run(lab, node, "dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n'")
    return {
        parts[1]: parts[2]
        for parts in (line.split() for line in listing.splitlines())
        if len(parts) == 3 and parts[0][1] == "i"
    }


def holds(lab: Lab, node: LabNode) -> set[str]:
    return set(run(lab, node, "apt-mark showhold").split())


def unit_state(lab: Lab, node: LabNode, unit: str) -> tuple[str, str]:
    enabled = run(lab, node, f"systemctl is-enabled {unit} || true").strip()
    active = run(lab, node, f"systemctl is-active {unit} || true").strip()
    return enabled, active


def loaded_driver(lab: Lab, node: LabNode) -> str:
    return run(lab, node, "gpunode-lab-hw show driver_version").strip().strip('"')


def repository_requests(lab: Lab) -> list[str]:
    """The lab repository server's request log (written from the first request on)."""
    log = Path(f"{lab.repo_dir}-requests.log")
    return log.read_text().splitlines() if log.exists() else []


def apt_data(lab: Lab) -> dict[str, str]:
    """The lab's NVIDIA repositories, as inventories/group_data/lab.py declares them."""
    repo = lab.repo_base_url
    return {
        "cuda_repo_url": f"{repo}/cuda/{{distro}}/{{arch}}",
        "container_toolkit_repo_url": f"{repo}/libnvidia-container/stable/deb/amd64",
        "cuda_keyring": str(lab.repo_dir / "keyrings" / "cuda-archive-keyring.gpg"),
        "container_toolkit_keyring": str(
            lab.repo_dir / "keyrings" / "nvidia-container-toolkit-keyring.gpg"
        ),
    }


# The nvidia_driver data of this module's last real run that succeeded (None: unknown, or the
# nodes fixture's nodes without a driver). Each test of the 550 -> 595 story starts from the
# state the one before it leaves; ``driver_at`` makes that state where the test before did not
# run (-k, or it failed), and costs nothing where it did.
_last_converged: dict[str, dict[str, Any] | None] = {"driver": None}


def deploy(
    lab: Lab, nodes: list[LabNode], path: Path, driver: dict[str, Any], *args: str
) -> PyinfraRun:
    """deploys/nvidia.py with ``driver`` as nvidia_driver data; lab-1 has NVSwitches."""
    data: dict[str, dict[str, Any]] = {}
    for node in nodes:
        data[node.name] = {"apt": apt_data(lab), "nvidia_driver": driver}
        if node.profile == "hgx-h100" and driver.get("source") == "nvidia":
            data[node.name]["expected_hardware"] = {"nvswitch": True}
    inventory = write_inventory(path, lab, nodes, data)
    result = run_pyinfra("-v", *args, DEPLOY, inventory=inventory)
    # source "none" leaves the driver as it is; --dry changes nothing.
    if "--dry" not in args and driver.get("source") != "none":
        _last_converged["driver"] = driver if result.returncode == 0 else None
    return result


def install_fake_initramfs(lab: Lab, node: LabNode) -> None:
    script = f'#!/bin/sh\necho "$*" >> {INITRAMFS_CALLS}\n'
    run(lab, node, f"printf %s {shlex.quote(script)} > {FAKE_INITRAMFS}; "
                   f"chmod 755 {FAKE_INITRAMFS}")  # fmt: skip


def driver_at(lab: Lab, nodes: list[LabNode], path: Path, driver: dict[str, Any]) -> None:
    """The nodes converged with ``driver``, unless this module's last run left them so."""
    if _last_converged["driver"] == driver:
        return
    for node in nodes:
        if ssh(lab, node, f"test -x {FAKE_INITRAMFS}").returncode != 0:
            install_fake_initramfs(lab, node)
    result = deploy(lab, nodes, path, driver)
    assert result.returncode == 0, result.output


def ours_changed(result: PyinfraRun) -> set[tuple[str, str]]:
    assert result.returncode == 0, result.output
    return {
        (name, host)
        for name, hosts in result.changed_operations().items()
        for host in hosts
        if name.startswith(OURS)
    }


def ours_predicted(result: PyinfraRun) -> set[tuple[str, str]]:
    assert result.returncode == 0 and result.results is not None, result.output
    return {
        (op["name"], host)
        for op in result.results["plan"]
        for host in op["hosts_with_change"]
        if op["name"].startswith(OURS)
    }


def converge(lab: Lab, nodes: list[LabNode], path: Path, driver: dict[str, Any]) -> PyinfraRun:
    """--dry, then the real run, which must change exactly what --dry predicted."""
    dry = deploy(lab, nodes, path, driver, "--dry")
    real = deploy(lab, nodes, path, driver)
    assert ours_changed(real) == ours_predicted(dry)
    return real


def assert_no_change(lab: Lab, nodes: list[LabNode], path: Path, driver: dict[str, Any]) -> None:
    again = deploy(lab, nodes, path, driver)
    assert again.returncode == 0, again.output
    assert again.changed_operations() == {}, again.output


def _remove_everything(lab: Lab, nodes: list[LabNode], path: Path) -> None:
    names = " ".join(sorted({package.name for package in catalogue()}))
    for node in nodes:
        run(
            lab,
            node,
            f"installed=$(dpkg-query -W -f='${{db:Status-Abbrev}} ${{Package}}\\n' {names} "
            "2>/dev/null | awk '$1 !~ /^.n/ {print $2}'); "
            'if [ -n "$installed" ]; then apt-mark unhold $installed >/dev/null; '
            "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q $installed >/dev/null; fi; "
            f"rm -f {PREFERENCES} {NOUVEAU} {FAKE_INITRAMFS} {INITRAMFS_CALLS}; "
            # Downloaded stand-ins too, so that each install fetches from the repository.
            f"for name in {names}; do rm -f /var/cache/apt/archives/${{name}}_*.deb; done",
        )
    # The repository role removes the NVIDIA source and keyring once nothing needs them.
    cleared = deploy(lab, nodes, path, {"source": "none"})
    assert cleared.returncode == 0, cleared.output


@pytest.fixture(scope="module")
def nodes(
    lab: Lab, lab_nodes: list[LabNode], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[LabNode]]:
    """The lab nodes without any NVIDIA driver; put back as found afterwards."""
    path = tmp_path_factory.mktemp("nvidia-driver") / "cleanup_inventory.py"
    _remove_everything(lab, lab_nodes, path)
    _last_converged["driver"] = None
    for node in lab_nodes:
        # The simulated reboots change the loaded driver and reset GPU settings.
        run(lab, node, f"cp -p {HARDWARE} {HARDWARE_BACKUP}")
        factory = hwsim.PROFILES[node.profile].driver_version
        run(lab, node, f"gpunode-lab-hw set driver_version '\"{factory}\"'")
    before = {node.name: run(lab, node, SNAPSHOT) for node in lab_nodes}
    yield lab_nodes
    _remove_everything(lab, lab_nodes, path)
    _last_converged["driver"] = None
    for node in lab_nodes:
        run(lab, node, f"mv {HARDWARE_BACKUP} {HARDWARE}")
        assert run(lab, node, SNAPSHOT) == before[node.name], f"{node.name} not left as found"


@pytest.fixture
def inventory_path(tmp_path: Path) -> Path:
    return tmp_path / "inventory.py"


# --- debian source: the real Debian packages, no headers for the container's kernel ---------


def test_debian_source_refuses_missing_headers_before_anything_changes(
    lab: Lab, nodes: list[LabNode], inventory_path: Path
) -> None:
    for node in nodes:
        # Fresh lists, so "not installable" is apt's verdict, and Debian does offer the driver.
        run(lab, node, "apt-get update -q >/dev/null")
        assert "Candidate: (none)" not in run(lab, node, "apt-cache policy nvidia-kernel-dkms")
    before = {node.name: run(lab, node, SNAPSHOT) for node in nodes}
    kernel = run(lab, nodes[0], "uname -r").strip()

    for args in (("--dry",), ()):
        result = deploy(lab, nodes, inventory_path, {"source": "debian"}, *args)
        assert result.returncode != 0
        assert (
            f"linux-headers-{kernel} is not installed and not installable from the configured "
            "repositories; the NVIDIA kernel module cannot be built (install it or use a kernel "
            "with headers)"
        ) in result.output
    for node in nodes:
        assert run(lab, node, SNAPSHOT) == before[node.name]
        assert "nvidia" not in run(lab, node, "dpkg -l | awk '$1 ~ /^.i/ {print $2}'")


# --- nvidia source: the lab's stand-in repository --------------------------------------------

# What a refused run must leave byte for byte: installed packages, holds, the files of the
# apt pin, the apt sources and keyrings, and modprobe's configuration (the nouveau blacklist).
FILES_DIGEST = (
    "sha256sum /etc/apt/sources.list /etc/apt/preferences.d/* /etc/apt/sources.list.d/* "
    "/etc/modprobe.d/* /usr/share/keyrings/* 2>/dev/null; true"
)
# Branches and versions the stand-in repository does not carry (lab/standin/world.toml: 550,
# 570, 580 and 595 only; 550.163.01 is Debian's build, never NVIDIA's).
MODPROBE_DIGEST = "sha256sum /etc/modprobe.d/* 2>/dev/null; true"
UNOFFERED_BRANCH = {"source": "nvidia", "branch": "590"}
UNOFFERED_VERSION = {"source": "nvidia", "branch": "550", "version": "550.163.01-1"}


def packages_and_files(lab: Lab, node: LabNode) -> tuple[str, str]:
    return run(lab, node, SNAPSHOT), run(lab, node, FILES_DIGEST)


def test_a_branch_the_fresh_mirror_lacks_stops_the_node_before_the_pin(
    lab: Lab, nodes: list[LabNode], inventory_path: Path
) -> None:
    """No NVIDIA source yet: apt learns what the mirror offers only from this run's update, so
    the node is asked then, before the nouveau blacklist, the pin or any package."""
    for node in nodes:
        sources = "/etc/apt/sources.list.d/gpunode-nvidia-cuda.sources"
        assert ssh(lab, node, f"test -e {sources}").returncode != 0
    before = {node.name: run(lab, node, SNAPSHOT) for node in nodes}
    modprobe = {node.name: run(lab, node, MODPROBE_DIGEST) for node in nodes}
    result = deploy(lab, nodes, inventory_path, UNOFFERED_BRANCH)
    assert result.returncode != 0
    for node in nodes:
        url = f"{lab.repo_base_url}/{cuda_path(node)}"
        assert (
            f"gpunode: {node.name}: NVIDIA driver of branch 590 is not offered by {url}: missing "
        ) in result.output
        assert run(lab, node, f"test -e {PREFERENCES} && echo pinned || true") == ""
        assert run(lab, node, MODPROBE_DIGEST) == modprobe[node.name]
        # Packages and holds as they were; only the repository (declared) was added.
        after = run(lab, node, SNAPSHOT)
        assert (
            after.replace("gpunode-nvidia-cuda.sources\n", "").replace(
                "gpunode-nvidia-cuda.gpg\n", ""
            )
            == before[node.name]
        )


# NVIDIA's full stack (nvidia-open / cuda-drivers); the compute-only default follows below.
OPEN_127 = {"source": "nvidia", "branch": "550", "version": "550.127.08-1", "stack": "full"}
OPEN_144 = {**OPEN_127, "version": "550.144.03-1"}
OPEN_144_REBOOT = {**OPEN_144, "reboot": "if-needed"}
PROPRIETARY_144 = {**OPEN_144_REBOOT, "flavour": "proprietary"}


def test_branch_550_installs_pinned_and_held(
    lab: Lab, nodes: list[LabNode], inventory_path: Path
) -> None:
    for node in nodes:
        install_fake_initramfs(lab, node)
    started = len(repository_requests(lab))
    result = converge(lab, nodes, inventory_path, OPEN_127)
    for node in nodes:
        assert ("NVIDIA driver | nouveau blacklisted", node.name) in ours_changed(result)
        assert ("NVIDIA driver | initramfs without nouveau", node.name) in ours_changed(result)
        assert run(lab, node, f"cat {INITRAMFS_CALLS}") == "-u\n"
        installed = versions(lab, node)
        assert {name: installed.get(name) for name in OPEN_DRIVER} == dict.fromkeys(
            OPEN_DRIVER, "550.127.08-1"
        )
        assert set(OPEN_DRIVER) <= holds(lab, node)
        # Pinned: apt would not pick the newer release even for a fresh install.
        policy = run(lab, node, "apt-cache policy nvidia-open")
        assert "Candidate: 550.127.08-1" in policy and "550.144.03-1" in policy
        assert "nvidia" not in run(lab, node, "apt-get -s -q dist-upgrade | grep ^Inst || true")
        assert run(lab, node, f"cat {NOUVEAU}").splitlines()[1:] == [
            "blacklist nouveau",
            "options nouveau modeset=0",
        ]
        assert unit_state(lab, node, "nvidia-persistenced") == ("enabled", "active")
        assert f"[{node.name}] noop: reboot required: loaded NVIDIA kernel module " in result.output

    lab1, lab2 = nodes[0], nodes[1]
    assert versions(lab, lab1)["nvidia-fabricmanager-550"] == "550.127.08-1"
    assert "nvidia-fabricmanager-550" in holds(lab, lab1)
    # The simulator's loaded driver is not 550.127.08: Fabric Manager waits for a reboot.
    assert unit_state(lab, lab1, "nvidia-fabricmanager") == ("enabled", "inactive")
    assert "nvidia-fabricmanager 550.127.08 not started: pending a reboot" in result.output
    assert not any("fabricmanager" in name for name in versions(lab, lab2))

    # The mirror from data is the only place apt looked; nothing names NVIDIA's hosts.
    for node in nodes:
        sources = run(lab, node, "cat /etc/apt/sources.list.d/gpunode-nvidia-cuda.sources")
        assert f"URIs: {lab.repo_base_url}/{cuda_path(node)}/" in sources
        assert run(lab, node, "grep -rl 'nvidia.com\\|nvidia.github.io' /etc/apt || true") == ""
    logged = repository_requests(lab)[started:]
    assert logged
    addresses = {node.address for node in nodes}
    assert {line.split()[1] for line in logged} <= addresses
    path_of = {node.address: f"/{cuda_path(node)}/" for node in nodes}
    assert all(line.split()[3].startswith(path_of[line.split()[1]]) for line in logged)
    assert any("nvidia-kernel-open-dkms_550.127.08-1_amd64.deb" in line for line in logged)


def test_second_run_changes_nothing(lab: Lab, nodes: list[LabNode], inventory_path: Path) -> None:
    driver_at(lab, nodes, inventory_path, OPEN_127)
    assert_no_change(lab, nodes, inventory_path, OPEN_127)
    for node in nodes:
        # The blacklist did not change, so the initramfs was left alone.
        assert run(lab, node, f"cat {INITRAMFS_CALLS}") == "-u\n"


def test_a_branch_or_version_the_mirror_does_not_offer_is_refused_before_anything_changes(
    lab: Lab, nodes: list[LabNode], inventory_path: Path
) -> None:
    driver_at(lab, nodes, inventory_path, OPEN_127)
    before = {node.name: packages_and_files(lab, node) for node in nodes}
    for driver, wanted in (
        (UNOFFERED_BRANCH, "of branch 590"),
        (UNOFFERED_VERSION, "550.163.01-1"),
    ):
        for args in (("--dry",), ()):
            result = deploy(lab, nodes, inventory_path, driver, *args)
            assert result.returncode != 0
            for node in nodes:
                url = f"{lab.repo_base_url}/{cuda_path(node)}"
                assert (
                    f"{node.name}: NVIDIA driver {wanted} is not offered by {url}: missing "
                ) in result.output
            assert "Nothing was changed" in result.output
            for node in nodes:
                assert packages_and_files(lab, node) == before[node.name]
    # Nothing changed: the nodes are still as OPEN_127 left them.
    _last_converged["driver"] = OPEN_127


def test_a_new_version_in_data_upgrades_and_holds_again(
    lab: Lab, nodes: list[LabNode], inventory_path: Path
) -> None:
    driver_at(lab, nodes, inventory_path, OPEN_127)
    result = converge(lab, nodes, inventory_path, OPEN_144)
    changed = ours_changed(result)
    for node in nodes:
        assert (
            "NVIDIA driver | NVIDIA driver 550.144.03-1 (open kernel module, nvidia source): "
            "installed and held",
            node.name,
        ) in changed
        installed = versions(lab, node)
        assert {installed[name] for name in OPEN_DRIVER} == {"550.144.03-1"}
        assert set(OPEN_DRIVER) <= holds(lab, node)
        assert "Pin: version 550.144.03-1" in run(lab, node, f"cat {PREFERENCES}")
    assert versions(lab, nodes[0])["nvidia-fabricmanager-550"] == "550.144.03-1"
    assert "nvidia-fabricmanager-550" in holds(lab, nodes[0])
    assert_no_change(lab, nodes, inventory_path, OPEN_144)


def test_if_needed_reboots_into_the_installed_driver_and_fabric_manager_starts(
    lab: Lab, nodes: list[LabNode], inventory_path: Path
) -> None:
    driver_at(lab, nodes, inventory_path, OPEN_144)
    assert {loaded_driver(lab, node) for node in nodes} != {"550.144.03"}
    result = converge(lab, nodes, inventory_path, OPEN_144_REBOOT)
    rebooted = {host for name, host in ours_changed(result) if "Loaded kernel module" in name}
    assert rebooted == {node.name for node in nodes}
    for node in nodes:
        assert loaded_driver(lab, node) == "550.144.03"
    assert unit_state(lab, nodes[0], "nvidia-fabricmanager") == ("enabled", "active")
    assert_no_change(lab, nodes, inventory_path, OPEN_144_REBOOT)


# --- Secure Boot: the simulated firmware, the real mokutil ------------------------------------

DKMS_KEY = "/var/lib/dkms/mok.pub"
# The key DKMS makes at its first build, by DKMS's own command (dell/dkms README.md, "Module
# signing"; read 2026-12-07): the stand-in packages run no DKMS, so the test makes it.
MAKE_DKMS_KEY = (
    "mkdir -p /var/lib/dkms && openssl req -new -x509 -nodes -days 36500 "
    "-subj '/CN=DKMS module signing key' -newkey rsa:2048 -keyout /var/lib/dkms/mok.key "
    f"-outform DER -out {DKMS_KEY} >/dev/null 2>&1"
)
# What the operator does: request the enrolment (the password MokManager will ask for, as a
# hash file instead of a prompt), then confirm it at the console at the next boot.
MOK_HASH = "/root/mok-password.hash"
REQUEST_ENROLMENT = (
    f"mokutil --generate-hash=gpunode-lab > {MOK_HASH} && "
    f"mokutil --import {DKMS_KEY} --hash-file {MOK_HASH}; status=$?; rm -f {MOK_HASH}; "
    "exit $status"
)
CONSOLE_CONFIRMS = "gpunode-lab-hw mok-manager"
INSTALLED = "dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n' | awk '$1 ~ /^.i/ {print $2}'"
# The firmware's factory state, and no key or request left in its NVRAM or DKMS's directory.
FACTORY_FIRMWARE = (
    "gpunode-lab-hw set firmware.secure_boot false && gpunode-lab-hw set firmware.uefi false "
    "&& rm -f /var/lib/gpunode-lab/efivars/Mok* && rm -rf /var/lib/dkms"
)


@pytest.fixture(scope="module")
def mokutil(lab: Lab, nodes: list[LabNode]) -> Iterator[None]:
    """Debian's mokutil on the nodes (from Debian's archive, through the lab's cache) for the
    tests that need it; purged with what it brought afterwards."""
    brought: dict[str, list[str]] = {}
    for node in nodes:
        before = set(run(lab, node, INSTALLED).split())
        run(
            lab,
            node,
            "export DEBIAN_FRONTEND=noninteractive; "
            "apt-get install -y -q --no-install-recommends mokutil >/dev/null 2>&1 || "
            "{ apt-get update -q >/dev/null && "
            "apt-get install -y -q --no-install-recommends mokutil >/dev/null; }",
        )
        brought[node.name] = sorted(set(run(lab, node, INSTALLED).split()) - before)
        # The lab's wrapper came with it (the dpkg hook), so mokutil reads the firmware.
        assert run(lab, node, "command -v mokutil").strip() == "/usr/local/sbin/mokutil"
    yield
    for node in nodes:
        run(lab, node, "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q "
                       f"{' '.join(brought[node.name])} >/dev/null")  # fmt: skip
        assert run(lab, node, "command -v mokutil || true") == ""


@pytest.fixture
def firmware(lab: Lab, nodes: list[LabNode], mokutil: None) -> Iterator[None]:
    """The test sets the nodes' firmware; it is back at the factory's afterwards."""
    yield
    for node in nodes:
        run(lab, node, FACTORY_FIRMWARE)
        assert run(lab, node, "ls /sys/firmware") == ""


def set_firmware(lab: Lab, node: LabNode, **settings: bool) -> None:
    for name, value in settings.items():
        run(lab, node, f"gpunode-lab-hw set firmware.{name} {str(value).lower()}")


def secure_boot_findings(nodes: list[LabNode], inventory: Path) -> dict[str, list[str]]:
    """The drift check's secure_boot.* findings of every node against ``inventory``, in one
    run: host -> "id severity: found | fix" of each."""
    result = subprocess.run(
        [GPUNODE, "drift", str(inventory), "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    report = json.loads(result.stdout)
    assert sorted(report["checked_hosts"]) == sorted(node.name for node in nodes), result.stderr
    found: dict[str, list[str]] = {node.name: [] for node in nodes}
    for finding in report["findings"]:
        if finding["id"].startswith("secure_boot."):
            found[finding["host"]].append(
                f"{finding['id']} {finding['severity']}: {finding['found']} | {finding['fix']}"
            )
    return found


def test_switching_to_the_proprietary_flavour_under_secure_boot(
    lab: Lab, nodes: list[LabNode], inventory_path: Path, firmware: None
) -> None:
    """A DKMS module change on nodes that boot with Secure Boot: refused, before anything
    changes, while the key DKMS signs with is not enrolled; done once it is."""
    driver_at(lab, nodes, inventory_path, OPEN_144_REBOOT)
    for node in nodes:
        set_firmware(lab, node, uefi=True, secure_boot=True)
        run(lab, node, MAKE_DKMS_KEY)
        assert run(lab, node, "mokutil --sb-state") == "SecureBoot enabled\n"
    before = {node.name: packages_and_files(lab, node) for node in nodes}
    for args in (("--dry",), ()):
        result = deploy(lab, nodes, inventory_path, PROPRIETARY_144, *args)
        assert result.returncode != 0
        for node in nodes:
            assert (
                f"{node.name}: NVIDIA driver 550.144.03-1 (proprietary kernel module, nvidia "
                "source) not installed: Secure Boot is on and no machine owner key DKMS signs "
                "the NVIDIA module with is enrolled: the module would not load; enrol the key "
                f"DKMS signs with: mokutil --import {DKMS_KEY}, then confirm the enrolment at "
                "the console on the next boot (MokManager)"
            ) in result.output
        assert "Nothing was changed" in result.output
        for node in nodes:
            assert packages_and_files(lab, node) == before[node.name]
    # The installed (open, DKMS-built) module would not load at the next boot either.
    enrol = (
        f"enrol the key DKMS signs with: mokutil --import {DKMS_KEY}, then confirm the "
        "enrolment at the console on the next boot (MokManager)"
    )
    findings = secure_boot_findings(nodes, inventory_path)
    for node in nodes:
        (finding,) = findings[node.name]
        assert finding.startswith(
            "secure_boot.module critical: module would not load under Secure Boot: Secure Boot "
            "is on and no machine owner key DKMS signs the NVIDIA module with is enrolled"
        )
        assert finding.endswith(f" | {enrol}")

    # The operator enrols DKMS's key: requested, then confirmed at the console.
    for node in nodes:
        run(lab, node, REQUEST_ENROLMENT)
        assert f"{DKMS_KEY} is already in the enrollment request" in run(
            lab, node, f"mokutil --test-key {DKMS_KEY} 2>&1 || true"
        )
        run(lab, node, CONSOLE_CONFIRMS)
        assert f"{DKMS_KEY} is already enrolled" in run(
            lab, node, f"mokutil --test-key {DKMS_KEY} 2>&1 || true"
        )
    assert secure_boot_findings(nodes, inventory_path) == {node.name: [] for node in nodes}
    converge(lab, nodes, inventory_path, PROPRIETARY_144)
    for node in nodes:
        installed = versions(lab, node)
        assert {installed.get(name) for name in PROPRIETARY_DRIVER} == {"550.144.03-1"}
        assert "nvidia-open" not in installed and "nvidia-kernel-open-dkms" not in installed
        assert set(PROPRIETARY_DRIVER) <= holds(lab, node)
        flavour = run(lab, node, "cat /var/lib/gpunode-lab/installed-kernel-module-flavour")
        assert flavour == "proprietary\n"
    assert_no_change(lab, nodes, inventory_path, PROPRIETARY_144)


def test_source_none_leaves_the_installed_driver_alone(
    lab: Lab, nodes: list[LabNode], inventory_path: Path
) -> None:
    driver_at(lab, nodes, inventory_path, PROPRIETARY_144)
    before = {node.name: versions(lab, node) for node in nodes}
    result = deploy(lab, nodes, inventory_path, {"source": "none"})
    assert ours_changed(result) == set()
    assert "NVIDIA driver left alone: nvidia_driver.source is 'none'" in result.output
    for node in nodes:
        assert versions(lab, node) == before[node.name]
        assert set(PROPRIETARY_DRIVER) <= holds(lab, node)


# --- today's branches: the compute-only default, and across the 590 packaging boundary ------

COMPUTE_580 = {"source": "nvidia", "branch": "580", "version": "580.95.05-1", "reboot": "if-needed"}
COMPUTE_595 = {**COMPUTE_580, "branch": "595", "version": "595.71.05-1"}
COMPUTE = ("nvidia-driver-cuda", "nvidia-kernel-open-dkms", "libcuda1", "nvidia-smi")


def driver_packages_at(lab: Lab, node: LabNode) -> dict[str, str]:
    """Installed packages of the driver's family (Fabric Manager's apart)."""
    return {
        name: version
        for name, version in versions(lab, node).items()
        if name.startswith(("nvidia-", "libnvidia-", "libcuda", "cuda-drivers", "firmware-nvidia"))
        and not name.startswith(("nvidia-fabricmanager", "libnvidia-nscq"))
    }


def test_580_compute_only_replaces_the_full_stack_and_fabric_manager_loses_its_suffix(
    lab: Lab, nodes: list[LabNode], inventory_path: Path, firmware: None
) -> None:
    driver_at(lab, nodes, inventory_path, PROPRIETARY_144)  # NVIDIA's full stack, 550
    # UEFI nodes with Secure Boot off: DKMS's key, not enrolled, holds nothing up.
    for node in nodes:
        set_firmware(lab, node, uefi=True, secure_boot=False)
        run(lab, node, MAKE_DKMS_KEY)
        assert run(lab, node, "mokutil --sb-state") == "SecureBoot disabled\n"
        assert f"{DKMS_KEY} is not enrolled" in run(
            lab, node, f"mokutil --test-key {DKMS_KEY} 2>&1 || true"
        )
    converge(lab, nodes, inventory_path, COMPUTE_580)
    for node in nodes:
        installed = driver_packages_at(lab, node)
        assert {installed.get(name) for name in COMPUTE} == {"580.95.05-1"}
        # Nothing of 550 is left, and no pinning package: 580 is of the branch-suffixed era.
        assert not {name for name, version in installed.items() if version.startswith("550.")}
        assert not [name for name in installed if name.startswith("nvidia-driver-pinning")]
        assert "cuda-drivers-550" not in installed and "nvidia-kernel-dkms" not in installed
        assert set(COMPUTE) <= holds(lab, node)
        assert loaded_driver(lab, node) == "580.95.05"
    lab1 = nodes[0]
    fabric = {n: v for n, v in versions(lab, lab1).items() if "fabricmanager" in n or "nscq" in n}
    assert fabric == {"nvidia-fabricmanager": "580.95.05-1", "libnvidia-nscq": "580.95.05-1"}
    assert set(fabric) <= holds(lab, lab1)
    assert unit_state(lab, lab1, "nvidia-fabricmanager") == ("enabled", "active")
    assert_no_change(lab, nodes, inventory_path, COMPUTE_580)


def test_crossing_to_595_locks_the_branch_with_its_pinning_package_in_one_run(
    lab: Lab, nodes: list[LabNode], inventory_path: Path
) -> None:
    driver_at(lab, nodes, inventory_path, COMPUTE_580)
    converge(lab, nodes, inventory_path, COMPUTE_595)
    for node in nodes:
        installed = driver_packages_at(lab, node)
        assert {installed.get(name) for name in COMPUTE} == {"595.71.05-1"}
        assert "nvidia-driver-pinning-595" in installed
        assert {"nvidia-driver-pinning-595", *COMPUTE} <= holds(lab, node)
        assert not {name for name, version in installed.items() if version.startswith("580.")}
        assert loaded_driver(lab, node) == "595.71.05"
        assert "Pin: version 595.71.05-1" in run(lab, node, f"cat {PREFERENCES}")
    assert versions(lab, nodes[0])["nvidia-fabricmanager"] == "595.71.05-1"
    assert unit_state(lab, nodes[0], "nvidia-fabricmanager") == ("enabled", "active")
    assert_no_change(lab, nodes, inventory_path, COMPUTE_595)

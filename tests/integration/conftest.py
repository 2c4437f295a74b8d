"""Lab nodes for integration tests: real Debian 12 / 13 systemd containers reached over SSH.

GPUNODE_TEST_LAB_RELEASE picks their releases as `gpunode lab up --release` does: mixed (the
default: bookworm and trixie in turn, lab-1 bookworm, lab-2 trixie, so that every test runs
against both releases), bookworm or trixie.

The VM part of the suite (tests marked ``vm``, test_vm_*.py) runs on ``lab_vms``: one lab VM
with a real kernel (`gpunode lab up --vms 1`: 1 GiB, four emulated NVMe drives) of the first
of those releases, booted when a VM test first needs it and removed at the end of the session.
The VM tests sort last among the integration tests, so no container test's deploy of
inventories/lab.py meets it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpunode.distributions import BY_CODENAME
from gpunode.model import DesiredState
from lab import LOGIN_USER, REBOOT_COMMAND, Lab, LabNode, releases_of
from lab import vm as lab_vm

ROOT = Path(__file__).resolve().parents[2]
LAB_NODES = int(os.environ.get("GPUNODE_TEST_LAB_NODES", "2"))
LAB_RELEASES = releases_of(os.environ.get("GPUNODE_TEST_LAB_RELEASE", "mixed"))
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
GPUNODE = str(Path(sys.executable).with_name("gpunode"))


@dataclass
class PyinfraRun:
    returncode: int
    output: str
    results: dict[str, Any] | None

    def changed_operations(self) -> dict[str, list[str]]:
        """Operation name -> hosts it changed (from pyinfra --json results)."""
        assert self.results is not None, self.output
        return {
            op["name"]: op["success"]
            for op in self.results["results"]["operations"]
            if op["success"]
        }


def run_pyinfra(*args: str, inventory: str = "inventories/lab.py") -> PyinfraRun:
    """Run the pyinfra CLI as an operator would, with JSON results on stdout.

    --dry runs without -y: pyinfra only works out its change plan when not told to skip it.
    """
    confirm = [] if "--dry" in args else ["-y"]
    result = subprocess.run(
        [PYINFRA, *confirm, "--json", inventory, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    try:
        results = json.loads(result.stdout)
    except json.JSONDecodeError:
        results = None
    return PyinfraRun(result.returncode, result.stdout + result.stderr, results)


def cuda_path(node: LabNode) -> str:
    """The stand-in CUDA repository's path for ``node``'s release (apt.cuda_repo_url's
    ``{distro}/{arch}`` filled in), e.g. cuda/debian13/x86_64."""
    return f"cuda/{BY_CODENAME[node.release].cuda_repo_distro}/x86_64"


@pytest.fixture(scope="session")
def lab() -> Lab:
    return Lab()


@pytest.fixture(scope="session")
def lab_nodes(lab: Lab) -> Iterator[list[LabNode]]:
    yield lab.up(LAB_NODES, releases=LAB_RELEASES)


@pytest.fixture(scope="session")
def lab_vms(lab: Lab) -> Iterator[list[lab_vm.LabVm]]:
    # Small on purpose (CI time): one VM, 1 GiB, 3 drives for the RAID0 and one for refusals.
    vms = lab_vm.up_vms(lab, 1, releases=LAB_RELEASES[:1], memory_mib=1024, nvme_drives=4)
    yield vms
    lab_vm.down_vms(lab)


def ssh(
    lab: Lab, node: LabNode, command: str, user: str = LOGIN_USER
) -> subprocess.CompletedProcess:
    """Run a command on a lab node over real SSH, the way an operator would."""
    return subprocess.run(
        [
            "ssh", "-i", str(lab.key_path), "-o", f"UserKnownHostsFile={lab.known_hosts_path}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", "ConnectTimeout=10",
            f"{user}@{node.address}", command,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip


def wait_for_ssh(lab: Lab, node: LabNode) -> None:
    """Until ``node`` accepts a new SSH login again (after sshd restarts, say)."""
    for _ in range(40):
        if ssh(lab, node, "true").returncode == 0:
            return
        time.sleep(0.25)
    raise AssertionError(f"{node.name} does not accept SSH logins")


def lab_desired_state(inventory: str = "inventories/lab.py") -> DesiredState:
    """The desired state the lab inventory declares (all lab hosts share it but hardware)."""
    from gpunode.cli import load_inventory
    from gpunode.inventory import fleet_of

    hosts = fleet_of(load_inventory(str(ROOT / inventory)), inventory).hosts
    return next(iter(hosts.values()))


def write_inventory(
    path: Path, lab: Lab, nodes: list[LabNode], data: dict[str, dict[str, Any]]
) -> str:
    """A throw-away inventory of lab nodes with per-host data (``data[node.name]``).

    It sits outside inventories/, so no group data applies: only connection settings, the
    lab's way of rebooting (its GPU simulator, never the container) and what the test passes.
    """
    hosts = []
    for node in nodes:
        host_data = {
            "ssh_hostname": node.address,
            "ssh_user": LOGIN_USER,
            "ssh_key": str(lab.key_path),
            "ssh_known_hosts_file": str(lab.known_hosts_path),
            "ssh_strict_host_key_checking": "yes",
            "_sudo": True,
            "reboot": {"command": list(REBOOT_COMMAND)},
            **data.get(node.name, {}),
        }
        hosts.append((node.name, host_data))
    path.write_text(f"lab_nodes = {hosts!r}\n")
    return str(path)


def drift_report(node: LabNode, inventory: str = "inventories/lab.py") -> dict[str, Any]:
    """``gpunode drift --json`` of ``node`` alone, as the nightly check runs it; the node
    must have been checked."""
    result = subprocess.run(
        [GPUNODE, "drift", inventory, "--json", "--limit", node.name],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads(result.stdout)
    assert report["checked_hosts"] == [node.name], result.stderr
    return report

"""Lab nodes for integration tests: real Debian 12 / 13 systemd containers reached over SSH.

GPUNODE_TEST_LAB_RELEASE picks their releases as `gpunode lab up --release` does: mixed (the
default: the releases in turn, so the suite's two nodes are lab-1 bookworm and lab-2 trixie and
every test runs against both Debian releases; the Ubuntu lab node has a module of its own,
test_ubuntu_node.py), bookworm or trixie.

The VM part of the suite (tests marked ``vm``: test_vm.py, then test_vm_guards.py on the
same VM) runs on ``lab_vms``: one lab VM with a real kernel (`gpunode lab up --vms 1`: 1 GiB,
six emulated NVMe drives) of the first of those releases. It is part of every run of the
suite (``-m "not vm"`` leaves it out). When the session's tests include VM tests, it starts
booting (a process of its own: image build, TCG boot) as soon as the tests are collected, so
that it comes up while the unit and container tests run; ``lab_vms`` waits for it, and a VM
that does not come up is a failure with its boot log and console, never a hang. It is left
out of inventories/lab.py (no container test's deploy reaches it) and removed at the end of
the session. Under TCG on this two-core CI machine, loaded by another lab (load average
4-5), test_vm.py took 8 min 43 s alone, its VM's boot (40 s) included: the first converge
3.5 min (update-initramfs about 70 s of it), the real reboot and the second run 2.4 min.
"""

from __future__ import annotations

import json
import os
import pickle
import runpy
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpunode import ssh_kex
from gpunode.distributions import BY_CODENAME
from gpunode.model import DesiredState
from lab import DEBIAN_MODE_VARIABLE, LOGIN_USER, REBOOT_COMMAND, Lab, LabNode, releases_of
from lab import vm as lab_vm

ROOT = Path(__file__).resolve().parents[2]
# The suite's labs serve their nodes a signed subset of Debian's archive (lab.debian_subset:
# apt's cost on every command grows with its index, and apt was 44 % of the nodes' CPU with
# Debian's whole one); set before any Lab is made here or any pyinfra or gpunode run reads
# inventories/lab.py, which all inherit it. GPUNODE_LAB_DEBIAN=debian in the environment
# runs the suite against Debian's whole archive instead.
os.environ.setdefault(DEBIAN_MODE_VARIABLE, "subset")
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


def run_pyinfra(
    *args: str, inventory: str = "inventories/lab.py", checkout: Path = ROOT
) -> PyinfraRun:
    """Run the pyinfra CLI as an operator would, with JSON results on stdout.

    --dry runs without -y: pyinfra only works out its change plan when not told to skip it.
    ``checkout``: this checkout seen at another path (a bind mount of it): pyinfra and its
    interpreter run from there, so a deploy knows its checkout and Python by that path.
    """
    confirm = [] if "--dry" in args else ["-y"]
    command = [PYINFRA]
    if checkout != ROOT:
        python = checkout / Path(sys.executable).relative_to(ROOT)
        command = [str(python), str(python.with_name("pyinfra"))]
    result = subprocess.run(
        [*command, *confirm, "--json", inventory, *args],
        cwd=checkout,
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
def paramiko_kex() -> None:
    """paramiko in this process speaks mlkem768x25519-sha256 (gpunode/ssh_kex.py), the only
    kind of key exchange a hardened Debian 13 sshd offers. pyinfra's CLI gets it from
    config.py and the drift check installs it itself; a module that connects to nodes in this
    process (pyinfra's API) asks for this fixture rather than rely on another module (or a
    unit test) having installed it before."""
    ssh_kex.install()


# Small on purpose (CI time): one VM, 1 GiB; three drives for the RAID0, three for refusals.
VM_NVME_DRIVES = 6
# The longest a VM may take to come up: an image built from nothing (minutes), the lab's lock
# while the container nodes come up (Lab.up), a TCG boot on a busy two-core machine.
VM_UP_TIMEOUT_S = 3600
_vm_boot: dict[str, Any] = {}


def _vm_boot_log(lab: Lab) -> Path:
    return lab.state_dir / "test-vm-up.log"


def start_vm_boot(lab: Lab) -> subprocess.Popen:
    """`gpunode lab up --vms 1` for the VM tests, in the background (once a session)."""
    if "process" not in _vm_boot:
        lab.state_dir.mkdir(parents=True, exist_ok=True)
        log = _vm_boot_log(lab).open("wb")
        _vm_boot["process"] = subprocess.Popen(
            [
                sys.executable, "-m", "gpunode.cli", "lab", "up", "--nodes", "0", "--vms", "1",
                "--vms-unlisted", "--release", LAB_RELEASES[0], "--vm-memory-mib", "1024",
                "--vm-nvme-drives", str(VM_NVME_DRIVES),
            ],
            cwd=ROOT,
            # Its log as it goes: a VM killed for its time still shows how far it came.
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return _vm_boot["process"]


def pytest_report_header(config: pytest.Config) -> str:
    return "VM part of the suite (tests marked vm): on; -m 'not vm' leaves it out"


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    if any(item.get_closest_marker("vm") for item in session.items):
        start_vm_boot(Lab())


def _stop_vm_boot(lab: Lab) -> None:
    process = _vm_boot.get("process")
    if process is not None and process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def pytest_sessionfinish(session: pytest.Session) -> None:
    # A session that ends before the VM tests ran (-x, an interrupt) still removes the VM.
    if "process" in _vm_boot and not _vm_boot.get("removed"):
        lab = Lab()
        _stop_vm_boot(lab)
        lab_vm.down_vms(lab)


def vm_failure(lab: Lab, why: str) -> str:
    """Why the VM is not up, with its boot log and every VM console's end."""
    parts = [why, "--- gpunode lab up --vms 1:", _tail(_vm_boot_log(lab))]
    for console in sorted((lab.state_dir / "vms").glob("*/console*.log")):
        parts += [f"--- {console}:", _tail(console)]
    return "\n".join(parts)


def _tail(path: Path, size: int = 4000) -> str:
    try:
        return path.read_bytes()[-size:].decode(errors="replace")
    except OSError as error:
        return f"(unreadable: {error})"


@pytest.fixture(scope="session")
def lab_vms(lab: Lab) -> Iterator[list[lab_vm.LabVm]]:
    process = start_vm_boot(lab)
    try:
        process.wait(timeout=VM_UP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _stop_vm_boot(lab)
        failure = vm_failure(lab, f"the lab VM is not up after {VM_UP_TIMEOUT_S} s")
        lab_vm.down_vms(lab)
        pytest.fail(failure)
    if process.returncode != 0:
        failure = vm_failure(lab, f"gpunode lab up --vms 1 failed ({process.returncode})")
        lab_vm.down_vms(lab)
        pytest.fail(failure)
    vms = [vm for vm in lab.vms() if not vm.listed]
    assert len(vms) == 1, vm_failure(lab, f"the lab's state names {vms}")
    yield vms
    lab_vm.down_vms(lab)
    _vm_boot["removed"] = True


# Python source that counts, per host, the shell commands (SSH round trips) run in the
# process it is put into: pyinfra's SSH connector's, and those gpunode.remote_script starts on
# pyinfra's connection itself (the fact batches: gpunode.pyinfra_patches.exec_command):
# ``commands`` is {host name: count}. The tests that count put it after their imports and
# before they run pyinfra or the drift check.
SSH_COMMAND_COUNTER = """
from pyinfra.connectors.ssh import SSHConnector

import gpunode.pyinfra_patches

commands = {}
original = SSHConnector.run_shell_command
original_exec = gpunode.pyinfra_patches.exec_command


def counting(self, *args, **kwargs):
    commands[self.host.name] = commands.get(self.host.name, 0) + 1
    return original(self, *args, **kwargs)


def counting_exec(host, *args, **kwargs):
    channel = original_exec(host, *args, **kwargs)
    if channel is not None:
        commands[host.name] = commands.get(host.name, 0) + 1
    return channel


SSHConnector.run_shell_command = counting
gpunode.pyinfra_patches.exec_command = counting_exec
"""


def ssh(
    lab: Lab, node: LabNode, command: str, user: str = LOGIN_USER, input: str | None = None
) -> subprocess.CompletedProcess:
    """Run a command on a lab node over real SSH, the way an operator would (``input``: its
    standard input)."""
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
        input=input,
    )  # fmt: skip


def wait_for_ssh(lab: Lab, node: LabNode) -> None:
    """Until ``node`` accepts a new SSH login again (after sshd restarts, say)."""
    for _ in range(40):
        if ssh(lab, node, "true").returncode == 0:
            return
        time.sleep(0.25)
    raise AssertionError(f"{node.name} does not accept SSH logins")


def _sudo_output(lab: Lab, node: LabNode, command: str) -> str:
    result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, f"{node.name}: {command}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def journal_cursor(lab: Lab, node: LabNode) -> str:
    """Where the node's journal ends now: what is logged after it happened after this call."""
    for line in _sudo_output(lab, node, "journalctl -n 0 --show-cursor").splitlines():
        if line.startswith("-- cursor: "):
            return line.removeprefix("-- cursor: ")
    raise AssertionError(f"{node.name}: journalctl showed no cursor")


def journal_since(lab: Lab, node: LabNode, cursor: str, unit: str) -> str:
    """What ``unit`` logged, and systemd logged about it, after ``cursor``."""
    return _sudo_output(
        lab, node, f"journalctl --no-pager -o cat -u {unit} --after-cursor={shlex.quote(cursor)}"
    )


# Loading an inventory as pyinfra does imports pyinfra's CLI package, which monkey-patches the
# whole process with gevent (sockets, ssl, threads, subprocesses) as it is imported: done in
# pytest's process, every module after the first that asked would run patched, and each one's
# process would differ with the order modules run in. A process of its own loads it instead.
DESIRED_STATE_SCRIPT = """
import pickle
import sys

from gpunode.cli import load_inventory
from gpunode.inventory import fleet_of

hosts = fleet_of(load_inventory(sys.argv[1]), sys.argv[2]).hosts
with open(sys.argv[3], "wb") as out:
    pickle.dump(next(iter(hosts.values())), out)
"""


def lab_desired_state(inventory: str = "inventories/lab.py") -> DesiredState:
    """The desired state the lab inventory declares (all lab hosts share it but hardware)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "desired.pickle"
        done = subprocess.run(
            [sys.executable, "-c", DESIRED_STATE_SCRIPT, str(ROOT / inventory), inventory, out],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        state = pickle.loads(out.read_bytes())  # written just now by our own process
    assert isinstance(state, DesiredState), state
    return state


def lab_group_data(key: str) -> Any:
    """One key of inventories/group_data/lab.py, as the lab inventory's hosts have it."""
    return runpy.run_path(str(ROOT / "inventories" / "group_data" / "lab.py"))[key]


def lab_audit_data(**sections: Any) -> str:
    """``--data audit=...``: the lab's audit settings with these sections replaced. pyinfra's
    --data replaces the whole key, so the lab's other audit sections are kept here (a module
    that turns one audit on leaves the others off, as the rest of the suite has them)."""
    return "audit=" + json.dumps({**lab_group_data("audit"), **sections})


def write_inventory(
    path: Path, lab: Lab, nodes: list[LabNode], data: dict[str, dict[str, Any]]
) -> str:
    """A throw-away inventory of lab nodes with per-host data (``data[node.name]``).

    It sits outside inventories/, so no group data applies: only connection settings, the
    lab's way of rebooting (its GPU simulator, never the container), the lab's audit settings
    (off: no module's converge installs the audit packages), the lab's Debian archive where it
    serves its subset (so that a node's sources stay the same between the lab inventory's
    runs and these: each switch would be a full apt update) and what the test passes (its
    ``apt`` keys over the lab's).
    """
    hosts = []
    debian = lab.debian_apt_data()
    for node in nodes:
        given = data.get(node.name, {})
        host_data = {
            "ssh_hostname": node.address,
            "ssh_user": LOGIN_USER,
            "ssh_key": str(lab.key_path),
            "ssh_known_hosts_file": str(lab.known_hosts_path),
            "ssh_strict_host_key_checking": "yes",
            "_sudo": True,
            "reboot": {"command": list(REBOOT_COMMAND)},
            "audit": lab_group_data("audit"),
            **given,
        }
        if debian:
            host_data["apt"] = {**debian, **given.get("apt", {})}
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

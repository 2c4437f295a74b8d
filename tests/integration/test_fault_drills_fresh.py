"""Fault drills that need a node of their own, in a one-node lab beside the shared one.

- A deploy killed at a random point of a node's first converge (SIGKILL to pyinfra, the way
  a lost terminal or an OOM-killed control host ends it), then run again: it converges,
  a third run changes nothing, the drift check is clean and the verify suite passes.
  The kill point comes from a seed, printed on failure; GPUNODE_DRILL_SEED replays one.
- A run that starts while the apt of a cut-off run still works on the node waits for dpkg's
  lock and finishes the journal, instead of failing on the lock.
- A reboot in the middle of a driver change (the node restarted the moment dpkg works on an
  NVIDIA package): that run fails for this node, and the next run finishes the change.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import Lab, LabNode

from .conftest import PYINFRA, ROOT, PyinfraRun

# A lab of its own, none of the shared lab's nodes (tests/tiers.py: own_lab).
pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

DEPLOY = "deploys/gpu_node.py"
GPUNODE = str(Path(sys.executable).with_name("gpunode"))


class DrillLab:
    def __init__(self, lab: Lab, env: dict[str, str]) -> None:
        self.lab, self.env = lab, env
        (self.node,) = lab.nodes()

    def pyinfra(self, *args: str, inventory: str = "inventories/lab.py") -> PyinfraRun:
        result = subprocess.run(
            [PYINFRA, "-y", "--json", inventory, *args],
            cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=1200,
        )  # fmt: skip
        try:
            results = json.loads(result.stdout)
        except json.JSONDecodeError:
            results = None
        return PyinfraRun(result.returncode, result.stdout + result.stderr, results)

    def drift(self) -> dict[str, Any]:
        result = subprocess.run(
            [GPUNODE, "drift", "inventories/lab.py", "--json"],
            cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        return json.loads(result.stdout)

    def verify(self) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/verify",
             "--inventory", "inventories/lab.py"],
            cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip


@pytest.fixture(scope="module")
def drill(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DrillLab]:
    state = tmp_path_factory.mktemp("drill")
    subnet = int(lab.network_prefix.rsplit(".", 1)[1]) + 101
    fresh = Lab(state_dir=state / "lab", name=f"{lab.name}-drill", subnet_index=subnet)
    env = {
        **os.environ,
        "GPUNODE_LAB_DIR": str(state / "lab"),
        "GPUNODE_LAB_NAME": fresh.name,
        "GPUNODE_LAB_SUBNET": str(subnet),
        "GPUNODE_FACT_PLAN_DIR": str(state / "plans"),
    }
    fresh.up(1, profiles=["hgx-h100"])
    try:
        yield DrillLab(fresh, env)
    finally:
        fresh.down(keep_image=True)


def assert_converged(drill: DrillLab, context: str) -> None:
    again = drill.pyinfra(DEPLOY)
    assert again.returncode == 0, f"{context}\n{again.output}"
    assert again.changed_operations() == {}, context
    report = drill.drift()
    assert report["findings"] == [], f"{context}\n{report['findings']}"
    assert report["unreachable"] == {}, context
    verify = drill.verify()
    assert verify.returncode == 0, f"{context}\n{verify.stdout[-3000:]}"


def test_a_deploy_killed_at_a_random_point_converges_when_run_again(drill: DrillLab) -> None:
    seed = int(os.environ.get("GPUNODE_DRILL_SEED") or time.time_ns() % 1_000_000)
    kill_after = random.Random(seed).uniform(3.0, 40.0)  # a first converge takes longer
    context = f"drill seed {seed} (GPUNODE_DRILL_SEED replays it): killed at {kill_after:.1f} s"
    run = subprocess.Popen(
        [PYINFRA, "-y", "inventories/lab.py", DEPLOY],
        cwd=ROOT, env=drill.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        run.wait(timeout=kill_after)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
    output, _ = run.communicate()
    assert run.returncode == -signal.SIGKILL, f"{context}: it finished first\n{output}"
    resumed = drill.pyinfra(DEPLOY)
    assert resumed.returncode == 0, f"{context}\n{output[-3000:]}\n{resumed.output}"
    assert_converged(drill, context)


HOLD_DPKG_LOCK = (
    "import fcntl, sys, time\n"
    "lock = open('/var/lib/dpkg/lock-frontend', 'w')\n"
    "fcntl.lockf(lock, fcntl.LOCK_EX)\n"  # the lock dpkg and apt take (fcntl, not flock)
    "open('/var/lib/dpkg/updates/0000', 'w').close()\n"  # its journal, as a live dpkg has one
    "print('held', flush=True)\n"
    "time.sleep(float(sys.argv[1]))\n"
)


def test_a_run_waits_for_a_package_change_still_running_on_the_node(drill: DrillLab) -> None:
    # A run cut off in the middle of an install leaves its apt working on the node: the next
    # run sees dpkg's journal, waits for the lock instead of failing on it, then finishes.
    converged = drill.pyinfra(DEPLOY)
    assert converged.returncode == 0, converged.output
    holder = subprocess.Popen(
        ["docker", "exec", drill.node.container, "python3", "-c", HOLD_DPKG_LOCK, "8"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        run = drill.pyinfra(DEPLOY)
        assert holder.poll() == 0, "the run finished before the lock was given back"
    finally:
        holder.kill()
        holder.wait()
    assert run.returncode == 0, run.output
    assert [name for name in run.changed_operations() if "interrupted package" in name], (
        run.changed_operations()
    )
    journal = subprocess.run(
        ["docker", "exec", drill.node.container, "ls", "-A", "/var/lib/dpkg/updates"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert journal == ""


def dpkg_on_nvidia_packages(lab: Lab, node: LabNode) -> int | None:
    """The host pid of a dpkg process of the node working on an NVIDIA package, if any."""
    container_pid = lab.client.containers.get(node.container).attrs["State"]["Pid"]
    namespace = os.readlink(f"/proc/{container_pid}/ns/pid")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            if not cmdline[0].endswith(b"dpkg") or os.readlink(entry / "ns" / "pid") != namespace:
                continue
        except OSError:
            continue
        arguments = cmdline[1:]
        # apt's own "--configure --pending" of what it unpacked counts; the recovery's
        # "--configure -a" of an earlier cut-off run is not the driver change.
        if b"-a" not in arguments and any(b"nvidia" in a or a == b"--configure" for a in arguments):
            return int(entry.name)
    return None


def test_a_reboot_in_the_middle_of_a_driver_change_is_finished_by_the_next_run(
    drill: DrillLab, tmp_path: Path
) -> None:
    # The node converged at the fleet's 580.105.08-1 (by the drill above, or here when this
    # test runs alone or first); the data now pins 580.95.05-1.
    converged = drill.pyinfra(DEPLOY)
    assert converged.returncode == 0, converged.output
    inventory = tmp_path / "lab.py"
    (tmp_path / "group_data").symlink_to(ROOT / "inventories" / "group_data")
    lab_driver = {
        "source": "nvidia", "branch": "580", "version": "580.95.05-1", "flavour": "open",
        "reboot": "if-needed",
    }  # fmt: skip
    node = drill.node
    data = {
        "ssh_hostname": node.address,
        "nvidia_driver": lab_driver,
        "fabric_manager": {"version": "580.95.05-1"},
    }
    inventory.write_text(f"h100_nodes = {[(node.name, data)]!r}\n")
    run = subprocess.Popen(
        [PYINFRA, "-y", str(inventory), DEPLOY],
        cwd=ROOT, env=drill.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    rebooted_during: int | None = None
    deadline = time.monotonic() + 300
    while run.poll() is None and time.monotonic() < deadline:
        rebooted_during = dpkg_on_nvidia_packages(drill.lab, node)
        if rebooted_during:
            drill.lab.power_cycle(node)
            break
        time.sleep(0.01)
    output, _ = run.communicate(timeout=300)
    assert rebooted_during, f"dpkg never worked on an NVIDIA package\n{output}"
    assert run.returncode != 0, output  # the reboot cut that run short
    audit = subprocess.run(
        ["docker", "exec", node.container, "sh", "-c",
         "ls /var/lib/dpkg/updates; dpkg --audit"],
        capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    finish = drill.pyinfra(DEPLOY, inventory=str(inventory))
    assert finish.returncode == 0, f"{output[-3000:]}\n{finish.output}"
    recovered = [name for name in finish.changed_operations() if "interrupted package" in name]
    # Where the reboot left dpkg's work unfinished, the run finished it first.
    assert bool(recovered) == bool(audit), (audit, finish.changed_operations())
    again = drill.pyinfra(DEPLOY, inventory=str(inventory))
    assert again.returncode == 0 and again.changed_operations() == {}, again.output
    installed = subprocess.run(
        ["docker", "exec", node.container, "dpkg-query", "-W", "-f=${Version} ${Status}\\n",
         "nvidia-driver-cuda"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert installed == "580.95.05-1 hold ok installed"

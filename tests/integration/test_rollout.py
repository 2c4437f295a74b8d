"""`gpunode rollout` against real Slurm in the lab: the lab's slurmctld (test_slurm's
controller and converge, shared), gpunode's CLI reaching it over SSH as an operator would.

A job running on a node is waited for: the node is drained, converged (rebooted through the
driver role: its simulated GPUs were running another driver) and resumed, and no job starts
on it between the drain and the resume. A node that fails the health gate (an XID in its
kernel log) stays drained with the failed check in its reason, and with --max-failures 0 the
later batch is untouched. A rollout killed mid-batch (its whole process group, as a control
host going down) and started again finishes without touching the finished node again. A node
drained by hand is neither drained, converged nor resumed, by the rollout or by
``gpunode drift --drain critical``, which drains a node with a critical finding and resumes
it once clean. The GPU settings the simulated reboot resets come back from the boot unit
before slurmd starts. A MIG node rebooted by a rollout (``gpunode-lab-hw reboot --boot``: the
GPUs lose their instances, then the boot starts the units) has its MIG layout back from the
boot unit before slurmd and passes the gate; when the boot cannot lay it out, the gate fails
with ``gpu.mig_layout`` and the node stays drained. With ``--dcgm-diag`` the gate runs DCGM's
diagnostic (the lab's stand-in dcgmi) on the node that declares DCGM, not on the other, and a
fault in the simulated GPUs fails the named test. A node an operator set DOWN or FAIL ("PSU
fault") is skipped by the rollout and left alone by the drift drain, its reason kept, and
stays DOWN when its slurmd registers again (ReturnToService=1); a node the operator resumes
while the rollout waits for its job is left out unconverged, and a second rollout of the
inventory meanwhile refuses to start, naming the first. The driver reboot waits for the drain
read again after the converge: a node the operator resumed during the converge is left out
converged and not rebooted (its simulated GPUs still on the old driver); one still drained is
rebooted by the rollout's second run.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpunode.health.finding import gpu_bus_id
from lab import Lab, LabNode
from lab.hwsim.hwstate import DEFAULT_STATE_PATH
from roles.gpu_settings import BOOT_SETTINGS, BOOT_UNIT

from . import test_slurm
from .conftest import GPUNODE, ROOT, PyinfraRun, run_pyinfra, ssh, write_inventory
from .test_slurm import on_controller, sudo

# test_slurm's module fixtures (its controller, converge and registration): shared, not copied.
controller = test_slurm.controller
members = test_slurm.members
munge_key = test_slurm.munge_key
converged = test_slurm.converged
registered = test_slurm.registered

pytestmark = pytest.mark.lab

DEPLOY = "deploys/gpu_node.py"
INVENTORY = "inventories/lab.py"
# A kernel log line of an XID the drift check takes as critical (79: fallen off the bus).
XID_MESSAGE = (
    "NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=rollout-test, GPU has fallen off the bus."
)
# How long a rollout of the lab may take on a loaded lab host: a wait for an event, never an
# assertion on time.
ROLLOUT_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def scheduler_ssh(lab: Lab, controller: LabNode, tmp_path_factory: pytest.TempPathFactory) -> str:
    """--scheduler-ssh for the lab's controller: its own host key, the lab's login key."""
    container = lab.client.containers.get(controller.container)
    key = container.exec_run(["cat", "/etc/ssh/ssh_host_ed25519_key.pub"]).output.decode()
    known_hosts = tmp_path_factory.mktemp("controller") / "known_hosts"
    known_hosts.write_text(f"{controller.address} {' '.join(key.split()[:2])}\n")
    return (
        f"-i {lab.key_path} -o UserKnownHostsFile={known_hosts} -o IdentitiesOnly=yes "
        f"-o StrictHostKeyChecking=yes debian@{controller.address}"
    )


@pytest.fixture
def ready(
    lab: Lab,
    registered: dict[str, dict[str, str]],
    members: list[LabNode],
    lab_nodes: list[LabNode],
) -> Iterator[list[LabNode]]:
    """Every lab node, Slurm members IDLE; afterwards no job left, nothing left drained and
    no XID left in a node's kernel log."""
    yield lab_nodes
    on_controller(lab, "scancel --user root; scontrol update NodeName=ALL State=RESUME")
    # Until the jobs are gone: slurmctld's state outlives its container (Lab.slurm_up), and a
    # job it still held when the controller went would hold its node in the next session.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and on_controller(lab, "squeue -h -o %i")[1].strip():
        time.sleep(1)
    for node in lab_nodes:
        sudo(lab, node, "journalctl --rotate --vacuum-files=1 >/dev/null 2>&1 || true")


def rollout_argv(scheduler_ssh: str, state: Path, *extra: str) -> list[str]:
    return [
        GPUNODE, "rollout", INVENTORY, DEPLOY, "--state", str(state),
        "--scheduler-ssh", scheduler_ssh, "--poll", "1", *extra,
    ]  # fmt: skip


def run_rollout(
    scheduler_ssh: str, state: Path, *extra: str, inventory: str = INVENTORY, deploy: str = DEPLOY
) -> PyinfraRun:
    argv = rollout_argv(scheduler_ssh, state, *extra)
    argv[2:4] = [inventory, deploy]
    done = subprocess.run(
        argv,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=ROLLOUT_TIMEOUT_S,
    )
    results = json.loads(state.read_text()) if state.exists() else None
    return PyinfraRun(done.returncode, done.stdout + done.stderr, results)


def phase_of(state: Path) -> dict[str, str]:
    try:
        data = json.loads(state.read_text())
    except (OSError, ValueError):
        return {}
    return {name: record["phase"] for name, record in data["nodes"].items()}


def slurm_view(lab: Lab, node: LabNode) -> tuple[str, str, list[tuple[str, str]]]:
    """(sinfo state, reason, [(job id, state)] of squeue) of ``node`` on the controller."""
    _, sinfo = on_controller(lab, f"sinfo -h -N -n {node.name} -o '%T|%E'")
    state, _, reason = (
        sinfo.strip().splitlines()[0].partition("|") if sinfo.strip() else ("", "", "")
    )
    _, queue = on_controller(lab, f"squeue -h -w {node.name} -o '%i %T'")
    jobs = [tuple(line.split()[:2]) for line in queue.splitlines() if len(line.split()) >= 2]
    return state, reason, jobs  # type: ignore[return-value]


def submit(lab: Lab, node: LabNode, command: str) -> str:
    code, output = on_controller(
        lab, f"sbatch --parsable -w {node.name} -o /dev/null --wrap {command!r}"
    )
    assert code == 0, output
    return output.strip().split(";")[0]


def job_field(lab: Lab, job: str, name: str) -> str:
    _, output = on_controller(lab, f"scontrol show job -o {job}")
    fields = dict(word.split("=", 1) for word in output.split() if "=" in word)
    return fields.get(name, "")


def drain_updates(lab: Lab, node: LabNode, rollout_id: str) -> int:
    """How often slurmctld set ``node``'s reason to one of this rollout's."""
    _, log = on_controller(lab, "cat /var/log/slurm/slurmctld.log")
    return sum(
        f"node {node.name} reason set to: gpunode: rollout {rollout_id}" in line
        for line in log.splitlines()
    )


def takes_jobs(lab: Lab, node: LabNode) -> bool:
    """Once ``node`` is idle or mixed and responding: right after a resume slurmctld shows it
    not responding (``idle*``) until its next ping is answered ("now responding")."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if slurm_view(lab, node)[0] in ("idle", "mixed"):
            return True
        time.sleep(1)
    return False


@dataclass
class Sample:
    phases: dict[str, str]
    state: str
    reason: str
    jobs: list[tuple[str, str]]


def test_a_running_job_is_waited_for_and_no_job_starts_between_drain_and_resume(
    lab: Lab, ready: list[LabNode], members: list[LabNode], scheduler_ssh: str, tmp_path: Path
) -> None:
    node = members[0]
    # Long enough to outlive any start of the rollout: it ends once the rollout waits for it.
    first = submit(lab, node, "sleep 600")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and job_field(lab, first, "JobState") != "RUNNING":
        time.sleep(0.5)
    assert job_field(lab, first, "JobState") == "RUNNING"
    # The change needs a reboot: the node's simulated GPUs run another driver than installed.
    installed = sudo(lab, node, "gpunode-lab-hw show driver_version").strip()
    sudo(lab, node, "gpunode-lab-hw set driver_version '\"550.127.08\"'")
    state = tmp_path / "state.json"
    process = subprocess.Popen(
        rollout_argv(scheduler_ssh, state, "--limit", node.name),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    samples: list[Sample] = []
    queued = None
    deadline = time.monotonic() + ROLLOUT_TIMEOUT_S
    while process.poll() is None and time.monotonic() < deadline:
        slurm_state, reason, jobs = slurm_view(lab, node)
        samples.append(Sample(phase_of(state), slurm_state, reason, jobs))
        if queued is None and reason.startswith("gpunode: rollout"):
            # Submitted while the node is drained: it must wait for the resume.
            queued = submit(lab, node, "true")
        elif queued is not None and samples[-1].phases.get(node.name) == "waiting":
            on_controller(lab, f"scancel {first}")  # the job ends while the rollout waits
        time.sleep(0.5)
    output = process.communicate(timeout=60)[0]
    assert process.returncode == 0, output[-4000:]
    assert queued is not None, output
    data = json.loads(state.read_text())
    record = data["nodes"][node.name]
    assert (record["phase"], record["rebooted"]) == ("done", True), record
    assert f"{node.name}: waiting for jobs {first}" in output
    assert sudo(lab, node, "gpunode-lab-hw show driver_version").strip() == installed
    # While the rollout held the node: only the job that ran before the drain ran, and not
    # once the converge had begun; the job queued meanwhile never ran before the resume.
    held = [s for s in samples if s.phases.get(node.name) not in (None, "pending", "done")]
    assert held, samples
    for sample in held:
        running = {job for job, job_state in sample.jobs if job_state == "RUNNING"}
        assert running <= {first}, sample
        if sample.phases[node.name] in ("converging", "reboot-pending", "checking", "resuming"):
            assert running == set(), sample
    # Slurm's own record: the queued job started after the first one ended, once resumed.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and job_field(lab, queued, "JobState") != "COMPLETED":
        time.sleep(0.5)
    assert job_field(lab, queued, "JobState") == "COMPLETED"
    assert job_field(lab, queued, "StartTime") >= job_field(lab, first, "EndTime")
    assert takes_jobs(lab, node)


def test_a_node_failing_the_health_gate_stays_drained_and_the_later_batch_is_untouched(
    lab: Lab, ready: list[LabNode], members: list[LabNode], scheduler_ssh: str, tmp_path: Path
) -> None:
    node = members[0]
    later = [other for other in ready if other != node]
    assert later, "the lab needs two nodes"
    sudo(lab, node, f"logger -t kernel '{XID_MESSAGE}'")
    state = tmp_path / "state.json"
    run = run_rollout(scheduler_ssh, state, "--canary", "1", "--batch", "1", "--max-failures", "0")
    assert run.returncode == 3, run.output[-4000:]  # stopped by the budget
    assert run.results is not None
    rollout_id = run.results["id"]
    record = run.results["nodes"][node.name]
    assert record["phase"] == "failed", record
    slurm_state, reason, _ = slurm_view(lab, node)
    assert slurm_state in ("drained", "draining")
    assert reason.startswith(f"gpunode: rollout {rollout_id} failed health gate gpu.xid:79"), reason
    for other in later:
        assert run.results["nodes"][other.name]["phase"] == "pending"
        if other in members:
            assert takes_jobs(lab, other)
            assert drain_updates(lab, other, rollout_id) == 0
    assert "stopped: 1 failed, more than --max-failures 0" in run.output


def test_a_rollout_killed_mid_batch_finishes_without_touching_finished_nodes_twice(
    lab: Lab, ready: list[LabNode], members: list[LabNode], scheduler_ssh: str, tmp_path: Path
) -> None:
    first, second = ready[0], ready[1]
    state = tmp_path / "state.json"
    process = subprocess.Popen(
        rollout_argv(scheduler_ssh, state, "--batch", "1"),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + ROLLOUT_TIMEOUT_S
    while process.poll() is None and time.monotonic() < deadline:
        if phase_of(state).get(second.name) == "converging":
            break
        time.sleep(0.2)
    assert process.poll() is None, process.communicate()[0][-4000:]
    # The control host goes down: the rollout and its pyinfra, all at once.
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
    killed = json.loads(state.read_text())
    assert killed["nodes"][first.name]["phase"] == "done"
    assert killed["nodes"][second.name]["phase"] == "converging"
    if second in members:
        assert slurm_view(lab, second)[1].startswith(f"gpunode: rollout {killed['id']}")
    again = run_rollout(scheduler_ssh, state, "--batch", "1")
    assert again.returncode == 0, again.output[-4000:]
    assert again.results is not None and again.results["id"] == killed["id"]
    assert f"going on from {state}" in again.output
    assert {name: r["phase"] for name, r in again.results["nodes"].items()} == {
        first.name: "done", second.name: "done"
    }  # fmt: skip
    # The finished node: not drained, converged, checked or resumed again.
    assert not [line for line in again.output.splitlines() if f": {first.name}:" in line]
    if first in members:
        assert drain_updates(lab, first, killed["id"]) == 1
    if second in members:
        assert takes_jobs(lab, second)


def test_a_node_drained_by_hand_is_neither_converged_nor_resumed(
    lab: Lab, ready: list[LabNode], members: list[LabNode], scheduler_ssh: str, tmp_path: Path
) -> None:
    node = members[0]
    others = [other for other in ready if other != node]
    code, output = on_controller(
        lab, f"scontrol update NodeName={node.name} State=DRAIN Reason='bad fan, ticket 42'"
    )
    assert code == 0, output
    # Drift a converge would repair, on every node: persistence mode off on GPU 0.
    for each in ready:
        sudo(lab, each, "nvidia-smi -i 0 -pm 0 >/dev/null")
    state = tmp_path / "state.json"
    run = run_rollout(scheduler_ssh, state, "--batch", "2")
    assert run.returncode == 1, run.output[-4000:]  # complete, one node skipped
    assert run.results is not None
    record: dict[str, Any] = run.results["nodes"][node.name]
    assert record["phase"] == "skipped"
    assert "drained by someone else (bad fan, ticket 42)" in record["note"]
    assert slurm_view(lab, node)[:2] == ("drained", "bad fan, ticket 42")
    assert drain_updates(lab, node, run.results["id"]) == 0
    persistence = "nvidia-smi -i 0 --query-gpu=persistence_mode --format=csv,noheader"
    try:
        assert sudo(lab, node, persistence).strip() == "Disabled"  # not converged
        for other in others:
            assert run.results["nodes"][other.name]["phase"] == "done"
            assert sudo(lab, other, persistence).strip() == "Enabled"  # converged
    finally:
        sudo(lab, node, "nvidia-smi -i 0 -pm 1 >/dev/null")


def test_dry_prints_the_plan_and_changes_nothing(
    lab: Lab, ready: list[LabNode], members: list[LabNode], scheduler_ssh: str, tmp_path: Path
) -> None:
    node = members[0]
    job = submit(lab, node, "sleep 30")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and job_field(lab, job, "JobState") != "RUNNING":
        time.sleep(0.5)
    state = tmp_path / "state.json"
    run = run_rollout(scheduler_ssh, state, "--dry", "--canary", "1")
    assert run.returncode == 0, run.output[-4000:]
    assert not state.exists()
    assert f"batch 1/{len(ready)}: {node.name}" in run.output
    # (mixed or allocated: whether the job's CPU is all the node has Slurm count)
    plan = rf"{node.name}: drain \((mixed|allocated)\), wait for jobs {job}, converge, "
    assert re.search(plan + "health gate, resume", run.output), run.output
    assert slurm_view(lab, node)[0] in ("mixed", "allocated")


def drift_drain(scheduler_ssh: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUNODE, "drift", INVENTORY, "--json", "--drain", "critical",
         "--scheduler-ssh", scheduler_ssh],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def wait_for_view(lab: Lab, node: LabNode, state: str, reason: str) -> tuple[str, str]:
    """Once sinfo shows ``state`` and ``reason`` (a drain reaches sinfo in a while)."""
    deadline = time.monotonic() + 120
    view = slurm_view(lab, node)[:2]
    while time.monotonic() < deadline and view != (state, reason):
        time.sleep(1)
        view = slurm_view(lab, node)[:2]
    return view


def test_drift_drain_drains_a_critical_node_resumes_it_clean_and_never_a_hand_drained_one(
    lab: Lab, ready: list[LabNode], members: list[LabNode], scheduler_ssh: str
) -> None:
    node = members[0]
    clean_journal = "journalctl --rotate --vacuum-files=1 >/dev/null 2>&1"
    sudo(lab, node, f"logger -t kernel '{XID_MESSAGE}'")
    found = drift_drain(scheduler_ssh)
    assert found.returncode == 1, found.stderr  # drift found
    ids = [f["id"] for f in json.loads(found.stdout)["findings"] if f["host"] == node.name]
    (xid,) = [finding for finding in ids if finding.startswith("gpu.xid:79")]
    reason = f"gpunode: drift {xid}"
    assert f"gpunode drift --drain: {node.name}: drained ({reason})" in found.stderr
    assert wait_for_view(lab, node, "drained", reason) == ("drained", reason)
    # A node without critical findings is not drained.
    for other in members[1:]:
        assert slurm_view(lab, other)[0] in ("idle", "mixed", "idle*")
    sudo(lab, node, clean_journal)
    clean = drift_drain(scheduler_ssh)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert f"gpunode drift --drain: {node.name}: resumed (clean again)" in clean.stderr
    assert takes_jobs(lab, node)
    # Drained by a person: with a critical finding or clean, left alone by --drain.
    code, output = on_controller(
        lab, f"scontrol update NodeName={node.name} State=DRAIN Reason='bad fan, ticket 42'"
    )
    assert code == 0, output
    sudo(lab, node, f"logger -t kernel '{XID_MESSAGE}'")
    found = drift_drain(scheduler_ssh)
    assert f"{node.name}: drained by someone else (bad fan, ticket 42): left alone" in found.stderr
    assert wait_for_view(lab, node, "drained", "bad fan, ticket 42") == (
        "drained", "bad fan, ticket 42"
    )  # fmt: skip
    sudo(lab, node, clean_journal)
    clean = drift_drain(scheduler_ssh)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert slurm_view(lab, node)[:2] == ("drained", "bad fan, ticket 42")


# The inventory's leave for gpunode to reset a GPU whose driver asks for it, as the test gives it.
RESET_ON_REQUEST = json.dumps({"actions": {"gpu.recovery_action": "reset_gpu"}})


def drift_remedy(
    scheduler_ssh: str, node: LabNode, history: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUNODE, "drift", INVENTORY, "--json", "--limit", node.name, "--drain", "critical",
         "--remedy", "--remedy-history", str(history), "--scheduler-ssh", scheduler_ssh,
         "--data", f"health={RESET_ON_REQUEST}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_a_gpu_the_driver_asks_to_reset_is_reset_once_its_node_is_drained_and_idle(
    lab: Lab, ready: list[LabNode], members: list[LabNode], scheduler_ssh: str, tmp_path: Path
) -> None:
    """gpunode drift --drain critical --remedy: the driver's "GPU Reset" recovery action drains
    the node; while a job still runs the reset waits; once it has ended the GPU is reset (the
    simulator's nvidia-smi -r, which answers the request) and a later check resumes the node;
    a request that comes back within the window is left to a person."""
    node = members[0]
    history = tmp_path / "remedies.json"
    sudo(lab, node, "gpunode-lab-hw set gpus.2.recovery_action 'GPU Reset'")
    job = submit(lab, node, "sleep 300")
    try:
        # Running, not only queued: a job that has not started holds nothing yet.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and job_field(lab, job, "JobState") != "RUNNING":
            time.sleep(0.5)
        waiting = drift_remedy(scheduler_ssh, node, history)
        assert waiting.returncode == 1, waiting.stderr
        (remedy,) = json.loads(waiting.stdout)["remedies"]
        assert remedy["withheld"].startswith(f"jobs still run on the drained node ({job})")
        assert f"{node.name}: drained (gpunode: drift gpu.recovery_action:2)" in waiting.stderr
        assert not history.exists()
    finally:
        on_controller(lab, f"scancel {job}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and slurm_view(lab, node)[2]:
        time.sleep(1)
    done = drift_remedy(scheduler_ssh, node, history)
    (remedy,) = json.loads(done.stdout)["remedies"]
    assert (remedy["action"], remedy["outcome"], remedy["withheld"]) == ("reset_gpu", "done", "")
    bus = sudo(lab, node, "nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 2")
    assert remedy["gpus"] == [gpu_bus_id(bus.strip())]
    assert remedy["findings"] == ["gpu.recovery_action:2"]
    assert "<gpu_recovery_action>None</gpu_recovery_action>" in sudo(
        lab, node, "nvidia-smi -q -x -i 2"
    )
    assert [entry["host"] for entry in json.loads(history.read_text())["entries"]] == [node.name]
    clean = drift_remedy(scheduler_ssh, node, history)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert json.loads(clean.stdout)["remedies"] == []
    assert f"gpunode drift --drain: {node.name}: resumed (clean again)" in clean.stderr
    assert takes_jobs(lab, node)
    # Back within the window: drained, and left to a person (health.action_limit 1).
    sudo(lab, node, "gpunode-lab-hw set gpus.2.recovery_action 'GPU Reset'")
    try:
        again = drift_remedy(scheduler_ssh, node, history)
        (remedy,) = json.loads(again.stdout)["remedies"]
        assert remedy["withheld"].startswith("1 remedies on this node in the last 24 h")
        assert "GPU Reset" in sudo(lab, node, "nvidia-smi -q -x -i 2")
    finally:
        sudo(lab, node, "gpunode-lab-hw set gpus.2.recovery_action None")
    resumed = drift_remedy(scheduler_ssh, node, history)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert takes_jobs(lab, node)


SETTINGS_DEPLOY = f"""\
import sys

sys.path.insert(0, {str(ROOT)!r})

from gpunode.inventory import desired_state
from roles.gpu_settings import gpu_settings

gpu_settings(desired=desired_state())
"""


def unit_times(lab: Lab, node: LabNode, unit: str) -> dict[str, int]:
    shown = sudo(
        lab, node, f"systemctl show {unit} -p ActiveEnterTimestampMonotonic "
        "-p InactiveExitTimestampMonotonic",
    )  # fmt: skip
    return {key: int(value) for key, value in (line.split("=", 1) for line in shown.splitlines())}


def test_gpu_settings_come_back_at_boot_before_slurmd_starts(
    lab: Lab, ready: list[LabNode], members: list[LabNode], tmp_path: Path
) -> None:
    node = members[0]
    deploy = tmp_path / "gpu_settings.py"
    deploy.write_text(SETTINGS_DEPLOY)
    data = {"gpu_settings": {"persistence_mode": True, "power_limit_w": 500}}
    inventory = write_inventory(tmp_path / "inventory.py", lab, [node], {node.name: data})
    power = "nvidia-smi --query-gpu=power.limit,persistence_mode --format=csv,noheader"
    try:
        run = run_pyinfra(str(deploy), inventory=inventory)
        assert run.returncode == 0, run.output[-4000:]
        assert set(sudo(lab, node, power).splitlines()) == {"500.00 W, Enabled"}
        assert sudo(lab, node, f"systemctl is-enabled {BOOT_UNIT}").strip() == "enabled"
        # The lab's simulated reboot: the driver's defaults again, as on real hardware.
        sudo(lab, node, "gpunode-lab-hw reboot")
        assert set(sudo(lab, node, power).splitlines()) == {"700.00 W, Disabled"}
        # The boot's order, by systemd: slurmd starting pulls nothing in, but in one
        # transaction the settings unit must be done before slurmd begins to start.
        sudo(lab, node, "systemctl stop slurmd")
        sudo(lab, node, f"systemctl restart {BOOT_UNIT} slurmd.service")
        assert set(sudo(lab, node, power).splitlines()) == {"500.00 W, Enabled"}
        settings = unit_times(lab, node, BOOT_UNIT)
        slurmd = unit_times(lab, node, "slurmd.service")
        assert settings["ActiveEnterTimestampMonotonic"] <= slurmd["InactiveExitTimestampMonotonic"]
        journal = sudo(lab, node, f"journalctl -u {BOOT_UNIT} -n 20 --no-pager -o cat")
        assert "gpunode-gpu-settings: nvidia-smi -pl 500" in journal
        # The health gate sees a setting the boot did not bring back.
        sudo(lab, node, "nvidia-smi -pl 700")
        drift = subprocess.run(
            [GPUNODE, "drift", inventory, "--json"], cwd=ROOT, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        found = {f["id"]: f["severity"] for f in json.loads(drift.stdout)["findings"]}
        assert found.get("gpu.power_limit:0") == "critical", drift.stdout
    finally:
        # The lab's own settings again: its converge (power limit left as found) after the
        # driver's defaults.
        sudo(lab, node, "gpunode-lab-hw reboot")
        again = run_pyinfra(DEPLOY, "--limit", node.name)
        assert again.returncode == 0, again.output[-4000:]
    assert takes_jobs(lab, node)


# The rollout's change for the MIG node: the GPU settings role, then the driver role's reboot
# step (its name is what the rollout counts as a reboot), which the simulated driver needs.
MIG_DEPLOY = f"""\
import sys

sys.path.insert(0, {str(ROOT)!r})

from gpunode.inventory import desired_state
from roles.gpu_settings import gpu_settings
from roles.nvidia_driver import driver_reboot

desired = desired_state()
gpu_settings(desired=desired)
driver_reboot(
    name="Loaded kernel module is the installed one (reboot: if-needed)",
    policy="if-needed",
    reboot_command=desired.reboot.command,
)
"""
HALVES = ["3g.40gb", "3g.40gb"]
# The simulated reboot, then the boot's start of the GPU settings unit and slurmd.
REBOOT_AND_BOOT = ["gpunode-lab-hw", "reboot", "--boot"]
OTHER_DRIVER = "550.127.08"  # loaded by the simulated GPUs: the installed one needs a reboot
INJECTED_DIR = "/usr/local/lib/gpunode-test-inject"
INJECTED_DROP_IN = f"/etc/systemd/system/{BOOT_UNIT}.d/test-inject.conf"
# A drop-in no deploy manages: the boot unit's PATH finds an nvidia-smi that fails GPU 0's
# "mig -i 0 -cgi ..." as the driver does when it cannot place them.
BREAK_LAYOUT_AT_BOOT = (
    f"mkdir -p {INJECTED_DIR} /etc/systemd/system/{BOOT_UNIT}.d && "
    f"printf '%s\\n' '#!/bin/sh' "
    '\'[ "$1 $2 $3 $4" = "mig -i 0 -cgi" ] && '
    '{{ echo "Failed to create GPU instances: Insufficient Resources"; exit 255; }}\' '
    "'exec {real} \"$@\"' "
    f"> {INJECTED_DIR}/nvidia-smi && chmod 755 {INJECTED_DIR}/nvidia-smi && "
    f"printf '[Service]\\nEnvironment=PATH={INJECTED_DIR}:/usr/sbin:/usr/bin:/sbin:/bin\\n' "
    f"> {INJECTED_DROP_IN} && systemctl daemon-reload"
)


def gpu_instances(lab: Lab, node: LabNode) -> dict[int, list[str]]:
    """GPU index -> the profiles of its GPU instances (``nvidia-smi mig -lgi``)."""
    listing = ssh(lab, node, "nvidia-smi mig -lgi").stdout
    found: dict[int, list[str]] = {}
    for gpu, profile in re.findall(r"^\|\s+(\d+)\s+MIG (\S+)\s+\d+\s+\d+\s+\d+:\d+", listing, re.M):
        found.setdefault(int(gpu), []).append(profile)
    return found


@pytest.fixture
def mig_node(lab: Lab, ready: list[LabNode], members: list[LabNode]) -> Iterator[LabNode]:
    """A Slurm member whose simulated GPUs have MIG (the A100 node, else the H100 one), in MIG
    mode with no instance yet; its simulated hardware and boot settings put back after."""
    by_profile = {node.profile: node for node in members}
    node = by_profile.get("a100") or by_profile["hgx-h100"]
    saved_state = sudo(lab, node, f"cat {DEFAULT_STATE_PATH}")
    saved_settings = sudo(lab, node, f"cat {BOOT_SETTINGS} 2>/dev/null || true")
    sudo(lab, node, "nvidia-smi -mig 1 >/dev/null && gpunode-lab-hw reboot")
    try:
        yield node
    finally:
        sudo(lab, node, f"rm -rf {INJECTED_DIR} {INJECTED_DROP_IN} && systemctl daemon-reload")
        for path, text in ((DEFAULT_STATE_PATH, saved_state), (BOOT_SETTINGS, saved_settings)):
            if not text and path == BOOT_SETTINGS:
                sudo(lab, node, f"rm -f {BOOT_SETTINGS}")
                continue
            encoded = base64.b64encode(text.encode()).decode()
            sudo(
                lab, node,
                f"echo {encoded} | base64 -d > {path}.restore && chmod 644 {path}.restore && "
                f"mv {path}.restore {path}",
            )  # fmt: skip


def test_a_mig_node_rebooted_by_a_rollout_gets_its_layout_back_before_slurmd_or_stays_drained(
    lab: Lab, mig_node: LabNode, scheduler_ssh: str, tmp_path: Path
) -> None:
    node = mig_node
    slurm = lab.slurm_settings()
    assert slurm is not None
    data = {
        "slurm": dataclasses.asdict(slurm),
        "gpu_settings": {"persistence_mode": None, "mig": True, "mig_layout": HALVES},
        "reboot": {"command": REBOOT_AND_BOOT},
    }
    inventory = write_inventory(tmp_path / "mig_inventory.py", lab, [node], {node.name: data})
    deploy = tmp_path / "mig_deploy.py"
    deploy.write_text(MIG_DEPLOY)
    gpus = len(sudo(lab, node, "nvidia-smi -L").splitlines())
    laid_out = {index: HALVES for index in range(gpus)}
    # Before the rollout: the layout laid out by a converge (the one extra converge).
    before = run_pyinfra(str(deploy), inventory=inventory)
    assert before.returncode == 0, before.output[-4000:]
    assert gpu_instances(lab, node) == laid_out
    assert f"MIG_LAYOUT={','.join(HALVES)}" in sudo(lab, node, f"cat {BOOT_SETTINGS}")

    sudo(lab, node, f"gpunode-lab-hw set driver_version '\"{OTHER_DRIVER}\"'")
    state = tmp_path / "passes.json"
    run = run_rollout(scheduler_ssh, state, inventory=inventory, deploy=str(deploy))
    assert run.returncode == 0, run.output[-4000:]
    assert run.results is not None
    record = run.results["nodes"][node.name]
    assert (record["phase"], record["rebooted"]) == ("done", True), record
    assert sudo(lab, node, "gpunode-lab-hw show driver_version").strip() != f'"{OTHER_DRIVER}"'
    # Laid out again by the boot unit (the rollout's converge ran before the reboot), and
    # done before slurmd began to start.
    assert gpu_instances(lab, node) == laid_out
    journal = sudo(lab, node, f"journalctl -u {BOOT_UNIT} -n 400 --no-pager -o cat")
    assert f"gpunode-gpu-settings: nvidia-smi mig -i 0 -cgi {','.join(HALVES)} -C" in journal
    settings, slurmd = unit_times(lab, node, BOOT_UNIT), unit_times(lab, node, "slurmd.service")
    assert settings["ActiveEnterTimestampMonotonic"] <= slurmd["InactiveExitTimestampMonotonic"]
    assert takes_jobs(lab, node)

    # The boot's layout step broken on GPU 0: the unit's nvidia-smi refuses to create its
    # instances there (what a GPU that refuses them would answer), nothing else changes.
    sudo(
        lab,
        node,
        BREAK_LAYOUT_AT_BOOT.format(real=sudo(lab, node, "command -v nvidia-smi").strip()),
    )
    sudo(lab, node, f"gpunode-lab-hw set driver_version '\"{OTHER_DRIVER}\"'")
    state = tmp_path / "fails.json"
    run = run_rollout(scheduler_ssh, state, inventory=inventory, deploy=str(deploy))
    assert run.returncode == 3, run.output[-4000:]  # stopped by the budget (--max-failures 0)
    assert run.results is not None
    record = run.results["nodes"][node.name]
    assert (record["phase"], record["rebooted"]) == ("failed", True), record
    assert "health gate: gpu.mig_layout:0" in record["note"], record
    assert gpu_instances(lab, node) == {i: HALVES for i in range(1, gpus)}
    slurm_state, reason, _ = slurm_view(lab, node)
    assert slurm_state in ("drained", "draining")
    assert reason.startswith(
        f"gpunode: rollout {run.results['id']} failed health gate gpu.mig_layout:0"
    ), reason
    journal = sudo(lab, node, f"journalctl -u {BOOT_UNIT} -n 400 --no-pager -o cat")
    assert "gpunode-gpu-settings: failed: nvidia-smi mig -i 0 -cgi" in journal


ROW_REMAP = "Page Retirement/Row Remap"


@pytest.fixture
def dcgm_node(lab: Lab, ready: list[LabNode], members: list[LabNode]) -> Iterator[LabNode]:
    """A Slurm member with DCGM (the stand-in DCGM 4 the module's converge installed) and its
    host engine running; its simulated GPUs without a pending row remap again after."""
    node = members[0]
    sudo(lab, node, "dcgmi --version && systemctl start nvidia-dcgm")
    try:
        yield node
    finally:
        sudo(lab, node, "gpunode-lab-hw set gpus.2.remapped_rows.pending No")


def test_the_dcgm_diagnostic_gates_nodes_that_declare_dcgm_and_is_skipped_elsewhere(
    lab: Lab, dcgm_node: LabNode, members: list[LabNode], scheduler_ssh: str, tmp_path: Path
) -> None:
    # On a mixed lab the Slurm cluster has one member (its bookworm node): the rollout's note
    # for a node without DCGM ("skipped: dcgm not declared") is then the unit tests' alone.
    others = [node for node in members if node != dcgm_node]
    slurm = lab.slurm_settings()
    assert slurm is not None
    common = {"slurm": dataclasses.asdict(slurm), "gpu_settings": {"persistence_mode": None}}
    data = {node.name: common for node in others}
    data[dcgm_node.name] = {**common, "dcgm": {"enabled": True, "cuda_major": 13}}
    inventory = write_inventory(tmp_path / "dcgm_inventory.py", lab, members, data)
    deploy = tmp_path / "gpu_settings.py"
    deploy.write_text(SETTINGS_DEPLOY)
    argv = ("--batch", "2", "--dcgm-diag", "quick")
    run = run_rollout(scheduler_ssh, tmp_path / "passes.json", *argv, inventory=inventory,
                      deploy=str(deploy))  # fmt: skip
    assert run.returncode == 0, run.output[-4000:]
    assert run.results is not None
    notes = {name: record["note"] for name, record in run.results["nodes"].items()}
    assert notes[dcgm_node.name] == "resumed (DCGM diagnostic level 1 passed)", notes
    for other in others:
        assert notes[other.name] == "resumed (DCGM diagnostic skipped: dcgm not declared)"
    summary = run.output[run.output.index("batch  node") :]
    assert ("DCGM diagnostic skipped: dcgm not declared" in summary) == bool(others), summary

    # A fault in the simulated GPUs that DCGM's deployment checks see: a pending row remap.
    sudo(lab, dcgm_node, "gpunode-lab-hw set gpus.2.remapped_rows.pending Yes")
    run = run_rollout(scheduler_ssh, tmp_path / "fails.json", *argv, "--limit", dcgm_node.name,
                      inventory=inventory, deploy=str(deploy))  # fmt: skip
    assert run.returncode == 3, run.output[-4000:]
    assert run.results is not None
    record = run.results["nodes"][dcgm_node.name]
    assert record["phase"] == "failed", record
    assert f"health gate: dcgm.diag:{ROW_REMAP}" in record["note"], record
    slurm_state, reason, _ = slurm_view(lab, dcgm_node)
    assert slurm_state in ("drained", "draining")
    assert reason.startswith(
        f"gpunode: rollout {run.results['id']} failed health gate dcgm.diag:{ROW_REMAP}"
    ), reason


# --- operator states are someone else's (issue 29) ------------------------------------------


def drift_drain_of(scheduler_ssh: str, node: LabNode) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUNODE, "drift", INVENTORY, "--json", "--drain", "critical", "--limit", node.name,
         "--scheduler-ssh", scheduler_ssh],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.parametrize("held", ["DOWN", "FAIL"])
def test_a_node_an_operator_set_down_or_fail_is_skipped_with_its_reason_and_never_resumed(
    lab: Lab,
    ready: list[LabNode],
    members: list[LabNode],
    scheduler_ssh: str,
    tmp_path: Path,
    held: str,
) -> None:
    node = members[0]
    why = "PSU fault, ticket 7"
    code, output = on_controller(
        lab, f"scontrol update NodeName={node.name} State={held} Reason='{why}'"
    )
    assert code == 0, output
    word = held.lower()
    assert wait_for_view(lab, node, word, why) == (word, why)
    state = tmp_path / "state.json"
    run = run_rollout(scheduler_ssh, state, "--limit", node.name)
    assert run.returncode == 1, run.output[-4000:]  # complete, its one node skipped
    assert run.results is not None
    record: dict[str, Any] = run.results["nodes"][node.name]
    assert record["phase"] == "skipped"
    assert f"{word} by someone else ({why}): untouched" in record["note"]
    assert slurm_view(lab, node)[:2] == (word, why)
    assert drain_updates(lab, node, run.results["id"]) == 0
    # The drift drain leaves it alone too, with a critical finding and once clean.
    sudo(lab, node, f"logger -t kernel '{XID_MESSAGE}'")
    found = drift_drain_of(scheduler_ssh, node)
    assert f"{node.name}: {word} by someone else ({why}): left alone" in found.stderr, found.stderr[
        -3000:
    ]
    assert slurm_view(lab, node)[:2] == (word, why)
    sudo(lab, node, "journalctl --rotate --vacuum-files=1 >/dev/null 2>&1")
    drift_drain_of(scheduler_ssh, node)
    assert slurm_view(lab, node)[:2] == (word, why)


def test_a_node_an_operator_set_down_stays_down_when_its_slurmd_registers_again(
    lab: Lab, ready: list[LabNode], members: list[LabNode]
) -> None:
    node = members[0]
    why = "PSU fault, ticket 8"
    code, output = on_controller(
        lab, f"scontrol update NodeName={node.name} State=DOWN Reason='{why}'"
    )
    assert code == 0, output
    assert wait_for_view(lab, node, "down", why) == ("down", why)
    started = test_slurm.node_view(lab, node).get("SlurmdStartTime")
    sudo(lab, node, "systemctl restart slurmd")
    # Until slurmctld has the new slurmd's registration (its start time changes with it).
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if test_slurm.node_view(lab, node).get("SlurmdStartTime") not in (None, started):
            break
        time.sleep(1)
    assert test_slurm.node_view(lab, node).get("SlurmdStartTime") != started
    assert slurm_view(lab, node)[:2] == ("down", why)
    _, conf = on_controller(lab, "cat /etc/slurm/slurm.conf")
    assert "ReturnToService=1" in conf.splitlines()


def test_a_node_resumed_while_the_rollout_waits_is_left_out_and_a_second_rollout_refuses(
    lab: Lab, ready: list[LabNode], members: list[LabNode], scheduler_ssh: str, tmp_path: Path
) -> None:
    node = members[0]
    job = submit(lab, node, "sleep 600")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and job_field(lab, job, "JobState") != "RUNNING":
        time.sleep(0.5)
    assert job_field(lab, job, "JobState") == "RUNNING"
    state = tmp_path / "state.json"
    process = subprocess.Popen(
        rollout_argv(scheduler_ssh, state, "--limit", node.name),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + ROLLOUT_TIMEOUT_S
        while time.monotonic() < deadline and phase_of(state).get(node.name) != "waiting":
            assert process.poll() is None, process.communicate()[0][-4000:]
            time.sleep(0.5)
        assert phase_of(state).get(node.name) == "waiting"
        # A second rollout of the inventory (a state file of its own) refuses, naming the first.
        second = run_rollout(scheduler_ssh, tmp_path / "second.json", "--limit", node.name)
        assert second.returncode == 2, second.output[-4000:]
        assert "another rollout holds " in second.output
        assert f"pid {process.pid} on " in second.output
        # The operator puts the node back in service while the rollout waits; its job ends.
        code, output = on_controller(lab, f"scontrol update NodeName={node.name} State=RESUME")
        assert code == 0, output
        on_controller(lab, f"scancel {job}")
        output, _ = process.communicate(timeout=ROLLOUT_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 1, output[-4000:]
    data = json.loads(state.read_text())
    record = data["nodes"][node.name]
    assert record["phase"] == "left-out", output[-4000:]
    assert "resumed by someone else" in record["note"] and "not converged" in record["note"]
    assert drain_updates(lab, node, data["id"]) == 1  # drained once, never again
    assert takes_jobs(lab, node)


# The driver role's reboot step alone, as deploys/gpu_node.py calls it (deferred under a
# rollout). With RESUME, the deferred run's preparation puts the node back in service on the
# controller, as an operator would while the driver packages install.
REBOOT_DEPLOY = """\
import shlex
import subprocess
import sys

sys.path.insert(0, {root!r})

from pyinfra import host

from gpunode.inventory import desired_state
from roles.nvidia_driver import REBOOT_DEFERRED_NAME, driver_reboot, reboot_deferred

desired = desired_state()
deferred = reboot_deferred()
if deferred and {resume!r}:
    # As gpunode's own --scheduler-ssh runs Slurm's commands there.
    subprocess.run(
        ["ssh", "-o", "BatchMode=yes", *shlex.split({scheduler_ssh!r}),
         "sudo -n scontrol update NodeName=" + shlex.quote(host.name) + " State=RESUME"],
        check=True, capture_output=True, timeout=120,
    )
driver_reboot(
    name=REBOOT_DEFERRED_NAME if deferred else
    "Loaded kernel module is the installed one (reboot: if-needed)",
    policy="if-needed",
    reboot_command=desired.reboot.command,
    deferred=deferred,
)
"""


def test_the_driver_reboot_waits_for_the_drain_read_again_after_the_converge(
    lab: Lab, ready: list[LabNode], members: list[LabNode], scheduler_ssh: str, tmp_path: Path
) -> None:
    node = members[0]
    slurm = lab.slurm_settings()
    assert slurm is not None
    inventory = write_inventory(
        tmp_path / "inventory.py", lab, [node], {node.name: {"slurm": dataclasses.asdict(slurm)}}
    )
    installed = sudo(lab, node, "gpunode-lab-hw show driver_version").strip()
    sudo(lab, node, f"gpunode-lab-hw set driver_version '\"{OTHER_DRIVER}\"'")
    try:
        # Resumed by the operator during the converge: converged, not rebooted, left out.
        deploy = tmp_path / "resumed.py"
        deploy.write_text(
            REBOOT_DEPLOY.format(root=str(ROOT), resume=True, scheduler_ssh=scheduler_ssh)
        )
        state = tmp_path / "resumed.json"
        run = run_rollout(scheduler_ssh, state, inventory=inventory, deploy=str(deploy))
        assert run.returncode == 1, run.output[-4000:]
        assert run.results is not None
        record = run.results["nodes"][node.name]
        assert (record["phase"], record["rebooted"]) == ("left-out", False), record
        assert (
            "resumed by someone else) before its reboot: converged, not rebooted"
            in (record["note"])
        ), record
        assert sudo(lab, node, "gpunode-lab-hw show driver_version").strip() == (
            f'"{OTHER_DRIVER}"'
        )
        assert drain_updates(lab, node, run.results["id"]) == 1  # drained once, never again
        assert takes_jobs(lab, node)

        # Still drained after the converge: the rollout's second run reboots it.
        deploy = tmp_path / "drained.py"
        deploy.write_text(
            REBOOT_DEPLOY.format(root=str(ROOT), resume=False, scheduler_ssh=scheduler_ssh)
        )
        state = tmp_path / "drained.json"
        run = run_rollout(scheduler_ssh, state, inventory=inventory, deploy=str(deploy))
        assert run.returncode == 0, run.output[-4000:]
        assert run.results is not None
        record = run.results["nodes"][node.name]
        assert (record["phase"], record["rebooted"]) == ("done", True), record
        assert sudo(lab, node, "gpunode-lab-hw show driver_version").strip() == installed
        assert takes_jobs(lab, node)
    finally:
        sudo(lab, node, f"gpunode-lab-hw set driver_version {shlex.quote(installed)}")

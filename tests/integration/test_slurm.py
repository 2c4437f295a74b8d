"""deploys/gpu_node.py's slurm role against real Slurm in the lab: Debian's slurmctld and munge
on the lab's controller (``Lab.slurm_up``), slurmd on the GPU nodes converged by gpunode.

The nodes register as dynamic nodes with the GRES of their simulated GPUs and go IDLE; a job
given a GPU runs on a node and sees CUDA_VISIBLE_DEVICES; a GPU that falls off the bus makes
the drift check report the GRES mismatch; the MUNGE key is 0400 munge:munge on the nodes,
the controller's own, and never in pyinfra's output (nor with --diff, where a file's content
would be shown); a second converge changes nothing.
"""

from __future__ import annotations

import json
import shlex
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpunode.expected.slurm import MUNGE_KEY, gres_gpus, gres_summary
from gpunode.scheduler import NodeStatus, SlurmScheduler, gpunode_reason, shell_runner
from lab import Lab, LabNode

from .conftest import PyinfraRun, drift_report, run_pyinfra, ssh

pytestmark = pytest.mark.lab

DEPLOY = "deploys/gpu_node.py"
MUNGE_KEY_OP = f"slurm | MUNGE key {MUNGE_KEY} (the cluster's, 0400 munge:munge)"
# How long the nodes may take to register after the converge (a loaded lab host); a wait
# for an event, never an assertion on time.
REGISTRATION_TIMEOUT_S = 300


def sudo(lab: Lab, node: LabNode, command: str) -> str:
    result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, f"{node.name}: {command}: {result.stderr}"
    return result.stdout


def on_controller(lab: Lab, command: str) -> tuple[int, str]:
    controller = lab.slurm_controller()
    assert controller is not None
    container = lab.client.containers.get(controller.container)
    result = container.exec_run(["sh", "-c", command])
    return result.exit_code, result.output.decode(errors="replace")


def expected_gres(lab: Lab, node: LabNode) -> str:
    """Slurm's Gres= of the GPUs the node's simulator has present (name, minor number)."""
    gpus = json.loads(sudo(lab, node, "gpunode-lab-hw show gpus"))
    gres, problems = gres_gpus([gpu for gpu in gpus if gpu["present"]])
    assert problems == [] and gres
    return gres_summary(gres)


def node_view(lab: Lab, node: LabNode) -> dict[str, str]:
    """``scontrol show node -o`` of ``node`` on the controller, as key=value words."""
    code, output = on_controller(lab, f"scontrol show node -o {shlex.quote(node.name)}")
    if code != 0:
        return {}
    return dict(word.split("=", 1) for word in output.split() if "=" in word)


def fresh_slurm(lab: Lab, lab_nodes: list[LabNode]) -> None:
    """Each module starts its own cluster: no saved slurmctld state (an earlier module's jobs
    and node records restored into it held a node MIXED, or refused a GPU step with "Invalid
    generic resource (gres) specification"), and no slurmd left running from that cluster,
    so that the module's converge starts slurmd, which registers with the new controller."""
    if lab.slurm_controller() is not None:
        return  # a controller kept up by hand (gpunode lab up --slurm): its cluster as it is
    for node in lab_nodes:
        sudo(lab, node, "systemctl stop slurmd 2>/dev/null || true")
    for saved in lab.state_dir.glob("slurmctld-*"):
        shutil.rmtree(saved, ignore_errors=True)


@pytest.fixture(scope="module")
def controller(lab: Lab, lab_nodes: list[LabNode]) -> Iterator[LabNode]:
    fresh_slurm(lab, lab_nodes)
    controller = lab.slurm_up()  # of lab-1's release
    yield controller
    # slurmctld's state outlives the controller (Lab.slurm_up): a test that failed with a
    # node drained must not leave it drained for the next run.
    on_controller(lab, "scancel --user root; scontrol update NodeName=ALL State=RESUME")
    # Until the jobs are gone, or the saved state would hold a cancelled job that still
    # holds its node (MIXED, not IDLE) when the next controller starts.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and on_controller(lab, "squeue -h -o %i")[1].strip():
        time.sleep(1)
    # The lab inventory enables slurm only while a controller runs: later tests of this
    # lab converge without it again.
    lab.slurm_down()


@pytest.fixture(scope="module")
def members(lab: Lab, controller: LabNode, lab_nodes: list[LabNode]) -> list[LabNode]:
    """The lab nodes of the controller's release (Lab.slurm_members: one Slurm release per
    cluster); the others are no Slurm nodes."""
    found = [node for node in lab_nodes if node.release == controller.release]
    assert [node.name for node in found] == [node.name for node in lab.slurm_members()]
    assert found and found[0] == lab_nodes[0]
    return found


@pytest.fixture(scope="module")
def munge_key(lab: Lab, controller: LabNode) -> str:
    return lab.munge_key_path.read_text().strip()


@pytest.fixture(scope="module")
def converged(lab: Lab, controller: LabNode, lab_nodes: list[LabNode]) -> PyinfraRun:
    run = run_pyinfra(DEPLOY)
    assert run.returncode == 0, run.output[-6000:]
    return run


@pytest.fixture(scope="module")
def registered(
    lab: Lab, converged: PyinfraRun, members: list[LabNode]
) -> dict[str, dict[str, str]]:
    """Each node's view on the controller once every node is IDLE with its GRES."""
    wanted = {node.name: expected_gres(lab, node) for node in members}
    views: dict[str, dict[str, str]] = {}
    deadline = time.monotonic() + REGISTRATION_TIMEOUT_S
    while time.monotonic() < deadline:
        views = {node.name: node_view(lab, node) for node in members}
        if all(
            view.get("State", "").startswith("IDLE") and view.get("Gres") == wanted[name]
            for name, view in views.items()
        ):
            return views
        time.sleep(2)
    _, log = on_controller(lab, "tail -n 30 /var/log/slurm/slurmctld.log")
    raise AssertionError(f"nodes not IDLE with {wanted}: {views}\n{log}")


def test_the_nodes_are_idle_with_the_gres_of_their_gpus(
    lab: Lab, registered: dict[str, dict[str, str]], members: list[LabNode]
) -> None:
    code, sinfo = on_controller(lab, "sinfo -h -N -o '%N %t %G %P'")
    assert code == 0, sinfo
    rows = {line.split()[0]: line.split()[1:] for line in sinfo.splitlines() if line.strip()}
    assert sorted(rows) == sorted(node.name for node in members), sinfo
    for node in members:
        gres = expected_gres(lab, node)
        assert rows[node.name] == ["idle", gres, "gpu*"], sinfo
        view = registered[node.name]
        assert view["NodeAddr"] == node.address
        kind = gres.split(":")[1]
        assert kind in view["AvailableFeatures"].split(",")


def test_a_job_given_gpus_runs_on_the_node_and_sees_them(
    lab: Lab, registered: dict[str, dict[str, str]], members: list[LabNode]
) -> None:
    node = members[0]
    code, output = on_controller(
        lab,
        f"timeout 120 srun -w {node.name} --gres=gpu:2 "
        "sh -c 'echo host=$(hostname) CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES'",
    )
    assert code == 0, output
    assert f"host={node.name} CUDA_VISIBLE_DEVICES=0,1" in output.splitlines()
    # sbatch too: the job is accounted on the node and finishes.
    code, output = on_controller(
        lab,
        f"sbatch --parsable -w {node.name} --gres=gpu:1 -o /tmp/job-%j.out "
        "--wrap 'echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES'",
    )
    assert code == 0, output
    job = output.strip().split(";")[0]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        _, state = on_controller(lab, f"scontrol show job -o {job}")
        if "JobState=COMPLETED" in state:
            break
        time.sleep(1)
    assert "JobState=COMPLETED" in state and f"NodeList={node.name}" in state, state
    # The job's output is written on the node that ran it.
    assert sudo(lab, node, f"cat /tmp/job-{job}.out").strip() == "CUDA_VISIBLE_DEVICES=0"


def controller_scheduler(lab: Lab) -> SlurmScheduler:
    """gpunode's scheduler interface, its commands run on the lab's controller."""

    def execute(line: str) -> tuple[int, str, str]:
        code, output = on_controller(lab, line)
        return code, output, output

    return SlurmScheduler(shell_runner(execute))


def wait_until_drained(scheduler: SlurmScheduler, node: LabNode, drained: bool) -> NodeStatus:
    """Once the node's drain is what is wanted (an update reaches sinfo in a while).

    Not a state word: sinfo may still say "draining" a while after the last job ended
    (seen on 24.11), so a job's end is told by running_jobs, a drain by ``drained``.
    """
    deadline = time.monotonic() + 120
    status = None
    while time.monotonic() < deadline:
        status = scheduler.status([node.name]).nodes.get(node.name)
        if status is not None and status.drained == drained:
            return status
        time.sleep(1)
    raise AssertionError(f"{node.name} not {'drained' if drained else 'resumed'}: {status}")


def test_the_scheduler_interface_drains_sees_jobs_and_resumes_on_real_slurm(
    lab: Lab, registered: dict[str, dict[str, str]], members: list[LabNode]
) -> None:
    node = members[0]
    slurm = controller_scheduler(lab)
    code, output = on_controller(
        lab, f"sbatch --parsable -w {node.name} --gres=gpu:1 -o /dev/null --wrap 'sleep 600'"
    )
    assert code == 0, output
    job = output.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and slurm.running_jobs(node.name) != [job]:
            time.sleep(1)
        assert slurm.running_jobs(node.name) == [job]
        slurm.drain(node.name, gpunode_reason("integration test"))
        # A drain lets the running job go on: draining until it ends, then drained.
        status = wait_until_drained(slurm, node, True)
        assert (status.reason, status.drained_by_gpunode) == ("gpunode: integration test", True)
        assert slurm.running_jobs(node.name) == [job]
    finally:
        on_controller(lab, f"scancel {job}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and slurm.running_jobs(node.name):
        time.sleep(1)
    assert slurm.running_jobs(node.name) == []
    assert wait_until_drained(slurm, node, True).drained_by_gpunode
    slurm.resume(node.name)
    resumed = wait_until_drained(slurm, node, False)
    # (Slurm may keep the reason of a resumed node a while: it means nothing then.)
    assert resumed.state in ("idle", "mixed") and not resumed.drained_by_gpunode, resumed
    # A drain by someone else is no drain of gpunode's.
    assert (
        on_controller(
            lab, f"scontrol update NodeName={node.name} State=DRAIN Reason='bad fan, ticket 42'"
        )[0]
        == 0
    )
    try:
        status = wait_until_drained(slurm, node, True)
        assert not status.drained_by_gpunode
        assert status.reason == "bad fan, ticket 42"
    finally:
        slurm.resume(node.name)
    wait_until_drained(slurm, node, False)


def test_the_munge_key_is_the_controllers_0400_munge_and_never_shown(
    lab: Lab, converged: PyinfraRun, munge_key: str, members: list[LabNode]
) -> None:
    _, controller_sum = on_controller(lab, f"sha256sum {MUNGE_KEY}")
    for node in members:
        assert sudo(lab, node, f"stat -c '%a %U %G' {MUNGE_KEY}").strip() == "400 munge munge"
        assert sudo(lab, node, f"sha256sum {MUNGE_KEY}").split()[0] == controller_sum.split()[0]
        assert (
            sudo(lab, node, "ls /run/gpunode-munge 2>&1 || true")
            .strip()
            .endswith("No such file or directory")
        )
    assert munge_key not in converged.output
    assert munge_key[:32] not in converged.output


def test_a_gpu_gone_from_a_node_is_a_gres_finding(
    lab: Lab, registered: dict[str, dict[str, str]], members: list[LabNode]
) -> None:
    node = members[0]
    assert "slurm.gres" not in {f["id"] for f in drift_report(node)["findings"]}
    sudo(lab, node, "gpunode-lab-hw set gpus.3.present false")
    try:
        findings = {f["id"]: f for f in drift_report(node)["findings"]}
    finally:
        sudo(lab, node, "gpunode-lab-hw set gpus.3.present true")
    finding: dict[str, Any] = findings["slurm.gres"]
    assert finding["severity"] == "critical"
    assert "no GPU of the node at /dev/nvidia3" in finding["found"]


def test_a_replaced_key_is_predicted_by_dry_without_showing_it_and_then_restored(
    lab: Lab, registered: dict[str, dict[str, str]], munge_key: str, members: list[LabNode]
) -> None:
    node = members[-1]
    sudo(lab, node, f"head -c 64 /dev/urandom > {MUNGE_KEY}")
    # --diff shows a changed file's content: never this one's.
    dry = run_pyinfra("--dry", "--diff", DEPLOY)
    assert dry.returncode == 0, dry.output[-6000:]
    assert dry.results is not None
    predicted = {(op["name"], h) for op in dry.results["plan"] for h in op["hosts_with_change"]}
    assert (MUNGE_KEY_OP, node.name) in predicted
    assert munge_key not in dry.output and munge_key[:32] not in dry.output
    repair = run_pyinfra(DEPLOY)
    assert repair.returncode == 0, repair.output[-6000:]
    assert munge_key not in repair.output
    assert node.name in repair.changed_operations()[MUNGE_KEY_OP]
    # Munge restarted with the cluster's key: a job on the node authenticates again.
    code, output = on_controller(lab, f"timeout 120 srun -w {node.name} hostname")
    assert code == 0 and output.strip() == node.name, output


def test_a_second_converge_changes_nothing(
    lab: Lab, registered: dict[str, dict[str, str]], munge_key: str
) -> None:
    again = run_pyinfra(DEPLOY)
    assert again.returncode == 0, again.output[-6000:]
    assert again.changed_operations() == {}
    assert munge_key not in again.output

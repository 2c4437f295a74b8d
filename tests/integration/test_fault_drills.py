"""Fault drills on lab nodes: what operators meet at fleet scale, and what gpunode does.

- A node another run holds: this run waits, then refuses that node with the holder named,
  changes nothing on it, and finishes the others. A holder the control host knows is dead
  (its process is gone) is broken instead of waited out.
- A node that stops answering mid-run (its network cut while a command runs on it): that
  host fails within a minute, named in the output; the other finishes; exit code 1.
- A package mirror the node cannot reach: a clear error naming the mirror and the reason,
  before the node's sources, lists or packages are touched.
- A node whose own state stops one of its operations mid-run (a docker configuration that is
  not JSON): that node fails at that operation, named; the other runs to the end.

The drills that need a fresh node (a deploy killed at a random point, a reboot in the middle
of a driver change) run on a lab of their own in test_fault_drills_fresh.py.
"""

from __future__ import annotations

import runpy
import shlex
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from facts.run_lock import NodeRunLock
from gpunode.reach import DEAD_AFTER_S, KEEPALIVE_S
from lab import Lab, LabNode

from .conftest import ROOT, PyinfraRun, run_pyinfra, ssh

pytestmark = pytest.mark.lab

DEPLOY = "deploys/gpu_node.py"
APT_STATE = "sha1sum /etc/apt/sources.list.d/*; ls -l --time-style=+%s /var/lib/apt/lists"


def ssh_command(lab: Lab, node: LabNode) -> list[str]:
    return [
        "ssh", "-i", str(lab.key_path), "-o", f"UserKnownHostsFile={lab.known_hosts_path}",
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
        f"debian@{node.address}",
    ]  # fmt: skip


def sudo(lab: Lab, node: LabNode, command: str) -> str:
    result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def hold_lock(lab: Lab, node: LabNode, owner: str, seconds: int) -> subprocess.Popen:
    """Take the node's run lock from an SSH session of our own, as another run would, and
    keep the session (so the lock) for ``seconds``."""
    command = NodeRunLock().command(owner=owner)
    holder = subprocess.Popen(
        [*ssh_command(lab, node), f"sudo sh -c {shlex.quote(command)}; sleep {seconds}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held=yes"
    return holder


def run_while_held(
    lab: Lab, node: LabNode, holder: str, seconds: int, before: str | None = None
) -> tuple[PyinfraRun, float]:
    """The deploy run (and its wall time) while another "run" holds ``node``'s lock for
    ``seconds``; ``before`` runs on the node once the lock is held."""
    session = hold_lock(lab, node, holder, seconds)
    try:
        if before:
            sudo(lab, node, before)
        started = time.monotonic()
        run = run_pyinfra(DEPLOY)
        return run, time.monotonic() - started
    finally:
        session.kill()


def error_lines(run: PyinfraRun, node: str) -> str:
    return "\n".join(line for line in run.output.splitlines() if f"[{node}]" in line)


@pytest.fixture(scope="module")
def converged(lab_nodes: list[LabNode]) -> list[LabNode]:
    run = run_pyinfra(DEPLOY)
    assert run.returncode == 0, run.output
    return lab_nodes[:2]


# --- two runs at once ----------------------------------------------------------------------


def test_a_node_held_by_another_run_is_refused_untouched_and_the_others_converge(
    lab: Lab, converged: list[LabNode]
) -> None:
    lab_1, _ = converged
    other_run = "ops@other-control pid 4242 since 2026-11-30T12:00:00Z (deploys/gpu_node.py)"
    # rm: drift this run would repair, were it let in.
    run, waited = run_while_held(lab, lab_1, other_run, 120, before="rm /etc/nccl.conf")
    assert run.returncode == 1, run.output
    assert f"lab-1: another gpunode run holds this node: {other_run} (waited 10 s)" in run.output
    assert "Nothing was changed on it by this run" in run.output
    assert "gpunode: 1 of 2 host(s) failed: lab-1 (at Run lock held)" in run.output
    assert waited >= 10
    assert run.changed_operations() == {}  # lab-2 converged already; lab-1 was not touched
    assert sudo(lab, lab_1, "test -e /etc/nccl.conf && echo present || echo absent").strip() == (
        "absent"
    )
    # The holder gone, the next run gets in and repairs the drift.
    repair = run_pyinfra(DEPLOY)
    assert repair.returncode == 0, repair.output
    assert repair.changed_operations() == {"NCCL | NCCL settings in /etc/nccl.conf": ["lab-1"]}


def test_a_run_waits_for_one_that_is_about_to_finish(lab: Lab, converged: list[LabNode]) -> None:
    lab_1, _ = converged
    holder = "ops@other-control pid 4242 since 2026-11-30T12:00:00Z"
    run, elapsed = run_while_held(lab, lab_1, holder, seconds=4)
    assert run.returncode == 0, run.output
    assert elapsed >= 3  # it waited for the lock rather than refusing or interleaving
    assert run.changed_operations() == {}


def test_the_lock_of_a_run_this_control_host_knows_is_dead_is_broken(
    lab: Lab, converged: list[LabNode]
) -> None:
    lab_1, _ = converged
    gone = subprocess.Popen(["true"])
    gone.wait()
    # The connection of a killed run that the node has not noticed yet (network cut, say).
    dead_run = f"root@{socket.gethostname()} pid {gone.pid} since 2026-11-30T12:00:00Z (x.py)"
    run, _ = run_while_held(lab, lab_1, dead_run, seconds=120)
    # The dead run's holder keeps the lock for 120 s, far past the 10 s a run waits: a run
    # that got in broke the lock instead of waiting it out and refusing.
    assert run.returncode == 0, run.output
    assert "another gpunode run holds this node" not in run.output, run.output
    assert run.changed_operations() == {}


# --- a node that stops answering -------------------------------------------------------------


def set_link(lab: Lab, node: LabNode, state: str) -> None:
    """eth0 of the node up or down, from the lab host (the node cannot bring it back); up
    also restores the default route, which the kernel dropped with the link."""
    pid = lab.client.containers.get(node.container).attrs["State"]["Pid"]
    netns = ["nsenter", f"--net=/proc/{pid}/ns/net", "ip"]
    subprocess.run([*netns, "link", "set", "eth0", state], check=True)
    if state == "up":
        subprocess.run([*netns, "route", "replace", "default", "via", lab.gateway], check=True)


def test_a_node_that_stops_answering_mid_run_fails_alone_and_is_named(
    lab: Lab, converged: list[LabNode]
) -> None:
    _, lab_2 = converged
    # The node's network goes the moment the run first reads its GPUs: mid-command, no reset
    # sent. Once only: the wrapper removes itself, since the node's side of the cut-off run
    # goes on reading GPUs (through /usr/bin/nvidia-smi) after the control side gave up.
    sudo(
        lab, lab_2,
        "printf '#!/bin/sh\\nrm -f /usr/local/bin/nvidia-smi\\nip link set eth0 down\\n"
        "exec /usr/bin/nvidia-smi \"$@\"\\n' > /usr/local/bin/nvidia-smi && "
        "chmod 755 /usr/local/bin/nvidia-smi",
    )  # fmt: skip
    try:
        started = time.monotonic()
        run = run_pyinfra(DEPLOY)
        elapsed = time.monotonic() - started
    finally:
        set_link(lab, lab_2, "up")
        sudo(lab, lab_2, "rm -f /usr/local/bin/nvidia-smi")
    assert run.returncode == 1, run.output
    # Without dead-peer detection TCP retransmits for some 15 minutes; with it the node is
    # given up within DEAD_AFTER_S of silence (a minute of margin for a loaded machine).
    assert elapsed < DEAD_AFTER_S + KEEPALIVE_S + 60, run.output
    named = error_lines(run, "lab-2")
    assert "Error" in named or "error" in named, run.output
    assert not error_lines(run, "lab-1").count("Error"), run.output
    assert "gpunode: 1 of 2 host(s) failed: lab-2 (" in run.output, run.output
    assert "Re-run them with --limit lab-2" in run.output
    # The next run gets in (the stale lock of the cut connection is broken) and is clean.
    rerun = run_pyinfra(DEPLOY)
    assert rerun.returncode == 0, rerun.output
    assert rerun.changed_operations() == {}


# --- an unreachable package mirror ---------------------------------------------------------


def lab_inventory(tmp_path: Path, lab: Lab, host_data: dict[str, dict[str, Any]]) -> str:
    """inventories/lab.py with the lab's group data, plus ``host_data`` per node."""
    (tmp_path / "group_data").symlink_to(ROOT / "inventories" / "group_data")
    groups: dict[str, list[tuple[str, dict[str, Any]]]] = {
        "h100_nodes": [], "a100_nodes": [], "pcie_nodes": [],
    }  # fmt: skip
    group_of = {"hgx-h100": "h100_nodes", "a100": "a100_nodes", "pcie-a10g": "pcie_nodes"}
    for node in lab.nodes():
        data = {"ssh_hostname": node.address, **host_data.get(node.name, {})}
        groups[group_of[node.profile]].append((node.name, data))
    inventory = tmp_path / "lab.py"  # pyinfra names the group after the file: "lab"
    inventory.write_text("".join(f"{name} = {hosts!r}\n" for name, hosts in groups.items()))
    return str(inventory)


def test_an_unreachable_mirror_is_named_and_nothing_is_changed(
    lab: Lab, converged: list[LabNode], tmp_path: Path
) -> None:
    lab_1, _ = converged
    lab_apt = runpy.run_path(str(ROOT / "inventories" / "group_data" / "lab.py"))["apt"]
    mirror = f"http://{lab.gateway}:9/debian"  # nothing listens there: connection refused
    inventory = lab_inventory(
        tmp_path, lab, {"lab-1": {"apt": {**lab_apt, "debian_mirror": mirror}}}
    )
    before = sudo(lab, lab_1, APT_STATE)
    run = run_pyinfra(DEPLOY, "--limit", "lab-1", inventory=inventory)
    assert run.returncode == 1, run.output
    assert (
        f"lab-1: package mirror {mirror}/dists/bookworm/InRelease is unreachable from the node: "
        f"Could not connect to {lab.gateway}:9" in run.output
    ), run.output
    assert "Nothing was changed: package sources, lists and packages are as they were." in (
        run.output
    )
    after = sudo(lab, lab_1, APT_STATE)
    assert after == before


def test_mirror_check_only_when_apt_is_about_to_fetch(converged: list[LabNode]) -> None:
    run = run_pyinfra(DEPLOY)
    assert run.returncode == 0, run.output
    assert run.results is not None
    names = [op["name"] for op in run.results["results"]["operations"]]
    assert "Base system | Package mirrors answer" not in names  # lists fresh, sources as data


# --- a node whose own state stops an operation mid-run ----------------------------------------


def test_a_node_whose_operation_refuses_mid_run_fails_alone_and_the_others_converge(
    lab: Lab, converged: list[LabNode]
) -> None:
    lab_1, lab_2 = converged
    daemon_json = sudo(lab, lab_1, "cat /etc/docker/daemon.json")
    # Kept with its time stamp: a newer one would (rightly) have docker restarted.
    sudo(lab, lab_1, "cp -p /etc/docker/daemon.json /root/daemon.json.drill")
    # lab-1: a docker configuration gpunode cannot read, found only when its operation runs;
    # both nodes: drift that operations after it repair.
    sudo(lab, lab_1, "printf '{ not json' > /etc/docker/daemon.json; rm /etc/nccl.conf")
    sudo(lab, lab_2, "rm /etc/nccl.conf")
    try:
        run = run_pyinfra(DEPLOY)
        assert run.returncode == 1, run.output
        assert "/etc/docker/daemon.json: " in error_lines(run, "lab-1"), run.output
        assert "fix it by hand" in error_lines(run, "lab-1")
        assert (
            "gpunode: 1 of 2 host(s) failed: lab-1 (at NVIDIA Container Toolkit | docker: nvidia "
            "runtime in /etc/docker/daemon.json). Re-run them with --limit lab-1"
        ) in run.output
        # lab-2 went on to the end; lab-1 stopped at the refusing operation.
        assert run.changed_operations() == {"NCCL | NCCL settings in /etc/nccl.conf": ["lab-2"]}
        assert sudo(lab, lab_1, "cat /etc/docker/daemon.json") == "{ not json"
        assert sudo(lab, lab_1, "test -e /etc/nccl.conf && echo present || echo absent") == (
            "absent\n"
        )
    finally:
        sudo(lab, lab_1, "mv /root/daemon.json.drill /etc/docker/daemon.json")
    assert sudo(lab, lab_1, "cat /etc/docker/daemon.json") == daemon_json
    repair = run_pyinfra(DEPLOY)
    assert repair.returncode == 0, repair.output
    assert repair.changed_operations() == {"NCCL | NCCL settings in /etc/nccl.conf": ["lab-1"]}


def test_drills_leave_no_holder_behind(lab: Lab, converged: list[LabNode]) -> None:
    time.sleep(1)  # a holder notices its closed connection within half a second
    for node in converged:
        holders = sudo(lab, node, "pgrep -f '[g]punode-run-lock' || true").split()
        assert holders == [], node.name

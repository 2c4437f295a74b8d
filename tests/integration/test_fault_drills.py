"""Fault drills on lab nodes: what operators meet at fleet scale, and what gpunode does.

- A node another run holds: this run waits, then refuses that node with the holder named,
  changes nothing on it, and finishes the others. A holder the control host knows is dead
  (its process is gone) is broken instead of waited out.
- A node that stops answering mid-run (its network cut while a command runs on it): that
  host fails while the node is still silent (dead-peer detection gives it up; it does not
  wait for the node to answer again), named in the output; the other finishes; exit code 1.
- A package mirror the node cannot reach: a clear error naming the mirror and the reason,
  before the node's sources, lists or packages are touched.
- A node whose own state stops one of its operations mid-run (a docker configuration that is
  not JSON): that node fails at that operation, named; the other runs to the end.

The drills that need a fresh node (a deploy killed at a random point, a reboot in the middle
of a driver change) run on a lab of their own in test_fault_drills_fresh.py.
"""

from __future__ import annotations

import json
import re
import runpy
import shlex
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from facts.run_lock import OWNER_PATH, WAIT_S, NodeRunLock
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


# What the holder session does once it holds the lock, as root on the node: it watches for
# the run's lock request (a flock waiting on the lock file; anchored, so that this watcher's
# own command line, which holds the same words, is not taken for it) and reports on its
# stdout, one line per event, what it saw while it still held the lock.
_WAITER = f"^flock -w {WAIT_S} 9$"
_SEE_WAITER = f"""
for i in $(seq 3000); do
  waiter=$(pgrep -f {shlex.quote(_WAITER)} | head -1)
  [ -n "$waiter" ] && break
  sleep 0.1
done
echo "waiter=${{waiter:-none}}"
"""
WATCHER_NAME = "gpunode-drill-watch"
WATCH = {
    # Let go the moment the run waits for the lock: the holder session ends with the script.
    "release-when-waited": _SEE_WAITER + f'echo "owner-at-release=$(cat {OWNER_PATH})"\n',
    # Keep it, and say once the run has given up waiting while it was still held.
    "keep": _SEE_WAITER
    + f"""
while [ -n "$waiter" ] && [ -d /proc/$waiter ]; do sleep 0.1; done
echo "waiter-gave-up-while-held-by=$(cat {OWNER_PATH})"
sleep 600
""",
    # Keep it, and say who holds it once someone else's name is on it.
    "until-broken": _SEE_WAITER
    + f"""
while owner=$(cat {OWNER_PATH} 2>/dev/null); [ -z "$owner" ] || [ "$owner" = "$1" ]; do
  sleep 0.1
done
echo "owner-while-held=$owner"
sleep 600
""",
}


def hold_lock(lab: Lab, node: LabNode, owner: str, watch: str) -> subprocess.Popen:
    """Take the node's run lock from an SSH session of our own, as another run would, and
    keep the session (so the lock) while the ``WATCH[watch]`` script runs in it."""
    command = NodeRunLock().command(owner=owner)
    script = f"sh -c {shlex.quote(WATCH[watch])} {WATCHER_NAME} {shlex.quote(owner)}"
    holder = subprocess.Popen(
        [*ssh_command(lab, node),
         f"sudo sh -c {shlex.quote(command)}; sudo {script}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held=yes"
    return holder


def run_while_held(
    lab: Lab, node: LabNode, holder: str, watch: str, before: str | None = None
) -> tuple[PyinfraRun, dict[str, str]]:
    """The deploy run while another "run" holds ``node``'s lock, and what that holder saw
    (event -> value, from its report lines); ``before`` runs on the node once the lock is
    held."""
    session = hold_lock(lab, node, holder, watch)
    try:
        if before:
            sudo(lab, node, before)
        run = run_pyinfra(DEPLOY)
    finally:
        session.kill()
        # The node may not have noticed the closed session yet: its watcher goes too.
        sudo(lab, node, f"pkill -f '[{WATCHER_NAME[0]}]{WATCHER_NAME[1:]}' || true")
    report, _ = session.communicate(timeout=60)
    seen = dict(line.split("=", 1) for line in report.splitlines() if "=" in line)
    return run, seen


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
    run, seen = run_while_held(lab, lab_1, other_run, "keep", before="rm /etc/nccl.conf")
    assert run.returncode == 1, run.output
    assert f"lab-1: another gpunode run holds this node: {other_run} (waited 10 s)" in run.output
    assert "Nothing was changed on it by this run" in run.output
    assert "gpunode: 1 of 2 hosts failed: lab-1 (failed at operation Run lock held)" in run.output
    # The run asked for the lock and waited on it, and gave up while the other still held it.
    assert seen["waiter"] != "none", seen
    assert seen["waiter-gave-up-while-held-by"] == other_run, seen
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
    run, seen = run_while_held(lab, lab_1, holder, "release-when-waited")
    assert run.returncode == 0, run.output
    # The holder let go only once the run was waiting for the lock, and the lock was still the
    # holder's then: the run waited for it rather than refusing or interleaving, and got it.
    assert seen["waiter"] != "none", seen
    assert seen["owner-at-release"] == holder, seen
    assert "another gpunode run holds this node" not in run.output, run.output
    assert run.changed_operations() == {}


def test_the_lock_of_a_run_this_control_host_knows_is_dead_is_broken(
    lab: Lab, converged: list[LabNode]
) -> None:
    lab_1, _ = converged
    gone = subprocess.Popen(["true"])
    gone.wait()
    # The connection of a killed run that the node has not noticed yet (network cut, say).
    dead_run = f"root@{socket.gethostname()} pid {gone.pid} since 2026-11-30T12:00:00Z (x.py)"
    run, seen = run_while_held(lab, lab_1, dead_run, "until-broken")
    # The dead run's session never lets go: a run that got in broke the lock instead of
    # waiting it out and refusing. It waited once, then broke the lock, and took it itself
    # while the dead run's session was still there.
    assert run.returncode == 0, run.output
    assert "another gpunode run holds this node" not in run.output, run.output
    assert seen["waiter"] != "none", seen
    this_control_host = rf"\S+@{re.escape(socket.gethostname())} pid \d+ since \S+ \(.*{DEPLOY}\)"
    assert re.fullmatch(this_control_host, seen.get("owner-while-held", "")), seen
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


def link_is_up(lab: Lab, node: LabNode) -> bool:
    pid = lab.client.containers.get(node.container).attrs["State"]["Pid"]
    shown = subprocess.run(
        ["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "-j", "link", "show", "eth0"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return "UP" in json.loads(shown.stdout)[0]["flags"]


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
        run = run_pyinfra(DEPLOY)
        # Nothing brings the link back but this test, after the run: a run that ended with it
        # down gave the node up while it was silent. Without dead-peer detection a read on
        # the cut connection waits for TCP (no data in flight: for ever), and the run with it.
        cut_when_the_run_ended = not link_is_up(lab, lab_2)
    finally:
        set_link(lab, lab_2, "up")
        wrapper_left = sudo(lab, lab_2, "test -e /usr/local/bin/nvidia-smi && echo yes || true")
        sudo(lab, lab_2, "rm -f /usr/local/bin/nvidia-smi")
    assert wrapper_left.strip() == "", "the run never read lab-2's GPUs: the link was not cut"
    assert cut_when_the_run_ended, run.output
    assert run.returncode == 1, run.output
    named = error_lines(run, "lab-2")
    assert "Error" in named or "error" in named, run.output
    assert not error_lines(run, "lab-1").count("Error"), run.output
    assert "gpunode: 1 of 2 hosts failed: lab-2 (" in run.output, run.output
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
        f"lab-1: package mirror {mirror}/dists/{lab_1.release}/InRelease is unreachable from "
        "the node: "
        f"Could not connect to {lab.gateway}:9" in run.output
    ), run.output
    assert "Nothing was changed: package sources, lists and packages are as they were." in (
        run.output
    )
    after = sudo(lab, lab_1, APT_STATE)
    assert after == before


def test_a_mirror_keyring_missing_on_the_control_machine_is_named_and_nothing_changes(
    lab: Lab, converged: list[LabNode], tmp_path: Path
) -> None:
    """apt.debian_keyring (a site mirror's signing key) that is not there: refused before any
    operation runs on the node, naming the setting and the path."""
    lab_1, _ = converged
    lab_apt = runpy.run_path(str(ROOT / "inventories" / "group_data" / "lab.py"))["apt"]
    missing = tmp_path / "site-mirror-keyring.gpg"
    inventory = lab_inventory(
        tmp_path, lab, {"lab-1": {"apt": {**lab_apt, "debian_keyring": str(missing)}}}
    )
    state = f"{APT_STATE}; ls -l --time-style=+%s /usr/share/keyrings /etc/apt/apt.conf.d"
    before = sudo(lab, lab_1, state)
    run = run_pyinfra(DEPLOY, "--limit", "lab-1", inventory=inventory)
    assert run.returncode == 1, run.output
    assert f"lab-1: apt.debian_keyring = {str(missing)!r}: no such file" in run.output, run.output
    assert sudo(lab, lab_1, state) == before


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
            "gpunode: 1 of 2 hosts failed: lab-1 (failed at operation NVIDIA Container Toolkit | "
            "docker: nvidia runtime in /etc/docker/daemon.json). Re-run them with --limit lab-1"
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
    # A holder notices its closed connection within half a second: wait for that (bounded,
    # so a holder that stays fails here), then none may be left.
    holder = "pgrep -f '[g]punode-run-lock'"
    left = f"for i in $(seq 100); do {holder} >/dev/null || exit 0; sleep 0.1; done; {holder}"
    for node in converged:
        holders = sudo(lab, node, left + "; true").split()
        assert holders == [], node.name

"""The run lock's control-side judgement: whose lock may be broken, and what a refusal says."""

from __future__ import annotations

import os
import socket
import subprocess

from facts.run_lock import NodeRunLock
from roles.run_lock import RUN_OWNER, dead_here, lock_refused


def test_this_runs_owner_names_user_control_host_pid_and_deploys() -> None:
    assert f"@{socket.gethostname()} pid {os.getpid()} since " in RUN_OWNER


def test_only_a_dead_run_of_this_control_host_may_lose_its_lock() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    here = socket.gethostname()
    assert dead_here(f"root@{here} pid {gone.pid} since 2026-11-30T12:00:00Z (deploys/x.py)")
    # Alive (this very test runs under pytest, whose command line names .py files).
    assert not dead_here(f"root@{here} pid {os.getpid()} since 2026-11-30T12:00:00Z (x.py)")
    # Another control host's run: only that host can tell whether it is gone.
    assert not dead_here(f"root@elsewhere pid {gone.pid} since 2026-11-30T12:00:00Z (x.py)")
    assert not dead_here("not recorded")


def test_a_refusal_names_the_node_the_holder_and_that_nothing_changed() -> None:
    message = lock_refused("ops@ctl pid 7 since T (deploys/gpu_node.py)", "node-1")
    assert message.startswith(
        "node-1: another gpunode run holds this node: ops@ctl pid 7 since T (deploys/gpu_node.py)"
    )
    assert "Nothing was changed on it by this run" in message


def test_lock_fact_reads_its_answer() -> None:
    fact = NodeRunLock()
    assert fact.process(["held=no", "holder=ops@ctl pid 7 since T (x.py)"]) == {
        "held": False,
        "holder": "ops@ctl pid 7 since T (x.py)",
        "error": None,
    }
    assert "stale=''" in fact.command(owner="me")
    assert NodeRunLock.cacheable is False

"""The run lock's control-side judgement: whose lock may be broken, and what a refusal says."""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import time
from pathlib import Path

from facts.run_lock import NodeRunLock
from gpunode.run_lock import RUN_OWNER, dead_here, lock_refused, process_start


def test_this_runs_owner_names_user_control_host_pid_and_deploys() -> None:
    assert f"@{socket.gethostname()} pid {os.getpid()} since " in RUN_OWNER


def test_only_a_dead_run_of_this_control_host_may_lose_its_lock() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    here = socket.gethostname()
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert dead_here(f"root@{here} pid {gone.pid} since {now} (deploys/x.py)")
    # Alive: this process started before "now".
    assert not dead_here(f"root@{here} pid {os.getpid()} since {now} (x.py)")
    # The pid now belongs to a process that started after that run: the pid was reused.
    assert dead_here(f"root@{here} pid {os.getpid()} since 2000-01-01T00:00:00Z (x.py)")
    # Another control host's run: only that host can tell whether it is gone.
    assert not dead_here(f"root@elsewhere pid {gone.pid} since {now} (x.py)")
    assert not dead_here("not recorded")


def test_process_start_orders_processes_by_when_they_started() -> None:
    started = process_start(os.getpid())
    booted = next(
        int(line.split()[1])
        for line in Path("/proc/stat").read_text().splitlines()
        if line.startswith("btime ")
    )
    # A process this one starts now started after it, and both after the machine booted.
    later = subprocess.Popen(["cat"], stdin=subprocess.PIPE)
    try:
        started_later = process_start(later.pid)
    finally:
        later.communicate()
    assert started is not None and started_later is not None
    assert booted <= started <= started_later


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
        "open_by": [],
    }
    assert "stale=''" in fact.command(owner="me")
    assert NodeRunLock.cacheable is False


def test_the_lock_is_tied_to_openssh_10s_per_connection_process(tmp_path: Path) -> None:
    # OpenSSH 10 (Debian 13) names the per-connection process sshd-session; its listener,
    # named sshd, outlives every connection: a lock tied to it would never be released.
    import shlex
    import shutil

    from facts.run_lock import _ACQUIRE

    start = _ACQUIRE.index("pid=$PPID")
    end = _ACQUIRE.index('[ "$pid" -gt 1 ] || pid=')
    walk = _ACQUIRE[start:end]
    session = tmp_path / "sshd-session"
    shutil.copy("/bin/dash" if Path("/bin/dash").exists() else "/bin/sh", session)
    # sshd-session -> sh (the walk): the walk must stop at sshd-session, not go on above it.
    script = f"sh -c {shlex.quote(walk + 'echo $pid')}; echo parent=$$"
    result = subprocess.run([str(session), "-c", script], capture_output=True, text=True)
    found, parent = result.stdout.split()
    assert parent == f"parent={found}", result


def test_a_lock_not_taken_names_the_processes_that_keep_it(tmp_path: Path) -> None:
    """The acquire script itself, run here against a lock file another process holds: the
    answer names that process (pid and name), not the script's own shell."""

    from facts.run_lock import _ACQUIRE, LOCK_DIR, WAIT_S

    lock_dir = tmp_path / "run"
    lock_dir.mkdir()
    script = _ACQUIRE.replace(LOCK_DIR, str(lock_dir)).replace(f"-w {WAIT_S}", "-w 0")
    keeper = subprocess.Popen(
        ["flock", str(lock_dir / "run.lock"), "sleep", "30"], stdout=subprocess.DEVNULL
    )
    try:
        for _ in range(100):  # until flock has the lock and sleep runs with the file open
            if subprocess.run(["flock", "-n", str(lock_dir / "run.lock"), "true"]).returncode:
                break
            time.sleep(0.05)
        done = subprocess.run(
            ["sh", "-c", f"owner=me stale= ; {script}"], capture_output=True, text=True
        )
    finally:
        keeper.kill()
        keeper.wait()
    answer = NodeRunLock().process(done.stdout.splitlines())
    assert answer["held"] is False, done.stdout
    names = {entry.split()[1] for entry in answer["open_by"]}
    assert "flock" in names or "sleep" in names, answer
    assert str(keeper.pid) in {entry.split()[0] for entry in answer["open_by"]}, answer


def test_what_keeps_a_lock_is_read_as_pid_and_name_only() -> None:
    answer = NodeRunLock().process(
        ["held=no", "holder=x", "open_by=42 sleep", "open_by=43 \x1b[2Jevil", "open_by=x y"]
    )
    assert answer["open_by"] == ["42 sleep"]
    assert lock_refused("x", "node-1", answer["open_by"]).endswith(
        "The lock is held on the node by: 42 sleep."
    )

"""One gpunode run at a time per node (see facts/run_lock.py for how the lock lives)."""

from __future__ import annotations

import datetime
import getpass
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any

from pyinfra import host
from pyinfra.api import operation
from pyinfra.context import ctx_state

from facts.run_lock import WAIT_S, NodeRunLock
from gpunode import summary
from gpunode.reach import detect_dead_peer
from gpunode.refusal import install_per_node_failures, refusal


def run_owner() -> str:
    """Who this run is, for the message a second run shows: user, control host, pid, start,
    and the deploy files (never the rest of the command line, which may carry data)."""
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    deploys = " ".join(arg for arg in sys.argv[1:] if arg.endswith(".py"))
    user, control = getpass.getuser(), socket.gethostname()
    return f"{user}@{control} pid {os.getpid()} since {started} ({deploys})"


RUN_OWNER = run_owner()
_OWNER = re.compile(r"^\S+@(?P<control>\S+) pid (?P<pid>\d+) since (?P<since>\S+)")
_held: dict[str, dict[str, Any]] = {}


def dead_here(holder: str) -> bool:
    """Whether ``holder`` is a run of this control host whose process is gone: no process
    has its pid, or the one that has it started after that run did (the pid was reused)."""
    match = _OWNER.match(holder)
    if not match or match["control"] != socket.gethostname():
        return False
    try:
        since = datetime.datetime.strptime(match["since"], "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return False
    started = process_start(int(match["pid"]))
    if started is None:
        return True
    # RUN_OWNER is written after the process starts, to the second: allow that second.
    return started > since.replace(tzinfo=datetime.UTC).timestamp() + 1


def process_start(pid: int) -> float | None:
    """When process ``pid`` of this machine started (epoch seconds), None if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, ValueError):
        return None
    # Fields after the command name, which may hold blanks: state is field 3, starttime 22.
    ticks = int(stat.rsplit(")", 1)[1].split()[19])
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def lock_refused(holder: str, node: str, open_by: list[str] | None = None) -> str:
    """Why a node is refused: the run holding it, and (where the node said) the processes
    that keep its lock file open: after a run ended, what still holds its lock."""
    where = f" The lock is held on the node by: {', '.join(open_by)}." if open_by else ""
    return (
        f"{node}: another gpunode run holds this node: {holder} (waited {WAIT_S} s). "
        "Nothing was changed on it by this run; run again once that one has finished "
        f"(its lock ends with its SSH connection).{where}"
    )


def node_run_lock() -> None:
    """Take this node's run lock before anything else is read or changed on it, and hold it
    until the run ends. A node another live run holds fails at its first operation, with
    that run named; nothing is changed on it. Also makes a node that stops answering fail
    its host within a minute instead of hanging the run, and names every failed node in one
    line at the end of the run. From here on, a node whose operation raises fails alone."""
    if host.name not in _held:
        summary.install(ctx_state.get())
        install_per_node_failures()
        detect_dead_peer(host)
        lock = host.get_fact(NodeRunLock, owner=RUN_OWNER)
        if not lock["held"] and dead_here(lock["holder"]):
            lock = host.get_fact(NodeRunLock, owner=RUN_OWNER, stale=lock["holder"])
        _held[host.name] = lock
    run_lock_held(name="Run lock held", lock=_held[host.name])


@operation()
def run_lock_held(lock: dict[str, Any]):
    """
    The run lock read when the deploy was loaded is this run's; else the host is refused.

    + lock: the NodeRunLock fact's value read at prepare time (held, holder, error)
    """
    if lock.get("error"):
        yield refusal(f"{host.name}: no run lock: {lock['error']}")
    elif not lock["held"]:
        yield refusal(lock_refused(lock["holder"], host.name, lock.get("open_by")))
    else:
        host.noop("this run holds the node's run lock")

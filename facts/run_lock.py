"""The node's run lock: one gpunode run at a time per node.

Reading this fact takes the lock, for as long as the SSH connection that read it stays open:
a small holder process keeps an flock on /run/gpunode/run.lock and watches that connection's
sshd process. pyinfra keeps one connection per host for the whole run, so the lock ends with
the run, however it ends: finished, failed, killed, or the control host gone (then when sshd
notices). A reboot clears /run, and with it the lock.

It is a fact because pyinfra reads facts before it changes anything: a second run reads it
while the first holds the lock, and that host fails before anything is prepared on it.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from pyinfra.api import FactBase

LOCK_DIR = "/run/gpunode"
LOCK_PATH = f"{LOCK_DIR}/run.lock"
OWNER_PATH = f"{LOCK_DIR}/run.owner"
HOLDER_NAME = "gpunode-run-lock"
# How long a run waits for another to end before giving up: long enough for a run that just
# finished to let go (its holder notices the closed connection within half a second).
WAIT_S = 10
_OPEN_BY = re.compile(r"open_by=[0-9]{1,10} [A-Za-z0-9._:+@-]{0,15}")

_ACQUIRE = rf"""
mkdir -p {LOCK_DIR}
# The process whose life is this run's: the sshd of this connection (OpenSSH 10, Debian 13:
# sshd-session; the listener above it is named sshd and outlives every connection), or, run
# locally, the first ancestor that is not a shell or sudo.
pid=$PPID
while [ "$pid" -gt 1 ]; do
  case "$(cat /proc/$pid/comm 2>/dev/null)" in
    sshd|sshd-session) break ;;
    sh|dash|bash|sudo) ;;
    *) [ -z "$fallback" ] && fallback=$pid ;;
  esac
  pid=$(awk '/^PPid:/ {{print $2}}' /proc/$pid/status)
done
[ "$pid" -gt 1 ] || pid=${{fallback:-0}}
if [ "$pid" -le 1 ]; then echo "error=no process to tie the node lock to"; exit 0; fi
exec 9>>{LOCK_PATH}
if [ -n "$stale" ] && [ "$(cat {OWNER_PATH} 2>/dev/null)" = "$stale" ]; then
  # The control host says that run is gone: its holder goes, and with it the lock.
  # Anchored on the holder's own command line: this script's contains the same words.
  pkill -f "^sh -c while kill -0 .* {HOLDER_NAME} [0-9]+ " || true
fi
if ! flock -w {WAIT_S} 9; then
  echo "held=no"
  echo "holder=$(cat {OWNER_PATH} 2>/dev/null || echo 'not recorded')"
  # Which processes have the lock file open: the holder of a run still going, or whatever
  # else keeps the lock alive after its run ended (a process that inherited it).
  for fd in /proc/[0-9]*/fd/*; do
    [ "$(readlink "$fd" 2>/dev/null)" = {LOCK_PATH} ] || continue
    p=${{fd#/proc/}}; p=${{p%%/*}}
    [ "$p" = "$$" ] || echo "open_by=$p $(cat /proc/$p/comm 2>/dev/null)"
  done
  exit 0
fi
printf '%s\n' "$owner" > {OWNER_PATH}
setsid sh -c 'while kill -0 "$1" 2>/dev/null; do sleep 0.5; done; rm -f "$2"' \
  {HOLDER_NAME} "$pid" {OWNER_PATH} </dev/null >/dev/null 2>&1 &
echo "held=yes"
echo "holder=$owner"
"""


class NodeRunLock(FactBase[dict[str, Any]]):
    """
    Takes the node's run lock for this run (see the module), waiting up to ``WAIT_S``
    seconds for another run to end. ``stale`` names a holder the control host knows is dead;
    its lock is broken first.

    .. code:: python

        {"held": False, "holder": "root@control pid 4242 since 2026-11-30T12:00:00Z (...)"}
    """

    # Reading it changes the node: never cached, prefetched or planned.
    cacheable = False

    def command(self, owner: str, stale: str = "") -> str:
        return f"owner={shlex.quote(owner)}\nstale={shlex.quote(stale)}\n" + _ACQUIRE

    def process(self, output: list[str]) -> dict[str, Any]:  # type: ignore[override]
        values = dict(line.split("=", 1) for line in output if "=" in line)
        # "pid name" of each process with the lock file open, when the lock was not taken;
        # node output, so only what a pid and a process name can be is kept.
        open_by = [line.removeprefix("open_by=") for line in output if _OPEN_BY.fullmatch(line)]
        return {
            "held": values.get("held") == "yes",
            "holder": values.get("holder", ""),
            "error": values.get("error"),
            "open_by": open_by,
        }

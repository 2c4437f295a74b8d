"""Rolling changes: a deploy applied batch by batch, each node drained in the scheduler first,
checked by the drift check after, and given back to the scheduler only when it is healthy.

    gpunode rollout inventories/prod.py deploys/gpu_node.py --batch 4 --canary 1 --max-failures 1

Per batch (the canary batch first): every node is drained with a reason naming the rollout
(``gpunode: rollout <id> ...``); the rollout waits for its jobs to end (past ``--job-timeout``
the node is left out of this rollout and resumed); the deploy converges the batch (pyinfra,
``--limit`` to those nodes) with the driver's reboot deferred (``GPUNODE_DRIVER_REBOOT=defer``
in its environment: the driver role only marks a node whose loaded kernel module differs from
the installed one); a node so marked has its drain read again and, still drained by this
rollout, is rebooted by a second run of the deploy without the deferral, whose changes are
that reboot and what waits for it (Fabric Manager and IMEX started on the new driver), with the
inventory's ``nvidia_driver.reboot`` and ``reboot`` settings, as in any run;
the rollout waits for the nodes to answer again and runs the health gate, the drift check of
those nodes: no critical finding. A node that passes is resumed; one that fails stays
drained, the failed checks in its reason. The rollout stops when more nodes failed than
``--max-failures``.

A node someone else took out of service is neither drained, converged nor resumed, and its
reason is never rewritten: DOWN, FAIL or FAILING (whatever the reason: "PSU fault"), or
drained with a reason without this rollout's id (a person, another tool, gpunode's own drift
drain). It is skipped, and the summary says so with their reason. Right before the converge,
and again right before a node's driver reboot (the packages may take minutes to install),
each node's drain is read again: a node someone resumed while the rollout waited, or that a
restarted rollout finds no longer drained by it, is left out of this rollout, unconverged or
converged but not rebooted (its new driver loads at its next reboot), and the summary says
why; so is one someone else took over meanwhile. A node no reboot waits for costs no second
run. A node the inventory does not make a scheduler node (``slurm.enabled``
false) has no jobs to wait for: it is converged and checked without a drain.

Two rollouts of one inventory never run at once: each holds a lock (``flock``) on its state
file and on its inventory, with a record of its holder (pid, host, user, start) that a second
rollout names when it refuses to start; a lock whose holder ended without letting go (killed)
is free to ``flock`` and is taken over, its record named as stale.

The state is a JSON file on the control host, written atomically (temporary file, fsync,
rename) before every step, so a rollout interrupted (Ctrl-C, SIGTERM, a killed control host)
and started again goes on where it stopped: a node that finished is never drained again, and
a step cut short is done again (each is idempotent: a drain, a converge, a check, a resume).
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import hashlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from gpunode.sanitize import clean_text
from gpunode.scheduler import (
    GPUNODE_REASON_PREFIX,
    HELD_STATES,
    NodeStatus,
    Scheduler,
    bounded_reason,
)

# Exit codes (gpunode rollout --help and the README list them).
EXIT_COMPLETE = 0  # every node done
EXIT_INCOMPLETE = 1  # went through every batch, but some node failed, was left out or skipped
EXIT_ERROR = 2  # could not start or go on: bad arguments, inventory, state file, scheduler
EXIT_STOPPED = 3  # stopped by the failure budget: later batches untouched
EXIT_INTERRUPTED = 4  # interrupted (Ctrl-C, SIGTERM): run it again to go on
EXIT_CODES = {
    EXIT_COMPLETE: "complete: every node done",
    EXIT_INCOMPLETE: "complete, but some node failed, was left out or skipped",
    EXIT_ERROR: "not started or not continued (arguments, inventory, state file, scheduler)",
    EXIT_STOPPED: "stopped: more nodes failed than --max-failures; later batches untouched",
    EXIT_INTERRUPTED: "interrupted; run the same command again to go on",
}

STATE_VERSION = 1
ROLLOUT_ID = re.compile(r"[0-9]{8}T[0-9]{6}-[0-9a-f]{4}")


class Phase(StrEnum):
    PENDING = "pending"
    DRAINING = "draining"  # drain asked for
    WAITING = "waiting"  # drained; its jobs may still run
    CONVERGING = "converging"
    REBOOT_PENDING = "reboot-pending"  # converged; its driver reboot waits for the drain read
    CHECKING = "checking"  # converged; waiting for it to answer, then the health gate
    RESUMING = "resuming"  # passed; resume asked for
    DONE = "done"
    FAILED = "failed"  # converge or health gate failed: stays drained
    LEFT_OUT = "left-out"  # jobs outlived --job-timeout, or someone drained it meanwhile
    SKIPPED = "skipped"  # drained by someone else, or unknown to the scheduler: untouched

    @property
    def finished(self) -> bool:
        return self in FINISHED


FINISHED = frozenset({Phase.DONE, Phase.FAILED, Phase.LEFT_OUT, Phase.SKIPPED})


class RolloutError(RuntimeError):
    """The rollout cannot start or go on; the message says why."""


@dataclass
class NodeRecord:
    batch: int
    scheduled: bool  # a scheduler node (drained, resumed); otherwise converged and checked only
    phase: Phase = Phase.PENDING
    note: str = ""
    drained: bool = False  # drained by this rollout (and not resumed since)
    rebooted: bool = False
    waiting_since: float | None = None  # epoch seconds: the job timeout outlives a restart


@dataclass
class RolloutState:
    id: str
    inventory: str
    deploy: str
    batches: list[list[str]]
    nodes: dict[str, NodeRecord]
    outcome: str = "running"  # running, complete, stopped, interrupted
    phase_seconds: dict[str, float] = field(default_factory=dict)  # per phase, all batches

    @property
    def failures(self) -> int:
        return sum(record.phase is Phase.FAILED for record in self.nodes.values())

    def reason_prefix(self) -> str:
        return f"{GPUNODE_REASON_PREFIX} rollout {self.id}"

    def to_json(self) -> str:
        data = asdict(self)
        data["version"] = STATE_VERSION
        for record in data["nodes"].values():
            record["phase"] = str(record["phase"])
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> RolloutState:
        """The state as written by :meth:`to_json`; anything else is a RolloutError."""
        try:
            data = json.loads(text)
            if data.get("version") != STATE_VERSION:
                raise ValueError(f"version {data.get('version')!r}, not {STATE_VERSION}")
            if not ROLLOUT_ID.fullmatch(str(data["id"])):
                raise ValueError(f"rollout id {str(data['id'])[:40]!r}")
            nodes = {
                str(name): NodeRecord(
                    batch=int(record["batch"]),
                    scheduled=bool(record["scheduled"]),
                    phase=Phase(record["phase"]),
                    note=str(record.get("note", "")),
                    drained=bool(record.get("drained", False)),
                    rebooted=bool(record.get("rebooted", False)),
                    waiting_since=(
                        None
                        if record.get("waiting_since") is None
                        else float(record["waiting_since"])
                    ),
                )
                for name, record in data["nodes"].items()
            }
            batches = [[str(name) for name in batch] for batch in data["batches"]]
            if sorted(name for batch in batches for name in batch) != sorted(nodes):
                raise ValueError("its batches and nodes differ")
            return cls(
                id=str(data["id"]),
                inventory=str(data["inventory"]),
                deploy=str(data["deploy"]),
                batches=batches,
                nodes=nodes,
                outcome=str(data.get("outcome", "running")),
                phase_seconds={
                    str(k): float(v) for k, v in dict(data.get("phase_seconds", {})).items()
                },
            )
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise RolloutError(f"unreadable rollout state: {error}") from None


def make_batches(nodes: Sequence[str], batch: int, canary: int) -> list[list[str]]:
    """The canary batch (the first ``canary`` nodes) first, then batches of ``batch``."""
    if batch < 1:
        raise RolloutError(f"--batch {batch}: at least 1")
    if canary < 0:
        raise RolloutError(f"--canary {canary}: 0 or more")
    names = list(nodes)
    batches = [names[:canary]] if canary else []
    rest = names[canary:]
    batches += [rest[start : start + batch] for start in range(0, len(rest), batch)]
    return [chunk for chunk in batches if chunk]


def new_rollout_id(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{secrets.token_hex(2)}"


def new_state(
    inventory: str,
    deploy: str,
    nodes: Sequence[tuple[str, bool]],
    batch: int,
    canary: int,
    rollout_id: str | None = None,
) -> RolloutState:
    """``nodes``: (name, is a scheduler node), in rollout order."""
    batches = make_batches([name for name, _ in nodes], batch, canary)
    scheduled = dict(nodes)
    records = {
        name: NodeRecord(batch=index, scheduled=scheduled[name])
        for index, chunk in enumerate(batches)
        for name in chunk
    }
    return RolloutState(rollout_id or new_rollout_id(), inventory, deploy, batches, records)


def reason(prefix: str, what: str, items: Iterable[str] = ()) -> str:
    """A drain reason: ``prefix what item,item`` (see :func:`gpunode.scheduler.bounded_reason`)."""
    return bounded_reason(f"{prefix} {what}", items)


def is_ours(status: NodeStatus | None, state: RolloutState) -> bool:
    """Drained by this rollout (its reason names the rollout's id)."""
    return (
        status is not None
        and status.drained
        and ((status.reason or "") + " ").startswith(state.reason_prefix() + " ")
    )


def someone_elses(status: NodeStatus, state: RolloutState) -> bool:
    """Out of service by someone else: DOWN, FAIL or FAILING whatever the reason, or drained
    by anyone but this rollout (a person, another tool, gpunode's drift drain, another
    rollout). Never drained, resumed or re-worded by this rollout."""
    return status.state in HELD_STATES or (status.drained and not is_ours(status, state))


def held_note(status: NodeStatus) -> str:
    """'down by someone else (PSU fault)': the state and the reason, cleaned."""
    word = status.state if status.state in HELD_STATES else "drained"
    return f"{word} by someone else ({clean_text(status.reason or 'no reason', 300)})"


def state_base() -> Path:
    """Where gpunode keeps its state on the control host: $XDG_STATE_HOME/gpunode."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "gpunode"


def default_state_path(inventory: str, deploy: str, limit: str | None) -> Path:
    """One state file per inventory, deploy and limit, under $XDG_STATE_HOME/gpunode."""
    key = hashlib.sha256(
        "\0".join((os.path.realpath(inventory), deploy, limit or "")).encode()
    ).hexdigest()[:12]
    return state_base() / f"rollout-{key}.json"


def inventory_lock_path(inventory: str) -> Path:
    """The lock every rollout of ``inventory`` holds, whatever its deploy, limit or state file."""
    key = hashlib.sha256(os.path.realpath(inventory).encode()).hexdigest()[:12]
    return state_base() / f"rollout-inventory-{key}.lock"


# --- one rollout at a time --------------------------------------------------------------


def holder_record(started: float | None = None) -> dict[str, object]:
    """Who holds a lock: enough to find the process (and to tell a stale lock)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    when = time.time() if started is None else started
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "user": user,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)),
    }


def describe_holder(text: str) -> str:
    """A holder record as one line: pid, host, user, start (the file is read as untrusted)."""
    try:
        record = json.loads(text)
        if not isinstance(record, dict):
            raise ValueError("not an object")
        shown = (
            f"pid {record.get('pid')} on {record.get('host')}, user {record.get('user')}, "
            f"since {record.get('started')}"
        )
    except ValueError:
        shown = f"an unreadable holder record {text[:80]!r}"
    return clean_text(shown, 300)


class RolloutLock:
    """``flock`` on each of ``paths`` (a rollout's state file's ``.lock``, its inventory's
    lock), each with a holder record. The kernel lets go of a ``flock`` when its process
    ends, however it ends, so a lock that can be taken is free; a record left in it was
    written by a holder that ended without letting go (killed): it is named as stale."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = list(dict.fromkeys(paths))
        self._held: list[tuple[Path, int]] = []
        self.stale: list[str] = []  # 'path: pid ... (stale: its process ended)'

    def __enter__(self) -> RolloutLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        record = json.dumps(holder_record(), sort_keys=True) + "\n"
        try:
            for path in self.paths:
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = os.pread(descriptor, 4096, 0).decode(errors="replace")
                    os.close(descriptor)
                    raise RolloutError(
                        f"another rollout holds {path}: {describe_holder(holder)}; wait for it "
                        "to end, or stop that process"
                    ) from None
                self._held.append((path, descriptor))
                left = os.pread(descriptor, 4096, 0).decode(errors="replace")
                if left.strip():
                    self.stale.append(
                        f"{path}: {describe_holder(left)} (stale: that rollout ended without "
                        "letting go; taken over)"
                    )
                os.ftruncate(descriptor, 0)
                os.pwrite(descriptor, record.encode(), 0)
                os.fsync(descriptor)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """The record emptied (no stale lock left behind), then the lock let go."""
        for _path, descriptor in reversed(self._held):
            with contextlib.suppress(OSError):
                os.ftruncate(descriptor, 0)
            os.close(descriptor)
        self._held = []


# --- what the rollout does to nodes ---------------------------------------------------------


@dataclass
class ConvergeResult:
    failed: dict[str, str]  # node -> why
    rebooted: set[str]
    reboot_pending: set[str] = field(default_factory=set)  # its driver reboot was deferred


@dataclass
class CheckResult:
    critical: list[str] | None  # finding ids; None: the node was not checked
    why_not: str = ""
    note: str = ""  # what the gate ran besides the drift check (the DCGM diagnostic or not)


class Nodes(Protocol):
    """The deploy and the health gate, for the nodes of a batch."""

    def converge(self, nodes: Sequence[str]) -> ConvergeResult:
        """The deploy, the driver's reboot deferred: ``reboot_pending`` names who needs it."""
        ...

    def reboot(self, nodes: Sequence[str]) -> ConvergeResult:
        """The deploy again, the reboot no longer deferred: that reboot and what waits for it."""
        ...

    def check(self, nodes: Sequence[str]) -> dict[str, CheckResult]: ...


REBOOT_OPERATION = "Loaded kernel module is the installed one"
# roles/nvidia_driver.py's REBOOT_DEFERRAL_VARIABLE, REBOOT_DEFERRAL_VALUE, REBOOT_DEFERRED_NAME
# (the rollout imports no role; tests/unit/test_rollout.py keeps them equal).
REBOOT_DEFERRAL = ("GPUNODE_DRIVER_REBOOT", "defer")
REBOOT_DEFERRED_OPERATION = "Driver reboot deferred to the rollout"
GATE_PASSED = "health gate passed"


class PyinfraNodes:
    """The deploy through the pyinfra CLI (``--limit`` to the batch) and the health gate
    through ``gpunode drift --json``, both subprocesses of this Python."""

    def __init__(
        self,
        inventory: str,
        deploy: str,
        timeout_s: float = 3600,
        dcgm_diag_level: int | None = None,
        dcgm_nodes: frozenset[str] = frozenset(),
        config: str | None = None,
    ) -> None:
        self.inventory = inventory
        self.deploy = deploy
        # The deploy's checkout's config.py, given to pyinfra by its path: pyinfra reads
        # config.py from its working directory only, and a rollout may run from anywhere.
        self.config = config
        self.timeout_s = timeout_s
        # The gate's DCGM diagnostic (gpunode drift --dcgm-diag): run where DCGM is declared.
        self.dcgm_diag_level = dcgm_diag_level
        self.dcgm_nodes = dcgm_nodes

    def converge(self, nodes: Sequence[str]) -> ConvergeResult:
        return self._deploy(nodes, defer_reboot=True)

    def reboot(self, nodes: Sequence[str]) -> ConvergeResult:
        return self._deploy(nodes, defer_reboot=False)

    def _deploy(self, nodes: Sequence[str], defer_reboot: bool) -> ConvergeResult:
        limits = [word for node in nodes for word in ("--limit", node)]
        config = ["--config", self.config] if self.config else []
        argv = [sys.executable, "-m", "pyinfra", "-y", "--json", *config]
        argv += [self.inventory, self.deploy]
        variable, value = REBOOT_DEFERRAL
        # Set or removed either way: one left in the operator's shell decides nothing here.
        env = {key: text for key, text in os.environ.items() if key != variable}
        if defer_reboot:
            env[variable] = value
        try:
            done = subprocess.run(
                [*argv, *limits], capture_output=True, text=True, timeout=self.timeout_s, env=env
            )
        except subprocess.TimeoutExpired:
            return ConvergeResult(
                {node: f"deploy ran past {self.timeout_s:g} s" for node in nodes}, set()
            )
        return converge_result(nodes, done.returncode, done.stdout, done.stderr)

    def check(self, nodes: Sequence[str]) -> dict[str, CheckResult]:
        argv = [sys.executable, "-m", "gpunode.cli", "drift", self.inventory, "--json"]
        if self.dcgm_diag_level is not None:
            argv += ["--dcgm-diag", str(self.dcgm_diag_level)]
        try:
            done = subprocess.run(
                [*argv, "--limit", ",".join(nodes)],
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
            )
        except subprocess.TimeoutExpired:
            return {node: CheckResult(None, "drift check timed out") for node in nodes}
        results = check_result(nodes, done.stdout, done.stderr)
        for node, result in results.items():
            result.note = dcgm_note(self.dcgm_diag_level, node in self.dcgm_nodes)
        return results


def dcgm_note(level: int | None, declared: bool) -> str:
    """What the gate says of DCGM's diagnostic for one node."""
    if level is None:
        return ""
    if not declared:
        return "DCGM diagnostic skipped: dcgm not declared"
    return f"DCGM diagnostic level {level} passed"


def _tail(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return clean_text(" / ".join(lines[-3:]), 300) if lines else "no output"


def converge_result(
    nodes: Sequence[str], returncode: int, stdout: str, stderr: str
) -> ConvergeResult:
    """pyinfra --json's results: failed hosts, hosts whose driver reboot ran, and hosts whose
    driver reboot was deferred to the rollout."""
    try:
        results = json.loads(stdout)["results"]
        failed_hosts = {str(name) for name in results["failed_hosts"]}
        changed: dict[str, set[str]] = {REBOOT_OPERATION: set(), REBOOT_DEFERRED_OPERATION: set()}
        for operation in results["operations"]:
            for marker, hosts in changed.items():
                if marker in str(operation.get("name", "")):
                    hosts.update(str(name) for name in operation.get("success", []))
        rebooted = changed[REBOOT_OPERATION]
        pending = changed[REBOOT_DEFERRED_OPERATION]
    except (ValueError, KeyError, TypeError):
        why = f"deploy failed (exit status {returncode}): {_tail(stderr or stdout)}"
        return ConvergeResult({node: why for node in nodes}, set())
    if returncode != 0 and not failed_hosts:
        # pyinfra stopped the whole run (an inventory or deploy error): no node converged.
        failed_hosts = set(nodes)
    why = f"deploy failed (exit status {returncode}): {_tail(stderr)}"
    return ConvergeResult(
        {node: why for node in nodes if node in failed_hosts},
        rebooted & set(nodes),
        pending & set(nodes),
    )


def check_result(nodes: Sequence[str], stdout: str, stderr: str) -> dict[str, CheckResult]:
    """``gpunode drift --json`` -> each node's critical finding ids, or why it was not checked."""
    try:
        report = json.loads(stdout)
        if isinstance(report, dict) and "error" in report and "checked_hosts" not in report:
            why = f"drift check could not run: {clean_text(str(report['error']), 300)}"
            return {node: CheckResult(None, why) for node in nodes}
        checked = {str(name) for name in report["checked_hosts"]}
        unreachable = {str(k): str(v) for k, v in dict(report["unreachable"]).items()}
        critical: dict[str, list[str]] = {}
        for finding in report["findings"]:
            if finding["severity"] == "critical":
                critical.setdefault(str(finding["host"]), []).append(str(finding["id"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        why = f"drift check gave no report: {_tail(stderr or stdout)}"
        return {node: CheckResult(None, why) for node in nodes}
    results = {}
    for node in nodes:
        if node in checked:
            results[node] = CheckResult(sorted(critical.get(node, [])))
        else:
            results[node] = CheckResult(None, clean_text(unreachable.get(node, "not checked"), 300))
    return results


# --- the rollout ----------------------------------------------------------------------------


class Interrupted(Exception):
    """SIGTERM, as Ctrl-C is KeyboardInterrupt."""


class Rollout:
    def __init__(
        self,
        state: RolloutState,
        scheduler: Scheduler | None,
        nodes: Nodes,
        save: Callable[[RolloutState], None],
        max_failures: int,
        job_timeout_s: float,
        return_timeout_s: float = 900,
        poll_s: float = 5,
        say: Callable[[str], None] = print,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if scheduler is None and any(record.scheduled for record in state.nodes.values()):
            raise RolloutError("scheduler nodes in the rollout, but no scheduler to drain them")
        self.state = state
        self.scheduler = scheduler
        self.nodes = nodes
        self._save = save
        self.max_failures = max_failures
        self.job_timeout_s = job_timeout_s
        self.return_timeout_s = return_timeout_s
        self.poll_s = poll_s
        self.say = say
        self.clock = clock
        self.sleep = sleep

    # -- bookkeeping
    def save(self) -> None:
        self._save(self.state)

    def set(self, name: str, phase: Phase, note: str | None = None) -> None:
        record = self.state.nodes[name]
        record.phase = phase
        if note is not None:
            record.note = clean_text(note, 300)
        self.save()
        self.say(f"rollout {self.state.id}: {name}: {phase}{f' ({record.note})' if note else ''}")

    def timed(self, phase: str, started: float) -> None:
        seconds = self.state.phase_seconds
        seconds[phase] = round(seconds.get(phase, 0.0) + max(0.0, self.clock() - started), 3)

    def batch_label(self, index: int) -> str:
        canary = " (canary)" if index == 0 and self._has_canary else ""
        return f"batch {index + 1}/{len(self.state.batches)}{canary}"

    _has_canary = False

    def status_of(self, names: Sequence[str]) -> dict[str, NodeStatus]:
        wanted = [name for name in names if self.state.nodes[name].scheduled]
        if not wanted or self.scheduler is None:
            return {}
        return self.scheduler.status(wanted).nodes

    # -- the run
    def run(self, has_canary: bool = False) -> int:
        self._has_canary = has_canary
        self.state.outcome = "running"
        try:
            for index, batch in enumerate(self.state.batches):
                active = [name for name in batch if not self.state.nodes[name].phase.finished]
                if not active:
                    continue
                # Checked before a batch too: run again after a stop, a rollout goes on only
                # with a larger --max-failures.
                if self.state.failures > self.max_failures:
                    return self.stop(index)
                self.say(f"rollout {self.state.id}: {self.batch_label(index)}: {', '.join(active)}")
                self.run_batch(index, active)
                if self.state.failures > self.max_failures:
                    return self.stop(index + 1)
        except (KeyboardInterrupt, Interrupted):
            self.state.outcome = "interrupted"
            self.save()
            self.say(f"rollout {self.state.id}: interrupted; run it again to go on")
            return EXIT_INTERRUPTED
        self.state.outcome = "complete"
        self.save()
        phases = {record.phase for record in self.state.nodes.values()}
        return EXIT_COMPLETE if phases <= {Phase.DONE} else EXIT_INCOMPLETE

    def stop(self, first_untouched: int) -> int:
        self.state.outcome = "stopped"
        self.save()
        later = [n for b in self.state.batches[first_untouched:] for n in b]
        self.say(
            f"rollout {self.state.id}: stopped: {self.state.failures} failed, more than "
            f"--max-failures {self.max_failures}; untouched: {', '.join(later) or 'none'}"
        )
        return EXIT_STOPPED

    def run_batch(self, index: int, active: list[str]) -> None:
        started = self.clock()
        self.drain(index, active)
        self.wait_for_jobs([n for n in active if self.state.nodes[n].phase is Phase.WAITING])
        self.timed("drain", started)
        converging = [
            n for n in active if self.state.nodes[n].phase in (Phase.WAITING, Phase.CONVERGING)
        ]
        if converging:
            converging = self.still_drained(converging)
        if converging:
            started = self.clock()
            self.converge(converging)
            self.timed("converge", started)
        # Also the nodes a restarted rollout finds between their converge and their reboot.
        rebooting = [n for n in active if self.state.nodes[n].phase is Phase.REBOOT_PENDING]
        if rebooting:
            rebooting = self.still_drained(rebooting, before_reboot=True)
        if rebooting:
            started = self.clock()
            self.reboot(rebooting)
            self.timed("reboot", started)
        checking = [n for n in active if self.state.nodes[n].phase is Phase.CHECKING]
        if checking:
            self.gate(checking)
        resuming = [n for n in active if self.state.nodes[n].phase is Phase.RESUMING]
        if resuming:
            started = self.clock()
            self.resume(resuming)
            self.timed("resume", started)

    def drain(self, index: int, names: list[str]) -> None:
        status = self.status_of(
            [n for n in names if self.state.nodes[n].phase in (Phase.PENDING, Phase.DRAINING)]
        )
        for name in names:
            record = self.state.nodes[name]
            if record.phase not in (Phase.PENDING, Phase.DRAINING):
                continue
            if not record.scheduled:
                record.waiting_since = self.clock()
                self.set(name, Phase.WAITING, "no scheduler node (slurm off): no drain")
                continue
            found = status.get(name)
            if found is None:
                self.set(name, Phase.SKIPPED, "the scheduler does not know it: untouched")
                continue
            if someone_elses(found, self.state):
                self.set(name, Phase.SKIPPED, f"{held_note(found)}: untouched")
                continue
            if not is_ours(found, self.state):
                self.set(name, Phase.DRAINING)
                assert self.scheduler is not None
                self.scheduler.drain(
                    name, reason(self.state.reason_prefix(), self.batch_label(index))
                )
            record.drained = True
            if record.waiting_since is None:
                record.waiting_since = self.clock()
            self.set(name, Phase.WAITING, "drained")

    def wait_for_jobs(self, names: list[str]) -> None:
        waiting = [n for n in names if self.state.nodes[n].scheduled]
        told: set[str] = set()
        while waiting:
            still = []
            for name in waiting:
                assert self.scheduler is not None
                jobs = self.scheduler.running_jobs(name)
                if not jobs:
                    continue
                record = self.state.nodes[name]
                since = record.waiting_since if record.waiting_since is not None else self.clock()
                if self.clock() - since >= self.job_timeout_s:
                    ours = self.still_ours(name)
                    if ours:
                        self.scheduler.resume(name)
                    record.drained = False
                    self.set(
                        name,
                        Phase.LEFT_OUT,
                        f"jobs {','.join(jobs[:5])} still running after --job-timeout "
                        f"{self.job_timeout_s:g} s: "
                        + ("resumed" if ours else "drained by someone else meanwhile")
                        + ", not converged",
                    )
                    continue
                if name not in told:
                    self.say(f"rollout {self.state.id}: {name}: waiting for jobs {','.join(jobs)}")
                    told.add(name)
                still.append(name)
            waiting = still
            if waiting:
                self.sleep(self.poll_s)

    def still_drained(self, names: list[str], before_reboot: bool = False) -> list[str]:
        """The nodes still drained by this rollout, read again right before the converge and
        right before the driver reboot: a person may have resumed a node while the rollout
        waited for its jobs or while the deploy installed, or taken it over, and a restarted
        rollout may find a node it drained back in service. Such a node is left out, with
        why: unconverged, or converged and not rebooted."""
        status = self.status_of(names)
        ready = []
        for name in names:
            record = self.state.nodes[name]
            if not record.scheduled:
                ready.append(name)
                continue
            found = status.get(name)
            if found is not None and is_ours(found, self.state):
                ready.append(name)
                continue
            record.drained = False
            if found is None:
                why = "the scheduler does not know it any more"
            elif someone_elses(found, self.state):
                why = held_note(found)
            else:
                why = f"not drained any more ({found.state}: resumed by someone else)"
            left = (
                " before its reboot: converged, not rebooted; the new driver loads at its next "
                "reboot"
                if before_reboot
                else ": not converged, left as it is"
            )
            self.set(name, Phase.LEFT_OUT, why + left)
        return ready

    def converge(self, names: list[str]) -> None:
        for name in names:
            self.set(name, Phase.CONVERGING)
        result = self.nodes.converge(names)
        for name in names:
            record = self.state.nodes[name]
            record.rebooted = record.rebooted or name in result.rebooted
            if name in result.failed:
                self.fail(name, "converge", [], result.failed[name])
            elif name in result.reboot_pending:
                self.set(name, Phase.REBOOT_PENDING, "converged; its driver reboot waits for "
                         "its drain to be read again")  # fmt: skip
            else:
                self.set(
                    name, Phase.CHECKING, "converged" + (", rebooted" if record.rebooted else "")
                )

    def reboot(self, names: list[str]) -> None:
        """The deploy once more, its reboot no longer deferred (everything else converged)."""
        result = self.nodes.reboot(names)
        for name in names:
            record = self.state.nodes[name]
            record.rebooted = record.rebooted or name in result.rebooted
            if name in result.failed:
                self.fail(name, "reboot", [], result.failed[name])
            else:
                # Not rebooted: the run found the new module loaded already (a restart).
                done = "rebooted" if name in result.rebooted else "no reboot needed any more"
                self.set(name, Phase.CHECKING, f"converged, {done}")

    def gate(self, names: list[str]) -> None:
        """Once the nodes answer again (the scheduler sees them respond, the drift check
        reaches them), no critical finding."""
        started = self.clock()
        pending = list(names)
        last: dict[str, str] = {}
        while pending:
            status = self.status_of(pending)
            answering = [
                n
                for n in pending
                if not self.state.nodes[n].scheduled or (n in status and status[n].responding)
            ]
            for name in pending:
                if name not in answering:
                    last[name] = "the scheduler does not see it respond"
            checked = self.nodes.check(answering) if answering else {}
            still = []
            for name in pending:
                result = checked.get(name)
                if result is None or result.critical is None:
                    if result is not None:
                        last[name] = result.why_not
                    still.append(name)
                elif result.critical:
                    self.fail(name, "health gate", result.critical, ", ".join(result.critical))
                else:
                    note = f" ({result.note})" if result.note else ""
                    self.set(name, Phase.RESUMING, f"{GATE_PASSED}{note}")
            pending = still
            if pending:
                if self.clock() - started >= self.return_timeout_s:
                    for name in pending:
                        why = last.get(name, "not checked")
                        self.fail(
                            name,
                            "not back",
                            [],
                            f"not back after {self.return_timeout_s:g} s: {why}",
                        )
                    break
                self.sleep(self.poll_s)
        self.timed("return and health gate", started)

    def still_ours(self, name: str) -> bool:
        """The node is still drained by this rollout (no one drained it again meanwhile)."""
        return is_ours(self.status_of([name]).get(name), self.state)

    def fail(self, name: str, what: str, ids: list[str], note: str) -> None:
        record = self.state.nodes[name]
        if record.scheduled and record.drained and not self.still_ours(name):
            record.drained = False  # someone else's drain now: their reason stays
        if record.scheduled and record.drained:
            assert self.scheduler is not None
            # The failed checks become the drain's reason (still this rollout's).
            self.scheduler.drain(name, reason(self.state.reason_prefix(), f"failed {what}", ids))
        self.set(
            name, Phase.FAILED, f"{what}: {note}" + (": stays drained" if record.drained else "")
        )

    def resume(self, names: list[str]) -> None:
        status = self.status_of(names)
        for name in names:
            record = self.state.nodes[name]
            if record.scheduled and record.drained:
                found = status.get(name)
                if found is not None and someone_elses(found, self.state):
                    # Someone took it over meanwhile (drained, DOWN, FAIL): theirs, not resumed.
                    record.drained = False
                    self.set(name, Phase.LEFT_OUT, f"{held_note(found)}: not resumed")
                    continue
                assert self.scheduler is not None
                if found is None or found.drained:
                    self.scheduler.resume(name)
                record.drained = False
            # What the gate said besides passing (the DCGM diagnostic) stays in the summary.
            said = record.note.removeprefix(GATE_PASSED).strip()
            done = "resumed" if record.scheduled else "passed"
            self.set(name, Phase.DONE, f"{done} {said}" if said else done)


# --- what the operator sees -----------------------------------------------------------------


def summary_table(state: RolloutState) -> str:
    headers = ("batch", "node", "result", "rebooted", "note")
    rows = [
        (str(record.batch + 1), clean_text(name, 80), str(record.phase),
         "yes" if record.rebooted else "", clean_text(record.note, 300))
        for batch in state.batches
        for name in batch
        for record in [state.nodes[name]]
    ]  # fmt: skip
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (headers, *rows)
    ]
    counts: dict[str, int] = {}
    for record in state.nodes.values():
        counts[str(record.phase)] = counts.get(str(record.phase), 0) + 1
    totals = ", ".join(f"{count} {phase}" for phase, count in sorted(counts.items()))
    phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in state.phase_seconds.items())
    lines.append(f"rollout {state.id} {state.outcome}: {totals}")
    if phases:
        lines.append(f"time per phase: {phases}")
    return "\n".join(lines) + "\n"


def dry_plan(
    state: RolloutState, status: dict[str, NodeStatus] | None, jobs: dict[str, list[str]]
) -> str:
    """The batches and what would happen to each node; nothing is changed."""
    lines = [
        f"rollout {state.id} (dry: nothing changes): {len(state.batches)} batches",
        "(a node whose driver change needs a reboot has its drain read again before that "
        "reboot, a second run of the deploy)",
    ]
    for index, batch in enumerate(state.batches):
        lines.append(f"batch {index + 1}/{len(state.batches)}: {', '.join(batch)}")
        for name in batch:
            record = state.nodes[name]
            if record.phase.finished:
                note = clean_text(record.note, 300)
                lines.append(f"  {name}: {record.phase} already ({note}): left alone")
                continue
            if record.phase is Phase.REBOOT_PENDING:
                lines.append(
                    f"  {clean_text(name, 80)}: converged already: drain read again, driver "
                    "reboot, health gate" + (", resume" if record.scheduled else "")
                )
                continue
            if not record.scheduled:
                plan = "no scheduler node: converge, health gate"
            elif status is None:
                plan = (
                    "drain, wait for its jobs, converge, health gate, resume (scheduler not asked)"
                )
            elif name not in status:
                plan = "skip: the scheduler does not know it"
            elif someone_elses(status[name], state):
                plan = f"skip: {held_note(status[name])}"
            else:
                running = [clean_text(job, 40) for job in jobs.get(name, [])]
                wait = f"wait for jobs {','.join(running)}" if running else "no job running"
                plan = (
                    f"drain ({clean_text(status[name].state, 40)}), {wait}, converge, "
                    "health gate, resume"
                )
            lines.append(f"  {clean_text(name, 80)}: {plan}")
    return "\n".join(lines) + "\n"

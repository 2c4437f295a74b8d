"""The workload scheduler as fleet operations see it: a node's state and drain reason, drain,
resume, and the jobs running on a node.

Rolling changes and health-driven drain use this interface only, so another scheduler
(Kubernetes: cordon, drain and the pods of a node through kubectl) is another
implementation of :class:`Scheduler`. :class:`SlurmScheduler` runs Slurm's own commands
(``sinfo``, ``squeue``, ``scontrol``) through a :data:`Runner`: on the control machine
when it is a Slurm client (:func:`local_runner`), or on the controller over SSH
(:func:`shell_runner` around any way of running a shell command there).

A drain gpunode makes carries a reason starting with :data:`GPUNODE_REASON_PREFIX`; a node
drained with any other reason was drained by a person or another tool, and gpunode never
resumes it (:attr:`NodeStatus.drained_by_gpunode`). A node DOWN, FAIL or FAILING was taken
out of service by a person or by Slurm itself, whatever its reason: gpunode never drains it
(a drain would clear FAIL and replace the reason), never resumes it and never rewrites its
reason (:attr:`NodeStatus.held_by_someone_else`).

Slurm's output is node text: parsers keep the lines they can read and name the others.
A reason is free text (anyone with operator rights writes it), so ``sinfo``'s records start
with a random marker made for each call: a reason cannot forge a record (a newline in it
continues the record it belongs to), output is split on ``\n`` only (``str.splitlines``
also splits on U+2028, U+0085, FS/GS/RS...), and reasons are kept cleaned
(:func:`gpunode.sanitize.clean_text`).
Sources (read 2026-12-01): sinfo(1) (``-N``, ``-h``, ``-o %N %T %E``; states and their
suffixes), squeue(1) (``-w``, ``-t``, ``-o %i``), scontrol(1) (``update NodeName=...
State=DRAIN Reason=...``, ``State=RESUME``), of Slurm 22.05 and 24.11. sinfo(1) prints a
format's characters other than ``%`` fields as they are (the marker). Node states (read
2026-12-07 in Slurm's source, src/common/slurm_protocol_defs.c node_state_string, master of
2026-08-20): a DRAIN flag
reads ``drained``/``draining`` whatever the base state (DOWN too), FAIL reads ``fail`` or
``failing``, a DOWN node without DRAIN reads ``down``; ``scontrol update State=DRAIN``
clears FAIL (src/slurmctld/node_mgr.c, update_node).
"""

from __future__ import annotations

import re
import secrets
import shlex
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpunode.sanitize import clean_text

GPUNODE_REASON_PREFIX = "gpunode:"
# Slurm node names as gpunode passes them (host names); reasons: printable, one line, and
# without the characters sinfo's output separator or a shell would take.
NODE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,62}[A-Za-z0-9])?")
REASON = re.compile(r"[A-Za-z0-9 ._:,/=+@()#-]{1,200}")
MAX_REASON_CHARS = 200
_UNSAFE_REASON_CHARACTER = re.compile(r"[^A-Za-z0-9 ._:,/=+@()#-]")
MAX_OUTPUT_LINES = 100_000
# The job states that hold a node's resources (squeue -t): running, completing,
# configuring (booting its nodes), suspended (its memory still held).
BUSY_JOB_STATES = ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED")
DRAINED_STATES = frozenset({"drained", "draining"})
# Out of service by a person's (or Slurm's) decision: never drained, resumed or reworded.
HELD_STATES = frozenset({"down", "fail", "failing"})
MAX_REASON_SHOWN = 400
_FIELD_SEPARATOR = "|"
_RECORD_MARK = re.compile(r"gpunode-[0-9a-f]{16}:")
_STATE = re.compile(r"[a-z_]+")
_JOB_ID = re.compile(r"[0-9]+(_[0-9]+|\+[0-9]+)?")

# argv -> (exit status, stdout, stderr)
Runner = Callable[[Sequence[str]], tuple[int, str, str]]


class SchedulerError(RuntimeError):
    """The scheduler refused or failed a request; the message says which and why."""


@dataclass(frozen=True)
class NodeStatus:
    """One node as the scheduler sees it."""

    name: str
    state: str  # the scheduler's word for it, lowercase: idle, mixed, allocated, drained...
    # Why it is drained or down, as whoever did it wrote it; Slurm may still show the last
    # reason a while after a resume, so it says something only while the node is drained.
    reason: str | None
    responding: bool = True

    @property
    def drained(self) -> bool:
        """Drained or draining: no new job lands on it."""
        return self.state in DRAINED_STATES

    @property
    def drained_by_gpunode(self) -> bool:
        return self.drained and (self.reason or "").startswith(GPUNODE_REASON_PREFIX)

    @property
    def held_by_someone_else(self) -> bool:
        """Out of service by someone else's decision: DOWN, FAIL or FAILING (any reason), or
        drained with a reason that is not gpunode's. Such a node is never drained (a drain
        clears FAIL and replaces the reason), resumed or re-worded by gpunode."""
        if self.state in HELD_STATES:
            return True
        return self.drained and not self.drained_by_gpunode


@dataclass(frozen=True)
class StatusReport:
    nodes: dict[str, NodeStatus]
    problems: list[str]  # lines that could not be read, quoted and cut


class Scheduler(Protocol):
    """What ``gpunode rollout`` and ``gpunode drift --drain`` need of a scheduler.

    A second implementation (Kubernetes through kubectl: cordon, a taint or annotation for the
    reason, the node's pods) provides these four methods with these meanings:

    - ``status``: one :class:`NodeStatus` per known node, leaving out the unknown ones (the
      rollout skips those); ``state`` is the scheduler's word, lowercase, and a node that takes
      no new work must read as ``drained`` or ``draining`` (:data:`DRAINED_STATES`: a cordoned
      node), or, where someone else declared it broken, ``down``, ``fail`` or ``failing``
      (:data:`HELD_STATES`: never drained, resumed or re-worded by gpunode); ``reason`` is
      the drain's reason exactly as stored, read back while it is drained (gpunode tells its
      own drains from a person's by :data:`GPUNODE_REASON_PREFIX`, so the reason must survive
      the round trip); ``responding``: false while the node is not back
      (the health gate waits for it after a reboot); lines it cannot read go to ``problems``;
    - ``drain``: idempotent, and a drain of a drained node replaces its reason (a node that
      fails the gate is drained again with the failed checks); running work goes on;
    - ``resume``: the node takes work again; only ever called for a node gpunode drained;
    - ``running_jobs``: ids of the work that still holds the node (empty once it may change).

    Node names are checked with :func:`check_node` and reasons with :func:`check_reason` before
    they reach a command, every value is one argv word (quoted where a shell runs it), and any
    refusal or failure raises :class:`SchedulerError` with the scheduler's words. The CLI's
    ``scheduler_from`` builds the scheduler (:class:`SlurmScheduler`, locally or over
    ``--scheduler-ssh``); a new one needs its option there, nothing in the rollout or the drift
    drain changes.
    """

    def status(self, nodes: Sequence[str]) -> StatusReport:
        """The state of ``nodes``; a node the scheduler does not know is not in it."""
        ...

    def drain(self, node: str, reason: str) -> None:
        """No new job on ``node``; its running jobs go on. ``reason`` is stored with it."""
        ...

    def resume(self, node: str) -> None:
        """``node`` takes jobs again."""
        ...

    def running_jobs(self, node: str) -> list[str]:
        """The ids of the jobs that hold ``node``'s resources now."""
        ...


def gpunode_reason(text: str) -> str:
    """A drain reason gpunode writes: the prefix, then ``text``."""
    return check_reason(f"{GPUNODE_REASON_PREFIX} {text}")


def bounded_reason(head: str, items: Iterable[str] = ()) -> str:
    """A drain reason ``head item,item,...`` from text that may come from nodes (finding ids):
    characters a reason may not hold become ``_``, and the items are cut (``+N more``) to fit
    its 200 characters."""
    text = _UNSAFE_REASON_CHARACTER.sub("_", " ".join(head.split()))[:MAX_REASON_CHARS]
    names = [_UNSAFE_REASON_CHARACTER.sub("_", item)[:80] for item in items]
    for count, name in enumerate(names):
        more = f" +{len(names) - count} more"
        candidate = f"{text}{' ' if count == 0 else ','}{name}"
        last = count == len(names) - 1
        if len(candidate) > MAX_REASON_CHARS or (
            not last and len(candidate + more) > MAX_REASON_CHARS
        ):
            text += more
            break
        text = candidate
    return check_reason(text or "gpunode")


def check_node(name: str) -> str:
    if not NODE_NAME.fullmatch(name):
        raise SchedulerError(f"{name!r} is not a node name")
    return name


def check_reason(reason: str) -> str:
    if not REASON.fullmatch(reason):
        raise SchedulerError(
            f"drain reason {reason[:80]!r}: one line of at most 200 letters, digits, spaces "
            "and ._:,/=+@()#-"
        )
    return reason


def local_runner(timeout_s: float = 60) -> Runner:
    """Runs the scheduler's commands on this machine (a Slurm client of the cluster)."""

    def run(argv: Sequence[str]) -> tuple[int, str, str]:
        try:
            done = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return 127, "", f"{argv[0]}: {error}"
        return done.returncode, done.stdout, done.stderr

    return run


def shell_runner(execute: Callable[[str], tuple[int, str, str]]) -> Runner:
    """A runner from anything that runs one shell command line elsewhere (SSH to the
    controller, say): every word is quoted."""

    def run(argv: Sequence[str]) -> tuple[int, str, str]:
        return execute(shlex.join(argv))

    return run


def new_record_mark() -> str:
    """The marker that starts each of one ``sinfo`` call's records: random, so that no reason
    written before the call can hold it."""
    return f"gpunode-{secrets.token_hex(8)}:"


def sinfo_format(mark: str) -> str:
    return f"{mark}%N{_FIELD_SEPARATOR}%T{_FIELD_SEPARATOR}%E"


def output_lines(output: str) -> list[str]:
    """Lines split on ``\n`` alone: ``str.splitlines`` splits on U+2028, U+0085, FS, GS, RS,
    VT and FF too, which a reason or a job's name may hold."""
    return output.split("\n")


def parse_sinfo(output: str, mark: str) -> StatusReport:
    """``sinfo -h -N -o '<mark>%N|%T|%E'`` -> each node once (sinfo lists a node per partition).

    A record starts at a line starting with ``mark``; a line without it is part of the reason
    before it (a reason holding a newline), so it can neither add a node nor change one. The
    reason is cleaned (control characters, line separators: visible escapes).

    A state's suffix says more than the state: ``*`` the node does not respond, ``~`` and
    ``#`` power saving, ``!``, ``%`` and ``@`` power and reboot requests; the state is kept
    without it, ``responding`` from ``*``.
    """
    if not _RECORD_MARK.fullmatch(mark):
        raise SchedulerError(f"{mark[:40]!r} is not a record marker")
    records: list[tuple[int, str]] = []
    problems: list[str] = []
    lines = output_lines(output)
    if len(lines) > MAX_OUTPUT_LINES:
        problems.append(f"output past {MAX_OUTPUT_LINES} lines not read")
        lines = lines[:MAX_OUTPUT_LINES]
    for number, line in enumerate(lines, start=1):
        if line.startswith(mark):
            records.append((number, line[len(mark) :]))
        elif records:
            start, text = records[-1]
            records[-1] = (start, f"{text}\n{line}")
        elif line.strip():
            problems.append(f"line {number}: {clean_text(line, 120)}")
    nodes: dict[str, NodeStatus] = {}
    for number, text in records:
        text = text.removesuffix("\n").removesuffix("\r")
        fields = text.split(_FIELD_SEPARATOR, 2)
        name, raw_state = [*fields, "", ""][:2]
        state = raw_state.strip().rstrip("*~#!%$@^-").lower()
        if len(fields) != 3 or not NODE_NAME.fullmatch(name) or not _STATE.fullmatch(state):
            problems.append(f"line {number}: {clean_text(text, 120)}")
            continue
        reason = fields[2].strip(" ")
        nodes[name] = NodeStatus(
            name=name,
            state=state,
            reason=(
                None if reason in ("", "none", "(null)") else clean_text(reason, MAX_REASON_SHOWN)
            ),
            responding="*" not in raw_state,
        )
    return StatusReport(nodes, problems)


class SlurmScheduler:
    """:class:`Scheduler` on Slurm, through ``run`` (see :data:`Runner`)."""

    def __init__(self, run: Runner):
        self._run = run

    def _call(self, argv: list[str]) -> str:
        code, stdout, stderr = self._run(argv)
        if code != 0:
            message = clean_text(" ".join((stderr or stdout).split()), 300) or "no message"
            raise SchedulerError(f"{argv[0]} {argv[1]}: exit status {code}: {message}")
        return stdout

    def status(self, nodes: Sequence[str]) -> StatusReport:
        names = [check_node(node) for node in nodes]
        if not names:
            return StatusReport({}, [])
        mark = new_record_mark()
        output = self._call(
            ["sinfo", "--noheader", "--Node", "--nodes", ",".join(names),
             "--format", sinfo_format(mark)]
        )  # fmt: skip
        report = parse_sinfo(output, mark)
        wanted = set(names)
        return StatusReport(
            {name: status for name, status in report.nodes.items() if name in wanted},
            report.problems,
        )

    def drain(self, node: str, reason: str) -> None:
        self._call(
            ["scontrol", "update", f"NodeName={check_node(node)}", "State=DRAIN",
             f"Reason={check_reason(reason)}"]
        )  # fmt: skip

    def resume(self, node: str) -> None:
        self._call(["scontrol", "update", f"NodeName={check_node(node)}", "State=RESUME"])

    def running_jobs(self, node: str) -> list[str]:
        output = self._call(
            ["squeue", "--noheader", "--nodelist", check_node(node),
             "--states", ",".join(BUSY_JOB_STATES), "--format", "%i"]
        )  # fmt: skip
        jobs = [line.strip() for line in output_lines(output) if line.strip()]
        unreadable = [clean_text(job, 40) for job in jobs if not _JOB_ID.fullmatch(job)]
        if unreadable:
            raise SchedulerError(f"squeue: unreadable job ids {', '.join(unreadable[:5])}")
        return jobs

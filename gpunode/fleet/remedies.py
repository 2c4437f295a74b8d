"""Health remedies gpunode carries out itself: ``gpunode drift --remedy``.

A health finding names its remedy (``gpunode.health.catalogue``); the inventory says, per
failure class, which remedy gpunode may carry out on its own (``health.actions``; today a GPU
reset, ``reset_gpu``). After the check, ``plan`` decides per node what to do and what to
leave, and says why:

- only findings of an opted-in failure class whose remedy is that action, and that name their
  GPU (``Finding.gpu``, its PCI bus id): the reset acts on those GPUs alone;
- never while the scheduler runs jobs on the node: a Slurm node is reset only once it is
  drained and its jobs have ended (``--drain critical`` drains it; a later check acts), and not
  at all where the scheduler cannot be asked; a node no scheduler manages is checked on the
  node itself, where a GPU that any process uses is refused (``roles/remedy.py``);
- at most ``health.action_limit`` remedies per node within ``health.action_window_hours``,
  counted in a history file on the control host, so a node whose fault comes back is not reset
  in a loop: past the limit it is left to an operator.

``carry_out`` runs ``deploys/remedy.py`` for one node (pyinfra, ``--limit`` the node), the
GPUs in an environment variable of its own process that no inventory can set
(``REMEDY_GPUS_VARIABLE``, each checked against the bus-id pattern there again), and records
the outcome. The report carries every decision (``as_dict``: the JSON report's ``remedies``,
Prometheus' ``gpunode_health_remedy``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gpunode.drift.findings import DriftResult, Finding
from gpunode.model import Health
from gpunode.rollout import state_base
from gpunode.sanitize import clean_text

RESET_GPU = "reset_gpu"
# The deploy that carries a remedy out, and how the GPUs reach it.
REMEDY_DEPLOY = "deploys/remedy.py"
REMEDY_GPUS_VARIABLE = "GPUNODE_REMEDY_GPUS"
# A GPU's PCI bus id as nvidia-smi -i takes it (gpunode.health.finding.gpu_bus_id writes it).
GPU_BUS_ID = re.compile(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]")
HISTORY_VERSION = 1
# The words of a failed run kept in the report.
OUTCOME_CHARS = 600


@dataclass(frozen=True)
class Remedy:
    """One node's remedy: carried out (``withheld`` empty) or left, and why; then how it went."""

    host: str
    action: str
    gpus: tuple[str, ...]
    findings: tuple[str, ...]
    failure_classes: tuple[str, ...]
    withheld: str = ""
    outcome: str = ""  # "done", or "failed: <why>", once carried out

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "gpus": list(self.gpus),
            "findings": list(self.findings),
            "failure_classes": list(self.failure_classes),
        }

    def line(self) -> str:
        gpus = ", ".join(self.gpus) or "no GPU"
        what = f"{self.host}: {self.action} of {gpus} for {', '.join(self.findings)}"
        if self.withheld:
            return clean_text(f"{what}: left to an operator: {self.withheld}", 2000)
        return clean_text(f"{what}: {self.outcome or 'to do'}", 2000)


# --- the history of remedies carried out ------------------------------------------------


class HistoryError(Exception):
    """The history cannot be read or written: no remedy is carried out without it."""


@dataclass
class History:
    """Remedies carried out, on the control host: what the rate limit counts."""

    path: Path
    entries: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> History:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls(path)
        except OSError as error:
            raise HistoryError(f"cannot read the remedy history {path}: {error}") from error
        try:
            document = json.loads(text)
            entries = document["entries"]
            if document.get("version") != HISTORY_VERSION or not isinstance(entries, list):
                raise ValueError("not a gpunode remedy history")
            for entry in entries:
                if not (
                    isinstance(entry.get("host"), str) and isinstance(entry.get("at"), float | int)
                ):
                    raise ValueError("an entry without its host and time")
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise HistoryError(
                f"the remedy history {path} is unreadable ({error}): no remedy is carried out "
                "without knowing how many ran; move the file aside to start counting again"
            ) from error
        return cls(path, entries)

    def count(self, host: str, since: float) -> int:
        return sum(1 for entry in self.entries if entry["host"] == host and entry["at"] >= since)

    def record(self, remedy: Remedy, at: float) -> None:
        self.entries.append({"host": remedy.host, "action": remedy.action, "at": at,
                             "gpus": list(remedy.gpus), "outcome": remedy.outcome})  # fmt: skip

    def save(self, keep_since: float) -> None:
        from gpunode.drift.output import write_atomically

        self.entries = [entry for entry in self.entries if entry["at"] >= keep_since]
        document = {"version": HISTORY_VERSION, "entries": self.entries}
        try:
            write_atomically(self.path, json.dumps(document, indent=1) + "\n")
        except OSError as error:
            raise HistoryError(f"cannot write the remedy history {self.path}: {error}") from error


def default_history_path(inventory: str) -> Path:
    """One history per inventory, under $XDG_STATE_HOME/gpunode (as the rollout's state)."""
    key = hashlib.sha256(os.path.realpath(inventory).encode()).hexdigest()[:12]
    return state_base() / f"remedies-{key}.json"


# --- deciding ------------------------------------------------------------------------------


def candidates(findings: Iterable[Finding], health: Health) -> list[Finding]:
    """The findings whose remedy the inventory lets gpunode carry out for their class."""
    return [
        finding
        for finding in findings
        if finding.failure_class
        and finding.remedy == RESET_GPU
        and health.actions.get(finding.failure_class) == RESET_GPU
    ]


def plan(
    result: DriftResult,
    health_of: Callable[[str], Health],
    scheduled: Mapping[str, list[str] | str],
    history: History,
    now: float,
) -> list[Remedy]:
    """One remedy per node that has findings to act on, carried out or withheld with why.

    ``scheduled``: for each node a scheduler manages, the jobs running on it once it is
    drained (``[]``: none), or why it is not to be touched now (a string: not drained, held by
    someone else, the scheduler cannot be asked); a node not in it has no scheduler.
    """
    remedies = []
    by_host: dict[str, list[Finding]] = {}
    for finding in result.sorted_findings():
        by_host.setdefault(finding.host, []).append(finding)
    for host in sorted(by_host):
        health = health_of(host)
        chosen = candidates(by_host[host], health)
        if not chosen:
            continue
        gpus = tuple(sorted({f.gpu for f in chosen if GPU_BUS_ID.fullmatch(f.gpu)}))
        remedy = Remedy(
            host, RESET_GPU, gpus,
            tuple(f.id for f in chosen), tuple(sorted({f.failure_class for f in chosen})),
        )  # fmt: skip
        since = now - health.action_window_hours * 3600
        done = history.count(host, since)
        jobs = scheduled.get(host)
        if not gpus:
            why = "the findings name no one GPU to reset"
        elif isinstance(jobs, str):
            why = jobs
        elif jobs:
            why = (
                f"jobs still run on the drained node ({', '.join(jobs[:5])}): a later check "
                "acts once they have ended"
            )
        elif done >= health.action_limit:
            why = (
                f"{done} remedies on this node in the last {health.action_window_hours} h "
                f"(health.action_limit {health.action_limit}): a fault that comes back needs a "
                "person"
            )
        else:
            why = ""
        remedies.append(replace(remedy, withheld=why))
    return remedies


# --- carrying out --------------------------------------------------------------------------

Runner = Callable[[Sequence[str], Mapping[str, str]], tuple[int, str]]


# How long one node's remedy may take (a GPU reset takes seconds; the run connects first).
REMEDY_TIMEOUT_S = 900


def pyinfra_runner(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int, str]:
    """Run pyinfra as the rollout does; its exit status and its output."""
    try:
        done = subprocess.run(
            list(argv), env={**os.environ, **env}, capture_output=True, text=True,
            timeout=REMEDY_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return 124, f"the remedy's run took longer than {REMEDY_TIMEOUT_S} s and was stopped"
    except OSError as error:
        return 127, f"pyinfra could not be started: {error}"
    return done.returncode, done.stdout + done.stderr


def carry_out(
    remedy: Remedy, inventory: str, runner: Runner = pyinfra_runner, python: str = sys.executable
) -> Remedy:
    """Run the remedy's deploy on its node; the remedy with its outcome."""
    if any(not GPU_BUS_ID.fullmatch(gpu) for gpu in remedy.gpus):
        raise ValueError(f"not PCI bus ids: {remedy.gpus!r}")
    argv = [python, "-m", "pyinfra", "-y", inventory, REMEDY_DEPLOY, "--limit", remedy.host]
    code, output = runner(argv, {REMEDY_GPUS_VARIABLE: ",".join(remedy.gpus)})
    if code == 0:
        return replace(remedy, outcome="done")
    words = [line.strip() for line in output.splitlines() if line.strip()]
    tail = " / ".join(words[-4:])[-OUTCOME_CHARS:]
    return replace(remedy, outcome=clean_text(f"failed (pyinfra exit {code}): {tail}", 2000))

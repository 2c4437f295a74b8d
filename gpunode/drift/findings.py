"""Drift findings: what differs from the inventory, how bad it is, and what fixes it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from gpunode.sanitize import MAX_REPORT_TEXT_CHARS, clean_text


class Severity(StrEnum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"critical": 0, "warning": 1, "info": 2}[self.value]


RUN_DEPLOY = "run deploys/gpu_node.py"
HARDWARE_TICKET = "open a hardware ticket (drain the node)"


@dataclass(frozen=True)
class Finding:
    """One difference between the declared and the observed state of one host.

    ``id`` is stable across runs (check name plus subject, never a timestamp or a count),
    so a baseline can tell a new finding from one already known.
    """

    id: str
    host: str
    severity: Severity
    expected: str
    found: str
    fix: str
    status: str = field(default="new", compare=False)
    # A health finding's failure class (``gpunode.health.catalogue``), the node's words it
    # rests on, how sure it is (reported by the driver / inferred) and the remedy's name;
    # empty for a drift finding that is no health failure.
    failure_class: str = ""
    evidence: str = ""
    confidence: str = ""
    remedy: str = ""
    # The PCI bus id of the one GPU a health finding is about (where a remedy would act on
    # it alone); "" otherwise. In the report only where set.
    gpu: str = ""

    HEALTH_FIELDS: ClassVar[tuple[str, ...]] = (
        "failure_class", "evidence", "confidence", "remedy", "gpu",
    )  # fmt: skip

    def __post_init__(self) -> None:
        # The one place text enters a report: node text (already cleaned with the facts),
        # inventory names and rule wording alike leave here safe for every renderer.
        for name in ("id", "host", "expected", "found", "fix", "status", *self.HEALTH_FIELDS):
            value = getattr(self, name)
            text = value if isinstance(value, str) else str(value)
            object.__setattr__(self, name, clean_text(text, MAX_REPORT_TEXT_CHARS))

    @property
    def health(self) -> dict[str, str]:
        """The health fields, where this finding is a health failure (else {})."""
        if not self.failure_class:
            return {}
        return {
            name: getattr(self, name)
            for name in self.HEALTH_FIELDS
            if getattr(self, name) or name != "gpu"
        }

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in self.HEALTH_FIELDS:
            data.pop(name)
        data["severity"] = self.severity.value
        if self.health:
            data["health"] = self.health
        return data


@dataclass
class DriftResult:
    """Findings per checked host, plus hosts that could not be checked and why."""

    findings: list[Finding] = field(default_factory=list)
    checked_hosts: list[str] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)
    # The health remedies decided after the check (``gpunode drift --remedy``:
    # gpunode.fleet.remedies.Remedy.as_dict); None where none were asked for.
    remedies: list[dict[str, Any]] | None = None

    @property
    def exit_code(self) -> int:
        """0 no drift, 1 drift found or some hosts could not be checked (the fleet has a
        problem; gpunode's contract keeps 2 for a configuration the check could not start
        with). Info findings (what an operator should know, e.g. a driver branch past its end
        of life) are no drift."""
        if self.unreachable:
            return 1
        return 1 if any(f.severity != Severity.INFO for f in self.findings) else 0

    def sorted_findings(self) -> list[Finding]:
        return sorted(self.findings, key=lambda f: (f.host, f.severity.rank, f.id))

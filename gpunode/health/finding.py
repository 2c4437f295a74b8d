"""What a health judge finds: the failure class, its evidence, how sure, and the remedy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpunode.health.catalogue import REMEDY_TEXT, Confidence, Remedy, Severity


@dataclass(frozen=True)
class HealthFinding:
    """One failure on one node. ``id`` is stable across runs (class and subject, no count or
    time), as the drift check's baseline needs."""

    id: str
    severity: Severity
    expected: str
    found: str
    failure_class: str
    evidence: str
    confidence: Confidence
    remedy: Remedy
    if_it_persists: Remedy | None = None

    @property
    def fix(self) -> str:
        """The remedy in words, and the next one if it does not help."""
        text = REMEDY_TEXT[self.remedy]
        if self.if_it_persists is not None:
            text += f"; if it persists: {REMEDY_TEXT[self.if_it_persists]}"
        return text

    def detail(self) -> dict[str, str]:
        """The fields a drift finding carries besides its own five."""
        return {
            "failure_class": self.failure_class,
            "evidence": self.evidence,
            "confidence": self.confidence.value,
            "remedy": self.remedy.value,
        }


def gpu_subject(gpu: dict[str, Any]) -> str:
    """How a finding names a GPU: its index, bus id and serial where the driver gave them."""
    parts = [f"GPU {gpu.get('index')}"]
    if gpu.get("pci_bus_id"):
        parts.append(f"bus {gpu['pci_bus_id']}")
    if gpu.get("serial"):
        parts.append(f"serial {gpu['serial']}")
    return ", ".join(parts)

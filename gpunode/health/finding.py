"""What a health judge finds: the failure class, its evidence, how sure, and the remedy."""

from __future__ import annotations

import re
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
    # The PCI bus id of the one GPU the finding is about, as nvidia-smi -i takes it (where a
    # remedy acts on that GPU alone); "" for a finding about no one GPU.
    gpu: str = ""

    @property
    def fix(self) -> str:
        """The remedy in words, and the next one if it does not help."""
        text = REMEDY_TEXT[self.remedy]
        if self.if_it_persists is not None:
            text += f"; if it persists: {REMEDY_TEXT[self.if_it_persists]}"
        return text

    def detail(self) -> dict[str, str]:
        """The fields a drift finding carries besides its own five."""
        detail = {
            "failure_class": self.failure_class,
            "evidence": self.evidence,
            "confidence": self.confidence.value,
            "remedy": self.remedy.value,
        }
        if self.gpu:
            detail["gpu"] = self.gpu
        return detail


def gpu_subject(gpu: dict[str, Any]) -> str:
    """How a finding names a GPU: its index, bus id and serial where the driver gave them."""
    parts = [f"GPU {gpu.get('index')}"]
    if gpu.get("pci_bus_id"):
        parts.append(f"bus {gpu['pci_bus_id']}")
    if gpu.get("serial"):
        parts.append(f"serial {gpu['serial']}")
    return ", ".join(parts)


def gpu_bus_id(bus_id: object) -> str:
    """A GPU's PCI bus id as nvidia-smi -i takes it (``00000000:18:00.0``), from the forms
    the driver and the kernel log write it in (``0000:18:00``, ``18:00.0``); "" for one that
    is none of them."""
    match = re.fullmatch(
        r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?",
        str(bus_id or "").strip(),
    )
    if not match:
        return ""
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):08X}:{int(bus, 16):02X}:{int(device, 16):02X}.{function or 0}"

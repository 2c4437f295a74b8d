"""A GPU's PCIe link below what the GPU can do: fewer lanes, or a lower generation while busy.

The width is judged at any time: a link trains its width once, at boot or reset, and a
narrower one is a seating, riser or slot fault. The generation is judged only on a busy GPU:
an idle GPU lowers its link generation to save power, by design, so a lower generation is
no fault unless the GPU works (utilization above 0 and no "GPU idle" clocks event reason).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpunode.health.catalogue import FAILURE_CLASSES, Confidence
from gpunode.health.finding import HealthFinding, gpu_subject

WIDTH = FAILURE_CLASSES["pcie.width_degraded"]
GENERATION = FAILURE_CLASSES["pcie.generation_degraded"]


def _busy(gpu: dict[str, Any]) -> bool:
    reasons = gpu.get("clock_event_reasons")
    utilization = (gpu.get("utilization_percent") or {}).get("gpu")
    return reasons is not None and "gpu_idle" not in reasons and bool(utilization)


def judge(report: dict[str, Any]) -> Iterator[HealthFinding]:
    for gpu in report.get("gpus") or []:
        if gpu.get("lost"):
            continue  # its one finding is gpu.lost
        label, subject = str(gpu.get("index")), gpu_subject(gpu)
        pcie = gpu.get("pcie") or {}
        width, width_max = pcie.get("width_current"), pcie.get("width_max")
        if width and width_max and width < width_max:
            yield HealthFinding(
                id=f"gpu.pcie_width:{label}", severity=WIDTH.severity, expected=f"x{width_max}",
                found=f"x{width} (max x{width_max})", failure_class=WIDTH.name,
                evidence=f"{subject}: PCIe link width x{width}, the GPU's maximum x{width_max}",
                confidence=Confidence.REPORTED, remedy=WIDTH.remedy,
                if_it_persists=WIDTH.if_it_persists,
            )  # fmt: skip
        generation, generation_max = pcie.get("gen_current"), pcie.get("gen_max")
        if generation and generation_max and generation < generation_max and _busy(gpu):
            utilization = (gpu.get("utilization_percent") or {}).get("gpu")
            yield HealthFinding(
                id=f"gpu.pcie_generation:{label}", severity=GENERATION.severity,
                expected=f"PCIe Gen {generation_max} while busy",
                found=f"Gen {generation} (max Gen {generation_max})",
                failure_class=GENERATION.name,
                evidence=f"{subject}: PCIe Gen {generation} of {generation_max} at {utilization}% "
                "utilization, not idle",
                confidence=Confidence.INFERRED, remedy=GENERATION.remedy,
            )  # fmt: skip

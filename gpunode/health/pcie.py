"""A GPU's PCIe link below what the GPU can do: fewer lanes, or a lower generation while busy.

The width is judged against the GPU's maximum (NVML's: possible with this device and system)
and against the other GPUs of its model on the node: one narrower than its siblings is a
seating, riser or slot fault (warning); every GPU of the model at the same narrower width is
the platform's way (three real captures in tests/fixtures, idle A10G, T4 and RTX 2070s, show
x8 of x16), worth knowing only (info). The generation is judged only on a busy GPU:
an idle GPU lowers its link generation to save power, by design, so a lower generation is
no fault unless the GPU works (utilization above 0 and no "GPU idle" clocks event reason).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpunode.health.catalogue import FAILURE_CLASSES, Confidence, Remedy, Severity
from gpunode.health.finding import HealthFinding, gpu_subject

WIDTH = FAILURE_CLASSES["pcie.width_degraded"]
GENERATION = FAILURE_CLASSES["pcie.generation_degraded"]


def _busy(gpu: dict[str, Any]) -> bool:
    reasons = gpu.get("clock_event_reasons")
    utilization = (gpu.get("utilization_percent") or {}).get("gpu")
    return reasons is not None and "gpu_idle" not in reasons and bool(utilization)


def _widest(gpus: list[dict[str, Any]]) -> dict[Any, int]:
    """The widest link among the GPUs of each model (name) on the node."""
    widest: dict[Any, int] = {}
    for gpu in gpus:
        width = (gpu.get("pcie") or {}).get("width_current")
        if isinstance(width, int):
            widest[gpu.get("name")] = max(widest.get(gpu.get("name"), 0), width)
    return widest


def _width(gpu: dict[str, Any], widest: dict[Any, int]) -> Iterator[HealthFinding]:
    label, subject = str(gpu.get("index")), gpu_subject(gpu)
    pcie = gpu.get("pcie") or {}
    width, width_max = pcie.get("width_current"), pcie.get("width_max")
    if not (width and width_max and width < width_max):
        return
    siblings = widest.get(gpu.get("name"), width)
    evidence = f"{subject}: PCIe link width x{width}, the GPU's maximum x{width_max}"
    if width < siblings:
        yield HealthFinding(
            id=f"gpu.pcie_width:{label}", severity=WIDTH.severity, expected=f"x{width_max}",
            found=f"x{width} (max x{width_max})", failure_class=WIDTH.name,
            evidence=f"{evidence}; other GPUs of its model at x{siblings}",
            confidence=Confidence.REPORTED, remedy=WIDTH.remedy,
            if_it_persists=WIDTH.if_it_persists,
        )  # fmt: skip
    else:
        yield HealthFinding(
            id=f"gpu.pcie_width:{label}", severity=Severity.INFO, expected=f"x{width_max}",
            found=f"x{width} (max x{width_max}), as every GPU of its model here",
            failure_class=WIDTH.name,
            evidence=f"{evidence}; no GPU of its model here is wider",
            confidence=Confidence.INFERRED, remedy=Remedy.NONE, if_it_persists=WIDTH.remedy,
        )  # fmt: skip


def judge(report: dict[str, Any]) -> Iterator[HealthFinding]:
    gpus = [gpu for gpu in report.get("gpus") or [] if not gpu.get("lost")]
    widest = _widest(gpus)
    for gpu in gpus:  # a lost GPU's one finding is gpu.lost
        label, subject = str(gpu.get("index")), gpu_subject(gpu)
        pcie = gpu.get("pcie") or {}
        yield from _width(gpu, widest)
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

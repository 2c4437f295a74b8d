"""Clocks held down by the hardware or the driver's thermal protection, and a GPU at or over
its own slowdown temperature.

NVML's clocks event reasons (nvidia-smi's "Clocks Event Reasons", formerly throttle reasons):
idle, the application's clocks, the power cap, sync boost and display clocks are no fault;
HW slowdown, HW thermal slowdown, HW power brake slowdown and SW thermal slowdown are the
hardware protecting itself (heat, an external power brake, power draw too high). The
temperature is judged against the GPU's own slowdown threshold (nvidia-smi's "GPU Slowdown
Temp"; driver 590's T.Limit headroom against its "GPU Slowdown T.Limit Temp"), never a fixed
number: each board has its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpunode.health.catalogue import FAILURE_CLASSES, SLOWDOWN_REASONS, Confidence
from gpunode.health.finding import HealthFinding, gpu_subject

SLOWDOWN = FAILURE_CLASSES["clocks.slowdown"]
HOT = FAILURE_CLASSES["temperature.slowdown"]


def _tlimit(gpu: dict[str, Any], label: str, subject: str) -> Iterator[HealthFinding]:
    """Driver 590 gives temperatures as T.Limit headroom (degrees left before the GPU's
    limit; "GPU Slowdown T.Limit Temp", e.g. -2 C, the headroom at which slowdown begins)."""
    tlimit = gpu.get("temperature_tlimit_c") or {}
    headroom, slowdown = tlimit.get("current"), tlimit.get("slowdown")
    if headroom is None or slowdown is None or headroom > slowdown:
        return
    yield HealthFinding(
        id=f"gpu.temperature:{label}", severity=HOT.severity,
        expected=f"T.Limit headroom above the slowdown's {slowdown} C",
        found=f"T.Limit headroom {headroom} C", failure_class=HOT.name,
        evidence=f"{subject}: GPU T.Limit Temp {headroom} C, its Slowdown T.Limit Temp "
        f"{slowdown} C", confidence=Confidence.REPORTED, remedy=HOT.remedy,
        if_it_persists=HOT.if_it_persists,
    )  # fmt: skip


def judge(report: dict[str, Any]) -> Iterator[HealthFinding]:
    for gpu in report.get("gpus") or []:
        if gpu.get("lost"):
            continue
        label, subject = str(gpu.get("index")), gpu_subject(gpu)
        temperature = (gpu.get("temperature_c") or {}).get("gpu")
        for reason in gpu.get("clock_event_reasons") or []:
            if reason in SLOWDOWN_REASONS:
                yield HealthFinding(
                    id=f"gpu.throttle:{label}:{reason}", severity=SLOWDOWN.severity,
                    expected="no hardware or thermal slowdown", found=reason,
                    failure_class=SLOWDOWN.name,
                    evidence=f"{subject}: clocks event reason {reason} active"
                    + (f" at {temperature} C" if temperature is not None else ""),
                    confidence=Confidence.REPORTED, remedy=SLOWDOWN.remedy,
                )  # fmt: skip
        yield from _tlimit(gpu, label, subject)
        threshold = gpu.get("temperature_slowdown_c")
        if temperature is not None and threshold and temperature >= threshold:
            yield HealthFinding(
                id=f"gpu.temperature:{label}", severity=HOT.severity,
                expected=f"below the GPU's slowdown temperature {threshold} C",
                found=f"{temperature} C", failure_class=HOT.name,
                evidence=f"{subject}: {temperature} C, its slowdown threshold {threshold} C",
                confidence=Confidence.REPORTED, remedy=HOT.remedy,
                if_it_persists=HOT.if_it_persists,
            )  # fmt: skip

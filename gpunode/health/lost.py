"""A GPU that is lost: it answers no query, or the driver cannot open it at all.

Read from the GPU records (``lost``: every value "GPU is lost", or "Unknown Error" without
even a UUID or serial; NVML's GPU_IS_LOST), from the GPUs nvidia-smi names as unreachable
("Unable to determine the device handle for GPU ...", or its exit status 15) and from XID 79
("GPU has fallen off the bus") in the kernel log, which makes it the driver's own word.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpunode.health.catalogue import FAILURE_CLASSES, Confidence
from gpunode.health.finding import HealthFinding, gpu_subject
from gpunode.probe.gpu_record import bus_key

FALLEN_OFF_THE_BUS = 79
LOST = FAILURE_CLASSES["gpu.lost"]


def _xid79_by_bus(report: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    events = (report.get("xid_events") or {}).get("events") or []
    return {
        bus_key(event.get("pci")): event
        for event in events
        if event.get("xid") == FALLEN_OFF_THE_BUS and bus_key(event.get("pci")) is not None
    }


def _finding(subject: str, key: str, evidence: str, xid79: dict[str, Any] | None) -> HealthFinding:
    confidence = Confidence.INFERRED
    if xid79 is not None:
        evidence += f"; kernel log: XID 79 at {xid79.get('time')}"
        confidence = Confidence.REPORTED
    return HealthFinding(
        id=f"gpu.lost:{key}", severity=LOST.severity, expected="every GPU answers",
        found=f"{subject} is lost", failure_class=LOST.name, evidence=evidence,
        confidence=confidence, remedy=LOST.remedy, if_it_persists=LOST.if_it_persists,
    )  # fmt: skip


def judge(report: dict[str, Any]) -> Iterator[HealthFinding]:
    xid79 = _xid79_by_bus(report)
    for gpu in report.get("gpus") or []:
        if gpu.get("lost"):
            evidence = str(gpu.get("lost_evidence") or "the driver says so")
            key = str(gpu.get("index"))
            yield _finding(
                gpu_subject(gpu), key, evidence, xid79.get(bus_key(gpu.get("pci_bus_id")))
            )
    for position, entry in enumerate(report.get("lost_gpus") or []):
        bus = entry.get("pci_bus_id")
        subject = f"GPU at bus {bus}" if bus else "a GPU (nvidia-smi names none)"
        evidence = f"nvidia-smi: {entry.get('message')}"
        yield _finding(subject, str(bus or f"unnamed{position}"), evidence, xid79.get(bus_key(bus)))

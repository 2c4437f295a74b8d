"""The driver's own recovery action for a GPU (NVML's nvmlDeviceGpuRecoveryAction_t; nvidia-smi's
"GPU Recovery Action"): anything but None is the driver saying what it needs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpunode.health.catalogue import FAILURE_CLASSES, RECOVERY_ACTIONS, Confidence, Remedy, Severity
from gpunode.health.finding import HealthFinding, gpu_bus_id, gpu_subject

RECOVERY = FAILURE_CLASSES["gpu.recovery_action"]


def judge(report: dict[str, Any]) -> Iterator[HealthFinding]:
    for gpu in report.get("gpus") or []:
        label, subject = str(gpu.get("index")), gpu_subject(gpu)
        value, words = gpu.get("recovery_action"), gpu.get("recovery_action_text")
        action = RECOVERY_ACTIONS.get(value) if isinstance(value, int) else None
        if action is not None and action.value == 0:
            continue
        if action is not None:
            yield HealthFinding(
                id=f"gpu.recovery_action:{label}", severity=action.severity,
                expected="no recovery action", found=f"{action.name}: {action.meaning}",
                failure_class=RECOVERY.name,
                evidence=f"{subject}: the driver's recovery action is {value} ({action.name})",
                confidence=Confidence.REPORTED, remedy=action.remedy,
                gpu=gpu_bus_id(gpu.get("pci_bus_id")),
            )  # fmt: skip
        elif value is not None or words:
            # A value or words no catalogue entry names (a newer driver): a person looks.
            yield HealthFinding(
                id=f"gpu.recovery_action:{label}", severity=Severity.WARNING,
                expected="no recovery action", found=f"unknown recovery action {words or value}",
                failure_class=RECOVERY.name,
                evidence=f"{subject}: the driver's recovery action reads {words or value}",
                confidence=Confidence.REPORTED, remedy=Remedy.DRAIN,
            )  # fmt: skip

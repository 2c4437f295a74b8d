"""NVLink links down, and a GPU not registered with the NVLink fabric.

Links (``nvidia-smi nvlink -s`` or NVML, the record's ``nvlink``): some links up and others
down on one GPU is a link of the mesh lost, whatever the inventory says (critical); every
link down ("all links are inactive") is critical where another GPU of the node has links up
(it lost its peers), and a warning on its own: a PCIe board without its bridge says the same.
Where the inventory declares the links per GPU, the drift check's ``gpu.nvlink`` judges
against that number instead (``gpunode.drift.rules``).

Fabric (NVML's nvmlGpuFabricInfo_t; nvidia-smi's ``fabric/state`` and ``fabric/status``, on
NVSwitch and GB200 systems): a GPU registers with the fabric (Not Started, In Progress,
Completed); one that has not completed, or completed with a status other than Success, has no
NVLink peers (NVIDIA's Fabric Manager user guide).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpunode.health.catalogue import FAILURE_CLASSES, Confidence, Severity
from gpunode.health.finding import HealthFinding, gpu_subject

INACTIVE = FAILURE_CLASSES["nvlink.inactive"]
FABRIC = FAILURE_CLASSES["fabric.not_registered"]
FABRIC_DONE, FABRIC_OK = "completed", "success"


def _links(gpu: dict[str, Any], peers_up: bool) -> Iterator[HealthFinding]:
    nvlink = gpu.get("nvlink") or {}
    label, subject = str(gpu.get("index")), gpu_subject(gpu)
    state, active, total = nvlink.get("state"), nvlink.get("active") or 0, nvlink.get("total")
    down = sorted(
        str(link.get("link")) for link in nvlink.get("links") or [] if link.get("active") is False
    )
    if state == "ok" and total and 0 < active < total:
        yield HealthFinding(
            id=f"gpu.nvlink_inactive:{label}", severity=INACTIVE.severity,
            expected=f"all {total} NVLinks active", found=f"{active} of {total} active",
            failure_class=INACTIVE.name,
            evidence=f"{subject}: {nvlink.get('source')}: links {', '.join(down)} inactive",
            confidence=Confidence.REPORTED, remedy=INACTIVE.remedy,
            if_it_persists=INACTIVE.if_it_persists,
        )  # fmt: skip
    elif state == "all_inactive":
        yield HealthFinding(
            id=f"gpu.nvlink_inactive:{label}",
            severity=INACTIVE.severity if peers_up else Severity.WARNING,
            expected="NVLinks active", found="all inactive", failure_class=INACTIVE.name,
            evidence=f"{subject}: {nvlink.get('source')}: all links are inactive"
            + ("; other GPUs of the node have links up" if peers_up else ""),
            confidence=Confidence.REPORTED if peers_up else Confidence.INFERRED,
            remedy=INACTIVE.remedy, if_it_persists=INACTIVE.if_it_persists,
        )  # fmt: skip


def _fabric(gpu: dict[str, Any]) -> Iterator[HealthFinding]:
    fabric = gpu.get("fabric") or {}
    state, status = fabric.get("state"), fabric.get("status")
    if not state or state.lower() in ("n/a", "not supported"):
        return  # no NVLink fabric on this system
    label, subject = str(gpu.get("index")), gpu_subject(gpu)
    done = state.lower() == FABRIC_DONE
    if done and (not status or status.lower() == FABRIC_OK):
        return
    found = f"fabric state {state}" + (f", status {status}" if status else "")
    yield HealthFinding(
        id=f"gpu.fabric:{label}", severity=FABRIC.severity,
        expected="registered with the fabric (Completed, Success)", found=found,
        failure_class=FABRIC.name, evidence=f"{subject}: {found}",
        confidence=Confidence.REPORTED, remedy=FABRIC.remedy,
        if_it_persists=FABRIC.if_it_persists,
    )  # fmt: skip


def judge(report: dict[str, Any]) -> Iterator[HealthFinding]:
    gpus = [gpu for gpu in report.get("gpus") or [] if not gpu.get("lost")]
    peers_up = any(((gpu.get("nvlink") or {}).get("active") or 0) > 0 for gpu in gpus)
    for gpu in gpus:
        yield from _links(gpu, peers_up)
        yield from _fabric(gpu)

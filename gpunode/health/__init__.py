"""GPU health: failure classes as data, and one module per class that judges a GPU report.

``catalogue`` holds what NVIDIA says each failure means and what fixes it (with source and
date); ``lost``, ``memory``, ``xid``, ``recovery``, ``nvswitch`` (SXids), ``nvlink`` (links and
fabric registration), ``nvlink_errors`` (the links' replay, recovery and CRC counters),
``pcie`` and ``clocks`` (slowdowns, temperature) each read one concern of the probe's GPU
report (``gpunode.probe.gpu_probe``) and name what they find as ``HealthFinding``s: the
failure class, the evidence (node text, cleaned again by the drift check's findings), how sure
it is and the remedy. The drift check's ``gpu_health_rules`` runs them all (``judge``), as does
``gpunode triage`` on saved outputs. ``infiniband`` judges ``ibstat``'s ports and
``infiniband_counters`` their error counters (the drift check's ``infiniband_rules`` and triage
call them).

Standard library and ``gpunode.health`` only: no drift, no pyinfra.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from gpunode.health import (
    clocks,
    lost,
    memory,
    nvlink,
    nvlink_errors,
    nvswitch,
    pcie,
    recovery,
    xid,
)
from gpunode.health.finding import HealthFinding

# Each failure class's judge, in the order its findings are listed.
JUDGES: tuple[Callable[[dict[str, Any]], Iterator[HealthFinding]], ...] = (
    lost.judge,
    memory.judge,
    recovery.judge,
    xid.judge,
    nvswitch.judge,
    nvlink.judge,
    nvlink_errors.judge,
    pcie.judge,
    clocks.judge,
)


def judge(report: dict[str, Any]) -> list[HealthFinding]:
    """Every failure class's findings on one node's GPU report (the probe's ``gpu`` section)."""
    return [finding for judge_one in JUDGES for finding in judge_one(report)]

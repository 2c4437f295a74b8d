"""InfiniBand and RoCE ports' error counters (/sys/class/infiniband/<ca>/ports/<n>/counters).

Reads ``gpunode.probe.parsers.parse_ib_counters``'s ports: per port the kernel's counters since
they were last cleared (by the driver's load or a counter reset). A counter over its limit in
``IB_COUNTER_LIMITS`` (ibqueryerrors' thresholds: 10 symbol errors and 10 link error
recoveries, any count of the others) is a link losing data or retraining, most often a cable
or transceiver (``infiniband.errors``); a ``link_downed`` count is the link having gone down
(``infiniband.link_downed``), which NVIDIA's own check fails on a single outage of 30 s. One
finding per port and class, naming each counter over its limit; the id holds no count, so a
baseline keeps it while the counts grow, and ``found`` shows them growing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpunode.health.catalogue import FAILURE_CLASSES, IB_COUNTER_LIMITS, Confidence
from gpunode.health.finding import HealthFinding

ERRORS = FAILURE_CLASSES["infiniband.errors"]
DOWNED = FAILURE_CLASSES["infiniband.link_downed"]
LINK_DOWNED = "link_downed"


def _finding(port: dict[str, Any], failure: Any, over: dict[str, int]) -> HealthFinding:
    name = f"{port.get('ca')}/{port.get('port')}"
    counts = ", ".join(f"{counter} {count}" for counter, count in over.items())
    limits = ", ".join(f"{counter} over {IB_COUNTER_LIMITS[counter]}" for counter in over)
    prefix = "ib.link_downed" if failure is DOWNED else "ib.counters"
    return HealthFinding(
        id=f"{prefix}:{name}",
        severity=failure.severity,
        expected="no link down since the counters were cleared"
        if failure is DOWNED
        else "error counters within ibqueryerrors' thresholds",
        found=counts,
        failure_class=failure.name,
        evidence=f"/sys/class/infiniband/{port.get('ca')}/ports/{port.get('port')}/counters: "
        f"{counts} ({limits})",
        confidence=Confidence.REPORTED,
        remedy=failure.remedy,
        if_it_persists=failure.if_it_persists,
    )


def judge(ports: list[dict[str, Any]]) -> Iterator[HealthFinding]:
    for port in ports:
        counters = port.get("counters") or {}
        over = {
            counter: count
            for counter, count in counters.items()
            if counter in IB_COUNTER_LIMITS
            and isinstance(count, int)
            and count > IB_COUNTER_LIMITS[counter]
        }
        if LINK_DOWNED in over:
            yield _finding(port, DOWNED, {LINK_DOWNED: over.pop(LINK_DOWNED)})
        if over:
            yield _finding(port, ERRORS, over)

"""InfiniBand and RoCE ports down, or up at a lower rate than they should be (``ibstat``).

A port is healthy Active / LinkUp; Down, Initializing, Armed, Polling, Disabled and the rest
are a cable, transceiver, adapter or switch port fault (ibstat(8)). Its rate is judged against
the inventory's declared rate where the drift check has one, else against the other ports of
the same adapter model and link layer on the node (the most common rate among those up): a
port trained at half their rate is a bad cable or transceiver (inferred). A port's rate while
it is down means nothing (ibstat prints its lowest) and is not judged.

``judge`` reads ``gpunode.probe.parsers.parse_ibstat``'s ports; the drift check's
``infiniband_rules`` hands it the InfiniBand ports with the declared rate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from gpunode.health.catalogue import FAILURE_CLASSES, Confidence
from gpunode.health.finding import HealthFinding

DOWN = FAILURE_CLASSES["infiniband.port_down"]
SLOW = FAILURE_CLASSES["infiniband.rate_degraded"]
UP = ("Active", "LinkUp")


def _is_up(port: dict[str, Any]) -> bool:
    return (port.get("state"), port.get("physical_state")) == UP


def _usual_rates(ports: list[dict[str, Any]]) -> dict[tuple[Any, Any], float]:
    """(adapter model, link layer) -> the most common rate among its ports that are up."""
    rates: dict[tuple[Any, Any], Counter[float]] = {}
    for port in ports:
        if _is_up(port) and isinstance(port.get("rate"), (int, float)):
            key = (port.get("ca_type"), port.get("link_layer"))
            rates.setdefault(key, Counter())[port["rate"]] += 1
    return {key: counter.most_common(1)[0][0] for key, counter in rates.items()}


def judge(
    ports: list[dict[str, Any]], declared_rate: float | None = None
) -> Iterator[HealthFinding]:
    """Each port's findings. Ports whose state was not read are left to the caller."""
    usual = _usual_rates(ports)
    for port in ports:
        name = f"{port.get('ca')}/{port.get('port')}"
        where = f"{port.get('link_layer') or 'unknown link layer'} port {name}"
        state, physical = port.get("state"), port.get("physical_state")
        if state is None or physical is None:
            continue
        if not _is_up(port):
            yield HealthFinding(
                id=f"ib.port:{name}", severity=DOWN.severity, expected="Active / LinkUp",
                found=f"{state} / {physical}", failure_class=DOWN.name,
                evidence=f"ibstat: {where}: State {state}, Physical state {physical}",
                confidence=Confidence.REPORTED, remedy=DOWN.remedy,
            )  # fmt: skip
            continue
        rate = port.get("rate")
        wanted = declared_rate or usual.get((port.get("ca_type"), port.get("link_layer")))
        if wanted and (rate is None or rate < wanted):
            against = "declared" if declared_rate else f"as its sibling {port.get('ca_type')} ports"
            yield HealthFinding(
                id=f"ib.rate:{name}", severity=SLOW.severity, expected=f"{wanted:g} Gb/s",
                found="rate unreadable" if rate is None else f"{rate:g} Gb/s",
                failure_class=SLOW.name,
                evidence=f"ibstat: {where}: Rate {rate}, {wanted:g} Gb/s {against}",
                confidence=Confidence.REPORTED if declared_rate else Confidence.INFERRED,
                remedy=SLOW.remedy,
            )  # fmt: skip

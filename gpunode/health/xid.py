"""XID errors from the kernel log, judged by NVIDIA's Xid catalogue, and counted over a window.

Each XID's severity and remedy come from its catalogue entry (``XID_CATALOGUE``: NVIDIA's
immediate action). XIDs NVIDIA files under "restart the application" or "ignore" are no
fault of the node on one hit; the same XID on one GPU ``XID_REPEAT`` times within its window
is (``xid.repeated``, gpunode's policy). XID 154 carries the driver's new recovery action in
its words ("GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)"), which names
the remedy. One finding per XID and GPU (``gpu.xid:XID:PCI``), with its count.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from gpunode.health.catalogue import (
    FAILURE_CLASSES,
    RECOVERY_ACTIONS,
    UNKNOWN_XID_REMEDY,
    XID_CATALOGUE,
    Confidence,
    Remedy,
    Severity,
)
from gpunode.health.finding import HealthFinding, gpu_bus_id

RECOVERY_ACTION_CHANGED = 154
# "... changed from 0x0 (None) to 0x2 (OS Reboot)": the new value, in hex.
_NEW_ACTION = re.compile(r"to 0x([0-9a-fA-F]{1,8})\b")
MESSAGE_SHOWN = 80


def event_time(text: Any) -> datetime | None:
    """An event's time as the XID parser kept it (ISO 8601, or syslog's 'Sep 09 15:53:19',
    read without a year: only differences within a window are taken)."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text)
        return moment.replace(tzinfo=None) - (moment.utcoffset() or timedelta())
    except ValueError:
        pass
    try:
        return datetime.strptime(" ".join(text.split()), "%b %d %H:%M:%S")
    except ValueError:
        return None


def most_in_window(times: list[datetime | None], hours: int) -> int:
    """The most events within any ``hours`` long window. Events without a readable time are
    counted in every window: they came from the read window, and a burst must not hide."""
    known = sorted(moment for moment in times if moment is not None)
    unknown = len(times) - len(known)
    best, start = 0, 0
    for end, moment in enumerate(known):
        while moment - known[start] > timedelta(hours=hours):
            start += 1
        best = max(best, end - start + 1)
    return best + unknown


def _recovery_from_154(events: list[dict[str, Any]]) -> tuple[Severity, Remedy, str] | None:
    for event in reversed(events):
        match = _NEW_ACTION.search(str(event.get("message") or ""))
        action = RECOVERY_ACTIONS.get(int(match[1], 16)) if match else None
        if action is not None:
            return action.severity, action.remedy, f"recovery action now {action.name}"
    return None


def _group(report: dict[str, Any]) -> dict[tuple[Any, Any], list[dict[str, Any]]]:
    groups: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for event in (report.get("xid_events") or {}).get("events") or []:
        groups.setdefault((event.get("xid"), event.get("pci")), []).append(event)
    return groups


def judge(report: dict[str, Any]) -> Iterator[HealthFinding]:
    for (number, pci), events in _group(report).items():
        last = events[-1]
        count = len(events)
        shown = str(last.get("message") or "")[:MESSAGE_SHOWN]
        when = f" at {last['time']}" if last.get("time") else ""  # a log line without a time
        found = f"XID {number}{when}" + (f" ({count} times)" if count > 1 else "")
        found += f": {shown}"
        evidence = f"kernel log, PCI {pci}: {count} XID {number} events, last: {shown}"
        entry = XID_CATALOGUE.get(number) if isinstance(number, int) else None
        failure = FAILURE_CLASSES["xid"]
        if entry is None:
            # An XID the catalogue does not know (a newer driver) or a line not read whole.
            yield HealthFinding(
                id=f"gpu.xid:{number}:{pci}", severity=Severity.WARNING, expected="no XID errors",
                found=found, failure_class=failure.name, evidence=evidence,
                confidence=Confidence.REPORTED, remedy=UNKNOWN_XID_REMEDY,
            )  # fmt: skip
            continue
        severity, remedy, then = entry.severity, entry.remedy, entry.if_it_persists
        failure_class = failure.name
        if number == RECOVERY_ACTION_CHANGED and (action := _recovery_from_154(events)):
            severity, remedy, words = action
            found += f" ({words})"
        repeat = entry.repeat
        if repeat is not None:
            most = most_in_window([event_time(event.get("time")) for event in events],
                                  repeat.window_hours)  # fmt: skip
            if most >= repeat.count:
                severity = max(severity, Severity.WARNING, key=_rank)
                remedy, then = repeat.remedy, FAILURE_CLASSES["xid.repeated"].if_it_persists
                failure_class = "xid.repeated"
                found += f" ({most} within {repeat.window_hours} h, at least {repeat.count})"
        yield HealthFinding(
            id=f"gpu.xid:{number}:{pci}", severity=severity, expected="no XID errors",
            found=found, failure_class=failure_class,
            evidence=f"{evidence}; NVIDIA: {entry.mnemonic}, {entry.bucket}",
            confidence=Confidence.REPORTED, remedy=remedy, if_it_persists=then,
            gpu=gpu_bus_id(pci),
        )  # fmt: skip


def _rank(severity: Severity) -> int:
    """Higher is worse, for max()."""
    return {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}[severity]

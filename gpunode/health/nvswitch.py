"""NVSwitch errors (SXids) from the kernel log, as the nvidia-nvswitch driver prints them.

NVIDIA documents SXids in its Fabric Manager user guide; each SXid line says whether it is
Fatal or Non-fatal. A fatal SXid is critical, its remedy a reboot (the fabric's GPUs and
NVSwitches reset together: gpunode's reading, see ``catalogue.FABRIC_MANAGER_URL``); a
non-fatal one is informational. The
same non-fatal SXid on one NVSwitch ``SXID_REPEAT`` times within its window is gpunode's
warning, as for XIDs. Lines that say neither (the detail line that follows an error) are
kept as the evidence of the error they follow and judged as no error of their own.
One finding per SXid and NVSwitch (``nvswitch.sxid:SXID:PCI``), with its count.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpunode.health.catalogue import FAILURE_CLASSES, SXID_REPEAT, Confidence
from gpunode.health.finding import HealthFinding
from gpunode.health.xid import MESSAGE_SHOWN, event_time, most_in_window

FATAL = FAILURE_CLASSES["nvswitch.sxid_fatal"]
NON_FATAL = FAILURE_CLASSES["nvswitch.sxid_non_fatal"]
REPEATED = FAILURE_CLASSES["nvswitch.sxid_repeated"]


def judge(report: dict[str, Any]) -> Iterator[HealthFinding]:
    groups: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for event in (report.get("xid_events") or {}).get("sxid_events") or []:
        if event.get("fatal") is not None:
            groups.setdefault((event.get("sxid"), event.get("pci")), []).append(event)
    for (number, pci), events in groups.items():
        last, count = events[-1], len(events)
        fatal = any(event.get("fatal") for event in events)
        shown = str(last.get("message") or "")[:MESSAGE_SHOWN]
        kind = "Fatal" if fatal else "Non-fatal"
        when = f" at {last['time']}" if last.get("time") else ""
        found = f"SXid {number} ({kind}){when}"
        found += (f" ({count} times)" if count > 1 else "") + f": {shown}"
        failure = FATAL if fatal else NON_FATAL
        if not fatal:
            times = [event_time(event.get("time")) for event in events]
            most = most_in_window(times, SXID_REPEAT.window_hours)
            if most >= SXID_REPEAT.count:
                failure = REPEATED
                found += f" ({most} within {SXID_REPEAT.window_hours} h, at least "
                found += f"{SXID_REPEAT.count})"
        yield HealthFinding(
            id=f"nvswitch.sxid:{number}:{pci}", severity=failure.severity,
            expected="no NVSwitch errors", found=found, failure_class=failure.name,
            evidence=f"kernel log, NVSwitch {last.get('switch')} (PCI {pci}): {count} SXid "
            f"{number} events, last: {shown}",
            confidence=Confidence.REPORTED, remedy=failure.remedy,
            if_it_persists=failure.if_it_persists,
        )  # fmt: skip

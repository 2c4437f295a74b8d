"""A node program on a schedule: a oneshot service and its timer, in place or gone.

What the audits (AIDE's check, ClamAV's scan) and the GPU metrics share: the two unit
files under /etc/systemd/system, systemd reloaded when either changed (or systemd has not
loaded the files it has), the timer enabled and running; or both files removed when the
setting is off.
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.operations import files, systemd

from facts.freshness import UnitsNeedDaemonReload

UNIT_DIR = "/etc/systemd/system"


def unit_paths(unit: str) -> tuple[str, str]:
    """The service's and the timer's file of ``unit`` (a name without suffix)."""
    return f"{UNIT_DIR}/{unit}.service", f"{UNIT_DIR}/{unit}.timer"


def scheduled_unit(unit: str, service_text: str, timer_text: str) -> None:
    """``unit``.service and ``unit``.timer with these texts; the timer enabled and running."""
    service_path, timer_path = unit_paths(unit)
    service = files.put(name=f"{unit}.service", src=StringIO(service_text), dest=service_path)
    timer = files.put(name=f"{unit}.timer", src=StringIO(timer_text), dest=timer_path)
    unloaded = host.get_fact(UnitsNeedDaemonReload, units=[f"{unit}.service", f"{unit}.timer"])
    systemd.daemon_reload(
        name="Reload systemd after a unit change",
        _if=lambda: service.did_change() or timer.did_change() or unloaded,
    )
    systemd.service(
        name=f"{unit}.timer enabled and running",
        service=f"{unit}.timer",
        running=True,
        enabled=True,
    )


def no_scheduled_unit(unit: str, what: str) -> None:
    """Neither file of ``unit`` (``what`` names it in the operations)."""
    service_path, timer_path = unit_paths(unit)
    timer = files.file(name=f"No {what} timer", path=timer_path, present=False)
    files.file(name=f"No {what} service", path=service_path, present=False)
    systemd.daemon_reload(name="Reload systemd after removing units", _if=timer.did_change)

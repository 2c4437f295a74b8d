"""A systemd timer of gpunode's on the inventory's schedule: the audits' shared shape; the
nightly drift check's memory ceiling."""

from __future__ import annotations

# The nightly drift check's memory ceiling (its unit's MemoryMax=: "the absolute limit on
# memory usage", past which the kernel's OOM killer acts inside the unit; systemd.resource-
# control(5), unix.com/man-page/linux/5/systemd.resource-control, read 2026-12-07): a check
# gone wrong stops there, never takes the control host with it. What a run holds is each
# host's answer while it is read, at most gpunode.drift.gather.HOST_LIMITS' 8 MiB, for all
# the hosts read at once (64), plus one host's decoding and parsing at a time (gevent runs
# one at a time): bench/drift_memory.py, 64 hosts on 2 test nodes (2026-12-07), peak RSS
# 97 MiB as they are, 209 MiB with a bad byte and 3.5 MB after it on every host, 274 MiB
# with 8 MB decoded to the widest text, 379 MiB with every host flooding past the cap. The
# bound, 100 MiB + 64 x 8 MiB + one host's ~60 MiB, is under 700 MiB: 1 GiB holds it.
DRIFT_MEMORY_MAX_MIB = 1024


def render_schedule_timer(key: str, description: str, schedule: str) -> str:
    """The timer of the setting ``key`` (named in its header), on ``schedule`` (a systemd
    calendar event, checked by the model), up to 30 minutes late at random so that a fleet
    does not start at once, and run at boot where the node was off at that time."""
    return "\n".join(
        [
            f"# Managed by gpunode ({key}).",
            "[Unit]",
            f"Description={description}, on a schedule",
            "",
            "[Timer]",
            f"OnCalendar={schedule}",
            "RandomizedDelaySec=30min",
            "Persistent=true",
            "",
            "[Install]",
            "WantedBy=timers.target",
            "",
        ]
    )

"""A systemd timer of gpunode's on the inventory's schedule: the audits' shared shape."""

from __future__ import annotations


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

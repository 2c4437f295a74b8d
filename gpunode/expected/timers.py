"""A systemd timer of gpunode's on the inventory's schedule: the audits' shared shape; the
nightly drift check's memory ceiling."""

from __future__ import annotations

import posixpath

from gpunode.model import GpuMetrics

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


# The control host's drift check (deploys/drift_timer.py) writes its textfile atomically, so
# the deploy makes the textfile's directory writable by the check's group. Only a directory
# gpunode owns may be: node_exporter's textfile directory, the one gpunode's node_exporter
# role points the collector at, or a directory under one named for gpunode. Never /var/lib,
# /var/cache/apt or any other system directory.
NODE_EXPORTER_TEXTFILE_DIR = GpuMetrics().textfile_dir
GPUNODE_DIRECTORIES = ("/var/lib/gpunode/", "/var/cache/gpunode/", "/srv/gpunode/")


def drift_textfile_problem(textfile: str, group: str) -> str | None:
    """Why ``textfile``'s directory may not be made writable by ``group``; None if it may."""
    directory = posixpath.dirname(textfile)
    if directory == NODE_EXPORTER_TEXTFILE_DIR or directory.startswith(GPUNODE_DIRECTORIES):
        return None
    return (
        f"its directory {directory} would be made writable by group {group}, and only a "
        f"directory gpunode owns may be: node_exporter's textfile directory "
        f"{NODE_EXPORTER_TEXTFILE_DIR}, or one under " + ", ".join(GPUNODE_DIRECTORIES)
    )


def drift_output_dir_problem(output_dir: str, user: str) -> str | None:
    """Why the drift check's output directory may not be handed to ``user``; None if it may.

    The deploy makes the directory itself ``user``'s (mode 750): a system directory named
    there (/var/lib/apt, /var/cache/man) would change hands. Only a directory under one
    named for gpunode may be.
    """
    if output_dir.rstrip("/") + "/" not in GPUNODE_DIRECTORIES and (
        output_dir.startswith(GPUNODE_DIRECTORIES)
    ):
        return None
    return (
        f"the directory would be given to {user}, and only a directory under one gpunode "
        "owns may be: " + ", ".join(GPUNODE_DIRECTORIES)
    )

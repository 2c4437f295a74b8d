"""File integrity as gpunode sets it up on a node: AIDE's configuration, the check's units.

gpunode runs AIDE with a configuration of its own (not Debian's /etc/aide/aide.conf, whose
211 rule files hash the whole system with a dozen digests: 73 s of a test node's wall
time per run, measured 2026-12-01 with aide 0.18.3-1+deb12u5), over the paths the inventory
declares, one digest (SHA-256) and the attributes an attacker changes: permissions, owner,
group, size, inode, link count, mtime and ctime, file type (aide.conf(5), "ATTRIBUTES").
Its report is AIDE's JSON (``report_format=json``, AIDE 0.18 and later: Debian 12 ships
0.18.3, Debian 13 0.19.1; both checked on test nodes 2026-12-01). Sources: aide(1) and
aide.conf(5) of aide 0.18.3, read on a Debian 12 test node 2026-12-01.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from gpunode.expected.timers import render_schedule_timer
from gpunode.model import FileIntegrity

CONFIG = "/etc/gpunode/aide.conf"
# A symbolic link to CONFIG where other tools look for AIDE's configuration: lynis's FINT-4315
# searches aide.conf in /etc, /etc/aide and /usr/local/etc only, warns when it finds none, and
# its FINT-4316 reads the database's path from the file it found (lynis 3.0.8 and 3.1.4,
# include/tests_file_integrity). /etc/aide/aide.conf is Debian's (aide-common, which gpunode
# does not install); /etc/aide.conf is no package's in Debian 12 or 13.
CONFIG_LINK = "/etc/aide.conf"
STATE_DIR = "/var/lib/gpunode/aide"
DATABASE = f"{STATE_DIR}/aide.db"
SUMMARY = f"{STATE_DIR}/summary.json"
PROGRAM_DIR = "/usr/local/lib/gpunode-audit"
PROGRAM = f"{PROGRAM_DIR}/file_integrity.py"
UNIT = "gpunode-file-integrity"
RULE = "GpunodeIntegrity"
ATTRIBUTES = "p+u+g+s+i+n+m+c+sha256+ftype"

# Python's bytecode of gpunode's own node programs, written when they run (not watched: it
# is regenerated from the watched sources beside it).
OWN_CACHES = (
    "/usr/local/lib/gpunode-probe/__pycache__",
    "/usr/local/lib/gpunode-audit/__pycache__",
)

# A change under these is to the programs and libraries the node runs: critical (a trojaned
# binary or library), where a change elsewhere (configuration) is a warning.
SYSTEM_BINARY_PATHS = (
    "/bin/", "/sbin/", "/lib/", "/lib64/", "/usr/bin/", "/usr/sbin/", "/usr/lib/",
    "/usr/lib64/", "/usr/libexec/", "/usr/local/bin/", "/usr/local/sbin/", "/usr/local/lib/",
    "/boot/",
)  # fmt: skip


def is_system_binary(path: str) -> bool:
    return path.startswith(SYSTEM_BINARY_PATHS)


def _regex(path: str) -> str:
    """An inventory path as the regex AIDE matches from the start of a file name."""
    return re.sub(r"([.+^$()\[\]{}|?*\\])", r"\\\1", path)


def render_aide_conf(settings: FileIntegrity) -> str:
    """gpunode's AIDE configuration: its database under STATE_DIR, the declared paths."""
    lines = [
        "# Managed by gpunode (audit.file_integrity); local edits are replaced.",
        f"database_in=file:{STATE_DIR}/aide.db",
        f"database_out=file:{STATE_DIR}/aide.db.new",
        "gzip_dbout=yes",
        # report_format applies to the report_url lines after it (aide.conf(5)).
        "report_format=json",
        "report_url=stdout",
        f"{RULE} = {ATTRIBUTES}",
    ]
    lines += [f"!{_regex(path)}($|/)" for path in settings.exclude + OWN_CACHES]
    lines += [f"{_regex(path)} {RULE}" for path in settings.paths]
    return "\n".join(lines) + "\n"


def render_service() -> str:
    return "\n".join(
        [
            "# Managed by gpunode (audit.file_integrity).",
            "[Unit]",
            "Description=gpunode file integrity check (AIDE)",
            "Documentation=file:" + PROGRAM,
            "",
            "[Service]",
            "Type=oneshot",
            "Nice=19",
            "IOSchedulingClass=idle",
            f"ExecStart=/usr/bin/python3 -I {PROGRAM} --config {CONFIG} --state {STATE_DIR} check",
            "",
        ]
    )


def render_timer(schedule: str) -> str:
    return render_schedule_timer(
        "audit.file_integrity", "gpunode file integrity check (AIDE)", schedule
    )


def adopt_command(since: float, changed_before_run: Sequence[str] | None) -> str:
    """The run's last step: what changed from ``since`` on is the run's (file_integrity.py);
    a removal only in a directory not in ``changed_before_run`` (what ``changed_dirs_command``
    read when the run began; None: unknown, so no removal is the run's)."""
    command = (
        f"/usr/bin/python3 -I {PROGRAM} --config {CONFIG} --state {STATE_DIR} "
        f"adopt --since {int(since)}"
    )
    if changed_before_run is None:
        return command
    # Last: the option takes every word after it.
    return " ".join([command, "--changed-before-run", *map(shlex.quote, changed_before_run)])


def changed_dirs_command() -> str:
    """Read only, with the run's facts: the watched directories changed since the last check."""
    return f"/usr/bin/python3 -I {PROGRAM} --config {CONFIG} --state {STATE_DIR} changed-dirs"


def init_command() -> str:
    return f"/usr/bin/python3 -I {PROGRAM} --config {CONFIG} --state {STATE_DIR} init"

"""What the shared-data role reads before it changes anything: what is at each declared mount
point, and which mount units an earlier run wrote.

A mount point is only read while nothing is mounted there (the role checks /proc/self/mounts
first): listing an autofs trigger would itself mount the file system.
"""

from __future__ import annotations

import shlex
from typing import Any

from pyinfra.api import FactBase

from gpunode.expected.shared_data import MARKER, UNIT_DIRECTORY
from gpunode.sanitize import clean_text

SEPARATOR = "\t"
KINDS = ("absent", "directory", "other")


def parse_mount_points(lines: list[str]) -> dict[str, dict[str, Any]]:
    """``path<TAB>kind<TAB>entries`` lines -> {path: {"kind", "empty"}}; a line of another
    shape is skipped, and a path it would have named reads as "other" (refused), never as
    an empty directory."""
    found: dict[str, dict[str, Any]] = {}
    for line in lines:
        fields = line.split(SEPARATOR)
        if len(fields) != 3 or not fields[0].startswith("/"):
            continue
        path, kind, entries = fields
        found[path] = {
            "kind": kind if kind in KINDS else "other",
            "empty": entries == "0",
        }
    return found


class MountPointState(FactBase[dict[str, dict[str, Any]]]):
    """
    For each path: absent, a directory (and whether it is empty), or something else (a file,
    a device); symbolic links are found by ``facts.paths.SymlinkOnPath`` first.

    .. code:: python

        {"/data": {"kind": "directory", "empty": True}}
    """

    def command(self, paths: list[str]) -> str:
        # ls -A | head -n 1: one entry is enough to know the directory holds data. The paths
        # are the model's (letters, digits and ._+@-), quoted all the same.
        checks = [
            f"p={shlex.quote(path)}; "
            'if [ ! -e "$p" ] && [ ! -L "$p" ]; then printf \'%s\\tabsent\\t0\\n\' "$p"; '
            'elif [ -d "$p" ] && [ ! -L "$p" ]; then '
            'n=$(ls -A -- "$p" | head -n 1 | wc -l); printf \'%s\\tdirectory\\t%s\\n\' "$p" "$n"; '
            "else printf '%s\\tother\\t1\\n' \"$p\"; fi"
            for path in paths
        ]
        return "; ".join(checks) + "; true"

    def process(self, output: list[str]) -> dict[str, dict[str, Any]]:  # type: ignore[override]
        return parse_mount_points(list(output))

    @staticmethod
    def default() -> dict[str, dict[str, Any]]:
        return {}


def parse_managed_units(lines: list[str]) -> list[str]:
    """File names of the units gpunode's shared-data role wrote (``grep -l`` output)."""
    names = []
    for line in lines:
        path = line.strip()
        directory, _, name = path.rpartition("/")
        if directory == UNIT_DIRECTORY and name.endswith((".mount", ".automount")):
            names.append(clean_text(name))
    return sorted(set(names))


class ManagedMountUnits(FactBase[list[str]]):
    """
    The mount and automount units in /etc/systemd/system whose first line is gpunode's
    shared-data marker.

    .. code:: python

        ["data.automount", "data.mount"]
    """

    def command(self) -> str:
        marker = shlex.quote(f"^{MARKER}")
        return (
            f"grep -l -- {marker} {UNIT_DIRECTORY}/*.mount {UNIT_DIRECTORY}/*.automount "
            "2>/dev/null; true"
        )

    def process(self, output: list[str]) -> list[str]:  # type: ignore[override]
        return parse_managed_units(list(output))

    @staticmethod
    def default() -> list[str]:
        return []


# How long one network file system may take to answer statfs before it counts as hung: a hard
# NFS mount whose server is gone blocks the caller until killed (SIGKILL still ends it: the
# NFS client waits killably), so the drift check's own deadline is never at risk.
ANSWER_TIMEOUT_S = 3
MAX_NETWORK_MOUNTS = 16
NETWORK_TYPES = ("nfs", "nfs4", "lustre")
_ANSWERS = {"ok", "stale", "hung", "error"}


def parse_network_mounts(lines: list[str]) -> dict[str, Any]:
    """``path<TAB>answer[<TAB>error]`` lines -> {"state", "reason", "answers": {path: text}};
    a line of another shape is named in "problems", never read as an answer."""
    answers: dict[str, str] = {}
    problems: list[str] = []
    for line in lines:
        fields = line.split(SEPARATOR)
        if len(fields) >= 2 and fields[0].startswith("/") and fields[1] in _ANSWERS:
            detail = clean_text(fields[2])[:120] if len(fields) > 2 and fields[2] else ""
            answers[fields[0]] = fields[1] + (f": {detail}" if detail else "")
        elif line.strip():
            problems.append(f"unreadable line {clean_text(line)[:80]!r}")
    return {"state": "ok", "reason": "", "answers": answers, "problems": problems}


class NetworkMountAnswers(FactBase[dict[str, Any]]):
    """
    Whether each mounted NFS or Lustre file system answers ``stat -f`` within
    ``ANSWER_TIMEOUT_S``: ok, stale (ESTALE: the server lost the export), hung (no answer,
    killed), or error (another failure, its message).

    .. code:: python

        {"state": "ok", "reason": "", "answers": {"/datasets": "ok"}, "problems": []}
    """

    def requires_command(self) -> str:
        return "timeout"

    def command(self) -> str:
        types = "|".join(NETWORK_TYPES)
        # Mount points with an escaped character (\040 for a space) are not gpunode's (the
        # model's paths have none) and are skipped rather than unescaped.
        return (
            "n=0; while read -r src mp fstype rest; do "
            f'case "$fstype" in {types}) ;; *) continue ;; esac; '
            'case "$mp" in *\\\\*) continue ;; esac; '
            f"n=$((n + 1)); [ $n -gt {MAX_NETWORK_MOUNTS} ] && break; "
            f'err=$(timeout -s KILL {ANSWER_TIMEOUT_S} stat -f -c %T -- "$mp" 2>&1 >/dev/null); '
            "rc=$?; "
            "if [ $rc -eq 0 ]; then printf '%s\\tok\\n' \"$mp\"; "
            "elif [ $rc -eq 137 ] || [ $rc -eq 124 ]; then printf '%s\\thung\\n' \"$mp\"; "
            'else case "$err" in *[Ss]tale*) a=stale ;; *) a=error ;; esac; '
            'printf \'%s\\t%s\\t%s\\n\' "$mp" "$a" "$(printf \'%s\' "$err" | head -n 1)"; fi; '
            "done < /proc/self/mounts; true"
        )

    def process(self, output: list[str]) -> dict[str, Any]:  # type: ignore[override]
        return parse_network_mounts(list(output))

    @staticmethod
    def default() -> dict[str, Any]:
        return {"state": "ok", "reason": "", "answers": {}, "problems": []}

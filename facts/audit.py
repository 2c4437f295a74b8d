"""What the node's file integrity check (AIDE, roles.audit) last found."""

from __future__ import annotations

import re
from typing import Any

from pyinfra.api import FactBase

from gpunode import framing
from gpunode.expected.audit import CONFIG, DATABASE, SUMMARY, changed_dirs_command
from gpunode.sanitize import parse_json

PARTS = ("database", "summary")
# The summary is gpunode's own file, but node text all the same: bounded, checked field by
# field, a path of at most 4096 characters (PATH_MAX) without control characters.
MAX_SUMMARY_BYTES = 512 * 1024
MAX_ALERTS_KEPT = 200
ALERT_KINDS = ("added", "removed", "changed")
_PATH = re.compile(r"/[^\x00-\x1f\x7f]{0,4095}")
# The directories changed before a run go back to the node in the adopt step's command line,
# one argument for sh -c (Linux's MAX_ARG_STRLEN, 128 KiB): past this many characters, the
# run treats the list as unknown.
MAX_CHANGED_DIRS_CHARS = 32 * 1024
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")


def _time(value: Any) -> str | None:
    return value if isinstance(value, str) and _TIME.fullmatch(value) else None


def parse_summary(text: str) -> tuple[dict[str, Any], list[str]]:
    """summary.json -> the fields the drift rules read, and what could not be read."""
    problems: list[str] = []
    try:
        raw = parse_json(text) if text.strip() else {}
    except ValueError as not_json:
        return {}, [f"summary.json is not JSON: {str(not_json)[:80]}"]
    if not isinstance(raw, dict):
        return {}, ["summary.json is not an object"]
    alerts = []
    for index, alert in enumerate(raw.get("alerts") or []):
        if (
            isinstance(alert, dict)
            and alert.get("kind") in ALERT_KINDS
            and isinstance(alert.get("path"), str)
            and _PATH.fullmatch(alert["path"])
        ):
            alerts.append({"kind": alert["kind"], "path": alert["path"],
                           "found": _time(alert.get("found"))})  # fmt: skip
        else:
            problems.append(f"alerts[{index}]: {str(alert)[:80]!r}")
    count = raw.get("alert_count")
    explained = raw.get("last_explained")
    error = raw.get("last_error")
    summary = {
        "alerts": alerts[:MAX_ALERTS_KEPT],
        "alert_count": count if isinstance(count, int) and count >= 0 else len(alerts),
        "last_check": _time(raw.get("last_check")),
        "last_check_kind": raw.get("last_check_kind")
        if raw.get("last_check_kind") in ("check", "gpunode-run") else None,
        "initialised": _time(raw.get("initialised")),
        "explained": {str(key)[:32]: value for key, value in explained.items()
                      if isinstance(value, int)} if isinstance(explained, dict) else {},
        "last_error": str(error)[:300] if error else None,
    }  # fmt: skip
    return summary, problems[:20]


def parse_file_integrity(output: list[str]) -> dict[str, Any]:
    frame = framing.parse(output, PARTS, max_output_chars=MAX_SUMMARY_BYTES + 4096)
    database = frame.part("database")
    if database.exit_status is None:
        reason = database.problem or "no output"
        return {"state": "unreadable", "reason": reason, "database": False, "problems": []}
    summary_part = frame.part("summary")
    summary: dict[str, Any] = {}
    problems: list[str] = []
    if summary_part.exit_status == 0:
        summary, problems = parse_summary(summary_part.text)
    elif summary_part.problem:
        problems = [f"summary: {summary_part.problem}"]
    return {
        "state": "ok",
        "reason": "",
        "database": database.exit_status == 0,
        "summary": summary,
        "problems": problems,
    }


class FileIntegrityState(FactBase):
    """
    Whether AIDE's database (roles.audit) exists, and the summary of its checks.

    .. code:: python

        {"state": "ok", "database": True, "problems": [],
         "summary": {"alerts": [{"kind": "added", "path": "/usr/bin/x", "found": "..."}],
                     "alert_count": 1, "last_check": "2026-12-01T03:41:07Z",
                     "last_check_kind": "check", "explained": {"package": 3}, ...}}
    """

    def requires_command(self) -> str:
        return "aide"

    @staticmethod
    def default() -> dict[str, Any]:
        return {"state": "absent", "reason": "aide is not installed", "database": False,
                "summary": {}, "problems": []}  # fmt: skip

    def command(self) -> str:
        return framing.command(
            [
                framing.Part("database", f"[ -s {DATABASE} ] && [ -s {CONFIG} ]"),
                framing.Part("summary", f"head -c {MAX_SUMMARY_BYTES} {SUMMARY}", stderr="drop"),
            ]
        )

    def process(self, output: list[str]) -> dict[str, Any]:  # type: ignore[override]
        return parse_file_integrity(list(output))


def parse_changed_directories(output: list[str]) -> list[str] | None:
    """``changed-dirs``'s JSON -> the directories; None (unknown) for anything else: a list
    cut short, a path gpunode would not put in a command, too many characters."""
    try:
        raw = parse_json("\n".join(output))
    except ValueError:
        return None
    if not isinstance(raw, dict) or raw.get("complete") is not True:
        return None
    directories = raw.get("directories")
    if not isinstance(directories, list) or not all(
        isinstance(path, str) and _PATH.fullmatch(path) for path in directories
    ):
        return None
    if sum(len(path) + 3 for path in directories) > MAX_CHANGED_DIRS_CHARS:
        return None
    return directories


class DirectoriesChangedSinceCheck(FactBase):
    """
    The watched directories whose ctime is past AIDE's last check, read with the run's other
    facts (before it changes anything): a removal there may predate the run. None where it
    cannot be known (no program yet, too many).

    .. code:: python

        ["/etc", "/etc/apt/apt.conf.d"]
    """

    def requires_command(self) -> str:
        return "python3"

    @staticmethod
    def default() -> None:
        return None

    def command(self) -> str:
        return f"{changed_dirs_command()} 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str] | None:  # type: ignore[override]
        return parse_changed_directories(list(output))

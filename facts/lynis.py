"""What the node's last lynis audit (roles.lynis) reported: /var/log/lynis-report.dat."""

from __future__ import annotations

import re
from typing import Any

from pyinfra.api import FactBase

from gpunode import framing
from gpunode.expected.lynis import REPORT

PARTS = ("report",)
MAX_REPORT_BYTES = 2 * 1024 * 1024
MAX_ITEMS_KEPT = 300
MAX_PROBLEMS_KEPT = 20
_TEST_ID = re.compile(r"[A-Z]{2,8}(-[0-9]{4})?")  # LYNIS: its own update check
_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}")
_VERSION = re.compile(r"[0-9][0-9A-Za-z.+~-]{0,31}")
# A report line: key=value, the key a word, ``[]`` for a list (lynis's Report function).
_LINE = re.compile(r"([a-z0-9_-]{1,64})(\[\])?=(.*)")
_TEXT_CHARS = re.compile(r"[^\x20-\x7e]")
MAX_TEXT = 200


def _text(value: str) -> str:
    return _TEXT_CHARS.sub("?", value)[:MAX_TEXT]


def _item(value: str) -> dict[str, str] | None:
    """``TEST-ID|text|detail|solution|`` -> {"test", "text", "detail"}, or None."""
    fields = value.split("|")
    if not _TEST_ID.fullmatch(fields[0]):
        return None
    detail = fields[2] if len(fields) > 2 and fields[2] != "-" else ""
    return {"test": fields[0], "text": _text(fields[1] if len(fields) > 1 else ""),
            "detail": _text(detail)}  # fmt: skip


def parse_report(text: str) -> dict[str, Any]:
    """lynis-report.dat -> the fields the drift rules read, and each line it could not read.

    Keys it does not need are skipped (the report has hundreds); lines that are not
    ``key=value``, and values of the keys it reads that do not fit, are named in problems.
    """
    report: dict[str, Any] = {"hardening_index": None, "report_end": None, "report_start": None,
                              "lynis_version": None, "warnings": [], "suggestions": []}  # fmt: skip
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = _LINE.fullmatch(line)
        if match is None:
            problems.append(f"line {number}: {line[:80]!r}")
            continue
        key, listed, value = match.groups()
        if key == "hardening_index" and not listed:
            if value.isdigit() and 0 <= int(value) <= 100:
                report["hardening_index"] = int(value)
            else:
                problems.append(f"hardening_index: {value[:40]!r}")
        elif key in ("report_datetime_end", "report_datetime_start") and not listed:
            if _DATETIME.fullmatch(value):
                report["report_end" if key.endswith("end") else "report_start"] = value
            else:
                problems.append(f"{key}: {value[:40]!r}")
        elif key == "lynis_version" and not listed:
            if _VERSION.fullmatch(value):
                report["lynis_version"] = value
            else:
                problems.append(f"lynis_version: {value[:40]!r}")
        elif key in ("warning", "suggestion") and listed:
            item = _item(value)
            if item is None:
                problems.append(f"{key}[]: {value[:80]!r}")
            elif len(report[f"{key}s"]) < MAX_ITEMS_KEPT:
                report[f"{key}s"].append(item)
    return {"report": report, "problems": problems[:MAX_PROBLEMS_KEPT]}


def parse_lynis(output: list[str]) -> dict[str, Any]:
    frame = framing.parse(output, PARTS, max_output_chars=MAX_REPORT_BYTES + 4096)
    part = frame.part("report")
    if part.exit_status is None:
        return {"state": "unreadable", "reason": part.problem or "no output", "report": None,
                "problems": []}  # fmt: skip
    if part.exit_status != 0:
        return {"state": "missing", "reason": f"no {REPORT}", "report": None, "problems": []}
    parsed = parse_report(part.text)
    return {"state": "ok", "reason": "", **parsed}


class LynisReport(FactBase):
    """
    The last lynis report: hardening index, when it ended, its warnings and suggestions.

    .. code:: python

        {"state": "ok", "problems": [],
         "report": {"hardening_index": 78, "report_end": "2026-12-02 04:41:07",
                    "lynis_version": "3.0.8", "warnings": [{"test": "PKGS-7392", ...}],
                    "suggestions": [{"test": "SSH-7408", "text": "...", "detail": "..."}]}}
    """

    def requires_command(self) -> str:
        return "lynis"

    @staticmethod
    def default() -> dict[str, Any]:
        return {"state": "absent", "reason": "lynis is not installed", "report": None,
                "problems": []}  # fmt: skip

    def command(self) -> str:
        return framing.command(
            [framing.Part("report", f"head -c {MAX_REPORT_BYTES} {REPORT}", stderr="drop")]
        )

    def process(self, output: list[str]) -> dict[str, Any]:  # type: ignore[override]
        return parse_lynis(list(output))


_HOME_LINE = re.compile(r"([0-7]{3,4}) (/home/[^\x00-\x1f\x7f]{1,4000})")


def parse_home_modes(output: list[str]) -> dict[str, int]:
    """``stat -c '%a %n'`` lines -> {home directory: mode}; other lines are dropped."""
    modes: dict[str, int] = {}
    for line in output:
        match = _HOME_LINE.fullmatch(line.rstrip("\n"))
        if match and "/../" not in match.group(2) + "/":
            modes[match.group(2)] = int(match.group(1), 8)
    return modes


class LoginHomeModes(FactBase):
    """
    The mode of each home directory under /home of an account with a login shell (lynis
    HOME-9304 reads the same accounts: not /usr/sbin/nologin nor /bin/false).

    .. code:: python

        {"/home/gpuadmin": 0o750, "/home/debian": 0o755}
    """

    def command(self) -> str:
        return (
            "awk -F: '$7 !~ /(false|nologin)$/ && $6 ~ /^\\/home\\// {print $6}' /etc/passwd"
            ' | while IFS= read -r home; do [ -d "$home" ] && [ ! -L "$home" ]'
            ' && stat -c "%a %n" -- "$home"; done; true'
        )

    def process(self, output: list[str]) -> dict[str, int]:  # type: ignore[override]
        return parse_home_modes(list(output))

"""Yesterday's report as a baseline: today's findings are marked new or known."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gpunode.drift.findings import DriftResult
from gpunode.sanitize import MAX_REPORT_TEXT_CHARS, clean_text


class UnreadableBaseline(Exception):
    """The baseline file exists but is not a whole --json report."""


def _warn_on_stderr(message: str) -> None:
    print(message, file=sys.stderr)


def read_baseline(path: Path) -> set[tuple[str, str]]:
    """The (host, id) of every finding in a --json report; UnreadableBaseline says why not."""
    try:
        previous = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise UnreadableBaseline(f"not readable ({error})") from error
    except ValueError as error:
        raise UnreadableBaseline(f"not JSON, truncated or corrupted ({error})") from error
    if not isinstance(previous, dict):
        raise UnreadableBaseline(f"a JSON {type(previous).__name__}, not a report object")
    findings = previous.get("findings", [])
    if not isinstance(findings, list):
        raise UnreadableBaseline("'findings' is not a list")
    known = set()
    for position, finding in enumerate(findings):
        if not isinstance(finding, dict):
            raise UnreadableBaseline(f"finding {position} is not an object")
        host, finding_id = finding.get("host"), finding.get("id")
        if not isinstance(host, str) or not isinstance(finding_id, str):
            raise UnreadableBaseline(f"finding {position} has no string 'host' and 'id'")
        known.add((host, finding_id))
    return known


def apply_baseline(
    result: DriftResult,
    baseline_path: str | Path,
    warn: Callable[[str], None] = _warn_on_stderr,
) -> DriftResult:
    """Mark each finding 'known' if the baseline (a --json report) had the same host and id.

    A missing baseline file means the first night: everything is new. So does one that cannot
    be read (cut short by a crash, edited, not a report): ``warn`` names it, and the run goes
    on, so tomorrow's baseline replaces it.
    """
    path = Path(baseline_path)
    if not path.exists():
        return result
    try:
        known = read_baseline(path)
    except UnreadableBaseline as problem:
        message = (
            f"gpunode drift: warning: baseline {path} is unreadable: {problem}; "
            "treating it as absent (every finding is new)"
        )
        warn(clean_text(message, MAX_REPORT_TEXT_CHARS))
        return result
    result.findings = [
        replace(f, status="known" if (f.host, f.id) in known else "new") for f in result.findings
    ]
    return result

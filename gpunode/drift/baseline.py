"""Yesterday's report as a baseline: today's findings are marked new or known."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from gpunode.drift.findings import DriftResult


def apply_baseline(result: DriftResult, baseline_path: str | Path) -> DriftResult:
    """Mark each finding 'known' if the baseline (a --json report) had the same host and id.

    A missing baseline file means the first night: everything is new.
    """
    path = Path(baseline_path)
    if not path.exists():
        return result
    previous = json.loads(path.read_text())
    known = {(f["host"], f["id"]) for f in previous.get("findings", [])}
    result.findings = [
        replace(f, status="known" if (f.host, f.id) in known else "new") for f in result.findings
    ]
    return result

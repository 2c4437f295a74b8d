"""Prometheus' own checker, ``promtool``, for the metrics and rules gpunode ships.

Debian's ``prometheus`` package ships it (./dev installs it, so CI has it). A test that needs
it fails where it is missing: skipping would let CI pass without checking anything.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is not installed: apt-get install --no-install-recommends prometheus"
    return path


def check_metrics(text: str) -> subprocess.CompletedProcess[str]:
    """``promtool check metrics`` on one exposition; its lint findings are in stdout/stderr."""
    return subprocess.run(
        [promtool(), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def run(*arguments: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *map(str, arguments)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )

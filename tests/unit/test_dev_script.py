"""`./dev stop` stops the dockerd `./dev` started and nothing else, and pyproject.toml's
license is an SPDX expression that setuptools reads without a deprecation."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def dev_stop(state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / "dev"), "stop"], env={"GPUNODE_DEV_STATE": str(state), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_stop_without_anything_started_says_so(tmp_path: Path) -> None:
    done = dev_stop(tmp_path)
    assert done.returncode == 0
    assert done.stderr == "==> nothing ./dev started is running\n"


def test_stop_never_kills_a_process_that_is_not_the_dockerd_it_started(tmp_path: Path) -> None:
    """A recorded pid now taken by another process (here a sleep) is left alone; the record,
    stale, is removed. So is one that is no pid at all."""
    other = subprocess.Popen(["sleep", "300"])
    try:
        (tmp_path / "dockerd.pid").write_text(f"{other.pid}\n")
        done = dev_stop(tmp_path)
        assert done.returncode == 0, done.stderr
        assert f"dockerd ./dev started (pid {other.pid}) is no longer running" in done.stderr
        assert other.poll() is None  # still running
        assert not (tmp_path / "dockerd.pid").exists()
        (tmp_path / "dockerd.pid").write_text("1; kill 1\n")
        assert "is no longer running" in dev_stop(tmp_path).stderr
    finally:
        other.kill()
        other.wait()


def test_the_license_is_an_spdx_expression_for_a_setuptools_that_reads_one() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    (setuptools,) = [r for r in project["build-system"]["requires"] if r.startswith("setuptools")]
    minimum = re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", setuptools)
    assert minimum and int(minimum.group(1)) >= 77, setuptools  # PEP 639 support
    # What the installed metadata says (./dev installs again when pyproject.toml changes).
    assert importlib.metadata.metadata("gpunode")["License-Expression"] == "Apache-2.0"

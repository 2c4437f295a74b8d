"""bench/suite.py: per-module wall time from a run's JUnit reports, and CPU seconds from its
cpu.json (tests/tiers.py) where the run left one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def junit(path: Path, classname: str, *times: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cases = "".join(
        f'<testcase classname="{classname}" name="t{i}" time="{t}"/>' for i, t in enumerate(times)
    )
    path.write_text(f'<testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')


def report(reports: Path) -> str:
    done = subprocess.run(
        [sys.executable, "bench/suite.py", "--reports", str(reports)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_modules_are_listed_by_wall_time_with_their_cpu_where_the_run_measured_it(
    tmp_path: Path,
) -> None:
    junit(tmp_path / "unit.xml", "tests.unit.test_model", 1.5, 2.5)
    junit(tmp_path / "lab" / "test_rollout.xml", "tests.integration.test_rollout", 300, 26.5)
    junit(tmp_path / "lab" / "test_sshd.xml", "tests.integration.test_sshd", 100)
    before = report(tmp_path)
    assert "tier lab: 7.1 min in 2 modules\n" in before
    assert "   326.5       -  lab       2  tests/integration/test_rollout.py" in before
    jobs = {
        "unit": {"tier": "unit", "wall_s": 5, "tree_cpu_s": 4.0, "lab_cpu_s": 0.0},
        "lab/test_rollout": {"tier": "lab", "wall_s": 330, "tree_cpu_s": 40.2, "lab_cpu_s": 90.0},
        "lab/test_sshd": {"tier": "lab", "wall_s": 101, "tree_cpu_s": 10.0, "lab_cpu_s": 20.4},
    }
    (tmp_path / "cpu.json").write_text(json.dumps({"jobs": jobs}))
    after = report(tmp_path)
    assert "tier lab: 7.1 min in 2 modules, CPU 161 s\n" in after
    assert "tier unit: 0.1 min in 1 modules, CPU 4 s\n" in after
    assert "   326.5     130  lab       2  tests/integration/test_rollout.py" in after
    assert "   100.0      30  lab       1  tests/integration/test_sshd.py" in after
    assert "     4.0       -  unit      2  tests/unit/test_model.py" in after
    # a cpu.json the run broke off in is no CPU column, not a crash
    (tmp_path / "cpu.json").write_text('{"jobs": {"unit": {')
    assert report(tmp_path) == before

"""tests/tiers.py: `./dev test`'s tiers run at once, apart, and say where the time went."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import tiers


def test_the_vm_tier_has_a_lab_of_its_own_beside_the_session_lab() -> None:
    env = tiers.tier_environment(
        "vm",
        {"GPUNODE_LAB_DIR": "/srv/x/.lab", "GPUNODE_LAB_NAME": "mine", "GPUNODE_LAB_SUBNET": "7"},
    )
    assert (env["GPUNODE_LAB_DIR"], env["GPUNODE_LAB_NAME"], env["GPUNODE_LAB_SUBNET"]) == (
        "/srv/x/.lab-vm",
        "mine-vm",
        "8",
    )
    defaults = tiers.tier_environment("vm", {})
    assert defaults["GPUNODE_LAB_DIR"] == str(tiers.ROOT / ".lab-vm")
    assert defaults["GPUNODE_LAB_NAME"] == "gpunode-lab-vm"
    assert defaults["GPUNODE_LAB_SUBNET"] == "1"


@pytest.mark.parametrize("tier", ["unit", "lab"])
def test_the_other_tiers_use_the_session_lab_as_it_is(tier: str) -> None:
    given = {"GPUNODE_LAB_NAME": "mine", "PATH": "/usr/bin"}
    assert tiers.tier_environment(tier, given) == given


def test_the_tiers_split_the_integration_tests_by_the_vm_marker_and_miss_none() -> None:
    lab, vm = tiers.TIERS["lab"], tiers.TIERS["vm"]
    assert lab[0] == vm[0] == "tests/integration"
    assert lab[lab.index("-m") + 1] == "not " + vm[vm.index("-m") + 1]
    assert tiers.TIERS["unit"] == ["tests/unit"]


@pytest.mark.parametrize(
    ("seconds", "shown"), [(0, "0s"), (42.4, "42s"), (59.6, "1m00s"), (95.3, "1m35s")]
)
def test_seconds_read_as_minutes_and_seconds(seconds: float, shown: str) -> None:
    assert tiers.format_seconds(seconds) == shown


def test_the_time_line_names_each_part_and_the_total() -> None:
    def finished(name: str, seconds: float) -> tiers.TierRun:
        run = tiers.TierRun(name, subprocess.Popen(["true"]), started=100.0, log=None)
        run.process.wait()
        run.ended = 100.0 + seconds
        return run

    runs = [finished("unit", 250), finished("lab", 1800), finished("vm", 1000)]
    assert tiers.time_line(runs, setup_s=61, lint_s=40, total_s=1901) == (
        "time: setup 1m01s, lint 40s, unit 4m10s, lab 30m00s, vm 16m40s (at once), total 31m41s"
    )
    assert tiers.time_line(runs[:1], 0, 0, 250) == "time: unit 4m10s, total 4m10s"


def test_an_unknown_tier_is_refused_by_name() -> None:
    done = subprocess.run(
        [sys.executable, str(Path(tiers.__file__)), "units"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "no tier units: the tiers are unit, lab, vm" in done.stderr


def test_a_failed_tier_fails_the_run_and_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two tiers at once, one failing: the run fails, both logs are printed whole, and the
    failed tier is named (stand-in tiers: a pytest run of one tiny test file each)."""
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    assert True\n")
    (tmp_path / "test_bad.py").write_text("def test_bad():\n    assert 1 == 2\n")
    monkeypatch.setattr(tiers, "ROOT", tmp_path)
    monkeypatch.setattr(tiers, "REPORTS", tmp_path / "reports")
    monkeypatch.setattr(
        tiers,
        "TIERS",
        {"good": [str(tmp_path / "test_ok.py")], "bad": [str(tmp_path / "test_bad.py")]},
    )
    extra = ["-p", "no:cacheprovider", "-o", "addopts="]
    assert tiers.run(["good", "bad"], extra, setup_s=0, lint_s=0) == 1
    out = capsys.readouterr().out
    assert "tier good: passed (pytest exit 0)" in out
    assert "tier bad: FAILED (pytest exit 1)" in out
    assert "failed tiers: bad" in out
    assert "assert 1 == 2" in out  # the failing tier's log, printed
    assert (tmp_path / "reports" / "bad.xml").is_file()
    assert out.splitlines()[-3].startswith("time: good ")
    assert out.splitlines()[-2].startswith("CPU busy ")


def test_cpu_busy_share_is_read_from_proc_stat() -> None:
    # user nice system idle iowait irq softirq steal: 600 busy of 1000, then 900 of 2000
    before = tiers.cpu_times("cpu  300 0 200 350 50 50 50 0 0 0\ncpu0 1 2 3 4\n")
    after = tiers.cpu_times("cpu  500 0 300 1000 100 50 50 0 0 0\n")
    assert before == (600, 1000) and after == (900, 2000)
    assert tiers.busy_share(before, after) == 0.3
    assert tiers.busy_share(after, after) == 0.0
    assert tiers.cpu_line(0.934, 2) == "CPU busy 93% of 2 CPUs while the tiers ran"

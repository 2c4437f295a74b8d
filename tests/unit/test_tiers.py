"""tests/tiers.py: `./dev test`'s tiers run at once, on labs of their own, the lab tier's
modules spread over several labs, and the run says where the time went."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import tiers

# A stand-in tier's job: pytest on one tiny test file, alone (no cache, no project addopts).
PYTEST_ALONE = ["-p", "no:cacheprovider", "-o", "addopts="]


def stand_in_job(tier: str, path: Path, name: str) -> tiers.Job:
    return tiers.Job(tier, [str(path), *PYTEST_ALONE], name)


def reports_under(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The runner's checkout and reports are ``tmp_path``'s."""
    monkeypatch.setattr(tiers, "ROOT", tmp_path)
    monkeypatch.setattr(tiers, "REPORTS", tmp_path / "reports")


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


def test_each_lab_shard_but_the_first_has_a_lab_of_its_own() -> None:
    given = {"GPUNODE_LAB_NAME": "mine", "GPUNODE_LAB_SUBNET": "3", "PATH": "/usr/bin"}
    assert tiers.tier_environment("lab", given, shard=0) == given
    second = tiers.tier_environment("lab", given, shard=1)
    third = tiers.tier_environment("lab", given, shard=2)
    assert (second["GPUNODE_LAB_NAME"], second["GPUNODE_LAB_SUBNET"]) == ("mine-shard1", "13")
    assert (third["GPUNODE_LAB_NAME"], third["GPUNODE_LAB_SUBNET"]) == ("mine-shard2", "23")
    assert second["GPUNODE_LAB_DIR"] == str(tiers.ROOT / ".lab-shard1")
    # No two labs' subnets meet, the shards' modules' own labs (+100..+104) included (the
    # VM tier's modules make none).
    shards = [3 + tiers.SHARD_SUBNET_STEP * shard for shard in range(8)]
    taken = [subnet + offset for subnet in shards for offset in (0, 100, 101, 102, 103, 104)]
    taken.append(3 + tiers.VM_SUBNET_OFFSET)
    assert len(taken) == len(set(taken)) and max(taken) < 256


def test_the_unit_tier_uses_the_environment_as_it_is() -> None:
    given = {"GPUNODE_LAB_NAME": "mine", "PATH": "/usr/bin"}
    assert tiers.tier_environment("unit", given) == given


def test_the_tiers_split_the_integration_tests_by_the_vm_marker_and_miss_none() -> None:
    lab, vm = tiers.TIERS["lab"], tiers.TIERS["vm"]
    assert lab[0] == vm[0] == "tests/integration"
    assert lab[lab.index("-m") + 1] == "not " + vm[vm.index("-m") + 1]
    assert tiers.TIERS["unit"] == ["tests/unit"]


def test_the_lab_queue_starts_with_the_longest_modules_and_untimed_ones_first() -> None:
    modules = ["a.py", "b.py", "c.py", "new.py"]
    seconds = {"a.py": 10.0, "b.py": 300.0, "c.py": 45.0}
    assert tiers.queue_order(modules, seconds, seed=None) == ["new.py", "b.py", "c.py", "a.py"]
    shuffled = tiers.queue_order(modules, seconds, seed=11)
    assert sorted(shuffled) == sorted(modules)
    assert shuffled == tiers.queue_order(modules, {}, seed=11)


def test_recorded_seconds_are_read_and_a_bad_file_is_no_record(tmp_path: Path) -> None:
    path = tmp_path / "module_seconds.json"
    path.write_text(json.dumps({"modules": {"tests/x.py": 12.5, "tests/y.py": "slow"}}))
    assert tiers.recorded_seconds(path) == {"tests/x.py": 12.5}
    path.write_text("{not json")
    assert tiers.recorded_seconds(path) == {}
    assert tiers.recorded_seconds(tmp_path / "absent.json") == {}


@pytest.mark.parametrize("value", ["0", "9", "two", "-1"])
def test_a_bad_number_of_labs_is_refused_by_name(value: str) -> None:
    with pytest.raises(SystemExit, match=f"GPUNODE_TEST_LAB_SHARDS='{value}'"):
        tiers.shards_wanted({tiers.LAB_SHARDS: value})
    assert tiers.shards_wanted({}) == tiers.DEFAULT_LAB_SHARDS


@pytest.mark.parametrize(
    ("seconds", "shown"), [(0, "0s"), (42.4, "42s"), (59.6, "1m00s"), (95.3, "1m35s")]
)
def test_seconds_read_as_minutes_and_seconds(seconds: float, shown: str) -> None:
    assert tiers.format_seconds(seconds) == shown


def test_the_time_line_names_each_part_and_the_total() -> None:
    def finished(name: str, seconds: float, jobs: int = 1, workers: int = 1) -> tiers.TierRun:
        run = tiers.TierRun(name, [tiers.Job(name, [], name)] * jobs, workers=workers)
        run.started, run.ended = 100.0, 100.0 + seconds
        return run

    runs = [finished("unit", 250), finished("lab", 1500, jobs=27, workers=2), finished("vm", 1000)]
    assert tiers.time_line(runs, setup_s=61, lint_s=40, total_s=1601) == (
        "time: setup 1m01s, lint 40s, unit 4m10s, lab 25m00s (27 modules on 2 labs), "
        "vm 16m40s (tiers at once), total 26m41s"
    )
    assert tiers.time_line(runs[:1], None, None, 250) == "time: unit 4m10s, total 4m10s"
    # ./dev timed them: shown, a warm set-up's 0 s too
    assert tiers.time_line(runs[:1], 0, 1, 251) == (
        "time: setup 0s, lint 1s, unit 4m10s, total 4m11s"
    )


def test_cpu_busy_share_is_read_from_proc_stat() -> None:
    # user nice system idle iowait irq softirq steal: 600 busy of 1000, then 900 of 2000
    before = tiers.cpu_times("cpu  300 0 200 350 50 50 50 0 0 0\ncpu0 1 2 3 4\n")
    after = tiers.cpu_times("cpu  500 0 300 1000 100 50 50 0 0 0\n")
    assert before == (600, 1000) and after == (900, 2000)
    assert tiers.busy_share(before, after) == 0.3
    assert tiers.busy_share(after, after) == 0.0
    assert tiers.cpu_line(0.934, 2) == "CPU busy 93% of 2 CPUs while the tiers ran"


def test_an_unknown_tier_is_refused_by_name() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.tiers", "units"],
        cwd=tiers.ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "no tier units: the tiers are unit, lab, vm" in done.stderr


def test_a_failed_job_fails_its_tier_and_the_run_and_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two tiers at once, one of them two modules on two workers, one module failing: the run
    fails, every log is printed whole, and the failed module is named (stand-in tiers: tiny
    test files, pytest run on each for real)."""
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    assert True\n")
    (tmp_path / "test_also_ok.py").write_text("def test_also():\n    assert 2 == 2\n")
    (tmp_path / "test_bad.py").write_text("def test_bad():\n    assert 1 == 2\n")
    reports_under(monkeypatch, tmp_path)
    good = tiers.TierRun("good", [stand_in_job("good", tmp_path / "test_ok.py", "good")])
    modules = tiers.TierRun(
        "lab",
        [
            stand_in_job("lab", tmp_path / name, f"lab/{name[:-3]}")
            for name in ("test_bad.py", "test_also_ok.py")
        ],
        workers=2,
    )
    tiers.execute([good, modules], tiers.Runner(to_log=True), {"PATH": "/usr/bin:/bin"})
    out = capsys.readouterr().out
    assert [job.returncode for job in modules.jobs] == [1, 0]
    assert good.jobs[0].returncode == 0 and not good.failed
    assert [job.name for job in modules.failed] == ["lab/test_bad"]
    assert "===== lab/test_bad: FAILED (1) in " in out
    assert "assert 1 == 2" in out  # the failing module's log, printed
    assert "===== good: passed in " in out
    for name in ("good", "lab/test_bad", "lab/test_also_ok"):
        assert (tmp_path / "reports" / f"{name}.xml").is_file(), name
    # The run's last lines name the failed test and repeat what pytest said of it.
    summary = tiers.failure_summary(modules.jobs[0])
    assert summary[0] == "--- lab/test_bad: pytest exit 1"
    assert summary[1].startswith("FAILURE ") and summary[1].endswith("::test_bad")
    assert any("assert 1 == 2" in line for line in summary[2:])


def test_a_job_that_wrote_no_report_is_summed_up_by_its_logs_end_with_control_characters_shown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    reports_under(monkeypatch, tmp_path)
    job = tiers.Job("vm", [], "vm", returncode=3)
    log, xml = job.paths()
    log.parent.mkdir(parents=True)
    log.write_bytes(b"".join(b"line %d\n" % n for n in range(100)) + b"the end \x1b[2J\xff\n")
    summary = tiers.failure_summary(job)
    assert summary[0] == "--- vm: pytest exit 3"
    assert summary[1].startswith("(no test report: ")
    assert summary[2:] == [f"line {n}" for n in range(61, 100)] + ["the end ?[2J\ufffd"]
    xml.write_text("<testsuites><testsuite><testcase")  # cut short
    assert tiers.failure_summary(job)[1].startswith("(no test report: ")


def test_a_jobs_cpu_is_its_whole_trees_and_its_labs_and_the_run_says_where_it_went(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A module whose test burns CPU in a child process: wait4's account of the job has it
    (pytest reaped the child); the lab it held got what the meter saw there."""
    (tmp_path / "test_busy.py").write_text(
        "import subprocess, sys\n"
        "def test_busy():\n"
        "    burn = 'import time\\nend = time.process_time() + 0.5\\n'"
        " 'while time.process_time() < end: pass\\n'\n"
        "    assert subprocess.run([sys.executable, '-c', burn]).returncode == 0\n"
    )
    reports_under(monkeypatch, tmp_path)

    class Meter:
        def __init__(self) -> None:
            self.held: list[str] = []

        def hold(self, lab: str, holder: object) -> None:
            self.held.append(lab)

        def release(self, lab: str) -> float:
            return 12.0

    meter = Meter()
    lab = tiers.TierRun("lab", [stand_in_job("lab", tmp_path / "test_busy.py", "lab/x")])
    unit = tiers.TierRun("unit", [stand_in_job("unit", tmp_path / "test_busy.py", "unit")])
    runner = tiers.Runner(to_log=True, meter=meter)  # type: ignore[arg-type]
    tiers.execute([lab, unit], runner, {"PATH": "/usr/bin:/bin", "GPUNODE_LAB_NAME": "mine"})
    job, unit_job = lab.jobs[0], unit.jobs[0]
    assert job.returncode == 0 and unit_job.returncode == 0
    assert meter.held == ["mine"]  # the lab job's lab; the unit tier has none
    assert job.tree_cpu_s >= 0.5 and unit_job.tree_cpu_s >= 0.5
    assert job.lab_cpu_s == 12.0 and unit_job.lab_cpu_s == 0.0
    assert (
        f"===== lab/x: passed in {tiers.format_seconds(job.seconds)}, CPU "
        in capsys.readouterr().out
    )
    line = tiers.cpu_by_tier_line([lab, unit], busy_s=job.cpu_s + unit_job.cpu_s + 30)
    assert line == (
        f"CPU-s: lab {job.cpu_s:.0f}, unit {unit_job.cpu_s:.0f}, other 30 "
        f"(machine busy {job.cpu_s + unit_job.cpu_s + 30:.0f})"
    )
    report = tiers.cpu_report([lab, unit], busy_s=100.0, unheld_s=3.0)
    assert report["labs_not_the_suites_cpu_s"] == 3.0
    assert report["jobs"]["lab/x"]["lab_cpu_s"] == 12.0
    assert report["jobs"]["unit"]["tree_cpu_s"] == round(unit_job.tree_cpu_s, 1)


# The scenario of the next test, run in a process of its own: tiers.execute's workers are
# threads, and a unit test before it may have left this process patched by gevent (pyinfra's
# CLI patches threads on import), where one thread waiting on its job's process blocks all.
OWN_LAB_SCENARIO = """
import json, sys
from pathlib import Path
from tests import tiers

tmp = Path(sys.argv[1])
tiers.ROOT, tiers.REPORTS = tmp, tmp / "reports"
alone = sys.argv[2] == "alone"


def job(tier, name, path):
    return tiers.Job(tier, [str(tmp / path), "-p", "no:cacheprovider", "-o", "addopts="], name)


lab = tiers.TierRun(
    "lab",
    [job("lab", "lab/test_shared", "test_shared.py"), job("lab", "lab/test_own", "test_own.py")],
    own_lab=frozenset({"lab/test_own"}),
)
runs = [lab] if alone else [lab, tiers.TierRun("unit", [job("unit", "unit", "test_ok.py")])]
env = {"PATH": "/usr/bin:/bin", "GPUNODE_LAB_NAME": "mine", "GPUNODE_LAB_SUBNET": "0"}
tiers.execute(runs, tiers.Runner(to_log=True), env)
print(json.dumps({
    "returncodes": [job.returncode for run in runs for job in run.jobs],
    "labs_used": sorted(lab.labs_used),
    "time_line": tiers.time_line([lab], None, None, 0.0),
}))
"""


def test_own_lab_modules_go_to_a_finished_tiers_worker_on_a_lab_of_its_own_or_to_a_shard(
    tmp_path: Path,
) -> None:
    """The lab tier's one shard is busy with a module that waits for the own-lab module to
    have run: the unit tier's worker, its own job done, takes the own-lab module, on a lab
    identity after the shard's. Alone, a shard takes own-lab modules once its queue is empty."""
    seen = tmp_path / "seen"
    seen.mkdir()
    (tmp_path / "test_own.py").write_text(
        "import os, pathlib\n"
        "def test_own():\n"
        f"    pathlib.Path({str(seen)!r}, 'own').write_text(os.environ['GPUNODE_LAB_NAME'])\n"
    )
    waiting = (
        "import os, pathlib, time\n"
        "def test_shared():\n"
        f"    own = pathlib.Path({str(seen)!r}, 'own')\n"
        "    end = time.monotonic() + 60\n"
        "    while not own.exists() and time.monotonic() < end:\n"
        "        time.sleep(0.05)\n"
        "    assert own.exists()\n"
        f"    pathlib.Path({str(seen)!r}, 'shared').write_text(os.environ['GPUNODE_LAB_NAME'])\n"
    )
    (tmp_path / "test_shared.py").write_text(waiting)
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    assert True\n")

    def scenario(which: str) -> dict:
        done = subprocess.run(
            [sys.executable, "-c", OWN_LAB_SCENARIO, str(tmp_path), which],
            cwd=Path(tiers.__file__).resolve().parents[1],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    helped = scenario("helped")
    assert helped["returncodes"] == [0, 0, 0], helped
    assert (seen / "shared").read_text() == "mine"
    assert (seen / "own").read_text() == "mine-shard1"
    assert helped["labs_used"] == [0, 1]
    assert "(2 modules on 2 labs)" in helped["time_line"]

    for path in seen.iterdir():
        path.unlink()
    (tmp_path / "test_shared.py").write_text(
        "import os, pathlib\n"
        "def test_shared():\n"
        f"    pathlib.Path({str(seen)!r}, 'shared').write_text(os.environ['GPUNODE_LAB_NAME'])\n"
    )
    alone = scenario("alone")
    assert alone["returncodes"] == [0, 0], alone
    assert (seen / "shared").read_text() == (seen / "own").read_text() == "mine"
    assert alone["labs_used"] == [0]

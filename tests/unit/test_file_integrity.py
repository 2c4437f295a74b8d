"""File integrity (audit.file_integrity): AIDE's configuration, the node program's
classification, the fact's parser and the drift rule."""

from __future__ import annotations

import datetime
import json
import os
import shlex
import shutil
import time
from pathlib import Path

import pytest

from facts.audit import parse_changed_directories, parse_file_integrity, parse_summary
from gpunode import framing
from gpunode.drift.findings import Severity
from gpunode.drift.rules import file_integrity_rules
from gpunode.expected.audit import OWN_CACHES, adopt_command, is_system_binary, render_aide_conf
from gpunode.model import FileIntegrity, build_desired_state
from gpunode.probe import file_integrity as program

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "aide"
NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)


def enabled(**settings: object) -> object:
    state, problems = build_desired_state(
        {"audit": {"file_integrity": {"enabled": True, **settings}}}
    )
    assert problems == []
    return state


# --- configuration ----------------------------------------------------------------------------


def test_the_report_format_comes_before_the_report_url_it_applies_to() -> None:
    lines = render_aide_conf(FileIntegrity(enabled=True)).splitlines()
    assert lines.index("report_format=json") < lines.index("report_url=stdout")


def test_paths_are_watched_and_exclusions_escaped_as_aide_regexes() -> None:
    conf = render_aide_conf(
        FileIntegrity(enabled=True, paths=("/etc", "/usr/bin"), exclude=("/etc/ld.so.cache",))
    )
    lines = conf.splitlines()
    assert "/etc GpunodeIntegrity" in lines
    assert "/usr/bin GpunodeIntegrity" in lines
    # '.' is any character in a regex: escaped, and the exclusion covers what lies below.
    assert r"!/etc/ld\.so\.cache($|/)" in lines
    for cache in OWN_CACHES:
        assert any(line.startswith("!" + cache.replace(".", r"\.")) for line in lines)
    assert "GpunodeIntegrity = p+u+g+s+i+n+m+c+sha256+ftype" in lines


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"paths": ["etc"]}, "audit.file_integrity.paths[0]"),
        ({"paths": ["/usr/../etc"]}, "audit.file_integrity.paths[0]"),
        ({"exclude": ["/etc/$(reboot)"]}, "audit.file_integrity.exclude[0]"),
        ({"schedule": "daily; rm -rf /"}, "audit.file_integrity.schedule"),
        ({"schedule": "daily\nExecStart=/bin/sh"}, "audit.file_integrity.schedule"),
        ({"paths": []}, "audit.file_integrity.paths"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(settings: dict, key: str) -> None:
    _, problems = build_desired_state({"audit": {"file_integrity": {"enabled": True, **settings}}})
    assert key in [problem.key for problem in problems], problems


def test_the_adopt_step_never_dates_the_run_later_than_it_began() -> None:
    # ctime at the run's first second counts as the run's: the start is rounded down.
    assert adopt_command(1764590400.9, None).endswith("adopt --since 1764590400")


# --- the node program --------------------------------------------------------------------------


def test_aide_s_json_reports_give_each_entry_with_its_kind() -> None:
    removed = json.loads((FIXTURES / "check-0.18.3-deb12.json").read_text())
    assert program.differences(removed) == [
        ("changed", "/etc"),
        ("removed", "/etc/gpunode-capture-gone"),
    ]
    added = json.loads((FIXTURES / "check-0.18.3-deb12-added-changed.json").read_text())
    assert program.differences(added) == [
        ("changed", "/etc/ssh/ssh_config"),
        ("changed", "/usr/local/bin"),
        ("added", "/usr/local/bin/capture-added"),
    ]


def test_a_report_that_is_not_aide_s_shape_gives_no_entries() -> None:
    assert program.differences({"added": ["/x"], "changed": "text"}) == []


def test_a_file_dpkg_owns_unchanged_is_the_package_s_and_one_it_does_not_own_is_not(
    tmp_path: Path,
) -> None:
    dpkg = shutil.which("dpkg")
    assert dpkg is not None
    verified: dict[str, set[str]] = {}
    assert program.package_consistent(os.path.realpath(dpkg), verified)
    stray = tmp_path / "stray"
    stray.write_text("x")
    assert not program.package_consistent(str(stray), verified)


def test_what_changed_after_the_run_began_is_the_run_s_and_what_changed_before_is_an_alert(
    tmp_path: Path,
) -> None:
    before = tmp_path / "before"
    before.write_text("planted before the run")
    time.sleep(0.05)
    started = time.time()
    time.sleep(0.05)
    during = tmp_path / "during"
    during.write_text("written by the run")
    found = [("added", str(before)), ("added", str(during)), ("changed", str(tmp_path))]
    alerts, explained = program.classify(found, database_time=time.time() + 3600, since=started)
    assert alerts == [{"kind": "added", "path": str(before)}]
    assert explained["gpunode-run"] == 1  # the directory's own change is its entries'


def _checked_before(tmp_path: Path) -> Path:
    """The last check's database, written after what is in ``tmp_path`` now."""
    time.sleep(0.05)
    database = tmp_path / "state" / "aide.db"
    database.parent.mkdir()
    database.write_text("db")
    time.sleep(0.05)
    return database


def test_a_removal_before_the_run_is_not_the_run_s_though_the_run_wrote_beside_it(
    tmp_path: Path,
) -> None:
    # The run's own write in the same directory moves its ctime past the run's start: the
    # directory's ctime alone would take in a removal nobody explained.
    watched = tmp_path / "etc"
    watched.mkdir()
    removed_before = watched / "planted-then-removed"
    removed_before.write_text("x")
    database = _checked_before(tmp_path)
    removed_before.unlink()
    changed_before_run = program.changed_directories([str(watched)], database)
    assert changed_before_run == [str(watched)]
    time.sleep(0.05)
    started = time.time()
    time.sleep(0.05)
    (watched / "written-by-the-run").write_text("y")
    alerts, explained = program.classify(
        [("removed", str(removed_before))],
        database_time=database.stat().st_mtime,
        since=started,
        changed_before_run=frozenset(changed_before_run),
    )
    assert alerts == [{"kind": "removed", "path": str(removed_before)}]
    assert explained["gpunode-run"] == 0


def test_a_removal_by_the_run_in_a_directory_unchanged_before_it_is_the_run_s(
    tmp_path: Path,
) -> None:
    watched = tmp_path / "etc"
    watched.mkdir()
    removed_by_run = watched / "old-drop-in"
    removed_by_run.write_text("x")
    database = _checked_before(tmp_path)
    changed_before_run = program.changed_directories([str(watched)], database)
    assert changed_before_run == []
    time.sleep(0.05)
    started = time.time()
    time.sleep(0.05)
    removed_by_run.unlink()
    found = [("removed", str(removed_by_run))]
    alerts, explained = program.classify(
        found, database.stat().st_mtime, since=started, changed_before_run=frozenset()
    )
    assert alerts == [] and explained["gpunode-run"] == 1
    # Where the run could not read which directories had changed, no removal is its own.
    alerts, _ = program.classify(found, database.stat().st_mtime, since=started)
    assert alerts == [{"kind": "removed", "path": str(removed_by_run)}]


def test_too_many_changed_directories_or_no_database_is_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    watched = tmp_path / "etc"
    for index in range(3):
        (watched / str(index)).mkdir(parents=True)
    assert program.changed_directories([str(watched)], tmp_path / "no-database") is None
    database = tmp_path / "aide.db"
    database.write_text("db")
    os.utime(database, (1, 1))
    monkeypatch.setattr(program, "MAX_CHANGED_DIRS", 2)
    assert program.changed_directories([str(watched)], database) is None


def test_the_watched_paths_are_read_back_from_gpunode_s_configuration(tmp_path: Path) -> None:
    paths = ("/etc", "/usr/lib/x+y", "/opt/a.b")
    config = tmp_path / "aide.conf"
    config.write_text(render_aide_conf(FileIntegrity(enabled=True, paths=paths)))
    assert program.watched_paths(str(config)) == list(paths)


def test_the_adopt_step_carries_the_directories_to_the_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple] = []
    monkeypatch.setattr(program, "update", lambda *arguments: calls.append(arguments) or 0)
    for changed_before_run in (["/etc", "/etc/it's here"], [], None):
        words = shlex.split(adopt_command(1764590400.0, changed_before_run))
        assert words[:3] == [
            "/usr/bin/python3",
            "-I",
            "/usr/local/lib/gpunode-audit/file_integrity.py",
        ]
        arguments = [
            word if word != "/var/lib/gpunode/aide" else str(tmp_path) for word in words[3:]
        ]
        assert program.main(arguments) == 0
        *_, since, before = calls.pop()
        assert since == 1764590400.0
        assert before == (None if changed_before_run is None else frozenset(changed_before_run))


def test_the_fact_takes_only_a_complete_list_of_clean_paths() -> None:
    assert parse_changed_directories(['{"complete": true, "directories": ["/etc"]}']) == ["/etc"]
    assert parse_changed_directories(['{"complete": true, "directories": []}']) == []
    for bad in (
        '{"complete": false, "directories": []}',
        '{"complete": true, "directories": ["/etc/a\\nb"]}',
        '{"complete": true, "directories": ["relative"]}',
        '{"complete": true, "directories": ["/' + "x" * 40000 + '"]}',
        "not json",
        "",
    ):
        assert parse_changed_directories([bad]) is None, bad


def test_a_nightly_check_explains_nothing_by_time(tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    planted.write_text("x")
    alerts, explained = program.classify(
        [("added", str(planted))], database_time=time.time() + 3600, since=None
    )
    assert alerts == [{"kind": "added", "path": str(planted)}]
    assert explained["gpunode-run"] == 0


def test_alerts_outlive_later_checks_until_accepted(tmp_path: Path) -> None:
    program.write_summary(tmp_path, {"alerts": [{"kind": "added", "path": "/usr/bin/x"}],
                                     "alert_count": 1})  # fmt: skip
    assert program.read_summary(tmp_path)["alert_count"] == 1
    program.accept(tmp_path)
    after = program.read_summary(tmp_path)
    assert after["alerts"] == [] and after["alert_count"] == 0 and after["accepted"]
    assert not list(tmp_path.glob(".*.tmp"))  # written whole, then renamed


# --- the fact ----------------------------------------------------------------------------------


def _output(database: int, summary: str | None) -> list[str]:
    parts: dict[str, framing.PartOutput | list[str]] = {
        "database": framing.PartOutput("database", [], [], database)
    }
    parts["summary"] = (
        summary.splitlines() if summary is not None else framing.PartOutput("summary", [], [], 1)
    )
    return framing.output_of(parts)


def test_the_fact_reads_the_summary_the_program_writes() -> None:
    summary = {
        "alerts": [{"kind": "added", "path": "/usr/local/bin/x", "found": "2026-12-01T03:41:07Z"}],
        "alert_count": 1,
        "last_check": "2026-12-01T03:41:07Z",
        "last_check_kind": "check",
        "last_explained": {"package": 2, "gpunode-run": 0},
    }
    fact = parse_file_integrity(_output(0, json.dumps(summary, indent=1)))
    assert fact["state"] == "ok" and fact["database"] is True
    assert fact["summary"]["alerts"] == summary["alerts"]
    assert fact["summary"]["explained"] == {"package": 2, "gpunode-run": 0}


def test_no_database_and_no_summary_is_read_as_such() -> None:
    fact = parse_file_integrity(_output(1, None))
    assert fact["state"] == "ok" and fact["database"] is False and fact["summary"] == {}


def test_a_bad_alert_is_named_and_the_good_ones_kept() -> None:
    text = json.dumps(
        {"alerts": [{"kind": "added", "path": "/usr/bin/ok"}, {"kind": "rm -rf", "path": 3},
                    {"kind": "changed", "path": "/etc/a\x1b[31m"}]}
    )  # fmt: skip
    summary, problems = parse_summary(text)
    assert [alert["path"] for alert in summary["alerts"]] == ["/usr/bin/ok"]
    assert len(problems) == 2 and problems[0].startswith("alerts[1]")


def test_a_summary_that_is_not_json_is_a_problem_not_a_crash() -> None:
    fact = parse_file_integrity(_output(0, "{not json"))
    assert fact["state"] == "ok" and fact["problems"][0].startswith("summary.json is not JSON")


def test_output_cut_short_is_unreadable() -> None:
    assert parse_file_integrity(["garbage"])["state"] == "unreadable"


# --- the drift rule ----------------------------------------------------------------------------


def _facts(alerts: list[dict], last_check: str = "2026-12-01T03:41:07Z", database: bool = True):
    return {
        "file_integrity": {
            "state": "ok",
            "reason": "",
            "database": database,
            "summary": {"alerts": alerts, "alert_count": len(alerts), "last_check": last_check},
            "problems": [],
        }
    }


def _findings(facts: dict, **settings: object) -> list[tuple[str, Severity]]:
    return [
        (finding[0], finding[1])
        for finding in file_integrity_rules(enabled(**settings), facts, now=NOW)  # type: ignore[arg-type]
    ]


def test_a_changed_program_is_critical() -> None:
    facts = _facts([{"kind": "added", "path": "/usr/local/bin/x"},
                    {"kind": "changed", "path": "/etc/ssh/ssh_config"}])  # fmt: skip
    found = list(file_integrity_rules(enabled(), facts, now=NOW))  # type: ignore[arg-type]
    assert [(f[0], f[1]) for f in found] == [("audit.file_integrity.changed", Severity.CRITICAL)]
    assert "/usr/local/bin/x" in found[0][3] and "2 changed" in found[0][3]


def test_a_changed_configuration_file_alone_is_a_warning() -> None:
    facts = _facts([{"kind": "changed", "path": "/etc/ssh/ssh_config"}])
    assert _findings(facts) == [("audit.file_integrity.changed", Severity.WARNING)]


def test_a_clean_recent_check_has_no_finding() -> None:
    assert _findings(_facts([])) == []


def test_an_overdue_check_and_a_missing_database_are_warnings() -> None:
    assert _findings(_facts([], last_check="2026-11-25T03:41:07Z")) == [
        ("audit.file_integrity.overdue", Severity.WARNING)
    ]
    assert _findings(_facts([], database=False)) == [
        ("audit.file_integrity.database", Severity.WARNING)
    ]


def test_nothing_is_checked_when_file_integrity_is_off() -> None:
    state, _ = build_desired_state({})
    facts = _facts([{"kind": "added", "path": "/usr/bin/x"}])
    assert list(file_integrity_rules(state, facts, now=NOW)) == []


def test_system_binaries_are_the_programs_and_libraries() -> None:
    assert is_system_binary("/usr/lib/x86_64-linux-gnu/libc.so.6")
    assert is_system_binary("/boot/vmlinuz-6.1.0-40-amd64")
    assert not is_system_binary("/etc/passwd")
    assert not is_system_binary("/usr/library")  # a prefix of a name is not its directory


# --- every deploy ends with the AIDE step ------------------------------------------------------


def _last_call_in_converging(path: Path) -> str | None:
    import ast

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.With) and any(
            isinstance(item.context_expr, ast.Call)
            and getattr(item.context_expr.func, "id", None) == "converging"
            for item in node.items
        ):
            last = node.body[-1]
            if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
                return getattr(last.value.func, "id", None)
            return None
    return "no converging()"


DEPLOYS = sorted((Path(__file__).resolve().parents[2] / "deploys").glob("*.py"))


@pytest.mark.parametrize("deploy", DEPLOYS, ids=lambda path: path.name)
def test_every_deploy_ends_with_this_run_into_the_integrity_database(deploy: Path) -> None:
    # A run that changes the node without the step would leave its changes to be reported as
    # tampering by the next check.
    last = _last_call_in_converging(deploy)
    if last == "no converging()":
        assert deploy.name == "drift_timer.py"  # the control host's timer, no node roles
        return
    assert last in ("file_integrity", "file_integrity_takes_this_run"), deploy.name

"""Drift reports in every format carry the same findings; exit codes and baseline."""

from __future__ import annotations

import json
import os
import stat
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from gpunode.drift.baseline import apply_baseline
from gpunode.drift.findings import RUN_DEPLOY, DriftResult, Finding, Severity
from gpunode.drift.output import (
    render_json,
    render_junit,
    render_prometheus,
    render_table,
    write_atomically,
)


def sample() -> DriftResult:
    return DriftResult(
        findings=[
            Finding(
                "gpu.persistence:0", "node-2", Severity.WARNING, "Enabled", "Disabled", RUN_DEPLOY
            ),
            Finding("gpu.count", "node-2", Severity.CRITICAL, "8", "7", "open a hardware ticket"),
        ],
        checked_hosts=["node-1", "node-2"],
        unreachable={"node-3": "ConnectError: timed out"},
    )


def test_exit_codes() -> None:
    assert DriftResult(checked_hosts=["a"]).exit_code == 0
    assert DriftResult(findings=sample().findings, checked_hosts=["node-2"]).exit_code == 1
    assert sample().exit_code == 1  # a host not checked: the fleet's problem, not a usage error
    assert DriftResult(checked_hosts=["a"], unreachable={"b": "timed out"}).exit_code == 1


def test_table_sorts_by_severity_and_names_unchecked_hosts() -> None:
    table = render_table(sample()).splitlines()
    assert table[1].split()[:4] == ["node-2", "critical", "new", "gpu.count"]
    assert table[2].split()[:4] == ["node-2", "warning", "new", "gpu.persistence:0"]
    assert "node-3: NOT CHECKED: ConnectError: timed out" in table
    assert table[-1] == ("2 hosts checked, 1 without drift, 2 findings (1 critical), 1 not checked")


def test_json_round_trips_every_field() -> None:
    data = json.loads(render_json(sample()))
    assert data["exit_code"] == 1
    assert data["findings"][0] == {
        "id": "gpu.count",
        "host": "node-2",
        "severity": "critical",
        "expected": "8",
        "found": "7",
        "fix": "open a hardware ticket",
        "status": "new",
    }


def test_junit_has_a_failure_per_finding_and_an_error_per_unchecked_host() -> None:
    root = ElementTree.fromstring(render_junit(sample()))
    suites = {suite.get("name"): suite for suite in root.iter("testsuite")}
    assert set(suites) == {"node-1", "node-2", "node-3"}
    assert [c.get("name") for c in suites["node-2"].iter("testcase")] == [
        "gpu.count",
        "gpu.persistence:0",
    ]
    failure = suites["node-2"].find("testcase/failure")
    assert failure is not None and failure.get("message") == "expected 8, found 7"
    assert suites["node-1"].find("testcase/failure") is None
    error = suites["node-3"].find("testcase/error")
    assert error is not None and error.get("message") == "ConnectError: timed out"


def test_prometheus_textfile() -> None:
    text = render_prometheus(sample())
    assert 'gpunode_drift_findings{host="node-2",severity="critical"} 1' in text
    assert 'gpunode_drift_findings{host="node-1",severity="warning"} 0' in text
    assert (
        'gpunode_drift_finding{host="node-2",id="gpu.count",severity="critical",status="new"} 1'
        in text
    )
    assert 'gpunode_drift_host_checked{host="node-3"} 0' in text


def test_atomic_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "textfile" / "gpunode.prom"
    write_atomically(target, "a 1\n")
    write_atomically(target, "a 2\n")
    assert target.read_text() == "a 2\n"
    assert os.listdir(target.parent) == ["gpunode.prom"]
    assert target.stat().st_mode & 0o777 == 0o644


def test_baseline_marks_known_and_new(tmp_path: Path) -> None:
    yesterday = DriftResult(findings=[sample().findings[1]], checked_hosts=["node-2"])
    baseline = tmp_path / "baseline.json"
    baseline.write_text(render_json(yesterday))
    today = apply_baseline(sample(), baseline)
    status = {f.id: f.status for f in today.findings}
    assert status == {"gpu.count": "known", "gpu.persistence:0": "new"}
    assert apply_baseline(sample(), tmp_path / "missing.json").findings[0].status == "new"


BROKEN_BASELINES = [
    pytest.param('{"findings": [{"host": "node-2", "id": "gpu', "not JSON, truncated",
                 id="truncated"),
    pytest.param("", "not JSON", id="empty"),
    pytest.param("[1, 2]", "a JSON list, not a report object", id="a-json-list"),
    pytest.param('{"findings": {"host": "node-2"}}', "'findings' is not a list",
                 id="findings-dict"),
    pytest.param('{"findings": [1, 2]}', "finding 0 is not an object", id="findings-numbers"),
    pytest.param('{"findings": [{"host": 1, "id": ["x"]}]}', "finding 0 has no string",
                 id="finding-fields-wrong-type"),
    pytest.param(b"\xff\xfe{}", "not readable", id="not-utf8"),
]  # fmt: skip


@pytest.mark.parametrize(("content", "named"), BROKEN_BASELINES)
def test_an_unreadable_baseline_is_absent_with_a_warning_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | bytes, named: str
) -> None:
    baseline = tmp_path / "baseline.json"
    if isinstance(content, bytes):
        baseline.write_bytes(content)
    else:
        baseline.write_text(content)
    today = apply_baseline(sample(), baseline)
    assert [f.status for f in today.findings] == ["new", "new"]
    warning = capsys.readouterr().err
    assert f"baseline {baseline} is unreadable: {named}" in warning
    assert "treating it as absent" in warning


def test_atomic_write_reaches_the_disk_before_and_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(descriptor: int) -> None:
        kind = "directory" if stat.S_ISDIR(os.fstat(descriptor).st_mode) else "file"
        events.append(f"fsync {kind}")
        real_fsync(descriptor)

    def replace(source: str, target: str | Path) -> None:
        events.append("replace")
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "baseline.json"
    write_atomically(target, render_json(sample()))
    assert events == ["fsync file", "replace", "fsync directory"]
    assert json.loads(target.read_text())["exit_code"] == 1


def test_a_failed_write_leaves_the_previous_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "baseline.json"
    write_atomically(target, "yesterday\n")

    def full_disk(descriptor: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_atomically(target, "today\n")
    assert target.read_text() == "yesterday\n"
    assert os.listdir(tmp_path) == ["baseline.json"]

"""DCGM's diagnostic in the health gate: the parser on NVIDIA's real ``dcgmi diag -j`` output
(tests/fixtures/dcgm) and on what it cannot read, the fact's level and output, the rule, the
lab stand-in's document, and what the rollout says of nodes without DCGM."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from facts.dcgm import DcgmDiag, diag_level, parse_diag_output
from gpunode import framing
from gpunode.drift.findings import Severity
from gpunode.drift.rules import evaluate
from gpunode.model import build_desired_state
from gpunode.probe.parsers import parse_dcgm_diag
from gpunode.rollout import CheckResult, PyinfraNodes, dcgm_note
from lab.standin import dcgmi_diag

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures/dcgm/dcgmi-diag-r1-j.3.1.0.8gpu.pass.txt"
# DCGM 4: one test object NVIDIA's DCGM issue #215 quotes from `dcgmi diag -r 3 -j` (8 GPUs).
DCGM4_TEST = (
    Path(__file__).resolve().parents[1] / "fixtures/dcgm/dcgmi-diag-j.4.x.8gpu.diagnostic-test.json"
)
REMAP = "Page Retirement/Row Remap"


def capture() -> str:
    return CAPTURE.read_text(encoding="utf-8")


def document() -> dict[str, Any]:
    text = capture()
    loaded: dict[str, Any] = json.loads(text[text.index("{") :])
    return loaded


def with_status(test: str, status: str) -> str:
    changed = document()
    for category in changed["DCGM GPU Diagnostic"]["test_categories"]:
        for entry in category["tests"]:
            if entry and entry["name"] == test:
                entry["results"][0]["status"] = status
    return json.dumps(changed)


def diag_findings(section: dict[str, Any]) -> dict[str, Any]:
    desired, problems = build_desired_state({"dcgm": {"enabled": True, "cuda_major": 12}})
    assert problems == []
    return {
        f.id: f
        for f in evaluate("node-1", desired, {"dcgm_diag": section})
        if f.id.startswith("dcgm")
    }


def test_nvidias_real_output_reads_as_every_test_passed() -> None:
    report = parse_dcgm_diag(capture())
    assert (report["state"], report["version"], report["failed"]) == ("ok", "3.1.0", [])
    assert report["problems"] == []  # the WARNING line before it and the nulls are its shape
    names = [test["name"] for test in report["tests"]]
    assert names == [*dcgmi_diag.DEPLOYMENT_TESTS, "software"]
    assert {test["status"] for test in report["tests"]} == {"pass"}
    assert {test["category"] for test in report["tests"]} == {"Deployment", "Custom"}
    assert diag_findings(report) == {}


@pytest.mark.parametrize("spelling", ["FAIL", "Fail"])
def test_a_failed_test_is_critical_and_named(spelling: str) -> None:
    report = parse_dcgm_diag(with_status(REMAP, spelling))
    assert report["failed"] == [REMAP]
    found = diag_findings(report)
    assert {name: f.severity for name, f in found.items()} == {
        f"dcgm.diag:{REMAP}": Severity.CRITICAL
    }
    assert found[f"dcgm.diag:{REMAP}"].found == f"{REMAP} failed"


def test_one_failed_gpu_of_a_per_gpu_test_fails_the_test_with_dcgms_words() -> None:
    changed = document()
    software = changed["DCGM GPU Diagnostic"]["test_categories"][1]["tests"][0]
    software["results"][3].update(status="FAIL", warnings=[{"warning": "GPU 3 is unhappy"}])
    report = parse_dcgm_diag(json.dumps(changed))
    assert report["failed"] == ["software"]
    assert (
        diag_findings(report)["dcgm.diag:software"].found
        == "software failed on GPU 3: GPU 3 is unhappy"
    )


def test_what_the_parser_cannot_read_is_named_and_the_rest_kept() -> None:
    changed = document()
    tests = changed["DCGM GPU Diagnostic"]["test_categories"][0]["tests"]
    tests[0]["results"][0]["status"] = "MAYBE"
    tests[2] = {"results": []}
    report = parse_dcgm_diag(json.dumps(changed))
    assert report["state"] == "ok"
    assert report["problems"] == [
        "test 'Denylist': a result of unknown status 'MAYBE'",
        "a test without a name: {'results': []}",
    ]
    assert len(report["tests"]) == 8 and report["failed"] == []
    assert {name: f.severity for name, f in diag_findings(report).items()} == {
        "dcgm.unread_line": Severity.WARNING
    }


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "no JSON document: no output"),
        ("Error: unable to establish a connection to the specified host: localhost\n",
         "no JSON document: Error: unable to establish a connection"),
        (capture()[:400], "not JSON, truncated or corrupted"),
        ('{"something": {}}', "no 'DCGM GPU Diagnostic' (DCGM 3) or 'DCGM Diagnostic' object"),
        ('{"DCGM GPU Diagnostic": {"runtime_error": "No GPUs"}}', "DCGM: No GPUs"),
        ('{"DCGM GPU Diagnostic": {"version": "4.2.3"}}', "no test_categories"),
        ("[1, 2]", "no JSON document: [1, 2]"),
        ('[{"DCGM GPU Diagnostic": {}}]', "not JSON"),
    ],
)  # fmt: skip
def test_no_readable_diagnostic_fails_the_gate_saying_why(text: str, reason: str) -> None:
    report = parse_dcgm_diag(text)
    assert report["state"] == "unreadable"
    assert reason in report["reason"], report
    (finding,) = diag_findings(report).values()
    assert (finding.id, finding.severity) == ("dcgm.diag", Severity.CRITICAL)
    assert reason in finding.found


def test_the_fact_runs_the_level_asked_for_and_reads_a_failing_run() -> None:
    assert [diag_level(level) for level in (1, 2, "quick", "medium")] == [1, 2, 1, 2]
    for bad in (0, 3, "long", True, "1; reboot"):
        with pytest.raises(ValueError):
            diag_level(bad)
    assert "dcgmi diag -r 2 -j" in DcgmDiag().command(level=2)
    failing = with_status(REMAP, "FAIL").splitlines()
    output = framing.output_of({"dcgmi": framing.PartOutput("dcgmi", failing, [], 226)})
    assert parse_diag_output(output)["failed"] == [REMAP]
    broken = framing.output_of({"dcgmi": framing.PartOutput("dcgmi", ["Error: no"], [], 1)})
    assert parse_diag_output(broken)["reason"].startswith("exit status 1: no JSON document")
    missing = framing.output_of({"dcgmi": framing.PartOutput("dcgmi", [], [], None, absent=True)})
    assert parse_diag_output(missing)["state"] == "absent"
    assert diag_findings(parse_diag_output(missing))["dcgm.diag"].found == "dcgmi is not installed"


def test_no_diagnostic_section_no_finding() -> None:
    desired, _ = build_desired_state({"dcgm": {"enabled": True, "cuda_major": 12}})
    assert [f.id for f in evaluate("n", desired, {}) if f.id.startswith("dcgm")] == []


def lab_gpus(count: int = 8) -> list[dict[str, Any]]:
    gpu = {
        "present": True,
        "remapped_rows": {"pending": "No", "failure": "No"},
        "ecc_errors": {"volatile": {"dram_uncorrectable": 0}},
    }
    return [copy.deepcopy(gpu) for _ in range(count)]


def test_the_lab_standin_answers_in_the_real_shape_and_a_simulated_fault_fails_a_test() -> None:
    healthy = dcgmi_diag.render(lab_gpus(), 1, "4.2.3")
    real, standin = document(), json.loads(healthy)
    shape = [
        [(test or {}).get("name") for test in category["tests"]]
        for category in real["DCGM GPU Diagnostic"]["test_categories"]
    ]
    assert shape == [
        [(test or {}).get("name") for test in category["tests"]]
        for category in standin["DCGM GPU Diagnostic"]["test_categories"]
    ]
    assert parse_dcgm_diag(healthy)["failed"] == []
    gpus = lab_gpus()
    gpus[2]["remapped_rows"]["pending"] = "Yes"
    assert parse_dcgm_diag(dcgmi_diag.render(gpus, 1, "4.2.3"))["failed"] == [REMAP]
    gpus = lab_gpus()
    gpus[5]["ecc_errors"]["volatile"]["dram_uncorrectable"] = 2
    assert parse_dcgm_diag(dcgmi_diag.render(gpus, 1, "4.2.3"))["failed"] == []
    assert parse_dcgm_diag(dcgmi_diag.render(gpus, 2, "4.2.3"))["failed"] == ["Memory"]


def test_the_gate_says_which_nodes_skip_the_diagnostic() -> None:
    assert dcgm_note(None, True) == ""
    assert dcgm_note(1, True) == "DCGM diagnostic level 1 passed"
    assert dcgm_note(2, False) == "DCGM diagnostic skipped: dcgm not declared"
    nodes = PyinfraNodes("inv.py", "deploy.py", dcgm_diag_level=1, dcgm_nodes=frozenset({"a"}))
    assert (nodes.dcgm_diag_level, nodes.dcgm_nodes) == (1, frozenset({"a"}))
    assert CheckResult([]).note == ""


def test_the_summary_keeps_what_the_gate_said_of_the_diagnostic() -> None:
    from tests.unit.test_rollout import FakeNodes, make

    class Noting(FakeNodes):
        def check(self, nodes: Any) -> dict[str, CheckResult]:
            results = super().check(nodes)
            for node, result in results.items():
                result.note = dcgm_note(1, node == "n1")
            return results

    run, _, _, _ = make(names=["n1", "n2"], batch=2, canary=0, nodes=Noting())
    assert run.run() == 0
    notes = {name: record.note for name, record in run.state.nodes.items()}
    assert notes == {
        "n1": "resumed (DCGM diagnostic level 1 passed)",
        "n2": "resumed (DCGM diagnostic skipped: dcgm not declared)",
    }


# --- DCGM 4 -----------------------------------------------------------------------------------


def dcgm4_document(test: dict[str, Any], serials: bool = True) -> dict[str, Any]:
    """The quoted test in the document DCGM 4.6.0's dcgmi/Diag.cpp builds around its tests
    (HelperJsonBuildOutput): "DCGM Diagnostic" > test_categories, then "entity_groups" and
    "metadata" beside it."""
    entities = [
        {"device_id": "2330", "entity_id": number,
         **({"serial_num": f"165222000{number}"} if serials else {})}
        for number in range(8)
    ]  # fmt: skip
    return {
        "DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [test]}]},
        "entity_groups": [{"entities": entities, "entity_group": "GPU", "entity_group_id": 1}],
        "metadata": {"Driver Version Detected": "570.86.15", "version": "4.1.1"},
    }


def dcgm4_test() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DCGM4_TEST.read_text(encoding="utf-8"))
    return loaded


def test_dcgm4_output_reads_per_test_with_each_gpus_result() -> None:
    report = parse_dcgm_diag(json.dumps(dcgm4_document(dcgm4_test())))
    assert (report["state"], report["version"], report["driver_version"]) == (
        "ok", "4.1.1", "570.86.15"
    )  # fmt: skip
    assert report["problems"] == [] and report["failed"] == []
    (test,) = report["tests"]
    assert (test["name"], test["category"], test["status"]) == ("diagnostic", "Hardware", "pass")
    assert [result["entity"] for result in test["results"]] == [f"GPU {n}" for n in range(8)]
    assert test["results"][0]["serial"] == "1652220000"
    assert {result["status"] for result in test["results"]} == {"pass"}
    assert diag_findings(report) == {}


def test_dcgm4_one_failing_gpu_is_named_with_its_serial_and_dcgms_error() -> None:
    test = dcgm4_test()
    test["results"][5].update(
        status="Fail",
        warnings=[{"error_category": 4, "error_id": 37, "error_severity": 2,
                   "warning": "GPU 5 failed the GEMM test"}],
    )  # fmt: skip
    test["test_summary"]["status"] = "Fail"
    report = parse_dcgm_diag(json.dumps(dcgm4_document(test)))
    assert report["failed"] == ["diagnostic"]
    failed = [r for r in report["tests"][0]["results"] if r["status"] == "fail"]
    assert failed == [{"entity": "GPU 5", "serial": "1652220005", "status": "fail",
                       "detail": ["GPU 5 failed the GEMM test"], "error_ids": [37]}]  # fmt: skip
    finding = diag_findings(report)["dcgm.diag:diagnostic"]
    assert finding.severity is Severity.CRITICAL
    assert finding.found == (
        "diagnostic failed on GPU 5 (serial 1652220005): GPU 5 failed the GEMM test"
    )


def test_dcgm4_a_test_summary_failure_without_a_gpu_fails_the_test() -> None:
    """Errors no entity carries are in the summary only (Diag.cpp HelperJsonAddTestSummary)."""
    test = dcgm4_test()
    test["test_summary"] = {
        "status": "Fail",
        "warnings": [{"warning": "NVLink error", "error_id": 9}],
    }
    report = parse_dcgm_diag(json.dumps(dcgm4_document(test, serials=False)))
    assert report["failed"] == ["diagnostic"]
    assert report["tests"][0]["results"][0]["serial"] is None
    assert diag_findings(report)["dcgm.diag:diagnostic"].found == "diagnostic failed: NVLink error"


def test_dcgm4_runtime_error_is_unreadable_with_dcgms_words() -> None:
    """What Diag.cpp prints when it cannot run: the root with version and runtime_error."""
    text = json.dumps({"DCGM Diagnostic": {"version": "4.6.0", "runtime_error": "No GPUs"}})
    report = parse_dcgm_diag(text)
    assert (report["state"], report["reason"]) == ("unreadable", "DCGM: No GPUs")

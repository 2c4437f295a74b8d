"""GPU health: the failure catalogue, a lost GPU, memory errors, the recovery action, XIDs.

Captures: NVIDIA's Xid catalogue rows (gpunode.health.catalogue), nvidia-smi's XML of real
GPUs (tests/fixtures/nvidia-smi-xml), nvidia-smi's line for a GPU it cannot open and a
kernel log with XID 79 (tests/fixtures/nvidia-smi-lost, kernel-log; PROVENANCE.md). No
public XML capture of a lost GPU exists: those tests turn a real capture's GPU into one
answering as nvidia-smi does for a lost GPU ("GPU is lost" / "Unknown Error" for its values).
"""

from __future__ import annotations

import copy
import json
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import pytest

from gpunode.drift.findings import DriftResult, Finding, Severity
from gpunode.drift.output import render_json, render_junit, render_prometheus
from gpunode.drift.rules import evaluate
from gpunode.health import catalogue, judge
from gpunode.health.catalogue import RECOVERY_ACTIONS, XID_CATALOGUE, Remedy
from gpunode.health.xid import most_in_window
from gpunode.probe.gpu_probe import Completed, collect, parse_xid_events
from gpunode.probe.gpu_record import parse_nvidia_smi_xml, unreachable_gpus
from gpunode.probe.parsers import GPU_REPORT_SHAPE
from tests.unit.test_drift_rules import desired, healthy_facts
from tests.unit.test_probe import FakeNode, FakeNvml, hardware, real_pynvml
from tests.unit.test_probe import share_dir as share_dir  # the lab double's XML templates

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
A100_XML = FIXTURES / "nvidia-smi-xml/a100-sxm4-v12.xml"  # one A100, driver 535
TWO_GPUS_XML = FIXTURES / "nvidia-smi-xml/dual_2070-v13.xml"  # two RTX 2070, schema v13


def read(relative: str) -> str:
    return (FIXTURES / relative).read_text(encoding="utf-8")


def findings_of(facts: dict[str, Any]) -> dict[str, Finding]:
    return {finding.id: finding for finding in evaluate("node-1", desired(), facts)}


def with_gpu_report(report: dict[str, Any]) -> dict[str, Any]:
    facts = healthy_facts()
    facts["gpu"] = {**facts["gpu"], **report}
    return facts


# --- the catalogue ----------------------------------------------------------------------------

# The XIDs the issue names, and NVIDIA's immediate action for each (the catalogue's column).
NAMED_XIDS = {
    13: ("RESTART_APP", Severity.WARNING, Remedy.RESTART_APPLICATION),
    31: ("RESTART_APP", Severity.WARNING, Remedy.RESTART_APPLICATION),
    43: ("IGNORE", Severity.INFO, Remedy.NONE),
    45: ("WORKFLOW_XID_45", Severity.INFO, Remedy.NONE),
    48: ("WORKFLOW_XID_48", Severity.CRITICAL, Remedy.RESET_GPU),
    61: ("UNEXPECTED_ERR_REPORT_ISSUE", Severity.CRITICAL, Remedy.CONTACT_SUPPORT),
    62: ("RESET_GPU", Severity.CRITICAL, Remedy.RESET_GPU),
    63: ("IGNORE", Severity.INFO, Remedy.NONE),
    64: ("RESET_GPU", Severity.CRITICAL, Remedy.RESET_GPU),
    74: ("WORKFLOW_NVLINK_ERR", Severity.CRITICAL, Remedy.RESET_GPU),
    79: ("RESTART_BM", Severity.CRITICAL, Remedy.REBOOT),
    92: ("IGNORE", Severity.INFO, Remedy.NONE),
    94: ("RESTART_APP", Severity.WARNING, Remedy.RESTART_APPLICATION),
    95: ("RESET_GPU", Severity.CRITICAL, Remedy.RESET_GPU),
    119: ("RESET_GPU", Severity.CRITICAL, Remedy.RESET_GPU),
    120: ("RESET_GPU", Severity.CRITICAL, Remedy.RESET_GPU),
    121: ("IGNORE", Severity.INFO, Remedy.NONE),
    140: ("RESET_GPU", Severity.CRITICAL, Remedy.RESET_GPU),
    143: ("RESET_GPU", Severity.CRITICAL, Remedy.RESET_GPU),
}


@pytest.mark.parametrize("number", sorted(NAMED_XIDS))
def test_each_named_xid_has_nvidias_action_a_severity_and_a_remedy(number: int) -> None:
    entry = XID_CATALOGUE[number]
    bucket, severity, remedy = NAMED_XIDS[number]
    assert (entry.bucket, entry.severity.value, entry.remedy) == (bucket, severity.value, remedy)
    assert entry.source.url.startswith("https://docs.nvidia.com/")
    assert entry.source.read == "2026-12-07"


def test_the_catalogue_holds_every_xid_nvidia_lists_once_with_a_known_bucket() -> None:
    numbers = [row[0] for row in catalogue.XID_ROWS]
    assert numbers == list(range(1, 163))
    assert {row[2] for row in catalogue.XID_ROWS} <= set(catalogue.BUCKET_REMEDIES)
    # Only XIDs NVIDIA calls non-fatal get a threshold over a window.
    assert all(entry.repeat is None for entry in XID_CATALOGUE.values() if entry.fatal)
    assert XID_CATALOGUE[13].repeat is not None and XID_CATALOGUE[79].repeat is None


def test_recovery_actions_are_nvmls_values() -> None:
    """Checked against NVIDIA's own binding (pynvml's NVML_GPU_RECOVERY_ACTION_* constants)."""
    pynvml = real_pynvml()
    for value, action in RECOVERY_ACTIONS.items():
        assert getattr(pynvml, f"NVML_GPU_RECOVERY_ACTION_{action.name}") == value
    assert {RECOVERY_ACTIONS[v].name for v in (1, 2, 3, 4)} == {
        "GPU_RESET", "NODE_REBOOT", "DRAIN_P2P", "DRAIN_AND_RESET"
    }  # fmt: skip
    assert RECOVERY_ACTIONS[2].remedy is Remedy.REBOOT
    assert RECOVERY_ACTIONS[0].severity is catalogue.Severity.INFO


def test_every_failure_class_names_a_source_and_a_remedy_text() -> None:
    for failure in catalogue.FAILURE_CLASSES.values():
        assert failure.source.url.startswith("https://") and failure.source.read == "2026-12-07"
        assert failure.remedy in catalogue.REMEDY_TEXT


# --- a lost GPU -------------------------------------------------------------------------------


def lost_gpu_xml(
    position: int, word: str, keep_identity: bool = False, path: Path = TWO_GPUS_XML
) -> str:
    """A real capture with GPU ``position`` answering ``word`` for every value, as nvidia-smi
    prints a GPU whose every NVML call fails (the bus id, an attribute, stays)."""
    root = ElementTree.fromstring(path.read_text(encoding="utf-8"))
    gpu = root.findall("gpu")[position]
    for element in gpu.iter():
        if len(element) == 0 and (element.text or "").strip():
            if keep_identity and element.tag in ("uuid", "serial"):
                continue
            element.text = word
    return ElementTree.tostring(root, encoding="unicode")


def gpu_section(parsed: dict[str, Any]) -> dict[str, Any]:
    return {"state": "ok", "gpus": parsed["gpus"], "driver_version": "580.95.05"}


@pytest.mark.parametrize("word", ["GPU is lost", "[GPU is lost]", "Unknown Error"])
def test_a_gpu_answering_lost_for_every_value_is_a_critical_lost_gpu(word: str) -> None:
    parsed = parse_nvidia_smi_xml(lost_gpu_xml(1, word))
    assert [gpu["lost"] for gpu in parsed["gpus"]] == [False, True]
    assert parsed["gpus"][1]["lost_evidence"]
    # Before: every value None, and no finding at all.
    assert parsed["gpus"][1]["uuid"] is None and parsed["gpus"][1]["name"] is None
    found = findings_of(with_gpu_report(gpu_section(parsed)))
    lost = found["gpu.lost:1"]
    assert lost.severity is Severity.CRITICAL
    assert (lost.failure_class, lost.remedy, lost.confidence) == ("gpu.lost", "reboot", "inferred")
    assert "GPU 1, bus 00000000:02:00.0" in lost.found and "RMA" in lost.fix
    # Its unknown values make no other finding (no model None, no persistence off).
    assert not [key for key in found if key.endswith(":1") and key != "gpu.lost:1"]


def test_one_unknown_error_field_of_a_gpu_that_answers_is_no_lost_gpu() -> None:
    root = ElementTree.fromstring(TWO_GPUS_XML.read_text(encoding="utf-8"))
    for tag in ("fan_speed", "performance_state", "vbios_version"):
        element = root.find(f"gpu/{tag}")
        assert element is not None
        element.text = "Unknown Error"
    parsed = parse_nvidia_smi_xml(ElementTree.tostring(root, encoding="unicode"))
    assert [gpu["lost"] for gpu in parsed["gpus"]] == [False, False]
    assert not [key for key in findings_of(with_gpu_report(gpu_section(parsed))) if "lost" in key]


def test_unknown_error_with_a_readable_uuid_is_no_lost_gpu() -> None:
    parsed = parse_nvidia_smi_xml(lost_gpu_xml(1, "Unknown Error", keep_identity=True))
    assert parsed["gpus"][1]["lost"] is False


def test_nvidia_smis_line_for_a_gpu_it_cannot_open_names_it() -> None:
    """The real line of driver 610, and the form gpud's tests quote."""
    line = read("nvidia-smi-lost/device-handle-unknown-error.610.57.04.txt")
    other = "Unable to determine the device handle for GPU0000:CB:00.0: Unknown Error"
    assert unreachable_gpus(line + other + "\n" + other) == [
        {"pci_bus_id": "0000:34:00.0", "index": 1, "message": line.strip()},
        {"pci_bus_id": "0000:CB:00.0", "index": None, "message": other},
    ]
    assert unreachable_gpus("GPU 0: NVIDIA H100 (UUID: GPU-1)\n") == []


def probe_node(stdout: str, stderr: str, exit_code: int) -> FakeNode:
    node = FakeNode(hardware())
    node.commands["nvidia-smi"] = lambda argv: (
        Completed(exit_code, stdout, stderr) if argv[1:] == ["-q", "-x"] else Completed(0, "", "")
    )
    return node


def test_the_probe_keeps_the_other_gpus_and_names_the_one_nvidia_smi_cannot_open() -> None:
    line = read("nvidia-smi-lost/device-handle-unknown-error.610.57.04.txt")
    node = probe_node(TWO_GPUS_XML.read_text(encoding="utf-8"), line, 15)
    report = collect(node, None, "not shipped", None)
    assert report["state"] == "ok" and report["gpu_count"] == 2
    assert report["lost_gpus"] == unreachable_gpus(line)
    assert GPU_REPORT_SHAPE.problem(report) is None
    lost = findings_of(with_gpu_report(report))["gpu.lost:0000:34:00.0"]
    assert lost.severity is Severity.CRITICAL and "Unable to determine" in lost.evidence


def test_exit_status_15_alone_is_a_lost_gpu_too() -> None:
    report = collect(probe_node("", "", 15), None, "not shipped", None)
    assert report["state"] == "unreadable"
    found = findings_of(with_gpu_report(report))
    assert found["gpu.lost:unnamed0"].severity is Severity.CRITICAL
    assert "fallen off the bus" in found["gpu.lost:unnamed0"].evidence
    assert found["gpu.unreadable"].severity is Severity.WARNING


def test_xid_79_in_the_kernel_log_makes_the_lost_gpu_the_drivers_word() -> None:
    events = parse_xid_events(read("kernel-log/xid79-fallen-off-the-bus.syslog"))
    assert [(event["xid"], event["pci"]) for event in events["events"]] == [(79, "0000:10:00")]
    parsed = parse_nvidia_smi_xml(lost_gpu_xml(0, "GPU is lost"))
    parsed["gpus"][0]["pci_bus_id"] = "00000000:10:00.0"  # where the log's GPU sat
    found = findings_of(with_gpu_report({**gpu_section(parsed), "xid_events": events}))
    assert found["gpu.lost:0"].confidence == "reported"
    assert "XID 79" in found["gpu.lost:0"].evidence
    xid = found["gpu.xid:79:0000:10:00"]
    assert (xid.severity, xid.failure_class, xid.remedy) == (Severity.CRITICAL, "xid", "reboot")
    assert "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" in xid.evidence


class LostNvml(FakeNvml):
    """NVML over the lab's hardware where GPU 1 is lost: no handle, or every call lost."""

    def __init__(self, state: dict[str, Any], no_handle: bool) -> None:
        super().__init__(state)
        self.no_handle = no_handle

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        if index == 1 and self.no_handle:
            raise self.fail(self.NVML_ERROR_GPU_IS_LOST)
        return super().nvmlDeviceGetHandleByIndex(index)

    def __getattribute__(self, name: str) -> Any:
        attribute = super().__getattribute__(name)
        if not name.startswith("nvmlDeviceGet") or name == "nvmlDeviceGetHandleByIndex":
            return attribute
        lost = super().__getattribute__("gpus")[1]

        def call(*args: Any) -> Any:
            if args and args[0] is lost:
                raise self.fail(self.NVML_ERROR_GPU_IS_LOST)
            return attribute(*args)

        return call


@pytest.mark.parametrize("no_handle", [True, False], ids=["no-handle", "every-call-lost"])
def test_nvml_marks_a_lost_gpu_and_reads_the_others(no_handle: bool) -> None:
    state = hardware()
    report = collect(FakeNode(state), LostNvml(state, no_handle), "fake", None)
    assert report["source"] == "nvml" and report["gpu_count"] == 8
    assert [gpu["lost"] for gpu in report["gpus"]] == [False, True] + [False] * 6
    evidence = report["gpus"][1]["lost_evidence"]
    assert evidence.startswith(
        "NVML: no handle for GPU 1" if no_handle else "NVML answered GPU_IS_LOST"
    )
    assert report["gpus"][2]["uuid"] == state["gpus"][2]["uuid"]
    assert findings_of(with_gpu_report(report))["gpu.lost:1"].severity is Severity.CRITICAL


# --- memory -----------------------------------------------------------------------------------


def a100_gpus(mutate: Any) -> dict[str, Any]:
    parsed = parse_nvidia_smi_xml(A100_XML.read_text(encoding="utf-8"))
    gpus = copy.deepcopy(parsed["gpus"])
    mutate(gpus[0])
    return with_gpu_report({"state": "ok", "gpus": gpus})


def test_the_healthy_a100_capture_has_no_health_finding() -> None:
    found = findings_of(a100_gpus(lambda gpu: None))
    assert not [finding for finding in found.values() if finding.failure_class]


def test_uncorrectable_ecc_names_sram_and_dram() -> None:
    def mutate(gpu: dict[str, Any]) -> None:
        gpu["ecc_errors"]["volatile"]["uncorrected"] = 3
        gpu["ecc_memory"]["volatile"] = {"sram": 1, "dram": 2}

    finding = findings_of(a100_gpus(mutate))["gpu.ecc_uncorrectable:0"]
    assert finding.severity is Severity.CRITICAL
    assert (finding.failure_class, finding.remedy) == ("memory.uncorrectable_ecc", "reset_gpu")
    assert "(SRAM 1, DRAM 2)" in finding.found
    assert "serial 1650010486369" in finding.evidence or "GPU 0" in finding.evidence


def test_lifetime_uncorrectable_ecc_alone_is_information_only() -> None:
    def mutate(gpu: dict[str, Any]) -> None:
        gpu["ecc_errors"]["aggregate"]["uncorrected"] = 2

    found = findings_of(a100_gpus(mutate))
    assert found["gpu.ecc_uncorrectable_history:0"].severity is Severity.INFO
    assert "gpu.ecc_uncorrectable:0" not in found


def test_sram_past_nvidias_threshold_is_critical_and_rma() -> None:
    def mutate(gpu: dict[str, Any]) -> None:
        gpu["ecc_memory"]["sram_threshold_exceeded"] = True

    finding = findings_of(a100_gpus(mutate))["gpu.sram_threshold_exceeded:0"]
    assert (finding.severity, finding.remedy) == (Severity.CRITICAL, "reseat_or_rma")


@pytest.mark.parametrize(
    ("rows", "finding_id", "severity", "remedy"),
    [
        ({"failure": True, "pending": True}, "gpu.row_remap_failure:0", Severity.CRITICAL,
         "reseat_or_rma"),
        ({"failure": False, "pending": True}, "gpu.row_remap_pending:0", Severity.WARNING,
         "reset_gpu"),
    ],
)  # fmt: skip
def test_row_remapping(rows: dict[str, Any], finding_id: str, severity: Severity,
                       remedy: str) -> None:  # fmt: skip
    counts = {"correctable": 4, "uncorrectable": 1}
    found = findings_of(a100_gpus(lambda gpu: gpu["remapped_rows"].update(rows, **counts)))
    assert (found[finding_id].severity, found[finding_id].remedy) == (severity, remedy)
    assert found[finding_id].confidence == "reported"
    assert "remapped rows: 4 correctable, 1 uncorrectable" in found[finding_id].evidence


# --- the driver's recovery action -------------------------------------------------------------


def test_a_recovery_action_in_the_xml_is_read_and_judged() -> None:
    text = read("nvidia-smi-xml/rtx-4000-sff-ada-v13.xml")
    assert parse_nvidia_smi_xml(text)["gpus"][0]["recovery_action"] == 0
    for words, value, severity in [("Node Reboot", 2, Severity.CRITICAL),
                                   ("GPU Reset", 1, Severity.CRITICAL),
                                   ("Something New", None, Severity.WARNING)]:  # fmt: skip
        changed = text.replace(
            "<gpu_recovery_action>None</gpu_recovery_action>",
            f"<gpu_recovery_action>{words}</gpu_recovery_action>",
        )
        parsed = parse_nvidia_smi_xml(changed)
        assert parsed["gpus"][0]["recovery_action"] == value
        finding = findings_of(with_gpu_report(gpu_section(parsed)))["gpu.recovery_action:0"]
        assert finding.severity is severity and finding.failure_class == "gpu.recovery_action"
    healthy = findings_of(with_gpu_report(gpu_section(parse_nvidia_smi_xml(text))))
    assert "gpu.recovery_action:0" not in healthy


# --- XIDs over a window -----------------------------------------------------------------------


def xid_lines(number: int, hours: list[int], words: str = "Graphics SM Warp Exception") -> str:
    return "".join(
        f"2026-12-0{1 + hour // 24}T{hour % 24:02d}:00:00+0000 node kernel: "
        f"NVRM: Xid (PCI:0000:18:00): {number}, pid=1896, name=python, {words}\n"
        for hour in hours
    )


def xid_findings(text: str) -> dict[str, Finding]:
    return findings_of(with_gpu_report({"xid_events": parse_xid_events(text)}))


def test_one_application_xid_is_the_applications() -> None:
    finding = xid_findings(xid_lines(13, [1]))["gpu.xid:13:0000:18:00"]
    assert (finding.severity, finding.remedy) == (Severity.WARNING, "restart_application")


def test_an_application_xid_again_and_again_within_a_day_is_the_nodes() -> None:
    finding = xid_findings(xid_lines(13, [1, 2, 3, 4, 5]))["gpu.xid:13:0000:18:00"]
    assert (finding.severity, finding.failure_class) == (Severity.WARNING, "xid.repeated")
    assert finding.remedy == "drain" and "5 within 24 h" in finding.found


def test_the_same_count_spread_over_days_is_no_burst() -> None:
    finding = xid_findings(xid_lines(13, [0, 30, 60, 90, 110]))["gpu.xid:13:0000:18:00"]
    assert finding.failure_class == "xid" and finding.remedy == "restart_application"
    assert "(5 times)" in finding.found


def test_a_benign_xid_once_is_information_and_in_a_storm_a_warning() -> None:
    once = xid_findings(xid_lines(63, [1], "Row Remapper: New row marked for remapping"))
    assert once["gpu.xid:63:0000:18:00"].severity is Severity.INFO
    storm = xid_findings(xid_lines(63, list(range(10)), "Row Remapper"))
    assert storm["gpu.xid:63:0000:18:00"].severity is Severity.WARNING
    assert storm["gpu.xid:63:0000:18:00"].remedy == "contact_support"


def test_xid_154_names_the_drivers_new_recovery_action() -> None:
    # The words of driver 610's XID 154 (tests/fixtures PROVENANCE: the incident log).
    words = "GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)"
    finding = xid_findings(xid_lines(154, [1], words))["gpu.xid:154:0000:18:00"]
    assert (finding.severity, finding.remedy) == (Severity.CRITICAL, "reboot")
    assert "NODE_REBOOT" in finding.found


def test_an_xid_the_catalogue_does_not_know_is_a_warning_to_look_up() -> None:
    finding = xid_findings(xid_lines(999, [1]))["gpu.xid:999:0000:18:00"]
    assert (finding.severity, finding.remedy) == (Severity.WARNING, "drain")


def test_most_in_window_counts_unknown_times_in_every_window() -> None:
    from datetime import datetime, timedelta

    start = datetime(2026, 12, 1)
    times = [start + timedelta(hours=h) for h in (0, 1, 30, 31, 32)]
    assert most_in_window(times, 24) == 3
    assert most_in_window([*times, None], 24) == 4
    assert most_in_window([], 24) == 0


# --- reports ----------------------------------------------------------------------------------


def test_reports_carry_the_health_fields() -> None:
    facts = with_gpu_report({"xid_events": parse_xid_events(xid_lines(79, [1], "fallen off"))})
    findings = evaluate("node-1", desired(), facts)
    result = DriftResult(findings=findings, checked_hosts=["node-1"])
    data = json.loads(render_json(result))
    xid = next(f for f in data["findings"] if f["id"] == "gpu.xid:79:0000:18:00")
    assert xid["health"]["failure_class"] == "xid" and xid["health"]["remedy"] == "reboot"
    assert xid["health"]["confidence"] == "reported" and "RESTART_BM" in xid["health"]["evidence"]
    assert all("health" not in f for f in data["findings"] if not f["id"].startswith("gpu."))
    root = ElementTree.fromstring(render_junit(result))
    case = next(c for c in root.iter("testcase") if c.get("name") == "gpu.xid:79:0000:18:00")
    properties = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert properties["failure_class"] == "xid" and properties["remedy"] == "reboot"
    text = render_prometheus(result)
    assert re.search(
        r'gpunode_health_finding\{host="node-1",id="gpu.xid:79:0000:18:00",failure_class="xid",'
        r'severity="critical",remedy="reboot",confidence="reported"\} 1',
        text,
    )


def test_judge_reads_a_report_without_any_gpu_section_keys() -> None:
    assert judge({}) == []


def test_the_node_textfile_says_which_gpu_is_lost_and_its_recovery_action() -> None:
    from gpunode.probe.textfile import render_prometheus as render_textfile

    state = hardware()
    report = collect(FakeNode(state), LostNvml(state, no_handle=True), "fake", None)
    report["gpus"][0]["recovery_action"] = 2
    text = render_textfile(report)
    assert 'gpunode_gpu_lost{gpu="1",uuid="",pci_bus_id=""} 1' in text
    assert re.search(r'gpunode_gpu_lost\{gpu="0",uuid="GPU-[^"]+",pci_bus_id="[^"]+"\} 0', text)
    assert re.search(r'gpunode_gpu_recovery_action\{gpu="0",[^}]+\} 2', text)


def test_the_lab_double_puts_a_gpu_into_the_lost_and_recovery_classes() -> None:
    """What the lab's nvidia-smi prints for ``gpunode-lab-hw set gpus.N.lost true`` and
    ``gpus.N.recovery_action Reboot`` is read as those classes, by nvidia-smi and by NVML."""
    state = hardware()
    state["gpus"][2]["lost"] = True
    state["gpus"][5]["recovery_action"] = "Reboot"
    report = collect(FakeNode(state), None, "not shipped", None)
    assert [gpu["lost"] for gpu in report["gpus"]] == [False, False, True] + [False] * 5
    assert [gpu["recovery_action"] for gpu in report["gpus"]] == [0, 0, None, 0, 0, 2, 0, 0]
    found = findings_of(with_gpu_report(report))
    assert found["gpu.lost:2"].severity is Severity.CRITICAL
    assert (found["gpu.recovery_action:5"].severity, found["gpu.recovery_action:5"].remedy) == (
        Severity.CRITICAL, "reboot"
    )  # fmt: skip
    through_nvml = collect(FakeNode(state), FakeNvml(state), "fake", None)
    assert through_nvml["gpus"][5]["recovery_action"] == 2

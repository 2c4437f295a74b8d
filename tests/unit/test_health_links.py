"""Link, clock and fabric health: PCIe, clocks and temperature, NVLink and the fabric,
NVSwitch SXids, InfiniBand ports.

Captures (tests/fixtures, PROVENANCE.md): nvidia-smi's XML of a real A100 (turned into the
faulty states nvidia-smi prints for them: a narrower link, an active slowdown reason, a fabric
still registering), ``nvidia-smi nvlink -s`` of a real 8-GPU A100 node and of a GPU whose
links are all inactive, the kernel lines of a real HGX node's NVSwitch driver, and ``ibstat``
of real H100 nodes with ports down.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import pytest

from gpunode.drift.findings import Severity
from gpunode.drift.rules import evaluate
from gpunode.health import catalogue, judge
from gpunode.health.finding import HealthFinding
from gpunode.health.infiniband import judge as judge_infiniband
from gpunode.probe.gpu_probe import parse_xid_events
from gpunode.probe.gpu_record import parse_nvidia_smi_xml, parse_nvlink_status
from gpunode.probe.parsers import GPU_REPORT_SHAPE, parse_ibstat
from tests.unit.test_drift_rules import DATA, desired, healthy_facts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
A100_XML = FIXTURES / "nvidia-smi-xml/a100-sxm4-v12.xml"


def read(relative: str) -> str:
    return (FIXTURES / relative).read_text(encoding="utf-8")


def a100(**values: str) -> dict[str, Any]:
    """The real A100 capture's GPU record, with ``values`` ('pci/...': text) put in."""
    root = ElementTree.fromstring(A100_XML.read_text(encoding="utf-8"))
    gpu = root.find("gpu")
    assert gpu is not None
    for path, text in values.items():
        element = gpu.find(path)
        assert element is not None, path
        element.text = text
    return parse_nvidia_smi_xml(ElementTree.tostring(root, encoding="unicode"))["gpus"][0]


def by_id(findings: list[HealthFinding]) -> dict[str, HealthFinding]:
    return {finding.id: finding for finding in findings}


def test_the_real_a100_capture_is_healthy_on_every_link_and_clock() -> None:
    gpu = a100()
    assert gpu["temperature_slowdown_c"] == 89 and gpu["pcie"]["width_max"] == 16
    assert judge({"gpus": [gpu]}) == []


# --- PCIe ----------------------------------------------------------------------------------


def test_a_link_narrower_than_its_siblings_is_a_warning_with_its_evidence() -> None:
    narrow = a100(**{"pci/pci_gpu_link_info/link_widths/current_link_width": "8x"})
    found = by_id(judge({"gpus": [a100(), {**narrow, "index": 1}]}))
    finding = found["gpu.pcie_width:1"]
    assert (finding.severity, finding.failure_class) == (
        catalogue.Severity.WARNING, "pcie.width_degraded")  # fmt: skip
    assert finding.found == "x8 (max x16)" and "other GPUs of its model at x16" in finding.evidence
    assert finding.remedy is catalogue.Remedy.RESEAT_OR_RMA and list(found) == ["gpu.pcie_width:1"]


@pytest.mark.parametrize("capture", ["a10g.xml", "tesla-t4.xml", "dual_2070-v13.xml"])
def test_real_gpus_all_at_x8_of_x16_are_the_platforms_slots_info_only(capture: str) -> None:
    gpus = parse_nvidia_smi_xml(read(f"nvidia-smi-xml/{capture}"))["gpus"]
    findings = judge({"gpus": gpus})
    assert findings and {f.id for f in findings} == {f"gpu.pcie_width:{g['index']}" for g in gpus}
    assert {(f.severity, f.confidence.value) for f in findings} == {
        (catalogue.Severity.INFO, "inferred")}  # fmt: skip


def test_a_lower_pcie_generation_is_no_fault_while_idle_and_a_warning_while_busy() -> None:
    lower = {"pci/pci_gpu_link_info/pcie_gen/current_link_gen": "1"}
    idle = a100(**lower, **{"clocks_event_reasons/clocks_event_reason_gpu_idle": "Active"})
    assert judge({"gpus": [idle]}) == []
    busy = a100(**lower, **{"utilization/gpu_util": "87 %"})
    finding = by_id(judge({"gpus": [busy]}))["gpu.pcie_generation:0"]
    assert finding.found == "Gen 1 (max Gen 4)" and finding.confidence.value == "inferred"


# --- clocks and temperature ----------------------------------------------------------------


@pytest.mark.parametrize(
    "reason",
    ["hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"],
)
def test_each_hardware_slowdown_reason_is_a_clocks_slowdown(reason: str) -> None:
    gpu = a100(**{f"clocks_event_reasons/clocks_event_reason_{reason}": "Active"})
    finding = by_id(judge({"gpus": [gpu]}))[f"gpu.throttle:0:{reason}"]
    assert finding.failure_class == "clocks.slowdown" and "27 C" in finding.evidence


def test_the_power_cap_and_idle_are_no_slowdown() -> None:
    gpu = a100(**{
        "clocks_event_reasons/clocks_event_reason_sw_power_cap": "Active",
        "clocks_event_reasons/clocks_event_reason_gpu_idle": "Active",
    })  # fmt: skip
    assert judge({"gpus": [gpu]}) == []


def test_a_gpu_at_its_own_slowdown_temperature_is_a_warning_one_degree_below_is_not() -> None:
    assert judge({"gpus": [a100(**{"temperature/gpu_temp": "88 C"})]}) == []
    finding = by_id(judge({"gpus": [a100(**{"temperature/gpu_temp": "89 C"})]}))[
        "gpu.temperature:0"
    ]
    assert finding.failure_class == "temperature.slowdown"
    assert finding.evidence.endswith("89 C, its slowdown threshold 89 C")


# --- NVLink and the fabric -------------------------------------------------------------------


def nvlink_report(text: str) -> dict[str, Any]:
    """GPU records carrying the NVLink states of ``nvidia-smi nvlink -s`` (as the probe adds)."""
    status = parse_nvlink_status(text)
    assert status["state"] == "ok"
    return {"gpus": [{**gpu, "lost": False} | {"nvlink": gpu} for gpu in status["gpus"]]}


def test_eight_a100s_with_every_link_up_have_no_nvlink_finding() -> None:
    assert judge(nvlink_report(read("nvlink/nvidia-smi.nvlink.status.a100"))) == []


def test_one_link_down_among_twelve_is_critical_naming_the_link() -> None:
    lines = read("nvlink/nvidia-smi.nvlink.status.a100").split("\n")
    third_gpu = next(number for number, line in enumerate(lines) if line.startswith("GPU 2:"))
    lines[third_gpu + 5] = lines[third_gpu + 5].split(":")[0] + ": <inactive>"
    found = by_id(judge(nvlink_report("\n".join(lines))))
    assert list(found) == ["gpu.nvlink_inactive:2"]
    finding = found["gpu.nvlink_inactive:2"]
    assert finding.severity is catalogue.Severity.CRITICAL and finding.found == "11 of 12 active"
    assert "links 4 inactive" in finding.evidence


def test_every_link_inactive_is_critical_beside_peers_and_a_warning_alone() -> None:
    alone = by_id(judge(nvlink_report(read("nvlink/bad_nvlink_status.txt"))))
    assert alone["gpu.nvlink_inactive:6"].severity is catalogue.Severity.WARNING
    both = read("nvlink/good_nvlink_status.txt") + read("nvlink/bad_nvlink_status.txt")
    beside = by_id(judge(nvlink_report(both)))
    assert beside["gpu.nvlink_inactive:6"].severity is catalogue.Severity.CRITICAL
    assert "gpu.nvlink_inactive:7" not in beside


@pytest.mark.parametrize(
    ("state", "status", "bad"),
    [("Completed", "Success", False), ("In Progress", "N/A", True), ("Not Started", "N/A", True),
     ("Completed", "Insufficient Resources", True), ("N/A", "N/A", False)],
)  # fmt: skip
def test_a_gpu_not_registered_with_the_fabric_is_critical(
    state: str, status: str, bad: bool
) -> None:
    found = by_id(judge({"gpus": [a100(**{"fabric/state": state, "fabric/status": status})]}))
    assert ("gpu.fabric:0" in found) is bad
    if bad:
        assert found["gpu.fabric:0"].failure_class == "fabric.not_registered"


# --- NVSwitch SXids --------------------------------------------------------------------------


def test_sxids_from_a_real_hgx_kernel_log_by_switch_fatal_and_not() -> None:
    events = parse_xid_events(read("kernel-log/nvswitch-sxid.menthos.log"))
    assert len(events["sxid_events"]) == 8 and [e["xid"] for e in events["events"]] == [64]
    detail = next(event for event in events["sxid_events"] if event["sxid"] == 10002)
    assert detail["fatal"] is None and detail["switch"] == 2
    found = by_id(judge({"gpus": [], "xid_events": events}))
    fatal = found["nvswitch.sxid:20034:0000:c2:00.0"]
    assert (fatal.severity, fatal.failure_class, fatal.remedy) == (
        catalogue.Severity.CRITICAL, "nvswitch.sxid_fatal", catalogue.Remedy.REBOOT)  # fmt: skip
    assert "(2 times)" in fatal.found and "NVSwitch 0" in fatal.evidence
    assert {key for key in found if key.startswith("nvswitch.sxid:20034:")} == {
        f"nvswitch.sxid:20034:0000:{bus}:00.0" for bus in ("c2", "c3", "c4", "c5")
    }
    quiet = found["nvswitch.sxid:19084:0000:c6:00.0"]
    assert (
        quiet.severity is catalogue.Severity.INFO
        and quiet.failure_class == "nvswitch.sxid_non_fatal"
    )
    assert not any(key.startswith("nvswitch.sxid:10002") for key in found)  # a detail line
    assert "gpu.xid:64:0000:0f:00" in found


def test_a_non_fatal_sxid_again_and_again_is_a_warning() -> None:
    line = read("kernel-log/nvswitch-sxid.menthos.log").split("\n")[0]
    found = by_id(judge({"gpus": [], "xid_events": parse_xid_events("\n".join([line] * 10))}))
    finding = found["nvswitch.sxid:19084:0000:c6:00.0"]
    assert finding.failure_class == "nvswitch.sxid_repeated"
    assert finding.severity is catalogue.Severity.WARNING and "(10 times)" in finding.found


def test_the_probe_report_with_sxids_fits_its_shape() -> None:
    events = parse_xid_events(read("kernel-log/nvswitch-sxid.menthos.log"))
    report = {
        "schema": "gpunode.gpu-report/1",
        "state": "ok",
        "gpus": [a100()],
        "xid_events": events,
    }
    assert GPU_REPORT_SHAPE.problem(report) is None
    events["sxid_events"][0]["fatal"] = "yes"
    assert "fatal" in str(GPU_REPORT_SHAPE.problem(report))


# --- InfiniBand --------------------------------------------------------------------------------


def test_ports_down_on_a_real_h100_node_are_each_critical() -> None:
    ports = parse_ibstat(read("ibstat/ibstat.47.0.h100.some.down.0"))["ports"]
    found = by_id(list(judge_infiniband(ports)))
    down = [f"{port['ca']}/{port['port']}" for port in ports if port["state"] != "Active"]
    assert len(down) == 3 and sorted(found) == sorted(f"ib.port:{name}" for name in down)
    assert all(finding.failure_class == "infiniband.port_down" for finding in found.values())
    assert "State Down" in found[f"ib.port:{down[0]}"].evidence


@pytest.mark.parametrize(
    "capture", ["ibstat.47.0.h100.all.active.0", "ibstat.47.0.a100.all.active.0"]
)
def test_real_nodes_with_every_port_up_have_no_finding(capture: str) -> None:
    assert list(judge_infiniband(parse_ibstat(read(f"ibstat/{capture}"))["ports"])) == []


def test_a_port_at_half_its_siblings_rate_is_degraded_and_the_declared_rate_wins() -> None:
    ports = parse_ibstat(read("ibstat/ibstat.47.0.h100.all.active.0"))["ports"]
    ports[0]["rate"] = 200
    found = by_id(list(judge_infiniband(ports)))
    name = f"{ports[0]['ca']}/{ports[0]['port']}"
    assert list(found) == [f"ib.rate:{name}"]
    assert found[f"ib.rate:{name}"].expected == "400 Gb/s"
    assert found[f"ib.rate:{name}"].confidence.value == "inferred"
    declared = by_id(list(judge_infiniband(ports, declared_rate=100)))
    assert declared == {}


# --- in the drift check ----------------------------------------------------------------------


def test_drift_reports_the_interconnect_classes_with_their_health_fields() -> None:
    facts = healthy_facts()
    gpu = facts["gpu"]["gpus"][0]
    gpu["pcie"] = {"gen_current": 5, "gen_max": 5, "width_current": 8, "width_max": 16}
    facts["gpu"]["xid_events"] = parse_xid_events(read("kernel-log/nvswitch-sxid.menthos.log"))
    found = {finding.id: finding for finding in evaluate("node-1", desired(), facts)}
    assert found["gpu.pcie_width:0"].failure_class == "pcie.width_degraded"
    fatal = found["nvswitch.sxid:20034:0000:c2:00.0"]
    assert fatal.severity is Severity.CRITICAL and fatal.remedy == "reboot"


def test_drift_leaves_links_down_to_gpu_nvlink_where_the_inventory_declares_them() -> None:
    facts = healthy_facts()
    nvlink = facts["gpu"]["gpus"][0]["nvlink"]
    nvlink.update(active=nvlink["total"] - 1)
    declared = {finding.id for finding in evaluate("node-1", desired(), facts)}
    assert "gpu.nvlink:0" in declared and "gpu.nvlink_inactive:0" not in declared
    data = {
        **DATA,
        "expected_hardware": {**DATA["expected_hardware"], "nvlink_links_per_gpu": None},
    }
    undeclared = {finding.id for finding in evaluate("node-1", desired(data), facts)}
    assert "gpu.nvlink_inactive:0" in undeclared and "gpu.nvlink:0" not in undeclared


def h100_query_gpu(**temperatures: str) -> dict[str, Any]:
    """The real H100 (driver 590) of the capture's nvidia-smi -q, its temperature lines set."""
    from gpunode.probe.query_text import parse_query_gpus
    from lab.hwsim import nvidia_smi

    capture = read("nvidia-smi-capture/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt")
    text = nvidia_smi.capture_sections(capture)["load :: query (-q)"]
    for label, value in temperatures.items():
        line = next(line for line in text.split("\n") if line.strip().startswith(label + " "))
        text = text.replace(line, line.split(" : ")[0] + " : " + value)
    return parse_query_gpus(text)["gpus"][0]


def test_driver_590s_t_limit_headroom_at_the_slowdowns_is_a_warning() -> None:
    gpu = h100_query_gpu()
    assert gpu["temperature_tlimit_c"] == {"current": 26, "slowdown": -2}
    assert judge({"gpus": [gpu]}) == []
    hot = h100_query_gpu(**{"GPU T.Limit Temp": "-2 C"})
    finding = by_id(judge({"gpus": [hot]}))["gpu.temperature:0"]
    assert (
        finding.found == "T.Limit headroom -2 C"
        and "Slowdown T.Limit Temp -2 C" in finding.evidence
    )
    assert judge({"gpus": [h100_query_gpu(**{"GPU T.Limit Temp": "-1 C"})]}) == []

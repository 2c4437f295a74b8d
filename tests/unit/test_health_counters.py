"""Error counters of the interconnects: NVLink's replay, recovery and CRC counters
(``nvidia-smi nvlink -e``) and InfiniBand ports' counters (/sys/class/infiniband).

Captures (tests/fixtures, PROVENANCE.md): ``nvidia-smi nvlink -e`` of a real 8x A100-SXM4-40GB
node (every counter 0), and the sysfs tree of a real H100 node's ten RDMA devices (gpud's test
data), whose counters show receive errors, buffer overruns and, on one port, 255 link-downed
events (the counter's 8-bit maximum).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from gpunode.drift.findings import Severity
from gpunode.drift.rules import evaluate
from gpunode.health import catalogue, judge
from gpunode.health.finding import HealthFinding
from gpunode.health.infiniband_counters import judge as judge_ib_counters
from gpunode.probe.gpu_record import parse_nvlink_errors
from gpunode.probe.parsers import (
    GPU_REPORT_SHAPE,
    IB_COUNTER_NAMES,
    IB_COUNTERS_COMMAND,
    IB_COUNTERS_ROOT,
    SECTION_COMMANDS,
    parse_ib_counters,
    parse_section,
)
from tests.unit.test_drift_rules import desired, healthy_facts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
A100_ERRORS = "nvlink/nvidia-smi.nvlink.errors.a100-sxm4-40gb.535.161.08"


def read(relative: str) -> str:
    return (FIXTURES / relative).read_text(encoding="utf-8")


def with_count(text: str, gpu: int, link: int, counter: str, count: str) -> str:
    """The capture with one counter line of one GPU's link set to ``count``."""
    block_start = text.index(f"GPU {gpu}: ")
    line = f"\t Link {link}: {counter}: 0\n"
    at = text.index(line, block_start)
    return text[:at] + f"\t Link {link}: {counter}: {count}\n" + text[at + len(line) :]


def report_of(text: str) -> dict[str, Any]:
    """GPU records carrying ``nvidia-smi nvlink -e``'s counters, as the probe adds them."""
    errors = parse_nvlink_errors(text)
    assert errors["state"] == "ok", errors
    return {
        "gpus": [
            {"index": gpu["index"], "uuid": gpu["uuid"], "lost": False, "nvlink_errors": gpu}
            for gpu in errors["gpus"]
        ]
    }


def by_id(findings: list[HealthFinding]) -> dict[str, HealthFinding]:
    return {finding.id: finding for finding in findings}


# --- NVLink error counters: the parser ---------------------------------------------------------


def test_the_real_a100_capture_reads_every_link_of_every_gpu_at_zero() -> None:
    errors = parse_nvlink_errors(read(A100_ERRORS))
    assert errors["state"] == "ok" and errors["problems"] == []
    assert [gpu["index"] for gpu in errors["gpus"]] == list(range(8))
    assert errors["gpus"][0]["uuid"] == "GPU-fde0a018-ad1a-bbec-ccf6-50a9f64bd178"
    for gpu in errors["gpus"]:
        assert gpu["state"] == "ok"
        assert gpu["links"] == [
            {"link": link, "replay": 0, "recovery": 0, "crc": 0} for link in range(12)
        ]
    assert judge(report_of(read(A100_ERRORS))) == []


def test_what_the_parser_cannot_read_is_named_and_the_rest_kept() -> None:
    """The capture as its author ran it (a shell loop printing a banner before each GPU), a
    counter of another driver, a line cut short: every GPU is kept, each odd line named."""
    text = read(A100_ERRORS)
    blocks = text.split("GPU ")[1:]
    banners = "".join(
        f"=== GPU {n} NVLink Errors ===\nGPU {block}" for n, block in enumerate(blocks)
    )
    banners = banners.replace(
        "\t Link 3: CRC Errors: 0\n", "\t Link 3: CRC Errors: 0\n\t Link 3: Rx Errors: 7\n", 1
    )
    banners = banners.replace("\t Link 5: Replay Errors: 0\n", "\t Link 5: Replay Err\n", 1)
    errors = parse_nvlink_errors(banners)
    assert errors["state"] == "ok"
    assert len(errors["gpus"]) == 8
    assert errors["problems"][0] == "line 1 comes before any GPU: '=== GPU 0 NVLink Errors ==='"
    assert "not understood: '\\t Link 5: Replay Err'" in errors["problems"][1]
    first = errors["gpus"][0]
    assert first["state"] == "unreadable" and "=== GPU 1 NVLink Errors ===" in first["reason"]
    assert first["links"][3]["other"] == {"Rx Errors": 7}
    assert "replay" not in first["links"][5] and first["links"][5]["crc"] == 0
    # The banners of GPUs 1..7 are named under the GPU before them; their own counters stay.
    assert all(len(gpu["links"]) == 12 for gpu in errors["gpus"])


def test_output_that_is_not_nvlink_counters_is_unreadable_and_says_why() -> None:
    assert parse_nvlink_errors("")["reason"] == "empty output"
    assert parse_nvlink_errors("", empty_ok=True)["gpus"] == []
    nonsense = parse_nvlink_errors("Failed to initialize NVML: Unknown Error\n")
    assert nonsense["state"] == "unreadable"
    assert nonsense["reason"].startswith("line 1 comes before any GPU")
    huge = parse_nvlink_errors("GPU 0: X (UUID: GPU-a)\n\t Link 0: Replay Errors: " + "9" * 5000)
    assert huge["state"] == "unreadable" and "characters long" in huge["reason"]


def test_a_gpu_whose_links_are_all_inactive_has_no_counters() -> None:
    errors = parse_nvlink_errors(
        "GPU 6: NVIDIA A100-SXM4-80GB (UUID: GPU-x)\n"
        "NVML: Unable to retrieve NVLink information as all links are inactive\n"
    )
    assert errors["gpus"][0]["state"] == "none" and errors["gpus"][0]["links"] == []


# --- NVLink error counters: the judge -------------------------------------------------------


def test_replay_or_crc_errors_on_a_link_are_a_warning_naming_gpu_and_link() -> None:
    text = with_count(read(A100_ERRORS), 3, 7, "Replay Errors", "42")
    text = with_count(text, 3, 9, "CRC Errors", "5")
    found = by_id(judge(report_of(text)))
    assert list(found) == ["gpu.nvlink_errors:3"]
    finding = found["gpu.nvlink_errors:3"]
    assert finding.failure_class == "nvlink.errors"
    assert finding.severity is catalogue.Severity.WARNING
    assert finding.found == "47 on 2 links: link 7: replay 42; link 9: CRC 5"
    assert finding.evidence.startswith("GPU 3: nvidia-smi nvlink -e: link 7: replay 42")
    assert finding.remedy is catalogue.Remedy.RESET_GPU
    assert finding.if_it_persists is catalogue.Remedy.RESEAT_OR_RMA


def test_a_recovery_error_is_critical_and_the_id_keeps_no_count() -> None:
    once = with_count(read(A100_ERRORS), 0, 2, "Recovery Errors", "1")
    again = with_count(read(A100_ERRORS), 0, 2, "Recovery Errors", "3")
    first, later = by_id(judge(report_of(once))), by_id(judge(report_of(again)))
    assert list(first) == list(later) == ["gpu.nvlink_recovery_errors:0"]
    assert first["gpu.nvlink_recovery_errors:0"].severity is catalogue.Severity.CRITICAL
    assert first["gpu.nvlink_recovery_errors:0"].found == "1 on 1 link: link 2: recovery 1"
    assert later["gpu.nvlink_recovery_errors:0"].found == "3 on 1 link: link 2: recovery 3"


def test_counters_of_a_lost_gpu_or_of_another_drivers_names_are_not_judged() -> None:
    report = report_of(with_count(read(A100_ERRORS), 1, 0, "CRC Errors", "8"))
    report["gpus"][1]["lost"] = True
    assert [finding.failure_class for finding in judge(report)] == ["gpu.lost"]
    odd = parse_nvlink_errors("GPU 0: X (UUID: GPU-a)\n\t Link 0: Rx Errors: 900\n")
    assert judge({"gpus": [{"index": 0, "nvlink_errors": odd["gpus"][0]}]}) == []


def test_many_links_are_named_up_to_a_limit() -> None:
    text = read(A100_ERRORS)
    for link in range(12):
        text = with_count(text, 5, link, "Replay Errors", "1")
    finding = by_id(judge(report_of(text)))["gpu.nvlink_errors:5"]
    assert finding.found.startswith("12 on 12 links: link 0: replay 1;")
    assert finding.found.endswith("link 5: replay 1 (and 6 more links)")


# --- NVLink error counters: the drift check -------------------------------------------------


def test_drift_reports_nvlink_errors_with_class_and_severity_and_unread_lines() -> None:
    facts = healthy_facts()
    gpu = facts["gpu"]["gpus"][1]
    gpu["nvlink_errors"] = {
        "source": "nvidia-smi nvlink -e",
        "state": "ok",
        "links": [{"link": 4, "replay": 0, "recovery": 2, "crc": 0}],
    }
    facts["gpu"]["problems"]["nvlink_errors"] = ["line 9 not understood: 'x'"]
    found = {finding.id: finding for finding in evaluate("node-1", desired(), facts)}
    recovery = found["gpu.nvlink_recovery_errors:1"]
    assert recovery.severity is Severity.CRITICAL
    assert (recovery.failure_class, recovery.remedy) == ("nvlink.recovery_errors", "reset_gpu")
    unread = found["nvlink_errors.unread_line"]
    assert unread.severity is Severity.WARNING and "line 9 not understood" in unread.found


def test_a_report_whose_counters_are_not_numbers_is_refused_by_its_shape() -> None:
    gpu = {"index": 0, "nvlink_errors": {"state": "ok", "links": [{"link": 0, "replay": "lots"}]}}
    report = {"schema": "gpunode.gpu-report/1", "state": "ok", "gpus": [gpu]}
    problem = GPU_REPORT_SHAPE.problem(report)
    assert problem is not None and "replay" in problem


# --- InfiniBand port counters ----------------------------------------------------------------

H100_SYSFS = FIXTURES / "infiniband-sysfs/sys-class-infiniband-h100.0"


def sysfs_section(root: Path) -> dict[str, Any]:
    """What the drift check's ib_counters section reads on a node whose sysfs is ``root``:
    the section's own shell command, run by sh, with the root put in its place."""
    command = SECTION_COMMANDS["ib_counters"].replace(IB_COUNTERS_ROOT, str(root))
    completed = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    return parse_section("ib_counters", completed.stdout.splitlines())


def test_the_real_h100_sysfs_tree_is_read_port_by_port() -> None:
    section = sysfs_section(H100_SYSFS)
    assert section["state"] == "ok" and section["problems"] == []
    assert [port["ca"] for port in section["ports"]] == [
        "mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9",
        "mlx5_bond_0",
    ]  # fmt: skip
    flapped = section["ports"][1]
    assert (flapped["port"], flapped["counters"]["link_downed"]) == (1, 255)
    assert set(flapped["counters"]) == set(IB_COUNTER_NAMES)
    assert flapped["counters"]["port_rcv_errors"] == int(
        (H100_SYSFS / "mlx5_1/ports/1/counters/port_rcv_errors").read_text()
    )


def test_a_node_without_rdma_devices_has_no_ports(tmp_path: Path) -> None:
    assert sysfs_section(tmp_path / "absent") == {
        "state": "ok", "command": IB_COUNTERS_COMMAND, "ports": [], "problems": [],
    }  # fmt: skip


def test_the_judge_names_each_ports_errors_and_the_flapped_link() -> None:
    found = by_id(list(judge_ib_counters(sysfs_section(H100_SYSFS)["ports"])))
    downed = found["ib.link_downed:mlx5_1/1"]
    assert (downed.failure_class, downed.severity) == ("infiniband.link_downed", Severity.WARNING)
    assert downed.found == "link_downed 255"
    assert downed.remedy is catalogue.Remedy.RESEAT_OR_RMA
    errors = found["ib.counters:mlx5_0/1"]
    assert errors.failure_class == "infiniband.errors"
    assert errors.found == "port_rcv_errors 14, excessive_buffer_overrun_errors 15"
    assert errors.evidence.startswith("/sys/class/infiniband/mlx5_0/ports/1/counters: ")
    assert "ib.link_downed:mlx5_0/1" not in found
    assert len(found) == 10  # 9 ports with receive errors, one of them also flapped


def test_symbol_errors_and_link_recoveries_count_only_over_ibqueryerrors_ten() -> None:
    port = {"ca": "mlx5_2", "port": 1, "counters": dict.fromkeys(IB_COUNTER_NAMES, 0)}
    port["counters"].update(symbol_error=10, link_error_recovery=10, VL15_dropped=500)
    assert list(judge_ib_counters([port])) == []
    port["counters"]["symbol_error"] = 11
    (finding,) = judge_ib_counters([port])
    assert (finding.id, finding.found) == ("ib.counters:mlx5_2/1", "symbol_error 11")
    assert "symbol_error over 10" in finding.evidence


def test_counter_lines_not_understood_are_named_and_the_rest_kept() -> None:
    text = (
        "mlx5_0/ports/1/counters/symbol_error 3\n"
        "cat: /sys/class/infiniband/mlx5_0/ports/1/counters/link_downed: Input/output error\n"
        "mlx5_0/ports/1/counters/port_rcv_errors lots\n"
        "../../etc/ports/1/counters/symbol_error 1\n"
        "mlx5_0/ports/1/counters/port_xmit_discards 7\n"
    )
    section = parse_ib_counters(text)
    assert section["state"] == "ok"
    assert section["ports"] == [
        {"ca": "mlx5_0", "port": 1, "counters": {"symbol_error": 3, "port_xmit_discards": 7}}
    ]
    assert [problem.split(" not understood")[0] for problem in section["problems"]] == [
        "line 2", "line 3", "line 4",
    ]  # fmt: skip


def test_the_judged_counters_are_the_ones_the_node_is_asked_for() -> None:
    assert set(IB_COUNTER_NAMES) == set(catalogue.IB_COUNTER_LIMITS)


def test_drift_reports_ib_counters_with_class_and_severity() -> None:
    facts = healthy_facts()
    facts["ib_counters"] = sysfs_section(H100_SYSFS)
    facts["ib_counters"]["problems"] = ["line 3 not understood: 'x'"]
    found = {finding.id: finding for finding in evaluate("node-1", desired(), facts)}
    downed = found["ib.link_downed:mlx5_1/1"]
    assert (downed.severity, downed.failure_class) == (Severity.WARNING, "infiniband.link_downed")
    assert found["ib_counters.unread_line"].severity is Severity.WARNING
    facts["ib_counters"] = {"state": "ok", "ports": "many"}
    unreadable = {finding.id for finding in evaluate("node-1", desired(), facts)}
    assert "ib_counters.unreadable" in unreadable


def test_hostile_counter_lines_are_named_escaped_and_never_judged() -> None:
    """A node's words are data: a device name with terminal escapes, a path that climbs out of
    the tree, a count past any counter's width are refused line by line, quoted as repr."""
    text = (
        "\x1b[31mmlx5_0/ports/1/counters/symbol_error 99\n"
        "mlx5_0/ports/1/counters/../../../../etc/shadow 1\n"
        "mlx5_0/ports/1/counters/symbol_error 999999999999999999999999\n"
        "mlx5_0/ports/1/counters/symbol_error 12\n"
    )
    section = parse_ib_counters(text)
    assert section["ports"] == [{"ca": "mlx5_0", "port": 1, "counters": {"symbol_error": 12}}]
    assert len(section["problems"]) == 3
    assert "\\x1b[31m" in section["problems"][0] and "\x1b" not in section["problems"][0]
    (finding,) = judge_ib_counters(section["ports"])
    assert finding.found == "symbol_error 12"

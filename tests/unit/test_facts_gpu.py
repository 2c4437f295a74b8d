"""GpuDevices parses real nvidia-smi XML of several schema versions, and names bad output."""

from __future__ import annotations

from pathlib import Path

import pytest

from facts.gpu import ABSENT_MARKER, EXIT_MARKER, GpuDevices, parse_nvidia_smi_xml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi-xml"


def lines_of(name: str, exit_code: int = 0) -> list[str]:
    return [*(FIXTURES / name).read_text().splitlines(), f"{EXIT_MARKER}{exit_code}"]


def test_a100_v12_capture() -> None:
    report = parse_nvidia_smi_xml(lines_of("a100-sxm4-v12.xml"))
    assert report["state"] == "ok"
    assert report["driver_version"] == "535.54.03"
    assert report["cuda_version"] == "12.2"
    (gpu,) = report["gpus"]
    assert gpu["name"] == "NVIDIA A100-SXM4-80GB"
    assert gpu["bus_id"] == "00000000:01:00.0"
    assert gpu["persistence_mode"] == "Disabled"
    assert (gpu["mig_current"], gpu["mig_pending"]) == ("Enabled", "Enabled")
    assert (gpu["ecc_current"], gpu["ecc_pending"]) == ("Enabled", "Enabled")
    # v12 moved power limits under gpu_power_readings.
    assert gpu["power_limit_w"] == 500.0
    assert gpu["power_min_w"] == 100.0 and gpu["power_max_w"] == 500.0


@pytest.mark.parametrize(
    ("name", "product", "limit"),
    [("tesla-t4.xml", "Tesla T4", 70.0), ("a10g.xml", "NVIDIA A10G", 300.0)],
)
def test_v11_captures_use_the_older_power_readings(name: str, product: str, limit: float) -> None:
    report = parse_nvidia_smi_xml(lines_of(name))
    assert report["driver_version"] == "515.105.01"
    (gpu,) = report["gpus"]
    assert gpu["name"] == product
    assert gpu["power_limit_w"] == limit
    assert gpu["uuid"].startswith("GPU-")


def test_driver_not_loaded_is_unreadable_with_reason() -> None:
    output = [
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
        f"{EXIT_MARKER}9",
    ]
    report = parse_nvidia_smi_xml(output)
    assert report["state"] == "unreadable"
    assert report["reason"].startswith("nvidia-smi -q -x failed: NVIDIA driver is not loaded")
    assert report["gpus"] == []


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        ([f"{EXIT_MARKER}0"], "nvidia-smi -q -x printed nothing"),
        (["<nvidia_smi_log><gpu id='x'>", f"{EXIT_MARKER}0"], "output is not valid XML"),
        (["<html></html>", f"{EXIT_MARKER}0"], "has root <html>, not <nvidia_smi_log>"),
    ],
    ids=["empty", "truncated", "wrong-document"],
)
def test_bad_output_is_unreadable_never_an_empty_ok(output: list[str], reason: str) -> None:
    report = parse_nvidia_smi_xml(output)
    assert report["state"] == "unreadable"
    assert reason in report["reason"]


def test_missing_tool_is_absent() -> None:
    assert parse_nvidia_smi_xml([ABSENT_MARKER])["state"] == "absent"


def test_fact_command_reports_exit_code_and_absence() -> None:
    command = GpuDevices().command()
    assert "nvidia-smi -q -x" in command
    assert EXIT_MARKER in command and ABSENT_MARKER in command

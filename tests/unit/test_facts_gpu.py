"""GpuDevices parses real nvidia-smi XML of several schema versions, and names bad output."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from facts.gpu import (
    MIG_LISTING_SECTIONS,
    SECTIONS,
    XML_PART,
    GpuDevices,
    parse_fact_output,
    parse_nvidia_smi_xml,
)
from gpunode import framing
from gpunode.framing import PartOutput
from gpunode.probe import gpu_probe, gpu_record

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi-xml"


def xml_output(lines: list[str], exit_code: int = 0) -> list[str]:
    """What the fact command prints when ``nvidia-smi -q -x`` printed ``lines``."""
    return framing.output_of({XML_PART: PartOutput(XML_PART, lines, [], exit_code)})


def lines_of(name: str, exit_code: int = 0) -> list[str]:
    return xml_output((FIXTURES / name).read_text().splitlines(), exit_code)


XML_FIXTURES = sorted(path.name for path in FIXTURES.glob("*.xml"))
MIG_LISTINGS = {"mig_profiles", "gpu_instances", "compute_pids"}


@pytest.mark.parametrize("name", XML_FIXTURES)
def test_roles_and_drift_read_the_same_gpu_record(name: str) -> None:
    """The fact (roles) and the probe (drift, metrics) build one record from the same XML."""
    fact = parse_nvidia_smi_xml(lines_of(name))
    probe = gpu_probe.parse_nvidia_smi_xml((FIXTURES / name).read_text())
    assert fact["state"] == probe["state"] == "ok"
    assert fact["driver_version"] == probe["driver_version"]
    assert [set(gpu) for gpu in fact["gpus"]] == [gpu_record.RECORD_KEYS | MIG_LISTINGS] * len(
        probe["gpus"]
    )
    assert [{k: gpu[k] for k in gpu_record.RECORD_KEYS} for gpu in fact["gpus"]] == probe["gpus"]


def test_a100_v12_capture() -> None:
    report = parse_nvidia_smi_xml(lines_of("a100-sxm4-v12.xml"))
    assert report["state"] == "ok"
    assert report["driver_version"] == "535.54.03"
    assert report["cuda_version"] == "12.2"
    (gpu,) = report["gpus"]
    assert gpu["name"] == "NVIDIA A100-SXM4-80GB"
    assert gpu["pci_bus_id"] == "00000000:01:00.0"
    assert gpu["persistence_mode"] is False
    assert gpu["mig_mode"] == {"current": True, "pending": True}
    assert gpu["ecc_mode"] == {"current": True, "pending": True}
    # v12 moved power limits under gpu_power_readings.
    assert gpu["power_w"]["limit"] == 500.0
    assert gpu["power_w"]["min_limit"] == 100.0 and gpu["power_w"]["max_limit"] == 500.0


@pytest.mark.parametrize(
    ("name", "product", "limit"),
    [("tesla-t4.xml", "Tesla T4", 70.0), ("a10g.xml", "NVIDIA A10G", 300.0)],
)
def test_v11_captures_use_the_older_power_readings(name: str, product: str, limit: float) -> None:
    report = parse_nvidia_smi_xml(lines_of(name))
    assert report["driver_version"] == "515.105.01"
    (gpu,) = report["gpus"]
    assert gpu["name"] == product
    assert gpu["power_w"]["limit"] == limit
    assert gpu["uuid"].startswith("GPU-")


def test_driver_not_loaded_is_unreadable_with_reason() -> None:
    output = xml_output(
        ["NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."], 9
    )
    report = parse_nvidia_smi_xml(output)
    assert report["state"] == "unreadable"
    assert report["reason"].startswith("nvidia-smi -q -x failed: NVIDIA driver is not loaded")
    assert report["gpus"] == []


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        ([], "nvidia-smi -q -x printed nothing"),
        (["<nvidia_smi_log><gpu id='x'>"], "not well-formed XML, truncated"),
        (["<html></html>"], "root element is <html>, not <nvidia_smi_log>"),
    ],
    ids=["empty", "truncated", "wrong-document"],
)
def test_bad_output_is_unreadable_never_an_empty_ok(output: list[str], reason: str) -> None:
    report = parse_nvidia_smi_xml(xml_output(output))
    assert report["state"] == "unreadable"
    assert reason in report["reason"]


def test_missing_tool_is_absent() -> None:
    absent = framing.output_of({XML_PART: PartOutput(XML_PART, absent=True)})
    assert parse_nvidia_smi_xml(absent)["state"] == "absent"
    # pyinfra (and a fact batch) check requires_command and give default() without it.
    assert GpuDevices().requires_command() == "nvidia-smi"
    assert GpuDevices.default()["state"] == "absent"
    assert GpuDevices.default()["gpus"] == []


FAKE_NVIDIA_SMI = """#!/bin/sh
echo "$*" >> "$GPUNODE_TEST_LOG"
case "$*" in
  "-q -x") cat "$GPUNODE_TEST_XML"; exit "$GPUNODE_TEST_RC" ;;
  mig*) echo "No MIG-enabled devices found." ;;
  --query-gpu=mig.mode.current,mig.mode.pending*)
    [ "$GPUNODE_TEST_MIG" = fail ] && { echo "Failed to initialize NVML"; exit 9; }
    echo "$GPUNODE_TEST_MIG" ;;
esac
"""


def run_fact_command(
    tmp_path: Path, exit_code: int, mig: str = "[N/A], [N/A]"
) -> tuple[list[str], list[str]]:
    """(the fact command's output, the nvidia-smi calls) with a stand-in nvidia-smi."""
    import os
    import subprocess

    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text(FAKE_NVIDIA_SMI)
    tool.chmod(0o755)
    log = tmp_path / "calls"
    log.touch()
    env = {
        **os.environ,
        "PATH": f"{tool.parent}:/usr/bin:/bin",
        "GPUNODE_TEST_LOG": str(log),
        "GPUNODE_TEST_XML": str(FIXTURES / "a100-sxm4-v12.xml"),
        "GPUNODE_TEST_RC": str(exit_code),
        "GPUNODE_TEST_MIG": mig,
    }
    done = subprocess.run(
        ["sh", "-c", GpuDevices().command()], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout.splitlines(), log.read_text().splitlines()


MIG_QUERY = "--query-gpu=mig.mode.current,mig.mode.pending --format=csv,noheader"
COMPUTE_APPS = SECTIONS["compute_apps"].removeprefix("nvidia-smi ")


def test_fact_command_without_mig_reads_no_mig_listing(tmp_path: Path) -> None:
    output, calls = run_fact_command(tmp_path, 0, mig="Disabled, Disabled")
    assert calls == ["-q -x", MIG_QUERY, COMPUTE_APPS]
    report = parse_fact_output(output)
    assert report["state"] == "ok"
    assert report["listing_problems"] == {}
    assert len(report["gpus"]) == 1
    assert report["gpus"][0]["gpu_instances"] == []


@pytest.mark.parametrize("modes", ["Enabled, Enabled", "Disabled, Enabled"])
def test_fact_command_reads_the_report_and_the_listings(tmp_path: Path, modes: str) -> None:
    # MIG on now, or pending (enabled, awaiting a reset): the listings are read.
    output, calls = run_fact_command(tmp_path, 0, mig=modes)
    assert calls == [
        "-q -x",
        MIG_QUERY,
        *(command.removeprefix("nvidia-smi ") for command in SECTIONS.values()),
    ]
    report = parse_fact_output(output)
    assert report["state"] == "ok"
    assert report["listing_problems"] == {}
    assert len(report["gpus"]) == 1


def test_a_failed_mig_query_leaves_the_listings_unread_and_says_so(tmp_path: Path) -> None:
    output, calls = run_fact_command(tmp_path, 0, mig="fail")
    assert calls == ["-q -x", MIG_QUERY, COMPUTE_APPS]
    report = parse_fact_output(output)
    assert report["state"] == "ok"
    assert set(report["listing_problems"]) == set(MIG_LISTING_SECTIONS)
    assert report["listing_problems"]["gpu_instances"] == "nvidia-smi mig -lgi was not run"


# --- application clocks ---------------------------------------------------------------------

DEPRECATED = "Requested functionality has been deprecated"


def test_application_clocks_and_supported_clocks_of_the_a100_capture() -> None:
    (gpu,) = parse_nvidia_smi_xml(lines_of("a100-sxm4-v12.xml"))["gpus"]
    assert gpu["application_clocks_mhz"] == {"memory": 1593, "graphics": 1275}
    assert gpu["application_clocks_note"] == ""
    (supported,) = gpu["supported_clocks_mhz"]
    assert supported["memory"] == 1593
    graphics = supported["graphics"]
    assert (graphics[0], graphics[-1], len(graphics)) == (210, 1410, 81)


def test_deprecated_application_clocks_read_as_none_with_the_drivers_words() -> None:
    """Driver 590 on Hopper prints the deprecation text where the clocks were (-q capture)."""
    text = (FIXTURES / "a100-sxm4-v12.xml").read_text()
    start, end = text.index("<applications_clocks>"), text.index("</applications_clocks>")
    clocks = text[start:end]
    reworded = re.sub(r">\d+ MHz<", f">{DEPRECATED}<", clocks)
    lines = xml_output((text[:start] + reworded + text[end:]).splitlines())
    (gpu,) = parse_nvidia_smi_xml(lines)["gpus"]
    assert gpu["application_clocks_mhz"] is None
    assert gpu["application_clocks_note"] == DEPRECATED


# --- MIG listings (layouts of published nvidia-smi outputs, H100 80GB HBM3) -----------------

LGI = """\
+-------------------------------------------------------+
| GPU instances:                                        |
| GPU   Name             Profile  Instance   Placement  |
|                          ID       ID       Start:Size |
|=======================================================|
|   0  MIG 3g.40gb          9        1          4:4     |
+-------------------------------------------------------+
|   0  MIG 1g.10gb         19        7          0:1     |
+-------------------------------------------------------+
"""
LCI = """\
+--------------------------------------------------------------------+
| Compute instances:                                                 |
| GPU     GPU       Name             Profile   Instance   Placement  |
|       Instance                       ID        ID       Start:Size |
|         ID                                                         |
|====================================================================|
|   0      1       MIG 3g.40gb          2         0          0:3     |
+--------------------------------------------------------------------+
"""
LGIP = """\
+-----------------------------------------------------------------------------+
| GPU instance profiles:                                                      |
| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |
|                              Free/Total   GiB              CE    JPEG  OFA  |
|=============================================================================|
|   0  MIG 1g.10gb       19     2/7        9.75       No     16     1     0   |
|                                                             1     1     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 1g.10gb+me    20     0/1        9.75       No     16     1     0   |
|                                                             1     1     1   |
+-----------------------------------------------------------------------------+
|   0  MIG 3g.40gb        9     0/2        39.50      No     60     3     0   |
|                                                             3     3     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 7g.80gb        0     0/1        79.25      No     132    7     0   |
|                                                             8     7     1   |
+-----------------------------------------------------------------------------+
"""
LGIPP = """\
GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1
GPU  0 Profile ID 20 Placements: {0,1,2,3,4,5,6}:1
GPU  0 Profile ID  9 Placements: {0,4}:4
GPU  0 Profile ID  0 Placement : {0}:8
"""


def fact_output(**sections: str | None) -> list[str]:
    """The fact command's output: the A100 capture, then each section's part (None: the
    section was skipped)."""
    xml = (FIXTURES / "a100-sxm4-v12.xml").read_text().splitlines()
    parts: dict[str, PartOutput] = {XML_PART: PartOutput(XML_PART, xml, [], 0)}
    for name, text in sections.items():
        parts[name] = (
            PartOutput(name, skipped=True)
            if text is None
            else PartOutput(name, text.splitlines(), [], 0)
        )
    return framing.output_of(parts)


def all_sections(**overrides: str | None) -> dict[str, str | None]:
    uuid = parse_nvidia_smi_xml(lines_of("a100-sxm4-v12.xml"))["gpus"][0]["uuid"]
    sections = {
        "gpu_instances": LGI,
        "compute_instances": LCI,
        "mig_profiles": LGIP,
        "mig_placements": LGIPP,
        "compute_apps": f"{uuid}, 4242\nGPU-00000000-0000-0000-0000-000000000000, 7\n",
    }
    return sections | overrides


def test_mig_sections_give_each_gpu_its_instances_profiles_and_processes() -> None:
    report = parse_fact_output(fact_output(**all_sections()))
    assert report["listing_problems"] == {}
    (gpu,) = report["gpus"]
    assert gpu["gpu_instances"] == [
        {
            "id": 1,
            "profile": "3g.40gb",
            "profile_id": 9,
            "start": 4,
            "size": 4,
            "compute_instances": [{"id": 0, "profile": "3g.40gb", "profile_id": 2}],
        },
        {
            "id": 7,
            "profile": "1g.10gb",
            "profile_id": 19,
            "start": 0,
            "size": 1,
            "compute_instances": [],
        },
    ]
    assert list(gpu["mig_profiles"]) == ["1g.10gb", "1g.10gb+me", "3g.40gb", "7g.80gb"]
    assert gpu["mig_profiles"]["1g.10gb"] == {
        "id": 19,
        "free": 2,
        "total": 7,
        "memory_gib": 9.75,
        "placements": [0, 1, 2, 3, 4, 5, 6],
        "size": 1,
    }
    assert gpu["mig_profiles"]["7g.80gb"]["placements"] == [0]
    assert gpu["mig_profiles"]["7g.80gb"]["size"] == 8
    # A process on a GPU not in the report (another UUID) is not attributed to this one.
    assert gpu["compute_pids"] == [4242]


@pytest.mark.parametrize(
    "nothing", ["No MIG-enabled devices found.", "No GPU instances found."], ids=["off", "none"]
)
def test_nothing_listed_is_no_instances_not_a_problem(nothing: str) -> None:
    sections = all_sections(
        gpu_instances=nothing,
        compute_instances="No compute instances found.",
        mig_profiles=nothing,
        mig_placements=nothing,
        compute_apps="",
    )
    report = parse_fact_output(fact_output(**sections))
    assert report["listing_problems"] == {}
    (gpu,) = report["gpus"]
    assert (gpu["gpu_instances"], gpu["mig_profiles"], gpu["compute_pids"]) == ([], {}, [])


def test_an_unreadable_listing_is_named_never_taken_for_an_empty_one() -> None:
    failed = "Failed to display GPU instances: Insufficient Permissions"
    sections = all_sections(gpu_instances=failed, compute_apps="No devices were found")
    sections["mig_placements"] = None
    problems = parse_fact_output(fact_output(**sections))["listing_problems"]
    assert problems == {
        "gpu_instances": f"nvidia-smi mig -lgi: unexpected line {failed!r}",
        # Its rows name GPU instances that the unreadable -lgi did not list.
        "compute_instances": "nvidia-smi mig -lci: compute instance of unknown GPU instance 0/1",
        "mig_placements": "nvidia-smi mig -lgipp was not run",
        "compute_apps": (
            "nvidia-smi --query-compute-apps=gpu_uuid,pid --format=csv,noheader: "
            "unexpected line 'No devices were found'"
        ),
    }


def test_no_mig_listing_is_run_when_the_xml_report_failed(tmp_path: Path) -> None:
    output, calls = run_fact_command(tmp_path, 9)
    assert calls == ["-q -x"]
    report = parse_fact_output(output)
    assert report["state"] == "unreadable"

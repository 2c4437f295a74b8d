"""The parsers read every real capture in tests/fixtures and name what they cannot read.

Real captures are used as they are; the multi-command nvidia-smi captures are cut into their
sections (``nvlink -s``, ``-q``). Where no capture exists (XID lines, nvme-cli JSON), the
test says where its sample comes from.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import subprocess
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from facts.lynis import parse_report as parse_lynis_report
from gpunode import framing
from gpunode.framing import PartOutput
from gpunode.probe import file_integrity, gpu_record, malware_scan
from gpunode.probe.parsers import (
    SECTION_COMMANDS,
    combined_command,
    framed,
    parse_combined,
    parse_dcgm_diag,
    parse_gpu_report,
    parse_ib_flaps,
    parse_ibstat,
    parse_nvidia_smi_xml,
    parse_nvlink_status,
    parse_nvme_list,
    parse_page_retirement,
    parse_query_text,
    parse_section,
    parse_xid_events,
)
from gpunode.probe.query_text import parse_query_gpus
from lab.hwsim import nvidia_smi, nvme, profiles
from lab.hwsim.hwstate import SHARE_ENV

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
XML = FIXTURES / "nvidia-smi-xml"
H100_CAPTURE = "nvidia-smi-capture/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
H200_CAPTURE = "nvidia-smi-capture/linux-x86_64__nvidia-h200__590.48.01.txt"
H100_MIG_CAPTURE = "nvidia-smi-capture/linux-x86_64__nvidia-h100-mig__590.48.01.txt"
L40S_CAPTURE = "nvidia-smi-capture/linux-x86_64__nvidia-l40s__595.80.txt"
A100_UUID = "GPU-513536b6-7d19-9063-b049-1e69664bb298"

Parser = Callable[[str], dict[str, Any]]
Extract = Callable[[str], str]


def read(relative: str) -> str:
    return (FIXTURES / relative).read_text(encoding="utf-8")


def whole(text: str) -> str:
    return text


def lynis_report(text: str) -> dict[str, Any]:
    """facts.lynis's report parser in the shape the fixture checks read."""
    return {"state": "ok", "command": "cat /var/log/lynis-report.dat", **parse_lynis_report(text)}


def capture_section(title: str) -> Extract:
    """The body of one section of an nvidia_gpu_exporter multi-command capture."""

    def extract(text: str) -> str:
        return nvidia_smi.capture_sections(text)[title]

    return extract


CAPTURE_CASES: list[tuple[str, Extract, Parser]] = [
    ("nvlink -s", capture_section("capabilities :: nvlink -s"), parse_nvlink_status),
    ("idle -q", capture_section("idle :: query (-q)"), parse_page_retirement),
    ("load -q", capture_section("load :: query (-q)"), parse_page_retirement),
    ("idle -q, GPU records", capture_section("idle :: query (-q)"), parse_query_gpus),
    ("load -q, GPU records", capture_section("load :: query (-q)"), parse_query_gpus),
]


# Every command capture in tests/fixtures, with the parser(s) that read it.
def _clamscan(text: str) -> dict:
    """clamscan's output as the other parsers report: its unread lines are the problems."""
    parsed = malware_scan.parse_clamscan(text)
    return {"state": "ok", "command": "clamscan", "problems": parsed["unread"], **parsed}


def _dcgm4_test(text: str) -> dict:
    """One quoted DCGM 4 test object, in the document layout DCGM 4's dcgmi builds (a cut or
    mangled object is no document: unreadable, as parse_dcgm_diag says of one)."""
    try:
        test = json.loads(text)
    except ValueError as error:
        return gpu_record.unreadable("dcgmi diag -j", f"not JSON ({error})")
    document = {"DCGM Diagnostic": {"test_categories": [
        {"category": "Hardware", "tests": [test]}]}}  # fmt: skip
    return parse_dcgm_diag(json.dumps(document))


def _unreachable(text: str) -> dict:
    """nvidia-smi's lines naming the GPUs it cannot open, read as a result."""
    lost = gpu_record.unreachable_gpus(text)
    if not lost:
        return gpu_record.unreadable("nvidia-smi", "no 'Unable to determine the device handle'")
    return {"state": "ok", "command": "nvidia-smi", "lost": lost}


FIXTURE_CASES: dict[str, list[tuple[str, Extract, Parser]]] = {
    "nvidia-smi-xml/a100-sxm4-v12.xml": [("-q -x", whole, parse_nvidia_smi_xml)],
    "nvidia-smi-xml/tesla-t4.xml": [("-q -x", whole, parse_nvidia_smi_xml)],
    "nvidia-smi-xml/a10g.xml": [("-q -x", whole, parse_nvidia_smi_xml)],
    "nvidia-smi-xml/quadro-p400.xml": [("-q -x", whole, parse_nvidia_smi_xml)],
    "nvidia-smi-xml/rtx-3090-v12.xml": [("-q -x", whole, parse_nvidia_smi_xml)],
    "nvidia-smi-xml/dual_2070-v13.xml": [("-q -x", whole, parse_nvidia_smi_xml)],
    "nvidia-smi-xml/rtx-4000-sff-ada-v13.xml": [("-q -x", whole, parse_nvidia_smi_xml)],
    H100_CAPTURE: CAPTURE_CASES,
    H200_CAPTURE: CAPTURE_CASES,
    H100_MIG_CAPTURE: CAPTURE_CASES,
    L40S_CAPTURE: CAPTURE_CASES,
    "ibstat/ibstat.47.0.h100.all.active.0": [("ibstat", whole, parse_ibstat)],
    "dcgm/dcgmi-diag-r1-j.3.1.0.8gpu.pass.txt": [("diag -j", whole, parse_dcgm_diag)],
    "ibstat/ibstat.47.0.a100.all.active.0": [("ibstat", whole, parse_ibstat)],
    "ibstat/ibstat.47.0.h100.some.down.0": [("ibstat", whole, parse_ibstat)],
    "ibstat/ibstat.47.0.h100.some.down.1": [("ibstat", whole, parse_ibstat)],
    "nvlink/good_nvlink_status.txt": [("nvlink -s", whole, parse_nvlink_status)],
    "nvlink/bad_nvlink_status.txt": [("nvlink -s", whole, parse_nvlink_status)],
    "nvlink/nvidia-smi.nvlink.status.a100": [("nvlink -s", whole, parse_nvlink_status)],
    "nvlink/nvidia-smi.nvlink.errors.a100-sxm4-40gb.535.161.08": [
        ("nvlink -e", whole, gpu_record.parse_nvlink_errors)
    ],
    # Empty: the A10 has no NVLink and nvidia-smi printed nothing (with exit 0).
    "nvlink/nvidia-smi.nvlink.status.a10": [
        ("nvlink -s, exit 0", whole, lambda text: parse_nvlink_status(text, empty_ok=True))
    ],
    "page-retirement/orig_nvsmi8_output.txt": [("PAGE_RETIREMENT", whole, parse_page_retirement)],
    "page-retirement/bad_nvsmi8_output.txt": [("PAGE_RETIREMENT", whole, parse_page_retirement)],
    "syslog/1dev_6flap_syslog": [("syslog", whole, parse_ib_flaps)],
    "syslog/0flap_syslog": [("syslog", whole, parse_ib_flaps)],
    "aide/check-0.18.3-deb12.json": [("aide --check (JSON)", whole, file_integrity.parse_report)],
    "aide/check-0.18.3-deb12-added-changed.json": [
        ("aide --check (JSON)", whole, file_integrity.parse_report)
    ],
    "clamav/clamscan-1.4.6-deb12-infected.stdout": [("clamscan", whole, _clamscan)],
    "clamav/clamscan-1.4.6-deb12-clean.stdout": [("clamscan", whole, _clamscan)],
    "clamav/clamscan-1.4.6-deb12-error.stdout": [("clamscan", whole, _clamscan)],
    "lynis/lab-bookworm-harden.report.dat": [("lynis-report.dat", whole, lynis_report)],
    "kernel-log/xid79-fallen-off-the-bus.syslog": [("journal", whole, parse_xid_events)],
    "kernel-log/nvswitch-sxid.menthos.log": [("kernel log, SXids", whole, parse_xid_events)],
    "dcgm/dcgmi-diag-j.4.x.8gpu.diagnostic-test.json": [
        ("diag -j (DCGM 4, one test)", whole, _dcgm4_test)
    ],
    "nvidia-smi-lost/device-handle-unknown-error.610.57.04.txt": [
        ("nvidia-smi, a GPU it cannot open", whole, _unreachable)
    ],
}
NOT_COMMAND_OUTPUT = {
    "PROVENANCE.md": "where the fixtures come from",
    **{
        str(path.relative_to(FIXTURES)): "a real node's /sys/class/infiniband tree: "
        "test_health_counters.py runs the ib_counters section's shell command over it and "
        "reads the output with its parser"
        for path in (FIXTURES / "infiniband-sysfs").rglob("*")
        if path.is_file()
    },
    "manifests/DGX_A100.json": "an expected-hardware manifest, no command printed it",
    "nftables/list-chain-forward-1.1.3-deb13.txt": (
        "nft's listing of gpunode's forward chain: test_kubernetes.py reads it with "
        "facts.kubernetes's parser and checks the rendered chain against it"
    ),
    "systemd/show-trixie.json": (
        "systemctl show captures that pyinfra's own systemd facts read: test_factcache.py"
        " checks the fact cache's grouped read against them"
    ),
    # Read by the facts' own parsers and the package-name rules, in their tests.
    **dict.fromkeys(
        ("os-release/ubuntu-22.04-jammy", "os-release/ubuntu-24.04-noble"),
        "/etc/os-release captures: test_distributions.py reads them with facts.node's parser",
    ),
    **{
        f"mokutil/{name}": "mokutil's words: test_secure_boot.py reads them with "
        "facts.secure_boot's parsers"
        for name in (
            "sb-state-disabled-setup-mode.txt",
            "sb-state-enabled.txt",
            "sb-state-enabled-shim-validation-off.txt",
            "sb-state-no-efivars.stderr",
            "test-key-dkms-enrolled.txt",
            "test-key-dkms-not-enrolled.txt",
            "test-key-shim-signed-enrolled.txt",
            "lab/sb-state.txt",
            "lab/test-key-enrolled.txt",
            "lab/test-key-not-enrolled.txt",
            "lab/test-key-pending.txt",
        )
    },
    **{
        f"mokutil/lab/{name}": "the real mokutil's variables, key and listing in the lab: "
        "test_hwsim_firmware.py checks the lab's console enrolment and mokutil wrapper "
        "against them"
        for name in ("MokNew.efivar", "MokListRT.efivar", "dkms-mok.pub", "list-enrolled.txt")
    },
    **{
        f"ubuntu-packages/{name}": "excerpts of Ubuntu's package index, no command printed "
        "them: test_ubuntu_driver.py checks the package-name rules against them"
        for name in (
            "jammy_nvidia-headless.txt",
            "noble-updates_linux-modules-nvidia-575-6.8.0-64-generic.txt",
            "noble_linux-modules-nvidia-550-open-generic.txt",
            "noble_nvidia-graphics-drivers-550-server.txt",
            "noble_nvidia-utils.txt",
            "resolute-updates_linux-modules-nvidia-580-server-open-nvidia.txt",
            "tenacious_nvidia-utils-580-server.txt",
        )
    },
}
FIXTURE_PARAMETERS = [
    pytest.param(relative, extract, parse, id=f"{relative}:{label}")
    for relative, cases in FIXTURE_CASES.items()
    for label, extract, parse in cases
]


def test_every_fixture_file_is_read_by_a_parser() -> None:
    on_disk = {str(path.relative_to(FIXTURES)) for path in FIXTURES.rglob("*") if path.is_file()}
    assert on_disk == set(FIXTURE_CASES) | set(NOT_COMMAND_OUTPUT)


@pytest.mark.parametrize(("relative", "extract", "parse"), FIXTURE_PARAMETERS)
def test_every_capture_parses(relative: str, extract: Extract, parse: Parser) -> None:
    result = parse(extract(read(relative)))
    assert result["state"] == "ok", result
    assert result["command"]
    # Real vendor output: every line understood, nothing named as unread.
    assert result.get("problems", []) == []
    for gpu in result.get("gpus", []):
        assert gpu.get("problems", []) == [], gpu


# --- nvidia-smi -q -x -------------------------------------------------------------------------


def test_a100_v12_xml() -> None:
    report = parse_nvidia_smi_xml(read("nvidia-smi-xml/a100-sxm4-v12.xml"))
    assert (report["driver_version"], report["cuda_driver_version"]) == ("535.54.03", "12.2")
    # telegraf kept one of the four <gpu> elements: the count and the list disagree, as given.
    assert report["attached_gpus"] == 4
    (gpu,) = report["gpus"]
    assert gpu["uuid"] == A100_UUID
    assert gpu["serial"] == "1650522003820"
    assert gpu["name"] == "NVIDIA A100-SXM4-80GB"
    assert gpu["pci_bus_id"] == "00000000:01:00.0"
    assert gpu["vbios_version"] == "92.00.36.00.02"
    assert (gpu["minor_number"], gpu["module_id"]) == (1, 4)
    assert gpu["persistence_mode"] is False
    assert gpu["mig_mode"] == {"current": True, "pending": True}
    assert gpu["ecc_mode"] == {"current": True, "pending": True}
    assert gpu["ecc_errors"]["aggregate"] == {"corrected": 0, "uncorrected": 0}
    # A100 replaced page retirement by row remapping; this capture shows both as N/A.
    assert gpu["retired_pages"]["supported"] is False
    assert gpu["remapped_rows"]["supported"] is False
    assert gpu["temperature_c"] == {"gpu": 27, "memory": 44}
    assert gpu["power_w"] == {
        "draw": 67.03,
        "limit": 500.0,
        "default_limit": 500.0,
        "min_limit": 100.0,
        "max_limit": 500.0,
    }
    assert gpu["clocks_mhz"]["current"] == {
        "graphics": 1275,
        "sm": 1275,
        "memory": 1593,
        "video": 1275,
    }
    assert gpu["clocks_mhz"]["max"] == {"graphics": 1410, "sm": 1410, "memory": 1593, "video": 1290}
    assert gpu["clock_event_reasons"] == []
    assert gpu["pcie"] == {"gen_current": 4, "gen_max": 4, "width_current": 16, "width_max": 16}
    assert gpu["fabric"] == {"state": None, "status": None}
    assert gpu["nvlink"] is None  # not in any XML schema: the probe asks nvlink -s


def test_t4_v11_xml_uses_throttle_reasons_and_power_readings() -> None:
    (gpu,) = parse_nvidia_smi_xml(read("nvidia-smi-xml/tesla-t4.xml"))["gpus"]
    assert gpu["name"] == "Tesla T4"
    assert gpu["power_w"]["limit"] == 70.0 and gpu["power_w"]["draw"] == 26.78
    assert gpu["clock_event_reasons"] == []
    assert gpu["retired_pages"] == {
        "supported": True,
        "single_bit": 0,
        "double_bit": 0,
        "pending": False,
    }
    assert gpu["remapped_rows"]["supported"] is False
    assert gpu["pcie"] == {"gen_current": 3, "gen_max": 3, "width_current": 8, "width_max": 16}
    assert gpu["mig_mode"] == {"current": None, "pending": None}  # N/A: no MIG on Turing


def test_a10g_v11_xml_idle_and_row_remapping() -> None:
    (gpu,) = parse_nvidia_smi_xml(read("nvidia-smi-xml/a10g.xml"))["gpus"]
    assert gpu["clock_event_reasons"] == ["gpu_idle"]
    assert gpu["remapped_rows"] == {
        "supported": True,
        "correctable": 0,
        "uncorrectable": 0,
        "pending": False,
        "failure": False,
    }
    assert gpu["pcie"]["gen_current"] == 1 and gpu["pcie"]["gen_max"] == 4
    assert gpu["temperature_c"] == {"gpu": 17, "memory": None}


def test_every_schema_gives_the_same_field_names() -> None:
    reports = [
        parse_nvidia_smi_xml(read(f"nvidia-smi-xml/{name}"))
        for name in ("a100-sxm4-v12.xml", "tesla-t4.xml", "a10g.xml")
    ]
    key_sets = [_keys(report["gpus"][0]) for report in reports]
    assert key_sets[0] == key_sets[1] == key_sets[2]


def _keys(value: Any, prefix: str = "") -> set[str]:
    if not isinstance(value, dict):
        return {prefix}
    return set().union(*(_keys(item, f"{prefix}.{key}") for key, item in value.items()))


def _rename(root: ElementTree.Element, old: str, new: str) -> None:
    for element in root.iter():
        if element.tag.startswith(old):
            element.tag = new + element.tag[len(old) :]


def test_renamed_elements_of_older_and_newer_schemas_read_the_same() -> None:
    """v12's names, the v11 names (throttle reasons, power_readings) and 590's power draw."""
    text = read("nvidia-smi-xml/a100-sxm4-v12.xml")
    current = parse_nvidia_smi_xml(text)["gpus"]

    older = ElementTree.fromstring(text)
    _rename(older, "clocks_event_reason", "clocks_throttle_reason")
    readings = older.find("gpu/gpu_power_readings")
    assert readings is not None
    readings.tag = "power_readings"
    limit = readings.find("current_power_limit")
    assert limit is not None
    limit.tag = "power_limit"

    newer = ElementTree.fromstring(text)
    draw = newer.find("gpu/gpu_power_readings/power_draw")
    assert draw is not None
    draw.tag = "average_power_draw"

    for variant in (older, newer):
        assert (
            parse_nvidia_smi_xml(ElementTree.tostring(variant, encoding="unicode"))["gpus"]
            == current
        )


@pytest.fixture
def share_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The lab double's template directory, for rendering its XML here."""
    for template in ("nvidia-smi-xml/a100-sxm4-v12.xml", "nvidia-smi-xml/a10g.xml", H100_CAPTURE):
        (tmp_path / Path(template).name).write_text(read(template), encoding="utf-8")
    monkeypatch.setenv(SHARE_ENV, str(tmp_path))
    return tmp_path


def render(state: dict[str, Any], generation: str) -> str:
    state = {**copy.deepcopy(state), "smi_generation": generation}
    state["smi_xml_template"] = "a10g.xml" if generation == "r515" else "a100-sxm4-v12.xml"
    return nvidia_smi.render_xml(state, nvidia_smi.select(state, None))


@pytest.mark.usefixtures("share_dir")
def test_one_gpu_state_reads_the_same_from_driver_515_535_and_590_layouts() -> None:
    """The lab double prints the same hardware in each driver generation's XML layout."""
    state = profiles.initial_state("a100", "node-a")
    gpu = state["gpus"][2]
    gpu["persistence_mode"] = "Enabled"
    gpu["power"]["limit"] = 450.0
    gpu["ecc_errors"]["volatile"].update(sram_uncorrectable=3, dram_correctable=5)
    gpu["clocks_event_reasons"].update(gpu_idle=False, sw_power_cap=True)
    gpu["remapped_rows"].update(correctable=2, pending="Yes")
    reports = {
        generation: parse_nvidia_smi_xml(render(state, generation))
        for generation in ("r515", "r535", "r590")
    }
    # Driver 590 alone prints a recovery action and whether SRAM errors passed their threshold.
    # The slowdown temperature is the template board's own (and 590 gives it as T.Limit).
    only_590 = ("recovery_action", "ecc_memory", "temperature_slowdown_c", "temperature_tlimit_c")
    same = {
        generation: [{k: v for k, v in gpu.items() if k not in only_590} for gpu in report["gpus"]]
        for generation, report in reports.items()
    }
    assert same["r515"] == same["r535"] == same["r590"]
    third = reports["r590"]["gpus"][2]
    assert third["recovery_action"] == 0  # "None"
    # 590 gives temperatures as T.Limit headroom, the older layouts as degrees.
    assert third["temperature_tlimit_c"] == {"current": 46, "slowdown": -2}
    assert reports["r535"]["gpus"][2]["temperature_tlimit_c"] == {"current": None, "slowdown": None}
    assert third["ecc_memory"] == {
        "volatile": {"sram": 3, "dram": 0},
        "aggregate": {"sram": 0, "dram": 0},
        "sram_threshold_exceeded": False,
    }
    assert reports["r535"]["gpus"][2]["recovery_action"] is None
    assert third["persistence_mode"] is True
    assert third["power_w"]["limit"] == 450.0
    assert third["ecc_errors"]["volatile"] == {"corrected": 5, "uncorrected": 3}
    assert third["clock_event_reasons"] == ["sw_power_cap"]
    assert third["remapped_rows"]["correctable"] == 2 and third["remapped_rows"]["pending"] is True
    # 515/535 keep the module id in gpu_module_id, 590 under platformInfo.
    assert third["module_id"] == 3


def test_nvlink_element_in_xml_is_read_when_present() -> None:
    """No captured schema has one (synthetic element); if a driver adds it, it is used."""
    root = ElementTree.fromstring(read("nvidia-smi-xml/a100-sxm4-v12.xml"))
    gpu = root.find("gpu")
    assert gpu is not None
    links = ElementTree.SubElement(gpu, "nvlinks")
    for number, state in enumerate(("Active", "Inactive", "Active")):
        link = ElementTree.SubElement(links, "nvlink")
        ElementTree.SubElement(link, "link_id").text = str(number)
        ElementTree.SubElement(link, "state").text = state
    (parsed,) = parse_nvidia_smi_xml(ElementTree.tostring(root, encoding="unicode"))["gpus"]
    assert parsed["nvlink"]["source"] == "xml"
    assert (parsed["nvlink"]["active"], parsed["nvlink"]["total"]) == (2, 3)
    assert [link["active"] for link in parsed["nvlink"]["links"]] == [True, False, True]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty output"),
        ("   \n", "empty output"),
        (read("nvidia-smi-xml/a100-sxm4-v12.xml")[:5000], "not well-formed XML"),
        ("<html><body>502</body></html>", "root element is <html>"),
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
            "not well-formed",
        ),
        ("<nvidia_smi_log></nvidia_smi_log>", "no driver_version, attached_gpus or gpu element"),
    ],
    ids=["empty", "blank", "truncated", "wrong-document", "error-text", "no-content"],
)
def test_bad_xml_is_unreadable_naming_the_command(text: str, reason: str) -> None:
    result = parse_nvidia_smi_xml(text)
    assert result["state"] == "unreadable"
    assert result["command"] == "nvidia-smi -q -x"
    assert reason in result["reason"]


# --- nvidia-smi nvlink -s ---------------------------------------------------------------------


def test_good_nvlink_status_has_twelve_active_links() -> None:
    (gpu,) = parse_nvlink_status(read("nvlink/good_nvlink_status.txt"))["gpus"]
    assert (gpu["index"], gpu["uuid"]) == (7, "GPU-c7e253b0-c227-6f10-e860-7482c85e7ce8")
    assert gpu["name"] == "NVIDIA A100-SXM4-80GB"
    assert (gpu["state"], gpu["active"], gpu["total"]) == ("ok", 12, 12)
    assert {link["speed_gbps"] for link in gpu["links"]} == {25.0}
    assert [link["link"] for link in gpu["links"]] == list(range(12))


def test_bad_nvlink_status_is_all_inactive() -> None:
    (gpu,) = parse_nvlink_status(read("nvlink/bad_nvlink_status.txt"))["gpus"]
    assert (gpu["index"], gpu["uuid"]) == (6, "GPU-9667d95e-6d22-0c22-1f57-c481f13e7c44")
    assert gpu["state"] == "all_inactive"
    assert gpu["active"] == 0
    assert gpu["total"] is None  # nvidia-smi does not say how many links there are
    assert gpu["links"] == []


@pytest.mark.parametrize("capture", [H100_CAPTURE, H200_CAPTURE])
def test_hopper_captures_have_eighteen_links(capture: str) -> None:
    text = capture_section("capabilities :: nvlink -s")(read(capture))
    (gpu,) = parse_nvlink_status(text)["gpus"]
    assert (gpu["state"], gpu["active"], gpu["total"]) == ("ok", 18, 18)
    assert {link["speed_gbps"] for link in gpu["links"]} == {26.562}


def test_inactive_link_and_gpu_without_nvlink() -> None:
    """Layouts of the lab double: '<inactive>' for one link, a GPU line alone for none."""
    text = (
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n"
        "\t Link 0: 26.562 GB/s\n\t Link 1: <inactive>\n"
        "GPU 1: NVIDIA A10G (UUID: GPU-2)\n"
    )
    first, second = parse_nvlink_status(text)["gpus"]
    assert (first["state"], first["active"], first["total"]) == ("ok", 1, 2)
    assert (second["state"], second["active"], second["total"]) == ("none", 0, 0)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty output"),
        ("\t Link 0: 25 GB/s\n", "comes before any GPU"),
        ("GPU 7: NVIDIA A100-SXM4-80GB (UUID: GPU-1)\n\t Link 0: 25 GB", "unknown link state"),
        ("Failed to initialize NVML: Driver/library version mismatch\n", "comes before any GPU"),
    ],
    ids=["empty", "no-gpu-line", "truncated-line", "error-text"],
)
def test_bad_nvlink_status_output_is_unreadable(text: str, reason: str) -> None:
    result = parse_nvlink_status(text)
    assert result["state"] == "unreadable"
    assert result["command"] == "nvidia-smi nvlink -s"
    assert reason in result["reason"]


# --- nvidia-smi -q -d PAGE_RETIREMENT ---------------------------------------------------------


def test_bad_page_retirement_names_the_gpus_with_pending_blacklists() -> None:
    result = parse_page_retirement(read("page-retirement/bad_nvsmi8_output.txt"))
    assert (result["driver_version"], result["attached_gpus"]) == ("535.86.10", 8)
    pending = [gpu["pci_bus_id"] for gpu in result["gpus"] if gpu["retired_pages"]["pending"]]
    assert pending == [
        "00000002:00:00.0",
        "00000004:00:00.0",
        "00000006:00:00.0",
        "00000008:00:00.0",
    ]
    counts = {
        gpu["pci_bus_id"][:8]: (
            gpu["retired_pages"]["single_bit"],
            gpu["retired_pages"]["double_bit"],
        )
        for gpu in result["gpus"]
    }
    assert counts == {
        "00000001": (60, 5),
        "00000002": (2, 61),
        "00000003": (0, 0),
        "00000004": (6, 0),
        "00000005": (0, 0),
        "00000006": (20, 45),
        "00000007": (0, 0),
        "00000008": (8, 56),
    }


def test_orig_page_retirement_is_clean() -> None:
    result = parse_page_retirement(read("page-retirement/orig_nvsmi8_output.txt"))
    assert len(result["gpus"]) == 8
    assert {
        (pages["single_bit"], pages["double_bit"], pages["pending"])
        for pages in (gpu["retired_pages"] for gpu in result["gpus"])
    } == {(0, 0, False)}


@pytest.mark.parametrize(
    ("capture", "bus_id"), [(H100_CAPTURE, "00000000:00:09.0"), (H200_CAPTURE, "00000000:83:00.0")]
)
@pytest.mark.parametrize("phase", ["idle", "load"])
def test_hopper_full_query_shows_remapped_rows_not_retired_pages(
    capture: str, bus_id: str, phase: str
) -> None:
    text = capture_section(f"{phase} :: query (-q)")(read(capture))
    result = parse_page_retirement(text)
    assert result["driver_version"] == "590.48.01"
    (gpu,) = result["gpus"]
    assert gpu["pci_bus_id"] == bus_id
    assert gpu["retired_pages"] == {
        "supported": False,
        "single_bit": None,
        "double_bit": None,
        "pending": None,
    }
    assert gpu["remapped_rows"] == {
        "supported": True,
        "correctable": 0,
        "uncorrectable": 0,
        "pending": False,
        "failure": False,
    }


def test_query_text_nests_sections_by_indentation() -> None:
    text = capture_section("idle :: query (-q)")(read(H100_CAPTURE))
    header, gpus = parse_query_text(text)
    assert header["CUDA Version"] == "13.1"
    ((bus_id, sections),) = gpus
    assert bus_id == "00000000:00:09.0"
    assert sections["Product Name"] == "NVIDIA H100 80GB HBM3"
    assert sections["PCI"]["GPU Link Info"]["PCIe Generation"]["Max"] == "5"
    assert sections["Clocks Event Reasons"]["HW Slowdown"] == "Not Active"
    assert sections["Clocks Event Reasons Counters"]["Sync Boost"] == "0 us"


def _cut_before_line(text: str, needle: str, occurrence: int) -> str:
    lines = text.splitlines(keepends=True)
    positions = [n for n, line in enumerate(lines) if needle in line]
    return "".join(lines[: positions[occurrence]])


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty output"),
        ("garbage\nmore garbage\n", "no 'GPU <bus id>' section"),
        (
            _cut_before_line(read("page-retirement/bad_nvsmi8_output.txt"), "GPU 0000", 5),
            "says 8 but 5 are listed",
        ),
        (
            _cut_before_line(read("page-retirement/bad_nvsmi8_output.txt"), "Pending Page", 7),
            "lacks",
        ),
        (read("page-retirement/bad_nvsmi8_output.txt").replace(": 56", ": 5x"), "is not a count"),
        (
            read("page-retirement/bad_nvsmi8_output.txt").replace(": Yes", ": Ye"),
            "neither Yes nor No",
        ),
    ],
    ids=["empty", "garbage", "cut-at-gpu", "cut-in-gpu", "bad-count", "bad-flag"],
)
def test_bad_page_retirement_output_is_unreadable(text: str, reason: str) -> None:
    result = parse_page_retirement(text)
    assert result["state"] == "unreadable"
    assert result["command"] == "nvidia-smi -q -d PAGE_RETIREMENT"
    assert reason in result["reason"]


# --- ibstat -----------------------------------------------------------------------------------


def test_h100_ibstat_has_twelve_cas() -> None:
    result = parse_ibstat(read("ibstat/ibstat.47.0.h100.all.active.0"))
    assert len(result["cas"]) == 12
    by_type: dict[str, list[dict[str, Any]]] = {}
    for port in result["ports"]:
        by_type.setdefault(port["ca_type"], []).append(port)
    assert {ca_type: len(ports) for ca_type, ports in by_type.items()} == {"MT4129": 8, "MT4125": 4}
    assert {(p["firmware_version"], p["rate"]) for p in by_type["MT4129"]} == {("28.39.1002", 400)}
    assert {(p["firmware_version"], p["rate"]) for p in by_type["MT4125"]} == {("22.39.1002", 100)}
    assert {(p["state"], p["physical_state"], p["link_layer"]) for p in result["ports"]} == {
        ("Active", "LinkUp", "Ethernet")
    }
    first = result["cas"][0]
    assert (first["name"], first["node_guid"], first["number_of_ports"]) == (
        "mlx5_0",
        "0xa088c20300e3142a",
        1,
    )
    assert first["ports"][0]["port_guid"] == "0xa288c2fffee3142a"
    assert first["ports"][0]["base_lid"] == 0


def test_a100_ibstat_has_eight_infiniband_and_one_ethernet_port() -> None:
    result = parse_ibstat(read("ibstat/ibstat.47.0.a100.all.active.0"))
    assert len(result["cas"]) == 9
    assert {(p["ca_type"], p["rate"], p["state"]) for p in result["ports"]} == {
        ("MT4126", 200, "Active")
    }
    layers = [port["link_layer"] for port in result["ports"]]
    assert (layers.count("InfiniBand"), layers.count("Ethernet")) == (8, 1)


def test_ibstat_agrees_with_the_lab_doubles_own_reader() -> None:
    """The lab's profiles read the same captures; both must see the same ports."""
    text = read("ibstat/ibstat.47.0.a100.all.active.0")
    ours = parse_ibstat(text)["ports"]
    theirs = profiles.parse_ibstat(text)
    assert [(p["ca"], p["state"], p["rate"], p["port_guid"]) for p in ours] == [
        (p["ca"], p["state"], p["rate"], p["port_guid"]) for p in theirs
    ]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty output"),
        (
            read("ibstat/ibstat.47.0.h100.all.active.0").rsplit("\tPort 1:", 1)[0],
            "declares 1 ports but lists 0",
        ),
        (
            read("ibstat/ibstat.47.0.h100.all.active.0").rsplit("\t\tRate", 1)[0],
            "lacks ['rate', 'link_layer']",
        ),
        ("\t\tState: Active\n", "comes before any CA"),
        ("ibpanic: [1234] main: can't init UMAD library\n", "comes before any CA"),
        ("CA 'mlx5_0'\n\tCA type: MT4129\n\tPort 1:\n\t\t\tRate: 400\n", "not understood"),
    ],
    ids=["empty", "cut-before-port", "cut-in-port", "no-ca", "error-text", "bad-indent"],
)
def test_bad_ibstat_output_is_unreadable(text: str, reason: str) -> None:
    result = parse_ibstat(text)
    assert result["state"] == "unreadable"
    assert result["command"] == "ibstat"
    assert reason in result["reason"]


IBSTAT_CAPTURES = [
    "ibstat/ibstat.47.0.h100.all.active.0",
    "ibstat/ibstat.47.0.a100.all.active.0",
    "ibstat/ibstat.47.0.h100.some.down.0",
    "ibstat/ibstat.47.0.h100.some.down.1",
]
# ibstat prints one tab per level; a terminal or a log collector expands it (8 spaces, as in
# the linux-rdma post below), other tools and hand-made reports use 4 or 2.
INDENTS = {"8-spaces": " " * 8, "4-spaces": " " * 4, "2-spaces": "  ", "tab": "\t"}


def reindented(text: str, unit: str) -> str:
    return "\n".join(
        unit * (len(line) - len(line.lstrip("\t"))) + line.lstrip("\t")
        for line in text.splitlines()
    )


@pytest.mark.parametrize("unit", INDENTS.values(), ids=INDENTS.keys())
@pytest.mark.parametrize("relative", IBSTAT_CAPTURES)
def test_ibstat_reads_the_same_whatever_the_indent_unit(relative: str, unit: str) -> None:
    text = read(relative)
    if unit != "\t":
        assert reindented(text, unit) != text
    assert parse_ibstat(reindented(text, unit)) == parse_ibstat(text)


def test_ibstat_of_a_soft_roce_device_with_expanded_tabs_and_empty_fields() -> None:
    """As posted to linux-rdma ("rdma_rxe usage problem", 2022-01-19, Message-ID
    <CABrV9Yt0HYenR_qk_QWFkvH4-0Ooeb61y+CyT3WVOnDiAmxjhA@mail.gmail.com>): rdma-core on
    Manjaro, the tabs expanded to 8 spaces by the mail; rxe has no CA type or firmware."""
    text = (
        "CA 'rxe0'\n"
        "        CA type:\n"
        "        Number of ports: 1\n"
        "        Firmware version:\n"
        "        Hardware version:\n"
        "        Node GUID: 0x4a51c5fffef6e159\n"
        "        System image GUID: 0x4a51c5fffef6e159\n"
        "        Port 1:\n"
        "                State: Active\n"
        "                Physical state: LinkUp\n"
        "                Rate: 2.5\n"
        "                Base lid: 0\n"
        "                LMC: 0\n"
        "                SM lid: 0\n"
        "                Capability mask: 0x00010000\n"
        "                Port GUID: 0x4a51c5fffef6e159\n"
        "                Link layer: Ethernet\n"
    )
    result = parse_ibstat(text)
    assert (result["state"], result["problems"]) == ("ok", [])
    (port,) = result["ports"]
    assert (port["ca"], port["ca_type"], port["firmware_version"]) == ("rxe0", "", "")
    assert (port["rate"], port["state"], port["link_layer"]) == (2.5, "Active", "Ethernet")
    assert result["cas"][0]["node_guid"] == "0x4a51c5fffef6e159"


A100_IBSTAT = "ibstat/ibstat.47.0.a100.all.active.0"


def test_fields_a_newer_ibstat_adds_are_kept_not_problems() -> None:
    text = read(A100_IBSTAT).replace(
        "\tNumber of ports: 1\n", "\tNumber of ports: 1\n\tTransport (RDMA): InfiniBand\n", 1
    )
    text = text.replace("\t\tLink layer:", "\t\tLink width 2: 4X\n\t\tLink layer:", 1)
    result = parse_ibstat(text)
    assert (result["state"], result["problems"]) == ("ok", [])
    first = result["cas"][0]
    assert first["transport_rdma"] == "InfiniBand"
    assert first["ports"][0]["link_width_2"] == "4X"
    assert len(result["ports"]) == 9


def test_an_fdr10_rate_reads_as_its_number_and_name() -> None:
    """ibstat.c prints ``Rate: %d (FDR10)`` where sysfs names the rate FDR10."""
    text = read(A100_IBSTAT).replace("\t\tRate: 200", "\t\tRate: 40 (FDR10)", 1)
    port = parse_ibstat(text)["ports"][0]
    assert (port["rate"], port["rate_name"]) == (40, "FDR10")
    assert "unreadable" not in port


def cas_of(text: str) -> list[str]:
    return [line for line in text.splitlines(keepends=True) if not line.startswith("\t")]


def test_a_line_not_understood_is_named_in_its_ca_and_the_other_cas_are_kept() -> None:
    lines = read(A100_IBSTAT).splitlines(keepends=True)
    where = [n for n, line in enumerate(lines) if line.startswith("\t\tLMC:")][2]
    lines[where] = "   LMC: 0\n"  # three spaces where a tab is the unit
    result = parse_ibstat("".join(lines))
    assert result["state"] == "ok"
    named = f"line {where + 1} not understood: '   LMC: 0'"
    assert result["problems"] == [named]
    assert [ca["problems"] for ca in result["cas"]] == [[], [], [named], *[[]] * 6]
    assert len(result["ports"]) == 9
    untouched = parse_ibstat(read(A100_IBSTAT))["ports"]
    assert result["ports"][2] == {k: v for k, v in untouched[2].items() if k != "lmc"}
    assert result["ports"][3:] == untouched[3:]


def test_a_ca_cut_short_before_the_next_is_that_cas_problem_only() -> None:
    lines = read(A100_IBSTAT).splitlines(keepends=True)
    second = [n for n, line in enumerate(lines) if line.startswith("CA '")][1]
    port = next(n for n in range(second, len(lines)) if lines[n] == "\tPort 1:\n")
    del lines[port + 1 : port + 3]  # State and Physical state of mlx5_1's port
    result = parse_ibstat("".join(lines))
    assert result["state"] == "ok"
    named = "CA mlx5_1 port 1 lacks ['state', 'physical_state']"
    assert result["problems"] == [named]
    assert result["cas"][1]["problems"] == [named]
    assert [p.get("state") for p in result["ports"]] == ["Active", None, *["Active"] * 7]


def test_lines_before_the_first_ca_are_named_and_the_cas_kept() -> None:
    warning = "ibwarn: [4242] umad_get_ca: can't read sysfs of mlx5_bond_0\n"
    result = parse_ibstat(warning + read(A100_IBSTAT))
    assert result["state"] == "ok"
    assert result["problems"] == [f"line 1 comes before any CA: {warning.strip()!r}"]
    assert len(result["ports"]) == 9


def test_a_switch_names_its_type_and_lists_its_management_port() -> None:
    """ibstat.c: the header and the type field take the node type ("Switch 'x'",
    "Switch type:"), and a switch's port 0 is listed besides the ports it counts."""
    text = (
        "Switch 'sw0'\n\tSwitch type: MT54000\n\tNumber of ports: 1\n"
        "\tFirmware version: 27.2010.5042\n"
        "\tPort 0:\n\t\tState: Active\n\t\tPhysical state: LinkUp\n\t\tRate: 400\n"
        "\t\tLink layer: InfiniBand\n"
        "\tPort 1:\n\t\tState: Down\n\t\tPhysical state: Polling\n\t\tRate: 10\n"
        "\t\tLink layer: InfiniBand\n"
    )
    result = parse_ibstat(text)
    assert (result["state"], result["problems"]) == ("ok", [])
    (ca,) = result["cas"]
    assert (ca["node_type"], ca["ca_type"]) == ("Switch", "MT54000")
    assert [(p["port"], p["state"]) for p in result["ports"]] == [(0, "Active"), (1, "Down")]


# --- nvme list -o json ------------------------------------------------------------------------


def lab_nvme_listing(profile: str) -> str:
    """What the lab double prints (no real nvme-cli capture exists in tests/fixtures)."""
    drives = profiles.initial_state(profile, "node-a")["nvme"]
    document = {"Devices": [nvme.list_item(drive) for drive in drives]}
    return json.dumps(document, indent=2, separators=(",", ":"))


def test_nvme_listing() -> None:
    result = parse_nvme_list(lab_nvme_listing("hgx-h100"))
    assert len(result["devices"]) == 8
    first = result["devices"][0]
    assert first["device_path"] == "/dev/nvme0n1"
    assert first["model"] == "SAMSUNG MZWLJ3T8HBLS-00007"
    assert (first["physical_size"], first["sector_size"], first["namespace"]) == (
        3840755982336,
        512,
        1,
    )


def test_nvme_listing_strips_padding_and_reads_zero_devices() -> None:
    padded = (
        '{"Devices":[{"DevicePath":"/dev/nvme0n1","SerialNumber":"S4YP  ","ModelNumber":" M "}]}'
    )
    (device,) = parse_nvme_list(padded)["devices"]
    assert (device["serial"], device["model"], device["firmware"]) == ("S4YP", "M", None)
    assert parse_nvme_list('{"Devices":[]}') == {
        "state": "ok",
        "command": "nvme list -o json",
        "devices": [],
    }


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty output"),
        (lab_nvme_listing("a100")[:200], "not JSON"),
        ('{"devices": []}', "no 'Devices' list"),
        ('{"Devices": [{"ModelNumber": "x"}]}', "device 0 has no DevicePath"),
        ("[1, 2]", "no 'Devices' list"),
    ],
    ids=["empty", "truncated", "wrong-key", "no-path", "wrong-type"],
)
def test_bad_nvme_output_is_unreadable(text: str, reason: str) -> None:
    result = parse_nvme_list(text)
    assert result["state"] == "unreadable"
    assert result["command"] == "nvme list -o json"
    assert reason in result["reason"]


# --- kernel log XIDs --------------------------------------------------------------------------

# Message layouts of the NVIDIA driver's XID reports (no kernel log capture is in the fixtures).
XID_LOG = "\n".join(
    [
        "2026-11-30T09:19:40+0000 lab-1 kernel[98]: NVRM: Xid (PCI:0000:18:00): 79, pid=1234, "
        "name=python, GPU has fallen off the bus.",
        "2026-11-30T09:20:01.250000+0000 gpu-7 kernel: NVRM: Xid (PCI:0000:b3:00): 48, "
        "pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been "
        "detected on GPU in the framebuffer at partition 6, subpartition 0.",
        "2026-11-30T09:21:00+0000 gpu-7 kernel: NVRM: Xid (PCI:0000:4b:00 GPU-I:05): 43, pid=77, "
        "name=train, Ch 00000008",
        "2026-11-30T09:22:00+0000 gpu-7 kernel: nvidia-nvswitch0: SXid (PCI:0000:c5:00.0): 12028, "
        "Non-fatal, Link 32 egress non-posted PRIV error",
        "Aug 17 06:18:01 gpu-7 kernel: [12345.678901] NVRM: Xid (0000:3b:00): 13, Graphics SM Warp "
        "Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    ]
)


def test_xid_events() -> None:
    result = parse_xid_events(XID_LOG)
    assert result["lines_read"] == 5
    fell_off, dbe, mig, sm = result["events"]
    assert fell_off == {
        "time": "2026-11-30T09:19:40+00:00",
        "pci": "0000:18:00",
        "xid": 79,
        "message": "GPU has fallen off the bus.",
        "pid": "1234",
        "process": "python",
    }
    assert (dbe["xid"], dbe["pci"], dbe["pid"]) == (48, "0000:b3:00", "'<unknown>'")
    assert dbe["time"] == "2026-11-30T09:20:01.250000+00:00"
    assert dbe["message"].startswith("An uncorrectable double bit error")
    assert (mig["xid"], mig["pci"]) == (43, "0000:4b:00")
    assert (sm["xid"], sm["pci"], sm["time"]) == (13, "0000:3b:00", "Aug 17 06:18:01")
    assert sm["message"].startswith("Graphics SM Warp Exception")


def test_kernel_log_without_xids_is_an_explicit_zero() -> None:
    result = parse_xid_events("2026-11-30T09:19:40+0000 n kernel: eth0: link up\n")
    assert (result["state"], result["lines_read"], result["events"]) == ("ok", 1, [])


def test_unrecognized_xid_line_is_kept_not_dropped() -> None:
    (event,) = parse_xid_events("kernel: NVRM: Xid (something new)\n")["events"]
    assert event["xid"] is None and "something new" in event["message"]


# --- syslog IB flaps --------------------------------------------------------------------------


def test_six_flaps_on_ib6() -> None:
    result = parse_ib_flaps(read("syslog/1dev_6flap_syslog"))
    assert result["flaps"] == {"ib6": 6}
    assert result["total_flaps"] == 6
    assert result["recoveries"] == {"ib6": 6}
    assert (result["first_flap"], result["last_flap"]) == ("Aug 17 06:18:01", "Aug 17 06:18:06")
    assert result["lines_read"] == 14 and result["unparsed_lines"] == 0


def test_no_flaps() -> None:
    result = parse_ib_flaps(read("syslog/0flap_syslog"))
    assert (result["state"], result["flaps"], result["total_flaps"], result["lines_read"]) == (
        "ok",
        {},
        0,
        2,
    )


def test_carrier_loss_of_other_interfaces_is_not_an_ib_flap() -> None:
    log = "2026-11-30T09:19:40+0000 n systemd-networkd[5]: eth0: Lost carrier\n"
    result = parse_ib_flaps(log)
    assert (result["total_flaps"], result["other_carrier_losses"]) == (0, {"eth0": 1})


@pytest.mark.parametrize(
    ("text", "reason"),
    [("", "empty output"), ("no syslog here\nnor here\n", "no syslog-formatted line")],
)
def test_bad_syslog_is_unreadable(text: str, reason: str) -> None:
    result = parse_ib_flaps(text)
    assert result["state"] == "unreadable" and reason in result["reason"]


# --- the probe's report -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty output"),
        ('{"schema": "gpunode.gpu-report/1", "state": "ok"', "not JSON"),
        ('{"schema": "other/1"}', "not a gpunode.gpu-report/1 document"),
        ('{"schema": "gpunode.gpu-report/1", "state": "ok", "gpus": []}', "report lacks"),
        (
            '{"schema": "gpunode.gpu-report/1", "state": "absent", "reason": "r", "gpus": 3}',
            "not a list of GPU objects",
        ),
        ('{"schema": "gpunode.gpu-report/1", "state": "fine", "gpus": []}', "unknown report state"),
        ('{"schema": "gpunode.gpu-report/1", "state": "absent", "gpus": []}', "gives no reason"),
    ],
    ids=["empty", "truncated", "other-schema", "incomplete", "bad-gpus", "bad-state", "no-reason"],
)
def test_bad_probe_report_is_unreadable(text: str, reason: str) -> None:
    result = parse_gpu_report(text)
    assert result["state"] == "unreadable"
    assert result["command"] == "gpu_probe (python3 -)"
    assert reason in result["reason"]


# --- sections: framing, exit status, absence --------------------------------------------------


def run_sh(command: str) -> list[str]:
    done = subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stderr == ""  # everything, stderr included, arrives framed on stdout
    return done.stdout.splitlines()


def section_output(
    lines: list[str], stderr: list[str] | None = None, exit_code: int | None = 0
) -> list[str]:
    """What a section command prints when its tool printed ``lines`` (and ``stderr``) and
    exited ``exit_code`` (None: the output was cut before the exit status)."""
    part = PartOutput("tool", list(lines), list(stderr or []), exit_code)
    return framing.output_of({"tool": part}, complete=exit_code is not None)


def test_framing_keeps_stdout_prefixes_stderr_and_ends_with_the_exit_status() -> None:
    lines = run_sh(framed("echo out1; echo err1 >&2; printf out2; exit 3", "sh"))
    # stdout's last line had no newline: the first marker is glued to it, and still found.
    assert lines[3].startswith("out2##gpunode-frame:") and lines[3].endswith(":stderr:err1")
    (output,) = framing.parse(lines).parts.values()
    assert (output.lines, output.stderr, output.exit_status) == (["out1", "out2"], ["err1"], 3)


def test_framing_reports_a_missing_program() -> None:
    lines = run_sh(framed("no-such-tool --list", "no-such-tool"))
    assert framing.parse(lines).parts["no-such-tool"].absent
    result = parse_section("ibstat", lines)
    assert (result["state"], result["command"]) == ("absent", "ibstat")
    assert "not installed" in result["reason"]


def test_section_output_cut_short_is_unreadable() -> None:
    lines = read("ibstat/ibstat.47.0.h100.all.active.0").splitlines()
    result = parse_section("ibstat", section_output(lines, exit_code=None))  # the output was cut
    assert result["state"] == "unreadable" and "truncated" in result["reason"]
    assert parse_section("ibstat", section_output(lines))["state"] == "ok"
    assert parse_section("ibstat", [])["reason"] == "empty output"
    unframed = parse_section("ibstat", lines)  # no frame: nothing of it is taken as read
    assert unframed["state"] == "unreadable" and "not framed" in unframed["reason"]


def test_failed_tool_is_unreadable_with_its_message() -> None:
    lines = section_output([], ["ibpanic: [77] main: can't init UMAD library"], 255)
    result = parse_section("ibstat", lines)
    assert result["state"] == "unreadable"
    assert result["reason"] == "exit code 255: ibpanic: [77] main: can't init UMAD library"


def test_nvidia_smi_exit_codes_are_named() -> None:
    not_loaded = parse_section(
        "nvlink",
        section_output(
            ["NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."], [], 9
        ),
    )
    assert not_loaded["state"] == "driver_not_loaded"
    assert "NVIDIA driver is not loaded" in not_loaded["reason"]
    fell_off = parse_section(
        "nvidia_smi_xml", section_output(["Unable to determine the device handle"], [], 15)
    )
    assert fell_off["state"] == "unreadable" and "fallen off the bus" in fell_off["reason"]
    mismatch = parse_section(
        "nvidia_smi_xml",
        section_output(
            [
                "Failed to initialize NVML: Driver/library version mismatch",
                "NVML library version: 550.90",
            ],
            [],
            18,
        ),
    )
    assert mismatch["nvml_library_version"] == "550.90"
    assert "driver/library version mismatch" in mismatch["reason"]


def test_journal_sections_refuse_a_partial_journal() -> None:
    hint = "Hint: You are currently not seeing messages from other users and the system."
    result = parse_section("xid", section_output([], [hint]))
    assert result["state"] == "unreadable" and "run as root" in result["reason"]
    empty = parse_section("xid", section_output([]))
    assert (empty["state"], empty["events"], empty["lines_read"]) == ("ok", [], 0)
    flaps = parse_section("ib_flaps", section_output([]))
    assert (flaps["state"], flaps["total_flaps"]) == ("ok", 0)


def test_unknown_section_is_unreadable() -> None:
    assert parse_section("gpus", ["x"])["state"] == "unreadable"


def test_combined_output_is_split_by_section() -> None:
    ibstat = section_output(read("ibstat/ibstat.47.0.a100.all.active.0").splitlines())
    nvme = framing.output_of({"nvme": PartOutput("nvme", absent=True)})
    lines = framing.output_of({"ibstat": ibstat, "nvme": nvme}, complete=False)
    results = parse_combined(lines, ["ibstat", "nvme", "nvlink"])
    assert results["ibstat"]["state"] == "ok" and len(results["ibstat"]["ports"]) == 9
    assert results["nvme"]["state"] == "absent"
    assert results["nvlink"]["state"] == "unreadable" and "missing" in results["nvlink"]["reason"]


def test_combined_command_runs_each_section_in_its_own_part(tmp_path: Path) -> None:
    fixture = FIXTURES / "ibstat" / "ibstat.47.0.a100.all.active.0"
    (tmp_path / "ibstat").write_text(f"#!/bin/sh\ncat {shlex.quote(str(fixture))}\nexit 0\n")
    (tmp_path / "nvme").write_text("#!/bin/sh\necho 'nvme: no such command' >&2\nexit 1\n")
    for tool in ("ibstat", "nvme"):
        (tmp_path / tool).chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}  # the stand-ins come first
    command = combined_command(["ibstat", "nvme"])
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)
    results = parse_combined(done.stdout.splitlines(), ["ibstat", "nvme"])
    assert results["ibstat"]["state"] == "ok" and len(results["ibstat"]["ports"]) == 9
    assert results["nvme"]["state"] == "unreadable"
    assert results["nvme"]["reason"] == "exit code 1: nvme: no such command"
    with pytest.raises(ValueError, match="unknown sections"):
        combined_command(["ibstat", "disks"])


def test_section_commands_never_use_query_gpu() -> None:
    assert not any("--query-gpu" in command for command in SECTION_COMMANDS.values())
    assert re.search(r"\bnvidia-smi -q -x\b", SECTION_COMMANDS["nvidia_smi_xml"])


# --- tolerance: what can be read is kept, what cannot is named ----------------------------------


@pytest.mark.parametrize(
    ("capture", "state", "total"),
    [(H100_MIG_CAPTURE, "mig_mode", None), (L40S_CAPTURE, "none", 0)],
    ids=["h100-mig-590", "l40s-595"],
)
def test_nvlink_message_lines_of_real_captures_are_states(
    capture: str, state: str, total: int | None
) -> None:
    """'Nvlink queries are not supported for Devices in MIG mode' / 'Device does not have or
    support Nvlink' under the GPU line (nvidia_gpu_exporter captures)."""
    result = parse_nvlink_status(capture_section("capabilities :: nvlink -s")(read(capture)))
    (gpu,) = result["gpus"]
    assert (gpu["state"], gpu["active"], gpu["total"]) == (state, 0, total)
    assert result["problems"] == []


def test_empty_nvlink_output_after_exit_0_is_no_nvlink_through_the_section() -> None:
    """gpud's A10 capture is empty: with the exit status 0 framed, that is an answer."""
    lines = section_output(read("nvlink/nvidia-smi.nvlink.status.a10").splitlines())
    result = parse_section("nvlink", lines)
    assert (result["state"], result["gpus"]) == ("ok", [])


def test_an_unknown_nvlink_line_is_named_and_the_other_gpus_are_kept() -> None:
    text = read("nvlink/nvidia-smi.nvlink.status.a100")
    lines = text.splitlines()
    at = lines.index(next(line for line in lines if line.startswith("GPU 3:"))) + 1
    lines.insert(at, "         Link 0: <degraded>")
    lines.insert(at + 1, "Some message a newer driver prints")
    result = parse_nvlink_status("\n".join(lines) + "\n")
    assert result["state"] == "ok"
    assert len(result["gpus"]) == 8
    assert result["problems"] == [
        f"line {at + 1}: unknown link state '<degraded>'",
        f"line {at + 2} not understood: 'Some message a newer driver prints'",
    ]
    states = [gpu["state"] for gpu in result["gpus"]]
    assert states == ["ok"] * 3 + ["unreadable"] + ["ok"] * 4
    third = result["gpus"][3]
    assert third["problems"] == result["problems"]
    assert third["active"] == 12  # the twelve links it could read are kept
    assert all(gpu["active"] == 12 for gpu in result["gpus"])


def test_nvlink_lines_before_the_first_gpu_are_named_not_fatal() -> None:
    text = "WARNING: infoROM is corrupted at gpu 0000:07:00.0\n" + read(
        "nvlink/good_nvlink_status.txt"
    )
    result = parse_nvlink_status(text)
    assert result["state"] == "ok"
    assert result["problems"] == [
        "line 1 comes before any GPU: 'WARNING: infoROM is corrupted at gpu 0000:07:00.0'"
    ]
    assert result["gpus"][0]["active"] == 12

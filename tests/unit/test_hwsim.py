"""The lab's vendor-tool doubles answer like the real captures and keep their state.

Each test installs a profile's ``node_files()`` under a temporary root and runs the doubles
through their wrappers, with the state and template locations pointed into that root.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from facts.gpu import GpuDevices
from lab.hwsim import (
    COMMANDS,
    DIVERTED_PATHS,
    MODINFO_PATH,
    NODE_LIBRARY,
    PROFILES,
    initial_state,
    node_files,
)
from lab.hwsim.hwstate import DEFAULT_SHARE_DIR, DEFAULT_STATE_PATH, SHARE_ENV, STATE_ENV
from lab.hwsim.profiles import parse_ibstat

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H100_CAPTURE = FIXTURES / "nvidia-smi-capture/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
GOOD_NVLINK_UUID = "GPU-c7e253b0-c227-6f10-e860-7482c85e7ce8"
BAD_NVLINK_UUID = "GPU-9667d95e-6d22-0c22-1f57-c481f13e7c44"


class LabNode:
    """A profile's node files installed under ``root``; commands run through their wrappers.

    The wrappers are the shipped ones with the node's python3 and library directory replaced
    by the test's Python and the library under ``root``.
    """

    def __init__(self, root: Path, profile: str, hostname: str) -> None:
        self.root = root
        for path, (content, mode) in node_files(profile, hostname).items():
            target = self.path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            if path in COMMANDS:
                content = content.replace(b"/usr/bin/python3", sys.executable.encode())
                content = content.replace(
                    NODE_LIBRARY.encode(), str(self.path(NODE_LIBRARY)).encode()
                )
            target.write_bytes(content)
            target.chmod(mode)
        self.state_file = self.path(DEFAULT_STATE_PATH)
        self.commands = {
            Path(command).name: self.path(command) for command in (*COMMANDS, MODINFO_PATH)
        }

    def path(self, node_path: str) -> Path:
        return self.root / node_path.lstrip("/")

    def run(self, command: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": "/usr/bin:/bin",
            STATE_ENV: str(self.state_file),
            SHARE_ENV: str(self.path(DEFAULT_SHARE_DIR)),
        }
        return subprocess.run(
            [self.commands[command], *args],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=30,
        )

    def ok(self, command: str, *args: str) -> str:
        result = self.run(command, *args)
        assert result.returncode == 0, (command, args, result.stdout, result.stderr)
        return result.stdout

    def set(self, path: str, value: object) -> None:
        self.ok("gpunode-lab-hw", "set", path, json.dumps(value))

    def state(self) -> dict[str, Any]:
        return json.loads(self.state_file.read_text())

    def query(self, fields: str, *args: str) -> list[list[str]]:
        output = self.ok("nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader", *args)
        return [line.split(", ") for line in output.splitlines()]


@pytest.fixture
def lab_node(tmp_path: Path) -> Callable[..., LabNode]:
    def make(profile: str, hostname: str = "lab-node-1") -> LabNode:
        return LabNode(tmp_path / profile / hostname, profile, hostname)

    return make


def xml_gpus(output: str) -> list[ElementTree.Element]:
    return ElementTree.fromstring(output).findall("gpu")


def capture_section(title: str) -> list[str]:
    """Body lines of the H100 capture section whose '# $ ...' line starts with ``title``."""
    lines = H100_CAPTURE.read_text().splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith(f"# $ {title}"))
    end = next(n for n in range(start + 2, len(lines)) if lines[n].startswith("#####"))
    return lines[start + 2 : end]


# --- node files and factory state ---------------------------------------------------------


def test_node_files_install_the_doubles_over_the_diverted_tools() -> None:
    files = node_files("a100", "lab-node-1")
    assert set(DIVERTED_PATHS) < set(COMMANDS) <= set(files)
    for command, module in COMMANDS.items():
        content, mode = files[command]
        assert mode == 0o755
        assert content.startswith(b"#!/bin/sh\n")
        assert f"/usr/local/lib/gpunode-lab/gpunode_lab_hw/{module}.py" in files
    assert files[MODINFO_PATH][1] == 0o755 and files[MODINFO_PATH][0].startswith(b"#!/bin/sh\n")
    assert json.loads(files[DEFAULT_STATE_PATH][0]) == initial_state("a100", "lab-node-1")
    assert f"{DEFAULT_SHARE_DIR}/a10g.xml" in files


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_factory_state_is_stable_per_node_and_differs_between_nodes(profile: str) -> None:
    first = initial_state(profile, "lab-node-1")
    assert first == initial_state(profile, "lab-node-1")
    other = initial_state(profile, "lab-node-2")
    uuids = {gpu["uuid"] for gpu in first["gpus"]}
    assert len(uuids) == len(first["gpus"])
    assert uuids.isdisjoint(gpu["uuid"] for gpu in other["gpus"])
    for gpu in first["gpus"]:
        assert gpu["persistence_mode"] == "Disabled"
        assert gpu["ecc_mode"] == {"current": "Enabled", "pending": "Enabled"}
        assert gpu["mig_mode"]["current"] == gpu["mig_mode"]["pending"] != "Enabled"
        assert gpu["power"]["limit"] == gpu["power"]["default_limit"]
        assert all(link["active"] for link in gpu["nvlinks"])
    assert all(port["state"] == "Active" for port in first["ib_ports"])


def test_profiles_have_the_specified_hardware() -> None:
    h100, a100, a10g = (initial_state(p, "n") for p in ("hgx-h100", "a100", "pcie-a10g"))
    assert [len(s["gpus"]) for s in (h100, a100, a10g)] == [8, 8, 1]
    assert [len(s["gpus"][0]["nvlinks"]) for s in (h100, a100, a10g)] == [18, 12, 0]
    assert [len(s["nvme"]) for s in (h100, a100, a10g)] == [8, 4, 1]
    infiniband = [p for p in h100["ib_ports"] if p["link_layer"] == "InfiniBand"]
    assert len(infiniband) == 8
    assert {(p["ca_type"], p["firmware_version"], p["rate"]) for p in infiniband} == {
        ("MT4129", "28.39.1002", 400)
    }
    assert a10g["ib_ports"] == []
    assert h100["nvswitch_count"] > 0
    assert a100["nvswitch_count"] > 0
    assert a10g["nvswitch_count"] == 0


# --- nvidia-smi -q -x -----------------------------------------------------------------------


def test_h100_xml_has_eight_gpus_in_the_driver_590_layout(lab_node: Callable[..., LabNode]) -> None:
    output = lab_node("hgx-h100").ok("nvidia-smi", "-q", "-x")
    assert output.splitlines()[1] == '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">'
    root = ElementTree.fromstring(output)
    assert root.findtext("driver_version") == "590.48.01"
    assert root.findtext("cuda_version") == "13.1"
    assert root.findtext("attached_gpus") == "8"
    gpus = root.findall("gpu")
    assert [gpu.findtext("product_name") for gpu in gpus] == ["NVIDIA H100 80GB HBM3"] * 8
    for gpu in gpus:
        assert gpu.find("clocks_event_reasons/clocks_event_reason_hw_slowdown") is not None
        assert gpu.find("clocks_throttle_reasons") is None
        assert gpu.findtext("gpu_power_readings/instant_power_draw") == "69.85 W"
        assert gpu.find("gpu_power_readings/power_draw") is None
        assert gpu.findtext("gpu_power_readings/max_power_limit") == "700.00 W"
        assert gpu.find("clocks_event_reasons_counters") is not None
        assert gpu.findtext("applications_clocks/graphics_clock") == (
            "Requested functionality has been deprecated"
        )
        assert (gpu.findtext("mig_devices") or "").strip() == "None"


def test_a10g_xml_keeps_the_driver_515_names(lab_node: Callable[..., LabNode]) -> None:
    output = lab_node("pcie-a10g").ok("nvidia-smi", "-q", "-x")
    captured = (FIXTURES / "nvidia-smi-xml/a10g.xml").read_text()
    assert output.splitlines()[:2] == captured.splitlines()[:2]
    (gpu,) = xml_gpus(output)
    assert gpu.findtext("product_name") == "NVIDIA A10G"
    assert gpu.findtext("clocks_throttle_reasons/clocks_throttle_reason_gpu_idle") == "Active"
    assert gpu.find("clocks_event_reasons") is None
    assert gpu.findtext("power_readings/power_limit") == "300.00 W"
    assert gpu.find("gpu_power_readings") is None
    assert gpu.findtext("mig_mode/current_mig") == "N/A"
    assert gpu.findtext("fan_speed") == "0 %"


def test_a100_xml_has_the_captured_element_order(lab_node: Callable[..., LabNode]) -> None:
    captured = ElementTree.parse(FIXTURES / "nvidia-smi-xml/a100-sxm4-v12.xml").getroot()
    output = lab_node("a100").ok("nvidia-smi", "-q", "-x", "-i", "3")
    (gpu,) = xml_gpus(output)
    template = captured.find("gpu")
    assert template is not None
    assert [child.tag for child in gpu] == [child.tag for child in template]
    assert gpu.get("id") == "00000000:4E:00.0"
    assert gpu.findtext("mig_mode/current_mig") == "Disabled"
    assert gpu.findtext("remapped_rows/remapped_row_unc") == "0"
    graphics = [clock.text for clock in gpu.iter("supported_graphics_clock")]
    assert graphics == [clock.text for clock in template.iter("supported_graphics_clock")]


# --- nvidia-smi --query-gpu -----------------------------------------------------------------


def test_query_header_and_units_are_the_captures(lab_node: Callable[..., LabNode]) -> None:
    captures = H100_CAPTURE.read_text().splitlines()
    command = next(line for line in captures if line.startswith("# $ nvidia-smi --query-gpu="))
    fields = command.split("--query-gpu=")[1].split()[0]
    header, captured = capture_section("nvidia-smi --query-gpu=")[:2]
    node = lab_node("hgx-h100")
    output = node.ok("nvidia-smi", f"--query-gpu={fields}", "--format=csv", "-i", "0")
    ours_header, ours = output.splitlines()
    assert ours_header == header
    modelled = {
        "driver_version", "count", "name", "pci.bus_id", "pci.domain", "pci.device_id",
        "ecc.mode.current", "mig.mode.pending", "power.draw [W]",
        "power.limit [W]", "power.default_limit [W]", "power.min_limit [W]", "power.max_limit [W]",
        "temperature.gpu", "clocks.applications.graphics [MHz]", "clocks.max.graphics [MHz]",
        "pcie.link.gen.current", "pcie.link.width.max", "memory.total [MiB]", "fan.speed [%]",
        "clocks_event_reasons.active", "clocks_event_reasons.gpu_idle",
    }  # fmt: skip
    rows = zip(header.split(", "), captured.split(", "), ours.split(", "), strict=True)
    for name, captured_value, our_value in rows:
        if name in modelled:
            # Same shape: the unit (or the bracketed status) and the number format.
            shape = re.sub(r"[0-9A-F]", "9", captured_value)
            assert re.sub(r"[0-9A-F]", "9", our_value) == shape, (name, our_value)
    no_units = node.ok("nvidia-smi", "--query-gpu=power.limit,memory.total", "--format=csv,nounits")
    assert no_units.splitlines()[:2] == ["power.limit [W], memory.total [MiB]", "700.00, 81559"]


def test_an_unknown_query_field_fails_the_whole_call(lab_node: Callable[..., LabNode]) -> None:
    node = lab_node("a100")
    result = node.run("nvidia-smi", "--query-gpu=index,xyz", "--format=csv")
    assert (result.returncode, result.stdout) == (
        2,
        'Field "xyz" is not a valid field to query.\n\n',
    )
    aliased = node.ok("nvidia-smi", "--query-gpu=gpu_name,clocks.gr", "--format=csv", "-i", "0")
    assert aliased.splitlines()[0] == "name, clocks.current.graphics [MHz]"


# --- settings -------------------------------------------------------------------------------


def test_persistence_mode_is_set_at_once(lab_node: Callable[..., LabNode]) -> None:
    node = lab_node("a100")
    output = node.ok("nvidia-smi", "-i", "0,2", "-pm", "1")
    assert output == (
        "Enabled persistence mode for GPU 00000000:07:00.0.\n"
        "Enabled persistence mode for GPU 00000000:47:00.0.\n"
        "All done.\n"
    )
    modes = [row[1] for row in node.query("index,persistence_mode")]
    assert modes == ["Enabled", "Disabled", "Enabled"] + ["Disabled"] * 5
    again = node.ok("nvidia-smi", "-i", "0", "-pm", "1")
    assert again.startswith("Persistence mode is already Enabled for GPU 00000000:07:00.0.")


def test_compute_mode_is_set_at_once_and_forgotten_at_reboot(
    lab_node: Callable[..., LabNode],
) -> None:
    node = lab_node("a100")
    output = node.ok("nvidia-smi", "-i", "1", "-c", "EXCLUSIVE_PROCESS")
    # The published message (nvidia-smi -i 0 --compute-mode 3 on a real GPU).
    assert output == "Set compute mode to EXCLUSIVE_PROCESS for GPU 00000000:0F:00.0.\nAll done.\n"
    modes = [row[1] for row in node.query("index,compute_mode")]
    assert modes == ["Default", "Exclusive_Process"] + ["Default"] * 6
    node.ok("nvidia-smi", "--compute-mode", "3")
    assert {row[1] for row in node.query("index,compute_mode")} == {"Exclusive_Process"}
    assert "<compute_mode>Exclusive_Process</compute_mode>" in node.ok("nvidia-smi", "-q", "-x")
    assert node.run("nvidia-smi", "-c", "SIDEWAYS").returncode != 0
    node.ok("gpunode-lab-hw", "reboot")
    assert {row[1] for row in node.query("index,compute_mode")} == {"Default"}


@pytest.mark.parametrize("apply", [("gpunode-lab-hw", "reboot"), ("nvidia-smi", "-r")])
def test_ecc_change_waits_for_a_reset_or_reboot(
    lab_node: Callable[..., LabNode], apply: tuple[str, ...]
) -> None:
    node = lab_node("hgx-h100")
    output = node.ok("nvidia-smi", "-e", "0", "-i", "1")
    assert output.endswith("All done.\nReboot required.\n")
    ecc = "index,ecc.mode.current,ecc.mode.pending"
    assert node.query(ecc, "-i", "1") == [["1", "Enabled", "Disabled"]]
    node.ok(*apply)
    assert node.query(ecc, "-i", "1") == [["1", "Disabled", "Disabled"]]
    assert node.query(ecc, "-i", "0") == [["0", "Enabled", "Enabled"]]


def test_a_reset_answers_the_drivers_request_and_refuses_a_gpu_in_use(
    lab_node: Callable[..., LabNode],
) -> None:
    node = lab_node("hgx-h100")
    node.ok("gpunode-lab-hw", "set", "gpus.2.recovery_action", "GPU Reset")
    node.ok("gpunode-lab-hw", "set", "gpus.2.compute_processes",
            '[{"pid": 4242, "name": "python3", "used_memory_mib": 1024}]')  # fmt: skip
    bus = node.query("pci.bus_id", "-i", "2")[0][0]
    refused = node.run("nvidia-smi", "-r", "-i", bus)
    assert refused.returncode == 255
    assert "being used by some other process" in refused.stdout
    assert "<gpu_recovery_action>GPU Reset</gpu_recovery_action>" in node.ok(
        "nvidia-smi", "-q", "-x", "-i", "2"
    )
    node.ok("gpunode-lab-hw", "set", "gpus.2.compute_processes", "[]")
    assert (
        node.ok("nvidia-smi", "-r", "-i", bus) == f"GPU {bus} was successfully reset.\nAll done.\n"
    )
    assert "<gpu_recovery_action>None</gpu_recovery_action>" in node.ok(
        "nvidia-smi", "-q", "-x", "-i", "2"
    )


def test_mig_mode_is_pending_and_unsupported_on_a10g(lab_node: Callable[..., LabNode]) -> None:
    a100 = lab_node("a100")
    output = a100.ok("nvidia-smi", "-i", "5", "-mig", "1")
    assert output.startswith(
        "Warning: MIG mode is in pending enable state for GPU 00000000:90:00.0"
    )
    assert a100.query("mig.mode.current,mig.mode.pending", "-i", "5") == [["Disabled", "Enabled"]]
    a100.ok("gpunode-lab-hw", "reboot")
    assert a100.query("mig.mode.current,mig.mode.pending", "-i", "5") == [["Enabled", "Enabled"]]
    a10g = lab_node("pcie-a10g")
    before = a10g.state_file.read_bytes()
    assert "Not Supported" in a10g.ok("nvidia-smi", "-mig", "1")
    assert json.loads(a10g.state_file.read_bytes()) == json.loads(before)


def test_mig_instances_show_while_mig_is_on_and_go_at_reboot(
    lab_node: Callable[..., LabNode],
) -> None:
    node = lab_node("a100")
    node.set("gpus.1.mig_mode", {"current": "Enabled", "pending": "Enabled"})
    node.ok("nvidia-smi", "mig", "-i", "1", "-cgi", "1g.10gb,1g.10gb", "-C")
    (gpu,) = xml_gpus(node.ok("nvidia-smi", "-q", "-x", "-i", "1"))
    devices = gpu.findall("mig_devices/mig_device")
    assert [device.findtext("gpu_instance_id") for device in devices] == ["11", "13"]
    assert [device.findtext("index") for device in devices] == ["0", "1"]
    assert devices[1].findtext("fb_memory_usage/total") == "9728 MiB"
    assert devices[1].findtext("device_attributes/shared/multiprocessor_count") == "14"
    assert gpu.findtext("utilization/gpu_util") == "N/A"
    node.ok("gpunode-lab-hw", "reboot")
    (gpu,) = xml_gpus(node.ok("nvidia-smi", "-q", "-x", "-i", "1"))
    assert gpu.findtext("mig_mode/current_mig") == "Enabled"
    assert (gpu.findtext("mig_devices") or "").strip() == "None"
    assert node.run("nvidia-smi", "mig", "-lgi").stdout == "No GPU instances found.\n"


def test_power_limit_out_of_range_fails_and_changes_nothing(
    lab_node: Callable[..., LabNode],
) -> None:
    node = lab_node("hgx-h100")
    before = node.state_file.read_bytes()
    result = node.run("nvidia-smi", "-pl", "800")
    assert result.returncode == 2
    assert result.stdout == (
        "Provided power limit 800.00 W is not a valid power limit which should be between "
        "200.00 W and 700.00 W for GPU 00000000:18:00.0\n"
        "Terminating early due to previous errors.\n"
    )
    assert node.state_file.read_bytes() == before
    assert node.ok("nvidia-smi", "-i", "2", "-pl", "450") == (
        "Power limit for GPU 00000000:3A:00.0 was set to 450.00 W from 700.00 W.\nAll done.\n"
    )
    assert [row[0] for row in node.query("power.limit", "-i", "1,2")] == ["700.00 W", "450.00 W"]


def test_reboot_forgets_the_settings_the_driver_does_not_keep(
    lab_node: Callable[..., LabNode],
) -> None:
    node = lab_node("pcie-a10g")
    node.ok("nvidia-smi", "-pm", "1")
    node.ok("nvidia-smi", "-pl", "250")
    assert "Applications clocks set to" in node.ok("nvidia-smi", "-ac", "6251,1500")
    fields = "persistence_mode,power.limit,clocks.applications.graphics"
    assert node.query(fields) == [["Enabled", "250.00 W", "1500 MHz"]]
    node.ok("gpunode-lab-hw", "reboot")
    assert node.query(fields) == [["Disabled", "300.00 W", "1710 MHz"]]


def test_reboot_loads_the_installed_driver_and_reports_its_cuda_version(
    lab_node: Callable[..., LabNode],
) -> None:
    # What the stand-in kernel module package records (lab.standin.catalogue): a change from
    # the profile's 590 driver (CUDA 13.1) down to 580 takes effect at the reboot only.
    node = lab_node("hgx-h100")
    record = node.state_file.parent
    (record / "installed-driver-version").write_text("580.105.08\n")
    (record / "installed-driver-cuda-version").write_text("13.0\n")
    root = ElementTree.fromstring(node.ok("nvidia-smi", "-q", "-x"))
    assert (root.findtext("driver_version"), root.findtext("cuda_version")) == ("590.48.01", "13.1")
    node.ok("gpunode-lab-hw", "reboot")
    root = ElementTree.fromstring(node.ok("nvidia-smi", "-q", "-x"))
    assert (root.findtext("driver_version"), root.findtext("cuda_version")) == (
        "580.105.08",
        "13.0",
    )
    assert "CUDA Version: 13.0" in node.ok("nvidia-smi")


def test_a_lost_gpu_and_a_recovery_action_are_set_by_hand_and_gone_at_reboot(
    lab_node: Callable[..., LabNode],
) -> None:
    node = lab_node("hgx-h100")
    node.ok("gpunode-lab-hw", "set", "gpus.2.lost", "true")
    node.ok("gpunode-lab-hw", "set", "gpus.5.recovery_action", "Reboot")
    gpus = ElementTree.fromstring(node.ok("nvidia-smi", "-q", "-x")).findall("gpu")
    assert gpus[2].findtext("uuid") == "GPU is lost" and gpus[2].get("id")
    assert gpus[5].findtext("gpu_recovery_action") == "Reboot"
    assert gpus[4].findtext("gpu_recovery_action") == "None"
    node.ok("gpunode-lab-hw", "reboot")
    gpus = ElementTree.fromstring(node.ok("nvidia-smi", "-q", "-x")).findall("gpu")
    assert gpus[2].findtext("uuid", "").startswith("GPU-")
    assert gpus[5].findtext("gpu_recovery_action") == "None"


# --- faults -----------------------------------------------------------------------------------


def test_a_gpu_off_the_bus_disappears_everywhere(lab_node: Callable[..., LabNode]) -> None:
    node = lab_node("a100")
    lost = node.state()["gpus"][3]["uuid"]
    node.set("gpus.3.present", False)
    listing = node.ok("nvidia-smi", "-L")
    assert len(listing.splitlines()) == 7
    assert lost not in listing
    root = ElementTree.fromstring(node.ok("nvidia-smi", "-q", "-x"))
    assert root.findtext("attached_gpus") == "7"
    assert lost not in [gpu.findtext("uuid") for gpu in root.findall("gpu")]
    rows = node.query("index,uuid,count")
    assert [row[0] for row in rows] == [str(n) for n in range(7)]
    assert lost not in [row[1] for row in rows]
    assert {row[2] for row in rows} == {"7"}


def test_no_driver_fails_every_call_with_exit_9(lab_node: Callable[..., LabNode]) -> None:
    node = lab_node("hgx-h100")
    node.set("driver_loaded", False)
    for args in (["-L"], ["-q", "-x"], ["--query-gpu=name", "--format=csv"], ["-pm", "1"], []):
        result = node.run("nvidia-smi", *args)
        assert result.returncode == 9
        assert result.stdout == (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n\n"
        )


def test_state_paths_must_exist_to_be_set(lab_node: Callable[..., LabNode]) -> None:
    node = lab_node("a100")
    before = node.state_file.read_bytes()
    result = node.run("gpunode-lab-hw", "set", "gpus.0.persistance_mode", "Enabled")
    assert result.returncode == 1
    assert "persistance_mode" in result.stderr
    assert node.run("gpunode-lab-hw", "set", "gpus.8.present", "false").returncode == 1
    assert node.state_file.read_bytes() == before
    node.ok("gpunode-lab-hw", "set", "ib_ports.2.state", "Down")
    assert json.loads(node.ok("gpunode-lab-hw", "show", "ib_ports.2.state")) == "Down"


def test_concurrent_changes_are_all_kept(lab_node: Callable[..., LabNode]) -> None:
    node = lab_node("a100")
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(
            pool.map(
                lambda n: node.run(
                    "gpunode-lab-hw", "set", f"gpus.{n}.temperature.gpu", f"{60 + n}"
                ),
                range(8),
            )
        )
    assert [result.returncode for result in results] == [0] * 8
    assert [gpu["temperature"]["gpu"] for gpu in node.state()["gpus"]] == list(range(60, 68))


# --- nvlink, summary table ------------------------------------------------------------------


def test_nvlink_status_matches_the_captured_outputs(lab_node: Callable[..., LabNode]) -> None:
    node = lab_node("a100")
    node.set("gpus.7.uuid", GOOD_NVLINK_UUID)
    good = (FIXTURES / "nvlink/good_nvlink_status.txt").read_text()
    assert node.ok("nvidia-smi", "nvlink", "--status", "-i", "7") == good
    node.set("gpus.6.uuid", BAD_NVLINK_UUID)
    node.set("gpus.6.nvlinks", [{"active": False}] * 12)
    bad = (FIXTURES / "nvlink/bad_nvlink_status.txt").read_text()
    assert node.ok("nvidia-smi", "nvlink", "-s", "-i", "6") == bad
    node.set("gpus.5.nvlinks.3.active", False)
    links = node.ok("nvidia-smi", "nvlink", "-s", "-i", "5").splitlines()
    assert links[3:6] == ["\t Link 2: 25 GB/s", "\t Link 3: <inactive>", "\t Link 4: 25 GB/s"]


def test_nvlink_error_counters_match_the_captured_layout(
    lab_node: Callable[..., LabNode],
) -> None:
    """Every GPU, link and counter as in the real A100 capture (whose board is the 40 GB
    one: its GPU lines differ in name and UUID only); a test sets a counter, a GPU reset clears
    it, as the driver's counters count since the last reset."""
    node = lab_node("a100")
    capture = (FIXTURES / "nvlink/nvidia-smi.nvlink.errors.a100-sxm4-40gb.535.161.08").read_text()
    captured, simulated = capture.split("\n"), node.ok("nvidia-smi", "nvlink", "-e").split("\n")
    assert len(simulated) == len(captured)
    differing = [(a, b) for a, b in zip(captured, simulated, strict=True) if a != b]
    assert len(differing) == 8 and all(a.startswith("GPU ") for a, _ in differing)
    node.set("gpus.2.nvlinks.7.errors.replay", 42)
    lines = node.ok("nvidia-smi", "nvlink", "--errorcounters", "-i", "2").splitlines()
    assert lines[1 + 7 * 4] == "\t Link 7: Replay Errors: 42"
    node.ok("nvidia-smi", "-r", "-i", "2")
    assert "Replay Errors: 42" not in node.ok("nvidia-smi", "nvlink", "-e", "-i", "2")


def test_h100_nvlink_speed_is_the_captured_one(lab_node: Callable[..., LabNode]) -> None:
    output = lab_node("hgx-h100").ok("nvidia-smi", "nvlink", "-s", "-i", "0")
    assert output.splitlines()[1:] == capture_section("nvidia-smi nvlink -s")[1:19]


def test_summary_table_matches_the_capture(lab_node: Callable[..., LabNode]) -> None:
    node = lab_node("hgx-h100")
    node.set("gpus.0.pci_bus_id", "00000000:00:09.0")
    for position in range(1, 8):
        node.set(f"gpus.{position}.present", False)
    node.ok("nvidia-smi", "-pm", "1")
    lines = H100_CAPTURE.read_text().splitlines()
    start = lines.index("# $ nvidia-smi ") + 2
    table = node.ok("nvidia-smi").splitlines()
    assert table[1:] == lines[start + 1 : start + len(table)]
    assert re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4} {7}", table[0])


# --- mig, compute processes ------------------------------------------------------------------

# The layouts of published real outputs of an H100 80GB HBM3: -lgip, -lgipp, then seven 1g.10gb
# created with -C, listed with -lgi and -lci.
H100_LGIP = """\
+-----------------------------------------------------------------------------+
| GPU instance profiles:                                                      |
| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |
|                              Free/Total   GiB              CE    JPEG  OFA  |
|=============================================================================|
|   0  MIG 1g.10gb       19     7/7        9.75       No     16     1     0   |
|                                                             1     1     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 1g.10gb+me    20     1/1        9.75       No     16     1     0   |
|                                                             1     1     1   |
+-----------------------------------------------------------------------------+
|   0  MIG 1g.20gb       15     4/4        19.62      No     26     1     0   |
|                                                             1     1     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 2g.20gb       14     3/3        19.62      No     32     2     0   |
|                                                             2     2     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 3g.40gb        9     2/2        39.50      No     60     3     0   |
|                                                             3     3     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 4g.40gb        5     1/1        39.50      No     64     4     0   |
|                                                             4     4     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 7g.80gb        0     1/1        79.25      No     132    7     0   |
|                                                             8     7     1   |
+-----------------------------------------------------------------------------+
"""
H100_LGIPP = """\
GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1
GPU  0 Profile ID 20 Placements: {0,1,2,3,4,5,6}:1
GPU  0 Profile ID 15 Placements: {0,2,4,6}:2
GPU  0 Profile ID 14 Placements: {0,2,4}:2
GPU  0 Profile ID  9 Placements: {0,4}:4
GPU  0 Profile ID  5 Placement : {0}:4
GPU  0 Profile ID  0 Placement : {0}:8
"""
H100_SEVEN_IDS = (13, 11, 12, 7, 8, 9, 10)


def h100_lgi_row(gi: int) -> str:
    return f"|   0  MIG 1g.10gb         19       {gi:>2}          {gi - 7}:1     |"


def h100_lci_row(gi: int) -> str:
    return f"|   0     {gi:>2}       MIG 1g.10gb          0         0          0:1     |"


def mig_on(node: LabNode, *gpus: int) -> None:
    for index in gpus:
        node.set(f"gpus.{index}.mig_mode", {"current": "Enabled", "pending": "Enabled"})


def test_mig_listings_need_mig_mode_current_not_pending(lab_node: Callable[..., LabNode]) -> None:
    node = lab_node("a100")
    node.ok("nvidia-smi", "-i", "0", "-mig", "1")
    before = node.state_file.read_bytes()
    for action in (["-lgi"], ["-lgip"], ["-lci"], ["-cgi", "3g.40gb", "-C"], ["-dgi"]):
        result = node.run("nvidia-smi", "mig", "-i", "0", *action)
        assert (result.returncode, result.stdout) == (6, "No MIG-enabled devices found.\n")
    assert node.state_file.read_bytes() == before
    node.ok("gpunode-lab-hw", "reboot")
    result = node.run("nvidia-smi", "mig", "-lgi")
    assert (result.returncode, result.stdout) == (6, "No GPU instances found.\n")
    assert node.run("nvidia-smi", "mig", "-lci").stdout == "No compute instances found.\n"


def test_h100_profiles_and_placements_have_the_published_layout(
    lab_node: Callable[..., LabNode],
) -> None:
    node = lab_node("hgx-h100")
    mig_on(node, 0, 3)
    assert node.ok("nvidia-smi", "mig", "-i", "0", "-lgip") == H100_LGIP
    assert node.ok("nvidia-smi", "mig", "-lgipp", "-i", "0") == H100_LGIPP
    # Every GPU in MIG mode, in index order, when -i is not given.
    placements = node.ok("nvidia-smi", "mig", "-lgipp").splitlines()
    assert placements == H100_LGIPP.splitlines() + [
        line.replace("GPU  0", "GPU  3") for line in H100_LGIPP.splitlines()
    ]


def test_seven_instances_get_the_published_ids_and_listings(
    lab_node: Callable[..., LabNode],
) -> None:
    node = lab_node("hgx-h100")
    mig_on(node, 0)
    created = node.ok("nvidia-smi", "mig", "-i", "0", "-cgi", ",".join(["19"] * 7), "-C")
    expected = []
    for gi in H100_SEVEN_IDS:
        expected += [
            f"Successfully created GPU instance ID {gi:>2} on GPU  0 using profile MIG 1g.10gb "
            "(ID 19)",
            f"Successfully created compute instance ID  0 on GPU  0 GPU instance ID {gi:>2} "
            "using profile MIG 1g.10gb (ID  0)",
        ]
    assert created.splitlines() == expected
    rule = "+" + "-" * 55 + "+"
    lgi = node.ok("nvidia-smi", "mig", "-i", "0", "-lgi").splitlines()
    assert lgi[:5] == [
        rule,
        "| GPU instances:                                        |",
        "| GPU   Name             Profile  Instance   Placement  |",
        "|                          ID       ID       Start:Size |",
        "|" + "=" * 55 + "|",
    ]
    assert lgi[5:] == [line for gi in range(7, 14) for line in (h100_lgi_row(gi), rule)]
    rule = "+" + "-" * 68 + "+"
    lci = node.ok("nvidia-smi", "mig", "-i", "0", "-lci").splitlines()
    assert lci[1:6] == [
        "| Compute instances:                                                 |",
        "| GPU     GPU       Name             Profile   Instance   Placement  |",
        "|       Instance                       ID        ID       Start:Size |",
        "|         ID                                                         |",
        "|" + "=" * 68 + "|",
    ]
    assert lci[6:] == [line for gi in range(7, 14) for line in (h100_lci_row(gi), rule)]
    assert "|   0  MIG 1g.10gb       19     0/7        9.75 " in node.ok(
        "nvidia-smi", "mig", "-lgip"
    )


def test_two_halves_of_an_a100_take_the_published_places(lab_node: Callable[..., LabNode]) -> None:
    node = lab_node("a100")
    mig_on(node, 2)
    node.ok("nvidia-smi", "mig", "-i", "2", "-cgi", "3g.40gb,MIG 3g.40gb", "-C")
    rows = [line for line in node.ok("nvidia-smi", "mig", "-lgi").splitlines() if "MIG" in line]
    assert rows == [
        "|   2  MIG 3g.40gb          9        1          4:4     |",
        "|   2  MIG 3g.40gb          9        2          0:4     |",
    ]
    profiles = node.ok("nvidia-smi", "mig", "-lgip", "-i", "2")
    assert "|   2  MIG 3g.40gb        9     0/2        39.25      No     42     2     0   |" in (
        profiles.splitlines()
    )
    assert "|   2  MIG 1g.10gb       19     0/7        9.50 " in profiles
    (gpu,) = xml_gpus(node.ok("nvidia-smi", "-q", "-x", "-i", "2"))
    devices = gpu.findall("mig_devices/mig_device")
    assert [
        (d.findtext("gpu_instance_id"), d.findtext("compute_instance_id")) for d in devices
    ] == [
        ("1", "0"),
        ("2", "0"),
    ]
    assert {d.findtext("fb_memory_usage/total") for d in devices} == {"40192 MiB"}


def test_small_instances_first_can_leave_no_room_and_what_was_made_stays(
    lab_node: Callable[..., LabNode],
) -> None:
    node = lab_node("a100")
    mig_on(node, 0)
    result = node.run("nvidia-smi", "mig", "-i", "0", "-cgi", "19,19,14,9")
    assert result.returncode == 255
    assert result.stdout.splitlines()[-2:] == [
        "Unable to create a GPU instance on GPU  0 using profile 9: Insufficient Resources",
        "Failed to create GPU instances: Insufficient Resources",
    ]
    instances = node.state()["gpus"][0]["gpu_instances"]
    assert [(i["id"], i["profile_id"]) for i in instances] == [(13, 19), (11, 19), (3, 14)]
    assert all(i["compute_instances"] == [] for i in instances)  # no -C


def test_unknown_profile_is_an_invalid_argument_and_changes_nothing(
    lab_node: Callable[..., LabNode],
) -> None:
    node = lab_node("a100")
    mig_on(node, 0)
    before = node.state_file.read_bytes()
    result = node.run("nvidia-smi", "mig", "-i", "0", "-cgi", "3g.20gb", "-C")
    assert (result.returncode, result.stdout) == (
        2,
        "Unable to create a GPU instance on GPU  0 using profile 3g.20gb: Invalid Argument\n"
        "Failed to create GPU instances: Invalid Argument\n",
    )
    assert node.state_file.read_bytes() == before


def test_instances_are_destroyed_compute_first_and_not_while_in_use(
    lab_node: Callable[..., LabNode],
) -> None:
    node = lab_node("a100")
    mig_on(node, 0, 1)
    node.ok("nvidia-smi", "mig", "-i", "0", "-cgi", "3g.40gb,3g.40gb", "-C")
    node.ok("nvidia-smi", "mig", "-i", "1", "-cgi", "7g.80gb", "-C")
    result = node.run("nvidia-smi", "mig", "-i", "0", "-dgi")
    assert result.returncode == 255
    assert result.stdout == (
        "Unable to destroy GPU instance ID  1 from GPU  0: In use by another client\n"
        "Unable to destroy GPU instance ID  2 from GPU  0: In use by another client\n"
        "Failed to destroy GPU instances: In use by another client\n"
    )
    node.set("gpus.0.compute_processes", [{"pid": 4242, "name": "train", "used_memory_mib": 9}])
    assert node.run("nvidia-smi", "mig", "-i", "0", "-dci").stdout.endswith(
        "Failed to destroy compute instances: In use by another client\n"
    )
    node.set("gpus.0.compute_processes", [])
    assert node.ok("nvidia-smi", "mig", "-i", "0", "-dci") == (
        "Successfully destroyed compute instance ID  0 from GPU  0 GPU instance ID  1\n"
        "Successfully destroyed compute instance ID  0 from GPU  0 GPU instance ID  2\n"
    )
    assert node.ok("nvidia-smi", "mig", "-i", "0", "-dgi", "-gi", "2") == (
        "Successfully destroyed GPU instance ID  2 from GPU  0\n"
    )
    gpus = node.state()["gpus"]
    assert [i["id"] for i in gpus[0]["gpu_instances"]] == [1]
    assert [i["id"] for i in gpus[1]["gpu_instances"]] == [0], "-i 0 touched GPU 1"


def test_compute_processes_are_listed_per_gpu(lab_node: Callable[..., LabNode]) -> None:
    node = lab_node("a100")
    query = ("--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader")
    assert node.ok("nvidia-smi", *query) == ""
    assert node.ok("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv") == (
        "pid, used_gpu_memory [MiB]\n"
    )
    node.set(
        "gpus.3.compute_processes", [{"pid": 11345, "name": "./gpu_burn", "used_memory_mib": 15690}]
    )
    uuid = node.state()["gpus"][3]["uuid"]
    assert node.ok("nvidia-smi", *query) == f"{uuid}, 11345\n"
    assert (
        node.ok(
            "nvidia-smi",
            "--query-compute-apps=process_name,used_gpu_memory",
            "--format=csv,noheader",
        )
        == "./gpu_burn, 15690 MiB\n"
    )
    node.ok("gpunode-lab-hw", "reboot")
    assert node.ok("nvidia-smi", *query) == ""


def test_the_gpu_fact_reads_the_doubles_mig_listings(lab_node: Callable[..., LabNode]) -> None:
    node = lab_node("a100")
    mig_on(node, 0, 5)
    node.ok("nvidia-smi", "mig", "-i", "5", "-cgi", "4g.40gb,2g.20gb", "-C")
    node.ok("nvidia-smi", "mig", "-i", "5", "-cgi", "1g.10gb")  # no compute instance
    node.set("gpus.5.compute_processes", [{"pid": 77, "name": "x", "used_memory_mib": 1}])
    env = {
        "PATH": f"{node.path('/usr/bin')}:/usr/bin:/bin",
        STATE_ENV: str(node.state_file),
        SHARE_ENV: str(node.path(DEFAULT_SHARE_DIR)),
    }
    output = subprocess.run(
        ["sh", "-c", GpuDevices().command()], capture_output=True, text=True, env=env, check=True
    ).stdout
    report = GpuDevices().process(output.splitlines())
    assert report["listing_problems"] == {}
    gpus = report["gpus"]
    layout = [
        (i["profile"], i["start"], i["size"], [c["profile"] for c in i["compute_instances"]])
        for i in gpus[5]["gpu_instances"]
    ]
    assert layout == [
        ("4g.40gb", 0, 4, ["4g.40gb"]),
        ("2g.20gb", 4, 2, ["2g.20gb"]),
        ("1g.10gb", 6, 1, []),
    ]
    assert gpus[5]["compute_pids"] == [77]
    assert gpus[0]["gpu_instances"] == [] and gpus[0]["mig_profiles"]["7g.80gb"]["size"] == 8
    assert gpus[1]["mig_profiles"] == {}  # MIG off: nothing listed for it
    assert gpus[5]["mig_profiles"]["1g.10gb"]["free"] == 0


# --- ibstat, nvme ---------------------------------------------------------------------------


def test_ibstat_matches_the_a100_capture_line_for_line(lab_node: Callable[..., LabNode]) -> None:
    captured = (FIXTURES / "ibstat/ibstat.47.0.a100.all.active.0").read_text().splitlines()
    ours = lab_node("a100").ok("ibstat").splitlines()
    assert len(ours) == len(captured)
    for our_line, captured_line in zip(ours, captured, strict=True):
        if "GUID: 0x" in captured_line and not captured_line.endswith("0" * 16):
            # Node-specific: only the low 24 bits (the per-device part) differ.
            assert our_line[:-6] == captured_line[:-6]
            assert our_line != captured_line
        else:
            assert our_line == captured_line


def test_ibstat_shows_one_ca_and_reflects_port_drift(lab_node: Callable[..., LabNode]) -> None:
    node = lab_node("hgx-h100")
    names = node.ok("ibstat", "-l").split()
    assert names == sorted(port["ca"] for port in node.state()["ib_ports"])
    node.set("ib_ports.0.state", "Down")
    node.set("ib_ports.0.physical_state", "Disabled")
    (port,) = parse_ibstat(node.ok("ibstat", "mlx5_0"))
    assert (port["state"], port["physical_state"], port["link_layer"]) == (
        "Down",
        "Disabled",
        "InfiniBand",
    )
    assert node.run("ibstat", "mlx5_99").returncode == 255
    assert lab_node("pcie-a10g").run("ibstat").returncode == 255


def test_nvme_list_json_lists_present_drives(lab_node: Callable[..., LabNode]) -> None:
    node = lab_node("hgx-h100")
    output = node.ok("nvme", "list", "-o", "json")
    assert output.startswith('{\n  "Devices":[\n    {\n      "NameSpace":1,\n')
    devices = json.loads(output)["Devices"]
    assert len(devices) == 8
    assert list(devices[0]) == [
        "NameSpace", "DevicePath", "GenericPath", "Firmware", "ModelNumber", "SerialNumber",
        "UsedBytes", "MaximumLBA", "PhysicalSize", "SectorSize",
    ]  # fmt: skip
    assert devices[0]["MaximumLBA"] * devices[0]["SectorSize"] == devices[0]["PhysicalSize"]
    node.set("nvme.2.present", False)
    listing = json.loads(node.ok("nvme", "list", "-o", "json"))
    paths = [device["DevicePath"] for device in listing["Devices"]]
    assert "/dev/nvme2n1" not in paths
    assert len(paths) == 7


# --- modinfo: the stand-in NVIDIA kernel module ------------------------------------------------


@pytest.mark.parametrize(
    ("flavour", "license_text"), [("open", "Dual MIT/GPL"), ("proprietary", "NVIDIA")]
)
def test_modinfo_answers_for_the_installed_standin_module(
    lab_node: Callable[..., LabNode], flavour: str, license_text: str
) -> None:
    node = lab_node("a100")
    record = node.state_file.parent
    (record / "installed-driver-version").write_text("570.195.03\n")
    (record / "installed-kernel-module-flavour").write_text(f"{flavour}\n")
    assert node.ok("modinfo", "-F", "version", "nvidia") == "570.195.03\n"
    assert node.ok("modinfo", "-F", "license", "nvidia") == f"{license_text}\n"
    listing = node.ok("modinfo", "nvidia")
    assert re.search(r"^version: +570\.195\.03$", listing, re.MULTILINE), listing
    assert node.ok("modinfo", "-F", "vermagic", "nvidia") == "", "an unknown field prints nothing"


def test_modinfo_without_a_standin_driver_finds_no_nvidia_module(
    lab_node: Callable[..., LabNode],
) -> None:
    node = lab_node("a100")
    missing = node.run("modinfo", "-F", "version", "nvidia")
    assert missing.returncode != 0 and missing.stdout == ""
    assert "nvidia" in missing.stderr and "not found" in missing.stderr


def test_modinfo_double_is_shell_and_hands_every_other_call_to_the_real_one(
    tmp_path: Path,
) -> None:
    # The shipped double, with its real modinfo replaced by a script that says it ran and a
    # python3 that fails: the real modinfo is a C program, and so the double starts no Python.
    from lab.hwsim import modinfo

    real, python = tmp_path / "real-modinfo", tmp_path / "python3"
    real.write_text('#!/bin/sh\necho "real $*"\n')
    python.write_text('#!/bin/sh\necho "python started" >&2; exit 99\n')
    double = tmp_path / "modinfo"
    content = node_files("a100", "lab-node-1")["/usr/local/sbin/modinfo"][0].decode()
    assert "python" not in content
    double.write_text(content.replace(" ".join(modinfo.REAL_MODINFO), str(real)))
    for script in (real, python, double):
        script.chmod(0o755)
    record = tmp_path / "state"
    record.mkdir()
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", STATE_ENV: str(record / "hardware.json")}

    def run(*args: str) -> str:
        return subprocess.run(
            [double, *args], capture_output=True, text=True, check=True, env=env
        ).stdout.strip()

    assert run("-n", "ib_umad") == "real -n ib_umad"
    assert run("-F", "version", "ib_ipoib") == "real -F version ib_ipoib"
    assert run("-n", "nvidia") == "real -n nvidia", "a call the double does not answer"
    assert run("-F", "version", "nvidia") == "real -F version nvidia", "no stand-in driver"
    (record / "installed-driver-version").write_text("580.105.08\n")
    assert run("-F", "version", "nvidia") == "580.105.08"
    assert run("-F", "license", "nvidia") == "Dual MIT/GPL"
    (record / "installed-kernel-module-flavour").write_text("proprietary\n")
    assert run("-F", "license", "nvidia") == "NVIDIA"
    assert run("nvidia").splitlines()[1:3] == [
        "version:         580.105.08",
        "license:         NVIDIA",
    ]


# --- replayed answers (hwstate) -----------------------------------------------------------


def _kept(node: LabNode) -> dict[str, list[str]]:
    answers = node.state_file.parent / "answers"
    if not answers.exists():
        return {}
    return {d.name: sorted(f.name for f in d.iterdir()) for d in answers.iterdir()}


def test_a_query_is_replayed_for_the_same_state_only(lab_node: Callable[..., LabNode]) -> None:
    node = lab_node("a100")
    query = ("--query-gpu=index,persistence_mode", "--format=csv,noheader")
    first = node.ok("nvidia-smi", *query)
    kept = _kept(node)
    name = "nvidia_smi+--query-gpu=index,persistence_mode+--format=csv,noheader"
    assert [files for files in kept.values()] == [[name]]
    (directory,) = kept
    # What the wrapper prints now is the kept file's: Python does not run.
    answer = node.state_file.parent / "answers" / directory / name
    answer.write_text("replayed\n")
    assert node.ok("nvidia-smi", *query) == "replayed\n"
    # Another state: answered afresh, and the other state's answers are gone.
    saved = node.state_file.read_bytes()
    node.set("gpus.0.persistence_mode", "Disabled" if "Enabled" in first else "Enabled")
    changed = node.ok("nvidia-smi", *query)
    assert changed != first and changed != "replayed\n"
    assert directory not in _kept(node)
    # The first state written back as it was (as tests restore a saved copy): its answer.
    node.state_file.write_bytes(saved)
    assert node.ok("nvidia-smi", *query) == first


def test_settings_clock_readings_and_failures_are_never_replayed(
    lab_node: Callable[..., LabNode],
) -> None:
    node = lab_node("a100")
    node.ok("nvidia-smi", "-pm", "1")
    node.ok("nvidia-smi", "--query-gpu=timestamp,index", "--format=csv,noheader")
    assert node.run("nvidia-smi", "-q", "-d", "PERFORMANCE").returncode != 0
    assert node.run("ibstat", "-p").returncode != 0
    assert _kept(node) == {}
    node.ok("ibstat")  # while a plain query of the same state is kept
    assert [files for files in _kept(node).values()] == [["ibstat"]]


def test_xml_report_is_replayed_with_the_time_of_the_replay(
    lab_node: Callable[..., LabNode],
) -> None:
    node = lab_node("hgx-h100")
    first = node.ok("nvidia-smi", "-q", "-x")
    assert [files for files in _kept(node).values()] == [["nvidia_smi+-q+-x.asctime"]]
    replayed = node.ok("nvidia-smi", "-q", "-x")
    assert "@@" not in first + replayed
    stamp = re.compile(r"<timestamp>(.*)</timestamp>")
    assert stamp.sub("", first) == stamp.sub("", replayed)
    for output in (first, replayed):
        found = stamp.search(output)
        assert found and re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}", found[1])
    assert len(xml_gpus(replayed)) == 8


def test_a_lab_nodes_kernel_lists_the_nvidia_module_as_depmod_would() -> None:
    # Container Toolkit 1.18's nvidia-cdi-refresh.service runs only where modules.dep lists
    # nvidia.ko (its ExecCondition greps for it); the simulated GPUs' driver is loaded.
    import os
    import re

    files = node_files("a100", "lab-node-1")
    content, mode = files[f"/lib/modules/{os.uname().release}/modules.dep"]
    assert re.search(rb"/(nvidia|nvidia-current)\.ko", content)
    assert mode == 0o644


def test_the_simulated_boot_starts_gpunodes_gpu_settings_unit_before_slurmd() -> None:
    from lab.hwsim.hwctl import BOOT_UNITS
    from roles.gpu_settings import BOOT_UNIT, BOOT_UNIT_TEXT

    assert BOOT_UNITS == (BOOT_UNIT, "slurmd.service")
    # The order comes from the unit itself (one systemd transaction starts both).
    assert "Before=slurmd.service" in BOOT_UNIT_TEXT.splitlines()

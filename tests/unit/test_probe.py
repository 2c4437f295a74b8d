"""The node-side probe: its sources (NVML, nvidia-smi), node checks, and the shipped command.

``FakeNode`` answers ``nvidia-smi`` with the lab's hardware double (``lab.hwsim``,
in-process) and everything else from canned output; ``FakeNvml`` answers NVML calls from
the same simulated hardware, with pynvml's own constants, error classes and structures.
The last tests pipe the real fact command through ``sh`` with the lab double on PATH.
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import importlib
import io
import json
import os
import shutil
import subprocess
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from contextlib import redirect_stdout
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from gpunode import framing
from gpunode.probe import gpu_probe
from gpunode.probe.gpu_probe import Completed, System, collect
from gpunode.probe.gpu_record import recovery_action_value
from gpunode.probe.parsers import (
    installed_probe_files,
    parse_section,
    probe_command,
    probe_part,
)
from lab.hwsim import COMMANDS, NODE_LIBRARY, node_files, nvidia_smi, profiles
from lab.hwsim.hwstate import DEFAULT_SHARE_DIR, DEFAULT_STATE_PATH, SHARE_ENV, STATE_ENV

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)  # noqa: UP017
# Layouts of /proc/driver/nvidia/version written by the proprietary and the open module.
PROPRIETARY_MODULE = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03  Tue Jun  6 22:20:39 UTC 2023\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n"
)
OPEN_MODULE = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.48.01  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Mon Dec  1 01:25:25 UTC 2025\n"
    "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) \n"
)
XID_LINE = (
    "2026-11-30T11:59:00+0000 node-a kernel: NVRM: Xid (PCI:0000:2a:00): 79, pid=1234, "
    "name=python, GPU has fallen off the bus."
)
NOT_FOUND_UNIT = "LoadState=not-found\nActiveState=inactive\nSubState=dead\nUnitFileState=\n"


@pytest.fixture(autouse=True)
def share_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Templates of the lab's nvidia-smi double, for rendering its XML in-process."""
    directory = tmp_path_factory.mktemp("share")
    for template in node_files("pcie-a10g", "x"):
        if template.startswith(DEFAULT_SHARE_DIR):
            source = next(FIXTURES.rglob(Path(template).name))
            (directory / source.name).write_bytes(source.read_bytes())
    monkeypatch.setenv(SHARE_ENV, str(directory))
    return directory


class FakeNode(System):
    """A node whose nvidia-smi is the lab double of ``state`` (None: not installed)."""

    def __init__(
        self,
        state: dict[str, Any] | None,
        files: dict[str, str] | None = None,
        commands: dict[str, Completed | Callable[[list[str]], Completed]] | None = None,
    ) -> None:
        self.state = state
        self.files = files or {}
        self.commands: dict[str, Completed | Callable[[list[str]], Completed]] = {
            "journalctl": Completed(0, "", ""),
            "dpkg-query": Completed(1, "", "dpkg-query: no packages found matching nvidia*"),
            "systemctl": Completed(0, NOT_FOUND_UNIT, ""),
            **(commands or {}),
        }
        self.calls: list[list[str]] = []

    def run(self, argv: list[str], timeout: float = 60.0) -> Completed:
        self.calls.append(argv)
        if argv[0] in self.commands:
            answer = self.commands[argv[0]]
            return answer(argv) if callable(answer) else answer
        if argv[0] == "nvidia-smi" and self.state is not None:
            if not self.state["driver_loaded"]:
                return Completed(9, nvidia_smi.DRIVER_NOT_LOADED, "")
            try:
                return Completed(0, nvidia_smi.run(argv[1:], copy.deepcopy(self.state)), "")
            except nvidia_smi.Failure as failure:
                return Completed(failure.exit_code, failure.output, "")
        return Completed(None, "", f"{argv[0]}: not found", missing=True)

    def read(self, path: str) -> str | None:
        return self.files.get(path)

    def now(self) -> datetime:
        return NOW


def real_pynvml() -> types.ModuleType:
    with warnings.catch_warnings():  # the pynvml PyPI package warns that it is deprecated
        warnings.simplefilter("ignore", FutureWarning)
        return importlib.import_module("pynvml")


class FakeNvml(types.SimpleNamespace):
    """NVML over simulated hardware: pynvml's constants, errors and structures, fake calls."""

    def __init__(self, state: dict[str, Any], init_error: int | None = None) -> None:
        pynvml = real_pynvml()
        names = [
            name for name in vars(pynvml) if name.startswith(("NVML", "c_nvml", "nvmlMemory_v"))
        ]
        super().__init__(**{name: getattr(pynvml, name) for name in names})
        self.gpus = [gpu for gpu in state["gpus"] if gpu["present"]]
        self.state = state
        self.init_error = init_error
        self.shut_down = False

    def fail(self, code: int) -> Exception:
        return self.NVMLError(code)

    def not_supported(self) -> Exception:
        return self.fail(self.NVML_ERROR_NOT_SUPPORTED)

    # library
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.fail(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self.state["driver_version"])

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        major, minor = self.state["cuda_version"].split(".")
        return int(major) * 1000 + int(minor) * 10

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        return self.gpus[index]

    # identity
    def nvmlDeviceGetName(self, gpu: dict[str, Any]) -> str:
        return str(gpu["name"])

    def nvmlDeviceGetUUID(self, gpu: dict[str, Any]) -> str:
        return str(gpu["uuid"])

    def nvmlDeviceGetSerial(self, gpu: dict[str, Any]) -> bytes:
        return str(gpu["serial"]).encode()

    def nvmlDeviceGetPciInfo(self, gpu: dict[str, Any]) -> Any:
        return types.SimpleNamespace(busId=gpu["pci_bus_id"].encode())

    def nvmlDeviceGetVbiosVersion(self, gpu: dict[str, Any]) -> str:
        return str(gpu["vbios_version"])

    def nvmlDeviceGetMinorNumber(self, gpu: dict[str, Any]) -> int:
        return int(gpu["minor_number"])

    def nvmlDeviceGetModuleId(self, gpu: dict[str, Any]) -> int:
        return int(gpu["module_id"])

    # modes
    def _mode(self, text: str) -> int:
        if text == "N/A":
            raise self.not_supported()
        return int(text == "Enabled")

    def nvmlDeviceGetPersistenceMode(self, gpu: dict[str, Any]) -> int:
        return self._mode(gpu["persistence_mode"])

    def nvmlDeviceGetPerformanceState(self, gpu: dict[str, Any]) -> int:
        return int(gpu["performance_state"].removeprefix("P"))

    def nvmlDeviceGetEccMode(self, gpu: dict[str, Any]) -> list[int]:
        return [self._mode(gpu["ecc_mode"]["current"]), self._mode(gpu["ecc_mode"]["pending"])]

    def nvmlDeviceGetMigMode(self, gpu: dict[str, Any]) -> list[int]:
        return [self._mode(gpu["mig_mode"]["current"]), self._mode(gpu["mig_mode"]["pending"])]

    # errors
    def nvmlDeviceGetTotalEccErrors(self, gpu: dict[str, Any], kind: int, counter: int) -> int:
        scope = gpu["ecc_errors"]["volatile" if counter == self.NVML_VOLATILE_ECC else "aggregate"]
        word = "correctable" if kind == self.NVML_MEMORY_ERROR_TYPE_CORRECTED else "uncorrectable"
        return int(scope[f"sram_{word}"] + scope[f"dram_{word}"])

    def nvmlDeviceGetMemoryErrorCounter(
        self, gpu: dict[str, Any], kind: int, counter: int, location: int
    ) -> int:
        scope = gpu["ecc_errors"]["volatile" if counter == self.NVML_VOLATILE_ECC else "aggregate"]
        word = "correctable" if kind == self.NVML_MEMORY_ERROR_TYPE_CORRECTED else "uncorrectable"
        memory = "sram" if location == self.NVML_MEMORY_LOCATION_SRAM else "dram"
        return int(scope[f"{memory}_{word}"])

    def nvmlDeviceGetSramEccErrorStatus(self, gpu: dict[str, Any], status: Any) -> int:
        if self.state["smi_generation"] != "r590":  # older drivers have no such call
            raise self.fail(self.NVML_ERROR_FUNCTION_NOT_FOUND)
        status.bThresholdExceeded = 0  # the simulated XML's <sram_threshold_exceeded>No
        return 0

    def nvmlDeviceGetRetiredPages(self, gpu: dict[str, Any], cause: int) -> list[int]:
        raise self.not_supported()  # Ampere and later remap rows instead

    def nvmlDeviceGetRetiredPagesPendingStatus(self, gpu: dict[str, Any]) -> int:
        raise self.not_supported()

    def nvmlDeviceGetRemappedRows(self, gpu: dict[str, Any]) -> tuple[int, int, int, int]:
        rows = gpu["remapped_rows"]
        return (
            rows["correctable"],
            rows["uncorrectable"],
            int(rows["pending"] == "Yes"),
            int(rows["failure"] == "Yes"),
        )

    # sensors, power, clocks
    def nvmlDeviceGetTemperature(self, gpu: dict[str, Any], sensor: int) -> int:
        return int(gpu["temperature"]["gpu"])

    def nvmlDeviceGetFieldValues(self, gpu: dict[str, Any], fields: list[int]) -> Any:
        values = (self.c_nvmlFieldValue_t * len(fields))()
        if fields == [self.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]:
            # Driver 590 reports one (the XML's <gpu_recovery_action>), older ones do not.
            supported = self.state["smi_generation"] == "r590"
            values[0].nvmlReturn = 0 if supported else self.NVML_ERROR_NOT_SUPPORTED
            values[0].value.uiVal = recovery_action_value(gpu["recovery_action"]) or 0
            return values
        memory = gpu["temperature"]["memory"]
        values[0].nvmlReturn = self.NVML_ERROR_NOT_SUPPORTED if memory is None else 0
        values[0].value.uiVal = memory or 0
        return values

    def _milliwatts(self, gpu: dict[str, Any], key: str) -> int:
        return round(gpu["power"][key] * 1000)

    def nvmlDeviceGetPowerUsage(self, gpu: dict[str, Any]) -> int:
        return self._milliwatts(gpu, "draw")

    def nvmlDeviceGetEnforcedPowerLimit(self, gpu: dict[str, Any]) -> int:
        return self._milliwatts(gpu, "limit")

    def nvmlDeviceGetPowerManagementDefaultLimit(self, gpu: dict[str, Any]) -> int:
        return self._milliwatts(gpu, "default_limit")

    def nvmlDeviceGetPowerManagementLimitConstraints(self, gpu: dict[str, Any]) -> list[int]:
        return [self._milliwatts(gpu, "min_limit"), self._milliwatts(gpu, "max_limit")]

    def _clock(self, clocks: dict[str, int], kind: int) -> int:
        names = {
            self.NVML_CLOCK_GRAPHICS: "graphics",
            self.NVML_CLOCK_SM: "sm",
            self.NVML_CLOCK_MEM: "memory",
            self.NVML_CLOCK_VIDEO: "video",
        }
        return clocks[names[kind]]

    def nvmlDeviceGetClockInfo(self, gpu: dict[str, Any], kind: int) -> int:
        return self._clock(gpu["clocks"], kind)

    def nvmlDeviceGetMaxClockInfo(self, gpu: dict[str, Any], kind: int) -> int:
        return self._clock(gpu["max_clocks"], kind)

    def nvmlDeviceGetApplicationsClock(self, gpu: dict[str, Any], kind: int) -> int:
        if gpu["applications_clocks"] is None:  # deprecated (driver 590 on Hopper)
            raise self.not_supported()
        return self._clock(gpu["applications_clocks"], kind)

    def nvmlDeviceGetSupportedMemoryClocks(self, gpu: dict[str, Any]) -> list[int]:
        return [entry["memory"] for entry in gpu["supported_clocks"]]

    def nvmlDeviceGetSupportedGraphicsClocks(self, gpu: dict[str, Any], memory: int) -> list[int]:
        (entry,) = (entry for entry in gpu["supported_clocks"] if entry["memory"] == memory)
        return list(range(entry["graphics_max"], entry["graphics_min"] - 1, -15))

    def nvmlDeviceGetCurrentClocksEventReasons(self, gpu: dict[str, Any]) -> int:
        return sum(
            nvidia_smi.REASON_BITS[name] for name, on in gpu["clocks_event_reasons"].items() if on
        )

    # utilisation and memory
    def nvmlDeviceGetUtilizationRates(self, gpu: dict[str, Any]) -> Any:
        if gpu["mig_mode"]["current"] == "Enabled":  # per instance only, as on a real GPU
            raise self.not_supported()
        return self.c_nvmlUtilization_t(gpu=0, memory=0)

    def nvmlDeviceGetMemoryInfo(self, gpu: dict[str, Any], version: int | None = None) -> Any:
        memory, mib = gpu["memory"], 1024 * 1024
        if version is None:  # v1: the reserved part counts as used
            used = memory["reserved_mib"] + memory["used_mib"]
            return self.c_nvmlMemory_t(total=memory["total_mib"] * mib, used=used * mib)
        return self.c_nvmlMemory_v2_t(
            version=version,
            total=memory["total_mib"] * mib,
            reserved=memory["reserved_mib"] * mib,
            used=memory["used_mib"] * mib,
        )

    # links and fabric
    def nvmlDeviceGetCurrPcieLinkGeneration(self, gpu: dict[str, Any]) -> int:
        return int(gpu["pcie"]["gen_current"])

    def nvmlDeviceGetMaxPcieLinkGeneration(self, gpu: dict[str, Any]) -> int:
        return int(gpu["pcie"]["gen_max"])

    def nvmlDeviceGetCurrPcieLinkWidth(self, gpu: dict[str, Any]) -> int:
        return int(gpu["pcie"]["width_current"])

    def nvmlDeviceGetMaxPcieLinkWidth(self, gpu: dict[str, Any]) -> int:
        return int(gpu["pcie"]["width_max"])

    def nvmlDeviceGetNvLinkState(self, gpu: dict[str, Any], link: int) -> int:
        if link >= len(gpu["nvlinks"]):
            raise self.fail(self.NVML_ERROR_INVALID_ARGUMENT)
        return int(gpu["nvlinks"][link]["active"])

    def nvmlDeviceGetGpuFabricInfo(self, gpu: dict[str, Any], reference: Any) -> int:
        if gpu["fabric"] is None:
            raise self.not_supported()
        states = {"Not Started": 1, "In Progress": 2, "Completed": 3}
        reference._obj.state = states[gpu["fabric"]["state"]]
        reference._obj.status = 0 if gpu["fabric"]["status"] == "Success" else 1
        return 0


def hardware(profile: str = "hgx-h100") -> dict[str, Any]:
    return profiles.initial_state(profile, "node-a")


def without_link_details(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """NVML has link states but no per-link speed, and no words for missing application
    clocks (only "not supported"); everything else must agree."""
    trimmed = copy.deepcopy(gpus)
    for gpu in trimmed:
        gpu.pop("application_clocks_note")
        # The double models no temperature thresholds: its XML's come from the template's board.
        gpu.pop("temperature_slowdown_c")
        gpu.pop("temperature_tlimit_c")
        gpu["nvlink"].pop("source")
        for link in gpu["nvlink"]["links"]:
            link.pop("speed_gbps")
    return trimmed


# --- sources ----------------------------------------------------------------------------------


def test_nvidia_smi_fallback_reads_the_lab_hgx_h100() -> None:
    node = FakeNode(hardware())
    report = collect(node, None, "not shipped", None)
    assert (report["state"], report["source"], report["gpu_count"]) == ("ok", "nvidia-smi", 8)
    assert (report["driver_version"], report["cuda_driver_version"]) == ("590.48.01", "13.1")
    assert {gpu["name"] for gpu in report["gpus"]} == {"NVIDIA H100 80GB HBM3"}
    assert [gpu["nvlink"]["active"] for gpu in report["gpus"]] == [18] * 8
    assert {gpu["nvlink"]["source"] for gpu in report["gpus"]} == {"nvidia-smi nvlink -s"}
    assert report["nvml"] == {"state": "unavailable", "reason": "not shipped"}
    # nvidia-smi -q -x once and nvlink -s once for all GPUs; never --query-gpu.
    smi_calls = [call for call in node.calls if call[0] == "nvidia-smi"]
    assert smi_calls == [
        ["nvidia-smi", "-q", "-x"],
        ["nvidia-smi", "nvlink", "-s"],
        ["nvidia-smi", "nvlink", "-e"],
    ]


@pytest.mark.parametrize("profile", ["hgx-h100", "a100", "pcie-a10g"])
def test_nvml_and_nvidia_smi_report_the_same_gpus(profile: str) -> None:
    state = hardware(profile)
    state["gpus"][0]["persistence_mode"] = "Enabled"
    state["gpus"][0]["remapped_rows"].update(correctable=4, pending="Yes")
    state["gpus"][0]["ecc_errors"]["aggregate"].update(dram_uncorrectable=2)
    state["gpus"][0]["clocks_event_reasons"].update(gpu_idle=False, hw_slowdown=True)
    if len(state["gpus"][0]["nvlinks"]) > 1:
        state["gpus"][0]["nvlinks"][1]["active"] = False
    nvml = FakeNvml(state)
    through_nvml = collect(FakeNode(state), nvml, "fake", None)
    through_smi = collect(FakeNode(state), None, "not shipped", None)
    assert through_nvml["source"] == "nvml" and through_smi["source"] == "nvidia-smi"
    assert through_nvml["nvml"] == {"state": "ok", "module": "fake"}
    assert nvml.shut_down
    assert without_link_details(through_nvml["gpus"]) == without_link_details(through_smi["gpus"])
    for key in ("driver_version", "cuda_driver_version", "gpu_count", "attached_gpus"):
        assert through_nvml[key] == through_smi[key]
    first = through_nvml["gpus"][0]
    assert first["persistence_mode"] is True
    assert first["remapped_rows"]["pending"] is True
    assert first["ecc_errors"]["aggregate"]["uncorrected"] == 2
    assert first["clock_event_reasons"] == ["hw_slowdown"]


def test_nvml_without_the_library_falls_back_to_nvidia_smi() -> None:
    state = hardware()
    nvml = FakeNvml(state, init_error=FakeNvml(state).NVML_ERROR_LIBRARY_NOT_FOUND)
    report = collect(FakeNode(state), nvml, "pynvml.py (shipped)", None)
    assert (report["state"], report["source"]) == ("ok", "nvidia-smi")
    assert report["nvml"]["reason"] == "NVML Shared Library Not Found"


def test_driver_not_loaded() -> None:
    state = hardware()
    state["driver_loaded"] = False
    nvml = FakeNvml(state, init_error=FakeNvml(state).NVML_ERROR_DRIVER_NOT_LOADED)
    report = collect(FakeNode(state), nvml, "fake", None)
    assert report["state"] == "driver_not_loaded"
    assert "exit code 9: NVIDIA driver is not loaded" in report["reason"]
    assert (report["gpus"], report["gpu_count"]) == ([], None)
    assert report["kernel_module"]["state"] == "not_loaded"


def test_no_nvidia_smi_and_no_nvml_is_absent() -> None:
    report = collect(FakeNode(None), None, "not shipped", None)
    assert (report["state"], report["reason"]) == ("absent", "nvidia-smi is not installed")
    assert report["kernel_module"]["state"] == "not_loaded"


def test_hung_nvidia_smi_is_unreadable() -> None:
    node = FakeNode(None, commands={"nvidia-smi": Completed(None, "", "timed out")})
    report = collect(node, None, "not shipped", None)
    assert (report["state"], report["reason"]) == ("unreadable", "timed out (a GPU may be hung)")


def test_gpu_that_fell_off_the_bus_is_missing_and_links_follow_uuids() -> None:
    state = hardware()
    state["gpus"][3]["present"] = False
    state["gpus"][5]["nvlinks"][0]["active"] = False
    report = collect(FakeNode(state), None, "not shipped", None)
    assert report["gpu_count"] == 7 and report["attached_gpus"] == 7
    assert state["gpus"][3]["uuid"] not in {gpu["uuid"] for gpu in report["gpus"]}
    # nvidia-smi renumbers after the gap: GPU 5 of the state is index 4 now.
    renumbered = report["gpus"][4]
    assert renumbered["uuid"] == state["gpus"][5]["uuid"]
    assert (renumbered["nvlink"]["active"], renumbered["nvlink"]["total"]) == (17, 18)


def test_nvlink_status_failure_is_reported_per_gpu() -> None:
    failing = Completed(2, "", "nvidia-smi: not simulated")
    node = FakeNode(hardware())

    def smi(argv: list[str]) -> Completed:
        if argv[1:] == ["nvlink", "-s"]:
            return failing
        node.commands.pop("nvidia-smi")
        try:
            return node.run(argv)
        finally:
            node.commands["nvidia-smi"] = smi

    node.commands["nvidia-smi"] = smi
    report = collect(node, None, "not shipped", None)
    links = report["gpus"][0]["nvlink"]
    assert links["state"] == "unreadable"
    assert links["reason"].startswith("exit code 2: invalid argument")


# --- kernel module, packages, versions --------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "version", "flavor"),
    [(PROPRIETARY_MODULE, "535.54.03", "proprietary"), (OPEN_MODULE, "590.48.01", "open")],
)
def test_loaded_module_version_and_flavor(text: str, version: str, flavor: str) -> None:
    report = collect(FakeNode(hardware(), {gpu_probe.MODULE_VERSION_PATH: text}), None, "-", None)
    module = report["kernel_module"]
    assert (module["state"], module["version"], module["flavor"]) == ("loaded", version, flavor)


def test_lab_node_module_state_is_unknown_not_a_guess() -> None:
    module = collect(FakeNode(hardware()), None, "-", None)["kernel_module"]
    assert (module["state"], module["version"]) == ("unknown", None)
    assert "/proc/driver/nvidia/version is absent" in module["reason"]


def test_kernel_module_older_than_userspace_is_a_mismatch() -> None:
    files = {gpu_probe.MODULE_VERSION_PATH: PROPRIETARY_MODULE}  # 535 module, 590 userspace
    versions = collect(FakeNode(hardware(), files), None, "-", None)["driver_versions"]
    assert (versions["kernel_module"], versions["userspace"]) == ("535.54.03", "590.48.01")
    assert versions["mismatch"] is True
    assert versions["reason"] == "versions differ: 535.54.03, 590.48.01"


def test_installed_packages_agreeing_with_the_driver() -> None:
    dpkg = (
        "nvidia-driver-590-open\t590.48.01-0ubuntu1\tii \n"
        "libnvidia-compute-590\t590.48.01-0ubuntu1\tii \n"
        "nvidia-driver-535\t535.54.03-1\trc \n"  # removed, configuration left: not installed
        "nvidia-driver-assistant\t0.21.57.08-1\tii \n"  # not a driver version
    )
    node = FakeNode(
        hardware(),
        {gpu_probe.MODULE_VERSION_PATH: OPEN_MODULE},
        {"dpkg-query": Completed(0, dpkg, "")},
    )
    versions = collect(node, None, "-", None)["driver_versions"]
    assert versions["installed_packages"] == {
        "nvidia-driver-590-open": "590.48.01",
        "libnvidia-compute-590": "590.48.01",
    }
    assert (versions["installed_package"], versions["installed_package_source"]) == (
        "590.48.01",
        "dpkg",
    )
    assert (versions["mismatch"], versions["reason"]) == (False, "")


def test_installed_package_other_than_the_answering_driver_is_a_mismatch() -> None:
    dpkg = "nvidia-kernel-open-dkms\t580.95.05-1\tii \n"
    node = FakeNode(hardware(), {}, {"dpkg-query": Completed(0, dpkg, "")})
    versions = collect(node, None, "-", None)["driver_versions"]
    assert versions["installed_package"] == "580.95.05"
    assert versions["installed_package_source"] == "dpkg"
    assert versions["mismatch"] is True  # 590.48.01 answers, 580.95.05 is installed


def test_one_known_version_cannot_mismatch() -> None:
    versions = collect(FakeNode(hardware()), None, "-", None)["driver_versions"]
    assert (versions["userspace"], versions["mismatch"]) == ("590.48.01", None)


def test_driver_library_mismatch_reported_by_the_driver() -> None:
    state = hardware()
    mismatch = (
        "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 590.48\n"
    )
    nvml = FakeNvml(state, init_error=FakeNvml(state).NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    node = FakeNode(state, commands={"nvidia-smi": Completed(18, mismatch, "")})
    report = collect(node, nvml, "fake", None)
    assert report["state"] == "unreadable"
    assert report["driver_versions"]["mismatch"] is True
    assert report["driver_versions"]["userspace"] == "590.48"


# --- fabric manager, XIDs ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "state"),
    [
        (Completed(0, NOT_FOUND_UNIT, ""), "not_installed"),
        (Completed(0, "LoadState=loaded\nActiveState=active\nSubState=running\n", ""), "active"),
        (Completed(0, "LoadState=loaded\nActiveState=failed\nSubState=failed\n", ""), "failed"),
        (Completed(1, "", "Failed to connect to bus"), "unknown"),
        (Completed(None, "", "systemctl: not found", missing=True), "unknown"),
    ],
)
def test_fabric_manager_state(answer: Completed, state: str) -> None:
    report = collect(FakeNode(hardware(), commands={"systemctl": answer}), None, "-", None)
    assert report["fabric_manager"]["state"] == state


def test_xid_events_since_a_time_name_their_gpu() -> None:
    node = FakeNode(hardware(), commands={"journalctl": Completed(0, XID_LINE + "\n", "")})
    since = datetime(2026, 11, 30, 10, 0, 0, tzinfo=timezone.utc)  # noqa: UP017
    xids = collect(node, None, "-", since)["xid_events"]
    (event,) = xids["events"]
    assert (event["xid"], event["pci"], event["gpu_index"]) == (79, "0000:2a:00", 1)
    assert event["message"] == "GPU has fallen off the bus."
    assert xids["since"] == "2026-11-30T10:00:00+00:00"
    (journal,) = [call for call in node.calls if call[0] == "journalctl"]
    assert journal[journal.index("--since") + 1] == "2026-11-30 10:00:00 UTC"
    assert journal[journal.index("-t") + 1] == "kernel"


def test_xid_window_defaults_to_the_last_day() -> None:
    xids = collect(FakeNode(hardware()), None, "-", None)["xid_events"]
    assert (xids["state"], xids["since"], xids["events"]) == ("ok", "2026-11-29T12:00:00+00:00", [])


def test_journal_readable_only_in_part_is_unreadable() -> None:
    hint = "Hint: You are currently not seeing messages from other users and the system.\n"
    node = FakeNode(hardware(), commands={"journalctl": Completed(0, "", hint)})
    xids = collect(node, None, "-", None)["xid_events"]
    assert xids["state"] == "unreadable" and "run as root" in xids["reason"]


# --- the program --------------------------------------------------------------------------------


def test_main_prints_one_json_document_even_when_the_probe_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: Any) -> dict[str, Any]:
        raise RuntimeError("boom")

    monkeypatch.setattr(gpu_probe, "collect", broken)
    output = io.StringIO()
    with redirect_stdout(output):
        assert gpu_probe.main(["--no-nvml"]) == 0
    report = json.loads(output.getvalue())
    assert report["state"] == "unreadable"
    assert report["reason"] == "probe error: RuntimeError('boom')"


def test_probe_command_fits_in_one_argument_and_validates_its_time() -> None:
    # Linux caps one argument (the command sshd hands to the shell) at 128 KiB.
    assert len(probe_command()) < 100_000
    # With the MIG listing reader, the Python form's installed-copy check, the frame's
    # runner (its systemd and dpkg readers), the SXid and temperature thresholds' readers, and
    # the NVLink error counters' reader.
    assert len(probe_command(ship_pynvml=False)) < 44_000
    with pytest.raises(ValueError):
        probe_command(xid_since="yesterday; rm -rf /")
    since = probe_part(xid_since="2026-11-30T10:00:00Z")
    assert since.command.endswith(" --xid-since 2026-11-30T10:00:00Z; fi")  # without python3
    assert "arguments = ('--xid-since', '2026-11-30T10:00:00Z')" in str(since.python)


@pytest.fixture
def lab_root(tmp_path: Path) -> Iterator[Path]:
    """An hgx-h100 node's doubles under ``tmp_path``; ``bin`` holds what PATH should find."""
    library = tmp_path / NODE_LIBRARY.lstrip("/")
    state_path = tmp_path / DEFAULT_STATE_PATH.lstrip("/")
    share = tmp_path / DEFAULT_SHARE_DIR.lstrip("/")
    for path, (content, _mode) in node_files("hgx-h100", "node-a").items():
        if path not in COMMANDS:
            target = tmp_path / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "nvidia-smi": (
            f"exec env PYTHONPATH={library} {STATE_ENV}={state_path} {SHARE_ENV}={share} "
            f'{sys.executable} -P -m gpunode_lab_hw.nvidia_smi "$@"'
        ),
        "journalctl": f"echo '{XID_LINE}'",
        "systemctl": "printf 'LoadState=loaded\\nActiveState=active\\nSubState=running\\n'",
        "dpkg-query": "printf 'nvidia-driver-590\\t590.48.01-1\\tii \\n'",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    yield tmp_path


def run_command(command: str, root: Path) -> list[str]:
    # As on a node: the system python3, not this virtualenv's (which has pynvml installed).
    system_path = [p for p in os.environ["PATH"].split(":") if not p.startswith(sys.prefix)]
    environment = {**os.environ, "PATH": ":".join([str(root / "bin"), *system_path])}
    environment.pop("VIRTUAL_ENV", None)
    done = subprocess.run(
        ["sh", "-c", command],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=True,
    )
    assert done.stderr == ""
    return done.stdout.splitlines()


def test_the_fact_command_runs_the_shipped_probe_with_pynvml(lab_root: Path) -> None:
    """The exact command GpuReport sends, against the lab's nvidia-smi double."""
    lines = run_command(probe_command(xid_since="2026-11-30T00:00:00Z"), lab_root)
    report = parse_section("gpu", lines)
    assert (report["state"], report["source"], report["gpu_count"]) == ("ok", "nvidia-smi", 8)
    assert [gpu["nvlink"]["active"] for gpu in report["gpus"]] == [18] * 8
    # pynvml travelled with the probe and ran: this machine has no libnvidia-ml.so.1.
    assert report["nvml"] == {
        "state": "unavailable",
        "module": "pynvml.py (shipped)",
        "reason": "NVML Shared Library Not Found",
    }
    assert report["fabric_manager"]["state"] == "active"
    assert report["driver_versions"]["installed_package"] == "590.48.01"
    assert report["driver_versions"]["mismatch"] is False
    (event,) = report["xid_events"]["events"]
    assert (event["xid"], event["gpu_index"]) == (79, 1)


def test_the_fact_command_without_python_is_absent(lab_root: Path) -> None:
    command = probe_command(ship_pynvml=False).replace("python3", "no-such-python3")
    report = parse_section("gpu", run_command(command, lab_root))
    assert (report["state"], report["reason"]) == ("absent", "no-such-python3 is not installed")


def test_the_fact_command_on_a_node_whose_driver_is_not_loaded(lab_root: Path) -> None:
    state_path = lab_root / DEFAULT_STATE_PATH.lstrip("/")
    state = json.loads(state_path.read_text())
    state["driver_loaded"] = False
    state_path.write_text(json.dumps(state))
    report = parse_section("gpu", run_command(probe_command(ship_pynvml=False), lab_root))
    assert report["state"] == "driver_not_loaded"
    assert report["kernel_module"]["state"] == "not_loaded"
    # No NVML library on this machine: pynvml is not even imported (see load_pynvml).
    assert report["nvml"]["reason"].startswith("libnvidia-ml.so.1 cannot be loaded (")


def test_fabric_info_structure_is_the_real_one() -> None:
    """The NVML fabric call fills pynvml's own ctypes structure through a reference."""
    nvml = FakeNvml(hardware())
    info = nvml.c_nvmlGpuFabricInfo_t()
    nvml.nvmlDeviceGetGpuFabricInfo(nvml.gpus[0], ctypes.byref(info))
    assert (info.state, info.status) == (3, 0)


def test_the_probe_installed_as_roles_gpu_metrics_lays_it_out_runs(
    lab_root: Path, tmp_path: Path
) -> None:
    """The probe's files side by side (gpu_record.py and textfile.py beside gpu_probe.py), run
    as the metrics unit runs them; its output is clean for promtool."""
    from roles.gpu_metrics import METRICS_FILE, probe_arguments

    from .prometheus_tools import check_metrics

    installed = tmp_path / "gpunode-probe"
    installed.mkdir()
    for name, source in installed_probe_files(ship_pynvml=False).items():
        (installed / name).write_text(source.read_text(encoding="utf-8"))
    metrics = tmp_path / METRICS_FILE
    arguments = probe_arguments(str(metrics), expected_gpus=8, expected_nvlinks=18)
    run_command(f"cd / && python3 -I {installed}/gpu_probe.py --no-nvml {arguments}", lab_root)
    text = metrics.read_text(encoding="utf-8")
    assert 'gpunode_gpu_probe_ok{state="ok"} 1' in text
    assert "gpunode_gpus 8" in text
    assert "gpunode_gpus_expected 8" in text
    assert "gpunode_gpu_nvlink_links_expected 18" in text
    checked = check_metrics(text)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def answer_nvlink_status(node: FakeNode, answer: Completed) -> None:
    """``nvidia-smi nvlink -s`` on ``node`` answers ``answer``; every other call is the double's."""

    def smi(argv: list[str]) -> Completed:
        if argv[1:] == ["nvlink", "-s"]:
            return answer
        node.commands.pop("nvidia-smi")
        try:
            return node.run(argv)
        finally:
            node.commands["nvidia-smi"] = smi

    node.commands["nvidia-smi"] = smi


def test_nvlink_status_cut_short_by_an_error_keeps_the_gpus_it_listed() -> None:
    """Partial output, then an error and a non-zero exit: listed GPUs keep their links."""
    node = FakeNode(hardware())
    first_gpu = node.run(["nvidia-smi", "nvlink", "-s"]).stdout.split("GPU 1:")[0]

    answer_nvlink_status(
        node, Completed(15, first_gpu, "Unable to determine the device handle for GPU1")
    )
    report = collect(node, None, "not shipped", None)
    kept, lost = report["gpus"][0]["nvlink"], report["gpus"][1]["nvlink"]
    assert (kept["state"], kept["active"], kept["total"]) == ("ok", 18, 18)
    assert lost["state"] == "unreadable"
    assert lost["reason"].startswith(f"{report['gpus'][1]['uuid']} is missing from the output")
    assert "exit code 15" in lost["reason"]


def test_nvlink_lines_not_read_reach_the_report_before_the_first_gpu_too() -> None:
    """What nvidia-smi prints that the parser does not know is named in the report's
    ``problems``, the line before any GPU included; the GPUs keep their links."""
    node = FakeNode(hardware())
    listing = node.run(["nvidia-smi", "nvlink", "-s"]).stdout
    lines = listing.splitlines()
    second = next(n for n, line in enumerate(lines) if line.startswith("GPU 1:"))
    lines.insert(second + 1, "\t Link 0: 26.562 GB/s, degraded")
    text = "WARNING: infoROM is corrupted at gpu 0000:18:00.0\n" + "\n".join(lines) + "\n"

    answer_nvlink_status(node, Completed(0, text, ""))
    report = collect(node, None, "not shipped", None)
    assert report["problems"]["nvlink"] == [
        "line 1 comes before any GPU: 'WARNING: infoROM is corrupted at gpu 0000:18:00.0'",
        f"line {second + 3}: unknown link state '26.562 GB/s, degraded'",
    ]
    assert report["gpus"][1]["nvlink"]["state"] == "unreadable"
    assert [gpu["nvlink"]["state"] for gpu in report["gpus"][2:]] == ["ok"] * 6
    assert (
        parse_section("gpu", framing.output_of({"gpu": [json.dumps(report)]}))["problems"]
        == (report["problems"])
    )


def test_nvlink_error_counters_reach_each_gpu_of_the_report_through_its_shape() -> None:
    """One ``nvidia-smi nvlink -e`` for the node; each GPU gets its own links' counters, and
    the report read back on the control side keeps them for the health judge."""
    state = hardware()
    state["gpus"][2]["nvlinks"][5]["errors"]["replay"] = 9
    node = FakeNode(state)
    report = collect(node, None, "not shipped", None)
    assert node.calls.count(["nvidia-smi", "nvlink", "-e"]) == 1
    counters = report["gpus"][2]["nvlink_errors"]
    assert (counters["state"], counters["source"]) == ("ok", "nvidia-smi nvlink -e")
    assert counters["links"][5] == {"link": 5, "replay": 9, "recovery": 0, "crc": 0}
    assert len(counters["links"]) == 18 and report["problems"]["nvlink_errors"] == []
    read_back = parse_section("gpu", framing.output_of({"gpu": [json.dumps(report)]}))
    assert read_back["gpus"][2]["nvlink_errors"] == counters


def test_a_node_without_nvlink_is_not_asked_for_nvlink_counters() -> None:
    node = FakeNode(hardware("pcie-a10g"))
    report = collect(node, None, "not shipped", None)
    assert ["nvidia-smi", "nvlink", "-e"] not in node.calls
    assert report["gpus"][0]["nvlink_errors"]["state"] == "none"


def test_nvlink_counters_that_fail_are_unreadable_per_gpu_and_odd_lines_named() -> None:
    node = FakeNode(hardware())

    def smi(argv: list[str]) -> Completed:
        if argv[1:] == ["nvlink", "-e"]:
            return Completed(15, "", "Unable to determine the device handle for GPU1")
        node.commands.pop("nvidia-smi")
        try:
            return node.run(argv)
        finally:
            node.commands["nvidia-smi"] = smi

    node.commands["nvidia-smi"] = smi
    report = collect(node, None, "not shipped", None)
    counters = report["gpus"][0]["nvlink_errors"]
    assert counters["state"] == "unreadable" and counters["reason"].startswith("exit code 15")
    assert counters["links"] == []


def test_nvlink_counters_on_a_node_whose_nvml_answers_without_nvidia_smi() -> None:
    state = hardware()
    node = FakeNode(state, commands={"nvidia-smi": Completed(None, "", "", missing=True)})
    report = collect(node, FakeNvml(state), "shipped", None)
    assert report["source"] == "nvml" and report["gpus"][0]["nvlink"]["active"] == 18
    counters = report["gpus"][0]["nvlink_errors"]
    assert (counters["state"], counters["reason"]) == ("unreadable", "nvidia-smi is not installed")


def logging_python(root: Path) -> Path:
    """A ``python3`` first in the lab root's PATH that records its arguments, then runs the
    system's python3 (as on a node)."""
    system_path = [p for p in os.environ["PATH"].split(":") if not p.startswith(sys.prefix)]
    real = next(
        Path(directory) / "python3"
        for directory in system_path
        if (Path(directory) / "python3").is_file()
    )
    log = root / "python3.log"
    wrapper = root / "bin" / "python3"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    return log


def install_probe(directory: Path) -> None:
    directory.mkdir(parents=True)
    for name, source in installed_probe_files().items():
        (directory / name).write_bytes(source.read_bytes())


# The probe runs in the frame's one python3 process where the node has python3, else from
# its shell command (gpunode.framing): both forms run the installed copy only where it is
# this very probe. ``python3 -I -S -`` is the frame's Python process.
CALLS = {True: "-I -S -", False: "-I -c "}


@pytest.mark.parametrize("in_python", [True, False])
def test_the_installed_probe_runs_where_it_is_this_very_probe(
    lab_root: Path, in_python: bool
) -> None:
    installed = lab_root / "usr/local/lib/gpunode-probe"
    install_probe(installed)
    log = logging_python(lab_root)
    command = framing.command([probe_part(installed_dir=str(installed))], python=in_python)
    report = parse_section("gpu", run_command(command, lab_root))
    assert (report["state"], report["gpu_count"]) == ("ok", 8)
    # The pynvml beside it is the one it would use; with no NVML library here (no driver
    # stack) it does not import it.
    assert report["nvml"]["reason"].startswith(
        f"libnvidia-ml.so.1 cannot be loaded ({installed}/pynvml.py not imported): "
    ), report["nvml"]
    (call,) = log.read_text().splitlines()  # one python3, whichever form
    assert call.startswith(CALLS[in_python]), call
    if not in_python:
        # Imported as a module (its compiled code kept in __pycache__), not run as a script.
        assert call.startswith("-I -c import sys; sys.path.insert(0, ") and str(installed) in call
        assert "import gpu_probe; sys.exit(gpu_probe.main(sys.argv[1:]))" in call
    assert (installed / "__pycache__").is_dir()


@pytest.mark.parametrize("in_python", [True, False])
def test_an_installed_probe_that_differs_is_not_run(lab_root: Path, in_python: bool) -> None:
    installed = lab_root / "usr/local/lib/gpunode-probe"
    install_probe(installed)
    with (installed / "gpu_record.py").open("a") as changed:
        changed.write("# edited on the node\n")
    log = logging_python(lab_root)
    command = framing.command([probe_part(installed_dir=str(installed))], python=in_python)
    report = parse_section("gpu", run_command(command, lab_root))
    assert (report["state"], report["gpu_count"]) == ("ok", 8)
    assert report["nvml"]["module"] == "pynvml.py (shipped)"
    [call] = log.read_text().splitlines()
    assert call.startswith(CALLS[in_python]), call
    assert not (installed / "__pycache__").exists()


# --- MIG instances ----------------------------------------------------------------------------


def a100_in_mig_mode(layouts: dict[int, list[str]]) -> dict[str, Any]:
    """The lab's A100 node, every GPU in MIG mode, GPU i holding the instances ``layouts[i]``
    (created as ``nvidia-smi mig -cgi`` creates them)."""
    state = hardware("a100")
    for gpu in state["gpus"]:
        gpu["mig_mode"] = {"current": "Enabled", "pending": "Enabled"}
    for index, names in layouts.items():
        gpu = state["gpus"][index]
        for name in names:
            profile = next(p for p in gpu["mig_profiles"] if p["name"] == name)
            start = nvidia_smi._choose_placement(gpu, profile)
            assert start is not None
            nvidia_smi._create(index, gpu, profile, start, {"default_compute_instance": True})
    return state


def instance_profiles(report: dict[str, Any]) -> list[list[str] | None]:
    return [
        None if gpu["gpu_instances"] is None else [i["profile"] for i in gpu["gpu_instances"]]
        for gpu in report["gpus"]
    ]


def test_gpu_instances_come_from_one_mig_listing_on_both_paths() -> None:
    state = a100_in_mig_mode({0: ["3g.40gb", "3g.40gb"], 1: ["4g.40gb", "2g.20gb"]})
    node = FakeNode(state)
    through_smi = collect(node, None, "not shipped", None)
    through_nvml = collect(FakeNode(state), FakeNvml(state), "fake", None)
    expected = [["3g.40gb", "3g.40gb"], ["4g.40gb", "2g.20gb"], *[[]] * 6]
    assert instance_profiles(through_smi) == instance_profiles(through_nvml) == expected
    assert through_smi["mig_listing"] == {
        "state": "ok", "command": "nvidia-smi mig -lgi", "reason": ""
    }  # fmt: skip
    assert through_smi["gpus"][0]["gpu_instances"][0] == {
        "id": 1, "profile": "3g.40gb", "profile_id": 9, "start": 4, "size": 4
    }  # fmt: skip
    assert [call for call in node.calls if call[1:2] == ["mig"]] == [["nvidia-smi", "mig", "-lgi"]]
    # Read back on the control side, the record keeps them.
    shipped = parse_section("gpu", framing.output_of({"gpu": [json.dumps(through_smi)]}))
    assert instance_profiles(shipped) == expected


def test_no_gpu_in_mig_mode_runs_no_mig_listing() -> None:
    node = FakeNode(hardware("a100"))
    report = collect(node, None, "not shipped", None)
    assert report["mig_listing"] is None
    assert instance_profiles(report) == [[]] * 8
    assert not [call for call in node.calls if "mig" in call]


def test_after_a_reboot_the_gpus_hold_no_instance_and_the_gate_says_so() -> None:
    from gpunode.drift.rules import evaluate
    from gpunode.model import build_desired_state
    from lab.hwsim import hwstate

    state = a100_in_mig_mode({index: ["3g.40gb", "3g.40gb"] for index in range(8)})
    data = {
        "expected_hardware": {"gpu_model": "NVIDIA A100-SXM4-80GB"},
        "gpu_settings": {"mig": True, "mig_layout": ["3g.40gb", "3g.40gb"]},
    }
    desired, problems = build_desired_state(data)
    assert problems == []

    def gate(state: dict[str, Any]) -> dict[str, str]:
        report = collect(FakeNode(state), None, "not shipped", None)
        facts = {"gpu": parse_section("gpu", framing.output_of({"gpu": [json.dumps(report)]}))}
        return {
            f.id: f.found for f in evaluate("node-a", desired, facts) if f.id.startswith("gpu.mig")
        }

    assert gate(state) == {}
    hwstate.reboot(state)  # the driver keeps no MIG instance across a reboot
    assert gate(state) == {
        f"gpu.mig_layout:{index}": "no GPU instances (none laid out at boot)" for index in range(8)
    }


def test_an_unreadable_mig_listing_leaves_the_instances_unknown_not_empty() -> None:
    state = a100_in_mig_mode({0: ["3g.40gb", "3g.40gb"]})
    for answer, reason in [
        (Completed(0, "| 0  MIG 3g.40gb  9  1  4:4 | extra\n", ""), "unexpected line"),
        (Completed(None, "", "timed out"), "timed out (a GPU may be hung)"),
        (Completed(255, "", "Unknown Error"), "exit code 255: other error"),
        (Completed(0, "| 9  MIG 3g.40gb  9  1  4:4 |\n", ""), "instances of GPU 9"),
    ]:
        node = FakeNode(state)

        def smi(argv: list[str], node: FakeNode = node, answer: Completed = answer) -> Completed:
            if argv[1:] == ["mig", "-lgi"]:
                return answer
            node.commands.pop("nvidia-smi")
            try:
                return node.run(argv)
            finally:
                node.commands["nvidia-smi"] = smi

        node.commands["nvidia-smi"] = smi
        report = collect(node, None, "not shipped", None)
        assert report["state"] == "ok"
        assert report["mig_listing"]["state"] == "unreadable"
        assert reason in report["mig_listing"]["reason"], report["mig_listing"]
        assert instance_profiles(report) == [None] * 8


def test_no_gpu_instances_is_an_answer_although_nvidia_smi_exits_6() -> None:
    state = a100_in_mig_mode({})
    node = FakeNode(state)
    report = collect(node, None, "not shipped", None)
    assert report["mig_listing"]["state"] == "ok"
    assert instance_profiles(report) == [[]] * 8


# A dpkg database holding the driver's packages in the states the probe meets: installed,
# held, removed with its configuration kept, purged, and a package none of its patterns name.
DRIVER_DATABASE = """\
Package: nvidia-driver-cuda
Status: hold ok installed
Architecture: amd64
Version: 590.48.01-1

Package: libnvidia-ml1
Status: install ok installed
Architecture: amd64
Version: 590.48.01-1

Package: nvidia-driver-libs
Status: deinstall ok config-files
Architecture: amd64
Version: 580.95.05-1

Package: libnvidia-compute-580
Status: purge ok not-installed
Architecture: amd64

Package: bash
Status: install ok installed
Architecture: amd64
Version: 5.2.15-2+b8
"""


def test_the_probe_in_the_frame_reads_the_driver_packages_dpkg_query_reads(
    lab_root: Path, tmp_path: Path
) -> None:
    """In the frame's Python process the probe takes the driver's packages from the frame's one
    read of dpkg's database (no dpkg-query of its own); from its shell command it runs the
    real dpkg-query. Both, told to read one database, report the same packages."""
    database = tmp_path / "dpkg"
    for directory in ("updates", "info"):
        (database / directory).mkdir(parents=True)
    (database / "status").write_text(DRIVER_DATABASE)
    real = shutil.which("dpkg-query")
    assert real is not None
    calls = tmp_path / "dpkg-query.log"
    wrapper = lab_root / "bin" / "dpkg-query"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {real} --admindir={database} "$@"\n')
    wrapper.chmod(0o755)
    installed = lab_root / "usr/local/lib/gpunode-probe"
    install_probe(installed)
    part = probe_part(installed_dir=str(installed))
    assert part.python is not None and repr(framing.DPKG_DIR) in part.python
    part = dataclasses.replace(
        part, python=part.python.replace(repr(framing.DPKG_DIR), repr(str(database)))
    )
    reports = {}
    for in_python in (True, False):
        command = framing.command([part], python=in_python)
        reports[in_python] = parse_section("gpu", run_command(command, lab_root))
        logged = calls.read_text() if calls.exists() else ""
        assert logged.count("-W -f ") == (0 if in_python else 1), logged
    assert reports[True]["driver_versions"] == reports[False]["driver_versions"]
    assert reports[True]["driver_versions"]["installed_package_source"] == "dpkg"
    assert reports[True]["driver_versions"]["installed_packages"] == {
        "libnvidia-ml1": "590.48.01",
        "nvidia-driver-cuda": "590.48.01",
    }

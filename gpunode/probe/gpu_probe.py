"""Node-side GPU probe: prints one JSON document about the node's NVIDIA GPUs and driver stack.

It runs with the node's ``/usr/bin/python3`` and needs nothing but the standard library.
``facts.hardware.GpuReport`` pipes this file (and, by default, NVIDIA's pure-Python ``pynvml``
module from the control venv, so nodes need no pip) into ``python3 -``: nothing is installed.
Where the fact is told not to ship pynvml, the probe imports it from ``sys.path`` or
``PYNVML_DIR`` (/usr/local/lib/gpunode-probe/pynvml.py) if present.

Sources, in order of preference:

- NVML through pynvml, when ``libnvidia-ml.so.1`` loads;
- else ``nvidia-smi -q -x`` (every XML schema: elements renamed between driver generations
  are looked up under each name), plus ``nvidia-smi nvlink -s`` for NVLink states, since no
  known XML schema carries them. ``--query-gpu`` is never used: an older driver rejects a
  whole call that names a field it does not know.

The GPU instances of GPUs in MIG mode come from ``nvidia-smi mig -lgi`` on both paths, read by
the parser ``facts.gpu.GpuDevices`` uses too (``gpu_record.parse_gpu_instances``): one call for
every GPU, and only where some GPU's MIG mode is on.

Per node it adds the kernel module's state and version (/proc/driver/nvidia/version), the
installed driver package version (dpkg), whether these disagree with the
userspace driver, the Fabric Manager service state, and NVIDIA XID events from the kernel
log since a given time.

The parsing functions here are pure and are also used on the control side
(``gpunode.probe.parsers``). Each returns data, or ``{"state": "unreadable", "command": ...,
"reason": ...}`` naming what could not be read and why; none raises.

Usage: ``python3 gpu_probe.py [--xid-since ISO8601] [--no-nvml]``
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import re
import secrets
import stat
import subprocess
import sys
from datetime import datetime, timedelta, timezone

# Names for the type checker alone. The probe runs on every node at every drift check, in the
# check's one Python process, and each module imported costs that node CPU (typing 2 ms,
# ctypes 2 ms, contextlib 1 ms): ctypes and importlib are imported where they are used,
# typing not at all.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, NamedTuple

RECORD_MODULE = "gpunode.probe.gpu_record"
TEXTFILE_MODULE = "gpunode.probe.textfile"


def _load_module(name: str = RECORD_MODULE) -> Any:
    """Make ``name`` (``gpunode.probe.gpu_record``, ``.textfile``) importable wherever this
    file runs, and return it.

    On the control side it is the package's module. ``parsers.probe_program`` registers the
    record in ``sys.modules`` before this file runs; where ``roles.gpu_metrics`` installed the
    probe as a script, the modules lie beside it (``python3 -I`` puts no script directory on
    sys.path).
    """
    if name in sys.modules:
        return sys.modules[name]
    import importlib.util  # lazily: see the imports above

    try:
        return importlib.import_module(name)
    except ImportError:
        file_name = name.rsplit(".", 1)[-1] + ".py"
        path = os.path.join(os.path.dirname(os.path.realpath(__file__)), file_name)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module


_load_module()

from gpunode.probe.gpu_record import (  # noqa: E402 - importable only once loaded above
    CLOCK_EVENT_REASON_BITS,
    MAX_LINE_CHARS,
    MIG_INSTANCES_COMMAND,
    NOTHING_LISTED,
    NVLINK_COMMAND,
    NVLINK_ERRORS_COMMAND,
    XML_COMMAND,
    Result,
    absent,
    bus_key,
    clean,
    lost_record,
    never_raises,
    nvlink_errors_summary,
    nvlink_summary,
    parse_gpu_instances,
    parse_nvidia_smi_xml,
    parse_nvlink_errors,
    parse_nvlink_status,
    unreachable_gpus,
    unreadable,
)

SCHEMA = "gpunode.gpu-report/1"
PYNVML_DIR = "/usr/local/lib/gpunode-probe"
NVML_LIBRARY = "libnvidia-ml.so.1"  # what pynvml's _LoadNvmlLibrary opens on Linux
XID_WINDOW_HOURS = 24

XID_COMMAND = "journalctl -t kernel -o short-iso"
DPKG_COMMAND = "dpkg-query -W nvidia-driver* libnvidia-ml1 libnvidia-compute*"
DPKG_PATTERNS = ("nvidia-driver*", "libnvidia-ml1", "libnvidia-compute*")
DPKG_FORMAT = "${Package}\t${Version}\t${db:Status-Abbrev}\n"
FABRIC_MANAGER_UNIT = "nvidia-fabricmanager.service"
FABRIC_MANAGER_PROPERTIES = ("LoadState", "ActiveState", "SubState", "UnitFileState")
FABRIC_MANAGER_COMMAND = f"systemctl show {FABRIC_MANAGER_UNIT}"
MODULE_VERSION_PATH = "/proc/driver/nvidia/version"
SYSFS_MODULE_VERSION_PATH = "/sys/module/nvidia/version"

# nvidia-smi(1), RETURN VALUE; 18 is NVML's "RM has detected an NVML/RM version mismatch".
SMI_EXIT_REASONS = {
    2: "invalid argument or flag",
    3: "the requested operation is not available on the target device",
    4: "insufficient permissions",
    6: "the query was unsuccessful (no such device)",
    8: "external power cables are not properly attached",
    9: "NVIDIA driver is not loaded",
    10: "NVIDIA kernel detected an interrupt issue with a GPU",
    12: "NVML shared library could not be found or loaded",
    13: "the local NVML version does not implement this function",
    14: "infoROM is corrupted",
    15: "the GPU has fallen off the bus or has otherwise become inaccessible",
    18: "driver/library version mismatch",
    255: "other error or internal driver error",
}
EXIT_DRIVER_NOT_LOADED = 9
EXIT_GPU_LOST = 15
VERSION_MISMATCH_TEXT = "Driver/library version mismatch"


# --- nvidia-smi failures ----------------------------------------------------------------------


def nvidia_smi_failure(command: str, exit_code: int | None, output: str) -> Result:
    """Why an nvidia-smi call failed, from its exit code (nvidia-smi(1)) and its words."""
    if exit_code is None:
        return unreadable(command, "timed out (a GPU may be hung)")
    reason = SMI_EXIT_REASONS.get(exit_code, "unknown failure")
    if VERSION_MISMATCH_TEXT in output:
        reason = SMI_EXIT_REASONS[18]
    detail = " ".join(output.split())[:300]
    result = unreadable(
        command, f"exit code {exit_code}: {reason}" + (f": {detail}" if detail else "")
    )
    result["exit_code"] = exit_code
    if exit_code == EXIT_DRIVER_NOT_LOADED:
        result["state"] = "driver_not_loaded"
    library = re.search(r"NVML library version: *([0-9][0-9.]*[0-9])", output)
    if library:  # printed on a driver/library mismatch: the userspace side's version
        result["nvml_library_version"] = library.group(1)
    return result


# --- kernel log: XID events -------------------------------------------------------------------

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)"
    r"[^)]*\): (\d+)(?:,(.*))?"
)
_ISO_TIME = re.compile(r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\s")
_SYSLOG_TIME = re.compile(r"([A-Z][a-z]{2} [ 0-9]\d \d{2}:\d{2}:\d{2})\s")
_PID_NAME = re.compile(r"pid=([^,]*), name=([^,]*), (.*)")
# NVSwitch errors: "nvidia-nvswitch4: SXid (PCI:0000:c6:00.0): 19084, Non-fatal, Link 29 ...".
_SXID = re.compile(
    r"nvidia-nvswitch(\d{1,3}): SXid \(PCI:([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}"
    r"(?:\.[0-7])?)\): (\d{1,6}), ?(.*)"
)


def _event_time(line: str) -> str | None:
    if match := _ISO_TIME.match(line):
        stamp = match.group(1)
        for layout in ("%Y-%m-%dT%H:%M:%S.%f%z", "%Y-%m-%dT%H:%M:%S%z"):
            try:
                return datetime.strptime(stamp.replace("Z", "+0000"), layout).isoformat()
            except ValueError:
                continue
        return stamp
    if match := _SYSLOG_TIME.match(line):
        return match.group(1)
    return None


@never_raises(XID_COMMAND)
def parse_xid_events(text: str) -> Result:
    """Kernel log lines (journalctl short-iso, syslog or dmesg) -> NVIDIA XID events.

    Lines that are not XID reports are other kernel messages and are only counted. No
    output is a valid answer here (no kernel message in the window); whether the command
    itself succeeded is for the caller to check.
    """
    events = []
    # The time, device and XID come first: a line over the limit is read by its head.
    lines = [line[:MAX_LINE_CHARS] for line in text.splitlines() if line.strip()]
    sxids = []
    for line in lines:
        if "SXid" in line and (sxid := _SXID.search(line)):
            sxids.append(_sxid_event(line, sxid))
            continue
        if "NVRM: Xid" not in line:
            continue
        match = _XID.search(line)
        if not match:
            events.append({"time": _event_time(line), "pci": None, "xid": None, "message": line})
            continue
        message = (match.group(3) or "").lstrip(" ")
        event: Result = {
            "time": _event_time(line),
            "pci": match.group(1).lower(),
            "xid": int(match.group(2)),
            "message": message,
        }
        if detail := _PID_NAME.fullmatch(message):
            event.update(pid=detail.group(1), process=detail.group(2), message=detail.group(3))
        events.append(event)
    return {"state": "ok", "command": XID_COMMAND, "lines_read": len(lines), "events": events,
            "sxid_events": sxids}  # fmt: skip


def _sxid_event(line: str, match: re.Match[str]) -> Result:
    """One SXid line; ``fatal`` None: a line that says neither (an error's detail line)."""
    words = match.group(4).strip()
    kind = words.split(",", 1)[0].strip().lower()
    fatal = {"fatal": True, "non-fatal": False}.get(kind)
    if fatal is not None:
        words = words.split(",", 1)[1].strip() if "," in words else ""
    return {
        "time": _event_time(line),
        "switch": int(match.group(1)),
        "pci": match.group(2).lower(),
        "sxid": int(match.group(3)),
        "fatal": fatal,
        "message": words,
    }


# --- driver versions --------------------------------------------------------------------------


def parse_module_version(text: str) -> Result:
    """/proc/driver/nvidia/version (or /sys/module/nvidia/version) -> version and flavour."""
    match = re.search(r"Kernel Module(?: for \S+)?\s+([0-9]+\.[0-9]+(?:\.[0-9]+)?)", text)
    if match:
        flavor = "open" if "Open Kernel Module" in text else "proprietary"
        return {"version": match.group(1), "flavor": flavor}
    bare = re.fullmatch(r"\s*([0-9]+\.[0-9]+(?:\.[0-9]+)?)\s*", text)  # the sysfs file
    return {"version": bare.group(1) if bare else None, "flavor": None}


def upstream_version(package_version: str) -> str | None:
    """'1:535.54.03-1~deb12u1' -> '535.54.03'; None unless it looks like a driver version."""
    version = package_version.split(":", 1)[-1].split("-", 1)[0]
    return version if re.fullmatch(r"[0-9]{3}\.[0-9]+(?:\.[0-9]+)?", version) else None


def parse_dpkg_versions(text: str) -> dict[str, str]:
    """``dpkg-query -W -f '${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'`` -> installed.

    Packages dpkg knows but has not installed (status not ?i) and packages whose version is
    not a driver version (e.g. nvidia-driver-assistant) are left out.
    """
    installed = {}
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) != 3 or len(fields[2]) < 2 or fields[2][1] != "i":
            continue
        version = upstream_version(fields[1])
        if version is not None:
            installed[fields[0]] = version
    return installed


def parse_systemctl_show(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def fabric_manager_state(properties: dict[str, str]) -> Result:
    load = properties.get("LoadState")
    active = properties.get("ActiveState")
    if load is None or active is None:
        return {"state": "unknown", "reason": "systemctl show printed no LoadState/ActiveState"}
    state = "not_installed" if load == "not-found" else active
    return {
        "state": state,
        "active_state": active,
        "sub_state": properties.get("SubState"),
        "load_state": load,
        "unit_file_state": properties.get("UnitFileState"),
    }


def version_comparison(
    kernel_module: str | None,
    userspace: str | None,
    installed: dict[str, str],
    installed_source: str | None,
    mismatch_reported: bool,
) -> Result:
    """Do kernel module, userspace driver and installed packages agree on one version?"""
    known = {
        "kernel_module": kernel_module,
        "userspace": userspace,
        **{f"package {name}": version for name, version in sorted(installed.items())},
    }
    distinct = sorted({version for version in known.values() if version})
    if mismatch_reported:
        mismatch: bool | None = True
        reason = "the driver reports a driver/library version mismatch"
    elif sum(1 for version in known.values() if version) < 2:
        mismatch = None
        reason = "fewer than two of kernel module, userspace and package versions are known"
    else:
        mismatch = len(distinct) > 1
        reason = f"versions differ: {', '.join(distinct)}" if mismatch else ""
    versions = sorted(set(installed.values()))
    return {
        "kernel_module": kernel_module,
        "userspace": userspace,
        "installed_package": versions[0] if len(versions) == 1 else None,
        "installed_packages": installed,
        "installed_package_source": installed_source,
        "mismatch": mismatch,
        "reason": reason,
    }


# --- NVML -------------------------------------------------------------------------------------

MIB = 1024 * 1024
FABRIC_STATES = {0: None, 1: "Not Started", 2: "In Progress", 3: "Completed"}


def _text_of(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return clean(value) if isinstance(value, str) else None


class NvmlReader:
    """Reads one value at a time; a value NVML cannot give (not supported...) is None."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        # Calls answered NVML_ERROR_GPU_IS_LOST since the last ``gpu``: the GPU is lost.
        self.lost_answers = 0

    def get(self, function: str, *args: Any) -> Any:
        call = getattr(self.nvml, function, None)
        if call is None:  # an older pynvml
            return None
        try:
            return call(*args)
        except self.nvml.NVMLError as error:
            if is_lost_error(self.nvml, error):
                self.lost_answers += 1
            return None

    def gpu(self, handle: Any, index: int) -> Result:
        """One GPU's record; a GPU whose calls answer GPU_IS_LOST is marked lost."""
        self.lost_answers = 0
        record = self._gpu(handle, index)
        if self.lost_answers:
            record["lost"] = True
            record["lost_evidence"] = f"NVML answered GPU_IS_LOST to {self.lost_answers} calls"
        return record

    def _recovery_action(self, handle: Any) -> int | None:
        """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (drivers 570 on); None where not reported."""
        field = getattr(self.nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        values = None if field is None else self.get("nvmlDeviceGetFieldValues", handle, [field])
        if not values or values[0].nvmlReturn != 0:
            return None
        return int(values[0].value.uiVal)

    def _ecc_memory(self, handle: Any) -> Result | None:
        """Uncorrectable ECC counts of SRAM and DRAM, where NVML counts them apart."""
        nvml = self.nvml
        sram = getattr(nvml, "NVML_MEMORY_LOCATION_SRAM", None)
        dram = getattr(nvml, "NVML_MEMORY_LOCATION_DRAM", None)
        if sram is None or dram is None:
            return None
        counts = {
            scope: {
                memory: self.get(
                    "nvmlDeviceGetMemoryErrorCounter", handle,
                    nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, counter, location,
                )
                for memory, location in (("sram", sram), ("dram", dram))
            }
            for scope, counter in (
                ("volatile", nvml.NVML_VOLATILE_ECC), ("aggregate", nvml.NVML_AGGREGATE_ECC)
            )
        }  # fmt: skip
        exceeded = self._sram_threshold_exceeded(handle)
        if exceeded is None and all(v is None for scope in counts.values() for v in scope.values()):
            return None
        return {**counts, "sram_threshold_exceeded": exceeded}

    def _sram_threshold_exceeded(self, handle: Any) -> bool | None:
        """nvmlDeviceGetSramEccErrorStatus's bThresholdExceeded (drivers 570 on)."""
        structure = getattr(self.nvml, "c_nvmlEccSramErrorStatus_v1_t", None)
        if structure is None:
            return None
        status = structure()
        if self.get("nvmlDeviceGetSramEccErrorStatus", handle, status) is None:
            return None
        return bool(status.bThresholdExceeded)

    def enabled(self, value: Any) -> bool | None:
        if value is None:
            return None
        return value == self.nvml.NVML_FEATURE_ENABLED

    def _gpu(self, handle: Any, index: int) -> Result:
        nvml = self.nvml
        pci = self.get("nvmlDeviceGetPciInfo", handle)
        ecc = self.get("nvmlDeviceGetEccMode", handle) or [None, None]
        mig = self.get("nvmlDeviceGetMigMode", handle) or [None, None]
        constraints = self.get("nvmlDeviceGetPowerManagementLimitConstraints", handle) or [
            None,
            None,
        ]
        remapped = self.get("nvmlDeviceGetRemappedRows", handle)
        retired = {
            name: self.get("nvmlDeviceGetRetiredPages", handle, cause)
            for name, cause in (
                ("single_bit", nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
                ("double_bit", nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
            )
        }
        pending_pages = self.get("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        reasons = self.get("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if reasons is None:
            reasons = self.get("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        utilization = self.get("nvmlDeviceGetUtilizationRates", handle)
        clock_types = {
            "graphics": nvml.NVML_CLOCK_GRAPHICS,
            "sm": nvml.NVML_CLOCK_SM,
            "memory": nvml.NVML_CLOCK_MEM,
            "video": nvml.NVML_CLOCK_VIDEO,
        }
        return {
            "index": index,
            "minor_number": self.get("nvmlDeviceGetMinorNumber", handle),
            "module_id": self.get("nvmlDeviceGetModuleId", handle),
            "uuid": _text_of(self.get("nvmlDeviceGetUUID", handle)),
            "serial": _text_of(self.get("nvmlDeviceGetSerial", handle)),
            "name": _text_of(self.get("nvmlDeviceGetName", handle)),
            "pci_bus_id": _text_of(getattr(pci, "busId", None)),
            "vbios_version": _text_of(self.get("nvmlDeviceGetVbiosVersion", handle)),
            "persistence_mode": self.enabled(self.get("nvmlDeviceGetPersistenceMode", handle)),
            "performance_state": self._performance_state(handle),
            "ecc_mode": {"current": self.enabled(ecc[0]), "pending": self.enabled(ecc[1])},
            "ecc_errors": {
                scope: {
                    kind: self.get("nvmlDeviceGetTotalEccErrors", handle, error_type, counter)
                    for kind, error_type in (
                        ("corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                        ("uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
                    )
                }
                for scope, counter in (
                    ("volatile", nvml.NVML_VOLATILE_ECC),
                    ("aggregate", nvml.NVML_AGGREGATE_ECC),
                )
            },
            "retired_pages": {
                "supported": any(pages is not None for pages in retired.values()),
                **{name: None if pages is None else len(pages) for name, pages in retired.items()},
                "pending": None if pending_pages is None else bool(pending_pages),
            },
            "remapped_rows": {
                "supported": remapped is not None,
                "correctable": None if remapped is None else remapped[0],
                "uncorrectable": None if remapped is None else remapped[1],
                "pending": None if remapped is None else bool(remapped[2]),
                "failure": None if remapped is None else bool(remapped[3]),
            },
            "mig_mode": {"current": self.enabled(mig[0]), "pending": self.enabled(mig[1])},
            "utilization_percent": {
                "gpu": getattr(utilization, "gpu", None),
                "memory": getattr(utilization, "memory", None),
            },
            "memory_mib": self._memory(handle),
            "temperature_c": {
                "gpu": self.get("nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU),
                "memory": self._memory_temperature(handle),
            },
            "temperature_slowdown_c": self._slowdown_temperature(handle),
            "temperature_tlimit_c": {"current": None, "slowdown": None},
            "power_w": {
                "draw": _watts(self.get("nvmlDeviceGetPowerUsage", handle)),
                "limit": _watts(self.get("nvmlDeviceGetEnforcedPowerLimit", handle)),
                "default_limit": _watts(
                    self.get("nvmlDeviceGetPowerManagementDefaultLimit", handle)
                ),
                "min_limit": _watts(constraints[0]),
                "max_limit": _watts(constraints[1]),
            },
            "clocks_mhz": {
                "current": {
                    name: self.get("nvmlDeviceGetClockInfo", handle, clock)
                    for name, clock in clock_types.items()
                },
                "max": {
                    name: self.get("nvmlDeviceGetMaxClockInfo", handle, clock)
                    for name, clock in clock_types.items()
                },
            },
            "clock_event_reasons": None if reasons is None else reason_names(reasons),
            "pcie": {
                "gen_current": self.get("nvmlDeviceGetCurrPcieLinkGeneration", handle),
                "gen_max": self.get("nvmlDeviceGetMaxPcieLinkGeneration", handle),
                "width_current": self.get("nvmlDeviceGetCurrPcieLinkWidth", handle),
                "width_max": self.get("nvmlDeviceGetMaxPcieLinkWidth", handle),
            },
            "fabric": self._fabric(handle),
            "nvlink": self._nvlink(handle),
            **self._application_clocks(handle),
            "lost": False,
            "lost_evidence": None,
            "ecc_memory": self._ecc_memory(handle),
            "recovery_action": self._recovery_action(handle),
            "recovery_action_text": None,
        }

    def _application_clocks(self, handle: Any) -> Result:
        """The same three fields as ``gpu_record``'s, from NVML."""
        nvml = self.nvml
        memory = self.get("nvmlDeviceGetApplicationsClock", handle, nvml.NVML_CLOCK_MEM)
        graphics = self.get("nvmlDeviceGetApplicationsClock", handle, nvml.NVML_CLOCK_GRAPHICS)
        supported = []
        for memory_clock in self.get("nvmlDeviceGetSupportedMemoryClocks", handle) or []:
            graphics_clocks = self.get("nvmlDeviceGetSupportedGraphicsClocks", handle, memory_clock)
            graphics_mhz = sorted(int(clock) for clock in graphics_clocks or [])
            supported.append({"memory": int(memory_clock), "graphics": graphics_mhz})
        if memory is None or graphics is None:
            # NVML gives no words, only "not supported" (e.g. deprecated on Hopper by 590).
            return {
                "application_clocks_mhz": None,
                "application_clocks_note": "not reported by NVML",
                "supported_clocks_mhz": supported,
            }
        return {
            "application_clocks_mhz": {"memory": int(memory), "graphics": int(graphics)},
            "application_clocks_note": "",
            "supported_clocks_mhz": supported,
        }

    def _memory(self, handle: Any) -> Result:
        """Framebuffer total and used, MiB as nvidia-smi prints them.

        The v2 call counts the driver's reserved memory apart, as nvidia-smi does; the v1
        call (older drivers) counts it as used.
        """
        version = getattr(self.nvml, "nvmlMemory_v2", None)
        info = None if version is None else self.get("nvmlDeviceGetMemoryInfo", handle, version)
        if info is None:
            info = self.get("nvmlDeviceGetMemoryInfo", handle)
        if info is None:
            return {"total": None, "used": None}
        return {"total": int(info.total) // MIB, "used": int(info.used) // MIB}

    def _performance_state(self, handle: Any) -> str | None:
        state = self.get("nvmlDeviceGetPerformanceState", handle)
        return None if state is None or state == 32 else f"P{state}"  # 32: unknown

    def _slowdown_temperature(self, handle: Any) -> int | None:
        threshold = getattr(self.nvml, "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", None)
        if threshold is None:
            return None
        return self.get("nvmlDeviceGetTemperatureThreshold", handle, threshold)

    def _memory_temperature(self, handle: Any) -> int | None:
        field = getattr(self.nvml, "NVML_FI_DEV_MEMORY_TEMP", None)
        values = None if field is None else self.get("nvmlDeviceGetFieldValues", handle, [field])
        if not values or values[0].nvmlReturn != 0:
            return None
        return int(values[0].value.uiVal)

    def _fabric(self, handle: Any) -> Result:
        structure = getattr(self.nvml, "c_nvmlGpuFabricInfo_t", None)
        if structure is None:
            return {"state": None, "status": None}
        import ctypes  # lazily: see the imports above

        info = structure()
        if self.get("nvmlDeviceGetGpuFabricInfo", handle, ctypes.byref(info)) is None:
            return {"state": None, "status": None}
        state = FABRIC_STATES.get(int(info.state))
        status = None
        if state is not None:
            status = (
                "Success"
                if int(info.status) == 0
                else _text_of(self.get("nvmlErrorString", int(info.status)))
            )
        return {"state": state, "status": status}

    def _nvlink(self, handle: Any) -> Result:
        links = []
        for link in range(int(getattr(self.nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            state = self.get("nvmlDeviceGetNvLinkState", handle, link)
            if state is not None:  # links past the GPU's own count are "not supported"
                links.append(
                    {
                        "link": link,
                        "active": state == self.nvml.NVML_FEATURE_ENABLED,
                        "speed_gbps": None,
                    }
                )
        return nvlink_summary(links, "nvml")


def is_lost_error(nvml: Any, error: Exception) -> bool:
    """NVML's own word that a GPU is gone (NVML_ERROR_GPU_IS_LOST, 15)."""
    return getattr(error, "value", None) == getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15)


def _watts(milliwatts: Any) -> float | None:
    return None if milliwatts is None else milliwatts / 1000.0


def reason_names(mask: int) -> list[str]:
    """NVML clocks event reason bitmask -> sorted names; unknown bits named by value."""
    names = [name for bit, name in CLOCK_EVENT_REASON_BITS.items() if mask & bit]
    known = 0
    for bit in CLOCK_EVENT_REASON_BITS:
        known |= bit
    unknown = mask & ~known
    bit = 1
    while unknown >= bit:
        if unknown & bit:
            names.append(f"reason_0x{bit:x}")
        bit <<= 1
    return sorted(names)


def cuda_version_text(value: int | None) -> str | None:
    """NVML's CUDA driver version 13010 -> '13.1'."""
    if not value:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"


def collect_nvml(nvml: Any) -> Result:
    """The GPU section from NVML; raises nvml.NVMLError when NVML cannot start."""
    nvml.nvmlInit()
    try:
        reader = NvmlReader(nvml)
        cuda = reader.get("nvmlSystemGetCudaDriverVersion_v2")
        if cuda is None:
            cuda = reader.get("nvmlSystemGetCudaDriverVersion")
        count = nvml.nvmlDeviceGetCount()
        gpus = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError as error:
                # One lost GPU is that GPU's finding; the others are still read.
                if not is_lost_error(nvml, error):
                    raise
                gpus.append(lost_record(index, f"NVML: no handle for GPU {index}: {error}"))
                continue
            gpus.append(reader.gpu(handle, index))
        return {
            "state": "ok",
            "command": "NVML",
            "driver_version": _text_of(nvml.nvmlSystemGetDriverVersion()),
            "cuda_driver_version": cuda_version_text(cuda),
            "attached_gpus": count,
            "gpus": gpus,
        }
    finally:
        try:  # noqa: SIM105 - contextlib is not imported (see the imports above)
            nvml.nvmlShutdown()
        except Exception:
            pass


def _beside_this_file() -> tuple[str, ...]:
    # Installed as a script (roles.gpu_metrics), pynvml.py lies beside this file.
    here = os.path.dirname(globals().get("__file__") or "")
    return (here,) if os.path.isabs(here) else ()


def load_pynvml(search: Iterable[str] | None = None) -> tuple[Any, str]:
    """pynvml (shipped by the fact, or installed) and where it came from; (None, why) if none.

    ``search``: directories that may hold pynvml.py; default: beside this file, PYNVML_DIR."""
    if search is None:
        search = (*_beside_this_file(), PYNVML_DIR)
    shipped = sys.modules.get("pynvml")
    if shipped is not None:
        return shipped, getattr(shipped, "__file__", None) or "shipped"
    for directory in search:
        if os.path.isfile(os.path.join(directory, "pynvml.py")) and directory not in sys.path:
            sys.path.append(directory)
    # pynvml is 200 kB of Python to import, and useless where its library cannot load (no
    # driver stack installed): ask the dynamic loader first, for the library pynvml itself
    # opens on Linux.
    import ctypes  # lazily: see the imports above
    import importlib.util

    try:
        ctypes.CDLL(NVML_LIBRARY)
    except OSError as error:
        spec = importlib.util.find_spec("pynvml")
        found = f"{spec.origin} not imported" if spec and spec.origin else "no pynvml either"
        return None, f"{NVML_LIBRARY} cannot be loaded ({found}): {error}"
    try:
        import pynvml
    except ImportError:
        return None, "pynvml is neither shipped nor importable"
    return pynvml, getattr(pynvml, "__file__", None) or "installed"


# --- the node ---------------------------------------------------------------------------------


if TYPE_CHECKING:

    class Completed(NamedTuple):
        exit_code: int | None  # None: timed out
        stdout: str
        stderr: str
        missing: bool = False  # the program is not installed

else:
    Completed = collections.namedtuple(
        "Completed", ("exit_code", "stdout", "stderr", "missing"), defaults=(False,)
    )


class System:
    """The node as the probe sees it; tests substitute a fake."""

    def run(self, argv: list[str], timeout: float = 60.0) -> Completed:
        environment = {**os.environ, "LC_ALL": "C"}
        environment["PATH"] = environment.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                env=environment,
                check=False,
            )
        except FileNotFoundError:
            return Completed(None, "", f"{argv[0]}: not found", missing=True)
        except subprocess.TimeoutExpired:
            return Completed(None, "", f"{argv[0]}: timed out after {timeout:.0f} s")
        decode = functools.partial(bytes.decode, encoding="utf-8", errors="replace")
        return Completed(done.returncode, decode(done.stdout), decode(done.stderr))

    def read(self, path: str) -> str | None:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except OSError:
            return None

    def now(self) -> datetime:
        return datetime.now(timezone.utc)  # noqa: UP017 - nodes may run Python 3.10


def read_gpus(system: System, nvml: Any, nvml_origin: str) -> tuple[Result, Result]:
    """The GPU section (NVML first, else nvidia-smi -q -x) and what became of NVML."""
    if nvml is None:
        nvml_state: Result = {"state": "unavailable", "reason": nvml_origin}
    else:
        try:
            section = collect_nvml(nvml)
            return section, {"state": "ok", "module": nvml_origin}
        except Exception as error:  # NVMLError (no libnvidia-ml.so.1...) or an NVML oddity
            nvml_state = {"state": "unavailable", "module": nvml_origin, "reason": str(error)}
            if getattr(error, "value", None) == getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9):
                nvml_state["driver_not_loaded"] = True
    completed = system.run(["nvidia-smi", "-q", "-x"])
    if completed.missing:
        return absent(XML_COMMAND, "nvidia-smi is not installed"), nvml_state
    # A GPU nvidia-smi cannot open is named on its own line and left out of the report; the
    # other GPUs' XML may still follow (whatever the exit status): both are kept.
    lost = unreachable_gpus(completed.stdout + "\n" + completed.stderr)
    parsed = parse_nvidia_smi_xml(completed.stdout) if completed.stdout.strip() else None
    if completed.exit_code != 0 and not (lost and parsed and parsed["state"] == "ok"):
        output = completed.stdout + completed.stderr
        section = nvidia_smi_failure(XML_COMMAND, completed.exit_code, output)
    else:
        section = parsed or unreadable(XML_COMMAND, "empty output")
    section["lost_gpus"] = lost
    if completed.exit_code == EXIT_GPU_LOST and not lost:
        # nvidia-smi(1): 15 "the GPU has fallen off the bus or has otherwise become
        # inaccessible", without naming which: the node has a lost GPU all the same.
        section["lost_gpus"] = [
            {
                "pci_bus_id": None,
                "index": None,
                "message": section.get("reason") or SMI_EXIT_REASONS[EXIT_GPU_LOST],
            }
        ]
    return section, nvml_state


def add_nvlink_status(system: System, gpus: list[Result]) -> list[str]:
    """NVLink states from ``nvidia-smi nvlink -s`` for GPUs whose report had none.

    Returns the lines of its output that were not read (those before the first GPU too), for
    the report's ``problems``; the GPUs they belong to say so in their own ``nvlink``.
    """
    wanting = [gpu for gpu in gpus if gpu.get("nvlink") is None]
    if not wanting:
        return []
    completed = system.run(["nvidia-smi", "nvlink", "-s"])
    # Output cut short by an error (non-zero exit) is still read: the GPUs it lists are kept,
    # the others carry the failure. No output at all with exit 0 means no GPU has NVLink.
    status = parse_nvlink_status(completed.stdout, empty_ok=completed.exit_code == 0)
    failure = None
    if completed.exit_code != 0:
        failure = nvidia_smi_failure(
            NVLINK_COMMAND, completed.exit_code, completed.stdout + completed.stderr
        )
        if status["state"] != "ok":
            status = failure
    by_uuid = {gpu["uuid"]: gpu for gpu in status.get("gpus", [])}
    for gpu in wanting:
        if status["state"] != "ok":
            gpu["nvlink"] = {
                "source": NVLINK_COMMAND,
                "state": "unreadable",
                "reason": status["reason"],
            }
        elif gpu["uuid"] in by_uuid:
            found = dict(by_uuid[gpu["uuid"]])
            for key in ("index", "name", "uuid"):
                found.pop(key)
            gpu["nvlink"] = found
        elif not status["gpus"]:  # exit 0 and nothing printed: no NVLink on this node
            gpu["nvlink"] = nvlink_summary([], NVLINK_COMMAND)
        else:
            missing = f"{gpu['uuid']} is missing from the output of {NVLINK_COMMAND}"
            gpu["nvlink"] = {
                "source": NVLINK_COMMAND,
                "state": "unreadable",
                "reason": f"{missing}: {failure['reason']}" if failure else missing,
            }
    return list(status.get("problems", [])) if status["state"] == "ok" else []


def add_nvlink_errors(system: System, gpus: list[Result]) -> list[str]:
    """Each GPU's ``nvlink_errors`` (its links' replay, recovery and CRC counters) from
    ``nvidia-smi nvlink -e``, on both paths: one call for every GPU, and only where some GPU
    has a link up (a node without NVLink pays nothing; its GPUs get state none).

    Returns the lines of its output that were not read, for the report's ``problems``.
    """
    with_links = [gpu for gpu in gpus if ((gpu.get("nvlink") or {}).get("active") or 0) > 0]
    for gpu in gpus:
        gpu["nvlink_errors"] = nvlink_errors_summary([])
    if not with_links:
        return []
    completed = system.run(["nvidia-smi", "nvlink", "-e"])
    errors = parse_nvlink_errors(completed.stdout, empty_ok=completed.exit_code == 0)
    if completed.missing:  # NVML answered, but the node has no nvidia-smi to ask for counters
        errors = unreadable(NVLINK_ERRORS_COMMAND, "nvidia-smi is not installed")
    elif completed.exit_code != 0:
        failure = nvidia_smi_failure(
            NVLINK_ERRORS_COMMAND, completed.exit_code, completed.stdout + completed.stderr
        )
        if errors["state"] != "ok":
            errors = failure
    by_uuid = {gpu["uuid"]: gpu for gpu in errors.get("gpus", [])}
    for gpu in with_links:
        if errors["state"] != "ok":
            gpu["nvlink_errors"] = {**nvlink_errors_summary([]), "state": "unreadable",
                                    "reason": errors["reason"]}  # fmt: skip
        elif gpu["uuid"] in by_uuid:
            found = dict(by_uuid[gpu["uuid"]])
            for key in ("index", "name", "uuid"):
                found.pop(key)
            gpu["nvlink_errors"] = found
        else:
            gpu["nvlink_errors"] = {**nvlink_errors_summary([]), "state": "unreadable",
                                    "reason": f"{gpu['uuid']} is missing from the output of "
                                    f"{NVLINK_ERRORS_COMMAND}"}  # fmt: skip
    return list(errors.get("problems", [])) if errors["state"] == "ok" else []


def add_mig_instances(system: System, gpus: list[Result]) -> Result | None:
    """Each GPU's ``gpu_instances`` (``gpu_record.parse_gpu_instances``, without ``gpu``): []
    for a GPU not in MIG mode, the listed instances for one in MIG mode, or None for one in MIG
    mode where ``nvidia-smi mig -lgi`` could not be read. Returns the listing's state (None: no
    GPU is in MIG mode, the listing was not run), so an unreadable listing is never mistaken
    for a GPU without instances.
    """
    in_mig = [gpu for gpu in gpus if (gpu.get("mig_mode") or {}).get("current") is True]
    for gpu in gpus:
        gpu["gpu_instances"] = []
    if not in_mig:
        return None
    completed = system.run(["nvidia-smi", "mig", "-lgi"])
    listing: Result = {"state": "ok", "command": MIG_INSTANCES_COMMAND, "reason": ""}
    lines = (completed.stdout + "\n" + completed.stderr).splitlines()
    instances, problem = parse_gpu_instances(lines)
    nothing_listed = any(line.strip() in NOTHING_LISTED for line in lines)
    by_index = {gpu["index"]: gpu for gpu in in_mig}
    if completed.missing:
        listing = {**listing, "state": "unreadable", "reason": "nvidia-smi is not installed"}
    elif completed.exit_code is None:
        failure = nvidia_smi_failure(MIG_INSTANCES_COMMAND, None, completed.stderr)
        listing = {**listing, "state": "unreadable", "reason": failure["reason"]}
    elif completed.exit_code != 0 and not instances and not nothing_listed:
        # It exits 6 with "No GPU instances found.": that is an answer, not a failure.
        output = completed.stdout + completed.stderr
        failure = nvidia_smi_failure(MIG_INSTANCES_COMMAND, completed.exit_code, output)
        listing = {**listing, "state": "unreadable", "reason": failure["reason"]}
    elif problem:
        listing = {**listing, "state": "unreadable", "reason": problem}
    elif unknown := sorted({each["gpu"] for each in instances} - set(by_index)):
        listing = {
            **listing,
            "state": "unreadable",
            "reason": f"instances of GPU {unknown[0]}, which is not a GPU in MIG mode here",
        }
    if listing["state"] != "ok":
        for gpu in in_mig:
            gpu["gpu_instances"] = None
        return listing
    for instance in instances:
        index = instance.pop("gpu")
        by_index[index]["gpu_instances"].append(instance)
    return listing


def kernel_module(system: System, gpu_section: Result, nvml_state: Result) -> Result:
    """Loaded, not loaded, or unknown (GPUs answer but the module's procfs is not visible)."""
    for path in (MODULE_VERSION_PATH, SYSFS_MODULE_VERSION_PATH):
        text = system.read(path)
        if text is not None:
            return {"state": "loaded", "source": path, **parse_module_version(text)}
    if gpu_section["state"] == "driver_not_loaded" or nvml_state.get("driver_not_loaded"):
        return {
            "state": "not_loaded",
            "version": None,
            "flavor": None,
            "reason": "the driver reports that it is not loaded",
        }
    if gpu_section["state"] == "ok":
        reason = (
            f"GPUs answer but {MODULE_VERSION_PATH} is absent "
            "(a container without the driver's procfs, or simulated GPUs)"
        )
        return {"state": "unknown", "version": None, "flavor": None, "reason": reason}
    return {
        "state": "not_loaded",
        "version": None,
        "flavor": None,
        "reason": f"no {MODULE_VERSION_PATH}, no {SYSFS_MODULE_VERSION_PATH} and no answering GPU",
    }


def installed_driver(system: System) -> tuple[dict[str, str], str | None]:
    """Installed driver package versions, and where they were read."""
    completed = system.run(["dpkg-query", "-W", "-f", DPKG_FORMAT, *DPKG_PATTERNS])
    installed = parse_dpkg_versions(completed.stdout)
    if installed:
        return installed, "dpkg"
    return {}, None


def fabric_manager(system: System) -> Result:
    completed = system.run(
        [
            "systemctl",
            "show",
            FABRIC_MANAGER_UNIT,
            "--property=" + ",".join(FABRIC_MANAGER_PROPERTIES),
        ]
    )
    if completed.missing:
        return {"state": "unknown", "reason": "systemctl is not installed"}
    if completed.exit_code != 0:
        return {
            "state": "unknown",
            "reason": f"systemctl show failed: {completed.stderr.strip()[:200]}",
        }
    return fabric_manager_state(parse_systemctl_show(completed.stdout))


def xid_events(system: System, since: datetime, gpus: list[Result]) -> Result:
    since_utc = since.astimezone(timezone.utc)  # noqa: UP017 - nodes may run Python 3.10
    # journalctl 252 (Debian 12) does not take ISO 8601's "T"; this form it takes everywhere.
    argv = [
        "journalctl",
        "-t",
        "kernel",
        "--since",
        since_utc.strftime("%Y-%m-%d %H:%M:%S UTC"),
        "-o",
        "short-iso",
        "--no-pager",
        "-q",
    ]
    completed = system.run(argv)
    since_text = since_utc.isoformat()
    if completed.missing:
        return {**unreadable(XID_COMMAND, "journalctl is not installed"), "since": since_text}
    if completed.exit_code != 0:
        reason = f"exit code {completed.exit_code}: {completed.stderr.strip()[:300]}"
        return {**unreadable(XID_COMMAND, reason), "since": since_text}
    if "not seeing messages from other users and the system" in completed.stderr:
        reason = "the system journal is not readable by this user (run as root)"
        return {**unreadable(XID_COMMAND, reason), "since": since_text}
    result = parse_xid_events(completed.stdout)
    result["since"] = since_text
    indexes = {bus_key(gpu.get("pci_bus_id")): gpu["index"] for gpu in gpus}
    for event in result.get("events", []):
        event["gpu_index"] = indexes.get(bus_key(event.get("pci")))
    return result


def collect(system: System, nvml: Any, nvml_origin: str, xid_since: datetime | None) -> Result:
    """The whole report; every section says itself whether it could be read."""
    gpu_section, nvml_state = read_gpus(system, nvml, nvml_origin)
    gpus = list(gpu_section.get("gpus", []))
    problems: Result = {}
    mig_listing = None
    if gpu_section["state"] == "ok":
        problems["nvlink"] = add_nvlink_status(system, gpus)
        problems["nvlink_errors"] = add_nvlink_errors(system, gpus)
        mig_listing = add_mig_instances(system, gpus)
    module = kernel_module(system, gpu_section, nvml_state)
    installed, installed_source = installed_driver(system)
    userspace = gpu_section.get("driver_version") or gpu_section.get("nvml_library_version")
    mismatch_reported = (
        gpu_section.get("exit_code") == 18
        or "mismatch" in str(nvml_state.get("reason", "")).lower()
    )
    since = xid_since or system.now() - timedelta(hours=XID_WINDOW_HOURS)
    source = {"ok": "nvml" if gpu_section["command"] == "NVML" else "nvidia-smi"}.get(
        gpu_section["state"]
    )
    return {
        "schema": SCHEMA,
        "probe": {"python": sys.version.split()[0]},  # as platform.python_version() says
        "state": gpu_section["state"],
        "reason": gpu_section.get("reason", ""),
        "source": source,
        "nvml": nvml_state,
        "driver_version": gpu_section.get("driver_version"),
        "cuda_driver_version": gpu_section.get("cuda_driver_version"),
        "attached_gpus": gpu_section.get("attached_gpus"),
        "gpu_count": len(gpus) if gpu_section["state"] == "ok" else None,
        "gpus": gpus,
        # GPUs the driver could not open at all (not in ``gpus``), or exit status 15's one.
        "lost_gpus": gpu_section.get("lost_gpus") or [],
        "mig_listing": mig_listing,  # None: no GPU in MIG mode, nothing listed
        "kernel_module": module,
        "driver_versions": version_comparison(
            module.get("version"), userspace, installed, installed_source, mismatch_reported
        ),
        "fabric_manager": fabric_manager(system),
        "xid_events": xid_events(system, since, gpus),
        "problems": problems,  # tool -> the lines of its output not read
    }


def parse_since(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)  # noqa: UP017


class UnsafeTextfile(Exception):
    """The textfile's place is a link: root writes nothing through it."""


def write_atomically(path: str, content: str) -> None:
    """node_exporter must never read half a file: write beside it, then rename.

    The probe runs as root in a directory others may write to (node_exporter's textfile
    directory, shared with other writers): it writes through no link. A directory or file
    that is a link is refused; the new file is made under a name nobody can guess, created
    exclusively and never through a link (O_EXCL, O_NOFOLLOW), in the directory opened
    once and used by descriptor, then renamed over the old one.
    """
    directory = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    os.makedirs(directory, exist_ok=True)
    if os.path.realpath(directory) != directory:
        raise UnsafeTextfile(f"{directory} is, or lies under, a symbolic link: not written")
    directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            if stat.S_ISLNK(os.stat(name, dir_fd=directory_fd, follow_symlinks=False).st_mode):
                raise UnsafeTextfile(f"{path} is a symbolic link: not written")
        except FileNotFoundError:
            pass
        temporary = f".{name}.{secrets.token_hex(8)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        descriptor = os.open(temporary, flags, 0o644, dir_fd=directory_fd)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
                stream.write(content)
                stream.flush()
                os.fchmod(stream.fileno(), 0o644)  # whatever the umask
            os.rename(temporary, name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=directory_fd)
            raise
    finally:
        os.close(directory_fd)


USAGE = """usage: gpu_probe [--xid-since TIME] [--no-nvml] [--prometheus FILE]
                 [--expected-gpus N] [--expected-nvlinks N] [--expected-persistence {on,off}]
                 [--certificate PEM ...]

  --xid-since TIME        ISO 8601 time (default: 24 h ago)
  --no-nvml               read nvidia-smi, not NVML
  --prometheus FILE       write node_exporter textfile metrics, not JSON
  --expected-gpus N       GPUs the inventory expects (metrics)
  --expected-nvlinks N    NVLinks per GPU expected up (metrics)
  --expected-persistence  persistence mode the inventory wants (metrics): on or off
  --certificate PEM       a certificate whose expiry the metrics report (repeatable)
"""


class UsageError(ValueError):
    pass


if TYPE_CHECKING:

    class Options(NamedTuple):
        xid_since: datetime | None = None
        no_nvml: bool = False
        prometheus: str | None = None
        expected_gpus: int | None = None
        expected_nvlinks: int | None = None
        expected_persistence: str | None = None
        certificate: tuple[str, ...] = ()

else:
    _OPTION_FIELDS = (
        "xid_since", "no_nvml", "prometheus", "expected_gpus", "expected_nvlinks",
        "expected_persistence", "certificate",
    )  # fmt: skip
    Options = collections.namedtuple(
        "Options", _OPTION_FIELDS, defaults=(None, False, None, None, None, None, ())
    )


def _count(text: str) -> int:
    if not text.isdigit():
        raise UsageError(f"not a count: {text!r}")
    return int(text)


def _persistence(text: str) -> str:
    if text not in ("on", "off"):
        raise UsageError(f"invalid choice: {text!r} (choose from 'on', 'off')")
    return text


def _since(text: str) -> datetime:
    try:
        return parse_since(text)
    except ValueError as error:
        raise UsageError(f"not an ISO 8601 time: {text!r}") from error


# Option -> (field, how its value is read; None: a flag). Parsed by hand: argparse and the
# gettext and locale modules it imports cost a sixth of the probe's CPU on every check.
_OPTIONS: dict[str, tuple[str, Any]] = {
    "--xid-since": ("xid_since", _since),
    "--no-nvml": ("no_nvml", None),
    "--prometheus": ("prometheus", str),
    "--expected-gpus": ("expected_gpus", _count),
    "--expected-nvlinks": ("expected_nvlinks", _count),
    "--expected-persistence": ("expected_persistence", _persistence),
    "--certificate": ("certificate", str),
}


def parse_arguments(argv: list[str]) -> Options:
    """The probe's options; UsageError names what is wrong."""
    values: dict[str, Any] = {}
    certificates: list[str] = []
    arguments = list(argv)
    while arguments:
        argument = arguments.pop(0)
        option, has_value, inline = argument.partition("=")
        if option not in _OPTIONS:
            raise UsageError(f"unrecognized argument: {argument!r}")
        field, read = _OPTIONS[option]
        if read is None:
            if has_value:
                raise UsageError(f"{option} takes no value")
            values[field] = True
            continue
        if not has_value:
            if not arguments:
                raise UsageError(f"{option} expects a value")
            inline = arguments.pop(0)
        value = read(inline)
        if field == "certificate":
            certificates.append(value)
        else:
            values[field] = value
    return Options(**values, certificate=tuple(certificates))


def main(argv: list[str], system: System | None = None) -> int:
    """The probe's command line; ``system``: the node as it reads it (default: ``System()``;
    the drift check's frame passes one that answers unit states from its one systemctl)."""
    system = system or System()
    if any(argument in ("-h", "--help") for argument in argv):
        sys.stdout.write(USAGE)
        return 0
    try:
        options = parse_arguments(argv)
    except UsageError as error:
        sys.stderr.write(f"{USAGE}gpu_probe: error: {error}\n")
        return 2
    nvml, origin = (None, "disabled by --no-nvml") if options.no_nvml else load_pynvml()
    try:
        report = collect(system, nvml, origin, options.xid_since)
    except Exception as error:  # a probe bug must still leave one JSON document
        report = {
            "schema": SCHEMA,
            "state": "unreadable",
            "reason": f"probe error: {error!r}",
            "gpus": [],
        }
    if options.prometheus:
        # Only the installed copy writes metrics: the probe the drift check ships over SSH
        # carries no renderer (see parsers.probe_program).
        textfile = _load_module(TEXTFILE_MODULE)
        certificates = [textfile.certificate_expiry(system, path) for path in options.certificate]
        persistence = options.expected_persistence
        expected = textfile.Expected(
            options.expected_gpus,
            options.expected_nvlinks,
            None if persistence is None else persistence == "on",
        )
        content = textfile.render_prometheus(report, expected, certificates)
        try:
            write_atomically(options.prometheus, content)
        except UnsafeTextfile as error:
            sys.stderr.write(f"gpu_probe: {error}\n")
            return 1
        return 0
    sys.stdout.write(json.dumps(report, sort_keys=True, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

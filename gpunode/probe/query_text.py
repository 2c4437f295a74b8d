"""GPU records from ``nvidia-smi -q`` text (what a customer pastes, what nvidia-bug-report.sh
holds), the same record ``gpu_record.gpu_from_xml`` builds from the XML, as far as the text
says it: identity, ECC counts (by SRAM and DRAM where split), retired pages, remapped rows,
clocks event reasons, PCIe link, temperature and its slowdown threshold, utilization, fabric
state, the recovery action, and whether the GPU is lost. A field the text does not give is
None, as in the XML record.

The text is read by ``parsers.parse_query_text`` (nesting by indentation). A GPU whose
Retired Pages or Remapped Rows section cannot be read keeps its other fields, and the
section's reason is named in ``problems``: one odd line never costs the whole report.
"""

from __future__ import annotations

import re
from typing import Any

from gpunode.probe import gpu_record
from gpunode.probe.gpu_record import (
    RECORD_KEYS,
    Result,
    clean,
    integer,
    lost_evidence,
    never_raises,
    recovery_action_value,
    unreadable,
    yes_no,
)
from gpunode.probe.parsers import (
    _Problem,
    _query_remapped_rows,
    _query_retired_pages,
    over_long_lines,
    parse_query_text,
)

QUERY_COMMAND = "nvidia-smi -q"
# nvidia-smi -q's words for each clocks event reason -> the XML's (and the record's) names.
REASON_WORDS = {
    "idle": "gpu_idle",
    "applications clocks setting": "applications_clocks_setting",
    "sw power cap": "sw_power_cap",
    "hw slowdown": "hw_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power brake slowdown": "hw_power_brake_slowdown",
    "sync boost": "sync_boost",
    "sw thermal slowdown": "sw_thermal_slowdown",
    "display clock setting": "display_clocks_setting",
}


def _at(section: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(section, dict):
            return None
        section = section.get(key)
    return section


def _text(section: Any, *path: str) -> str | None:
    value = _at(section, *path)
    return clean(value) if isinstance(value, str) else None


def _leaves(section: Any) -> list[str]:
    if isinstance(section, str):
        return [section]
    if isinstance(section, dict):
        return [leaf for value in section.values() for leaf in _leaves(value)]
    return []


def _ecc(section: Any) -> tuple[Result, Result | None]:
    """(``ecc_errors``, ``ecc_memory``) from "ECC Errors": per memory (driver 525 on: "SRAM
    Uncorrectable ...", "DRAM Uncorrectable") or per kind (older: "Double Bit" > "Total")."""
    totals: Result = {}
    memory: Result = {}
    for scope in ("volatile", "aggregate"):
        counters = _at(section, scope.capitalize())
        counts: dict[str, int | None] = {"corrected": None, "uncorrected": None}
        split: Result = {"sram": None, "dram": None}
        if isinstance(counters, dict):
            old = {"corrected": "Single Bit", "uncorrected": "Double Bit"}
            if any(isinstance(counters.get(word), dict) for word in old.values()):
                counts = {
                    kind: integer(_text(counters, word, "Total")) for kind, word in old.items()
                }
            for key, value in counters.items():
                count = integer(value) if isinstance(value, str) else None
                if count is None:
                    continue
                words = key.lower()
                kind = "uncorrected" if "uncorrectable" in words else (
                    "corrected" if "correctable" in words else None)  # fmt: skip
                if kind is None:
                    continue
                counts[kind] = (counts[kind] or 0) + count
                where = words.split(" ", 1)[0]
                if kind == "uncorrected" and where in split:
                    split[where] = (split[where] or 0) + count
        totals[scope] = counts
        memory[scope] = split
    exceeded = yes_no(_text(section, "Aggregate", "SRAM Threshold Exceeded"))
    if exceeded is None and all(v is None for scope in memory.values() for v in scope.values()):
        return totals, None
    return totals, {**memory, "sram_threshold_exceeded": exceeded}


def _reasons(section: Any) -> list[str] | None:
    if not isinstance(section, dict):
        return None
    states = {
        REASON_WORDS[key.lower()]: value.strip().lower()
        for key, value in section.items()
        if isinstance(value, str) and key.lower() in REASON_WORDS
    }
    known = {name: state for name, state in states.items() if state in ("active", "not active")}
    return sorted(name for name, state in known.items() if state == "active") if known else None


def _gpu(position: int, bus_id: str, gpu: dict[str, Any], problems: list[str]) -> Result:
    record: Result = dict.fromkeys(RECORD_KEYS)
    ecc_errors, ecc_memory = _ecc(gpu.get("ECC Errors"))
    reasons = gpu.get("Clocks Event Reasons", gpu.get("Clocks Throttle Reasons"))
    link = _at(gpu, "PCI", "GPU Link Info")
    action = _text(gpu, "GPU Recovery Action")
    record.update(
        index=position,
        minor_number=integer(_text(gpu, "Minor Number")),
        uuid=_text(gpu, "GPU UUID"),
        serial=_text(gpu, "Serial Number"),
        name=_text(gpu, "Product Name"),
        pci_bus_id=bus_id,
        persistence_mode=gpu_record.enabled(_text(gpu, "Persistence Mode")),
        ecc_errors=ecc_errors,
        ecc_memory=ecc_memory,
        clock_event_reasons=_reasons(reasons),
        pcie={
            "gen_current": integer(_text(link, "PCIe Generation", "Current")),
            "gen_max": integer(_text(link, "PCIe Generation", "Max")),
            "width_current": integer(_text(link, "Link Width", "Current")),
            "width_max": integer(_text(link, "Link Width", "Max")),
        },
        temperature_c={
            "gpu": integer(_text(gpu, "Temperature", "GPU Current Temp")),
            "memory": integer(_text(gpu, "Temperature", "Memory Current Temp")),
        },
        temperature_slowdown_c=integer(_text(gpu, "Temperature", "GPU Slowdown Temp")),
        temperature_tlimit_c={
            "current": integer(_text(gpu, "Temperature", "GPU T.Limit Temp")),
            "slowdown": integer(_text(gpu, "Temperature", "GPU Slowdown T.Limit Temp")),
        },
        utilization_percent={
            "gpu": integer(_text(gpu, "Utilization", "GPU")),
            "memory": integer(_text(gpu, "Utilization", "Memory")),
        },
        fabric={"state": _text(gpu, "Fabric", "State"), "status": _text(gpu, "Fabric", "Status")},
        recovery_action=recovery_action_value(action),
        recovery_action_text=action if recovery_action_value(action) is None else None,
    )
    for key, read in (
        ("retired_pages", _query_retired_pages),
        ("remapped_rows", _query_remapped_rows),
    ):
        title = "Retired Pages" if key == "retired_pages" else "Remapped Rows"
        try:
            record[key] = read(gpu.get(title), bus_id) if title in gpu else None
        except _Problem as problem:
            problems.append(str(problem))
    evidence = lost_evidence(_leaves(gpu), [record["uuid"], record["serial"]])
    record.update(lost=evidence is not None, lost_evidence=evidence)
    return record


@never_raises(QUERY_COMMAND)
def parse_query_gpus(text: str) -> Result:
    """``nvidia-smi -q`` text -> driver version and one record per GPU listed, with the
    sections that could not be read named in ``problems``."""
    if not text.strip():
        return unreadable(QUERY_COMMAND, "empty output")
    if problem := over_long_lines(text):
        return unreadable(QUERY_COMMAND, problem)
    header, gpus = parse_query_text(text)
    attached = integer(_text(header, "Attached GPUs"))
    if not gpus:
        return unreadable(QUERY_COMMAND, "no 'GPU <bus id>' section")
    problems: list[str] = []
    if attached is not None and attached != len(gpus):
        problems.append(f"'Attached GPUs' says {attached} but {len(gpus)} are listed (cut short?)")
    records = [_gpu(position, bus, gpu, problems) for position, (bus, gpu) in enumerate(gpus)]
    return {
        "state": "ok",
        "command": QUERY_COMMAND,
        "driver_version": _text(header, "Driver Version"),
        "attached_gpus": attached,
        "gpus": records,
        "problems": problems,
    }


# "GPU 00000000:00:09.0" opens a GPU's section of -q text; "==============NVSMI LOG" its head.
LOOKS_LIKE_QUERY = re.compile(r"^(?:=+NVSMI LOG=+|Attached GPUs\s+:)", re.MULTILINE)

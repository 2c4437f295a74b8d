"""GPU facts from ``nvidia-smi -q -x``, plus the MIG listings and compute processes.

The XML report is used rather than ``--query-gpu``: an older driver rejects a whole
``--query-gpu`` call that names a field it does not know, while XML elements that a driver
generation renamed (``power_readings`` -> ``gpu_power_readings``, ``clocks_throttle_reasons``
-> ``clocks_event_reasons``) are simply looked up under both names.

The XML names no MIG profile (its ``mig_devices`` carry instance ids only), so the same command
(one SSH round trip) also prints ``nvidia-smi mig -lgi``, ``-lci``, ``-lgip``, ``-lgipp`` and the
compute processes, each its own part of one ``gpunode.framing`` command, run only when the
XML report was read; the tables are read by their rows only.
"""

from __future__ import annotations

import re
from typing import Any

from pyinfra.api import FactBase

from gpunode import framing
from gpunode.probe import gpu_record

# Far above an 8-GPU node's XML report (about 300 kB) and its MIG listings; a longer output
# is garbage or hostile and is not parsed. Table lines longer than any nvidia-smi prints are
# not handed to the row patterns.
MAX_OUTPUT_CHARS = 8 << 20
MAX_LINE_CHARS = 4096
COMMAND = "nvidia-smi -q -x"
XML_PART = "xml"  # the framing part of the XML report; the listings' parts are SECTIONS' names
# One query says whether any GPU has MIG enabled (now or pending): only then are the four MIG
# listings read, so a node without MIG pays one nvidia-smi call, not four, on every read.
# Exit 0: some GPU has MIG; 1: none has; 2: the query failed (the listings are then unread).
MIG_GATE_PART = "mig_enabled"
MIG_GATE = (
    "modes=$(nvidia-smi --query-gpu=mig.mode.current,mig.mode.pending --format=csv,noheader) "
    '|| exit 2; case "$modes" in *Enabled*) exit 0 ;; *) exit 1 ;; esac'
)
MIG_LISTING_SECTIONS = ("gpu_instances", "compute_instances", "mig_profiles", "mig_placements")
# Printed after the XML when it was read; nvidia-smi's answers, their exit codes do not matter.
SECTIONS = {
    "gpu_instances": "nvidia-smi mig -lgi",
    "compute_instances": "nvidia-smi mig -lci",
    "mig_profiles": "nvidia-smi mig -lgip",
    "mig_placements": "nvidia-smi mig -lgipp",
    "compute_apps": "nvidia-smi --query-compute-apps=gpu_uuid,pid --format=csv,noheader",
}
COMPUTE_INSTANCE_ROW = re.compile(
    r"\|\s*(?P<gpu>\d+)\s+(?P<gpu_instance>\d+)\s+MIG (?P<profile>\S+)\s+(?P<profile_id>\d+)"
    r"\s+(?P<id>\d+)\s+(?P<start>\d+):(?P<size>\d+)\s*\|"
)
PROFILE_ROW = re.compile(
    r"\|\s*(?P<gpu>\d+)\s+MIG (?P<name>\S+)\s+(?P<id>\d+)\s+(?P<free>\d+)/(?P<total>\d+)"
    r"\s+(?P<memory>[0-9.]+)\s+\S+\s+(?P<sm>\d+)\s+\d+\s+\d+\s*\|"
)
PROFILE_ENGINES_ROW = re.compile(r"\|\s+\d+\s+\d+\s+\d+\s*\|")  # second line: CE JPEG OFA
PLACEMENTS_LINE = re.compile(
    r"GPU\s+(?P<gpu>\d+) Profile ID\s+(?P<id>\d+) Placements?\s*:\s*"
    r"\{(?P<starts>[0-9,]+)\}:(?P<size>\d+)"
)
COMPUTE_APP_LINE = re.compile(r"(?P<uuid>GPU-[0-9A-Fa-f-]+),\s*(?P<pid>\d+)")

# nvidia-smi exit codes worth naming (nvidia-smi(1), RETURN VALUE).
EXIT_REASONS = {
    9: "NVIDIA driver is not loaded",
    14: "infoROM is corrupted",
    15: "GPU has fallen off the bus",
}


def with_mig_listings(record: dict[str, Any]) -> dict[str, Any]:
    """One GPU record (``gpu_record``), with room for what the MIG listings add."""
    return {
        **record,
        # Filled from the MIG sections of the fact's command (GpuDevices), empty without them.
        "mig_profiles": {},
        "gpu_instances": [],
        "compute_pids": [],
    }


def parse_nvidia_smi_xml(lines: list[str]) -> dict[str, Any]:
    """Turn the fact command's output into a report; never raises on bad output."""
    xml = framing.parse(lines).part(XML_PART)
    if xml.absent:
        return {"state": "absent", "reason": "nvidia-smi is not installed", "gpus": []}
    if xml.problem is not None:
        return _unreadable(f"{COMMAND}: {xml.problem}")
    exit_code = xml.exit_status
    lines = xml.lines
    body = "\n".join(lines).strip()
    if exit_code not in (None, 0):
        reason = EXIT_REASONS.get(exit_code, f"exit code {exit_code}")
        return _unreadable(f"{COMMAND} failed: {reason}: {body[:200]}")
    if not body:
        return _unreadable(f"{COMMAND} printed nothing")
    parsed = gpu_record.parse_nvidia_smi_xml(body)
    if parsed["state"] != "ok":
        return _unreadable(f"{COMMAND}: {parsed['reason']}")
    gpus = [with_mig_listings(gpu) for gpu in parsed["gpus"]]
    return {
        "state": "ok",
        "reason": "",
        "driver_version": parsed["driver_version"],
        "cuda_version": parsed["cuda_driver_version"],
        "gpus": gpus,
    }


def _unreadable(reason: str) -> dict[str, Any]:
    return {"state": "unreadable", "reason": reason, "gpus": []}


def parse_fact_output(lines: list[str]) -> dict[str, Any]:
    """The XML report, with the MIG listings and compute processes merged into its GPUs.

    ``listing_problems`` names each section that could not be read (missing, or a line that is
    neither a table row, a border nor a known "nothing found" message), so a caller never
    mistakes an unreadable listing for an empty one.
    """
    size = sum(len(line) + 1 for line in lines)
    if size > MAX_OUTPUT_CHARS:
        return _unreadable(f"{COMMAND} output is {size} characters (over {MAX_OUTPUT_CHARS})")
    frame = framing.parse(
        lines, [XML_PART, MIG_GATE_PART, *SECTIONS], max_line_chars=MAX_LINE_CHARS
    )
    no_mig = frame.part(MIG_GATE_PART).exit_status == 1
    report = parse_nvidia_smi_xml(lines)
    if report["state"] != "ok":
        return report
    problems: dict[str, str] = {}
    by_index = {gpu["index"]: gpu for gpu in report["gpus"]}
    for name in SECTIONS:
        part = frame.part(name)
        if part.skipped and no_mig and name in MIG_LISTING_SECTIONS:
            continue  # no GPU has MIG enabled: there is nothing to list
        if part.skipped:
            problems[name] = f"{SECTIONS[name]} was not run"
            continue
        if part.problem is not None:
            problems[name] = f"{SECTIONS[name]}: {part.problem}"
            continue
        problem = SECTION_PARSERS[name](part.lines, by_index)
        if problem:
            problems[name] = f"{SECTIONS[name]}: {problem}"
    report["listing_problems"] = problems
    return report


def _parse_gpu_instances(lines: list[str], gpus: dict[int, dict[str, Any]]) -> str:
    # The probe reads the same listing with the same parser (gpu.mig_layout compares it).
    instances, problem = gpu_record.parse_gpu_instances(lines)
    for instance in instances:
        index = instance.pop("gpu")
        gpu = gpus.get(index)
        if gpu is None:
            return f"GPU {index} is not in the XML report"
        gpu["gpu_instances"].append({**instance, "compute_instances": []})
    return problem


def _parse_compute_instances(lines: list[str], gpus: dict[int, dict[str, Any]]) -> str:
    rows, problem = gpu_record.table_rows(lines, COMPUTE_INSTANCE_ROW)
    for row in rows:
        instances = gpus.get(int(row["gpu"]), {}).get("gpu_instances", [])
        parent = next((i for i in instances if i["id"] == int(row["gpu_instance"])), None)
        if parent is None:
            return f"compute instance of unknown GPU instance {row['gpu']}/{row['gpu_instance']}"
        parent["compute_instances"].append(
            {"id": int(row["id"]), "profile": row["profile"], "profile_id": int(row["profile_id"])}
        )
    return problem


def _parse_mig_profiles(lines: list[str], gpus: dict[int, dict[str, Any]]) -> str:
    rows, problem = gpu_record.table_rows(lines, PROFILE_ROW, PROFILE_ENGINES_ROW)
    for row in rows:
        gpu = gpus.get(int(row["gpu"]))
        if gpu is None:
            return f"GPU {row['gpu']} is not in the XML report"
        gpu["mig_profiles"][row["name"]] = {
            "id": int(row["id"]),
            "free": int(row["free"]),
            "total": int(row["total"]),
            "memory_gib": float(row["memory"]),
            "placements": None,  # from -lgipp
            "size": None,
        }
    return problem


def _parse_mig_placements(lines: list[str], gpus: dict[int, dict[str, Any]]) -> str:
    for line in (line.strip() for line in lines):
        if not line or line in gpu_record.NOTHING_LISTED:
            continue
        match = PLACEMENTS_LINE.fullmatch(line)
        if match is None:
            return f"unexpected line {line[:120]!r}"
        profiles = gpus.get(int(match["gpu"]), {}).get("mig_profiles", {})
        for profile in profiles.values():
            if profile["id"] == int(match["id"]):
                profile["placements"] = [int(start) for start in match["starts"].split(",")]
                profile["size"] = int(match["size"])
    return ""


def _parse_compute_apps(lines: list[str], gpus: dict[int, dict[str, Any]]) -> str:
    by_uuid = {gpu["uuid"]: gpu for gpu in gpus.values()}
    for line in (line.strip() for line in lines):
        if not line:
            continue
        match = COMPUTE_APP_LINE.fullmatch(line)
        if match is None:
            return f"unexpected line {line[:120]!r}"
        if match["uuid"] in by_uuid:
            by_uuid[match["uuid"]]["compute_pids"].append(int(match["pid"]))
    return ""


SECTION_PARSERS = {
    "gpu_instances": _parse_gpu_instances,
    "compute_instances": _parse_compute_instances,
    "mig_profiles": _parse_mig_profiles,
    "mig_placements": _parse_mig_placements,
    "compute_apps": _parse_compute_apps,
}


class GpuDevices(FactBase):
    """
    Every GPU the NVIDIA driver reports, with the settings gpunode converges.

    .. code:: python

        {
            "state": "ok",  # or "absent" (no nvidia-smi) / "unreadable" (reason says why)
            "reason": "",
            "driver_version": "550.127.08",
            # Each GPU is the one record of gpunode.probe.gpu_record (what the drift check
            # and the metrics read too), plus the MIG listings and compute processes:
            "gpus": [{"index": 0, "uuid": "GPU-...", "persistence_mode": True, ...,
                      "ecc_mode": {"current": True, "pending": True}, "power_w": {...},
                      "application_clocks_mhz": {"memory": 1593, "graphics": 1275} or None,
                      "supported_clocks_mhz": [{"memory": 1593, "graphics": [210, ...]}],
                      "mig_profiles": {"3g.40gb": {"id": 9, "total": 2, "placements": [0, 4],
                                                   "size": 4, ...}},
                      "gpu_instances": [{"id": 1, "profile": "3g.40gb", "start": 4, ...,
                                         "compute_instances": [{"id": 0, ...}]}],
                      "compute_pids": [4242]}],
            "listing_problems": {},  # section -> why it could not be read
        }
    """

    def requires_command(self) -> str:
        return "nvidia-smi"

    def command(self) -> str:
        # nvidia-smi prints its errors on stdout and stderr alike: both are the part's text.
        parts = [
            framing.Part(XML_PART, COMMAND, stderr="merge"),
            framing.Part(MIG_GATE_PART, MIG_GATE, stderr="drop", after=XML_PART),
        ]
        parts += [
            framing.Part(
                name,
                command,
                stderr="merge",
                after=MIG_GATE_PART if name in MIG_LISTING_SECTIONS else XML_PART,
            )
            for name, command in SECTIONS.items()
        ]
        return framing.command(parts)

    @staticmethod
    def default() -> dict[str, Any]:
        # What pyinfra returns when nvidia-smi (requires_command) is not installed.
        return {
            "state": "absent",
            "reason": "nvidia-smi is not installed",
            "gpus": [],
            "listing_problems": {},
        }

    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_fact_output(list(output))

"""Pure parsers of GPU-server hardware tool output, and the shell commands that produce it.

Every parser takes the text a command printed and returns a dict whose ``state`` says what
it is: ``ok`` (the data), ``unreadable`` (``reason`` says why: empty, truncated, malformed),
``absent`` (the tool is not installed), or for nvidia-smi ``driver_not_loaded``. ``command``
names the command the output came from. No parser raises and none returns a silent empty
list: where a list is empty, the output proved it empty.

Parsers (the ones the node-side probe also needs live in ``gpu_record`` and ``gpu_probe``
and are re-exported):

- ``parse_nvidia_smi_xml``: ``nvidia-smi -q -x``, every DTD version;
- ``parse_nvlink_status``: ``nvidia-smi nvlink -s``;
- ``parse_page_retirement``: ``nvidia-smi -q -d PAGE_RETIREMENT`` (and any full ``-q`` text);
- ``parse_ibstat``: ``ibstat``;
- ``parse_nvme_list``: ``nvme list -o json``;
- ``parse_xid_events``: kernel log lines with ``NVRM: Xid``;
- ``parse_ib_flaps``: InfiniBand carrier losses in syslog / journal lines;
- ``parse_gpu_report``: the JSON document of the probe (``gpu_probe``).

Sections: ``SECTION_COMMANDS`` maps a section name to one shell command that frames its tool's
output with ``gpunode.framing`` (stderr apart, exit status last, or the tool absent);
``parse_section(name, lines)`` turns that output into the parser's result. A composite fact
can run several sections as ONE command with ``combined_command(names)`` and split the
result with ``parse_combined(lines)``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import lzma
import re
import shlex
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from gpunode import framing
from gpunode.probe import gpu_probe, gpu_record, textfile
from gpunode.probe.gpu_probe import SCHEMA, XID_COMMAND, nvidia_smi_failure, parse_xid_events
from gpunode.probe.gpu_record import (
    NVLINK_COMMAND,
    XML_COMMAND,
    Result,
    absent,
    never_raises,
    parse_nvidia_smi_xml,
    parse_nvlink_status,
    unreadable,
)
from gpunode.sanitize import Bool, Int, ListOf, Maybe, Record, Str, parse_json

__all__ = [
    "SECTION_COMMANDS",
    "absent",
    "combined_command",
    "parse_combined",
    "parse_gpu_report",
    "parse_ib_flaps",
    "parse_ibstat",
    "parse_nvidia_smi_xml",
    "parse_nvlink_status",
    "parse_nvme_list",
    "parse_page_retirement",
    "parse_section",
    "parse_xid_events",
    "probe_command",
    "probe_part",
    "unreadable",
]

PAGE_RETIREMENT_COMMAND = "nvidia-smi -q -d PAGE_RETIREMENT"
IBSTAT_COMMAND = "ibstat"
NVME_COMMAND = "nvme list -o json"
IB_FLAPS_COMMAND = "journalctl -t systemd-networkd -t kernel -o short"
PROBE_COMMAND = "gpu_probe (python3 -)"
# The error counters of every RDMA device's ports, from sysfs (no tool needed): one line per
# counter, "<device>/ports/<n>/counters/<name> <value>". The names are the kernel's (ib_core's
# sysfs, as a real H100 node's tree in tests/fixtures/infiniband-sysfs shows them), those the
# health judge has thresholds for (gpunode.health.catalogue.IB_COUNTER_LIMITS).
IB_COUNTERS_ROOT = "/sys/class/infiniband"
IB_COUNTERS_COMMAND = f"cat {IB_COUNTERS_ROOT}/*/ports/*/counters/*"
IB_COUNTER_NAMES = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_xmit_discards",
)
_IB_COUNTER_LINE = re.compile(
    r"(?P<ca>[A-Za-z0-9_.-]{1,64})/ports/(?P<port>[0-9]{1,3})/counters/(?P<name>[a-z0-9_]{1,64})"
    r" (?P<value>[0-9]{1,20})"
)

LOG_WINDOW = "-24h"  # journalctl's relative --since, on the node's own clock

# Node output is read on the control side, in the gevent loop that serves every host: what
# one node prints must cost time in proportion to its size, and the size is bounded.
# No line of nvidia-smi's text, ibstat or the kernel log comes near this (printk's limit is
# 1024); the probe's JSON is one line, so it and nvme's JSON are bounded by the total only.
MAX_LINE_CHARS = gpu_record.MAX_LINE_CHARS
# Far above an 8-GPU node's largest section (nvidia-smi -q -x, about 300 kB).
MAX_OUTPUT_CHARS = 8 << 20


# --- nvidia-smi -q text (PAGE_RETIREMENT and full reports) ------------------------------------


class _Problem(Exception):
    """Text that cannot be trusted; becomes the unreadable result's reason."""


_QUERY_GPU = re.compile(r"GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*")


def over_long_lines(text: str, limit: int = MAX_LINE_CHARS) -> str | None:
    """Why ``text`` cannot be read line by line (its first line over ``limit``), or None."""
    for number, line in enumerate(text.splitlines(), 1):
        if len(line) > limit:
            return f"line {number} is {len(line)} characters long (over {limit}): not read"
    return None


def _query_line(line: str) -> tuple[int, str, str | None] | None:
    """One ``nvidia-smi -q`` line -> (indent, key, value or None for a section title).

    A value line is ``key : value``: the key ends at the first colon with a blank before it.
    Read with str methods, in one pass: a regex here backtracks quadratically on long blanks.
    """
    body = line.lstrip(" ")
    if not body or body[0].isspace():
        return None
    indent = len(line) - len(body)
    colon = body.find(":")
    while colon > 0 and not body[colon - 1].isspace():
        colon = body.find(":", colon + 1)
    if colon <= 0:
        return indent, body.rstrip(), None
    value = body[colon + 1 :]
    return indent, body[:colon].rstrip(), value.removeprefix(" ").rstrip()


def parse_query_text(text: str) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """``nvidia-smi -q`` text -> (header values, [(bus id, nested sections)]).

    Nesting follows indentation; a line without " : " opens a section.
    """
    header: dict[str, Any] = {}
    gpus: list[tuple[str, dict[str, Any]]] = []
    stack: list[tuple[int, dict[str, Any]]] = [(-1, header)]
    for line in text.splitlines():
        stripped = line.strip()
        banner = stripped.startswith("=") and stripped.endswith("=")
        if not stripped or (banner and stripped.strip("=") == "NVSMI LOG"):
            continue
        if match := _QUERY_GPU.fullmatch(line):
            sections: dict[str, Any] = {}
            gpus.append((match.group(1), sections))
            stack = [(-1, header), (0, sections)]
            continue
        parsed = _query_line(line)
        if parsed is None:  # a line indented with other blanks than spaces
            continue
        indent, key, value = parsed
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if value is not None:
            parent.setdefault(key, value)
        else:
            section: dict[str, Any] = {}
            parent.setdefault(key, section)
            stack.append((indent, section))
    return header, gpus


def _string(value: Any) -> str | None:
    """A value line's text; a section (a dict: the line lost its " : ") is no value."""
    return value if isinstance(value, str) else None


def _count(value: Any, where: str) -> int | None:
    if isinstance(value, dict):  # some drivers nest a count under the cause
        value = value.get("Count")
    if not isinstance(value, str) or gpu_record.clean(value) is None:
        return None
    if not re.fullmatch(r"[0-9]+", value.strip()):
        raise _Problem(f"{where}: {value!r} is not a count")
    return int(value)


def _flag(value: Any, where: str) -> bool | None:
    if not isinstance(value, str) or gpu_record.clean(value) is None:
        return None
    flag = gpu_record.yes_no(value)
    if flag is None:
        raise _Problem(f"{where}: {value!r} is neither Yes nor No")
    return flag


def _query_retired_pages(section: Any, bus_id: str) -> Result:
    if not isinstance(section, dict):
        return {"supported": False, "single_bit": None, "double_bit": None, "pending": None}
    pending_keys = [key for key in section if key.lower().startswith("pending")]
    missing = [k for k in ("Single Bit ECC", "Double Bit ECC") if k not in section]
    if missing or not pending_keys:
        raise _Problem(f"GPU {bus_id}: Retired Pages lacks {missing or 'Pending'} (truncated?)")
    where = f"GPU {bus_id} Retired Pages"
    single = _count(section["Single Bit ECC"], where)
    double = _count(section["Double Bit ECC"], where)
    flags = [_flag(section[key], where) for key in pending_keys]
    known = [flag for flag in flags if flag is not None]
    return {
        "supported": single is not None or double is not None,
        "single_bit": single,
        "double_bit": double,
        "pending": any(known) if known else None,
    }


def _query_remapped_rows(section: Any, bus_id: str) -> Result:
    keys = {
        "correctable": "Correctable Error",
        "uncorrectable": "Uncorrectable Error",
        "pending": "Pending",
        "failure": "Remapping Failure Occurred",
    }
    if not isinstance(section, dict):
        return {"supported": False, **dict.fromkeys(keys)}
    missing = [label for label in keys.values() if label not in section]
    if missing:
        raise _Problem(f"GPU {bus_id}: Remapped Rows lacks {missing} (truncated?)")
    where = f"GPU {bus_id} Remapped Rows"
    rows = {
        "correctable": _count(section[keys["correctable"]], where),
        "uncorrectable": _count(section[keys["uncorrectable"]], where),
        "pending": _flag(section[keys["pending"]], where),
        "failure": _flag(section[keys["failure"]], where),
    }
    return {"supported": any(value is not None for value in rows.values()), **rows}


@never_raises(PAGE_RETIREMENT_COMMAND)
def parse_page_retirement(text: str) -> Result:
    """Retired pages (and remapped rows where shown) per GPU from ``nvidia-smi -q`` text."""
    if not text.strip():
        return unreadable(PAGE_RETIREMENT_COMMAND, "empty output")
    if problem := over_long_lines(text):
        return unreadable(PAGE_RETIREMENT_COMMAND, problem)
    header, gpus = parse_query_text(text)
    attached = gpu_record.integer(_string(header.get("Attached GPUs")))
    if not gpus:
        return unreadable(PAGE_RETIREMENT_COMMAND, "no 'GPU <bus id>' section")
    if attached is None:
        return unreadable(PAGE_RETIREMENT_COMMAND, "no 'Attached GPUs' line: not -q output")
    if attached != len(gpus):
        return unreadable(
            PAGE_RETIREMENT_COMMAND,
            f"'Attached GPUs' says {attached} but {len(gpus)} are listed (truncated?)",
        )
    try:
        listed = []
        for bus_id, sections in gpus:
            if "Retired Pages" not in sections and "Remapped Rows" not in sections:
                raise _Problem(f"GPU {bus_id} has no Retired Pages section (truncated?)")
            listed.append(
                {
                    "pci_bus_id": bus_id,
                    "retired_pages": _query_retired_pages(sections.get("Retired Pages"), bus_id),
                    "remapped_rows": _query_remapped_rows(sections.get("Remapped Rows"), bus_id)
                    if "Remapped Rows" in sections
                    else None,
                }
            )
    except _Problem as problem:
        return unreadable(PAGE_RETIREMENT_COMMAND, str(problem))
    return {
        "state": "ok",
        "command": PAGE_RETIREMENT_COMMAND,
        "driver_version": gpu_record.clean(_string(header.get("Driver Version"))),
        "attached_gpus": attached,
        "gpus": listed,
    }


# --- ibstat -----------------------------------------------------------------------------------

# infiniband-diags' ibstat.c names each device by its node type: "CA 'mlx5_0'", and a
# switch's "Switch 'x'" (its first field is then "Switch type").
_IBSTAT_HEADER = re.compile(r"(CA|Switch|Router|iWARP RNIC|\?\?\?) '([^']+)'")
_IBSTAT_PORT = re.compile(r"Port ([0-9]+):")
# A field a later release adds may carry digits or punctuation in its name; it is kept as is.
_IBSTAT_KEY = re.compile(r"[A-Za-z][A-Za-z0-9 ()/_.+-]*")
_IBSTAT_RATE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(?: \(([A-Za-z0-9 ]+)\))?")
IBSTAT_NUMBERS = ("number_of_ports", "base_lid", "lmc", "sm_lid")
IBSTAT_PORT_REQUIRED = ("state", "physical_state", "rate", "link_layer")
IBSTAT_CA_REQUIRED = ("ca_type", "firmware_version")


def _ibstat_key(name: str) -> str:
    """``Physical state`` -> ``physical_state``; ``Port GUID (ext)`` -> ``port_guid_ext``."""
    return re.sub(r"[^a-z0-9]+", "_", name.strip().lower()).strip("_")


def _ibstat_field(body: str) -> tuple[str, str] | None:
    """``Key: value`` (indent removed) -> (key, value).

    Read with str methods: a regex ending in a lazy group and optional blanks backtracks
    quadratically on a long run of blanks.
    """
    key, colon, value = body.partition(":")
    if not colon or not _IBSTAT_KEY.fullmatch(key):
        return None
    return _ibstat_key(key), value.strip()


def _ibstat_value(key: str, value: str) -> tuple[Any, str | None, str | None]:
    """(value, a rate's name such as FDR10 or None, why it is unreadable or None)."""
    if key in IBSTAT_NUMBERS and re.fullmatch(r"[0-9]+", value):
        return int(value), None, None
    if key == "rate":  # Gb/s; SDR is 2.5; ibstat writes "56 (FDR10)" for FDR10 links
        match = _IBSTAT_RATE.fullmatch(value)
        if not match:
            return None, None, f"{value[:40]!r} is not a rate in Gb/s"
        rate = float(match[1])
        return (int(rate) if rate.is_integer() else rate), match[2], None
    return value, None, None


def _ibstat_level(indent: str, unit: str) -> int | None:
    """How many ``unit`` make up ``indent`` (None: not a whole number of them)."""
    if not unit or len(indent) % len(unit) or indent != unit * (len(indent) // len(unit)):
        return None
    return len(indent) // len(unit)


class _IbstatCa:
    """One CA while it is read: its record, its open port, its indent unit, its problems."""

    def __init__(self, name: str, node_type: str) -> None:
        self.record: Result = {"name": name, "node_type": node_type, "ports": [], "problems": []}
        self.port: Result | None = None
        self.unit: str | None = None

    def problem(self, message: str) -> None:
        self.record["problems"].append(message)

    def incomplete(self) -> list[str]:
        """Why this CA's listing is not whole (fields or ports missing); empty if it is."""
        ca = self.record
        found = []
        missing = [key for key in IBSTAT_CA_REQUIRED if key not in ca]
        if missing:
            found.append(f"CA {ca['name']} lacks {missing} (truncated?)")
        # A switch lists its management port 0 besides the ports it counts.
        listed = [each for each in ca["ports"] if each["port"] != 0]
        declared = ca.get("number_of_ports")
        if not isinstance(declared, int) or declared != len(listed):
            found.append(
                f"CA {ca['name']} declares {declared} ports but lists {len(listed)} (truncated?)"
            )
        for each in ca["ports"]:
            lacking = [key for key in IBSTAT_PORT_REQUIRED if key not in each]
            if lacking:
                found.append(f"CA {ca['name']} port {each['port']} lacks {lacking} (truncated?)")
        return found


def _ibstat_line(ca: _IbstatCa, line_number: int, line: str) -> None:
    """Read one indented line into ``ca``, or name it among the CA's problems."""
    over_long = len(line) > MAX_LINE_CHARS
    head = line[:MAX_LINE_CHARS].rstrip()
    body = head.lstrip(" \t")
    indent = head[: len(head) - len(body)]
    shown = f"{head[:120]!r}"
    if ca.unit is None and indent:
        ca.unit = indent  # releases and terminals differ: a tab, 8 spaces, 4 spaces...
    level = _ibstat_level(indent, ca.unit or "")
    if level == 1 and not over_long and (match := _IBSTAT_PORT.fullmatch(body)):
        ca.port = {"port": int(match[1])}
        ca.record["ports"].append(ca.port)
        return
    field = _ibstat_field(body) if level in (1, 2) else None
    if field is None:
        ca.problem(f"line {line_number} not understood: {shown}")
        return
    key, text_value = field
    if level == 2 and ca.port is None:
        ca.problem(f"line {line_number}: port field outside a port: {shown}")
        return
    if level == 1 and ca.port is not None:
        ca.problem(f"line {line_number}: CA field after its ports: {shown}")
        return
    target = ca.port if ca.port is not None else ca.record
    if key == f"{ca.record['node_type'].lower()}_type" and target is ca.record:
        key = "ca_type"  # "Switch type" is a switch's "CA type"
    if over_long:
        value: Any = None
        rate_name = None
        problem: str | None = (
            f"line {line_number} is {len(line)} characters long (over {MAX_LINE_CHARS}): not read"
        )
    else:
        value, rate_name, problem = _ibstat_value(key, text_value)
    target[key] = value
    if rate_name:
        target["rate_name"] = rate_name
    if problem:
        target.setdefault("unreadable", {})[key] = problem
        ca.problem(problem if over_long else f"line {line_number}: {key} {problem}")


@never_raises(IBSTAT_COMMAND)
def parse_ibstat(text: str) -> Result:
    """``ibstat`` -> CAs (type, firmware, GUIDs) with their ports, and the ports flattened.

    Tolerant of what differs between infiniband-diags releases and terminals: the indent unit
    is the first field line's (a tab, or spaces), fields are that unit once (CA) or twice
    (port); a field a release adds is kept under its own name. A line that is not understood,
    or a field whose value cannot be read (None, with the reason under the CA's or port's
    ``unreadable``), is named in its CA's ``problems`` and in ``problems``; every other CA is
    kept. The output is unreadable only when no CA reads whole, or when it ends inside a CA
    (cut short: CAs after it may be missing, and the ports counted would be wrong).
    """
    cas: list[_IbstatCa] = []
    before: list[str] = []  # lines before the first CA
    # Split at newlines only: str.splitlines also splits at \x85, \u2028 and others that a
    # node can put inside a line, and the line numbers named would no longer be the node's.
    for line_number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        head = line[:MAX_LINE_CHARS].rstrip()
        if len(line) <= MAX_LINE_CHARS and (match := _IBSTAT_HEADER.fullmatch(head)):
            cas.append(_IbstatCa(match[2], match[1]))
        elif not cas:
            before.append(f"line {line_number} comes before any CA: {head[:120]!r}")
        else:
            _ibstat_line(cas[-1], line_number, line)
    if not cas:
        if not text.strip():
            return unreadable(IBSTAT_COMMAND, "empty output")
        return unreadable(IBSTAT_COMMAND, before[0] if before else "no CA")
    for ca in cas[:-1]:  # followed by another CA: not cut short, only incomplete
        for message in ca.incomplete():
            ca.problem(message.removesuffix(" (truncated?)"))
    cut = cas[-1].incomplete()
    for message in cut:
        cas[-1].problem(message)
    whole = [ca for ca in cas if not ca.record["problems"]]
    if not whole:
        first = next(ca for ca in cas if ca.record["problems"])
        return unreadable(IBSTAT_COMMAND, first.record["problems"][0])
    if cut:
        return unreadable(IBSTAT_COMMAND, cut[0])
    records = [ca.record for ca in cas]
    ports = [
        {
            "ca": ca["name"],
            "ca_type": ca.get("ca_type"),
            "firmware_version": ca.get("firmware_version"),
        }
        | each
        for ca in records
        for each in ca["ports"]
    ]
    problems = before + [message for ca in records for message in ca["problems"]]
    return {
        "state": "ok",
        "command": IBSTAT_COMMAND,
        "cas": records,
        "ports": ports,
        "problems": problems,
    }


# --- nvme list -o json ------------------------------------------------------------------------

NVME_FIELDS = {
    "device_path": "DevicePath",
    "generic_path": "GenericPath",
    "namespace": "NameSpace",
    "model": "ModelNumber",
    "serial": "SerialNumber",
    "firmware": "Firmware",
    "physical_size": "PhysicalSize",
    "used_bytes": "UsedBytes",
    "sector_size": "SectorSize",
    "maximum_lba": "MaximumLBA",
}
NVME_NUMBERS = ("namespace", "physical_size", "used_bytes", "sector_size", "maximum_lba")


@never_raises(NVME_COMMAND)
def parse_nvme_list(text: str) -> Result:
    """``nvme list -o json`` (nvme-cli 1.x/2.x flat listing) -> NVMe namespaces."""
    if not text.strip():
        # nvme-cli prints nothing when it finds no device: not proof of zero drives.
        return unreadable(NVME_COMMAND, "empty output")
    try:
        document = parse_json(text)
    except ValueError as error:
        return unreadable(NVME_COMMAND, f"not JSON, truncated or corrupted ({error})")
    if not isinstance(document, dict) or not isinstance(document.get("Devices"), list):
        return unreadable(NVME_COMMAND, "no 'Devices' list at the top level")
    devices = []
    for position, entry in enumerate(document["Devices"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("DevicePath"), str):
            return unreadable(NVME_COMMAND, f"device {position} has no DevicePath")
        device: Result = {}
        for field, key in NVME_FIELDS.items():
            value = entry.get(key)
            if field in NVME_NUMBERS:
                ok = isinstance(value, int) and not isinstance(value, bool)
                device[field] = value if ok else None
            else:
                device[field] = value.strip() if isinstance(value, str) else None
        devices.append(device)
    return {"state": "ok", "command": NVME_COMMAND, "devices": devices}


# --- syslog: InfiniBand link flaps ------------------------------------------------------------

_SYSLOG_LINE = re.compile(
    r"(?P<time>[A-Z][a-z]{2} [ 0-9]\d \d{2}:\d{2}:\d{2}"
    r"|\d{4}-\d{2}-\d{2}T[0-9:.]+(?:Z|[+-][0-9:]+)?)"
    r" (?P<host>\S+) (?P<tag>[^\s:\[]+)(?:\[\d+\])?: (?P<message>.*)"
)
_CARRIER = re.compile(r"(?P<interface>[^\s:]+): (?P<event>[Ll]ost|[Gg]ained) carrier\s*")
_INFINIBAND_INTERFACE = re.compile(r"ib[0-9a-z]*")


def ib_counters_shell() -> str:
    """POSIX sh printing each counter of ``IB_COUNTER_NAMES`` of every port, prefixed by its
    path under the root: a node without RDMA devices prints nothing and exits 0."""
    names = " ".join(IB_COUNTER_NAMES)
    root = shlex.quote(IB_COUNTERS_ROOT)
    return (
        f'for port in {root}/*/ports/*; do [ -d "$port/counters" ] || continue; '
        f'for name in {names}; do counter="$port/counters/$name"; '
        f'[ -r "$counter" ] || continue; '
        f'printf \'%s %s\\n\' "${{counter#{IB_COUNTERS_ROOT}/}}" "$(cat "$counter")"; '
        "done; done; :"
    )


@never_raises(IB_COUNTERS_COMMAND)
def parse_ib_counters(text: str) -> Result:
    """``ib_counters_shell``'s output -> one record per port (``ca``, ``port``, ``counters``:
    name -> count), in device and port order.

    A line that is not "<device>/ports/<n>/counters/<name> <count>" (a counter the driver could
    not read prints an error, a value that is no count) is named in ``problems`` and its port's
    ``problems``; every counter read is kept. No output: no RDMA device, no port.
    """
    ports: dict[tuple[str, int], Result] = {}
    problems: list[str] = []
    for line_number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_CHARS:
            problems.append(f"line {line_number} is {len(line)} characters long")
            continue
        match = _IB_COUNTER_LINE.fullmatch(line.strip())
        if match is None:
            problems.append(f"line {line_number} not understood: {line[:120]!r}")
            continue
        key = (match["ca"], int(match["port"]))
        port = ports.setdefault(key, {"ca": key[0], "port": key[1], "counters": {}})
        port["counters"][match["name"]] = int(match["value"])
    return {
        "state": "ok",
        "command": IB_COUNTERS_COMMAND,
        "ports": [ports[key] for key in sorted(ports)],
        "problems": problems,
    }


@never_raises(IB_FLAPS_COMMAND)
def parse_ib_flaps(text: str, empty_ok: bool = False) -> Result:
    """Syslog or ``journalctl -o short`` lines -> carrier losses per InfiniBand interface.

    A flap is a "lost carrier" (systemd-networkd); "gained carrier" lines are counted as
    recoveries. ``empty_ok``: no line at all is a valid answer (the journal had none).
    """
    # A syslog line's time, host and tag come first: a line over the limit is read by its head.
    lines = [
        line[:MAX_LINE_CHARS]
        for line in text.splitlines()
        if line.strip() and not line.startswith("-- ")
    ]
    if not lines and not empty_ok:
        return unreadable(IB_FLAPS_COMMAND, "empty output")
    flaps: dict[str, int] = {}
    recoveries: dict[str, int] = {}
    others: dict[str, int] = {}
    times: list[str] = []
    syslog_lines = 0
    for line in lines:
        match = _SYSLOG_LINE.fullmatch(line.rstrip())
        if not match:
            continue
        syslog_lines += 1
        carrier = _CARRIER.fullmatch(match.group("message"))
        if not carrier:
            continue
        interface = carrier.group("interface")
        lost = carrier.group("event").lower() == "lost"
        if not _INFINIBAND_INTERFACE.fullmatch(interface):
            if lost:
                others[interface] = others.get(interface, 0) + 1
            continue
        counts = flaps if lost else recoveries
        counts[interface] = counts.get(interface, 0) + 1
        if lost:
            times.append(match.group("time"))
    if lines and not syslog_lines:
        return unreadable(IB_FLAPS_COMMAND, "no syslog-formatted line")
    return {
        "state": "ok",
        "command": IB_FLAPS_COMMAND,
        "lines_read": len(lines),
        "unparsed_lines": len(lines) - syslog_lines,
        "flaps": flaps,
        "total_flaps": sum(flaps.values()),
        "recoveries": recoveries,
        "other_carrier_losses": others,
        "first_flap": times[0] if times else None,
        "last_flap": times[-1] if times else None,
    }


# --- the probe's JSON -------------------------------------------------------------------------

REPORT_STATES = ("ok", "driver_not_loaded", "absent", "unreadable")
REPORT_KEYS = ("state", "gpus", "kernel_module", "driver_versions", "fabric_manager", "xid_events")

_COUNT = Maybe(Int)
_FLAG = Maybe(Bool)
_TEXT = Maybe(Str)
_ECC_COUNTS = Maybe(Record({"corrected": _COUNT, "uncorrected": _COUNT}))
_MEMORY_COUNTS = Maybe(Record({"sram": _COUNT, "dram": _COUNT}))
GPU_SHAPE = Record(
    {
        "index": _COUNT,
        "uuid": _TEXT,
        "name": _TEXT,
        "pci_bus_id": _TEXT,
        "persistence_mode": _FLAG,
        "ecc_mode": Maybe(Record({"current": _FLAG, "pending": _FLAG})),
        "ecc_errors": Maybe(Record({"volatile": _ECC_COUNTS, "aggregate": _ECC_COUNTS})),
        "remapped_rows": Maybe(
            Record(
                {
                    "correctable": _COUNT,
                    "uncorrectable": _COUNT,
                    "pending": _FLAG,
                    "failure": _FLAG,
                }
            )
        ),
        "retired_pages": Maybe(
            Record({"single_bit": _COUNT, "double_bit": _COUNT, "pending": _FLAG})
        ),
        "nvlink": Maybe(
            Record(
                {
                    "state": _TEXT,
                    "active": _COUNT,
                    "total": _COUNT,
                    "problems": Maybe(ListOf(Str)),
                    "source": _TEXT,
                    "links": Maybe(ListOf(Record({"link": _COUNT, "active": _FLAG}))),
                }
            )
        ),
        "nvlink_errors": Maybe(
            Record(
                {
                    "state": _TEXT,
                    "reason": _TEXT,
                    "source": _TEXT,
                    "links": Maybe(
                        ListOf(
                            Record(
                                {
                                    "link": _COUNT,
                                    "replay": _COUNT,
                                    "recovery": _COUNT,
                                    "crc": _COUNT,
                                }
                            )
                        )
                    ),
                }
            )
        ),
        "clock_event_reasons": Maybe(ListOf(Str)),
        "mig_mode": Maybe(Record({"current": _FLAG, "pending": _FLAG})),
        # None: in MIG mode, but the listing was unreadable (the report's mig_listing says why).
        "gpu_instances": Maybe(
            ListOf(
                Record(
                    {
                        "id": _COUNT,
                        "profile": _TEXT,
                        "profile_id": _COUNT,
                        "start": _COUNT,
                        "size": _COUNT,
                    }
                )
            )
        ),
        "pcie": Maybe(
            Record(
                {
                    "gen_current": _COUNT,
                    "gen_max": _COUNT,
                    "width_current": _COUNT,
                    "width_max": _COUNT,
                }
            )
        ),
        "lost": _FLAG,
        "lost_evidence": _TEXT,
        "ecc_memory": Maybe(
            Record(
                {
                    "volatile": _MEMORY_COUNTS,
                    "aggregate": _MEMORY_COUNTS,
                    "sram_threshold_exceeded": _FLAG,
                }
            )
        ),
        "recovery_action": _COUNT,
        "recovery_action_text": _TEXT,
        # Read by the link, clock and fabric health judges (gpunode.health).
        "temperature_c": Maybe(Record({"gpu": _COUNT})),
        "temperature_slowdown_c": _COUNT,
        "temperature_tlimit_c": Maybe(Record({"current": _COUNT, "slowdown": _COUNT})),
        "utilization_percent": Maybe(Record({"gpu": _COUNT})),
        "fabric": Maybe(Record({"state": _TEXT, "status": _TEXT})),
    }
)
LOST_GPU_SHAPE = Record({"pci_bus_id": _TEXT, "index": _COUNT, "message": _TEXT})
XID_EVENT_SHAPE = Record({"xid": _COUNT, "pci": _TEXT, "time": _TEXT, "message": _TEXT})
SXID_EVENT_SHAPE = Record(
    {"sxid": _COUNT, "switch": _COUNT, "pci": _TEXT, "time": _TEXT, "fatal": _FLAG,
     "message": _TEXT}
)  # fmt: skip
# Every field of the report that the control side reads (the drift rules, the metrics), with
# its type: a report that does not fit is unreadable, naming the first field that does not.
GPU_REPORT_SHAPE = Record(
    {
        "schema": Str,
        "state": Str,
        "reason": _TEXT,
        "driver_version": _TEXT,
        "gpus": ListOf(GPU_SHAPE),
        "lost_gpus": Maybe(ListOf(LOST_GPU_SHAPE)),
        "driver_versions": Maybe(
            Record(
                {
                    "mismatch": _FLAG,
                    "kernel_module": _TEXT,
                    "userspace": _TEXT,
                    "installed_package": _TEXT,
                }
            )
        ),
        "fabric_manager": Maybe(Record({"state": _TEXT})),
        "mig_listing": Maybe(Record({"state": _TEXT, "reason": _TEXT})),
        "kernel_module": Maybe(Record({"state": _TEXT, "version": _TEXT})),
        "xid_events": Maybe(
            Record(
                {
                    "state": _TEXT,
                    "events": ListOf(XID_EVENT_SHAPE),
                    "sxid_events": Maybe(ListOf(SXID_EVENT_SHAPE)),
                }
            )
        ),
        # Lines of a tool's output the probe could not read, by tool.
        "problems": Maybe(
            Record({"nvlink": Maybe(ListOf(Str)), "nvlink_errors": Maybe(ListOf(Str))})
        ),
    }
)


@never_raises(PROBE_COMMAND)
def parse_gpu_report(text: str) -> Result:
    """The probe's JSON document, checked to be one whole report of the known schema."""
    if not text.strip():
        return unreadable(PROBE_COMMAND, "empty output")
    try:
        report = parse_json(text)
    except ValueError as error:
        return unreadable(PROBE_COMMAND, f"not JSON, truncated or corrupted ({error})")
    if not isinstance(report, dict) or report.get("schema") != SCHEMA:
        schema = report.get("schema") if isinstance(report, dict) else None
        return unreadable(PROBE_COMMAND, f"not a {SCHEMA} document (schema {schema!r})")
    state = report.get("state")
    if state not in REPORT_STATES:
        return unreadable(PROBE_COMMAND, f"unknown report state {state!r}")
    if state == "ok":
        missing = [key for key in REPORT_KEYS if key not in report]
        if missing:
            return unreadable(PROBE_COMMAND, f"report lacks {missing}")
    elif not isinstance(report.get("reason"), str) or not report["reason"]:
        return unreadable(PROBE_COMMAND, f"report in state {state!r} gives no reason")
    gpus = report.get("gpus")
    if not isinstance(gpus, list) or not all(isinstance(gpu, dict) for gpu in gpus):
        return unreadable(PROBE_COMMAND, "'gpus' is not a list of GPU objects")
    if problem := GPU_REPORT_SHAPE.problem(report):
        return unreadable(PROBE_COMMAND, f"malformed report: {problem}")
    return {**report, "command": PROBE_COMMAND}


# --- commands ---------------------------------------------------------------------------------


def framed(command: str, program: str) -> str:
    """``command`` as one POSIX sh command framed by ``gpunode.framing`` (one part, named
    after ``program``): stdout passes through, stderr is captured and printed after it, the
    exit status comes last, so output cut short shows as such. If ``program`` is not
    installed the part is reported absent. The shell always exits 0: pyinfra fails a fact
    whose command fails, and a failure here is data.
    """
    return framing.command([framing.Part(program, command, requires=program)])


def framed_part(command: str, program: str) -> framing.Part:
    """The part ``framed`` runs, for a fact that frames it and leaves the check that
    ``program`` is installed to pyinfra (``requires_command``) or to a FactBatch."""
    return framing.Part(program, command)


# Where roles.gpu_metrics installs the probe (and the pure-Python pynvml beside it).
PROBE_INSTALL_DIR = "/usr/local/lib/gpunode-probe"


def _find_pynvml() -> Path | None:
    """pynvml.py (NVIDIA's nvidia-ml-py) on the control side, found without importing it."""
    for entry in sys.path:
        candidate = Path(entry or ".") / "pynvml.py"
        if candidate.is_file():
            return candidate
    return None


def probe_program(ship_pynvml: bool = True) -> str:
    """Python source that runs the probe; with ``ship_pynvml`` it carries pynvml along.

    Each module is registered in ``sys.modules`` before its code runs, as an import would.
    """
    lines = ["import sys, types"]
    modules: dict[str, tuple[str, str]] = {}
    pynvml_path = _find_pynvml() if ship_pynvml else None
    if pynvml_path is not None:
        modules["pynvml"] = (pynvml_path.read_text(encoding="utf-8"), "pynvml.py (shipped)")
    # The GPU record's parser first: gpu_probe imports it under its package name.
    record_source = Path(gpu_record.__file__).read_text(encoding="utf-8")
    modules[gpu_probe.RECORD_MODULE] = (record_source, "gpu_record.py")
    probe_source = Path(gpu_probe.__file__).read_text(encoding="utf-8")
    modules["gpunode_gpu_probe"] = (probe_source, "gpu_probe.py")
    for name, (source, filename) in modules.items():
        lines += [
            f"_module = types.ModuleType({name!r})",
            f"_module.__file__ = {filename!r}",
            f"sys.modules[{name!r}] = _module",
            f"exec(compile({source!r}, {filename!r}, 'exec'), _module.__dict__)",
        ]
    lines.append("sys.exit(sys.modules['gpunode_gpu_probe'].main(sys.argv[1:]))")
    return "\n".join(lines) + "\n"


@functools.cache
def _probe_payload(ship_pynvml: bool) -> str:
    """The probe program, compressed and encoded once per process (it is ~400 kB of source)."""
    program = probe_program(ship_pynvml).encode()
    # xz's default preset: 0.4 kB more than 9e (76 kB in all, under the 128 kB limit), in
    # half the CPU, on every drift check.
    return base64.b64encode(lzma.compress(program)).decode()


def installed_probe_files(ship_pynvml: bool = True) -> dict[str, Path]:
    """What ``roles.gpu_metrics`` installs in ``PROBE_INSTALL_DIR``: file name -> source here."""
    files = {
        "gpu_probe.py": Path(gpu_probe.__file__),
        "gpu_record.py": Path(gpu_record.__file__),
        "textfile.py": Path(textfile.__file__),
    }
    pynvml_path = _find_pynvml() if ship_pynvml else None
    if pynvml_path is not None:
        files["pynvml.py"] = pynvml_path
    return files


@functools.cache
def _installed_digests(ship_pynvml: bool) -> tuple[tuple[str, str], ...]:
    """(file name, sha256) of each file ``roles.gpu_metrics`` installs."""
    return tuple(
        (name, hashlib.sha256(source.read_bytes()).hexdigest())
        for name, source in installed_probe_files(ship_pynvml).items()
    )


@functools.cache
def _installed_checksums(ship_pynvml: bool, installed_dir: str) -> str:
    """``sha256sum -c`` input naming the installed copies of this very probe."""
    return "".join(
        f"{hashlib.sha256(source.read_bytes()).hexdigest()}  {installed_dir}/{name}\n"
        for name, source in installed_probe_files(ship_pynvml).items()
    )


def probe_command(
    xid_since: str | None = None,
    ship_pynvml: bool = True,
    installed_dir: str = PROBE_INSTALL_DIR,
) -> str:
    """ONE shell command that runs the probe (``probe_part``'s, framed)."""
    return framing.command([probe_part(xid_since, ship_pynvml, installed_dir)])


def probe_part(
    xid_since: str | None = None,
    ship_pynvml: bool = True,
    installed_dir: str = PROBE_INSTALL_DIR,
) -> framing.Part:
    """The probe as one frame part: the node's installed copy where it is this very probe
    (``roles.gpu_metrics`` installs it; every file's sha256 is checked first), else the probe
    from its source, carried in the command: nothing need be installed on the node.

    The installed copy spares the node unpacking and compiling ~400 kB of source on every
    check. The program travels xz-compressed and base64-encoded inside the command (about
    70 kB with pynvml, under Linux's 128 kB limit on one argument); ``python3 -c`` unpacks it
    from stdin with the standard library alone. Its Python form runs in the frame's one
    Python process (gpunode.framing), beside the other facts' Python parts.
    """
    arguments: list[str] = []
    if xid_since is not None:
        gpu_probe.parse_since(xid_since)  # bad input fails here, on the control side
        arguments = ["--xid-since", xid_since]
    shell_arguments = "".join(f" {shlex.quote(argument)}" for argument in arguments)
    payload = _probe_payload(ship_pynvml)
    unpack = (
        "import base64,lzma,sys;"
        'exec(compile(lzma.decompress(base64.b64decode(sys.stdin.read())),"gpu_probe","exec"))'
    )
    shipped = f"printf '%s\\n' {payload} | python3 -I -c '{unpack}'{shell_arguments}"
    # Without pynvml: never the installed copy, which would find the installed pynvml.
    checksums = _installed_digests(ship_pynvml) if ship_pynvml else ()
    python = framing.python_source(
        _PROBE_PYTHON,
        directory=installed_dir,
        checksums=checksums,
        arguments=tuple(arguments),
        payload=payload,
        unit=gpu_probe.FABRIC_MANAGER_UNIT,
        properties=gpu_probe.FABRIC_MANAGER_PROPERTIES,
        dpkg_dir=framing.DPKG_DIR,
    )
    units = (gpu_probe.FABRIC_MANAGER_UNIT,)
    if not ship_pynvml:
        return framing.Part(
            "python3", shipped, requires="python3", python=python, systemd_units=units
        )
    listed = shlex.quote(_installed_checksums(ship_pynvml, installed_dir))
    # Imported, not run as a script: Python keeps an imported module's compiled code
    # (__pycache__, written by root), where a script's 40 kB are compiled on every check.
    entry = (
        f"import sys; sys.path.insert(0, {installed_dir!r}); import gpu_probe; "
        "sys.exit(gpu_probe.main(sys.argv[1:]))"
    )
    installed = f"python3 -I -c {shlex.quote(entry)}{shell_arguments}"
    verified = f"printf '%s' {listed} | sha256sum -c --status - 2>/dev/null"
    command = f"if {verified}; then {installed}; else {shipped}; fi"
    return framing.Part("python3", command, requires="python3", python=python, systemd_units=units)


# probe_part's Python form: the installed copy, imported, where every file's sha256 is this
# probe's (no checksums: never), else the shipped program, run as a script would be.
_PROBE_PYTHON = r"""
import hashlib, os, sys
def installed():
    if not checksums:
        return False
    for name, digest in checksums:
        try:
            with open(os.path.join(directory, name), "rb") as source:
                if hashlib.sha256(source.read()).hexdigest() != digest:
                    return False
        except OSError:
            return False
    return True
if installed():
    sys.path.insert(0, directory)
    import gpu_probe
    class FrameSystem(gpu_probe.System):
        # The Fabric Manager's state from the frame's one systemctl, the driver's packages from
        # its one read of dpkg's database (gpunode.framing).
        def run(self, argv, timeout=60.0):
            asked = ["systemctl", "show", unit, "--property=" + ",".join(properties)]
            known = unit_properties(unit) if argv == asked else {}
            if all(name in known for name in properties):
                shown = "".join(f"{name}={known[name]}\n" for name in properties)
                return gpu_probe.Completed(0, shown, "")
            if argv == ["dpkg-query", "-W", "-f", gpu_probe.DPKG_FORMAT, *gpu_probe.DPKG_PATTERNS]:
                answer = installed_packages(gpu_probe.DPKG_PATTERNS)
                if answer is not None:
                    return answer
            return super().run(argv, timeout)
    def installed_packages(patterns):
        # What the probe reads of dpkg-query -W's answer: the lines of packages in any state
        # but not-installed (the probe reads installed ones alone), "no packages found" and
        # exit status 1 for a pattern that matches none.
        import fnmatch
        def chosen(name):
            return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
        found = dpkg_packages(dpkg_dir, chosen)
        if found is None:
            return None
        lines = "".join(
            f"{package}\t{version}\t{abbrev}\n"
            for abbrev, package, version in found
            if abbrev[1] != "n"
        )
        names = [package for _, package, _ in found]
        unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in names)]
        errors = "".join(f"dpkg-query: no packages found matching {p}\n" for p in unmatched)
        return gpu_probe.Completed(1 if unmatched else 0, lines, errors)
    sys.exit(gpu_probe.main(list(arguments), FrameSystem()))
import base64, lzma
program = lzma.decompress(base64.b64decode(payload))
sys.argv = ["gpu_probe", *arguments]
exec(compile(program, "gpu_probe", "exec"), {"__name__": "__main__"})
"""


def _nvidia_smi(arguments: str) -> str:
    return framed(f"nvidia-smi {arguments}", "nvidia-smi")


class _SectionCommands(Mapping[str, str]):
    """Section name -> its command; the GPU probe's is made when first asked for: it carries
    the probe's source, xz-compressed (a third of a second of CPU), which a deploy that
    imports this module for the other sections never sends."""

    def __init__(self, commands: dict[str, str | Callable[[], str]]) -> None:
        self._commands = commands

    def __getitem__(self, name: str) -> str:
        command = self._commands[name]
        if callable(command):
            command = self._commands[name] = command()
        return command

    def __iter__(self) -> Iterator[str]:
        return iter(self._commands)

    def __len__(self) -> int:
        return len(self._commands)


SECTION_COMMANDS: Mapping[str, str] = _SectionCommands(
    {
        "gpu": probe_command,
        "nvidia_smi_xml": _nvidia_smi("-q -x"),
        "nvlink": _nvidia_smi("nvlink -s"),
        "page_retirement": _nvidia_smi("-q -d PAGE_RETIREMENT"),
        "xid": framed(
            f"journalctl -t kernel --since {LOG_WINDOW} -o short-iso --no-pager -q", "journalctl"
        ),
        "ib_flaps": framed(
            f"journalctl -t systemd-networkd -t kernel --since {LOG_WINDOW} -o short --no-pager -q",
            "journalctl",
        ),
        "ibstat": framed("ibstat", "ibstat"),
        "ib_counters": framing.command([framing.Part("ib_counters", ib_counters_shell())]),
        "nvme": framed("nvme list -o json", "nvme"),
    }
)

SECTION_TITLES = {
    "gpu": PROBE_COMMAND,
    "nvidia_smi_xml": XML_COMMAND,
    "nvlink": NVLINK_COMMAND,
    "page_retirement": PAGE_RETIREMENT_COMMAND,
    "xid": XID_COMMAND,
    "ib_flaps": IB_FLAPS_COMMAND,
    "ibstat": IBSTAT_COMMAND,
    "ib_counters": IB_COUNTERS_COMMAND,
    "nvme": NVME_COMMAND,
}
NVIDIA_SMI_SECTIONS = ("nvidia_smi_xml", "nvlink", "page_retirement")
JOURNAL_SECTIONS = ("xid", "ib_flaps")
JOURNAL_NOT_READABLE = "not seeing messages from other users and the system"

SECTION_PARSERS: Mapping[str, Callable[[str], Result]] = {
    "gpu": parse_gpu_report,
    "nvidia_smi_xml": parse_nvidia_smi_xml,
    # Called after exit 0 only: no output then means no GPU has NVLink.
    "nvlink": lambda text: parse_nvlink_status(text, empty_ok=True),
    "page_retirement": parse_page_retirement,
    "xid": parse_xid_events,
    "ib_flaps": lambda text: parse_ib_flaps(text, empty_ok=True),
    "ibstat": parse_ibstat,
    "ib_counters": parse_ib_counters,
    "nvme": parse_nvme_list,
}


def parse_section(name: str, lines: Iterable[str]) -> Result:
    """The output of ``SECTION_COMMANDS[name]`` -> that section's parser result."""
    if name not in SECTION_PARSERS:
        return unreadable(name, f"unknown section; known: {', '.join(SECTION_PARSERS)}")
    title = SECTION_TITLES[name]
    lines = list(lines)
    size = sum(len(line) + 1 for line in lines)
    if size > MAX_OUTPUT_CHARS:
        return unreadable(title, f"output is {size} characters (over {MAX_OUTPUT_CHARS}): not read")
    if not any(line.strip() for line in lines):
        return unreadable(title, "empty output")
    frame = framing.parse(lines)
    if not frame.framed:
        return unreadable(title, "output is not framed (no frame header): not read")
    if len(frame.parts) != 1:
        return unreadable(title, f"{len(frame.parts)} parts in the output, not one (truncated?)")
    (output,) = frame.parts.values()
    if output.absent:
        return absent(title, f"{output.name} is not installed")
    if output.exit_status is None:
        if not output.lines and not output.stderr:
            return unreadable(title, "empty output")
        return unreadable(title, "output ends without the command's exit status (truncated)")
    if output.exit_status != 0:
        if name in NVIDIA_SMI_SECTIONS:
            return nvidia_smi_failure(
                title, output.exit_status, "\n".join(output.lines + output.stderr)
            )
        detail = " ".join(" ".join(output.stderr or output.lines).split())[:300]
        return unreadable(title, f"exit code {output.exit_status}: {detail or 'no message'}")
    if name in JOURNAL_SECTIONS and any(JOURNAL_NOT_READABLE in line for line in output.stderr):
        return unreadable(title, "the system journal is not readable by this user (run as root)")
    result = SECTION_PARSERS[name]("\n".join(output.lines))
    if output.stderr and result.get("state") == "ok":
        result["stderr"] = output.stderr
    return result


def combined_command(names: Iterable[str] | None = None) -> str:
    """Several sections as ONE shell command (one SSH round trip); see ``parse_combined``.
    Each section is a part whose output is that section's own framed output."""
    chosen = list(SECTION_COMMANDS if names is None else names)
    unknown = [name for name in chosen if name not in SECTION_COMMANDS]
    if unknown:
        raise ValueError(f"unknown sections {unknown}; known: {', '.join(SECTION_COMMANDS)}")
    return framing.command(framing.Part(name, SECTION_COMMANDS[name]) for name in chosen)


def parse_combined(lines: Iterable[str], names: Iterable[str] | None = None) -> dict[str, Result]:
    """The output of ``combined_command(names)`` -> each section's result by name."""
    chosen = list(SECTION_COMMANDS if names is None else names)
    frame = framing.parse(lines, chosen)
    results = {}
    for name in chosen:
        part = frame.part(name)
        title = SECTION_TITLES.get(name, name)
        if name not in frame.parts:
            results[name] = unreadable(title, "section missing from the output (cut short)")
        elif part.problem is not None:
            results[name] = unreadable(title, part.problem)
        else:
            results[name] = parse_section(name, part.lines)
    return results


# --- dcgmi diag -j ----------------------------------------------------------------------------
# DCGM's diagnostic as JSON: {"DCGM GPU Diagnostic": {"test_categories": [{"category",
# "tests": [{"name", "results": [{"gpu_ids", "status", "warnings"?, "info"?}]}]}], "version"}},
# with "runtime_error" where it could not run. Statuses PASS / FAIL / WARN / SKIPPED (the JSON
# format comment in NVIDIA/DCGM's nvvs sources; read 2026-12-02), spelled "Pass", "Fail"... by
# other releases (DCGM's own python tests compare "Fail"). What dcgmi
# prints before the document (a "WARNING:" line in NVIDIA's real-output test case,
# tests/fixtures/dcgm) is not JSON and is skipped; `null` entries between tests are that
# document's own and carry nothing.

DCGM_DIAG_COMMAND = "dcgmi diag -j"
DCGM_DIAG_ROOT = "DCGM GPU Diagnostic"  # DCGM 3
# DCGM 4 names its root "DCGM Diagnostic" and adds, beside it, "entity_groups" (each GPU's
# id and serial) and "metadata" ("version", "Driver Version Detected"); each result names its
# entity ("entity_group" "GPU", "entity_id" 0) and each test has a "test_summary" whose status
# and warnings cover what no entity carries. Read in NVIDIA/DCGM 4.6.0 (commit 72fa3fe):
# dcgmi/Diag.cpp HelperJsonBuildOutput, nvvs/include/NvvsJsonStrings.h and
# testing/python3/dcgm_diag_schema.json; read 2026-12-07.
DCGM4_DIAG_ROOT = "DCGM Diagnostic"
DCGM4_DRIVER_VERSION = "Driver Version Detected"
DCGM_STATUSES = {
    "pass": "pass",
    "fail": "fail",
    "warn": "warn",
    "warning": "warn",
    "skip": "skip",
    "skipped": "skip",
    "not run": "not_run",
    "notrun": "not_run",
}
MAX_DCGM_DIAG_CHARS = 4 << 20  # far above 8 GPUs at level 4; longer is garbage or hostile
# What DCGM 4 prints where a part has no serial number (a GB10's entity list).
DCGM_NO_SERIAL = "<<<NOT_SUPPORTED>>>"


def _dcgm_text(value: Any) -> str:
    """A warning or info item: a string, or an object's message (keys differ by release)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        for key in ("warning", "message", "msg"):
            if isinstance(value.get(key), str):
                return str(value[key])
    return ""


def _dcgm_serials(document: dict[str, Any]) -> dict[tuple[str, int], str]:
    """DCGM 4's entity list: (entity group, entity id) -> serial number, where it has one."""
    serials: dict[tuple[str, int], str] = {}
    groups = document.get("entity_groups")
    for group in groups if isinstance(groups, list) else []:
        if not isinstance(group, dict) or not isinstance(group.get("entities"), list):
            continue
        for entity in group["entities"]:
            if not isinstance(entity, dict):
                continue
            serial, number = entity.get("serial_num"), entity.get("entity_id")
            if (
                isinstance(serial, str)
                and serial
                and serial != DCGM_NO_SERIAL
                and isinstance(number, int)
            ):
                serials[(str(group.get("entity_group")), number)] = serial
    return serials


def _dcgm_versions(document: dict[str, Any], root: dict[str, Any]) -> tuple[Any, Any]:
    """(DCGM version, driver version): DCGM 3 keeps the version in its root, DCGM 4 both in
    "metadata"."""
    found = document.get("metadata")
    metadata: dict[str, Any] = found if isinstance(found, dict) else {}
    version = root.get("version", metadata.get("version"))
    driver = metadata.get(DCGM4_DRIVER_VERSION)
    return (
        version if isinstance(version, str) else None,
        driver if isinstance(driver, str) else None,
    )


@never_raises(DCGM_DIAG_COMMAND)
def parse_dcgm_diag(text: str) -> Result:
    """``dcgmi diag -r LEVEL -j`` of DCGM 3 or 4 -> each test's name, category and status over
    its results (the worst: fail, then warn; pass when every result passed or skipped), each
    result's entity (GPU and serial where DCGM names them), status, DCGM's error ids and
    words, the failed tests' names and the first words DCGM gave for each; what cannot be
    read is named in ``problems``, what can is kept."""
    if len(text) > MAX_DCGM_DIAG_CHARS:
        return unreadable(DCGM_DIAG_COMMAND, f"{len(text)} characters of output")
    start = text.find("{")
    if start < 0:
        detail = " ".join(text.split())[:200]
        return unreadable(DCGM_DIAG_COMMAND, f"no JSON document: {detail or 'no output'}")
    try:
        document = parse_json(text[start:])
    except ValueError as error:
        return unreadable(DCGM_DIAG_COMMAND, f"not JSON, truncated or corrupted ({error})")
    if not isinstance(document, dict):
        return unreadable(DCGM_DIAG_COMMAND, f"no {DCGM_DIAG_ROOT!r} object")
    root = document.get(DCGM4_DIAG_ROOT, document.get(DCGM_DIAG_ROOT))
    if not isinstance(root, dict):
        return unreadable(
            DCGM_DIAG_COMMAND, f"no {DCGM_DIAG_ROOT!r} (DCGM 3) or {DCGM4_DIAG_ROOT!r} object"
        )
    if isinstance(root.get("runtime_error"), str) and root["runtime_error"]:
        return unreadable(DCGM_DIAG_COMMAND, f"DCGM: {root['runtime_error'][:200]}")
    categories = root.get("test_categories")
    if not isinstance(categories, list) or not categories:
        return unreadable(DCGM_DIAG_COMMAND, "no test_categories")
    serials = _dcgm_serials(document)
    tests: list[Result] = []
    problems: list[str] = []
    for category in categories:
        if not isinstance(category, dict) or not isinstance(category.get("tests"), list):
            problems.append(f"a category that is not an object with tests: {category!r:.80}")
            continue
        for test in category["tests"]:
            if test is None:
                continue  # DCGM 3's own separator entries
            read = _dcgm_test(test, str(category.get("category") or ""), problems, serials)
            if read is not None:
                tests.append(read)
    if not tests:
        return unreadable(DCGM_DIAG_COMMAND, problems[0] if problems else "no test result")
    version, driver_version = _dcgm_versions(document, root)
    return {
        "state": "ok",
        "command": DCGM_DIAG_COMMAND,
        "version": version,
        "driver_version": driver_version,
        "tests": tests,
        "failed": sorted({test["name"] for test in tests if test["status"] == "fail"}),
        "problems": problems,
    }


def _dcgm_entity(result: dict[str, Any], serials: dict[tuple[str, int], str]) -> Result:
    """Which part a result is about: DCGM 4's entity, DCGM 3's gpu_ids, or the test as a
    whole (DCGM 4's test_summary)."""
    group, number = result.get("entity_group"), result.get("entity_id")
    if isinstance(group, str) and isinstance(number, int):
        return {"entity": f"{group} {number}", "serial": serials.get((group, number))}
    ids = result.get("gpu_ids")
    if isinstance(ids, (int, str)) and str(ids).strip():
        return {"entity": f"GPU {ids}", "serial": None}
    return {"entity": None, "serial": None}


def _dcgm_result(
    result: Any, name: str, problems: list[str], serials: dict[tuple[str, int], str]
) -> Result | None:
    raw = result.get("status") if isinstance(result, dict) else None
    status = DCGM_STATUSES.get(" ".join(str(raw).split()).lower()) if raw else None
    if status is None:
        problems.append(f"test {name!r}: a result of unknown status {raw!r:.40}")
        return None
    words: list[str] = []
    error_ids: list[int] = []
    if status in ("fail", "warn"):
        for item in [*(result.get("warnings") or []), *(result.get("info") or [])]:
            if word := _dcgm_text(item):
                words.append(word)
            if isinstance(item, dict) and isinstance(item.get("error_id"), int):
                error_ids.append(item["error_id"])
    return {**_dcgm_entity(result, serials), "status": status, "detail": words[:3],
            "error_ids": error_ids}  # fmt: skip


def _dcgm_test(
    test: Any, category: str, problems: list[str], serials: dict[tuple[str, int], str]
) -> Result | None:
    if not isinstance(test, dict) or not isinstance(test.get("name"), str):
        problems.append(f"a test without a name: {test!r:.80}")
        return None
    name = test["name"]
    results = test.get("results")
    summary = test.get("test_summary")
    if (not isinstance(results, list) or not results) and not isinstance(summary, dict):
        problems.append(f"test {name!r}: no results")
        return None
    read = [_dcgm_result(result, name, problems, serials) for result in results or []]
    per_entity = [result for result in read if result is not None]
    overall = _dcgm_result(summary, name, problems, serials) if isinstance(summary, dict) else None
    statuses = [result["status"] for result in per_entity]
    if overall is not None:
        statuses.append(overall["status"])
    if not statuses:
        return None
    worst: str | None = next((s for s in ("fail", "warn") if s in statuses), None)
    if worst is None:
        worst = "pass" if "pass" in statuses else statuses[0]
    words = [word for result in per_entity for word in result["detail"]]
    if overall is not None:
        words += [word for word in overall["detail"] if word not in words]
    return {"name": name, "category": category, "status": worst, "detail": words[:3],
            "results": per_entity}  # fmt: skip

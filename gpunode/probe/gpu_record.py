"""One GPU record from ``nvidia-smi -q -x`` (and NVLink states from ``nvidia-smi nvlink -s``).

The one parser of nvidia-smi's XML report: ``facts.gpu.GpuDevices`` (what roles converge),
the node-side probe ``gpu_probe`` (what the drift check and the node's metrics read) and the
control-side ``gpunode.probe.parsers`` all build their GPUs with ``gpu_from_xml``, so a deploy
and the drift check never disagree about the same GPU. The probe's NVML path builds the same
record (``RECORD_KEYS``) from NVML calls.

Standard library only, and no gpunode import: it travels to the node with the probe
(``parsers.probe_program`` registers it as ``gpunode.probe.gpu_record``; ``roles.gpu_metrics``
installs it beside ``gpu_probe.py``).

The record, one dict per GPU (None wherever the driver does not say):

- ``index`` (nvidia-smi's enumeration order, what ``-i`` takes), ``minor_number``,
  ``module_id``, ``uuid``, ``serial``, ``name``, ``pci_bus_id``, ``vbios_version``,
  ``performance_state``;
- ``persistence_mode``: bool; ``ecc_mode``, ``mig_mode``: ``{"current", "pending"}`` bools
  (None: the GPU has no ECC / no MIG);
- ``power_w``: ``{"draw", "limit", "default_limit", "min_limit", "max_limit"}``;
- ``application_clocks_mhz``: ``{"memory", "graphics"}`` or None, with
  ``application_clocks_note`` (the driver's words when it reports none, e.g. driver 590 on
  Hopper: "Requested functionality has been deprecated"), ``supported_clocks_mhz``:
  ``[{"memory": MHz, "graphics": [MHz, ...]}]`` (a list: JSON keeps no integer keys);
- ``clocks_mhz``: ``{"current", "max"}`` each ``{"graphics", "sm", "memory", "video"}``;
  ``clock_event_reasons``: active reasons, sorted (None: not reported);
- ``ecc_errors``: ``{"volatile", "aggregate"}`` each ``{"corrected", "uncorrected"}``;
  ``retired_pages``: ``{"supported", "single_bit", "double_bit", "pending"}``;
  ``remapped_rows``: ``{"supported", "correctable", "uncorrectable", "pending", "failure"}``;
- ``utilization_percent``: ``{"gpu", "memory"}`` (None in MIG mode); ``memory_mib``:
  ``{"total", "used"}`` of the framebuffer (used without the driver's reserved part);
- ``temperature_c``: ``{"gpu", "memory"}``; ``temperature_slowdown_c``: "GPU Slowdown Temp";
  ``temperature_tlimit_c``: driver 590's T.Limit headroom ``{"current", "slowdown"}``;
  ``pcie``: ``{"gen_current", "gen_max", "width_current", "width_max"}``;
  ``fabric``: ``{"state", "status"}``;
- ``nvlink``: ``nvlink_summary`` (state ok / all_inactive / none / mig_mode / unreadable,
  active, total, links), or None until ``nvidia-smi nvlink -s`` fills it in;
- ``lost``: bool, the GPU answers no query ("GPU is lost", or "Unknown Error" for every value
  where not even its UUID or serial can be read; NVML's GPU_IS_LOST), with ``lost_evidence``
  (what the driver answered, None when not lost);
- ``ecc_memory``: uncorrectable ECC counts by memory where the driver splits them:
  ``{"volatile": {"sram", "dram"}, "aggregate": {"sram", "dram"}, "sram_threshold_exceeded"}``;
- ``recovery_action``: NVML's ``nvmlDeviceGpuRecoveryAction_t`` value (0 none, 1 GPU reset,
  2 node reboot, 3 drain P2P, 4 drain and reset...) or None where not reported, with
  ``recovery_action_text``: the driver's words where they name no known action.

Every parser returns data or ``{"state": "unreadable", "command": ..., "reason": ...}``; none
raises. Where part of an output cannot be read, what can be read is kept and ``problems``
names each line that was not.
"""

from __future__ import annotations

import functools
import re

# typing and ElementTree are names for the type checker alone: a node runs this in the drift
# check's one Python process, where each import costs CPU (typing 2 ms), and ElementTree is
# imported where nvidia-smi's XML is read (a node whose NVML answers never needs it).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import xml.etree.ElementTree as ElementTree
    from collections.abc import Callable, Sequence
    from typing import Any

XML_COMMAND = "nvidia-smi -q -x"
NVLINK_COMMAND = "nvidia-smi nvlink -s"
REASON_PREFIXES = ("clocks_event_reason_", "clocks_throttle_reason_")
REASON_ALIASES = {"display_clock_setting": "display_clocks_setting"}
# NVML's clocks event (formerly throttle) reason bits, named as nvidia-smi's XML names them
# (the probe's NVML path reads the mask; the textfile writes each reason).
CLOCK_EVENT_REASON_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clocks_setting",
}

# How nvidia-smi says a value is not there; all read as None.
UNAVAILABLE = re.compile(
    r"\[?(n/a|not supported|unknown error|insufficient permissions|not available|"
    r"gpu is lost|requested functionality has been deprecated)\]?",
    re.IGNORECASE,
)

if TYPE_CHECKING:
    Result = dict[str, Any]
else:
    Result = dict

# Every key of one GPU record, from the XML report and from NVML alike (see the docstring).
RECORD_KEYS = frozenset(
    {
        "index", "minor_number", "module_id", "uuid", "serial", "name", "pci_bus_id",
        "vbios_version", "persistence_mode", "performance_state", "ecc_mode", "ecc_errors",
        "retired_pages", "remapped_rows", "mig_mode", "temperature_c", "power_w", "clocks_mhz",
        "clock_event_reasons", "pcie", "fabric", "nvlink", "application_clocks_mhz",
        "application_clocks_note", "supported_clocks_mhz", "utilization_percent", "memory_mib",
        "lost", "lost_evidence", "ecc_memory", "recovery_action", "recovery_action_text",
        "temperature_slowdown_c", "temperature_tlimit_c",
    }
)  # fmt: skip

# What nvidia-smi prints for a value of a GPU that answers no query (NVML's GPU_IS_LOST), and
# for one whose every query fails (NVML_ERROR_UNKNOWN): in the XML, in -q's text, in CSV.
LOST_VALUE = re.compile(r"\[?gpu is lost\]?", re.IGNORECASE)
UNKNOWN_ERROR_VALUE = re.compile(r"\[?unknown error\]?", re.IGNORECASE)
# Fewer values than this answered "Unknown Error" is a driver's odd field, not a lost GPU.
MIN_UNKNOWN_ERRORS_FOR_LOST = 3
# nvidia-smi's line for a GPU it cannot open at all (it leaves the GPU out of its report):
# "Unable to determine the device handle for GPU0000:CB:00.0: Unknown Error" (gpud's tests)
# and driver 610's "... for GPU1: 0000:34:00.0: Unknown Error" (see tests/fixtures).
UNREACHABLE_GPU = re.compile(
    r"Unable to determine the device handle for GPU ?(?:(?P<index>[0-9]{1,3}): ?)?"
    r"(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]): (?P<error>[^\n]{1,200})"
)

# Longer than any line nvidia-smi or the kernel log prints (printk's limit is 1024): a longer
# one is garbage or hostile, and is not handed to a regex whole (see parsers.MAX_LINE_CHARS).
MAX_LINE_CHARS = 4096


# --- the result contract ----------------------------------------------------------------------


def unreadable(command: str, reason: str) -> Result:
    """What every parser returns when the output cannot be trusted, saying why."""
    return {"state": "unreadable", "command": command, "reason": reason}


def absent(command: str, reason: str) -> Result:
    return {"state": "absent", "command": command, "reason": reason}


def never_raises(command: str) -> Callable[[Callable[..., Result]], Callable[..., Result]]:
    """A parser bug becomes an explicit unreadable result, never a crashed fact or probe.

    The reason starts with "internal parser error" so the fuzz tests can tell it apart.
    """

    def decorate(parse: Callable[..., Result]) -> Callable[..., Result]:
        @functools.wraps(parse)
        def guarded(*args: Any, **kwargs: Any) -> Result:
            try:
                return parse(*args, **kwargs)
            except Exception as error:  # the contract: data or a reason, never an exception
                return unreadable(command, f"internal parser error: {error!r}")

        return guarded

    return decorate


# --- values -----------------------------------------------------------------------------------


def clean(text: str | None) -> str | None:
    """Stripped text, or None where nvidia-smi says the value is not available."""
    if text is None:
        return None
    text = text.strip()
    if not text or UNAVAILABLE.fullmatch(text):
        return None
    return text


def number(text: str | None) -> float | None:
    """'350.00 W' -> 350.0, '16x' -> 16.0; unavailable or not numeric -> None."""
    value = clean(text)
    if value is None:
        return None
    match = re.match(r"[-+]?[0-9]+(?:\.[0-9]+)?", value)
    return float(match.group(0)) if match else None


def integer(text: str | None) -> int | None:
    value = number(text)
    return int(value) if value is not None and value.is_integer() else None


def enabled(text: str | None) -> bool | None:
    return {"enabled": True, "disabled": False}.get((clean(text) or "").lower())


def yes_no(text: str | None) -> bool | None:
    return {"yes": True, "no": False}.get((clean(text) or "").lower())


def bus_key(bus_id: str | None) -> tuple[int, int, int] | None:
    """'00000000:18:00.0', '0000:18:00' (XID) and '18:00.0' name the same device."""
    if not bus_id:
        return None
    match = re.fullmatch(
        r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.[0-7])?",
        bus_id.strip(),
    )
    if not match:
        return None
    return int(match.group(1) or "0", 16), int(match.group(2), 16), int(match.group(3), 16)


# --- nvidia-smi -q -x -------------------------------------------------------------------------


def _text(element: ElementTree.Element | None, *paths: str) -> str | None:
    """Text of the first of ``paths`` present (elements renamed across schemas)."""
    if element is None:
        return None
    for path in paths:
        found = element.find(path)
        if found is not None and found.text is not None and found.text.strip():
            return found.text.strip()
    return None


def _first(element: ElementTree.Element, *tags: str) -> ElementTree.Element | None:
    for tag in tags:
        found = element.find(tag)
        if found is not None:
            return found
    return None


def _ecc_totals(scope: ElementTree.Element | None) -> dict[str, int | None]:
    """Corrected and uncorrected totals of one ECC scope (volatile or aggregate).

    Schemas v11/v12 count per memory (sram_correctable, dram_uncorrectable, ...), driver 590
    splits SRAM uncorrectable by detection (..._parity, ..._secded), older schemas give
    single_bit/double_bit groups with a total each.
    """
    totals: dict[str, int | None] = {"corrected": None, "uncorrected": None}
    if scope is None:
        return totals
    old_style = {"corrected": "single_bit/total", "uncorrected": "double_bit/total"}
    if any(scope.find(path) is not None for path in old_style.values()):
        return {kind: integer(_text(scope, path)) for kind, path in old_style.items()}
    for counter in scope:
        count = integer(counter.text)
        if count is None:
            continue
        kind = (
            "uncorrected"
            if "uncorrectable" in counter.tag
            else "corrected"
            if "correctable" in counter.tag
            else None
        )
        if kind is not None:
            totals[kind] = (totals[kind] or 0) + count
    return totals


def _retired_pages(element: ElementTree.Element | None) -> Result:
    single = integer(_text(element, "multiple_single_bit_retirement/retired_count"))
    double = integer(_text(element, "double_bit_retirement/retired_count"))
    pending_flags = [
        yes_no(_text(element, tag)) for tag in ("pending_blacklist", "pending_retirement")
    ]
    known = [flag for flag in pending_flags if flag is not None]
    return {
        "supported": single is not None or double is not None,
        "single_bit": single,
        "double_bit": double,
        "pending": any(known) if known else None,
    }


def _remapped_rows(element: ElementTree.Element | None) -> Result:
    rows = {
        "correctable": integer(_text(element, "remapped_row_corr")),
        "uncorrectable": integer(_text(element, "remapped_row_unc")),
        "pending": yes_no(_text(element, "remapped_row_pending")),
        "failure": yes_no(_text(element, "remapped_row_failure")),
    }
    return {"supported": any(value is not None for value in rows.values()), **rows}


def _reason_name(tag: str) -> str:
    for prefix in REASON_PREFIXES:
        if tag.startswith(prefix):
            tag = tag[len(prefix) :]
            break
    return REASON_ALIASES.get(tag, tag)


def _clock_event_reasons(element: ElementTree.Element | None) -> list[str] | None:
    """Active reasons, sorted; None when the report has no readable reason at all."""
    if element is None:
        return None
    states = {_reason_name(child.tag): (clean(child.text) or "").lower() for child in element}
    known = {name: state for name, state in states.items() if state in ("active", "not active")}
    if not known:
        return None
    return sorted(name for name, state in known.items() if state == "active")


def _clocks(element: ElementTree.Element | None) -> dict[str, int | None]:
    return {
        name: integer(_text(element, f"{tag}_clock"))
        for name, tag in (
            ("graphics", "graphics"),
            ("sm", "sm"),
            ("memory", "mem"),
            ("video", "video"),
        )
    }


LINK_STATES = {"active": True, "up": True, "inactive": False, "down": False}


def _xml_nvlinks(gpu: ElementTree.Element) -> list[Result] | None:
    """NVLink states if the report has an NVLink element; None otherwise.

    No captured schema (v11, v12, driver 590) has one, so this only reads an element whose
    tag starts with "nvlink" and whose children each hold a link's state as text.
    """
    container = next((child for child in gpu if child.tag.startswith("nvlink")), None)
    if container is None:
        return None
    links = []
    for position, link in enumerate(container):
        texts = [(node.tag, clean(node.text)) for node in link.iter()]
        states = [
            LINK_STATES[text.lower()] for _, text in texts if text and text.lower() in LINK_STATES
        ]
        if not states:
            continue
        numbers = [integer(text) for tag, text in texts if "id" in tag or tag in ("link", "index")]
        link_number = next((value for value in numbers if value is not None), position)
        links.append({"link": link_number, "active": states[0], "speed_gbps": None})
    return links


def _application_clocks(gpu: ElementTree.Element) -> Result:
    """Application clocks, or None with the driver's words when it will not report them.

    Driver 590 prints "Requested functionality has been deprecated" on Hopper; older drivers
    print "N/A" where the GPU has no application clocks.
    """
    memory_text = _text(gpu, "applications_clocks/mem_clock")
    graphics_text = _text(gpu, "applications_clocks/graphics_clock")
    memory, graphics = integer(memory_text), integer(graphics_text)
    supported = []
    for entry in gpu.findall("supported_clocks/supported_mem_clock"):
        memory_clock = integer(_text(entry, "value"))
        if memory_clock is None:
            continue
        graphics_clocks = (integer(e.text) for e in entry.findall("supported_graphics_clock"))
        supported.append(
            {
                "memory": memory_clock,
                "graphics": sorted(g for g in graphics_clocks if g is not None),
            }
        )
    if memory is None or graphics is None:
        clocks, note = None, memory_text or graphics_text or "N/A"
    else:
        clocks, note = {"memory": memory, "graphics": graphics}, ""
    return {
        "application_clocks_mhz": clocks,
        "application_clocks_note": note,
        "supported_clocks_mhz": supported,
    }


def lost_evidence(values: Sequence[str], identity: Sequence[str | None]) -> str | None:
    """Why a GPU whose values are ``values`` is lost, or None: any value "GPU is lost", or
    "Unknown Error" for many values where ``identity`` (UUID, serial) cannot be read."""
    lost = sum(1 for value in values if LOST_VALUE.fullmatch(value.strip()))
    if lost:
        return f"'GPU is lost' for {lost} of {len(values)} values"
    unknown = sum(1 for value in values if UNKNOWN_ERROR_VALUE.fullmatch(value.strip()))
    readable = [value for value in identity if value]
    if unknown >= MIN_UNKNOWN_ERRORS_FOR_LOST and not readable:
        return f"'Unknown Error' for {unknown} of {len(values)} values, no UUID or serial"
    return None


def _xml_lost_evidence(gpu: ElementTree.Element) -> str | None:
    values = [
        element.text for element in gpu.iter() if len(element) == 0 and (element.text or "").strip()
    ]
    identity = [clean(_text(gpu, "uuid")), clean(_text(gpu, "serial"))]
    return lost_evidence([value for value in values if value is not None], identity)


def _ecc_memory(ecc_errors: ElementTree.Element | None) -> Result | None:
    """Uncorrectable ECC by memory (schemas v12 on: sram_*, dram_*); None where not split."""
    if ecc_errors is None:
        return None
    scopes: Result = {}
    for scope in ("volatile", "aggregate"):
        element = ecc_errors.find(scope)
        counts: Result = {"sram": None, "dram": None}
        for counter in [] if element is None else list(element):
            count = integer(counter.text)
            memory = counter.tag.split("_", 1)[0]
            if count is None or memory not in counts or "uncorrectable" not in counter.tag:
                continue
            counts[memory] = (counts[memory] or 0) + count
        scopes[scope] = counts
    if all(value is None for counts in scopes.values() for value in counts.values()):
        exceeded = yes_no(_text(ecc_errors, "aggregate/sram_threshold_exceeded"))
        if exceeded is None:
            return None
    return {
        **scopes,
        "sram_threshold_exceeded": yes_no(_text(ecc_errors, "aggregate/sram_threshold_exceeded")),
    }


def _recovery_action(gpu: ElementTree.Element) -> Result:
    """``<gpu_recovery_action>`` (drivers 570 on: "None"...) -> NVML's value, or the words."""
    text = clean(_text(gpu, "gpu_recovery_action"))
    value = recovery_action_value(text)
    return {"recovery_action": value, "recovery_action_text": text if value is None else None}


# How nvidia-smi and the kernel log word a recovery action ("None", "GPU Reset", XID 154's
# "OS Reboot"), lowercased without blanks -> NVML's nvmlDeviceGpuRecoveryAction_t value
# (gpunode.health.catalogue.RECOVERY_ACTIONS names each, with its source).
RECOVERY_ACTION_WORDS = {
    "none": 0,
    "reset": 1,
    "gpureset": 1,
    "reboot": 2,
    "nodereboot": 2,
    "osreboot": 2,
    "drainp2p": 3,
    "drainandreset": 4,
    "drainp2pandresetgpu": 4,
    "recoverimexdomain": 5,
    "busreset": 6,
    "systemreboot": 7,
}


def recovery_action_value(text: str | None) -> int | None:
    """The driver's words for a recovery action -> NVML's value; None for other words."""
    if text is None:
        return None
    return RECOVERY_ACTION_WORDS.get(re.sub(r"[^a-z0-9]", "", text.lower()))


def unreachable_gpus(text: str) -> list[Result]:
    """The GPUs nvidia-smi could not open ("Unable to determine the device handle for ..."):
    each ``{"pci_bus_id", "index", "message"}``, in the order printed, once each."""
    found: dict[str, Result] = {}
    for line in text.split("\n"):
        match = UNREACHABLE_GPU.search(line[:MAX_LINE_CHARS])
        if match and match["bus"].lower() not in found:
            found[match["bus"].lower()] = {
                "pci_bus_id": match["bus"],
                "index": int(match["index"]) if match["index"] else None,
                "message": match.group(0),
            }
    return list(found.values())


def lost_record(index: int, evidence: str, pci_bus_id: str | None = None) -> Result:
    """The record of a GPU that answers nothing: every value None but its place and why."""
    record: Result = dict.fromkeys(RECORD_KEYS)
    record.update(index=index, pci_bus_id=pci_bus_id, lost=True, lost_evidence=evidence)
    return record


def gpu_from_xml(gpu: ElementTree.Element, position: int) -> Result:
    """The normalized fields of one ``<gpu>`` element, whatever the schema."""
    power = _first(gpu, "gpu_power_readings", "power_readings")
    link_info = gpu.find("pci/pci_gpu_link_info")
    module_id = integer(_text(gpu, "gpu_module_id", "platformInfo/module_id"))
    ecc_errors = gpu.find("ecc_errors")
    xml_links = _xml_nvlinks(gpu)
    return {
        # The enumeration order, which nvidia-smi -i uses; the minor number (/dev/nvidiaN)
        # can differ, e.g. after a GPU has fallen off the bus.
        "index": position,
        "minor_number": integer(_text(gpu, "minor_number")),
        "module_id": module_id,
        "uuid": clean(_text(gpu, "uuid")),
        "serial": clean(_text(gpu, "serial")),
        "name": clean(_text(gpu, "product_name")),
        "pci_bus_id": clean(gpu.get("id")) or clean(_text(gpu, "pci/pci_bus_id")),
        "vbios_version": clean(_text(gpu, "vbios_version")),
        "persistence_mode": enabled(_text(gpu, "persistence_mode")),
        "performance_state": clean(_text(gpu, "performance_state")),
        "ecc_mode": {
            "current": enabled(_text(gpu, "ecc_mode/current_ecc")),
            "pending": enabled(_text(gpu, "ecc_mode/pending_ecc")),
        },
        "ecc_errors": {
            scope: _ecc_totals(None if ecc_errors is None else ecc_errors.find(scope))
            for scope in ("volatile", "aggregate")
        },
        "retired_pages": _retired_pages(gpu.find("retired_pages")),
        "remapped_rows": _remapped_rows(gpu.find("remapped_rows")),
        "mig_mode": {
            "current": enabled(_text(gpu, "mig_mode/current_mig")),
            "pending": enabled(_text(gpu, "mig_mode/pending_mig")),
        },
        "utilization_percent": {
            "gpu": integer(_text(gpu, "utilization/gpu_util")),
            "memory": integer(_text(gpu, "utilization/memory_util")),
        },
        "memory_mib": {
            "total": integer(_text(gpu, "fb_memory_usage/total")),
            "used": integer(_text(gpu, "fb_memory_usage/used")),
        },
        "temperature_c": {
            "gpu": integer(_text(gpu, "temperature/gpu_temp")),
            "memory": integer(_text(gpu, "temperature/memory_temp")),
        },
        "temperature_slowdown_c": integer(_text(gpu, "temperature/gpu_temp_slow_threshold")),
        "temperature_tlimit_c": {
            "current": integer(_text(gpu, "temperature/gpu_temp_tlimit")),
            "slowdown": integer(_text(gpu, "temperature/gpu_temp_slow_tlimit_threshold")),
        },
        "power_w": {
            "draw": number(_text(power, "power_draw", "average_power_draw", "instant_power_draw")),
            "limit": number(
                _text(power, "current_power_limit", "enforced_power_limit", "power_limit")
            ),
            "default_limit": number(_text(power, "default_power_limit")),
            "min_limit": number(_text(power, "min_power_limit")),
            "max_limit": number(_text(power, "max_power_limit")),
        },
        "clocks_mhz": {
            "current": _clocks(gpu.find("clocks")),
            "max": _clocks(gpu.find("max_clocks")),
        },
        "clock_event_reasons": _clock_event_reasons(
            _first(gpu, "clocks_event_reasons", "clocks_throttle_reasons")
        ),
        "pcie": {
            "gen_current": integer(_text(link_info, "pcie_gen/current_link_gen")),
            "gen_max": integer(_text(link_info, "pcie_gen/max_link_gen")),
            "width_current": integer(_text(link_info, "link_widths/current_link_width")),
            "width_max": integer(_text(link_info, "link_widths/max_link_width")),
        },
        "fabric": {
            "state": clean(_text(gpu, "fabric/state")),
            "status": clean(_text(gpu, "fabric/status")),
        },
        **_application_clocks(gpu),
        "nvlink": None if xml_links is None else nvlink_summary(xml_links, "xml"),
        "lost": (evidence := _xml_lost_evidence(gpu)) is not None,
        "lost_evidence": evidence,
        "ecc_memory": _ecc_memory(ecc_errors),
        **_recovery_action(gpu),
    }


@never_raises(XML_COMMAND)
def parse_nvidia_smi_xml(text: str) -> Result:
    """``nvidia-smi -q -x`` output (any DTD version) -> driver versions and normalized GPUs."""
    if not text.strip():
        return unreadable(XML_COMMAND, "empty output")
    import xml.etree.ElementTree as ElementTree  # lazily: see the imports above

    try:
        root = ElementTree.fromstring(text)
    except (ElementTree.ParseError, ValueError) as error:
        return unreadable(XML_COMMAND, f"not well-formed XML, truncated or corrupted ({error})")
    if root.tag != "nvidia_smi_log":
        return unreadable(XML_COMMAND, f"root element is <{root.tag}>, not <nvidia_smi_log>")
    elements = root.findall("gpu")
    driver_version = clean(_text(root, "driver_version"))
    attached = integer(_text(root, "attached_gpus"))
    if driver_version is None and attached is None and not elements:
        return unreadable(XML_COMMAND, "no driver_version, attached_gpus or gpu element")
    return {
        "state": "ok",
        "command": XML_COMMAND,
        "driver_version": driver_version,
        "cuda_driver_version": clean(_text(root, "cuda_version")),
        # Counts every GPU, also those a -i selection left out of the report.
        "attached_gpus": attached,
        "gpus": [gpu_from_xml(element, position) for position, element in enumerate(elements)],
    }


# --- nvidia-smi nvlink -s ---------------------------------------------------------------------

ALL_LINKS_INACTIVE = "NVML: Unable to retrieve NVLink information as all links are inactive"
# What nvidia-smi prints under a GPU line instead of its links, and the state it means.
# Captures: azurehpc-health-checks (all inactive), nvidia_gpu_exporter (L40S and RTX 4080
# SUPER on 595: no NVLink; H100 in MIG mode on 590: not queryable), see tests/fixtures.
NVLINK_MESSAGES = {
    ALL_LINKS_INACTIVE: "all_inactive",
    "Device does not have or support Nvlink": "none",
    "Nvlink queries are not supported for Devices in MIG mode": "mig_mode",
}
_NVLINK_UUID = re.compile(r"[^()\s]+")


def _nvlink_gpu(line: str) -> tuple[int, str, str] | None:
    """``GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)`` -> (index, name, UUID)."""
    if not line.startswith("GPU "):
        return None
    number, colon, rest = line[4:].partition(": ")
    name, marker, uuid = rest.rpartition(" (UUID: ")
    if not (colon and marker and number.isdigit() and number.isascii() and uuid.endswith(")")):
        return None
    uuid = uuid[:-1]
    return (int(number), name, uuid) if _NVLINK_UUID.fullmatch(uuid) else None


def _nvlink_link(line: str) -> tuple[int, str] | None:
    """``Link 3: 26.562 GB/s`` (indented) -> (3, '26.562 GB/s').

    Read with str methods: a regex ending in a lazy group and optional blanks backtracks
    quadratically on a long run of blanks.
    """
    body = line.strip()
    if not body.startswith("Link "):
        return None
    number, colon, value = body[5:].partition(": ")
    if not (colon and number.isdigit() and number.isascii()):
        return None
    return int(number), value


def nvlink_summary(
    links: list[Result],
    source: str,
    message_state: str | None = None,
    problems: Sequence[str] = (),
) -> Result:
    """Per-GPU NVLink state from its links, the message printed instead of them, or problems.

    ok (links listed), all_inactive, none (no NVLink), mig_mode (MIG mode hides the links),
    unreadable (a line under this GPU was not understood: ``problems`` names it; the links
    read are kept).
    """
    active = sum(1 for link in links if link["active"])
    state = "ok" if links else "none"
    if message_state == "all_inactive" or (links and not active):
        state = "all_inactive"
    elif message_state is not None:
        state = message_state
    if problems:
        state = "unreadable"
    summary: Result = {
        "source": source,
        "state": state,
        "active": active,
        # No link is named when all are inactive or in MIG mode: the number is unknown then.
        "total": None if message_state in ("all_inactive", "mig_mode") else len(links),
        "links": links,
    }
    if problems:
        summary["reason"] = "; ".join(problems)
        summary["problems"] = list(problems)
    return summary


def _read_nvlink_gpus(
    text: str,
    new_links: Callable[[], Any],
    read_link: Callable[[Result, str, int], str | None],
) -> tuple[list[Result], list[str]]:
    """The GPUs of an ``nvidia-smi nvlink`` listing (``-s`` and ``-e`` share its layout: a
    "GPU i: name (UUID: ...)" line, then its links' lines, or a message for the whole GPU),
    each with ``links`` (``new_links()``) filled by ``read_link(gpu, line, number)``, which
    returns a problem for a line it cannot read. A problem is named in ``problems`` and in
    its GPU's (whose state is then unreadable); every other GPU is kept."""
    gpus: list[Result] = []
    problems: list[str] = []

    def problem(message: str) -> None:
        problems.append(message)
        if gpus:
            gpus[-1]["problems"].append(message)

    # Newlines only: str.splitlines also splits inside a line (at \x85, \u2028...), and the
    # line numbers named would no longer be the node's.
    for line_number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_CHARS:
            problem(f"line {line_number} is {len(line)} characters long (over {MAX_LINE_CHARS})")
            continue
        if gpu_line := _nvlink_gpu(line.strip()):
            index, name, uuid = gpu_line
            gpus.append({"index": index, "name": name, "uuid": uuid, "links": new_links(),
                         "message": None, "problems": []})  # fmt: skip
        elif not gpus:
            problem(f"line {line_number} comes before any GPU: {line[:120]!r}")
        elif line.strip() in NVLINK_MESSAGES:
            gpus[-1]["message"] = NVLINK_MESSAGES[line.strip()]
        elif (unread := read_link(gpus[-1], line, line_number)) is not None:
            problem(unread)
    return gpus, problems


@never_raises(NVLINK_COMMAND)
def parse_nvlink_status(text: str, empty_ok: bool = False) -> Result:
    """``nvidia-smi nvlink -s`` -> per GPU (index, name, UUID) its links and their state.

    A line that is not understood is named in ``problems`` (and in its GPU's, whose state is
    then unreadable); every other GPU is kept. The whole output is unreadable only when no GPU
    could be read. With ``empty_ok`` (the caller saw nvidia-smi exit 0) no output is an answer:
    drivers print nothing where no GPU has NVLink (gpud's A10 capture).
    """
    if not text.strip():
        if empty_ok:
            return {"state": "ok", "command": NVLINK_COMMAND, "gpus": [], "problems": []}
        return unreadable(NVLINK_COMMAND, "empty output")

    def read_link(gpu: Result, line: str, line_number: int) -> str | None:
        link_line = _nvlink_link(line)
        if link_line is None:
            return f"line {line_number} not understood: {line[:120]!r}"
        link, value = link_line
        speed = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?) GB/s", value)
        if value == "<inactive>":
            gpu["links"].append({"link": link, "active": False, "speed_gbps": None})
        elif speed:
            gpu["links"].append({"link": link, "active": True, "speed_gbps": float(speed[1])})
        else:
            return f"line {line_number}: unknown link state {value[:120]!r}"
        return None

    gpus, problems = _read_nvlink_gpus(text, list, read_link)
    if not any(not gpu["problems"] for gpu in gpus):
        return unreadable(NVLINK_COMMAND, problems[0] if problems else "no GPU line")
    return {
        "state": "ok",
        "command": NVLINK_COMMAND,
        "gpus": [
            {
                "index": gpu["index"],
                "name": gpu["name"],
                "uuid": gpu["uuid"],
                **nvlink_summary(gpu["links"], NVLINK_COMMAND, gpu["message"], gpu["problems"]),
            }
            for gpu in gpus
        ],
        "problems": problems,
    }


# --- nvidia-smi nvlink -e ---------------------------------------------------------------------
# Each link's error counters since the driver loaded (a GPU reset or driver reload clears
# them), in the layout of a real 8x A100-SXM4-40GB capture on driver 535.161.08
# (tests/fixtures/nvlink/nvidia-smi.nvlink.errors.*): "GPU i: NAME (UUID: ...)" then, per link,
# "Link N: Replay Errors: 0", "Recovery Errors" and "CRC Errors", a blank line between links.
# Published outputs of H100 and GB300 systems print the same three counters.

NVLINK_ERRORS_COMMAND = "nvidia-smi nvlink -e"
NVLINK_ERROR_COUNTERS = {
    "Replay Errors": "replay",
    "Recovery Errors": "recovery",
    "CRC Errors": "crc",
}


@never_raises(NVLINK_ERRORS_COMMAND)
def parse_nvlink_errors(text: str, empty_ok: bool = False) -> Result:
    """``nvidia-smi nvlink -e`` -> per GPU (index, name, UUID) its links' error counters.

    A counter nvidia-smi names but gpunode does not know is kept under the link's ``other``
    by its name; a line not understood is named in ``problems`` (and its GPU's, whose
    ``state`` is then unreadable, its counters read so far kept). The whole output is
    unreadable only when no GPU could be read. With ``empty_ok`` (nvidia-smi exited 0) no
    output means no GPU has NVLink.
    """
    if not text.strip():
        if empty_ok:
            return {"state": "ok", "command": NVLINK_ERRORS_COMMAND, "gpus": [], "problems": []}
        return unreadable(NVLINK_ERRORS_COMMAND, "empty output")

    def read_link(gpu: Result, line: str, line_number: int) -> str | None:
        link_line = _nvlink_link(line)
        counter, colon, value = link_line[1].rpartition(": ") if link_line else ("", "", "")
        if not (link_line and colon and value.isdigit() and value.isascii() and counter):
            return f"line {line_number} not understood: {line[:120]!r}"
        link = gpu["links"].setdefault(link_line[0], {"link": link_line[0]})
        if counter in NVLINK_ERROR_COUNTERS:
            link[NVLINK_ERROR_COUNTERS[counter]] = int(value)
        else:  # a counter of a newer driver: kept by its own name, judged by no rule
            link.setdefault("other", {})[counter[:60]] = int(value)
        return None

    gpus, problems = _read_nvlink_gpus(text, dict, read_link)
    if not any(not gpu["problems"] for gpu in gpus):
        return unreadable(NVLINK_ERRORS_COMMAND, problems[0] if problems else "no GPU line")
    return {
        "state": "ok",
        "command": NVLINK_ERRORS_COMMAND,
        "gpus": [
            {
                "index": gpu["index"],
                "name": gpu["name"],
                "uuid": gpu["uuid"],
                **nvlink_errors_summary(
                    [gpu["links"][number] for number in sorted(gpu["links"])],
                    gpu["message"],
                    gpu["problems"],
                ),
            }
            for gpu in gpus
        ],
        "problems": problems,
    }


def nvlink_errors_summary(
    links: list[Result], message_state: str | None = None, problems: Sequence[str] = ()
) -> Result:
    """One GPU's ``nvlink_errors``: ok (counters listed), none (no NVLink, or all links
    inactive: nvidia-smi lists no counter then), mig_mode, or unreadable (``reason``)."""
    state = "ok" if links else (message_state or "none")
    if message_state == "all_inactive":
        state = "none"
    summary: Result = {"source": NVLINK_ERRORS_COMMAND, "state": state, "links": links}
    if problems:
        summary.update(state="unreadable", reason="; ".join(problems))
    return summary


# --- nvidia-smi mig -lgi ----------------------------------------------------------------------
# The one reader of nvidia-smi's MIG listings' box tables: facts.gpu.GpuDevices (what the
# gpu_settings role lays out) and the probe (what the drift check's gpu.mig_layout compares)
# both read their GPU instances with ``parse_gpu_instances``. Row layout as in published real
# outputs of A100 80GB and H100 80GB (the rows facts.gpu has read since it was written).

MIG_INSTANCES_COMMAND = "nvidia-smi mig -lgi"
# What the mig listings print instead of a table when there is nothing to list.
NOTHING_LISTED = (
    "No MIG-enabled devices found.",
    "No GPU instances found.",
    "No compute instances found.",
)
GPU_INSTANCE_ROW = re.compile(
    r"\|\s*(?P<gpu>\d+)\s+MIG (?P<profile>\S+)\s+(?P<profile_id>\d+)\s+(?P<id>\d+)"
    r"\s+(?P<start>\d+):(?P<size>\d+)\s*\|"
)


def table_rows(lines: Sequence[str], *patterns: re.Pattern[str]) -> tuple[list[re.Match[str]], str]:
    """Rows of an nvidia-smi box table matching the first pattern; the first odd line, if any.

    Borders, titles, header rows and the "nothing found" messages are skipped; a line that
    matches no pattern is named (the rows read before it are kept)."""
    rows: list[re.Match[str]] = []
    for line in (line.strip() for line in lines):
        if not line or line in NOTHING_LISTED or line.startswith("+"):
            continue
        if line.startswith("|") and not re.match(r"\|\s*\d", line):
            continue  # a title or header row
        if len(line) > MAX_LINE_CHARS:
            return rows, f"a line of {len(line)} characters"
        matches = [pattern.fullmatch(line) for pattern in patterns]
        if matches[0]:
            rows.append(matches[0])
        elif not any(matches):
            return rows, f"unexpected line {line[:120]!r}"
    return rows, ""


def parse_gpu_instances(lines: Sequence[str]) -> tuple[list[Result], str]:
    """``nvidia-smi mig -lgi`` -> its GPU instances (``gpu`` index, ``id``, ``profile`` without
    the "MIG " prefix, ``profile_id``, ``start``, ``size``) and the first line not read."""
    rows, problem = table_rows(lines, GPU_INSTANCE_ROW)
    return [
        {
            "gpu": int(row["gpu"]),
            "id": int(row["id"]),
            "profile": row["profile"],
            "profile_id": int(row["profile_id"]),
            "start": int(row["start"]),
            "size": int(row["size"]),
        }
        for row in rows
    ], problem

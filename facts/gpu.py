"""GPU facts from ``nvidia-smi -q -x``.

The XML report is used rather than ``--query-gpu``: an older driver rejects a whole
``--query-gpu`` call that names a field it does not know, while XML elements that a driver
generation renamed (``power_readings`` -> ``gpu_power_readings``, ``clocks_throttle_reasons``
-> ``clocks_event_reasons``) are simply looked up under both names.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from typing import Any

from pyinfra.api import FactBase

EXIT_MARKER = "gpunode:nvidia-smi-exit="
ABSENT_MARKER = "gpunode:nvidia-smi-absent"
COMMAND = "nvidia-smi -q -x"

# nvidia-smi exit codes worth naming (nvidia-smi(1), RETURN VALUE).
EXIT_REASONS = {
    9: "NVIDIA driver is not loaded",
    14: "infoROM is corrupted",
    15: "GPU has fallen off the bus",
}


def _text(element: ElementTree.Element | None, *paths: str) -> str | None:
    """First non-empty text found under any of ``paths`` (renamed elements across schemas)."""
    if element is None:
        return None
    for path in paths:
        found = element.find(path)
        if found is not None and found.text is not None and found.text.strip():
            return found.text.strip()
    return None


def _number(text: str | None) -> float | None:
    """'350.00 W' -> 350.0; 'N/A', '[N/A]', '[Not Supported]' -> None."""
    if text is None:
        return None
    match = re.match(r"\s*(-?[0-9]+(?:\.[0-9]+)?)", text)
    return float(match.group(1)) if match else None


def parse_gpu(gpu: ElementTree.Element, ordinal: int) -> dict[str, Any]:
    # nvidia-smi's -i index is the enumeration order, which is the order of the report; the
    # minor number (/dev/nvidiaN) can differ, e.g. once a GPU has fallen off the bus.
    minor = _number(_text(gpu, "minor_number"))
    return {
        "index": ordinal,
        "minor_number": int(minor) if minor is not None else None,
        "bus_id": gpu.get("id"),
        "uuid": _text(gpu, "uuid"),
        "serial": _text(gpu, "serial"),
        "name": _text(gpu, "product_name"),
        "vbios": _text(gpu, "vbios_version"),
        "persistence_mode": _text(gpu, "persistence_mode"),
        "ecc_current": _text(gpu, "ecc_mode/current_ecc"),
        "ecc_pending": _text(gpu, "ecc_mode/pending_ecc"),
        "mig_current": _text(gpu, "mig_mode/current_mig"),
        "mig_pending": _text(gpu, "mig_mode/pending_mig"),
        "power_limit_w": _number(
            _text(gpu, "gpu_power_readings/current_power_limit", "power_readings/power_limit")
        ),
        "power_min_w": _number(
            _text(gpu, "gpu_power_readings/min_power_limit", "power_readings/min_power_limit")
        ),
        "power_max_w": _number(
            _text(gpu, "gpu_power_readings/max_power_limit", "power_readings/max_power_limit")
        ),
        "application_clocks_mhz": {
            "memory": _number(_text(gpu, "applications_clocks/mem_clock")),
            "graphics": _number(_text(gpu, "applications_clocks/graphics_clock")),
        },
    }


def parse_nvidia_smi_xml(lines: list[str]) -> dict[str, Any]:
    """Turn the fact command's output into a report; never raises on bad output."""
    if lines and lines[-1].strip() == ABSENT_MARKER:
        return {"state": "absent", "reason": "nvidia-smi is not installed", "gpus": []}
    exit_code = None
    if lines and lines[-1].startswith(EXIT_MARKER):
        exit_code = int(lines[-1][len(EXIT_MARKER) :] or -1)
        lines = lines[:-1]
    body = "\n".join(lines).strip()
    if exit_code not in (None, 0):
        reason = EXIT_REASONS.get(exit_code, f"exit code {exit_code}")
        return _unreadable(f"{COMMAND} failed: {reason}: {body[:200]}")
    if not body:
        return _unreadable(f"{COMMAND} printed nothing")
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as error:
        return _unreadable(f"{COMMAND} output is not valid XML ({error})")
    if root.tag != "nvidia_smi_log":
        return _unreadable(f"{COMMAND} output has root <{root.tag}>, not <nvidia_smi_log>")
    gpus = [parse_gpu(gpu, ordinal) for ordinal, gpu in enumerate(root.findall("gpu"))]
    return {
        "state": "ok",
        "reason": "",
        "driver_version": _text(root, "driver_version"),
        "cuda_version": _text(root, "cuda_version"),
        "gpus": gpus,
    }


def _unreadable(reason: str) -> dict[str, Any]:
    return {"state": "unreadable", "reason": reason, "gpus": []}


class GpuDevices(FactBase):
    """
    Every GPU the NVIDIA driver reports, with the settings gpunode converges.

    .. code:: python

        {
            "state": "ok",  # or "absent" (no nvidia-smi) / "unreadable" (reason says why)
            "reason": "",
            "driver_version": "550.127.08",
            "gpus": [{"index": 0, "uuid": "GPU-...", "persistence_mode": "Enabled", ...}],
        }
    """

    def command(self) -> str:
        return (
            f"command -v nvidia-smi >/dev/null 2>&1 || {{ echo {ABSENT_MARKER}; exit 0; }}; "
            f"{COMMAND} 2>&1; echo {EXIT_MARKER}$?"
        )

    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_nvidia_smi_xml(list(output))

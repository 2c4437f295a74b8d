"""The GPUs' compute modes and the MPS control daemon's state (roles.mps, roles.gpu_settings)."""

from __future__ import annotations

import re
from typing import Any

from pyinfra.api import FactBase

from gpunode import framing
from gpunode.expected import mps as expected

PARTS = ("compute_modes", "active", "control")
COMPUTE_MODES_COMMAND = "nvidia-smi --query-gpu=index,compute_mode --format=csv,noheader"
# nvidia-smi's compute modes as --query-gpu prints them (its --help-query-gpu: "Default",
# "Exclusive_Process", "Prohibited"; the H100 and H200 captures print "Default").
COMPUTE_MODES = ("Default", "Exclusive_Process", "Prohibited", "Exclusive_Thread")
_MODE_LINE = re.compile(r"(?P<index>[0-9]{1,2}), (?P<mode>[A-Za-z_]{1,32})")
_UNIT_STATE = re.compile(r"[a-z-]{1,32}")
MAX_GPUS = 64


def parse_compute_modes(lines: list[str]) -> tuple[dict[str, str], list[str]]:
    """'0, Default' lines -> {"0": "Default"}, and the lines that could not be read."""
    modes: dict[str, str] = {}
    problems: list[str] = []
    for line in lines[: MAX_GPUS * 2]:
        text = line.strip()
        if not text:
            continue
        match = _MODE_LINE.fullmatch(text)
        if match is None or match["mode"] not in COMPUTE_MODES:
            problems.append(f"{COMPUTE_MODES_COMMAND}: {text[:80]!r}")
            continue
        modes[str(int(match["index"]))] = match["mode"]
    return modes, problems


def parse_mps(output: list[str]) -> dict[str, Any]:
    frame = framing.parse(output, PARTS, max_output_chars=64 * 1024)
    modes_part = frame.part("compute_modes")
    problems: list[str] = []
    modes: dict[str, str] | None = None
    if modes_part.absent:
        modes = None
    elif modes_part.exit_status == 0:
        modes, problems = parse_compute_modes(modes_part.lines)
    else:
        problems.append(f"{COMPUTE_MODES_COMMAND}: {modes_part.problem or 'failed'}")
    active_part = frame.part("active")
    active_text = active_part.lines[0].strip() if active_part.lines else ""
    control_part = frame.part("control")
    return {
        "state": "ok",
        "reason": "",
        "compute_modes": modes,
        "nvidia_smi": not modes_part.absent,
        "active": None if active_part.absent else active_text == "active",
        "unit_state": active_text if _UNIT_STATE.fullmatch(active_text) else None,
        "control_installed": control_part.exit_status == 0,
        "problems": problems[:20],
    }


class MpsState(FactBase):
    """
    Each GPU's compute mode (``nvidia-smi --query-gpu=index,compute_mode``), whether
    gpunode's MPS unit is active and whether ``nvidia-cuda-mps-control`` is installed.

    .. code:: python

        {"state": "ok", "compute_modes": {"0": "Exclusive_Process"}, "nvidia_smi": True,
         "active": True, "unit_state": "active", "control_installed": True, "problems": []}
    """

    def command(self) -> str:
        return framing.command(self.parts())

    def parts(self) -> list[framing.Part]:
        return [
            framing.Part(
                "compute_modes", COMPUTE_MODES_COMMAND, requires="nvidia-smi", stderr="drop"
            ),
            framing.Part(
                "active",
                f"systemctl is-active {expected.UNIT}",
                requires="systemctl",
                stderr="drop",
                python=framing.python_source(
                    "import sys\n"
                    'state = unit_properties(unit).get("ActiveState", "")\n'
                    "print(state)\n"
                    'sys.exit(0 if state in ("active", "reloading", "refreshing") else 3)\n',
                    unit=expected.UNIT,
                ),
                systemd_units=(expected.UNIT,),
            ),
            framing.Part(
                "control",
                f"test -x {expected.CONTROL}",
                stderr="drop",
                python=framing.python_source(
                    "import os, sys\nsys.exit(0 if os.access(path, os.X_OK) else 1)\n",
                    path=expected.CONTROL,
                ),
            ),
        ]

    def process(self, output: list[str]) -> dict[str, Any]:  # type: ignore[override]
        return parse_mps(list(output))

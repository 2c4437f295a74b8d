"""DCGM's diagnostic on the node: ``dcgmi diag -r LEVEL -j``, read by ``parse_dcgm_diag``.

Not part of ``NodeState``: a diagnostic loads the GPUs (level 1 takes seconds, level 2 about
two minutes), so only ``gpunode drift --dcgm-diag LEVEL`` (the rollout's health gate with
``--dcgm-diag``) runs it, and only where the inventory declares DCGM (``dcgm.enabled``).
Levels as DCGM's dcgmi-diag reference names them (docs.nvidia.com/datacenter/dcgm/latest/
reference/command-line-reference/dcgmi/dcgmi-diag.html, read 2026-12-02): 1 quick deployment
checks, normally seconds; 2 medium validation, about two minutes (3 and 4, 15 minutes and
more, are no gate's business).
"""

from __future__ import annotations

from typing import Any

from pyinfra.api import FactBase

from gpunode import framing
from gpunode.probe.gpu_record import absent, unreadable
from gpunode.probe.parsers import DCGM_DIAG_COMMAND, parse_dcgm_diag

DIAG_LEVELS = {"quick": 1, "medium": 2}
PART = "dcgmi"


def diag_level(level: Any) -> int:
    """1 or 2 (or their names); anything else is refused before it reaches a command."""
    chosen = DIAG_LEVELS.get(level, level) if isinstance(level, str) else level
    if isinstance(chosen, bool) or chosen not in DIAG_LEVELS.values():
        raise ValueError(f"DCGM diagnostic level {level!r}: one of 1 (quick), 2 (medium)")
    return int(chosen)


def parse_diag_output(lines: list[str]) -> dict[str, Any]:
    part = framing.parse(lines, [PART]).part(PART)
    if part.absent:
        return absent(DCGM_DIAG_COMMAND, "dcgmi is not installed")
    if part.problem is not None:
        return unreadable(DCGM_DIAG_COMMAND, part.problem)
    # dcgmi exits non-zero when a test failed and still prints the document: read it first.
    report = parse_dcgm_diag("\n".join(part.lines))
    if report["state"] != "ok" and part.exit_status not in (None, 0):
        report["reason"] = f"exit status {part.exit_status}: {report['reason']}"
    return report


class DcgmDiag(FactBase):
    """
    The DCGM diagnostic's tests and which failed.

    .. code:: python

        {"state": "ok", "version": "3.1.0", "failed": ["Memory"], "problems": [],
         "tests": [{"name": "Memory", "category": "Hardware", "status": "fail",
                    "detail": ["..."]}, ...]}
        # or {"state": "unreadable" / "absent", "reason": "..."}
    """

    def command(self, level: int = 1) -> str:
        return framing.command(
            [framing.Part(PART, f"dcgmi diag -r {diag_level(level)} -j", requires="dcgmi",
                          stderr="merge")]
        )  # fmt: skip

    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_diag_output(list(output))

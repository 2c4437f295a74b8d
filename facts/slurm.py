"""The node's Slurm GRES as slurmd reads it: the GPU lines of /etc/slurm/gres.conf."""

from __future__ import annotations

import re
from typing import Any

from pyinfra.api import FactBase

from gpunode.expected.slurm import GRES_CONF

# ``Name=gpu Type=<type> File=<path>`` in any order, as gres.conf(5) writes a line; values
# of the characters gpunode writes (other lines are named, not read).
_WORD = re.compile(r"(?P<key>[A-Za-z]+)=(?P<value>[A-Za-z0-9_./:\[\]-]{1,128})")
MAX_LINES = 1024
MAX_PROBLEMS_KEPT = 20


def parse_gres_conf(lines: list[str]) -> dict[str, Any]:
    """gres.conf's GPU lines -> ``{"state": "ok", "gres": [{"name", "type", "file"}], ...}``.

    Comments and lines of other GRES (no ``Name=gpu``) are skipped; a line that is not
    ``key=value`` words is named in ``problems`` (quoted and cut: node text).
    """
    gres: list[dict[str, str | None]] = []
    problems: list[str] = []
    for number, line in enumerate(lines[:MAX_LINES], start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        words = text.split()
        matches = [_WORD.fullmatch(word) for word in words]
        if not all(matches):
            problems.append(f"line {number}: {text[:80]!r}")
            continue
        fields = {match["key"].lower(): match["value"] for match in matches if match}
        if fields.get("name") != "gpu":
            continue
        gres.append({"name": "gpu", "type": fields.get("type"), "file": fields.get("file")})
    if len(lines) > MAX_LINES:
        problems.append(f"{len(lines) - MAX_LINES} lines past the first {MAX_LINES}")
    return {"state": "ok", "reason": "", "gres": gres, "problems": problems[:MAX_PROBLEMS_KEPT]}


class SlurmGres(FactBase):
    """
    The GPUs /etc/slurm/gres.conf gives slurmd.

    .. code:: python

        {"state": "ok", "reason": "",
         "gres": [{"name": "gpu", "type": "h100_80gb_hbm3", "file": "/dev/nvidia0"}, ...],
         "problems": []}  # or {"state": "absent", ...}: no slurmd or no gres.conf
    """

    def requires_command(self) -> str:
        return "slurmd"

    def command(self) -> str:
        # A marker first: an empty gres.conf (no GPU) differs from no gres.conf.
        return f"echo '# gres.conf'; cat {GRES_CONF} 2>/dev/null || echo '# absent'"

    @staticmethod
    def default() -> dict[str, Any]:
        return {"state": "absent", "reason": "slurmd is not installed", "gres": [], "problems": []}

    def process(self, output: list[str]) -> dict[str, Any]:  # type: ignore[override]
        lines = list(output)
        if lines and lines[-1].strip() == "# absent":
            return {"state": "absent", "reason": f"no {GRES_CONF}", "gres": [], "problems": []}
        return parse_gres_conf(lines[1:] if lines and lines[0].strip() == "# gres.conf" else lines)

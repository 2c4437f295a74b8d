"""Whether the node's kernel allows audit, and auditd's state and loaded rules (roles.auditd)."""

from __future__ import annotations

import re
import shlex
from typing import Any

from pyinfra.api import FactBase

from gpunode import framing
from gpunode.expected import auditd as expected

PARTS = ("support", "cmdline", "active", "rules")
MAX_RULES_KEPT = 500
_ERRNO = re.compile(r"E[A-Z0-9]{1,15}|\d{1,5}")
_REASON_TEXT = re.compile(r"[A-Za-z0-9 ,.'()/-]{0,80}")
_RULE_WORD = re.compile(r"[A-Za-z0-9_./=:-]{1,4096}")
_UNIT_STATE = re.compile(r"[a-z-]{1,32}")


def parse_support(lines: list[str], cmdline: str) -> tuple[bool | None, str]:
    """(the kernel allows audit: True/False/None unknown, why not)."""
    words = cmdline.split()
    if "audit=0" in words or "audit=off" in words:
        return False, "audit=0 on the kernel command line"
    if len(lines) != 1:
        return None, f"the kernel check printed {len(lines)} lines"
    answer = lines[0].split(" ", 2)
    if answer == ["allowed"]:
        return True, ""
    if answer[0] == "refused" and len(answer) == 3 and _ERRNO.fullmatch(answer[1]):
        text = answer[2] if _REASON_TEXT.fullmatch(answer[2]) else "(unreadable message)"
        return False, (
            f"the kernel refuses audit requests here ({answer[1]}: {text}): a container, "
            "which shares its host's kernel, or a kernel without audit"
        )
    return None, f"the kernel check printed {lines[0][:80]!r}"


def parse_auditd(output: list[str]) -> dict[str, Any]:
    frame = framing.parse(output, PARTS, max_output_chars=256 * 1024)
    support_part = frame.part("support")
    if support_part.exit_status is None and not support_part.absent:
        reason = support_part.problem or "no output"
        return {"state": "unreadable", "reason": reason, "kernel_allows": None,
                "refused_because": "", "active": None, "watches": [], "problems": []}  # fmt: skip
    cmdline = " ".join(frame.part("cmdline").lines)[:4096]
    if support_part.absent:
        allows, why = None, "python3 is not installed: the kernel's audit support is unknown"
    else:
        allows, why = parse_support(support_part.lines, cmdline)
    active_part = frame.part("active")
    active_text = active_part.lines[0].strip() if active_part.lines else ""
    active = None if active_part.absent else active_text == "active"
    problems: list[str] = []
    watches: list[dict[str, str]] = []
    rules_part = frame.part("rules")
    if rules_part.exit_status == 0:
        for line in rules_part.lines:
            watch = expected.loaded_watch(line)
            if watch and all(_RULE_WORD.fullmatch(word) for word in watch):
                watches.append({"path": watch[0], "key": watch[1]})
            elif line.strip() and line.strip() != "No rules":
                problems.append(f"auditctl -l: {line[:80]!r}")
    elif rules_part.problem:
        problems.append(f"auditctl -l: {rules_part.problem}")
    return {
        "state": "ok",
        "reason": "",
        "kernel_allows": allows,
        "refused_because": why,
        "installed": not rules_part.absent,
        "active": active,
        "unit_state": active_text if _UNIT_STATE.fullmatch(active_text) else None,
        "rules_loaded": rules_part.exit_status == 0,
        "watches": watches[:MAX_RULES_KEPT],
        # Only rules gpunode could not read are named: other rules a site loads are its own.
        "problems": [p for p in problems if "gpunode-" in p][:20],
    }


class AuditdState(FactBase):
    """
    Whether the kernel allows audit here (asked as auditctl -s does), whether auditd runs,
    and the watch rules loaded (``auditctl -l``).

    .. code:: python

        {"state": "ok", "kernel_allows": False,
         "refused_because": "the kernel refuses audit requests here (EPERM: ...)",
         "installed": False, "active": False, "rules_loaded": False, "watches": [], ...}
    """

    def command(self) -> str:
        return framing.command(self.parts())

    def parts(self) -> list[framing.Part]:
        return [
            framing.Part(
                "support",
                f"python3 -I -c {shlex.quote(expected.SUPPORT_PROBE)}",
                requires="python3",
                stderr="drop",
                # In the frame's one Python process: no interpreter of its own.
                python=expected.SUPPORT_PROBE,
            ),
            framing.Part(
                "cmdline",
                "cat /proc/cmdline",
                stderr="drop",
                python="print(open('/proc/cmdline').read(), end='')",
            ),
            framing.Part(
                "active",
                f"systemctl is-active {expected.SERVICE}",
                requires="systemctl",
                stderr="drop",
                # is-active prints ActiveState; its status is 0 for an active unit alone.
                python=framing.python_source(
                    "import sys\n"
                    'state = unit_properties(unit).get("ActiveState", "")\n'
                    "print(state)\n"
                    'sys.exit(0 if state in ("active", "reloading", "refreshing") else 3)\n',
                    unit=f"{expected.SERVICE}.service",
                ),
                systemd_units=(f"{expected.SERVICE}.service",),
            ),
            framing.Part("rules", "auditctl -l", requires="auditctl", stderr="drop"),
        ]

    def process(self, output: list[str]) -> dict[str, Any]:  # type: ignore[override]
        return parse_auditd(list(output))

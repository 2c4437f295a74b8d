"""Several facts in one SSH round trip.

pyinfra runs one command per fact. For the nightly drift check over a large fleet the round
trips, not the commands, are the cost; a FactBatch runs the commands of several facts as one
shell command, each framed by a marker, and hands each part to that fact's own process().
"""

from __future__ import annotations

from typing import Any, ClassVar

from pyinfra.api import FactBase

MARKER = "gpunode:batch:"
# What one node's batch may print: the drift check reads every node in one process, and a
# node is not trusted to bound its own output. The longest real lines are one-line payloads
# (the GPU probe's JSON, about 100 kB for 8 GPUs; config files sent base64-encoded, such as a
# CDI spec); a section holding a longer line, or output past the total, is unreadable.
MAX_LINE_CHARS = 4 << 20
MAX_OUTPUT_CHARS = 32 << 20


def unreadable(name: str, reason: str) -> dict[str, Any]:
    return {"state": "unreadable", "reason": f"{name}: {reason}"}


class FactBatch(FactBase):
    """The values of ``FACTS`` (name -> fact class), gathered with one command.

    A part whose output its fact cannot process becomes an explicit unreadable result naming
    the fact, so one broken tool never hides the others.
    """

    FACTS: ClassVar[dict[str, type[FactBase]]] = {}

    def command(self) -> str:
        parts = [
            # A subshell per part: one fact's `exit` or `set -e` cannot end the others.
            f"echo {MARKER}{name}; ( {fact().command()} ) 2>&1"
            for name, fact in self.FACTS.items()
        ]
        return "; ".join(parts) + f"; echo {MARKER}end"

    def process(self, output: list[str]) -> dict[str, Any]:
        sections: dict[str, list[str]] = {}
        refused: dict[str, str] = {}  # section -> why its output is not read
        current: list[str] | None = None
        name = ""
        complete = False
        size = 0
        for line in output:
            size += len(line) + 1
            if line.startswith(MARKER):
                name = line[len(MARKER) :].strip()
                complete = complete or name == "end"
                current = sections.setdefault(name, []) if name in self.FACTS else None
            elif current is None or name in refused:
                continue
            elif size > MAX_OUTPUT_CHARS:
                refused[name] = f"the node's output passed {MAX_OUTPUT_CHARS} characters here"
            elif len(line) > MAX_LINE_CHARS:
                refused[name] = f"a line of {len(line)} characters (over {MAX_LINE_CHARS})"
            else:
                current.append(line)
        values: dict[str, Any] = {}
        for name, fact in self.FACTS.items():
            if name in refused:
                values[name] = unreadable(name, f"not read: {refused[name]}")
                continue
            if name not in sections:
                values[name] = unreadable(name, "no output (the batch was cut short)")
                continue
            try:
                values[name] = fact().process(sections[name])
            except Exception as error:  # a parser bug must not cost the other sections
                values[name] = unreadable(name, f"could not parse: {error!r}")
        values["complete"] = complete
        return values

"""Several facts in one SSH round trip.

pyinfra runs one command per fact. For the nightly drift check over a large fleet the round
trips, not the commands, are the cost; a FactBatch runs the commands of several facts as one
shell command (``gpunode.framing``), each in its own part, and hands each part to that fact's
own process(), as pyinfra would have run the fact alone: the fact's stdout only, its
``requires_command()`` checked first (missing: the fact's ``default()``, as pyinfra gives),
a non-zero exit status a failed read.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pyinfra.api import FactBase

from gpunode import framing

# What one node's batch may print: the drift check reads every node in one process, and a
# node is not trusted to bound its own output. The longest real lines are one-line payloads
# (the GPU probe's JSON, about 100 kB for 8 GPUs; config files sent base64-encoded, such as a
# CDI spec); a part holding a longer line, or output past the total, is unreadable.
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
        parts = []
        for name, cls in self.FACTS.items():
            fact = cls()
            own = _own_parts(cls)
            if own is not None:
                # The fact's parts become the batch's, so that the Python parts of every
                # fact run in the batch's one Python process (gpunode.framing).
                parts += framing.prefixed(name, own)
                continue
            # pyinfra takes requires_command as a method or a plain value; so does a batch.
            attribute: Any = fact.requires_command
            requires = attribute() if callable(attribute) else attribute
            parts.append(
                framing.Part(
                    name,
                    str(fact.command()),
                    requires=None if requires is None else str(requires),
                )
            )
        return framing.command(parts)

    def process(self, output: list[str]) -> dict[str, Any]:
        frame = framing.parse(output, self._part_names(), MAX_LINE_CHARS, MAX_OUTPUT_CHARS)
        values: dict[str, Any] = {name: self._value(name, frame) for name in self.FACTS}
        values["complete"] = frame.complete
        return values

    def _part_names(self) -> list[str]:
        names = []
        for name, cls in self.FACTS.items():
            own = _own_parts(cls)
            names += [name] if own is None else [part.name for part in framing.prefixed(name, own)]
        return names

    def _value(self, name: str, frame: framing.FrameOutput) -> Any:
        fact = self.FACTS[name]()
        own = _own_parts(self.FACTS[name])
        if own is not None:
            # The output its own command would have printed: its parts, in a frame of their own.
            lines, why = framing.unprefixed_output(frame, name, [part.name for part in own])
            if lines is None:
                return unreadable(name, why)
            try:
                return fact.process(lines)
            except Exception as error:  # a parser bug must not cost the other parts
                return unreadable(name, f"could not parse: {error!r}")
        part = frame.part(name)
        if part.problem is not None:
            return unreadable(name, part.problem)
        if part.absent:
            return fact.default()
        if part.exit_status != 0:
            detail = " ".join(" ".join(part.stderr or part.lines).split())[:300]
            return unreadable(name, f"exit status {part.exit_status}: {detail or 'no message'}")
        if not part.lines:
            return fact.default()
        try:
            return fact.process(part.lines)
        except Exception as error:  # a parser bug must not cost the other parts
            return unreadable(name, f"could not parse: {error!r}")


_PARTS: dict[type, tuple[framing.Part, ...] | None] = {}


def _own_parts(cls: type[FactBase]) -> tuple[framing.Part, ...] | None:
    """The framing parts a fact's command is made of (its ``parts()``), where it has them
    and needs no program of its own; else None: the batch runs its command whole. Made once
    per fact class: the batch reads them for its command and again for every host's output
    (the GPU probe's part carries the probe's source)."""
    if cls in _PARTS:
        return _PARTS[cls]
    fact = cls()
    parts = getattr(fact, "parts", None)
    attribute: Any = fact.requires_command
    requires = attribute() if callable(attribute) else attribute
    made = tuple(parts()) if callable(parts) and requires is None else None
    _PARTS[cls] = made
    return made

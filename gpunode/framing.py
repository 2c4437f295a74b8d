"""Several commands in one SSH round trip: one framing, used by deploys, drift and facts.

``command(parts)`` builds ONE POSIX sh command from named parts; ``parse(lines)`` reads its
output back into one result per part. What the shell prints:

- a header line ``##gpunode-frame:<token>:begin``, first: the token (16 random hex digits,
  new for every command built) is what every later marker carries, so no tool output, log
  line or file a part prints can pass for a marker unless it guesses the token;
- per part, ``...:part:<name>``, then the part's output, then ``...:exit:<name>:<status>``
  (its exit status), or ``...:absent:<name>`` where the program it requires is not installed
  (pyinfra's ``requires_command``) and it was not run; with ``stderr="separate"`` its stderr
  lines come before the exit marker, each as ``...:stderr:<line>``;
- ``...:done`` last, so output cut short (a dropped connection, a killed shell) shows as such.

Each part runs in its own subshell: its ``exit``, ``set -e`` or ``cd`` cannot end or change
the others. A marker is found anywhere in a line, so the last line of a tool that prints no
final newline does not hide the marker glued to it. The command itself always exits 0: what
each part did is data in the output, not a failed command.

Node output is untrusted: ``parse`` never raises, keeps what it can read, and names what it
cannot. With ``max_line_chars`` / ``max_output_chars`` a part holding a longer line, or whose
output comes after the total has passed, is not read (``problem`` says why), the rest is.

Standard library only, so the node-side probe could use it too.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

PREFIX = "##gpunode-frame:"
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# A program name for ``command -v``: a plain word (pyinfra's requires_command is one).
PROGRAM = re.compile(r"[A-Za-z0-9_.+-]{1,64}")
_TOKEN = re.compile(r"[0-9a-f]{16}")
_BEGIN = re.compile(re.escape(PREFIX) + r"([0-9a-f]{16}):begin")
NO_HEADER = "no frame header: not a framed output"

Stderr = Literal["separate", "merge", "drop"]


@dataclass(frozen=True)
class Part:
    """One named command of a frame.

    ``requires``: the program that must be on the PATH (``command -v``) for the part to run;
    without it the part is reported absent. ``after``: an earlier part that must have exited
    0 for this one to run (reading more is pointless once it failed); otherwise this part is
    reported skipped. ``stderr``: ``separate`` (captured, printed after
    the part's stdout as stderr marker lines: what pyinfra hands a fact is stdout alone),
    ``merge`` (``2>&1``, interleaved with stdout) or ``drop`` (``2>/dev/null``).
    """

    name: str
    command: str
    requires: str | None = None
    stderr: Stderr = "separate"
    after: str | None = None

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name):
            raise ValueError(f"part name {self.name!r} is not a plain word ({NAME.pattern})")
        if self.requires is not None and not PROGRAM.fullmatch(self.requires):
            raise ValueError(f"required program {self.requires!r} is not a plain word")
        if self.stderr not in ("separate", "merge", "drop"):
            raise ValueError(f"stderr {self.stderr!r}: one of separate, merge, drop")


def new_token() -> str:
    return secrets.token_hex(8)


def _marker(token: str, event: str) -> str:
    return f"{PREFIX}{token}:{event}"


def _run(part: Part, token: str) -> str:
    # The command ends with a newline so a trailing comment cannot swallow the ")".
    inner = f"( {part.command}\n)"
    end = f'echo "{_marker(token, "exit:" + part.name)}:$gpunode_rc"'
    if part.stderr == "separate":
        # stdout passes straight through (fd 3); stderr is captured and printed after it.
        return (
            f"{{ gpunode_err=$( {inner} 2>&1 1>&3 3>&- ); gpunode_rc=$?; }} 3>&1; "
            f'[ -z "$gpunode_err" ] || printf "%s\\n" "$gpunode_err" '
            f"| sed 's/^/{_marker(token, 'stderr:')}/'; {end}"
        )
    redirect = "2>&1" if part.stderr == "merge" else "2>/dev/null"
    return f"{inner} {redirect}; gpunode_rc=$?; {end}"


def command(parts: Iterable[Part], token: str | None = None) -> str:
    """ONE shell command running ``parts`` in order, framed for ``parse``."""
    token = new_token() if token is None else token
    if not _TOKEN.fullmatch(token):
        raise ValueError(f"token {token!r} is not 16 lowercase hex digits")
    chosen = list(parts)
    names = [part.name for part in chosen]
    if len(set(names)) != len(names):
        raise ValueError(f"part names repeat: {names}")
    for part in chosen:
        if part.after is not None and part.after not in names[: names.index(part.name)]:
            raise ValueError(f"part {part.name!r} runs after {part.after!r}, not an earlier part")
    lines = [
        # Tools such as ibstat and nvme live in sbin, which a non-root user's PATH lacks.
        'PATH="$PATH:/usr/sbin:/sbin"',
        f"echo '{_marker(token, 'begin')}'",
    ]
    for index, part in enumerate(chosen):
        # Each part's status is kept (gpunode_rc_<index>) for the parts that run after it.
        run = _run(part, token) + f"; gpunode_rc_{index}=$gpunode_rc"
        if part.requires is not None:
            run = (
                f"if command -v {shlex.quote(part.requires)} >/dev/null 2>&1; then {run}; "
                f"else echo '{_marker(token, 'absent:' + part.name)}'; fi"
            )
        if part.after is not None:
            run = (
                f'if [ "${{gpunode_rc_{names.index(part.after)}:-}}" = 0 ]; then {run}; '
                f"else echo '{_marker(token, 'skipped:' + part.name)}'; fi"
            )
        # Set first: a frame run inside another's part must not see the outer frame's value.
        lines.append(f"gpunode_rc_{index}=; echo '{_marker(token, 'part:' + part.name)}'; {run}")
    lines.append(f"echo '{_marker(token, 'done')}'")
    return "\n".join(lines)


@dataclass
class PartOutput:
    """What one part printed: ``lines`` (stdout; with ``stderr="merge"`` stderr too),
    ``stderr`` (with ``stderr="separate"``), ``exit_status`` (None: the output ended before
    it, cut short), ``absent`` (its required program is not installed; it did not run),
    ``skipped`` (the part it runs after did not succeed; it did not run), ``problem`` (why
    its output is not read: over a size limit, or cut short)."""

    name: str
    lines: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    exit_status: int | None = None
    absent: bool = False
    skipped: bool = False
    problem: str | None = None

    @property
    def complete(self) -> bool:
        return self.absent or self.skipped or self.exit_status is not None

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass
class FrameOutput:
    """Every part found, by name; ``complete``: the end-of-batch marker was seen."""

    parts: dict[str, PartOutput]
    complete: bool
    problems: list[str] = field(default_factory=list)  # what was not understood, and where

    def part(self, name: str) -> PartOutput:
        """That part; one the output never reached is an empty part naming why."""
        found = self.parts.get(name)
        if found is not None:
            return found
        if not self.framed:
            return PartOutput(name, problem="no output: not a framed output (no frame header)")
        return PartOutput(name, problem="no output: the output was cut short before it")

    @property
    def framed(self) -> bool:
        return NO_HEADER not in self.problems


def parse(
    lines: Iterable[str],
    names: Iterable[str] | None = None,
    max_line_chars: int | None = None,
    max_output_chars: int | None = None,
) -> FrameOutput:
    """The output of ``command(parts)`` -> each part's output. ``names``: the parts expected
    (others are ignored and named in ``problems``); None takes every part found."""
    expected = None if names is None else set(names)
    parts: dict[str, PartOutput] = {}
    problems: list[str] = []
    iterator = iter(lines)
    tag = None
    for number, line in enumerate(iterator, 1):
        if match := _BEGIN.fullmatch(line.rstrip("\r")):
            tag = f"{PREFIX}{match.group(1)}:"
            if number > 1:
                problems.append(f"{number - 1} line(s) before the frame header ignored")
            break
    if tag is None:
        return FrameOutput({}, False, [NO_HEADER])
    current: PartOutput | None = None
    size = 0
    over = False  # the total output has passed max_output_chars
    stray = 0
    complete = False

    def content(part: PartOutput | None, text: str, stream: list[str] | None = None) -> None:
        nonlocal over, stray
        if part is None:
            stray += 1
            return
        if part.problem is not None:
            return
        if max_output_chars is not None and size > max_output_chars:
            over = True
            part.problem = f"not read: the node's output passed {max_output_chars} characters"
        elif max_line_chars is not None and len(text) > max_line_chars:
            part.problem = f"not read: a line of {len(text)} characters (over {max_line_chars})"
        else:
            (part.lines if stream is None else stream).append(text)

    for line in iterator:
        size += len(line) + 1
        where = line.find(tag)
        if where < 0:
            content(current, line)
            continue
        if where > 0:  # a last line without its newline, the marker glued to it
            content(current, line[:where])
        kind, _, rest = line[where + len(tag) :].rstrip("\r").partition(":")
        if kind == "done" and not rest:
            complete = True
            break
        if kind == "part":
            if rest in parts or not NAME.fullmatch(rest):
                problems.append(f"part {rest[:80]!r} repeated or misnamed: ignored")
                current = None
            elif expected is not None and rest not in expected:
                problems.append(f"unexpected part {rest!r}: ignored")
                current = None
            else:
                current = parts[rest] = PartOutput(rest)
                if over:
                    current.problem = (
                        f"not read: the node's output passed {max_output_chars} characters"
                    )
        elif kind == "stderr" and current is not None:
            content(current, rest, current.stderr)
        elif kind == "absent" and current is not None and rest == current.name:
            current.absent = True
            current = None
        elif kind == "skipped" and current is not None and rest == current.name:
            current.skipped = True
            current = None
        elif kind == "exit" and current is not None:
            name, _, status = rest.rpartition(":")
            if name == current.name and status.isdigit() and status.isascii():
                current.exit_status = int(status)
                current = None
            else:
                problems.append(f"malformed exit marker {rest[:80]!r}")
        else:
            problems.append(f"unknown marker {kind[:40]!r}")
    if stray:
        problems.append(f"{stray} line(s) outside any part ignored")
    for part in parts.values():
        if not part.complete and part.problem is None:
            part.problem = "cut short: the output ended before its exit status"
    return FrameOutput(parts, complete, problems)


def output_of(
    parts: Mapping[str, PartOutput | list[str]], token: str | None = None, complete: bool = True
) -> list[str]:
    """The lines ``command`` prints for parts that printed this: what a node would send back,
    for tests and doubles that stand in for a node. A list is a part's stdout, exit status 0;
    a PartOutput says what it printed, its status or that it is absent."""
    token = new_token() if token is None else token
    lines = [_marker(token, "begin")]
    for name, given in parts.items():
        part = given if isinstance(given, PartOutput) else PartOutput(name, list(given), [], 0)
        lines.append(_marker(token, f"part:{name}"))
        if part.absent or part.skipped:
            lines.append(_marker(token, f"{'absent' if part.absent else 'skipped'}:{name}"))
            continue
        lines += part.lines
        lines += [_marker(token, f"stderr:{line}") for line in part.stderr]
        if part.exit_status is not None:
            lines.append(_marker(token, f"exit:{name}:{part.exit_status}"))
    if complete:
        lines.append(_marker(token, "done"))
    return lines

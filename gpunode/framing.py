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
from dataclasses import dataclass, field, replace
from typing import Literal

PREFIX = "##gpunode-frame:"
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# A program name for ``command -v``: a plain word (pyinfra's requires_command is one).
PROGRAM = re.compile(r"[A-Za-z0-9_.+-]{1,64}")
_TOKEN = re.compile(r"[0-9a-f]{16}")
# A systemd unit name with its type (systemd.unit(5)): what ``systemctl show`` is asked about.
UNIT = re.compile(r"[A-Za-z0-9:_.@-]{1,200}\.(service|socket|timer|target|mount|path|slice)")
# What ``unit_properties`` answers: systemctl is-enabled prints UnitFileState, is-active
# ActiveState (its exit status is 0 for active and reloading), LoadState says whether a unit
# file exists (not-found).
UNIT_PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "UnitFileState")
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

    ``python``: the same part as Python source (standard library only) that prints what
    ``command`` prints and ends with the status it exits with (``sys.exit``; an exception is
    status 1, its message the part's stderr). Every Python part of a frame runs in ONE
    ``python3`` process where the node has one, instead of a shell pipeline of programs per
    part: on a node each program started costs a few milliseconds of CPU, reading a file in
    the process that is already running costs next to nothing. Without ``python3`` the shell
    command runs, so a fact reads a fresh node all the same. A part's source must not write
    to file descriptor 1 itself (a program it runs has its output captured). A Python part
    runs after another only if that one is a Python part too.

    Python parts have ``read_bytes(path)`` at hand: a file's bytes, None where it cannot be
    read; and ``dpkg_packages(directory, chosen)``: the packages of dpkg's database in
    ``directory`` (``/var/lib/dpkg``) whose name ``chosen`` accepts, as
    ``(status_abbrev, package, version)`` in dpkg-query's order (by name, then architecture),
    the database read once for every part of the frame; None where dpkg-query itself must
    answer (records still in dpkg's journal, which it applies first, or no database).

    ``systemd_units``: the units whose state the Python source reads with
    ``unit_properties(unit)`` (a dict of ``UNIT_PROPERTIES``; empty where systemctl is
    missing): ONE ``systemctl show`` answers every unit of the frame's Python parts, where
    each ``systemctl is-enabled`` or ``is-active`` costs the node a program and systemd's
    own work to answer it.
    """

    name: str
    command: str
    requires: str | None = None
    stderr: Stderr = "separate"
    after: str | None = None
    python: str | None = None
    systemd_units: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not NAME.fullmatch(self.name):
            raise ValueError(f"part name {self.name!r} is not a plain word ({NAME.pattern})")
        if self.requires is not None and not PROGRAM.fullmatch(self.requires):
            raise ValueError(f"required program {self.requires!r} is not a plain word")
        if self.stderr not in ("separate", "merge", "drop"):
            raise ValueError(f"stderr {self.stderr!r}: one of separate, merge, drop")
        for unit in self.systemd_units:
            if not UNIT.fullmatch(unit):
                raise ValueError(f"systemd unit {unit!r} is not a unit name ({UNIT.pattern})")
        if self.systemd_units and self.python is None:
            raise ValueError(f"part {self.name!r} reads systemd units but has no Python source")


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


def command(parts: Iterable[Part], token: str | None = None, python: bool = True) -> str:
    """ONE shell command running ``parts`` in order, framed for ``parse``.

    The parts that have Python source run together in one ``python3`` process, at the place
    of the first of them, where the node has ``python3``; ``python=False`` always runs
    their shell commands (what a node without ``python3`` runs; the tests compare the two).
    """
    token = new_token() if token is None else token
    if not _TOKEN.fullmatch(token):
        raise ValueError(f"token {token!r} is not 16 lowercase hex digits")
    chosen = list(parts)
    names = [part.name for part in chosen]
    if len(set(names)) != len(names):
        raise ValueError(f"part names repeat: {names}")
    by_name = {part.name: part for part in chosen}
    for part in chosen:
        if part.after is not None and part.after not in names[: names.index(part.name)]:
            raise ValueError(f"part {part.name!r} runs after {part.after!r}, not an earlier part")
        if part.after is not None and (part.python is None) != (by_name[part.after].python is None):
            raise ValueError(
                f"part {part.name!r} runs after {part.after!r}: both must have Python source, "
                "or neither (the Python parts run in one process of their own)"
            )
    lines = [
        # Tools such as ibstat and nvme live in sbin, which a non-root user's PATH lacks.
        'PATH="$PATH:/usr/sbin:/sbin"',
        f"echo '{_marker(token, 'begin')}'",
    ]
    in_python = [part for part in chosen if part.python is not None] if python else []
    for index, part in enumerate(chosen):
        if part in in_python:
            if part is in_python[0]:
                shell = "\n".join(
                    _without_python3(p, names.index(p.name), names, token) for p in in_python
                )
                runner = _python_runner(in_python, token)
                lines.append(
                    f"if command -v python3 >/dev/null 2>&1; then {runner}else\n{shell}\nfi"
                )
            continue
        lines.append(_shell_part(part, index, names, token))
    lines.append(f"echo '{_marker(token, 'done')}'")
    return "\n".join(lines)


def _without_python3(part: Part, index: int, names: list[str], token: str) -> str:
    """A Python part where the node has no python3: its shell command; one that needs
    python3 itself (the GPU probe) is absent without it, and its command, which may be large,
    is left out of the frame."""
    if part.requires == "python3":
        begin, absent = _marker(token, "part:" + part.name), _marker(token, "absent:" + part.name)
        return f"gpunode_rc_{index}=; echo '{begin}'; echo '{absent}'"
    return _shell_part(part, index, names, token)


def _shell_part(part: Part, index: int, names: list[str], token: str) -> str:
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
    return f"gpunode_rc_{index}=; echo '{_marker(token, 'part:' + part.name)}'; {run}"


# dpkg's database, as Python parts name it to the frame's ``dpkg_packages`` (see Part).
DPKG_DIR = "/var/lib/dpkg"

# The program that runs a frame's Python parts, each as the shell would have run its command:
# the same markers, its stderr captured per ``stderr``, its exit status from ``sys.exit`` (an
# exception: 1, and its message on stderr). Kept to what Python 3.9 and later have.
_RUNNER = r"""
import io, os, sys
def _gpunode_units(units, properties):
    answers = {}
    def unit_properties(unit):
        if not answers and units:
            import subprocess
            try:
                shown = subprocess.run(
                    ["systemctl", "show", "--property=" + ",".join(properties), "--", *units],
                    capture_output=True, stdin=subprocess.DEVNULL, text=True,
                ).stdout
            except OSError:
                shown = ""
            blocks = shown.split("\n\n") if shown.strip() else []
            for name, block in zip(units, blocks):
                answers[name] = dict(
                    line.split("=", 1) for line in block.splitlines() if "=" in line
                )
            for name in units:
                answers.setdefault(name, {})
        return dict(answers.get(unit, {}))
    return unit_properties
def _gpunode_dpkg():
    # dpkg's status database, read once per frame for every part that asks: its
    # ${db:Status-Abbrev} letters are the Status field's three words (dpkg-query(1)).
    want = {"unknown": "u", "install": "i", "hold": "h", "deinstall": "r", "purge": "p"}
    flag = {"ok": " ", "reinstreq": "R"}
    state = {"not-installed": "n", "config-files": "c", "half-installed": "H",
             "unpacked": "U", "half-configured": "F", "triggers-awaited": "W",
             "triggers-pending": "t", "installed": "i"}
    databases = {}
    def read(directory):
        import re
        try:
            if any(name.isdigit() for name in os.listdir(directory + "/updates")):
                return None  # records in dpkg's journal: dpkg-query applies them first
        except OSError:
            pass
        try:
            with open(directory + "/status", encoding="utf-8", errors="surrogateescape") as held:
                text = held.read()
        except OSError:
            return None
        found = re.compile(r"^Package: *(.*)$", re.M).finditer(text)
        return text, [(match.group(1), match.start()) for match in found]
    def dpkg_packages(directory, chosen):
        import re
        if directory not in databases:
            databases[directory] = read(directory)
        database = databases[directory]
        if database is None:
            return None
        text, names = database
        found = []
        for name, start in names:
            if not chosen(name):
                continue
            end = text.find("\n\n", start)
            stanza = text[start:] if end < 0 else text[start:end]
            fields = dict(re.findall(r"^(Status|Version|Architecture): *(.*)$", stanza, re.M))
            words = (fields.get("Status", "").split() + ["", "", ""])[:3]
            abbrev = want.get(words[0], "?") + state.get(words[2], "?") + flag.get(words[1], "?")
            key = (name, fields.get("Architecture", ""))
            found.append((key, (abbrev, name, fields.get("Version", ""))))
        return [record for _, record in sorted(found, key=lambda item: item[0])]
    return dpkg_packages
def _gpunode_read_bytes(path):
    try:
        with open(path, "rb") as held:
            return held.read()
    except OSError:
        return None
def _gpunode_frame(prefix, parts, units, properties):
    unit_properties = _gpunode_units(units, properties)
    dpkg_packages = _gpunode_dpkg()
    status = {}
    # Text written through at once: a part's print and its writes to sys.stdout.buffer (bytes
    # as the node has them) keep their order; what cannot be encoded goes out as it came in.
    sys.stdout.reconfigure(write_through=True, errors="surrogateescape")
    out = sys.stdout
    path = [d for d in os.environ.get("PATH", "").split(":") if d]
    for name, source, requires, stderr, after in parts:
        out.write(prefix + "part:" + name + "\n")
        if after is not None and status.get(after) != 0:
            out.write(prefix + "skipped:" + name + "\n")
            continue
        if requires is not None and not any(
            os.access(os.path.join(d, requires), os.X_OK) for d in path
        ):
            out.write(prefix + "absent:" + name + "\n")
            continue
        captured = io.StringIO()
        sys.stderr = captured
        code = 0
        try:
            space = {
                "__name__": "__gpunode_part__",
                "unit_properties": unit_properties,
                "read_bytes": _gpunode_read_bytes,
                "dpkg_packages": dpkg_packages,
            }
            exec(compile(source, name, "exec"), space)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except Exception as error:
            code = 1
            captured.write("%s: %s\n" % (type(error).__name__, error))
        finally:
            sys.stderr = sys.__stderr__
        errors = captured.getvalue()
        if stderr == "separate":
            for line in errors.splitlines():
                out.write(prefix + "stderr:" + line + "\n")
        elif stderr == "merge" and errors:
            out.write(errors if errors.endswith("\n") else errors + "\n")
        status[name] = code & 255
        out.write(prefix + "exit:" + name + ":" + str(code & 255) + "\n")
        out.flush()
"""


def python_source(body: str, **constants: object) -> str:
    """A Python part's source: ``constants`` first, as assignments of their ``repr`` (plain
    values only: str, bytes, int, tuples of them), then ``body``; never text pasted into code."""
    for name, value in constants.items():
        if not name.isidentifier() or not _plain(value):
            raise ValueError(f"constant {name!r} = {value!r}: a name and a plain value")
    assignments = "".join(f"{name} = {value!r}\n" for name, value in constants.items())
    return assignments + body.lstrip("\n")


def _plain(value: object) -> bool:
    """str, bytes, int, or a tuple of those: values whose repr is the value in Python code."""
    if isinstance(value, tuple):
        return all(_plain(item) for item in value)
    return isinstance(value, str | bytes | int)


def _python_runner(parts: list[Part], token: str) -> str:
    """``python3`` reading the runner and the parts' sources from a here-document: they can
    be larger than one argument may be (Linux: 128 kB), and Python reads its whole program
    before it runs any of it, so a program a part starts finds its standard input at its end."""
    table = [(p.name, p.python, p.requires, p.stderr, p.after) for p in parts]
    units = sorted({unit for part in parts for unit in part.systemd_units})
    call = f"_gpunode_frame({_marker(token, '')!r}, {table!r}, {units!r}, {UNIT_PROPERTIES!r})"
    source = f"{_RUNNER}\n{call}\n"
    delimiter = f"gpunode_python_{token}"
    if delimiter in source:  # repr() cannot print it alone on a line; this says so
        raise ValueError(f"a Python part holds the frame's here-document delimiter {delimiter}")
    # -I: no user site or environment variables; -S: no site-packages: the parts need the
    # standard library alone, and importing site is a tenth of the interpreter's start.
    return f"python3 -I -S - <<'{delimiter}'\n{source}{delimiter}\n"


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


def prefixed(prefix: str, parts: Iterable[Part]) -> list[Part]:
    """``parts`` named ``prefix.<name>`` (and what they run after): one fact's parts among
    the parts of a batch of several facts."""
    return [
        replace(
            part,
            name=f"{prefix}.{part.name}",
            after=None if part.after is None else f"{prefix}.{part.after}",
        )
        for part in parts
    ]


def unprefixed_output(
    frame: FrameOutput, prefix: str, names: Iterable[str]
) -> tuple[list[str] | None, str]:
    """What the parts ``names`` would have printed in a frame of their own, read from
    ``frame`` where they ran as ``prefixed(prefix, ...)``: (lines, ""), or (None, why) where
    one of them did not come back whole."""
    outputs: dict[str, PartOutput] = {}
    for name in names:
        found = frame.part(f"{prefix}.{name}")
        if found.problem is not None:
            return None, f"{name}: {found.problem}"
        outputs[name] = found
    return output_of(outputs), ""


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

"""What a support ticket carries, read offline: each file's kind told by its content, and an
``nvidia-bug-report.log.gz`` split into the sections triage can judge.

Kinds (``KINDS``): ``nvidia-smi -q -x``, ``nvidia-smi -q`` text, ``nvidia-smi nvlink -s`` and
``-e``,
``ibstat``, a kernel log (dmesg, ``journalctl -k``, syslog), ``dcgmi diag -j``, the probe's
JSON report, nvidia-smi's lines naming a GPU it cannot open, and NVIDIA's bug report.

The bug report (NVIDIA's nvidia-bug-report.sh, as its driver packages ship it): a gzip text
whose sections each begin with a line of 44 underscores, a blank line and the section's title:
the file appended ("*** /var/log/..."), or the command run ("/usr/bin/nvidia-smi --query",
"journalctl -b -0 ..."), or the script's own words ("Scanning kernel log files for NVIDIA
kernel messages:", "dmesg:"). Its ``nvidia-smi --query`` section also holds ``--query
--unit``'s output after that command's own title line. Sections of other kinds (lspci,
dmidecode, X logs...) are counted, not judged.

A file that cannot be read at all (missing, empty, too large, a broken gzip, a kind triage
does not know) raises ``Unreadable`` naming the file and why; nothing is judged then.
"""

from __future__ import annotations

import gzip
import io
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from gpunode.probe.query_text import LOOKS_LIKE_QUERY

# A bug report of a large node is tens of MB of text; far more is no bug report.
MAX_FILE_BYTES = 64 << 20
MAX_TEXT_BYTES = 512 << 20
GZIP_MAGIC = b"\x1f\x8b"
SECTION_RULE = "_" * 44
SAMPLE_CHARS = 1 << 20
MAX_LINE_CHARS = 4096
BUG_REPORT_HEAD = "Start of NVIDIA bug report log file"

XML, QUERY, NVLINK, NVLINK_ERRORS, IBSTAT, KERNEL, DCGM, PROBE, UNREACHABLE, BUG_REPORT = (
    "nvidia-smi -q -x", "nvidia-smi -q", "nvidia-smi nvlink -s", "nvidia-smi nvlink -e",
    "ibstat", "kernel log", "dcgmi diag -j", "gpunode probe report",
    "nvidia-smi (a GPU it cannot open)", "nvidia-bug-report",
)  # fmt: skip
KINDS = (XML, QUERY, NVLINK, NVLINK_ERRORS, IBSTAT, KERNEL, DCGM, PROBE, UNREACHABLE, BUG_REPORT)

_NVLINK_GPU = re.compile(r"^GPU \d+: .*\(UUID: [^)]+\)\s*$", re.MULTILINE)
# nvidia-smi nvlink -e's counter lines ("\t Link 0: Replay Errors: 0").
_NVLINK_COUNTER = re.compile(r"^[ \t]*Link \d+: (?:Replay|Recovery|CRC) Errors: \d+", re.MULTILINE)
_IBSTAT_CA = re.compile(r"^(?:CA|Switch) '[^']+'\s*$", re.MULTILINE)
# A kernel log line: dmesg's "[   12.345678] ", or a syslog / journal line ("Sep 10 01:02:03
# host tag: ...", "2026-12-07T06:00:00+0000 host tag: ...") whatever its tag.
_KERNEL_LINE = re.compile(
    r"^\s*\[\s*\d+\.\d+\]|^(?:[A-Z][a-z]{2} [ 0-9]\d \d{2}:\d{2}:\d{2}"
    r"|\d{4}-\d{2}-\d{2}T[0-9:.]+(?:Z|[+-][0-9:]+)?) \S+ [^\s:]+: "
)


class Unreadable(Exception):
    """A file triage cannot read at all: one line naming the file and why."""


@dataclass
class Piece:
    """One readable part of the input: its kind, its text, where it came from."""

    kind: str
    text: str
    origin: str


@dataclass
class Source:
    """One file as triage read it: its kind, its pieces, and what it left unjudged."""

    path: str
    kind: str
    pieces: list[Piece] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def read_text(path: Path) -> str:
    """The file's text (gunzipped where it is gzip), decoded with replacement."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise Unreadable(f"{path}: {size} bytes, more than {MAX_FILE_BYTES} (not a capture)")
        data = path.read_bytes()
    except OSError as error:
        raise Unreadable(f"{path}: {error.strerror or error}") from None
    if data.startswith(GZIP_MAGIC):
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
                data = stream.read(MAX_TEXT_BYTES + 1)
        except (OSError, EOFError, zlib.error) as error:
            raise Unreadable(f"{path}: a broken gzip file ({error})") from None
        if len(data) > MAX_TEXT_BYTES:
            raise Unreadable(f"{path}: more than {MAX_TEXT_BYTES} bytes once gunzipped")
    text = data.decode("utf-8", errors="replace")
    if not text.strip():
        raise Unreadable(f"{path}: empty")
    return text


def kind_of(text: str) -> str | None:
    """The kind of one output, told by its content; None where it is none triage reads."""
    head = text.lstrip()[:4096]
    # The line patterns read a bounded sample, each line cut: a hostile file costs no more.
    sample = "\n".join(line[:MAX_LINE_CHARS] for line in text[:SAMPLE_CHARS].split("\n"))
    if head.startswith("<?xml") or "<nvidia_smi_log" in head:
        return XML
    if BUG_REPORT_HEAD in head:
        return BUG_REPORT
    if head.startswith("{") and "gpunode.gpu-report/" in head:
        return PROBE
    if '"DCGM Diagnostic"' in text[: 1 << 20] or '"DCGM GPU Diagnostic"' in text[: 1 << 20]:
        return DCGM
    if LOOKS_LIKE_QUERY.search(text):
        return QUERY
    if _IBSTAT_CA.search(text):
        return IBSTAT
    if _NVLINK_GPU.search(text):
        return NVLINK_ERRORS if _NVLINK_COUNTER.search(sample) else NVLINK
    if "NVRM: Xid" in text or "SXid (PCI:" in text:
        return KERNEL
    if "Unable to determine the device handle" in text:
        return UNREACHABLE
    lines = [line for line in sample.split("\n")[:2000] if line.strip()]
    if lines and sum(1 for line in lines if _KERNEL_LINE.search(line)) * 2 >= len(lines):
        return KERNEL
    return None


def read_source(path: Path) -> Source:
    """One file: its kind and the pieces triage judges."""
    text = read_text(path)
    kind = kind_of(text)
    if kind is None:
        raise Unreadable(f"{path}: not an output triage reads (one of: {', '.join(KINDS)})")
    if kind == BUG_REPORT:
        return bug_report(str(path), text)
    return Source(str(path), kind, [Piece(kind, text, str(path))])


def _sections(text: str) -> list[tuple[str, list[str]]]:
    """(title, body lines) of each section, the title being its first non-blank line."""
    sections: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    for line in text.split("\n"):
        if line.strip() == SECTION_RULE:
            current = []
            sections.append(("", current))
            continue
        if current is None:
            continue
        if not sections[-1][0]:
            if line.strip():
                sections[-1] = (line.strip(), current)
            continue
        current.append(line)
    return sections


_KERNEL_TITLES = ("Scanning kernel log files for NVIDIA kernel messages:", "dmesg:")
_KERNEL_FILES = ("messages", "kern.log", "syslog", "dmesg", "kernel.log")


def _kernel_section(title: str) -> bool:
    if title in _KERNEL_TITLES:
        return True
    if title.startswith("journalctl -b") and "_COMM=" not in title:
        return True
    return title.startswith("*** /var/log/") and title.endswith(_KERNEL_FILES)


def bug_report(path: str, text: str) -> Source:
    """nvidia-bug-report's sections triage judges: nvidia-smi's query (and its XML where a
    report holds it), ibstat where present, and the kernel messages; the others counted."""
    source = Source(path, BUG_REPORT)
    kernel: list[tuple[str, Piece]] = []
    for title, lines in _sections(text):
        body = "\n".join(lines)
        where = f"{path}: section '{title[:80]}'"
        if title.endswith(("nvidia-smi --query", "nvidia-smi -q")):
            # --query --unit follows in the same section, after its own title line.
            unit = (n for n, line in enumerate(lines) if line.strip().endswith("--query --unit"))
            cut = next(unit, len(lines))
            source.pieces.append(Piece(QUERY, "\n".join(lines[:cut]), where))
        elif "nvidia-smi" in title and title.endswith(("-q -x", "--query --xml-format")):
            source.pieces.append(Piece(XML, body, where))
        elif title.endswith("ibstat"):
            source.pieces.append(Piece(IBSTAT, body, where))
        elif _kernel_section(title):
            kernel.append((title[:80], Piece(KERNEL, body, where)))
        elif title:
            source.skipped.append(title[:80])
    # The same kernel message is in several sections (the log files, the journal, dmesg):
    # judging them all would count each XID two or three times. The first section that
    # holds any XID or SXid is judged, in the script's order.
    with_events = [(title, piece) for title, piece in kernel
                   if "NVRM: Xid" in piece.text or "SXid" in piece.text]  # fmt: skip
    if with_events or kernel:
        judged = (with_events or kernel)[0]
        source.pieces.append(judged[1])
        source.skipped += [title for title, piece in kernel if piece is not judged[1]]
    return source

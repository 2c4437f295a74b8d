"""``gpunode triage FILE...``: the health judges run offline on what a customer attached.

No inventory, no SSH: the files of one node (``nvidia-smi -q -x`` or ``-q``, ``nvlink -s`` and
``-e``, ``ibstat``, a kernel log, ``dcgmi diag -j``, the probe's report, an
``nvidia-bug-report.log.gz``) are read by the parsers the drift check uses (``gpunode.probe``),
put together into the probe's GPU report, and judged by ``gpunode.health`` (and the drift
check's DCGM rule) into the same findings, with failure class, evidence, confidence and
remedy, rendered as ``gpunode drift`` renders them. A file that cannot be read at all is an
error (exit 2) that names it; a part of a file that cannot be read is a finding that says why.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpunode.drift.findings import DriftResult, Finding, Severity
from gpunode.drift.rules import dcgm_diag_findings
from gpunode.health import judge
from gpunode.health.finding import HealthFinding
from gpunode.health.infiniband import judge as judge_infiniband
from gpunode.probe.gpu_probe import parse_xid_events
from gpunode.probe.gpu_record import (
    bus_key,
    parse_nvidia_smi_xml,
    parse_nvlink_errors,
    parse_nvlink_status,
    unreachable_gpus,
)
from gpunode.probe.parsers import parse_dcgm_diag, parse_gpu_report, parse_ibstat
from gpunode.probe.query_text import parse_query_gpus
from gpunode.sanitize import clean_tree
from gpunode.triage import inputs
from gpunode.triage.inputs import Piece, Source, Unreadable

__all__ = ["Triage", "Unreadable", "triage"]

# The GPU listings, best first: the XML says most; the probe's report is the XML or NVML's.
GPU_LISTINGS = (inputs.PROBE, inputs.XML, inputs.QUERY)
CHECK_THE_FILE = "look at the file by hand; report a gpunode bug with it if it is whole"
MAX_PROBLEMS_SHOWN = 5


@dataclass
class Triage:
    """What triage read (each file's kind and the sections it judged) and what it found."""

    sources: list[Source]
    result: DriftResult = field(default_factory=DriftResult)

    def inputs(self) -> list[dict[str, Any]]:
        return [
            {"file": source.path, "kind": source.kind,
             "read": [f"{piece.kind} ({piece.origin})" for piece in source.pieces],
             "not_judged": len(source.skipped)}
            for source in self.sources
        ]  # fmt: skip


def _unread(what: str, where: str, problems: list[str]) -> Iterator[tuple]:
    if not problems:
        return
    shown = "; ".join(str(problem) for problem in problems[:MAX_PROBLEMS_SHOWN])
    more = len(problems) - MAX_PROBLEMS_SHOWN
    found = f"{len(problems)} not read in {where}: {shown}" + (
        f" (and {more} more)" if more > 0 else ""
    )
    yield f"triage.unread:{what}", Severity.WARNING, f"all of {what} read", found, CHECK_THE_FILE


def _unreadable(what: str, where: str, reason: str) -> Iterator[tuple]:
    found = f"{where}: {reason}"
    yield f"triage.unreadable:{what}", Severity.WARNING, f"{what} readable", found, CHECK_THE_FILE


class _Node:
    """The one node the files describe, as the probe would report it, put together."""

    def __init__(self) -> None:
        self.listing: tuple[str, str] | None = None  # (kind, where)
        self.gpus: list[dict[str, Any]] = []
        self.nvlink: list[dict[str, Any]] = []
        self.nvlink_errors: list[dict[str, Any]] = []
        self.lost: list[dict[str, Any]] = []
        self.kernel: list[str] = []
        self.ports: list[dict[str, Any]] = []
        self.dcgm: list[dict[str, Any]] = []
        self.findings: list[tuple] = []
        self.probe_events: dict[str, list[dict[str, Any]]] = {"events": [], "sxid_events": []}

    def gpu_listing(self, piece: Piece, result: dict[str, Any]) -> None:
        if result.get("state") != "ok":
            # What the tool printed instead ("NVIDIA-SMI has failed because it couldn't
            # communicate with the NVIDIA driver") is the support engineer's first clue.
            printed = next((line.strip() for line in piece.text.split("\n") if line.strip()), "")
            reason = f"{result.get('reason')}; it begins: {printed[:200]}"
            self.findings += _unreadable(piece.kind, piece.origin, reason)
            return
        if self.listing is not None:
            kept, where = self.listing
            if GPU_LISTINGS.index(piece.kind) >= GPU_LISTINGS.index(kept):
                if piece.kind == kept:
                    raise Unreadable(
                        f"{piece.origin}: a second GPU listing ({piece.kind}) beside {where}: "
                        "triage reads one node's files at a time"
                    )
                return  # a fuller listing of the same GPUs is kept
        self.listing = (piece.kind, piece.origin)
        self.gpus = [gpu for gpu in result.get("gpus") or [] if isinstance(gpu, dict)]
        self.lost = list(result.get("lost_gpus") or [])
        self.findings += _unread(piece.kind, piece.origin, list(result.get("problems") or []))
        if piece.kind == inputs.PROBE:  # the node's own read of its kernel log
            events = result.get("xid_events") or {}
            for key in ("events", "sxid_events"):
                self.probe_events[key] = list(events.get(key) or [])

    def add(self, piece: Piece) -> None:
        kind, text = piece.kind, piece.text
        if kind == inputs.XML:
            self.gpu_listing(piece, parse_nvidia_smi_xml(text))
        elif kind == inputs.QUERY:
            self.gpu_listing(piece, parse_query_gpus(text))
            self.lost += unreachable_gpus(text)
        elif kind == inputs.PROBE:
            self.gpu_listing(piece, parse_gpu_report(text))
        elif kind == inputs.NVLINK:
            status = parse_nvlink_status(text)
            if status.get("state") != "ok":
                self.findings += _unreadable(kind, piece.origin, str(status.get("reason")))
            else:
                self.nvlink += status["gpus"]
                self.findings += _unread(kind, piece.origin, status["problems"])
        elif kind == inputs.NVLINK_ERRORS:
            errors = parse_nvlink_errors(text)
            if errors.get("state") != "ok":
                self.findings += _unreadable(kind, piece.origin, str(errors.get("reason")))
            else:
                self.nvlink_errors += errors["gpus"]
                self.findings += _unread(kind, piece.origin, errors["problems"])
        elif kind == inputs.IBSTAT:
            ibstat = parse_ibstat(text)
            if ibstat.get("state") != "ok":
                self.findings += _unreadable(kind, piece.origin, str(ibstat.get("reason")))
            else:
                self.ports += ibstat["ports"]
                self.findings += _unread(kind, piece.origin, ibstat["problems"])
        elif kind == inputs.KERNEL:
            self.kernel.append(text)
        elif kind == inputs.DCGM:
            self.dcgm.append(parse_dcgm_diag(text))
        elif kind == inputs.UNREACHABLE:
            self.lost += unreachable_gpus(text)

    def report(self) -> dict[str, Any]:
        """The probe's GPU report of this node, from what the files hold."""
        gpus = [dict(gpu) for gpu in self.gpus]
        for key, entries in (("nvlink", self.nvlink), ("nvlink_errors", self.nvlink_errors)):
            for status in entries:
                match = _same_gpu(gpus, status)
                if match is not None:
                    match[key] = status
                elif self.listing is None:  # nvlink -s / -e alone: its GPUs are all we know
                    gpus.append({"index": status.get("index"), "name": status.get("name"),
                                 "uuid": status.get("uuid"), "lost": False,
                                 key: status})  # fmt: skip
        # One lost GPU named in several files ('00000000:34:00.0', '0000:34:00.0') is one.
        listed = {bus_key(gpu.get("pci_bus_id")) for gpu in gpus if gpu.get("pci_bus_id")}
        named = {bus_key(entry.get("pci_bus_id")): entry for entry in self.lost}
        lost = [entry for key, entry in named.items() if key not in listed]
        xid_events = parse_xid_events("\n".join(self.kernel))
        xid_events["events"] = self.probe_events["events"] + xid_events["events"]
        xid_events["sxid_events"] = self.probe_events["sxid_events"] + xid_events["sxid_events"]
        return {"state": "ok", "gpus": gpus, "lost_gpus": lost, "xid_events": xid_events}

    def judged(self, host: str) -> list[Finding]:
        report = clean_tree(self.report())
        health: list[HealthFinding] = list(judge(report)) + list(
            judge_infiniband(clean_tree(self.ports))
        )
        items = [*self.findings]
        items += [(f.id, Severity(f.severity.value), f.expected, f.found, f.fix, f.detail())
                  for f in health]  # fmt: skip
        for section in self.dcgm:
            items += dcgm_diag_findings(clean_tree(section))
        return [Finding(item[0], host, *item[1:5], **(item[5] if len(item) > 5 else {}))
                for item in items]  # fmt: skip


def _same_gpu(gpus: list[dict[str, Any]], status: dict[str, Any]) -> dict[str, Any] | None:
    """The GPU record an ``nvlink -s`` or ``-e`` entry is about: by UUID, else by index."""
    for gpu in gpus:
        if status.get("uuid") and gpu.get("uuid") == status["uuid"]:
            return gpu
    return next((gpu for gpu in gpus if gpu.get("index") == status.get("index")), None)


def bundle_name(paths: list[Path]) -> str:
    """How the report names the node: its first file, and how many more."""
    name = paths[0].name
    return name if len(paths) == 1 else f"{name} (+{len(paths) - 1} files)"


def triage(paths: Iterable[str | Path]) -> Triage:
    """Read every file first (``Unreadable`` on the first that cannot be read), then judge
    them together as one node."""
    files = [Path(path) for path in paths]
    if not files:
        raise Unreadable("no file given")
    sources = [inputs.read_source(path) for path in files]
    node = _Node()
    # GPU listings first, so that the others (nvlink -s, -e) find their GPUs whatever the order.
    pieces = [piece for source in sources for piece in source.pieces]
    for piece in sorted(pieces, key=lambda piece: piece.kind not in GPU_LISTINGS):
        node.add(piece)
    host = bundle_name(files)
    return Triage(sources, DriftResult(findings=node.judged(host), checked_hosts=[host]))

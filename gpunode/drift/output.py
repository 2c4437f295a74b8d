"""Drift reports: terminal table, JSON, JUnit XML for CI, Prometheus textfile for node_exporter."""

from __future__ import annotations

import json
import os
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from gpunode.control.exits import plural
from gpunode.drift.findings import DriftResult, Severity
from gpunode.sanitize import MAX_REPORT_TEXT_CHARS, clean_text


def _text(text: str) -> str:
    """Host names and why a host was not checked, as every report shows them: findings clean
    their own text, these are a DriftResult's plain strings (run_drift cleans its own, but any
    caller may build one), and cleaning twice changes nothing."""
    return clean_text(str(text), MAX_REPORT_TEXT_CHARS)


def _unreachable(result: DriftResult) -> dict[str, str]:
    return {_text(host): _text(reason) for host, reason in result.unreachable.items()}


def _checked(result: DriftResult) -> list[str]:
    return sorted({_text(host) for host in result.checked_hosts})


def render_table(result: DriftResult) -> str:
    findings = result.sorted_findings()
    lines = []
    if findings:
        headers = ("host", "severity", "status", "id", "expected", "found", "fix")
        rows = [
            (f.host, f.severity.value, f.status, f.id, f.expected, f.found, f.fix) for f in findings
        ]
        widths = [
            max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)
        ]
        for row in (headers, *rows):
            lines.append(
                "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True))
            )
    for host, reason in sorted(_unreachable(result).items()):
        lines.append(f"{host}: NOT CHECKED: {reason}")
    clean = sorted(set(_checked(result)) - {f.host for f in findings})
    lines.append(
        f"{plural(len(result.checked_hosts), 'host')} checked, {len(clean)} without drift, "
        f"{plural(len(findings), 'finding')} "
        f"({sum(f.severity is Severity.CRITICAL for f in findings)} critical), "
        f"{len(result.unreachable)} not checked"
    )
    return "\n".join(lines) + "\n"


def render_json(result: DriftResult) -> str:
    document: dict[str, object] = {
        "findings": [f.as_dict() for f in result.sorted_findings()],
        "checked_hosts": _checked(result),
        "unreachable": _unreachable(result),
        "exit_code": result.exit_code,
    }
    if result.remedies is not None:
        document["remedies"] = result.remedies
    return json.dumps(document, indent=2)


def render_junit(result: DriftResult) -> str:
    """One test suite per host, one failing test case per finding (CI shows each)."""
    suites = ElementTree.Element("testsuites", name="gpunode drift")
    by_host: dict[str, list] = {host: [] for host in _checked(result)}
    for finding in result.sorted_findings():
        by_host.setdefault(finding.host, []).append(finding)
    for host in sorted(by_host):
        findings = by_host[host]
        suite = ElementTree.SubElement(
            suites, "testsuite", name=host, tests=str(max(1, len(findings))),
            failures=str(len(findings)), errors="0",
        )  # fmt: skip
        if not findings:
            ElementTree.SubElement(suite, "testcase", classname=host, name="no drift")
        for finding in findings:
            case = ElementTree.SubElement(suite, "testcase", classname=host, name=finding.id)
            failure = ElementTree.SubElement(
                case, "failure", type=finding.severity.value,
                message=f"expected {finding.expected}, found {finding.found}",
            )  # fmt: skip
            failure.text = f"fix: {finding.fix}"
            if finding.health:
                properties = ElementTree.SubElement(case, "properties")
                for name, value in finding.health.items():
                    ElementTree.SubElement(properties, "property", name=name, value=value)
    for host, reason in sorted(_unreachable(result).items()):
        suite = ElementTree.SubElement(
            suites, "testsuite", name=host, tests="1", failures="0", errors="1"
        )
        case = ElementTree.SubElement(suite, "testcase", classname=host, name="reachable")
        ElementTree.SubElement(case, "error", message=reason)
    return ElementTree.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _label(value: str) -> str:
    """A label value as the exposition format escapes it: backslash, double quote, newline."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_prometheus(result: DriftResult) -> str:
    lines = [
        "# HELP gpunode_drift_findings Drift findings per host and severity.",
        "# TYPE gpunode_drift_findings gauge",
    ]
    hosts = _checked(result)
    for host in hosts:
        for severity in Severity:
            count = sum(1 for f in result.findings if f.host == host and f.severity is severity)
            labels = f'host="{_label(host)}",severity="{severity.value}"'
            lines.append(f"gpunode_drift_findings{{{labels}}} {count}")
    lines += [
        "# HELP gpunode_drift_finding One active drift finding (1) with its stable id.",
        "# TYPE gpunode_drift_finding gauge",
    ]
    for f in result.sorted_findings():
        lines.append(
            f'gpunode_drift_finding{{host="{_label(f.host)}",id="{_label(f.id)}",'
            f'severity="{f.severity.value}",status="{_label(f.status)}"}} 1'
        )
    lines += [
        "# HELP gpunode_health_finding One active GPU health finding (1): its failure class, "
        "remedy and how sure it is.",
        "# TYPE gpunode_health_finding gauge",
    ]
    for f in result.sorted_findings():
        if f.health:
            lines.append(
                f'gpunode_health_finding{{host="{_label(f.host)}",id="{_label(f.id)}",'
                f'failure_class="{_label(f.failure_class)}",severity="{f.severity.value}",'
                f'remedy="{_label(f.remedy)}",confidence="{_label(f.confidence)}"}} 1'
            )
    lines += [
        "# HELP gpunode_drift_host_checked 1 if the host was checked, 0 if unreachable.",
        "# TYPE gpunode_drift_host_checked gauge",
    ]
    lines += [f'gpunode_drift_host_checked{{host="{_label(h)}"}} 1' for h in hosts]
    lines += [
        f'gpunode_drift_host_checked{{host="{_label(h)}"}} 0' for h in sorted(_unreachable(result))
    ]
    if result.remedies is not None:
        lines += [
            "# HELP gpunode_health_remedy A health remedy this check decided on (1): carried "
            "out (outcome done or failed) or left to an operator (withheld).",
            "# TYPE gpunode_health_remedy gauge",
        ]
        for remedy in result.remedies:
            outcome = "withheld" if remedy["withheld"] else remedy["outcome"].split(" ", 1)[0]
            lines.append(
                f'gpunode_health_remedy{{host="{_label(remedy["host"])}",'
                f'action="{_label(remedy["action"])}",'
                f'failure_class="{_label(",".join(remedy["failure_classes"]))}",'
                f'outcome="{_label(outcome or "to_do")}"}} 1'
            )
    return "\n".join(lines) + "\n"


def write_atomically(path: str | Path, content: str) -> None:
    """Write so a reader (node_exporter's textfile collector, tomorrow's run reading its
    baseline) never sees half a file, even after a crash or a power cut: the content is on
    disk before the rename, and the rename is on disk before this returns."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(content)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        os.unlink(temporary)
        raise
    _fsync_directory(target.parent)


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)

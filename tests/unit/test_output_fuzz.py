"""Node text reaching the drift reports, fuzzed: no renderer can be made to lie or break.

Whatever text a node (or an error about it) puts into a finding, a host name or a reason a
host was not checked, the terminal table holds no control character or escape sequence and
has one line per row; the JSON report parses back to what was given; the JUnit file is
well-formed XML with one test case per finding and per host not checked; the Prometheus
textfile has exactly the lines the findings make, each a comment or one sample whose labels
read back as the text given (cleaned), so no line can be forged from inside a label.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ElementTree

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpunode.drift.findings import DriftResult, Finding, Severity
from gpunode.drift.output import render_json, render_junit, render_prometheus, render_table
from gpunode.sanitize import MAX_REPORT_TEXT_CHARS, clean_text

FUZZ = settings(
    max_examples=50,
    deadline=None,
    database=None,  # no .hypothesis directory in the checkout
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)

# What has broken a report somewhere: line ends and separators, C0/C1 controls (ESC, CSI, NEL),
# DEL, bidi overrides, a lone surrogate; the table's, XML's, JSON's and the exposition
# format's own syntax.
HOSTILE = [
    *"\n\r\t\x00\x07\x08\x0b\x0c\x1b\x7f\x85\x9b\u2028\u2029\ud800\u202e\u200f\ufeff",
    *'"\\{}<>&=,# ',
    "\x1b[2J",
    "\x1b]0;title\x07",
    '"} 1\ngpunode_drift_host_checked{host="forged"} 1\n',
    "]]><evil/>",
    "\r\n# TYPE forged gauge",
]
TEXT = st.one_of(
    st.text(max_size=12),
    st.lists(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=4)), max_size=5).map("".join),
)
NON_EMPTY = TEXT.filter(bool)
FINDING = st.builds(
    Finding,
    id=NON_EMPTY,
    host=NON_EMPTY,
    severity=st.sampled_from(list(Severity)),
    expected=TEXT,
    found=TEXT,
    fix=TEXT,
    status=st.sampled_from(["new", "known"]) | TEXT,
)
RESULT = st.builds(
    DriftResult,
    findings=st.lists(FINDING, max_size=4),
    checked_hosts=st.lists(NON_EMPTY, max_size=3, unique=True),
    unreachable=st.dictionaries(NON_EMPTY, TEXT, max_size=3),
)


def cleaned(text: str) -> str:
    return clean_text(text, MAX_REPORT_TEXT_CHARS)


def checked_hosts(result: DriftResult) -> set[str]:
    return {cleaned(host) for host in result.checked_hosts}


def unreachable_hosts(result: DriftResult) -> set[str]:
    return {cleaned(host) for host in result.unreachable}


@FUZZ
@given(result=RESULT)
def test_the_table_holds_no_control_character_and_one_line_per_row(result: DriftResult) -> None:
    table = render_table(result)
    assert table.endswith("\n")
    lines = table[:-1].split("\n")
    for line in lines:
        assert line.isprintable(), repr(line)
    header = 1 if result.findings else 0
    assert len(lines) == header + len(result.findings) + len(unreachable_hosts(result)) + 1


@FUZZ
@given(result=RESULT)
def test_the_json_report_parses_back_to_the_findings(result: DriftResult) -> None:
    report = json.loads(render_json(result))
    assert report["findings"] == [f.as_dict() for f in result.sorted_findings()]
    assert report["exit_code"] == result.exit_code
    assert set(report["checked_hosts"]) == checked_hosts(result)
    assert set(report["unreachable"]) == unreachable_hosts(result)
    # No text in it that a terminal or a strict reader would take for anything but text.
    for text in [*report["checked_hosts"], *report["unreachable"].items()]:
        for part in text if isinstance(text, tuple) else (text,):
            assert part.isprintable(), repr(part)


@FUZZ
@given(result=RESULT)
def test_the_junit_file_is_well_formed_with_a_case_per_finding(result: DriftResult) -> None:
    root = ElementTree.fromstring(render_junit(result).encode("utf-8"))
    cases = root.findall("./testsuite/testcase")
    failures = root.findall("./testsuite/testcase/failure")
    errors = root.findall("./testsuite/testcase/error")
    assert len(failures) == len(result.findings)
    assert len(errors) == len(unreachable_hosts(result))
    without_findings = checked_hosts(result) - {f.host for f in result.findings}
    assert len(cases) == len(result.findings) + len(without_findings) + len(errors)
    assert {error.get("message") for error in errors} <= {
        cleaned(reason) for reason in result.unreachable.values()
    }


SAMPLE = re.compile(
    r'(?P<name>gpunode_drift_[a-z_]+)\{(?P<labels>[a-z]+="(?:[^"\\\n]|\\[\\"n])*"'
    r'(?:,[a-z]+="(?:[^"\\\n]|\\[\\"n])*")*)\} (?P<value>[0-9]+)'
)
LABEL = re.compile(r'([a-z]+)="((?:[^"\\\n]|\\[\\"n])*)"')


def unescaped(value: str) -> str:
    return re.sub(r"\\([\\\"n])", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


@FUZZ
@given(result=RESULT)
def test_the_prometheus_textfile_has_only_the_lines_the_findings_make(
    result: DriftResult,
) -> None:
    text = render_prometheus(result)
    assert text.endswith("\n")
    lines = text[:-1].split("\n")
    samples = [line for line in lines if not line.startswith("# ")]
    checked = checked_hosts(result)
    unreachable = unreachable_hosts(result)
    assert len(samples) == (
        len(checked) * len(Severity) + len(result.findings) + len(checked) + len(unreachable)
    )
    hosts_seen = []
    for line in samples:
        match = SAMPLE.fullmatch(line)
        assert match, repr(line)
        assert line.isprintable(), repr(line)
        labels = dict(LABEL.findall(match.group("labels")))
        if match.group("name") == "gpunode_drift_host_checked":
            hosts_seen.append(unescaped(labels["host"]))
    assert sorted(hosts_seen) == sorted([*checked, *unreachable])

"""A hostile or broken node cannot break the drift check for the fleet, nor forge its reports.

Malformed facts (a string where a rule counts, a number where it expects an object) make that
section unreadable, naming the value; a rule that still fails becomes that host's finding.
Node text reaches no report raw: not the terminal table (ESC sequences, newlines), not the
JUnit XML (NUL, VT), not the files (lone surrogates), not Prometheus' label values.
"""

from __future__ import annotations

import copy
import json
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpunode.drift as drift
import gpunode.drift.gather as gather
from gpunode.drift import rules
from gpunode.drift.findings import DriftResult, Severity
from gpunode.drift.gather import HOST_LIMITS
from gpunode.drift.output import (
    render_json,
    render_junit,
    render_prometheus,
    render_table,
    write_atomically,
)
from gpunode.drift.rules import evaluate
from gpunode.probe.gpu_probe import SCHEMA
from gpunode.probe.parsers import parse_section
from gpunode.sanitize import MAX_REPORT_TEXT_CHARS

from .test_drift_rules import desired, healthy_facts, set_path
from .test_parsers import section_output

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# --- item 8: malformed facts ------------------------------------------------------------------

MALFORMED = [
    pytest.param("gpu.gpus.0.retired_pages.single_bit", "x",
                 "gpu.gpus[0].retired_pages.single_bit: 'x' is not an integer",
                 id="retired-pages-count-is-text"),
    pytest.param("gpu.xid_events.events", [79],
                 "gpu.xid_events.events[0]: 79 is not an object", id="xid-event-is-a-number"),
    pytest.param("gpu.gpus.1.ecc_mode", "on",
                 "gpu.gpus[1].ecc_mode: 'on' is not an object", id="ecc-mode-is-text"),
    pytest.param("gpu.problems.nvlink", [5],
                 "gpu.problems.nvlink[0]: 5 is not a string", id="unread-line-is-a-number"),
    pytest.param("gpu.gpus.0.lost", "yes", "gpu.gpus[0].lost: 'yes' is not true or false",
                 id="lost-is-text"),
    pytest.param("gpu.gpus.0.recovery_action", "Reboot",
                 "gpu.gpus[0].recovery_action: 'Reboot' is not an integer",
                 id="recovery-action-is-text"),
    pytest.param("gpu.gpus.0.nvlink.links", "abc",
                 "gpu.gpus[0].nvlink.links: 'abc' is not a list", id="nvlink-links-is-text"),
    pytest.param("gpu.gpus.0.fabric", {"state": 3},
                 "gpu.gpus[0].fabric.state: 3 is not a string", id="fabric-state-is-a-number"),
    pytest.param("gpu.gpus.0.temperature_slowdown_c", "hot",
                 "gpu.gpus[0].temperature_slowdown_c: 'hot' is not an integer",
                 id="slowdown-temperature-is-text"),
    pytest.param("gpu.xid_events.sxid_events", [{"sxid": 1, "fatal": "yes"}],
                 "gpu.xid_events.sxid_events[0].fatal: 'yes' is not true or false",
                 id="sxid-fatal-is-text"),
    pytest.param("gpu.lost_gpus", [{"pci_bus_id": 7}],
                 "gpu.lost_gpus[0].pci_bus_id: 7 is not a string", id="lost-gpu-bus-is-a-number"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "value", "named"), MALFORMED)
def test_malformed_probe_report_is_an_unreadable_finding_not_a_crash(
    path: str, value: Any, named: str
) -> None:
    facts = copy.deepcopy(healthy_facts())
    set_path(path, value)(facts)
    found = {f.id: f for f in evaluate("node-1", desired(), facts)}
    assert set(found) == {"gpu.unreadable"}
    assert found["gpu.unreadable"].severity is Severity.WARNING
    assert named in found["gpu.unreadable"].found


def probe_output(report: dict[str, Any]) -> list[str]:
    return section_output([json.dumps(report)])


@pytest.mark.parametrize(("path", "value", "named"), MALFORMED)
def test_probe_report_of_the_wrong_shape_is_unreadable_where_it_enters(
    path: str, value: Any, named: str
) -> None:
    facts = copy.deepcopy(healthy_facts())
    set_path(path, value)(facts)
    report = {"schema": SCHEMA, "kernel_module": {"state": "loaded"}, **facts["gpu"]}
    result = parse_section("gpu", probe_output(report))
    assert result["state"] == "unreadable"
    assert named.removeprefix("gpu.") in result["reason"]


def test_an_ibstat_port_whose_adapter_model_is_no_text_is_unreadable_not_a_crash() -> None:
    facts = copy.deepcopy(healthy_facts())
    facts["infiniband"]["ports"][0]["ca_type"] = {"model": "MT4129"}
    found = {f.id: f for f in evaluate("node-1", desired(), facts)}
    assert "ib.unreadable" in found and "ca_type" in found["ib.unreadable"].found
    assert not any(key.startswith("drift.rule_failed") for key in found)


def test_a_well_formed_probe_report_still_reads() -> None:
    report = {"schema": SCHEMA, "kernel_module": {"state": "loaded"}, **healthy_facts()["gpu"]}
    assert parse_section("gpu", probe_output(report))["state"] == "ok"


def test_other_sections_of_a_malformed_host_are_still_checked() -> None:
    facts = copy.deepcopy(healthy_facts())
    set_path("gpu.xid_events.events", [79])(facts)
    set_path("tls.days_to_expiry", 3)(facts)
    set_path("infiniband.ports.0.rate", "fast")(facts)
    assert {f.id for f in evaluate("node-1", desired(), facts)} == {
        "gpu.unreadable",
        "ib.unreadable",
        "tls.expiry",
    }


def test_facts_that_are_not_an_object_are_one_finding() -> None:
    (finding,) = evaluate("node-1", desired(), ["not", "sections"])
    assert (finding.id, finding.host) == ("facts.unreadable", "node-1")


def test_a_failing_rule_is_a_finding_for_that_host_and_the_others_still_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken_rule(desired: Any, facts: dict[str, Any]) -> Any:
        yield "broken.first", Severity.INFO, "x", "y", "z"
        raise KeyError("a bug\x1b[2J")

    monkeypatch.setattr(rules, "RULES", (broken_rule, *rules.RULES))
    facts = copy.deepcopy(healthy_facts())
    set_path("tls.days_to_expiry", 3)(facts)
    found = {f.id: f for f in evaluate("node-1", desired(), facts)}
    assert set(found) == {"broken.first", "drift.rule_failed:broken_rule", "tls.expiry"}
    assert found["drift.rule_failed:broken_rule"].found == "KeyError: 'a bug\\x1b[2J'"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)


def _paths(node: Any, prefix: str = "") -> list[str]:
    """Every dotted path into ``node`` (as set_path takes them)."""
    found = []
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, child in items:
        path = f"{prefix}{key}"
        found.append(path)
        if isinstance(child, dict | list) and child:
            found += _paths(child, f"{path}.")
    return found


PATHS = _paths({k: v for k, v in healthy_facts().items() if k != "complete"})


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(path=st.sampled_from(PATHS), value=JSON)
def test_any_value_anywhere_in_the_facts_is_checked_before_a_rule_reads_it(
    path: str, value: Any
) -> None:
    """The shapes cover every field the rules read: no random value reaches a rule that then
    fails (which the last-line guard would report as drift.rule_failed)."""
    facts = copy.deepcopy(healthy_facts())
    set_path(path, value)(facts)
    failed = [f for f in evaluate("node-1", desired(), facts) if f.id.startswith("drift.")]
    assert failed == []


class Host:
    def __init__(self, name: str) -> None:
        self.name, self.groups = name, ["gpu"]


class Fleet:
    def for_host(self, name: str) -> Any:
        return desired()


def test_one_malformed_host_leaves_the_fleet_checked_and_every_report_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    good, bad = healthy_facts(), copy.deepcopy(healthy_facts())
    set_path("gpu.gpus.0.ecc_mode", "on")(bad)

    def gathered(state: Any, fact: Any, hosts: Any, progress: Any = None, **_: Any) -> Any:
        values = {"node-1": good, "node-2": bad, "node-3": "garbage"}
        return values, {"node-4": "ConnectError: banner \x1b]0;owned\x07\r\nforged row"}

    monkeypatch.setattr(drift, "fleet_of", lambda inventory, source: Fleet())
    monkeypatch.setattr(gather, "make_state", lambda inventory: None)
    monkeypatch.setattr(gather, "gather_fact", gathered)
    inventory = [Host(f"node-{n}") for n in range(1, 5)]
    result = drift.run_drift(inventory, "inventories/test.py")

    assert result.checked_hosts == ["node-1", "node-2", "node-3"]
    assert {(f.host, f.id) for f in result.findings} == {
        ("node-2", "gpu.unreadable"),
        ("node-3", "facts.unreadable"),
    }
    assert "\x1b" not in result.unreachable["node-4"]
    assert "\n" not in result.unreachable["node-4"]
    for name, render in [("a.xml", render_junit), ("a.prom", render_prometheus),
                         ("a.json", render_json)]:  # fmt: skip
        write_atomically(tmp_path / name, render(result))
    ElementTree.parse(tmp_path / "a.xml")
    assert json.loads((tmp_path / "a.json").read_text())["exit_code"] == 1


# --- item 10: node text in the reports ------------------------------------------------------

FORGED = "NVIDIA H100\x1b[2J\x1b[H\nnode-9  critical  new  gpu.fake  all  fine  none"


def findings_for_gpu_name(name: str) -> DriftResult:
    facts = copy.deepcopy(healthy_facts())
    set_path("gpu.gpus.1.name", name)(facts)
    return DriftResult(findings=evaluate("node-1", desired(), facts), checked_hosts=["node-1"])


def test_escape_sequences_and_newlines_in_a_gpu_name_do_not_reach_the_table() -> None:
    result = findings_for_gpu_name(FORGED)
    table = render_table(result)
    assert "\x1b" not in table
    lines = table.splitlines()
    assert len(lines) == 1 + len(result.findings) + 1  # header, one row per finding, summary
    assert not any(line.startswith("node-9") for line in lines)
    (row,) = [line for line in lines if line.startswith("node-1")]
    assert "NVIDIA H100\\x1b[2J\\x1b[H\\nnode-9" in row


@pytest.mark.parametrize("control", ["\x1b", "\x00", "\x0b", "\x7f", "\x85", "\x9b"])
def test_control_characters_in_node_text_leave_the_junit_report_well_formed(
    control: str,
) -> None:
    result = findings_for_gpu_name(f"NVIDIA{control}H100")
    root = ElementTree.fromstring(render_junit(result))
    failure = root.find("testsuite/testcase/failure")
    assert failure is not None
    assert f"\\x{ord(control):02x}" in str(failure.get("message"))


def test_a_lone_surrogate_in_node_text_lets_every_report_be_written(tmp_path: Path) -> None:
    result = findings_for_gpu_name("NVIDIA \ud800 H100")
    for name, render in [("a.xml", render_junit), ("a.prom", render_prometheus),
                         ("a.json", render_json), ("a.txt", render_table)]:  # fmt: skip
        write_atomically(tmp_path / name, render(result))
    data = json.loads((tmp_path / "a.json").read_text(encoding="utf-8"))
    assert "\\ud800" in data["findings"][0]["found"]
    ElementTree.parse(tmp_path / "a.xml")
    render_table(result).encode("utf-8")


def test_unicode_line_separators_do_not_split_a_table_row() -> None:
    result = findings_for_gpu_name("NVIDIA\u2028H100\u2029x\r\x0cy")
    assert len(render_table(result).splitlines()) == 3


# A sample line of the text exposition format: name{label="value",...} number; a label value
# escapes backslash, double quote and newline and holds nothing else of them raw.
SAMPLE = re.compile(r'[a-z_]+\{(?:[a-z_]+="(?:[^"\\\n]|\\[\\"n])*",?)+\} [0-9]+')


def test_prometheus_label_values_are_escaped_as_the_exposition_format_says() -> None:
    result = DriftResult(checked_hosts=['odd"host\\name'], unreachable={"x": "y"})
    result.findings = evaluate('odd"host\\name', desired(), {"complete": True})
    text = render_prometheus(result)
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert samples and all(SAMPLE.fullmatch(line) for line in samples)
    assert 'host="odd\\"host\\\\name"' in text


def test_a_newline_in_a_label_value_is_written_as_backslash_n() -> None:
    from gpunode.drift.output import _label

    assert _label('a\nb"c\\') == 'a\\nb\\"c\\\\'


def test_json_report_of_hostile_text_is_valid_json() -> None:
    result = findings_for_gpu_name(FORGED + "\ud800\x00")
    data = json.loads(render_json(result))
    assert all("\x1b" not in f["found"] and "\x00" not in f["found"] for f in data["findings"])


# --- lines the parsers could not read, in the reports -----------------------------------------

HOSTILE_LINE = "\x1b[2J\x1b[H\x85node-9  critical  new  ib.fake  all  fine\u2028none"


def test_an_unread_hostile_ibstat_line_reaches_the_reports_quoted() -> None:
    ibstat = (FIXTURES / "ibstat/ibstat.47.0.a100.all.active.0").read_text(encoding="utf-8")
    lines = ibstat.splitlines()
    lines.insert(3, f"\t{HOSTILE_LINE}")
    facts = copy.deepcopy(healthy_facts())
    facts["infiniband"] = parse_section("ibstat", section_output(lines))
    assert facts["infiniband"]["state"] == "ok"
    result = DriftResult(findings=evaluate("node-1", desired(), facts), checked_hosts=["node-1"])
    unread = next(f for f in result.findings if f.id == "ib.unread_line")
    assert "line 4 not understood: '\\t\\x1b[2J\\x1b[H\\x85node-9" in unread.found
    table = render_table(result)
    assert "\x1b" not in table and "\x85" not in table and "\u2028" not in table
    rows = table.splitlines()
    assert len(rows) == 1 + len(result.findings) + 1
    assert not any(row.startswith("node-9") for row in rows)
    ElementTree.fromstring(render_junit(result))
    json.loads(render_json(result))


def test_unread_lines_a_probe_reports_are_cleaned_and_capped() -> None:
    """The probe runs on the node: its problem lines are raw node text, as many as it likes
    up to a whole answer's worth (gpunode.drift.gather.HOST_LIMITS: what is read of a node),
    each longer than a report shows."""
    line = HOSTILE_LINE * 100
    count = HOST_LIMITS.max_bytes // len(line)
    facts = copy.deepcopy(healthy_facts())
    facts["gpu"]["problems"] = {"nvlink": [line] * count}
    result = DriftResult(findings=evaluate("node-1", desired(), facts), checked_hosts=["node-1"])
    (unread,) = result.findings
    assert unread.id == "nvlink.unread_line"
    assert unread.found.startswith(f"{count} not read: \\x1b[2J\\x1b[H\\x85node-9")
    assert len(unread.found) <= MAX_REPORT_TEXT_CHARS
    assert unread.found.isprintable()
    assert len(render_table(result).splitlines()) == 3

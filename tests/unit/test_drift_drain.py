"""gpunode drift --drain critical: what is drained, resumed and left alone (gpunode.drift.drain),
the scheduler behind a fake of its interface (the integration test runs it on real Slurm)."""

from __future__ import annotations

from collections.abc import Sequence

from gpunode.drift import drain
from gpunode.drift.findings import DriftResult, Finding, Severity
from gpunode.scheduler import REASON, NodeStatus, StatusReport


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def status(self, nodes: Sequence[str]) -> StatusReport:
        raise AssertionError("apply asks no status")

    def drain(self, node: str, reason: str) -> None:
        assert REASON.fullmatch(reason)
        self.calls.append(("drain", node, reason))

    def resume(self, node: str) -> None:
        self.calls.append(("resume", node, ""))

    def running_jobs(self, node: str) -> list[str]:
        return []


def finding(host: str, id: str, severity: Severity = Severity.CRITICAL) -> Finding:
    return Finding(id, host, severity, "x", "y", "z")


def result(*findings: Finding, checked: Sequence[str] = ("a", "b", "c", "d")) -> DriftResult:
    return DriftResult(list(findings), list(checked), {"e": "timed out"})


IDLE = {name: NodeStatus(name, "idle", None) for name in "abcde"}


def test_a_critical_finding_drains_with_its_ids_and_warnings_do_not() -> None:
    found = result(
        finding("a", "slurm.gres"), finding("a", "gpu.xid:79:0000:18:00"),
        finding("b", "gpu.persistence:0", Severity.WARNING),
    )  # fmt: skip
    actions = drain.plan(found, ["a", "b", "c"], IDLE)
    assert actions == [
        drain.DrainAction("a", "drain", "gpunode: drift gpu.xid:79:0000:18:00,slurm.gres",
                          "gpu.xid:79:0000:18:00, slurm.gres"),
    ]  # fmt: skip
    scheduler = Recorder()
    lines = drain.apply(scheduler, actions)
    assert scheduler.calls == [("drain", "a", "gpunode: drift gpu.xid:79:0000:18:00,slurm.gres")]
    assert lines == ["a: drained (gpunode: drift gpu.xid:79:0000:18:00,slurm.gres)"]


def test_a_clean_node_drained_for_drift_is_resumed_and_no_other_drain_ever() -> None:
    status = {
        **IDLE,
        "a": NodeStatus("a", "drained", "gpunode: drift slurm.gres"),
        "b": NodeStatus("b", "drained", "bad fan, ticket 42"),
        "c": NodeStatus("c", "draining", "gpunode: rollout 20261201T120000-abcd batch 1/2"),
        "d": NodeStatus("d", "drained", "gpunode: driftwood"),
    }
    actions = drain.plan(result(finding("b", "gpu.xid:79:x")), ["a", "b", "c", "d"], status)
    by_node = {action.node: action.action for action in actions}
    assert by_node == {"a": "resume", "b": "leave", "c": "leave", "d": "leave"}
    scheduler = Recorder()
    lines = drain.apply(scheduler, actions)
    assert scheduler.calls == [("resume", "a", "")]
    assert "b: drained by someone else (bad fan, ticket 42): left alone" in lines


def test_a_drift_drain_is_kept_or_reworded_as_its_findings_change() -> None:
    status = {**IDLE, "a": NodeStatus("a", "drained", "gpunode: drift slurm.gres")}
    same = drain.plan(result(finding("a", "slurm.gres")), ["a"], status)
    assert [action.action for action in same] == ["keep"]
    more = drain.plan(
        result(finding("a", "slurm.gres"), finding("a", "driver.version")), ["a"], status
    )
    assert [(a.action, a.reason) for a in more] == [
        ("drain", "gpunode: drift driver.version,slurm.gres")
    ]


def test_unchecked_unscheduled_and_unknown_nodes_are_left_alone() -> None:
    found = result(finding("a", "slurm.gres"), finding("b", "slurm.gres"), checked=["a", "b"])
    # e was not checked (unreachable); b is no scheduler node; a is unknown to the scheduler.
    actions = drain.plan(found, ["a", "e"], {"e": NodeStatus("e", "drained", "gpunode: drift x")})
    assert [(a.node, a.action) for a in actions] == [("a", "keep")]
    assert drain.apply(Recorder(), actions) == []


def test_node_text_in_finding_ids_cannot_break_the_reason() -> None:
    ids = [f"mount:/scratch/{'x' * 60};rm -rf /{n}" for n in range(10)]
    reason = drain.drift_reason(ids)
    assert REASON.fullmatch(reason) and len(reason) <= 200
    assert reason.startswith("gpunode: drift mount:/scratch/") and reason.endswith(" more")
    assert ";" not in reason


def test_an_operators_down_or_fail_node_is_left_alone_critical_or_clean() -> None:
    # A drain would clear FAIL and put gpunode's reason over "PSU fault"; once clean, the
    # drift drain would then resume a node someone declared broken.
    status = {
        **IDLE,
        "a": NodeStatus("a", "down", "PSU fault"),
        "b": NodeStatus("b", "fail", "memtest"),
        "c": NodeStatus("c", "failing", "ECC storm"),
        "d": NodeStatus("d", "down", "gpunode: drift gpu.xid:79"),
    }
    critical = result(*(finding(name, "gpu.xid:79") for name in "abcd"))
    for found in (critical, result()):
        actions = drain.plan(found, ["a", "b", "c", "d"], status)
        assert [(action.node, action.action) for action in actions] == [
            ("a", "leave"), ("b", "leave"), ("c", "leave"), ("d", "leave")
        ]  # fmt: skip
        scheduler = Recorder()
        lines = drain.apply(scheduler, actions)
        assert scheduler.calls == []
        assert lines[:3] == [
            "a: down by someone else (PSU fault): left alone",
            "b: fail by someone else (memtest): left alone",
            "c: failing by someone else (ECC storm): left alone",
        ]


def test_drain_lines_are_safe_to_print() -> None:
    hostile = "fan\x1b[2J\x1b]0;owned\x07\u2028b: resumed\x85\u202e"
    status = {**IDLE, "a": NodeStatus("a", "drained", hostile)}
    lines = drain.apply(Recorder(), drain.plan(result(), ["a"], status))
    assert lines == [
        "a: drained by someone else (fan\\x1b[2J\\x1b]0;owned\\x07\\u2028b: resumed\\x85\\u202e)"
        ": left alone"
    ]
    assert all(line.isprintable() for line in lines)

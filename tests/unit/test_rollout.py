"""gpunode.rollout: batching, the per-node state machine, resume after an interruption, the
failure budget and drain reasons, with the scheduler behind a fake of its interface (the
integration test, tests/integration/test_rollout.py, runs it against real Slurm)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from gpunode import cli, rollout
from gpunode.rollout import (
    EXIT_COMPLETE,
    EXIT_INCOMPLETE,
    EXIT_INTERRUPTED,
    EXIT_STOPPED,
    CheckResult,
    ConvergeResult,
    Phase,
    Rollout,
    RolloutError,
    RolloutState,
    check_result,
    converge_result,
    make_batches,
    new_state,
    reason,
)
from gpunode.scheduler import REASON, NodeStatus, StatusReport


class FakeSlurm:
    """The scheduler interface over a dict: state, reason, running jobs per node."""

    def __init__(self, names: Sequence[str]) -> None:
        self.nodes = {name: {"state": "idle", "reason": None, "jobs": []} for name in names}
        self.calls: list[tuple[str, str]] = []
        # Jobs end after this many running_jobs calls per node (a job finishing).
        self.jobs_end_after: dict[str, int] = {}

    def status(self, nodes: Sequence[str]) -> StatusReport:
        return StatusReport(
            {
                name: NodeStatus(name, str(node["state"]), node["reason"])  # type: ignore[arg-type]
                for name, node in self.nodes.items()
                if name in nodes
            },
            [],
        )

    def drain(self, node: str, reason: str) -> None:
        assert REASON.fullmatch(reason)
        self.calls.append(("drain", node))
        self.nodes[node].update(state="drained", reason=reason)

    def resume(self, node: str) -> None:
        self.calls.append(("resume", node))
        self.nodes[node].update(state="idle", reason=None)

    def running_jobs(self, node: str) -> list[str]:
        left = self.jobs_end_after.get(node)
        if left is not None:
            if left <= 0:
                self.nodes[node]["jobs"] = []
            self.jobs_end_after[node] = left - 1
        return list(self.nodes[node]["jobs"])  # type: ignore[call-overload]


class FakeNodes:
    def __init__(self) -> None:
        self.converged: list[list[str]] = []
        self.checked: list[list[str]] = []
        self.broken: dict[str, list[str]] = {}  # node -> critical finding ids after converge
        self.converge_fails: set[str] = set()
        self.reboots: set[str] = set()  # nodes whose converge defers a driver reboot
        self.reboot_runs: list[list[str]] = []
        self.reboot_fails: set[str] = set()
        self.after_converge: list[Callable[[], None]] = []  # what happens meanwhile
        self.unreachable_checks: dict[str, int] = {}  # node -> checks before it answers
        self.interrupt_converge_of: str | None = None
        self.slurm: FakeSlurm | None = None
        self.jobs_seen_at_converge: dict[str, list[str]] = {}

    def converge(self, nodes: Sequence[str]) -> ConvergeResult:
        if self.interrupt_converge_of in nodes:
            self.interrupt_converge_of = None
            raise KeyboardInterrupt
        self.converged.append(list(nodes))
        if self.slurm is not None:
            for node in nodes:
                if node in self.slurm.nodes:
                    self.jobs_seen_at_converge[node] = self.slurm.running_jobs(node)
        for happens in self.after_converge:
            happens()
        failed = {node: "boom" for node in nodes if node in self.converge_fails}
        pending = {node for node in nodes if node in self.reboots and node not in failed}
        return ConvergeResult(failed, set(), pending)

    def reboot(self, nodes: Sequence[str]) -> ConvergeResult:
        self.reboot_runs.append(list(nodes))
        failed = {node: "no route" for node in nodes if node in self.reboot_fails}
        return ConvergeResult(failed, {n for n in nodes if n in self.reboots and n not in failed})

    def check(self, nodes: Sequence[str]) -> dict[str, CheckResult]:
        self.checked.append(list(nodes))
        results = {}
        for node in nodes:
            if self.unreachable_checks.get(node, 0) > 0:
                self.unreachable_checks[node] -= 1
                results[node] = CheckResult(None, "no route")
            else:
                results[node] = CheckResult(self.broken.get(node, []))
        return results


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


NAMES = ["n1", "n2", "n3", "n4", "n5"]


def make(
    names: Sequence[str] = NAMES,
    batch: int = 2,
    canary: int = 1,
    max_failures: int = 0,
    job_timeout_s: float = 600,
    scheduled: Sequence[str] | None = None,
    state: RolloutState | None = None,
    slurm: FakeSlurm | None = None,
    nodes: FakeNodes | None = None,
) -> tuple[Rollout, FakeSlurm, FakeNodes, list[str]]:
    on = set(names if scheduled is None else scheduled)
    if state is None:
        pairs = [(name, name in on) for name in names]
        state = new_state("inv.py", "deploy.py", pairs, batch, canary, "20261201T120000-abcd")
    slurm = slurm or FakeSlurm([name for name in names if name in on])
    nodes = nodes or FakeNodes()
    nodes.slurm = slurm
    saved: list[str] = []
    clock = Clock()
    run = Rollout(
        state, slurm, nodes, lambda s: saved.append(s.to_json()), max_failures, job_timeout_s,
        return_timeout_s=60, poll_s=5, say=lambda line: None, clock=clock, sleep=clock.sleep,
    )  # fmt: skip
    return run, slurm, nodes, saved


def phases(run: Rollout) -> dict[str, str]:
    return {name: str(record.phase) for name, record in run.state.nodes.items()}


def test_batches_put_the_canary_first_then_fixed_size_batches() -> None:
    assert make_batches(NAMES, 2, 1) == [["n1"], ["n2", "n3"], ["n4", "n5"]]
    assert make_batches(NAMES, 4, 0) == [["n1", "n2", "n3", "n4"], ["n5"]]
    assert make_batches(NAMES, 1, 7) == [NAMES]
    assert make_batches([], 3, 1) == []
    with pytest.raises(RolloutError):
        make_batches(NAMES, 0, 1)
    with pytest.raises(RolloutError):
        make_batches(NAMES, 1, -1)


def test_every_node_drained_converged_checked_and_resumed_batch_by_batch() -> None:
    run, slurm, nodes, saved = make()
    assert run.run(has_canary=True) == EXIT_COMPLETE
    assert set(phases(run).values()) == {"done"}
    assert nodes.converged == [["n1"], ["n2", "n3"], ["n4", "n5"]]
    assert nodes.checked == nodes.converged
    # Each batch drained before its converge and resumed after its check, in order.
    assert slurm.calls[:2] == [("drain", "n1"), ("resume", "n1")]
    assert slurm.calls[2:6] == [
        ("drain", "n2"),
        ("drain", "n3"),
        ("resume", "n2"),
        ("resume", "n3"),
    ]
    assert all(node["state"] == "idle" for node in slurm.nodes.values())
    assert json.loads(saved[-1])["outcome"] == "complete"


def test_the_drain_reason_names_the_rollout_and_its_batch() -> None:
    run, slurm, _nodes, _ = make()
    reasons: list[str] = []
    original = slurm.drain
    slurm.drain = lambda node, text: (reasons.append(text), original(node, text))  # type: ignore[method-assign]
    run.run(has_canary=True)
    assert reasons[0] == "gpunode: rollout 20261201T120000-abcd batch 1/3 (canary)"
    assert reasons[1] == "gpunode: rollout 20261201T120000-abcd batch 2/3"


def test_a_drained_node_waits_for_its_jobs_before_the_converge() -> None:
    run, slurm, nodes, _ = make(["n1"], batch=1, canary=0)
    slurm.nodes["n1"]["jobs"] = ["42"]
    slurm.jobs_end_after["n1"] = 3
    assert run.run() == EXIT_COMPLETE
    assert nodes.jobs_seen_at_converge == {"n1": []}
    assert slurm.calls == [("drain", "n1"), ("resume", "n1")]


def test_jobs_past_the_timeout_leave_the_node_out_resumed_and_unconverged() -> None:
    run, slurm, nodes, _ = make(["n1", "n2"], batch=2, canary=0, job_timeout_s=30)
    slurm.nodes["n1"]["jobs"] = ["7"]
    assert run.run() == EXIT_INCOMPLETE
    assert phases(run) == {"n1": "left-out", "n2": "done"}
    assert "jobs 7 still running after --job-timeout 30 s" in run.state.nodes["n1"].note
    assert nodes.converged == [["n2"]]
    assert slurm.nodes["n1"]["state"] == "idle"
    assert run.state.failures == 0


def test_a_node_drained_by_someone_else_is_never_drained_converged_or_resumed() -> None:
    run, slurm, nodes, _ = make(["n1", "n2"], batch=2, canary=0)
    slurm.nodes["n1"].update(state="drained", reason="bad fan, ticket 42")
    assert run.run() == EXIT_INCOMPLETE
    assert phases(run)["n1"] == "skipped"
    assert "bad fan, ticket 42" in run.state.nodes["n1"].note
    assert ("drain", "n1") not in slurm.calls and ("resume", "n1") not in slurm.calls
    assert nodes.converged == [["n2"]]
    assert slurm.nodes["n1"] == {"state": "drained", "reason": "bad fan, ticket 42", "jobs": []}


def test_a_drain_of_gpunode_drift_or_another_rollout_is_not_this_rollouts() -> None:
    run, slurm, nodes, _ = make(["n1", "n2"], batch=2, canary=0)
    slurm.nodes["n1"].update(state="drained", reason="gpunode: drift gpu.xid:0")
    slurm.nodes["n2"].update(state="draining", reason="gpunode: rollout 20261201T120000-abce x")
    run.run()
    assert phases(run) == {"n1": "skipped", "n2": "skipped"}
    assert slurm.calls == [] and nodes.converged == []


def test_a_node_drained_by_someone_else_during_the_batch_is_not_resumed() -> None:
    run, slurm, nodes, _ = make(["n1"], batch=1, canary=0)
    original = nodes.converge

    def converge_then_a_person_drains(names: Sequence[str]) -> ConvergeResult:
        slurm.nodes["n1"].update(state="drained", reason="person: memory test")
        return original(names)

    nodes.converge = converge_then_a_person_drains  # type: ignore[method-assign]
    run.run()
    assert phases(run) == {"n1": "left-out"}
    assert ("resume", "n1") not in slurm.calls
    assert slurm.nodes["n1"]["reason"] == "person: memory test"


def test_a_failed_health_gate_keeps_the_node_drained_with_the_failed_checks_and_stops() -> None:
    run, slurm, nodes, saved = make(max_failures=0)
    nodes.broken["n1"] = ["slurm.gres", "gpu.model:0"]
    assert run.run(has_canary=True) == EXIT_STOPPED
    assert phases(run) == {
        "n1": "failed", "n2": "pending", "n3": "pending", "n4": "pending", "n5": "pending"
    }  # fmt: skip
    assert slurm.nodes["n1"]["state"] == "drained"
    assert slurm.nodes["n1"]["reason"] == (
        "gpunode: rollout 20261201T120000-abcd failed health gate slurm.gres,gpu.model:0"
    )
    # The later batches were not touched at all.
    assert nodes.converged == [["n1"]]
    assert [call for call in slurm.calls if call[1] != "n1"] == []
    assert json.loads(saved[-1])["outcome"] == "stopped"


def test_failures_within_the_budget_go_on() -> None:
    run, slurm, nodes, _ = make(max_failures=1)
    nodes.broken["n2"] = ["gpu.xid:0"]
    nodes.converge_fails.add("n4")
    assert run.run(has_canary=True) == EXIT_STOPPED  # the second failure is one too many
    assert phases(run) == {
        "n1": "done",
        "n2": "failed",
        "n3": "done",
        "n4": "failed",
        "n5": "done",  # its batch goes on to the end; only later batches are held back
    }
    assert "converge" in slurm.nodes["n4"]["reason"]  # type: ignore[operator]

    run, slurm, nodes, _ = make(max_failures=1)
    nodes.broken["n2"] = ["gpu.xid:0"]
    assert run.run(has_canary=True) == EXIT_INCOMPLETE
    assert phases(run)["n5"] == "done"


def test_a_node_that_does_not_answer_in_time_fails() -> None:
    run, slurm, nodes, _ = make(["n1", "n2"], batch=2, canary=0, max_failures=5)
    nodes.unreachable_checks = {"n1": 2, "n2": 1000}
    run.run()
    assert phases(run) == {"n1": "done", "n2": "failed"}
    assert "not back after 60 s: no route" in run.state.nodes["n2"].note
    assert slurm.nodes["n2"]["state"] == "drained"


def test_a_rebooted_node_is_said_so() -> None:
    run, _slurm, nodes, _ = make(["n1"], batch=1, canary=0)
    nodes.reboots.add("n1")
    run.run()
    assert run.state.nodes["n1"].rebooted
    assert "yes" in rollout.summary_table(run.state).splitlines()[1]


def test_nodes_without_slurm_are_converged_and_checked_without_a_drain() -> None:
    run, slurm, nodes, _ = make(["n1", "n2"], batch=2, canary=0, scheduled=["n1"])
    assert run.run() == EXIT_COMPLETE
    assert nodes.converged == [["n1", "n2"]]
    assert [call[1] for call in slurm.calls] == ["n1", "n1"]


def test_a_node_the_scheduler_does_not_know_is_skipped() -> None:
    run, slurm, nodes, _ = make(["n1", "n2"], batch=2, canary=0)
    del slurm.nodes["n2"]
    run.run()
    assert phases(run) == {"n1": "done", "n2": "skipped"}
    assert nodes.converged == [["n1"]]


def test_interrupted_mid_batch_and_run_again_it_never_touches_a_finished_node_twice() -> None:
    run, slurm, nodes, saved = make(batch=2, canary=1)
    nodes.interrupt_converge_of = "n3"
    assert run.run(has_canary=True) == EXIT_INTERRUPTED
    state = RolloutState.from_json(saved[-1])
    assert state.outcome == "interrupted"
    assert {name: str(r.phase) for name, r in state.nodes.items()} == {
        "n1": "done", "n2": "converging", "n3": "converging", "n4": "pending", "n5": "pending"
    }  # fmt: skip
    # n2, n3 were drained and stay drained by this rollout while it is away.
    assert slurm.nodes["n2"]["state"] == slurm.nodes["n3"]["state"] == "drained"
    calls_before = list(slurm.calls)
    again, _, nodes_again, _ = make(state=state, slurm=slurm, nodes=FakeNodes())
    assert again.run(has_canary=True) == EXIT_COMPLETE
    new_calls = slurm.calls[len(calls_before) :]
    assert all(node != "n1" for _, node in new_calls)
    assert ("drain", "n2") not in new_calls and ("drain", "n3") not in new_calls
    assert nodes_again.converged == [["n2", "n3"], ["n4", "n5"]]
    assert set(phases(again).values()) == {"done"}


def test_a_restart_in_each_phase_goes_on_from_that_phase() -> None:
    for phase, converged, drained_again in (
        (Phase.DRAINING, [["n1"]], True),
        (Phase.WAITING, [["n1"]], False),
        (Phase.CHECKING, [], False),
        (Phase.RESUMING, [], False),
    ):
        run, slurm, nodes, _ = make(["n1"], batch=1, canary=0)
        record = run.state.nodes["n1"]
        record.phase = phase
        if phase is not Phase.DRAINING:
            record.drained = True
            slurm.nodes["n1"].update(
                state="drained", reason=f"{run.state.reason_prefix()} batch 1/1"
            )
        assert run.run() == EXIT_COMPLETE, phase
        assert nodes.converged == converged, phase
        assert (("drain", "n1") in slurm.calls) is drained_again, phase
        assert slurm.calls[-1] == ("resume", "n1"), phase


def test_the_state_round_trips_and_a_damaged_one_is_refused(tmp_path: Path) -> None:
    run, _, _, saved = make()
    run.run(has_canary=True)
    state = RolloutState.from_json(saved[-1])
    assert state.to_json() == saved[-1]
    for damaged in ("{", "[]", json.dumps({**json.loads(saved[-1]), "version": 9}),
                    json.dumps({**json.loads(saved[-1]), "id": "x; rm -rf /"}),
                    json.dumps({**json.loads(saved[-1]), "batches": [["n1"]]})):  # fmt: skip
        with pytest.raises(RolloutError):
            RolloutState.from_json(damaged)


def test_reasons_are_sanitised_and_bounded() -> None:
    text = reason(
        "gpunode: rollout r",
        "failed health gate",
        ["a;b", "c\nd", *[f"gpu.xid:{i}" for i in range(50)]],
    )
    assert REASON.fullmatch(text) and len(text) <= 200
    assert text.startswith("gpunode: rollout r failed health gate a_b,c_d,gpu.xid:0")
    assert text.endswith(" more")
    assert reason("gpunode: rollout r", "failed converge") == "gpunode: rollout r failed converge"


def test_is_ours_wants_this_rollouts_id_whole() -> None:
    run, _, _, _ = make()
    prefix = run.state.reason_prefix()
    assert rollout.is_ours(NodeStatus("n1", "drained", f"{prefix} batch 1/3"), run.state)
    assert not rollout.is_ours(NodeStatus("n1", "drained", f"{prefix}0 batch"), run.state)
    assert not rollout.is_ours(NodeStatus("n1", "idle", f"{prefix} batch 1/3"), run.state)
    assert not rollout.is_ours(NodeStatus("n1", "drained", "person"), run.state)


REBOOT = "Loaded kernel module is the installed one"  # roles/nvidia_driver.py's name


def test_pyinfra_results_tell_failed_and_rebooted_hosts() -> None:
    results = {
        "results": {
            "failed_hosts": ["n2"],
            "operations": [
                {"name": f"NVIDIA driver | {REBOOT} (reboot: if-needed)", "success": ["n1"]},
                {"name": "Base packages", "success": ["n1", "n2"]},
            ],
        }
    }  # fmt: skip
    result = converge_result(["n1", "n2"], 1, json.dumps(results), "boom\n")
    assert result.failed == {"n2": "deploy failed (exit status 1): boom"}
    assert result.rebooted == {"n1"}
    # pyinfra stopped before any host ran (no JSON, or no failed host named): all failed.
    assert set(converge_result(["n1"], 1, "Traceback...", "").failed) == {"n1"}
    none_named = {"results": {"failed_hosts": [], "operations": []}}
    assert set(converge_result(["n1"], 1, json.dumps(none_named), "").failed) == {"n1"}


def test_drift_reports_give_critical_ids_or_why_not_checked() -> None:
    report = {
        "checked_hosts": ["n1", "n2"],
        "unreachable": {"n3": "timed out"},
        "findings": [
            {"host": "n1", "severity": "critical", "id": "slurm.gres"},
            {"host": "n1", "severity": "warning", "id": "gpu.persistence:0"},
            {"host": "n2", "severity": "info", "id": "x"},
        ],
    }
    results = check_result(["n1", "n2", "n3", "n4"], json.dumps(report), "")
    assert results["n1"] == CheckResult(["slurm.gres"])
    assert results["n2"] == CheckResult([])
    assert results["n3"] == CheckResult(None, "timed out")
    assert results["n4"].critical is None
    assert all(r.critical is None for r in check_result(["n1"], "not json", "err").values())


def test_dry_prints_batches_and_each_nodes_plan_and_changes_nothing() -> None:
    run, slurm, nodes, saved = make(["n1", "n2", "n3"], batch=2, canary=1, scheduled=["n1", "n2"])
    slurm.nodes["n2"].update(state="drained", reason="ticket 9")
    status = slurm.status(["n1", "n2"]).nodes
    text = rollout.dry_plan(run.state, status, {"n1": ["5"]})
    assert "batch 1/2: n1" in text and "batch 2/2: n2, n3" in text
    assert "n1: drain (idle), wait for jobs 5, converge, health gate, resume" in text
    assert "n2: skip: drained by someone else (ticket 9)" in text
    assert "n3: no scheduler node: converge, health gate" in text
    assert slurm.calls == [] and nodes.converged == [] and saved == []


def test_the_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["rollout", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for code, meaning in rollout.EXIT_CODES.items():
        assert f"{code} {' '.join(meaning.split())}" in out


def test_a_drain_someone_else_made_meanwhile_is_neither_resumed_nor_reworded() -> None:
    # Jobs outlive the timeout, but a person drained the node in the meantime.
    run, slurm, nodes, _ = make(["n1"], batch=1, canary=0, job_timeout_s=10)
    slurm.nodes["n1"]["jobs"] = ["7"]
    original = slurm.running_jobs

    def jobs_then_a_person_drains(node: str) -> list[str]:
        slurm.nodes[node].update(state="drained", reason="person: fan")
        return original(node)

    slurm.running_jobs = jobs_then_a_person_drains  # type: ignore[method-assign]
    run.run()
    assert phases(run) == {"n1": "left-out"}
    assert "drained by someone else meanwhile" in run.state.nodes["n1"].note
    assert ("resume", "n1") not in slurm.calls
    assert slurm.nodes["n1"]["reason"] == "person: fan"
    # A failed gate on a node a person drained meanwhile: their reason stays.
    run, slurm, nodes, _ = make(["n1"], batch=1, canary=0)
    nodes.broken["n1"] = ["gpu.xid:79"]
    original_check = nodes.check

    def check_then_a_person_drains(names: Sequence[str]) -> dict[str, CheckResult]:
        slurm.nodes["n1"].update(state="drained", reason="person: memtest")
        return original_check(names)

    nodes.check = check_then_a_person_drains  # type: ignore[method-assign]
    run.run()
    assert phases(run) == {"n1": "failed"}
    assert slurm.nodes["n1"]["reason"] == "person: memtest"
    assert slurm.calls == [("drain", "n1")]


def test_run_again_after_a_stop_it_goes_on_only_with_a_larger_budget() -> None:
    run, slurm, nodes, saved = make(max_failures=0)
    nodes.broken["n1"] = ["gpu.xid:79"]
    assert run.run(has_canary=True) == EXIT_STOPPED
    state = RolloutState.from_json(saved[-1])
    again, _, nodes_again, _ = make(state=state, slurm=slurm, nodes=FakeNodes(), max_failures=0)
    assert again.run(has_canary=True) == EXIT_STOPPED
    assert nodes_again.converged == []  # not one more batch
    assert phases(again)["n2"] == "pending"
    larger, _, nodes_larger, _ = make(state=state, slurm=slurm, nodes=FakeNodes(), max_failures=1)
    assert larger.run(has_canary=True) == EXIT_INCOMPLETE
    assert nodes_larger.converged == [["n2", "n3"], ["n4", "n5"]]
    assert slurm.nodes["n1"]["state"] == "drained"  # the failed node stays drained


# --- operator states are someone else's (issue 29) ------------------------------------------


def test_a_node_an_operator_set_down_or_fail_is_never_drained_resumed_or_reworded() -> None:
    names = ["n1", "n2", "n3", "n4", "n5"]
    run, slurm, nodes, _ = make(names, batch=5, canary=0)
    held = {
        "n1": {"state": "down", "reason": "PSU fault"},
        "n2": {"state": "fail", "reason": "memtest, ticket 12"},
        "n3": {"state": "failing", "reason": "ECC storm"},
        # DOWN whatever its reason, even one that reads as this rollout's.
        "n4": {"state": "down", "reason": f"{run.state.reason_prefix()} batch 1/1"},
    }
    for name, view in held.items():
        slurm.nodes[name].update(view)
    assert run.run() == EXIT_INCOMPLETE
    assert phases(run) == {
        "n1": "skipped", "n2": "skipped", "n3": "skipped", "n4": "skipped", "n5": "done"
    }  # fmt: skip
    assert "down by someone else (PSU fault): untouched" in run.state.nodes["n1"].note
    assert "fail by someone else (memtest, ticket 12)" in run.state.nodes["n2"].note
    assert "failing by someone else (ECC storm)" in run.state.nodes["n3"].note
    assert nodes.converged == [["n5"]]
    assert slurm.calls == [("drain", "n5"), ("resume", "n5")]
    for name, view in held.items():
        assert {k: slurm.nodes[name][k] for k in view} == view


def test_a_node_resumed_while_the_rollout_waited_for_its_jobs_is_left_out_unconverged() -> None:
    run, slurm, nodes, _ = make(["n1"], batch=1, canary=0)
    slurm.nodes["n1"]["jobs"] = ["7"]
    original = slurm.running_jobs

    def a_person_resumes_then_the_job_ends(node: str) -> list[str]:
        slurm.nodes[node].update(state="mixed", reason=None, jobs=[])
        return original(node)

    slurm.running_jobs = a_person_resumes_then_the_job_ends  # type: ignore[method-assign]
    assert run.run() == EXIT_INCOMPLETE
    assert phases(run) == {"n1": "left-out"}
    assert "resumed by someone else" in run.state.nodes["n1"].note
    assert "not converged" in run.state.nodes["n1"].note
    assert nodes.converged == [] and nodes.checked == []
    assert slurm.calls == [("drain", "n1")]  # never drained again, never resumed


@pytest.mark.parametrize("phase", [Phase.WAITING, Phase.CONVERGING])
def test_a_restarted_rollout_finds_its_node_no_longer_drained_and_leaves_it_out(
    phase: Phase,
) -> None:
    run, slurm, nodes, _ = make(["n1"], batch=1, canary=0)
    record = run.state.nodes["n1"]
    record.phase, record.drained = phase, True  # the last run drained it; now it is idle
    assert run.run() == EXIT_INCOMPLETE
    assert phases(run) == {"n1": "left-out"}
    assert "not drained any more (idle: resumed by someone else)" in record.note
    assert nodes.converged == [] and slurm.calls == []


def test_a_node_set_down_before_the_converge_is_neither_converged_nor_resumed() -> None:
    run, slurm, nodes, _ = make(["n1", "n2"], batch=2, canary=0)
    slurm.nodes["n1"]["jobs"] = ["7"]
    original = slurm.running_jobs

    def a_person_sets_it_down(node: str) -> list[str]:
        if node == "n1":
            slurm.nodes[node].update(state="down", reason="PSU fault", jobs=[])
        return original(node)

    slurm.running_jobs = a_person_sets_it_down  # type: ignore[method-assign]
    assert run.run() == EXIT_INCOMPLETE
    assert phases(run) == {"n1": "left-out", "n2": "done"}
    assert "down by someone else (PSU fault)" in run.state.nodes["n1"].note
    assert nodes.converged == [["n2"]]
    assert ("resume", "n1") not in slurm.calls
    assert slurm.nodes["n1"]["state"] == "down" and slurm.nodes["n1"]["reason"] == "PSU fault"


def test_a_node_set_down_during_the_health_gate_is_not_resumed() -> None:
    run, slurm, nodes, _ = make(["n1"], batch=1, canary=0)
    original_check = nodes.check

    def check_then_a_person_sets_it_down(names: Sequence[str]) -> dict[str, CheckResult]:
        slurm.nodes["n1"].update(state="down", reason="PSU fault")
        return original_check(names)

    nodes.check = check_then_a_person_sets_it_down  # type: ignore[method-assign]
    assert run.run() == EXIT_INCOMPLETE
    assert phases(run) == {"n1": "left-out"}
    assert "down by someone else (PSU fault): not resumed" in run.state.nodes["n1"].note
    assert slurm.calls == [("drain", "n1")]
    assert slurm.nodes["n1"]["state"] == "down"


HOSTILE_REASON = "PSU\x1b[2J\x1b]0;owned\x07 fault\u2028n9: done\x85\u202e"


def test_dry_skips_operator_states_and_is_safe_to_print() -> None:
    run, slurm, _nodes, _ = make(["n1", "n2"], batch=2, canary=0)
    slurm.nodes["n1"].update(state="down", reason=HOSTILE_REASON)
    slurm.nodes["n2"].update(state="fail", reason="memtest")
    text = rollout.dry_plan(run.state, slurm.status(["n1", "n2"]).nodes, {})
    assert "n1: skip: down by someone else (PSU\\x1b[2J\\x1b]0;owned\\x07 fault\\u2028" in text
    assert "n2: skip: fail by someone else (memtest)" in text
    assert "drain (" not in text
    assert all(line.isprintable() for line in text.split("\n"))
    assert len(text.splitlines()) == len(text.split("\n")) - 1


def test_the_summary_and_notes_are_safe_to_print() -> None:
    run, slurm, _nodes, _ = make(["n1"], batch=1, canary=0)
    slurm.nodes["n1"].update(state="drained", reason=HOSTILE_REASON)
    said: list[str] = []
    run.say = said.append
    run.run()
    text = rollout.summary_table(run.state) + "\n".join(said)
    assert "\x1b" not in text and "\u2028" not in text and "\x85" not in text
    assert all(line.isprintable() for line in text.split("\n"))


# --- one rollout at a time ------------------------------------------------------------------

HOLD = """
import sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from gpunode.rollout import RolloutLock
lock = RolloutLock([Path({path!r})])
lock.acquire()
print("held", flush=True)
time.sleep(600)
"""


def hold_lock_elsewhere(path: Path) -> subprocess.Popen[str]:
    """A second process holding the lock (flock is per process here: the real case)."""
    root = str(Path(__file__).resolve().parents[2])
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD.format(root=root, path=str(path))],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_rollout_refuses_to_start_and_names_the_one_running(tmp_path: Path) -> None:
    path = tmp_path / "state.json.lock"
    holder = hold_lock_elsewhere(path)
    try:
        with pytest.raises(RolloutError) as refused:
            rollout.RolloutLock([path]).acquire()
        message = str(refused.value)
        assert f"another rollout holds {path}: pid {holder.pid} on " in message
        assert "user " in message and "since 20" in message
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_left_by_a_killed_rollout_is_named_stale_and_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "state.json.lock"
    holder = hold_lock_elsewhere(path)
    holder.kill()  # SIGKILL: no clean-up ran, its holder record stays
    holder.wait()
    lock = rollout.RolloutLock([path])
    lock.acquire()
    try:
        [stale] = lock.stale
        assert f"pid {holder.pid} on " in stale and "stale" in stale
        assert json.loads(path.read_text())["pid"] == os.getpid()
    finally:
        lock.release()
    # Let go cleanly: nothing stale for the next one.
    with rollout.RolloutLock([path]) as again:
        assert again.stale == []


def test_every_rollout_of_an_inventory_takes_the_same_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    lock = rollout.inventory_lock_path("inventories/lab.py")
    assert lock == rollout.inventory_lock_path(os.path.abspath("inventories/lab.py"))
    assert lock != rollout.inventory_lock_path("inventories/other.py")
    assert lock.parent == tmp_path / "gpunode"


# --- the driver reboot: the drain read again right before it ---------------------------------


def test_a_node_resumed_after_its_converge_is_not_rebooted_and_left_out_with_why() -> None:
    run, slurm, nodes, saved = make(["n1"], batch=1, canary=0)
    nodes.reboots.add("n1")
    # The driver packages installed for minutes; meanwhile an operator resumed the node.
    nodes.after_converge.append(lambda: slurm.nodes["n1"].update(state="mixed", reason=None))
    assert run.run() == EXIT_INCOMPLETE
    record = run.state.nodes["n1"]
    assert record.phase is Phase.LEFT_OUT and not record.rebooted
    assert record.note == (
        "not drained any more (mixed: resumed by someone else) before its reboot: converged, "
        "not rebooted; the new driver loads at its next reboot"
    )
    assert nodes.converged == [["n1"]] and nodes.reboot_runs == [] and nodes.checked == []
    assert slurm.calls == [("drain", "n1")]  # never drained again, never resumed
    assert json.loads(saved[-1])["nodes"]["n1"]["phase"] == "left-out"


def test_a_node_taken_over_after_its_converge_is_not_rebooted() -> None:
    run, slurm, nodes, _ = make(["n1"], batch=1, canary=0)
    nodes.reboots.add("n1")
    nodes.after_converge.append(
        lambda: slurm.nodes["n1"].update(state="drained", reason="ticket 12")
    )
    run.run()
    assert phases(run) == {"n1": "left-out"} and nodes.reboot_runs == []
    assert run.state.nodes["n1"].note.startswith("drained by someone else (ticket 12) before")
    assert slurm.nodes["n1"]["reason"] == "ticket 12"


def test_a_node_still_drained_after_its_converge_is_rebooted_then_checked_and_resumed() -> None:
    run, _slurm, nodes, saved = make(["n1", "n2"], batch=2, canary=0)
    nodes.reboots.add("n1")
    assert run.run() == EXIT_COMPLETE
    # The second run only for the node that needs its reboot; n2 costs none.
    assert nodes.converged == [["n1", "n2"]] and nodes.reboot_runs == [["n1"]]
    assert run.state.nodes["n1"].rebooted and not run.state.nodes["n2"].rebooted
    assert phases(run) == {"n1": "done", "n2": "done"}
    assert nodes.checked == [["n1", "n2"]]
    # Between converge and reboot the state file says the reboot is pending.
    assert any(json.loads(s)["nodes"]["n1"]["phase"] == "reboot-pending" for s in saved)


def test_no_node_needing_a_reboot_costs_no_second_run() -> None:
    run, _slurm, nodes, saved = make(["n1", "n2"], batch=2, canary=0)
    assert run.run() == EXIT_COMPLETE
    assert nodes.reboot_runs == []
    assert all(
        json.loads(s)["nodes"][n]["phase"] != "reboot-pending" for s in saved for n in ("n1", "n2")
    )


def test_a_failed_reboot_run_fails_the_node_drained() -> None:
    run, slurm, nodes, _ = make(["n1"], batch=1, canary=0)
    nodes.reboots.add("n1")
    nodes.reboot_fails.add("n1")
    assert run.run() == EXIT_STOPPED
    assert phases(run) == {"n1": "failed"}
    assert run.state.nodes["n1"].note.startswith("reboot: no route")
    assert slurm.nodes["n1"]["state"] == "drained"


@pytest.mark.parametrize("resumed", [False, True])
def test_a_restarted_rollout_reads_the_drain_again_before_a_pending_reboot(resumed: bool) -> None:
    run, slurm, nodes, _ = make(["n1"], batch=1, canary=0)
    nodes.reboots.add("n1")
    record = run.state.nodes["n1"]
    record.phase, record.drained = Phase.REBOOT_PENDING, True  # stopped before its reboot
    if not resumed:
        slurm.nodes["n1"].update(state="drained", reason=f"{run.state.reason_prefix()} batch 1/1")
    run.run()
    assert nodes.converged == []  # converged already: not again
    if resumed:
        assert phases(run) == {"n1": "left-out"} and nodes.reboot_runs == []
        assert "before its reboot: converged, not rebooted" in record.note
    else:
        assert phases(run) == {"n1": "done"} and nodes.reboot_runs == [["n1"]]
        assert record.rebooted and slurm.calls == [("resume", "n1")]


def test_the_state_file_keeps_a_pending_reboot() -> None:
    run, _, _, _ = make(["n1"], batch=1, canary=0)
    run.state.nodes["n1"].phase = Phase.REBOOT_PENDING
    again = RolloutState.from_json(run.state.to_json())
    assert again.nodes["n1"].phase is Phase.REBOOT_PENDING
    plan = rollout.dry_plan(again, None, {})
    assert "n1: converged already: drain read again, driver reboot, health gate, resume" in plan


def test_pyinfra_results_tell_the_hosts_whose_reboot_was_deferred() -> None:
    results = {
        "results": {
            "failed_hosts": [],
            "operations": [
                {"name": f"NVIDIA driver | {rollout.REBOOT_DEFERRED_OPERATION}",
                 "success": ["n1"], "no_change": ["n2"]},
            ],
        }
    }  # fmt: skip
    result = converge_result(["n1", "n2"], 0, json.dumps(results), "")
    assert result.reboot_pending == {"n1"} and result.rebooted == set() and not result.failed


def test_the_converge_defers_the_reboot_and_the_reboot_run_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The pyinfra subprocess stands in: what matters is the environment the rollout gives it.
    seen: list[dict[str, str]] = []
    commands: list[list[str]] = []

    def pyinfra(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        seen.append(dict(kwargs["env"]))  # type: ignore[call-overload]
        commands.append(argv)
        empty = {"results": {"failed_hosts": [], "operations": []}}
        return subprocess.CompletedProcess(argv, 0, json.dumps(empty), "")

    monkeypatch.setattr(rollout.subprocess, "run", pyinfra)
    # One left in the operator's shell decides nothing.
    monkeypatch.setenv("GPUNODE_DRIVER_REBOOT", "defer")
    nodes = rollout.PyinfraNodes("inv.py", "deploy.py", config="/srv/gpunode/config.py")
    nodes.converge(["n1"])
    nodes.reboot(["n1"])
    assert seen[0]["GPUNODE_DRIVER_REBOOT"] == "defer"
    assert "GPUNODE_DRIVER_REBOOT" not in seen[1]
    # pyinfra reads the deploy's checkout's config.py wherever the rollout was started
    for argv in commands:
        assert argv[argv.index("--config") + 1] == "/srv/gpunode/config.py"
        assert argv.index("--config") < argv.index("inv.py")


def test_the_rollouts_names_for_the_deferral_are_the_driver_roles() -> None:
    from roles import nvidia_driver

    assert rollout.REBOOT_DEFERRAL == (
        nvidia_driver.REBOOT_DEFERRAL_VARIABLE,
        nvidia_driver.REBOOT_DEFERRAL_VALUE,
    )
    assert rollout.REBOOT_DEFERRED_OPERATION == nvidia_driver.REBOOT_DEFERRED_NAME
    assert rollout.REBOOT_OPERATION not in nvidia_driver.REBOOT_DEFERRED_NAME

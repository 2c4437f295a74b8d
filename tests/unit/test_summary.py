"""The end-of-run line that names the failed nodes, why each failed, out of every host."""

from __future__ import annotations

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.state import StateOperationMeta

from gpunode import summary
from gpunode.summary import summary_line


def test_nothing_failed_prints_nothing() -> None:
    assert summary_line([], 4, {}) is None


def test_failed_nodes_are_named_with_why_and_a_limit_to_rerun() -> None:
    line = summary_line(
        ["node-9", "node-2"],
        16,
        {
            "node-2": "failed at operation Base system | Package mirrors answer",
            "node-9": "could not connect: x",
        },
    )
    assert line == (
        "gpunode: 2 of 16 hosts failed: node-2 (failed at operation Base system | Package "
        "mirrors answer); node-9 (could not connect: x). Re-run them with --limit node-2,node-9"
    )


def test_one_host_is_one_host() -> None:
    assert summary_line(["a"], 1, {}) == (
        "gpunode: 1 of 1 host failed: a (failed). Re-run them with --limit a"
    )


def test_a_limited_run_says_how_many_hosts_the_inventory_has() -> None:
    line = summary_line(["a"], 2, {"a": "refused before any change"}, inventory_total=3)
    assert line is not None
    assert line.startswith("gpunode: 1 of 2 hosts in this run (3 in the inventory) failed: a (")


def run_state(names: list[str], limit: list[str] | None = None) -> State:
    state = State(Inventory((names, {})), Config())
    if limit is not None:
        state.limit_hosts = [state.inventory.get_host(name) for name in limit]
    return state


def test_every_host_of_the_inventory_is_counted_and_a_connect_failure_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host that never connected is not one of pyinfra's activated hosts, and its failure
    happened before any deploy file loaded the callback: it is still counted and named."""
    state = run_state(["lab-1", "lab-2", "lab-ghost"])
    for name in ("lab-1", "lab-2"):
        state.inventory.get_host(name).connected = True
        state.activate_host(state.inventory.get_host(name))
    state.failed_hosts.add(state.inventory.get_host("lab-ghost"))
    monkeypatch.setattr(summary, "_states", [state])
    monkeypatch.setattr(summary, "_failed_at", {})
    summary._print_summary()
    assert capsys.readouterr().err == (
        "gpunode: 1 of 3 hosts failed: lab-ghost (could not connect; its error is above). "
        "Re-run them with --limit lab-ghost\n"
    )


def test_an_operation_failure_and_a_refusal_keep_their_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = run_state(["a", "b", "c"], limit=["a", "b"])
    for name in ("a", "b"):
        host = state.inventory.get_host(name)
        host.connected = True
        state.failed_hosts.add(host)
    monkeypatch.setattr(summary, "_states", [state])
    monkeypatch.setattr(summary, "_failed_at", {})
    summary.record_failure("a", "refused before any change")

    meta = StateOperationMeta((1,))
    meta.names.add("Driver | Install packages")
    state.op_meta["op-1"] = meta
    summary.FailureRecorder.operation_host_error(state, state.inventory.get_host("b"), "op-1")
    summary._print_summary()
    assert capsys.readouterr().err == (
        "gpunode: 2 of 2 hosts in this run (3 in the inventory) failed: a (refused before any "
        "change); b (failed at operation Driver | Install packages). Re-run them with --limit a,b\n"
    )

"""A node's refusal fails that node alone: while pyinfra prepares and while it executes."""

from __future__ import annotations

import ast
import copy
import logging
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import OperationError
from pyinfra.context import ctx_host, ctx_state

from gpunode import refusal, summary
from gpunode.refusal import NOTHING_CHANGED, NodeRefused, refusals_fail_this_node

ROOT = Path(__file__).resolve().parents[2]


class Node:
    def __init__(self, name: str) -> None:
        self.name = name
        self.print_prefix = f"[{name}] "


class Results:
    error_ops = 0


class Meta:
    def __init__(self) -> None:
        self.completed: tuple[Any, ...] | None = None

    def is_complete(self) -> bool:
        return self.completed is not None

    def set_complete(self, success: bool, commands: list[Any], output: Any) -> None:
        self.completed = (success, commands, list(output))


class OpData:
    def __init__(self) -> None:
        self.operation_meta = Meta()


class FleetState:
    """The parts of pyinfra's State that failing a host touches."""

    def __init__(self) -> None:
        self.failed: set[Any] = set()
        self.results: dict[str, Results] = {}
        self.op_data: dict[tuple[str, str], OpData] = {}
        self.callbacks: list[tuple[Any, ...]] = []

    def fail_hosts(self, hosts: set[Any]) -> None:
        self.failed |= hosts

    def get_results_for_host(self, node: Node) -> Results:
        return self.results.setdefault(node.name, Results())

    def get_op_data_for_host(self, node: Node, op_hash: str) -> OpData:
        return self.op_data.setdefault((node.name, op_hash), OpData())

    def trigger_callbacks(self, name: str, *args: Any) -> None:
        self.callbacks.append((name, *args))


@pytest.fixture(autouse=True)
def clean_summary() -> Any:
    summary._failed_at.clear()
    yield
    summary._failed_at.clear()


def prepare(node: Node, fleet: FleetState, error: Exception) -> None:
    with ctx_state.use(fleet), ctx_host.use(node), refusals_fail_this_node():
        raise error


def test_a_refusal_while_preparing_fails_that_node_with_its_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    node, fleet = Node("node-7"), FleetState()
    with caplog.at_level(logging.ERROR, logger="pyinfra"):
        prepare(node, fleet, NodeRefused("node-7: nccl: 'ib7' matches no interface\nsecond line"))
    assert fleet.failed == {node}
    assert caplog.messages == [
        "[node-7] node-7: nccl: 'ib7' matches no interface",
        "[node-7] second line",
        "[node-7] Nothing was changed.",
    ]
    assert summary._failed_at == {"node-7": "refused before any change"}


def test_a_refusal_says_nothing_changed_once_on_its_last_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refused = NodeRefused("n: sshd hardening refused: this deploy logs in with a password")
    assert refused.reason == "n: sshd hardening refused: this deploy logs in with a password"
    assert str(refused) == f"{refused.reason}\n{NOTHING_CHANGED}"
    for same in (copy.copy(refused), pickle.loads(pickle.dumps(refused))):
        assert str(same) == str(refused)
    with caplog.at_level(logging.ERROR, logger="pyinfra"):
        prepare(Node("n"), FleetState(), refused)
    assert caplog.messages == [
        "[n] n: sshd hardening refused: this deploy logs in with a password",
        "[n] Nothing was changed.",
    ]


def test_an_operation_error_while_preparing_a_dry_run_fails_that_node_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    node, fleet = Node("n"), FleetState()
    with caplog.at_level(logging.ERROR, logger="pyinfra"):
        prepare(node, fleet, OperationError("/etc/docker/daemon.json: not valid JSON"))
    assert fleet.failed == {node}
    assert caplog.messages == [
        "[n] /etc/docker/daemon.json: not valid JSON",
        "[n] Nothing was changed.",
    ]


# Refusals while pyinfra executes concern part of the node (earlier operations may have run),
# so each says in its own words what it left alone.
WHAT_A_REFUSAL_WHILE_EXECUTING_LEFT_ALONE = {
    "roles/base.py": "\nNothing was changed: package sources, lists and packages are as they were.",
    "roles/sshd.py": "sshd hardening refused, nothing changed: the deploy user ",
}


def test_no_role_says_the_refusal_s_nothing_changed_itself() -> None:
    """NodeRefused and the prepare-time handler add NOTHING_CHANGED; a role that said it too
    would have it told twice."""
    said = {}
    for path in sorted((ROOT / "roles").glob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        name = str(path.relative_to(ROOT))
        texts = [
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and re.search(r"nothing (was )?changed", node.value, re.IGNORECASE)
            and node.value != WHAT_A_REFUSAL_WHILE_EXECUTING_LEFT_ALONE.get(name)
        ]
        if texts:
            said[name] = texts
    assert said == {}


def test_a_bug_is_not_taken_for_a_refusal() -> None:
    fleet = FleetState()
    with pytest.raises(KeyError):
        prepare(Node("n"), fleet, KeyError("gpus"))
    assert fleet.failed == set()
    assert summary._failed_at == {}


def test_an_operation_error_while_executing_fails_that_host_at_that_operation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def raising(state: Any, node: Any, op_hash: str) -> bool:
        raise OperationError("/etc/docker/daemon.json: not valid JSON; fix it by hand")

    node, fleet = Node("lab-1"), FleetState()
    with caplog.at_level(logging.ERROR, logger="pyinfra"):
        assert refusal._failing_only_this_host(raising)(fleet, node, "op-1") is False
    assert caplog.messages == ["[lab-1] /etc/docker/daemon.json: not valid JSON; fix it by hand"]
    assert fleet.results["lab-1"].error_ops == 1
    assert fleet.op_data[("lab-1", "op-1")].operation_meta.completed == (False, [], [])
    assert fleet.callbacks == [("operation_host_error", node, "op-1")]


def test_an_operation_that_succeeds_or_fails_on_its_own_is_left_as_pyinfra_reports_it() -> None:
    fleet = FleetState()
    run = refusal._failing_only_this_host(lambda state, node, op_hash: op_hash == "ok")
    assert run(fleet, Node("n"), "ok") is True
    assert run(fleet, Node("n"), "failed") is False
    assert fleet.callbacks == [] and fleet.results == {}


def test_an_unexpected_error_while_executing_still_ends_the_run() -> None:
    def buggy(state: Any, node: Any, op_hash: str) -> bool:
        raise TypeError("a bug")

    with pytest.raises(TypeError):
        refusal._failing_only_this_host(buggy)(FleetState(), Node("n"), "op")


def test_install_wraps_pyinfra_once() -> None:
    import pyinfra.api.operations as operations

    original = operations._run_host_op
    try:
        refusal.install_per_node_failures()
        wrapped = operations._run_host_op
        refusal.install_per_node_failures()
        assert operations._run_host_op is wrapped
        assert wrapped is not original
        assert getattr(wrapped, "__wrapped__", None) in (
            original,
            getattr(original, "__wrapped__", None),
        )
    finally:
        operations._run_host_op = original

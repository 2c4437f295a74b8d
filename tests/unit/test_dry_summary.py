"""`--dry` says per host, in one line, what will change and what might, so that "nothing to
do" is visible at a glance: an operation with an ``_if`` is predicted from the operations its
condition asks, not listed as a "Conditional Change" whatever they do."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyinfra import host
from pyinfra.api import Config, Inventory, State, operation
from pyinfra.api.connect import connect_all
from pyinfra.context import ctx_host, ctx_state

from gpunode import pyinfra_patches, summary
from gpunode.pyinfra_patches import PredictedOperation

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))


@operation()
def writes(path: str) -> Iterator[str]:
    """A change: one command (never run here: nothing is executed)."""
    yield f"touch {path}"


@operation()
def already_there() -> Iterator[str]:
    """No change: what it would write is there."""
    host.noop("already there")
    yield from ()


@pytest.fixture
def prepared() -> Iterator[State]:
    """A run prepared on the local host, changes predicted, as pyinfra prepares --dry."""
    state = State(Inventory((["@local"], {})), Config())
    with ctx_state.use(state):
        connect_all(state)
        yield state


def test_conditions_are_predicted_from_the_operations_they_ask(prepared: State) -> None:
    local = prepared.inventory.get_host("@local")
    unknown = {"known": False}

    def needs_the_run() -> bool:
        if not unknown["known"]:
            raise RuntimeError("known only when the run reaches it")
        return True

    with ctx_host.use(local):
        changed = writes(path="/nonexistent/a", name="Write a")
        kept = already_there(name="Kept")
        writes(path="/nonexistent/b", name="After a", _if=changed.did_change)
        waiting = writes(path="/nonexistent/c", name="After kept", _if=kept.did_change)
        writes(path="/nonexistent/d", name="After after kept", _if=[waiting.did_not_change])
        maybe = writes(path="/nonexistent/e", name="Found by the run", _if=needs_the_run)
        writes(path="/nonexistent/f", name="After maybe", _if=lambda: maybe.did_change())
    assert pyinfra_patches.predicted_operations(prepared, local) == [
        PredictedOperation("Write a", True, False),
        PredictedOperation("Kept", False, False),
        PredictedOperation("After a", True, True),
        PredictedOperation("After kept", False, True),
        PredictedOperation("After after kept", True, True),
        PredictedOperation("Found by the run", None, True),
        PredictedOperation("After maybe", None, True),
    ]
    # pyinfra's own did_change is back: asked before the run, it refuses
    with pytest.raises(RuntimeError, match="before execution"):
        changed.did_change()


def test_one_line_per_host() -> None:
    kept = PredictedOperation("Kept", False, False)
    waiting = PredictedOperation("Reload", False, True)
    assert summary.dry_line("lab-1", [kept, waiting, waiting]) == (
        "gpunode --dry: lab-1: nothing will change (2 conditional operations whose condition, "
        "an earlier change, will not come)"
    )
    assert summary.dry_line("lab-1", [kept]) == "gpunode --dry: lab-1: nothing will change"
    line = summary.dry_line(
        "lab-2",
        [PredictedOperation("Write", True, False), PredictedOperation("Reload", True, True),
         PredictedOperation("Probe", None, True)],
    )  # fmt: skip
    assert line == (
        "gpunode --dry: lab-2: 2 operations will change: Write; Reload (its condition: an "
        "earlier change); and 1 might, depending on what the run finds: Probe"
    )


def test_pyinfra_dry_prints_the_line_for_each_host(tmp_path: Path) -> None:
    """The real command line: pyinfra --dry prints its plan, then gpunode's line per host."""
    (tmp_path / "inventory.py").write_text('hosts = ["@local"]\n')
    (tmp_path / "deploy.py").write_text(
        "from pyinfra import state\n"
        "from pyinfra.operations import server\n"
        "from gpunode import summary\n"
        "summary.install(state)\n"
        "kept = server.shell(name='Probe', commands=[])\n"
        f"server.shell(name='Reload', commands=['touch {tmp_path}/never'], "
        "_if=kept.did_change)\n"
    )
    done = subprocess.run(
        [PYINFRA, "--dry", "inventory.py", "deploy.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Conditional Change" in output  # pyinfra's own table, as before
    assert (
        "gpunode --dry: @local: nothing will change (1 conditional operation whose condition, "
        "an earlier change, will not come)\n"
    ) in done.stderr
    assert not (tmp_path / "never").exists()
    # with --json, stdout stays pyinfra's plan alone
    planned = subprocess.run(
        [PYINFRA, "--dry", "--json", "inventory.py", "deploy.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)
    assert "gpunode --dry: @local: nothing will change" in planned.stderr

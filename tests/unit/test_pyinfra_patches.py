"""pyinfra's internals, patched in one place: each private name gpunode uses still has the
signature its patch was written against (one named test each, so a pyinfra upgrade fails
here), any other pyinfra version is refused before anything is patched, and no other module
of gpunode touches pyinfra's internals."""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import command as pyinfra_command
from pyinfra.api import facts as pyinfra_facts
from pyinfra.api import operations as pyinfra_operations
from pyinfra.operations import server

from gpunode import factcache, pyinfra_patches
from gpunode.pyinfra_patches import (
    COMMAND_CLASSES,
    SUPPORTED_VERSIONS,
    WRITTEN_AGAINST,
    UnsupportedPyinfra,
    require_supported,
    signature_of,
)

ROOT = Path(__file__).resolve().parents[2]
PATCHES = ROOT / "gpunode" / "pyinfra_patches.py"
PRODUCT_FOLDERS = ("gpunode", "roles", "facts", "deploys", "inventories")


def resolve(dotted: str) -> Any:
    """The object a dotted name names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(dotted)


# --- one test per private signature ----------------------------------------------------------


@pytest.mark.parametrize("name", sorted(WRITTEN_AGAINST))
def test_pyinfra_still_has_the_signature_the_patch_was_written_against(name: str) -> None:
    assert signature_of(resolve(name)) == WRITTEN_AGAINST[name]


def test_what_replaces_pyinfra_takes_what_pyinfra_s_own_takes() -> None:
    assert (
        signature_of(factcache._cached_get_fact) == WRITTEN_AGAINST["pyinfra.api.facts._get_fact"]
    )
    execute = WRITTEN_AGAINST["pyinfra.api.command.StringCommand.execute"]
    assert signature_of(factcache._clearing(pyinfra_command.StringCommand.execute)) == execute


def test_every_private_name_the_patches_use_has_its_signature_or_value_pinned() -> None:
    tree = ast.parse(PATCHES.read_text())
    own = {
        node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.ClassDef)
    } | {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)} | {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    # pyinfra's global arguments (_sudo, _if, ...) are its public, documented API.
    global_arguments = {name for name, _ in pyinfra_patches.global_arguments()}
    private = {
        name
        for name in used
        if re.fullmatch(r"_[A-Za-z][A-Za-z0-9_]*", name)
        and name not in own
        and name not in global_arguments
    }
    pinned = {key.rsplit(".", 1)[1] for key in WRITTEN_AGAINST}
    assert private, "the scan found nothing: it is broken"
    assert private <= pinned, private - pinned


# --- the version guard ------------------------------------------------------------------------


@pytest.fixture
def unsupported(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(pyinfra_patches, "installed_version", lambda: "4.0.0")
    pyinfra_patches._checked.cache_clear()
    yield
    pyinfra_patches._checked.cache_clear()


def test_a_pyinfra_version_the_patches_were_not_written_for_is_refused_naming_both() -> None:
    with pytest.raises(UnsupportedPyinfra) as refused:
        require_supported("3.11.0")
    message = str(refused.value)
    assert "pyinfra 3.11.0 is installed" in message
    assert "written for pyinfra 3.10.0 only" in message
    assert "pyinfra==3.10.0" in message
    assert "gpunode/pyinfra_patches.py" in message


def test_the_installed_and_pinned_pyinfra_is_one_the_patches_were_written_for() -> None:
    pins = re.findall(r'"pyinfra==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert pins and all(pin in SUPPORTED_VERSIONS for pin in pins)
    assert pyinfra_patches.installed_version() in SUPPORTED_VERSIONS
    require_supported()


@pytest.mark.usefixtures("unsupported")
def test_every_patch_and_call_refuses_an_unsupported_pyinfra_before_touching_it() -> None:
    get_fact, run_host_op = pyinfra_facts._get_fact, pyinfra_operations._run_host_op
    executes = [getattr(pyinfra_command, name).execute for name in COMMAND_CLASSES]
    calls = [
        lambda: pyinfra_patches.replace_get_fact(lambda *args: None),
        lambda: pyinfra_patches.wrap_command_execute(lambda execute: execute),
        lambda: pyinfra_patches.wrap_run_host_op(lambda run: run),
        lambda: pyinfra_patches.fact_arguments(None, None, type, None, None),
        lambda: pyinfra_patches.make_command("true", {}),
        lambda: pyinfra_patches.record_failed_operation(None, None, "op"),
        lambda: pyinfra_patches.inner(server.reboot),
    ]
    for call in calls:
        with pytest.raises(UnsupportedPyinfra, match=r"pyinfra 4\.0\.0 is installed"):
            call()
    assert pyinfra_facts._get_fact is get_fact
    assert pyinfra_operations._run_host_op is run_host_op
    assert [getattr(pyinfra_command, name).execute for name in COMMAND_CLASSES] == executes


@pytest.mark.usefixtures("unsupported")
def test_a_deploy_on_an_unsupported_pyinfra_stops_before_the_fact_cache_patches_it() -> None:
    get_fact = pyinfra_facts._get_fact
    with pytest.raises(UnsupportedPyinfra):
        factcache.install()
    assert factcache._installed == {}
    assert pyinfra_facts._get_fact is get_fact


def test_the_fact_cache_patches_pyinfra_and_puts_it_back() -> None:
    get_fact = pyinfra_facts._get_fact
    executes = [getattr(pyinfra_command, name).execute for name in COMMAND_CLASSES]
    assert not factcache._installed
    factcache.install()
    try:
        assert pyinfra_facts._get_fact is factcache._cached_get_fact
        assert factcache._installed["_get_fact"].original is get_fact
        patched = [getattr(pyinfra_command, name).execute for name in COMMAND_CLASSES]
        assert all(new is not old for new, old in zip(patched, executes, strict=True))
        factcache.install()  # idempotent
        assert [getattr(pyinfra_command, name).execute for name in COMMAND_CLASSES] == patched
    finally:
        factcache.uninstall()
    assert pyinfra_facts._get_fact is get_fact
    assert [getattr(pyinfra_command, name).execute for name in COMMAND_CLASSES] == executes


def test_inner_is_the_function_under_the_operation() -> None:
    assert pyinfra_patches.inner(server.reboot) is server.reboot._inner


# --- nothing else touches pyinfra's internals -------------------------------------------------


def _pyinfra_names(tree: ast.AST) -> set[str]:
    """Names a module binds to pyinfra modules or objects by importing them."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "pyinfra":
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pyinfra":
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def touches_pyinfra_internals(source: str) -> list[str]:
    """What ``source`` does with pyinfra's internals: imports or reads a private name of a
    pyinfra module or object, or assigns to an attribute of one (a patch)."""
    tree = ast.parse(source)
    bound = _pyinfra_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pyinfra":
            found += [f"imports {alias.name}" for alias in node.names if _private(alias.name)]
        elif isinstance(node, ast.Attribute) and _root(node) in bound:
            if _private(node.attr):
                found.append(f"reads {ast.unparse(node)}")
            elif isinstance(node.ctx, ast.Store | ast.Del):
                found.append(f"patches {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "delattr")
            and node.args
            and _root(node.args[0]) in bound
            and (
                node.func.id != "getattr"
                or (
                    len(node.args) > 1
                    and isinstance(node.args[1], ast.Constant)
                    and _private(str(node.args[1].value))
                )
            )
        ):
            found.append(f"{node.func.id} on {ast.unparse(node.args[0])}")
    return found


@pytest.mark.parametrize(
    "source",
    [
        "from pyinfra.api import facts\nfacts._get_fact",
        "import pyinfra.api.operations as ops\nops._run_host_op = run",
        "import pyinfra.api.facts\npyinfra.api.facts._make_command(a, b)",
        "from pyinfra.operations import server\ndef op():\n    yield from server.reboot._inner()",
        "from pyinfra.api.facts import _handle_fact_kwargs",
        "from pyinfra.api import command\ncommand.StringCommand.execute = wrapper",
        "from pyinfra.api import command\nsetattr(command.StringCommand, 'execute', w)",
        "from pyinfra.api import facts\ngetattr(facts, '_MISSING_COMMAND_MARKER')",
    ],
)
def test_every_way_of_touching_pyinfra_internals_is_seen(source: str) -> None:
    assert touches_pyinfra_internals(source)


def test_public_pyinfra_and_private_names_of_gpunode_are_not_taken_for_internals() -> None:
    source = (
        "from pyinfra import host\nfrom pyinfra.api import StringCommand\n"
        "host.noop('x')\nStringCommand('true').get_raw_value()\nself._cache = 1\n"
        "import gpunode.factcache as factcache\nfactcache._values = {}\n"
    )
    assert touches_pyinfra_internals(source) == []


def test_no_module_but_the_patches_touches_pyinfra_internals() -> None:
    found = {}
    for folder in PRODUCT_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == PATCHES:
                continue
            touched = touches_pyinfra_internals(path.read_text())
            if touched:
                found[str(path.relative_to(ROOT))] = touched
    assert found == {}
    assert touches_pyinfra_internals(PATCHES.read_text())  # the scan sees the patches


# --- operation order --------------------------------------------------------------------------

DEPLOY_SOURCE = """
def role(state, orders, both):
    for _ in range(2):
        orders.append(
            both(
                state
            )
        )

role(
    state,
    orders,
    both,
)
"""


@pytest.mark.parametrize("deploy_on_stack", [True, False])
@pytest.mark.parametrize("is_cli", [True, False])
def test_operation_order_is_pyinfra_s_from_the_same_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deploy_on_stack: bool, is_cli: bool
) -> None:
    import types

    import pyinfra
    import pyinfra.api.util

    deploy = tmp_path / "deploy.py"
    deploy.write_text(DEPLOY_SOURCE)
    monkeypatch.setattr(pyinfra, "is_cli", is_cli)
    filename = str(deploy) if deploy_on_stack else str(tmp_path / "another.py")
    state = types.SimpleNamespace(current_deploy_filename=filename, current_op_file_number=3)
    orders: list[tuple[list[int], list[int]]] = []
    code = compile(DEPLOY_SOURCE, str(deploy), "exec")
    exec(
        code,
        {
            "state": state,
            "orders": orders,
            "both": lambda state: orders_from_here(state)[::-1],
        },
    )
    assert len(orders) == 2
    for theirs, ours in orders:
        assert ours == theirs
    if deploy_on_stack:  # the deploy's frames: role's call, then the call in its loop
        assert orders[0][1][-4:-2] == [10, 5]
    nowhere = types.SimpleNamespace(current_deploy_filename="", current_op_file_number=0)
    ours, theirs = orders_from_here(nowhere)
    assert ours == theirs


def orders_from_here(state: Any) -> tuple[list[int], list[int]]:
    """Both orders, asked from one line (so that every frame's line is the same)."""
    import pyinfra.api.util

    return pyinfra_patches.operation_order(state), pyinfra.api.util.get_operation_order_from_stack(state)  # fmt: skip  # noqa: E501


def test_deploys_order_operations_with_operation_order() -> None:
    module = importlib.import_module("pyinfra.api.operation")
    original = module.get_operation_order_from_stack
    try:
        pyinfra_patches.replace_operation_order()
        assert module.get_operation_order_from_stack is pyinfra_patches.operation_order
    finally:
        module.get_operation_order_from_stack = original


def test_global_arguments_are_pyinfra_s_read_once() -> None:
    module = importlib.import_module("pyinfra.api.arguments")
    facts_module = importlib.import_module("pyinfra.api.facts")
    originals = module.all_global_arguments, facts_module.all_global_arguments
    try:
        expected = originals[0]()
        pyinfra_patches.remember_global_arguments()
        assert module.all_global_arguments is pyinfra_patches.global_arguments
        assert facts_module.all_global_arguments is pyinfra_patches.global_arguments
        first = module.all_global_arguments()
        assert first == expected and any(name == "_sudo" for name, _ in first)
        first.clear()  # a caller's list is its own
        assert module.all_global_arguments() == expected
    finally:
        module.all_global_arguments, facts_module.all_global_arguments = originals

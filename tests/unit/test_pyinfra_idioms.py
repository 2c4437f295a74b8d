"""gpunode's operations and facts follow pyinfra's own idioms.

* Operations (every ``@operation`` under roles/) are documented as pyinfra documents its
  own: a one-line summary, then one ``+ name: description`` line for each argument, in the
  order of the signature, and none for an argument that does not exist.
* Operations are generators (pyinfra iterates what the function returns) that either yield
  commands or say with ``host.noop(...)`` why there is nothing to do: an operation whose only
  yield is ``yield from ()`` and that never calls ``host.noop`` is a silent no-op. Whether
  every path says something cannot be read from the source; that some path can is checked.
* Facts (every FactBase subclass under facts/) are documented and have a ``command()``; a
  ``process()`` of their own, or FactBase's, takes the output lines. A base class that is no
  fact by itself says so as pyinfra's bases do (``abstract = True`` in its own body).

The checks are plain functions, so that the last tests can show each one failing.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import FactBase

ROOT = Path(__file__).resolve().parents[2]
ARGUMENT_LINE = re.compile(r"^\+ (\w+):(.*)$")


def _modules(folder: str) -> list[Any]:
    paths = sorted(path for path in (ROOT / folder).glob("*.py") if path.stem != "__init__")
    assert paths, f"no modules under {folder}/"
    return [importlib.import_module(f"{folder}.{path.stem}") for path in paths]


def _is_operation(obj: object) -> bool:
    # pyinfra's @operation() marks the function it wraps (functools.wraps keeps it reachable).
    wrapped = getattr(obj, "__wrapped__", None)
    return callable(obj) and wrapped is not None and hasattr(wrapped, "is_idempotent")


# Where operations live: the roles, and gpunode's run machinery (the run lock).
OPERATION_FOLDERS = ("roles", "gpunode")


def role_operations() -> list[tuple[str, Callable[..., Any]]]:
    """(module.name, the undecorated function) of every operation defined under roles/ and
    gpunode/ (top level)."""
    found = []
    for module in [m for folder in OPERATION_FOLDERS for m in _modules(folder)]:
        for name, obj in vars(module).items():
            if _is_operation(obj) and obj.__module__ == module.__name__:
                found.append((f"{module.__name__}.{name}", obj.__wrapped__))
    return sorted(found)


def _decorated_in_source() -> int:
    """How many functions under roles/ carry an ``operation`` decorator, read from the text."""
    count = 0
    paths = [p for folder in OPERATION_FOLDERS for p in sorted((ROOT / folder).glob("*.py"))]
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                for decorator in node.decorator_list:
                    target = decorator.func if isinstance(decorator, ast.Call) else decorator
                    name = getattr(target, "id", None) or getattr(target, "attr", None)
                    count += name == "operation"
    return count


def fact_classes() -> list[type[FactBase]]:
    found: dict[str, type[FactBase]] = {}
    for module in _modules("facts"):
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and issubclass(obj, FactBase)
                and obj.__module__ == module.__name__
            ):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[name] for name in sorted(found)]


OPERATIONS = role_operations()
FACTS = fact_classes()


# --- the checks ----------------------------------------------------------------------------


def parameters(function: Callable[..., Any]) -> list[str]:
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind in kinds
    ]


def docstring_problems(doc: str | None, arguments: list[str]) -> list[str]:
    """What keeps ``doc`` from being a pyinfra operation docstring for ``arguments``."""
    if not doc or not doc.strip():
        return ["no docstring"]
    lines = inspect.cleandoc(doc).splitlines()
    problems = []
    summary = lines[0].strip()
    if not summary or ARGUMENT_LINE.match(summary) or summary.startswith((".. ", "**")):
        problems.append(f"the first line is not a summary: {summary!r}")
    documented: list[str] = []
    for index, line in enumerate(lines):
        match = ARGUMENT_LINE.match(line)
        if not match:
            continue
        name, description = match.groups()
        if not description.strip():
            problems.append(f"+ {name}: has no description")
        if not documented and index > 0 and lines[index - 1].strip():
            problems.append("the argument list does not start after a blank line")
        documented.append(name)
    missing = [name for name in arguments if name not in documented]
    if missing:
        problems.append(f"arguments without a '+ name:' line: {missing}")
    unknown = [name for name in documented if name not in arguments]
    if unknown:
        problems.append(f"'+ name:' lines for arguments that do not exist: {unknown}")
    twice = sorted({name for name in documented if documented.count(name) > 1})
    if twice:
        problems.append(f"arguments documented twice: {twice}")
    if not (missing or unknown or twice) and documented != arguments:
        problems.append(f"arguments documented as {documented}, not in signature order")
    return problems


def _own_nodes(function: ast.FunctionDef) -> Iterator[ast.AST]:
    """The function's nodes, leaving out nested functions, lambdas and classes."""
    pending: list[ast.AST] = list(function.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        yield node
        pending.extend(ast.iter_child_nodes(node))


def _empty_literal(node: ast.expr) -> bool:
    return isinstance(node, ast.Tuple | ast.List | ast.Set) and not node.elts


def silence_problems(source: str) -> list[str]:
    """Why the operation defined in ``source`` would run without yielding or saying anything."""
    function = ast.parse(textwrap.dedent(source)).body[0]
    assert isinstance(function, ast.FunctionDef)
    nodes = list(_own_nodes(function))
    yields = [node for node in nodes if isinstance(node, ast.Yield | ast.YieldFrom)]
    if not yields:
        return [
            "not a generator: pyinfra iterates the operation (a check-only one ends with "
            "`yield from ()`)"
        ]
    yields_commands = any(
        isinstance(node, ast.Yield) or not _empty_literal(node.value) for node in yields
    )
    says_why = any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "noop"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "host"
        for node in nodes
    )
    if not (yields_commands or says_why):
        return ["yields no command and never calls host.noop(...): a silent no-op"]
    return []


def fact_problems(fact: type[FactBase]) -> list[str]:
    problems = []
    if not (fact.__dict__.get("__doc__") or "").strip():
        problems.append("no docstring")
    if fact.__dict__.get("abstract") is True:
        return problems  # a base: its subclasses are the facts
    if not callable(getattr(fact, "command", None)):
        problems.append("no command() (a base class that is no fact says `abstract = True`)")
    try:
        inspect.signature(fact.process).bind(fact, [])
    except TypeError:
        problems.append(f"process{inspect.signature(fact.process)} does not take the output lines")
    return problems


# --- the project ---------------------------------------------------------------------------


def test_every_operation_under_roles_is_found() -> None:
    assert OPERATIONS, "no operation found under roles/"
    assert len(OPERATIONS) == _decorated_in_source()


@pytest.mark.parametrize(("name", "function"), OPERATIONS, ids=[name for name, _ in OPERATIONS])
def test_operation_has_a_pyinfra_docstring(name: str, function: Callable[..., Any]) -> None:
    assert docstring_problems(function.__doc__, parameters(function)) == [], name


@pytest.mark.parametrize(("name", "function"), OPERATIONS, ids=[name for name, _ in OPERATIONS])
def test_operation_yields_commands_or_says_why_not(name: str, function: Callable[..., Any]) -> None:
    assert inspect.isgeneratorfunction(function), name
    assert silence_problems(inspect.getsource(function)) == [], name


def test_every_fact_under_facts_is_found() -> None:
    classes = [
        node.name
        for path in sorted((ROOT / "facts").glob("*.py"))
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.ClassDef)
    ]
    assert FACTS, "no FactBase subclass found under facts/"
    # Every class there is a fact (or a fact's base), so none escapes the check below.
    assert sorted(fact.__name__ for fact in FACTS) == sorted(classes)


@pytest.mark.parametrize("fact", FACTS, ids=[f"{f.__module__}.{f.__name__}" for f in FACTS])
def test_fact_is_documented_and_complete(fact: type[FactBase]) -> None:
    assert fact_problems(fact) == []


# --- the checks fail where they should -----------------------------------------------------


def test_docstring_check_names_each_problem() -> None:
    def example(path: str, present: bool = True) -> None:
        """The file ``path`` exists.

        + path: where
        + mode: its mode
        """

    assert docstring_problems(example.__doc__, parameters(example)) == [
        "arguments without a '+ name:' line: ['present']",
        "'+ name:' lines for arguments that do not exist: ['mode']",
    ]
    assert docstring_problems(None, ["path"]) == ["no docstring"]
    assert docstring_problems("+ path: where", ["path"]) == [
        "the first line is not a summary: '+ path: where'"
    ]
    assert docstring_problems("Summary.\n+ path:\n", ["path"]) == [
        "+ path: has no description",
        "the argument list does not start after a blank line",
    ]
    assert docstring_problems("Summary.\n\n+ b: x\n+ a: y\n", ["a", "b"]) == [
        "arguments documented as ['b', 'a'], not in signature order"
    ]
    assert docstring_problems("Summary.\n\n+ a: x\n+ a: y\n", ["a"]) == [
        "arguments documented twice: ['a']"
    ]
    assert docstring_problems("Summary.\n\n    + a: x\n      more\n", ["a"]) == []


def test_silence_check_finds_a_silent_operation() -> None:
    silent = """
    def checked(x):
        if not x:
            raise ValueError(x)
        yield from ()
    """
    not_a_generator = """
    def checked(x):
        host.noop("fine")
    """
    nested_only = """
    def checked(x):
        def inner():
            yield "true"
            host.noop("fine")
        yield from ()
    """
    assert silence_problems(silent) == [
        "yields no command and never calls host.noop(...): a silent no-op"
    ]
    assert silence_problems(not_a_generator)[0].startswith("not a generator")
    assert silence_problems(nested_only) == silence_problems(silent)
    assert silence_problems(silent.replace("yield from ()", "yield from commands(x)")) == []
    assert silence_problems(silent.replace("raise ValueError(x)", "host.noop('no x')")) == []


def test_fact_check_finds_an_incomplete_fact() -> None:
    class Undocumented(FactBase):
        def command(self) -> str:
            return "true"

    class NoCommand(FactBase):
        """A fact that forgot its command."""

    class Base(FactBase):
        """A base class, as pyinfra marks them."""

        abstract = True

    class BadProcess(FactBase):
        """A process() that cannot take the output."""

        def command(self) -> str:
            return "true"

        def process(self):  # type: ignore[no-untyped-def,override]
            return None

    assert fact_problems(Undocumented) == ["no docstring"]
    assert fact_problems(NoCommand) == [
        "no command() (a base class that is no fact says `abstract = True`)"
    ]
    assert fact_problems(Base) == []
    assert fact_problems(BadProcess) == ["process(self) does not take the output lines"]

"""The one-way flow between the project's folders, enforced on every module's imports.

The drift check (gpunode/drift) and the roles (roles/) both need what the validated model
means on a node; that lives in gpunode/expected, which both import. Neither imports the other:
the drift rules import nothing from roles/, and no role imports gpunode.drift. gpunode/expected
itself imports only gpunode.model and the standard library.

Imports are read from the source (every ``import``, ``from ... import`` and
``importlib.import_module``/``__import__`` call with a literal name, at any depth, including
those inside functions), so a lazy import counts as much as one at the top of a file.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def modules_under(folder: str) -> list[Path]:
    paths = sorted((ROOT / folder).rglob("*.py"))
    assert paths, f"no modules under {folder}/"
    return paths


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _absolute(module: str | None, level: int, importer: str, is_package: bool) -> str:
    """``from .x import y`` in ``importer`` as an absolute module name."""
    if level == 0:
        return module or ""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, module] if module else base)


def imported_names(source: str, importer: str, is_package: bool = False) -> Iterator[str]:
    """Every module name ``source`` imports, ``from a import b`` giving both a and a.b."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, importer, is_package)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id == "import_module")
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value


def imports_of(path: Path) -> set[str]:
    return set(
        imported_names(path.read_text(), module_name(path), is_package=path.name == "__init__.py")
    )


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def offending(folder: str, forbidden: str) -> dict[str, list[str]]:
    found = {}
    for path in modules_under(folder):
        bad = sorted(name for name in imports_of(path) if within(name, forbidden))
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    return found


def test_the_drift_rules_import_nothing_from_roles() -> None:
    assert offending("gpunode/drift", "roles") == {}


def test_no_role_imports_the_drift_package() -> None:
    assert offending("roles", "gpunode.drift") == {}


def test_what_the_model_means_on_a_node_imports_only_the_model_and_the_stdlib() -> None:
    # nvidia_releases and distributions: published facts as data, standard library only.
    allowed_packages = (
        "gpunode.model", "gpunode.expected", "gpunode.nvidia_releases", "gpunode.distributions",
    )  # fmt: skip
    found = {}
    for path in modules_under("gpunode/expected"):
        bad = sorted(
            name
            for name in imports_of(path)
            if name.split(".")[0] not in sys.stdlib_module_names
            and not any(within(name, package) for package in allowed_packages)
        )
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    assert found == {}


def test_the_health_classes_import_only_the_stdlib_and_the_gpu_record() -> None:
    """gpunode/health judges a GPU report wherever it came from (the drift check today, saved
    files tomorrow): no drift engine, no pyinfra, no facts."""
    allowed_packages = ("gpunode.health", "gpunode.probe.gpu_record")
    found = {}
    for path in modules_under("gpunode/health"):
        bad = sorted(
            name
            for name in imports_of(path)
            if name.split(".")[0] not in sys.stdlib_module_names
            and not any(within(name, package) for package in allowed_packages)
        )
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    assert found == {}


def test_the_distribution_table_imports_only_the_stdlib() -> None:
    path = ROOT / "gpunode" / "distributions.py"
    assert {
        name for name in imports_of(path) if name.split(".")[0] not in sys.stdlib_module_names
    } == set()


@pytest.mark.parametrize(
    "source",
    [
        "import roles.sshd",
        "import roles",
        "from roles import sshd",
        "from roles.firewall import render_ruleset",
        "def rule():\n    from roles.sshd import expected_effective\n",
        "import importlib\nimportlib.import_module('roles.sshd')",
        "__import__('roles')",
    ],
)
def test_every_way_of_importing_a_role_is_seen(source: str) -> None:
    assert any(within(name, "roles") for name in imported_names(source, "gpunode.drift.rules"))


@pytest.mark.parametrize(
    ("source", "importer", "is_package"),
    [
        ("import gpunode.drift.findings", "roles.firewall", False),
        ("from gpunode import drift", "roles.firewall", False),
        ("from gpunode.drift.findings import Severity", "roles.firewall", False),
        ("from .findings import Severity", "gpunode.drift.rules", False),
        ("from . import findings", "gpunode.drift", True),
        ("from ..drift import rules", "gpunode.expected.sshd", False),
    ],
)
def test_every_way_of_importing_the_drift_package_is_seen(
    source: str, importer: str, is_package: bool
) -> None:
    names = set(imported_names(source, importer, is_package))
    assert any(within(name, "gpunode.drift") for name in names), names


def test_a_neighbour_with_a_common_prefix_is_not_taken_for_the_package() -> None:
    names = set(imported_names("import rolesets\nfrom gpunode.drifting import x", "a.b"))
    assert not any(within(name, "roles") or within(name, "gpunode.drift") for name in names)


@pytest.mark.parametrize("forbidden", ["roles", "facts", "gpunode.expected"])
def test_the_verify_suite_restates_what_it_expects(forbidden: str) -> None:
    # tests/verify checks production nodes: values taken from the roles' own renderers,
    # facts or gpunode.expected would only prove a role wrote what it would write. Declared
    # data (gpunode.model) is the input, and fine.
    assert offending("tests/verify", forbidden) == {}


# --- the lab is test equipment beside the product ----------------------------------------------

PRODUCT_FOLDERS = ("roles", "facts", "deploys", "gpunode")
# The lab's package, its node paths and commands, or the word itself: product code names none.
NAMES_THE_LAB = re.compile(r"\blab\b|gpunode[-_]lab", re.IGNORECASE)


def lab_mentions(path: Path) -> list[str]:
    return [
        f"{number}: {line.strip()}"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if NAMES_THE_LAB.search(line)
    ]


@pytest.mark.parametrize("folder", PRODUCT_FOLDERS)
def test_product_code_neither_imports_nor_names_the_lab(folder: str) -> None:
    imports = offending(folder, "lab")
    mentions = {
        str(path.relative_to(ROOT)): found
        for path in modules_under(folder)
        if (found := lab_mentions(path))
    }
    assert imports == {} and mentions == {}, (imports, mentions)


@pytest.mark.parametrize(
    "line",
    [
        'LAB_TOOL = "gpunode-lab-hw"',
        "from lab import Lab",
        "# on lab nodes the simulator stands in",
        'STATE = "/var/lib/gpunode-lab/state"',
        "import gpunode_lab",
    ],
)
def test_every_way_of_naming_the_lab_is_seen(line: str, tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text(line + "\n")
    assert lab_mentions(module)


def test_words_that_merely_contain_lab_are_not_mentions(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text("label = available = enable_table = collaborate = None\n")
    assert lab_mentions(module) == []

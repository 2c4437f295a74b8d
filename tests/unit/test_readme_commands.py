"""Every command the README's ```sh blocks type works as written: the command exists, the
files it names exist, and its arguments parse (gpunode's parser, pyinfra's CLI, pytest's
options with the suite's plugins). Running them against a lab is the lab tier's business."""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from gpunode.cli import build_parser
from tests.readme import readme_commands

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
README = ROOT / "README.md"


COMMANDS = readme_commands(README.read_text())


def test_the_readme_has_everyday_commands() -> None:
    names = {words[0] for _, words in COMMANDS}
    assert {"gpunode", "pyinfra", "pytest", "./dev", "."} <= names


@cache
def pytest_options(path: str) -> str:
    return subprocess.run(
        [str(BIN / "pytest"), path, "--help"], cwd=ROOT, capture_output=True, text=True,
        check=True, timeout=300,
    ).stdout  # fmt: skip


def files_named(words: list[str], base: Path) -> list[Path]:
    """The checkout's files a command names: words that look like a path into it."""
    return [base / word for word in words if re.fullmatch(r"(inventories|deploys|tests)/\S+", word)]


@pytest.mark.parametrize(
    ("line", "words"), COMMANDS, ids=[f"README:{line}" for line, _ in COMMANDS]
)
def test_a_readme_command_works_as_written(line: int, words: list[str]) -> None:
    command, arguments = words[0], words[1:]
    base = ROOT
    if command == ".":
        assert (ROOT / arguments[0]).is_file(), arguments[0]
        return
    if command == "./dev":
        script = (ROOT / "dev").read_text()
        assert re.search(rf"^  {re.escape(arguments[0])}\)", script, re.MULTILINE), arguments
        if arguments[0] == "test" and arguments[1:2] and arguments[1].startswith("tests/"):
            assert (ROOT / arguments[1]).exists(), arguments[1]
        return
    name = command.removeprefix(".venv/bin/")
    if name == "ssh":
        return  # the system's client; its key and address are the running lab's
    assert (BIN / name).is_file(), f"{command}: not in {BIN}"
    if name == "gpunode":
        build_parser().parse_args(arguments)  # exits (SystemExit) on what it cannot parse
    elif name == "pyinfra":
        from pyinfra_cli.main import cli

        context = cli.make_context("pyinfra", list(arguments))
        if context.params.get("chdir"):
            base = ROOT  # the README's --chdir names where the reader's checkout is
        assert context.params["inventory"], arguments
    elif name == "pytest":
        path = next(word for word in arguments if not word.startswith("-"))
        options = pytest_options(path)
        for option in (word.split("=")[0] for word in arguments if word.startswith("--")):
            assert f"{option}" in options, f"pytest {path}: no option {option}"
    else:
        pytest.fail(f"README line {line}: a command this test does not know: {command}")
    for path in files_named(arguments, base):
        assert path.exists(), f"README line {line}: {path} does not exist"

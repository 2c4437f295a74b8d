"""The README's everyday commands, run as written against the lab, which stands in for the
production fleet the README names.

Only what names that fleet is replaced: ``inventories/prod.py`` is ``inventories/lab.py``,
``~/gpunode`` is this checkout, and testinfra's ``ssh://admin@node1`` reaches the lab's first
node as its login user, through an OpenSSH configuration that names ``node1`` (this machine
has no such name, and the lab's nodes no ``admin``). Each command runs in a shell of its own in the
checkout, after the block's ``. .venv/bin/activate``, with Enter for any question (an
operator's answer to pyinfra's "Press enter to execute"): on a converged lab each must end 0
(converged, valid, no drift, every check passing), without a traceback.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from lab import LOGIN_USER, Lab, LabNode
from tests.readme import section_commands

from .conftest import ROOT, run_pyinfra

pytestmark = pytest.mark.lab

README = ROOT / "README.md"
EVERYDAY = section_commands(README.read_text(), "## Everyday commands")
# What names the production fleet, and what names the lab in its place.
STAND_INS = {
    "inventories/prod.py": "inventories/lab.py",
    "~/gpunode": str(ROOT),
    "ssh://admin@node1": f"ssh://{LOGIN_USER}@node1",
}


# A host checked with the verify suite's defaults (`--hosts=`, no inventory) is held to them,
# and the lab's inventory declares two things otherwise: a container runtime (group_data/all.py),
# which turns forwarding on for its bridges (DesiredState.ip_forward), and an admin, gpuadmin,
# beside the login user (group_data/lab.py). These checks, and no others, must say so; every
# other check must pass or skip.
DEFAULTS_DIFFER = {
    "tests/verify/test_kernel.py::test_hardened_sysctls_are_persistent",
    "tests/verify/test_ssh.py::test_only_declared_admins_and_the_login_user_may_log_in",
}


def failed_checks(output: str) -> set[str]:
    """The verify checks pytest's short summary names as failed, without their host."""
    return {
        line.split()[1].split("[")[0] for line in output.splitlines() if line.startswith("FAILED ")
    }


def as_run_here(words: list[str]) -> str:
    line = shlex.join(words)
    for production, lab_stand_in in STAND_INS.items():
        line = line.replace(production, lab_stand_in)
    return line


@pytest.fixture(scope="module")
def converged(lab: Lab, lab_nodes: list[LabNode]) -> list[LabNode]:
    run = run_pyinfra("deploys/gpu_node.py")
    assert run.returncode == 0, run.output
    return lab_nodes


@pytest.fixture(scope="module")
def operator_env(
    lab: Lab, converged: list[LabNode], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """The environment of an operator whose OpenSSH configuration names the lab's first node
    ``node1``: OpenSSH reads ~/.ssh/config from the account's home, not from $HOME, so the
    ``ssh`` first on PATH is the system's with that configuration (-F)."""
    home = tmp_path_factory.mktemp("operator")
    config = home / "ssh_config"
    config.write_text(
        "Host node1\n"
        f"  HostName {converged[0].address}\n"
        f"  IdentityFile {lab.key_path}\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {lab.known_hosts_path}\n"
        "  StrictHostKeyChecking yes\n"
    )
    config.chmod(0o600)
    system_ssh = shutil.which("ssh")
    assert system_ssh, "no ssh client on this machine"
    bin_dir = home / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(
        f'#!/bin/sh\nexec {shlex.quote(system_ssh)} -F {shlex.quote(str(config))} "$@"\n'
    )
    (bin_dir / "ssh").chmod(0o755)
    yield {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_the_everyday_block_is_what_this_module_runs() -> None:
    names = [words[0] for _, words in EVERYDAY]
    assert names[0] == "." and {"gpunode", "pyinfra", "pytest"} <= set(names)


@pytest.mark.parametrize(
    ("line", "words"),
    [entry for entry in EVERYDAY if entry[1][0] != "."],
    ids=[f"README:{line}" for line, words in EVERYDAY if words[0] != "."],
)
def test_an_everyday_command_runs_as_written_on_the_converged_lab(
    converged: list[LabNode], operator_env: dict[str, str], line: int, words: list[str]
) -> None:
    command = as_run_here(words)
    done = subprocess.run(
        ["bash", "-c", f". .venv/bin/activate && {command}"],
        cwd=ROOT, env=operator_env, input="\n",
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    output = done.stdout + done.stderr
    said = f"README line {line}: {command}\n{output[-4000:]}"
    assert "Traceback" not in output, said
    if any(word.startswith("--hosts=") for word in words):
        assert done.returncode in (0, 1), said  # 1: checks ran, some failed
        assert failed_checks(output) == DEFAULTS_DIFFER, said
        assert " error" not in output.splitlines()[-1], said
    else:
        assert done.returncode == 0, said

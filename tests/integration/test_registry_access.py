"""Registry logins and mirrors on a lab node: the file an NGC API key becomes, written once and
never shown, its refusal when the key file is readable by others, containerd's hosts.toml, the
drift check's findings and the verify suite's checks.

What this checks, and what it does not: everything here is files and their modes, which a lab
container holds as any node does. No lab node reaches nvcr.io or runs containerd or Docker,
so a pull with the key, and containerd reading the mirror, are left to real nodes (the verify
suite's GPU container check runs there).
"""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpunode.expected.registry_access import (
    DOCKER_CLIENT_CONFIG,
    HOSTS_DIRECTORY,
    HOSTS_MARKER,
)
from lab import Lab, LabNode

from .conftest import ROOT, drift_report, run_pyinfra, ssh, write_inventory

pytestmark = pytest.mark.lab

DEPLOY = """\
import sys

sys.path.insert(0, {root!r})

from gpunode.converge import converging
from roles.registry_access import registry_access

with converging() as desired:
    registry_access(desired=desired)
"""
# Made up for the test, shaped like an NGC personal key.
API_KEY = "nvapi-lab0Test1Key2Not3Real4AbCdEfGhIjKlMnOpQrStUvWx"
MIRROR = "https://mirror.internal:5000"
HUB_HOSTS = f"{HOSTS_DIRECTORY}/docker.io/hosts.toml"
OPERATION = f"Container registry access | {DOCKER_CLIENT_CONFIG}: logins for nvcr.io"


def sudo(lab: Lab, node: LabNode, command: str) -> str:
    result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def node(lab: Lab, lab_nodes: list[LabNode]) -> Iterator[LabNode]:
    """The first lab node; what the module wrote removed at the end."""
    chosen = lab_nodes[0]
    yield chosen
    sudo(lab, chosen, f"rm -rf /root/.docker {HOSTS_DIRECTORY}/docker.io")


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ngc") / "ngc.key"
    path.write_text(API_KEY + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def inventory(
    lab: Lab, node: LabNode, key_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> str:
    data = {
        "container_runtime": {
            "engines": ["docker", "containerd"],
            "registry_logins": [{"password_file": str(key_file)}],
            "registry_mirrors": [{"registry": "docker.io", "mirrors": [MIRROR]}],
        }
    }
    path = tmp_path_factory.mktemp("registry") / "inventory.py"
    return write_inventory(path, lab, [node], {node.name: data})


@pytest.fixture(scope="module")
def deploy_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("registry-deploy") / "registry_access_only.py"
    path.write_text(DEPLOY.format(root=str(ROOT)))
    return str(path)


@pytest.fixture(scope="module")
def first_run(node: LabNode, inventory: str, deploy_file: str) -> Any:
    run = run_pyinfra("-v", deploy_file, inventory=inventory)
    assert run.returncode == 0, run.output
    return run


def test_the_key_becomes_roots_docker_login_written_once_and_never_shown(
    lab: Lab, node: LabNode, inventory: str, deploy_file: str, first_run: Any
) -> None:
    assert node.name in first_run.changed_operations().get(OPERATION, [])
    encoded = base64.b64encode(f"$oauthtoken:{API_KEY}".encode()).decode()
    assert API_KEY not in first_run.output and encoded not in first_run.output
    assert sudo(lab, node, f"stat -c '%a %U %G' {DOCKER_CLIENT_CONFIG}").split() == [
        "600", "root", "root",
    ]  # fmt: skip
    assert sudo(lab, node, "stat -c %a /root/.docker").strip() == "700"
    auths = json.loads(sudo(lab, node, f"cat {DOCKER_CLIENT_CONFIG}"))["auths"]
    assert auths == {"nvcr.io": {"auth": encoded}}
    assert ssh(lab, node, "test -e /run/gpunode-registry").returncode != 0  # staging removed
    hosts = sudo(lab, node, f"cat {HUB_HOSTS}")
    assert hosts.startswith(HOSTS_MARKER) and f'[host."{MIRROR}"]' in hosts
    second = run_pyinfra("-v", deploy_file, inventory=inventory)
    assert second.returncode == 0, second.output
    assert second.changed_operations() == {}, second.changed_operations()
    assert "containerd does not read /etc/containerd/certs.d yet" in second.output


def test_a_key_file_others_may_read_is_refused_and_nothing_changes(
    lab: Lab, node: LabNode, inventory: str, deploy_file: str, key_file: Path, first_run: Any
) -> None:
    before = sudo(lab, node, f"sha256sum {DOCKER_CLIENT_CONFIG}")
    key_file.chmod(0o644)
    try:
        refused = run_pyinfra(deploy_file, inventory=inventory)
    finally:
        key_file.chmod(0o600)
    assert refused.returncode != 0, refused.output
    assert f"{key_file} is readable by others (mode 0644); chmod 600 {key_file}" in (refused.output)
    assert API_KEY not in refused.output
    assert sudo(lab, node, f"sha256sum {DOCKER_CLIENT_CONFIG}") == before


def test_drift_and_verify_see_the_login_and_its_mode(
    lab: Lab, node: LabNode, inventory: str, first_run: Any, tmp_path: Path
) -> None:
    def findings() -> dict[str, Any]:
        report = drift_report(node, inventory)
        return {f["id"]: f for f in report["findings"] if f["id"].startswith("registry_access")}

    # The lab node has no containerd configuration: the mirror's file is there, unread.
    assert set(findings()) == {"registry_access.mirrors_unread"}
    verify = [sys.executable, "-m", "pytest", "tests/verify/test_shared_data.py",
              "--inventory", inventory, "-q", "-p", "no:cacheprovider", "-k",
              "registry_logins or hosts_toml"]  # fmt: skip
    passed = subprocess.run(verify, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert passed.returncode == 0 and "2 passed" in passed.stdout, passed.stdout
    sudo(lab, node, f"chmod 644 {DOCKER_CLIENT_CONFIG}")
    try:
        assert findings()["registry_access.mode"]["severity"] == "critical"
        failed = subprocess.run(verify, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert failed.returncode == 1 and "1 failed, 1 passed" in failed.stdout, failed.stdout
        assert API_KEY not in failed.stdout
    finally:
        sudo(lab, node, f"chmod 600 {DOCKER_CLIENT_CONFIG}")
    sudo(lab, node, f"mv {DOCKER_CLIENT_CONFIG} {DOCKER_CLIENT_CONFIG}.away")
    try:
        found = findings()["registry_access.login:nvcr.io"]
        assert found["severity"] == "warning" and found["found"] == f"no {DOCKER_CLIENT_CONFIG}"
    finally:
        sudo(lab, node, f"mv {DOCKER_CLIENT_CONFIG}.away {DOCKER_CLIENT_CONFIG}")

"""The hardened SSH server on lab nodes: effective config, outside audit, no lock-outs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpunode.lab import Lab, LabNode

from .conftest import run_pyinfra, ssh, write_inventory

pytestmark = pytest.mark.lab

DEPLOY = "deploys/gpu_node.py"
SSH_AUDIT = str(Path(sys.executable).with_name("ssh-audit"))
POLICY = "Hardened Debian 12 (version 3)"


def effective(lab: Lab, node: LabNode) -> dict[str, str]:
    result = ssh(lab, node, "sudo /usr/sbin/sshd -T")
    assert result.returncode == 0, result.stderr
    return dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)


@pytest.fixture(scope="module")
def hardened(lab: Lab, lab_nodes: list[LabNode]) -> list[LabNode]:
    # A cloud image's drop-in that turns password login back on must not win.
    for node in lab_nodes:
        drop_in = (
            "echo 'PasswordAuthentication yes' | sudo tee /etc/ssh/sshd_config.d/50-cloud-init.conf"
        )
        assert ssh(lab, node, drop_in).returncode == 0
    run = run_pyinfra(DEPLOY)
    assert run.returncode == 0, run.output
    return lab_nodes


def test_effective_config_is_hardened_despite_drop_ins(lab: Lab, hardened: list[LabNode]) -> None:
    for node in hardened:
        settings = effective(lab, node)
        assert settings["passwordauthentication"] == "no"
        assert settings["kbdinteractiveauthentication"] == "no"
        assert settings["permitrootlogin"] == "no"
        assert settings["authenticationmethods"] == "publickey"
        assert settings["maxauthtries"] == "2"
        assert settings["loglevel"] == "VERBOSE"
        assert settings["allowtcpforwarding"] == "no"


def test_ssh_audit_hardened_debian_12_policy_passes(hardened: list[LabNode]) -> None:
    for node in hardened:
        result = subprocess.run(
            [SSH_AUDIT, "-P", POLICY, node.address], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stdout
        assert "Passed" in result.stdout


def test_host_keys_and_moduli(lab: Lab, hardened: list[LabNode]) -> None:
    node = hardened[0]
    bits = ssh(lab, node, "ssh-keygen -l -f /etc/ssh/ssh_host_rsa_key.pub").stdout.split()[0]
    assert bits == "4096"
    weak = ssh(lab, node, "awk '!/^#/ && $5 < 3071' /etc/ssh/moduli | wc -l").stdout.strip()
    assert weak == "0"


def test_second_run_changes_nothing(hardened: list[LabNode]) -> None:
    run = run_pyinfra(DEPLOY)
    assert run.returncode == 0, run.output
    assert run.changed_operations() == {}


def test_config_that_cuts_new_logins_is_rolled_back(
    lab: Lab, hardened: list[LabNode], tmp_path: Path
) -> None:
    # sshd -t accepts listening on loopback only, but no new login could reach the node.
    target = hardened[0]
    before = ssh(lab, target, "sha1sum /etc/ssh/sshd_config").stdout
    inventory = write_inventory(
        tmp_path / "cut.py",
        lab,
        [target],
        {target.name: {"sshd": {"listen_addresses": ["127.0.0.1"]}}},
    )
    run = run_pyinfra(DEPLOY, inventory=inventory)
    assert run.returncode != 0
    assert (
        f"{target.name}: the new sshd configuration was rolled back because new SSH login"
        in run.output
    )
    assert "the previous configuration is active again" in run.output
    assert ssh(lab, target, "sha1sum /etc/ssh/sshd_config").stdout == before
    assert "listenaddress 0.0.0.0:22" in ssh(lab, target, "sudo /usr/sbin/sshd -T").stdout


def test_password_login_deploy_is_refused_before_any_change(
    lab: Lab, hardened: list[LabNode], tmp_path: Path
) -> None:
    target = hardened[0]
    assert ssh(lab, target, "sudo nvidia-smi -pm 0").returncode == 0
    inventory = write_inventory(
        tmp_path / "password.py", lab, [target], {target.name: {"ssh_password": "hunter2"}}
    )
    run = run_pyinfra(DEPLOY, inventory=inventory)
    assert run.returncode != 0
    assert (
        f"{target.name}: sshd hardening refused, nothing changed: "
        "this deploy logs in with a password" in run.output
    )
    assert "hunter2" not in run.output
    state = ssh(lab, target, "nvidia-smi --query-gpu=persistence_mode --format=csv,noheader").stdout
    assert set(state.split()) == {"Disabled"}
    assert run_pyinfra(DEPLOY).returncode == 0

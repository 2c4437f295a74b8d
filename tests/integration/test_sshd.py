"""The hardened SSH server on lab nodes: effective config, outside audit, no lock-outs."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from lab import Lab, LabNode

from .conftest import (
    drift_report,
    journal_cursor,
    journal_since,
    lab_group_data,
    run_pyinfra,
    ssh,
    wait_for_ssh,
    write_inventory,
)

pytestmark = pytest.mark.lab

DEPLOY = "deploys/gpu_node.py"
SSH_AUDIT = str(Path(sys.executable).with_name("ssh-audit"))
# Planted drop-ins: one that loosens login for everyone, one for an admin from outside only.
MATCH_ALL = "Match all\n    PasswordAuthentication yes\n    PermitRootLogin yes\n"
MATCH_ADMIN_FROM_OUTSIDE = (
    "Match User gpuadmin Address *,!127.0.0.1\n    KbdInteractiveAuthentication yes\n"
)
PLANTED = {
    "/etc/ssh/sshd_config.d/00-planted.conf": MATCH_ALL,
    "/etc/ssh/sshd_config.d/01-planted.conf": MATCH_ADMIN_FROM_OUTSIDE,
}
# ssh-audit's policy for each release (gpunode/distributions.py names the same; restated).
POLICIES = {
    "bookworm": "Hardened Debian 12 (version 3)",
    "trixie": "Hardened Debian 13 (version 1)",
}


def effective(lab: Lab, node: LabNode) -> dict[str, str]:
    result = ssh(lab, node, "sudo /usr/sbin/sshd -T")
    assert result.returncode == 0, result.stderr
    return dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)


def effective_for(lab: Lab, node: LabNode, user: str, address: str = "192.0.2.1") -> dict[str, str]:
    """``sshd -T`` as sshd would apply it to ``user`` logging in from ``address``."""
    result = ssh(
        lab, node, f"sudo /usr/sbin/sshd -T -C user={user},host={address},addr={address},lport=22"
    )
    assert result.returncode == 0, result.stderr
    return dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)


def sudo(lab: Lab, node: LabNode, command: str) -> str:
    result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, result.stderr
    return result.stdout


def sshd_findings(node: LabNode) -> dict[str, str]:
    """The drift check's sshd.* findings for ``node``: id -> found."""
    findings = drift_report(node)["findings"]
    return {f["id"]: f["found"] for f in findings if f["id"].startswith("sshd.")}


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


def ssh_audit(node: LabNode, policy: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SSH_AUDIT, "-P", policy, node.address], capture_output=True, text=True, timeout=120
    )


def test_ssh_audit_policy_of_each_release_passes(hardened: list[LabNode]) -> None:
    # Hardened Debian 12 (version 3) on bookworm, Hardened Debian 13 (version 1) on trixie.
    for node in hardened:
        result = ssh_audit(node, POLICIES[node.release])
        assert result.returncode == 0, result.stdout
        assert "Passed" in result.stdout and POLICIES[node.release] in result.stdout


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


# The sshd role alone (with the accounts it admits), as an operator runs it on one node.
SSHD_DEPLOY = """\
from gpunode.converge import converging
from roles.admin_users import admin_users
from roles.sshd import sshd

with converging() as desired:
    admin_users(desired=desired)
    sshd(desired=desired)
"""
# An address no lab node has (TEST-NET-1): sshd -t accepts it, sshd cannot bind it.
ABSENT_ADDRESS = "192.0.2.1"


def test_an_sshd_that_cannot_start_is_rolled_back_and_the_run_says_why(
    lab: Lab, hardened: list[LabNode], tmp_path: Path
) -> None:
    # sshd takes a configuration that listens on an address the node does not have on its
    # restart (sshd -t accepts it), and exits: the role puts the previous one back. (Moved here
    # from the lab VM: binding in a container's own network namespace fails the same way.)
    target = hardened[0]
    # What the role may change: the configuration, the moduli, the host keys.
    ssh_files = "sha1sum /etc/ssh/sshd_config /etc/ssh/moduli /etc/ssh/ssh_host_*"
    before = sudo(lab, target, ssh_files)
    inventory = write_inventory(
        tmp_path / "absent.py",
        lab,
        [target],
        {
            target.name: {
                # The lab's accounts and sshd settings (as converged), but where sshd listens.
                "admin_users": lab_group_data("admin_users"),
                "sshd": {**lab_group_data("sshd"), "listen_addresses": [ABSENT_ADDRESS]},
            }
        },
    )
    deploy = tmp_path / "sshd_deploy.py"
    deploy.write_text(SSHD_DEPLOY)
    cursor = journal_cursor(lab, target)
    run = run_pyinfra(str(deploy), inventory=inventory)
    assert run.returncode != 0, run.output
    # sshd took the new configuration on its restart, and could not listen with it.
    logged = journal_since(lab, target, cursor, "ssh.service")
    bind_error = f"error: Bind to port 22 on {ABSENT_ADDRESS} failed: Cannot assign requested"
    assert bind_error in logged, logged
    assert "fatal: Cannot bind any address." in logged, logged
    # The role put the previous one back and says what happened, naming the node.
    assert (
        f"{target.name}: the new sshd configuration was rolled back because new SSH login"
        in run.output
    )
    assert f"sshd did not come back (ssh.service is failed: {bind_error}" in run.output
    assert "the previous configuration is active again" in run.output
    wait_for_ssh(lab, target)
    assert sudo(lab, target, ssh_files) == before
    assert sudo(lab, target, "systemctl is-active ssh.service").strip() == "active"
    assert "listenaddress 0.0.0.0:22" in sudo(lab, target, "/usr/sbin/sshd -T")


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
        f"{target.name}: sshd hardening refused: this deploy logs in with a password" in run.output
    )
    assert "Nothing was changed." in run.output
    assert "hunter2" not in run.output
    state = ssh(lab, target, "nvidia-smi --query-gpu=persistence_mode --format=csv,noheader").stdout
    assert set(state.split()) == {"Disabled"}
    assert run_pyinfra(DEPLOY).returncode == 0


def test_match_drop_ins_do_not_override_and_drift_sees_match_blocks_per_user(
    lab: Lab, hardened: list[LabNode]
) -> None:
    target = hardened[0]
    planted = " && ".join(
        f"printf '%s' {shlex.quote(text)} > {path}" for path, text in PLANTED.items()
    )
    sudo(lab, target, f"{planted} && /usr/sbin/sshd -t && systemctl reload ssh")
    wait_for_ssh(lab, target)
    try:
        # gpunode's sshd_config reads no drop-ins: neither Match block applies.
        for user in ("gpuadmin", "root", "debian"):
            settings = effective_for(lab, target, user)
            assert settings["passwordauthentication"] == "no", user
            assert settings["permitrootlogin"] == "no", user
            assert settings["kbdinteractiveauthentication"] == "no", user
            assert settings["allowgroups"] == "gpunode-login", user
            assert settings["authorizedkeysfile"] == ".ssh/authorized_keys", user
        assert sshd_findings(target) == {}

        # Include them again by hand: the drift check sees what each account would get from
        # outside, including the Match block that only applies to gpuadmin off-host.
        sudo(
            lab,
            target,
            "echo 'Include /etc/ssh/sshd_config.d/*.conf' >> /etc/ssh/sshd_config "
            "&& systemctl reload ssh",
        )
        wait_for_ssh(lab, target)
        assert effective_for(lab, target, "gpuadmin")["kbdinteractiveauthentication"] == "yes"
        findings = sshd_findings(target)
        assert findings["sshd.passwordauthentication"] == "yes"
        assert findings["sshd.permitrootlogin"] == "yes"
        assert findings["sshd.config"] == "edited"
        assert findings["sshd.user:gpuadmin.kbdinteractiveauthentication"] == "yes"
        assert "sshd.user:debian.kbdinteractiveauthentication" not in findings

        # The deploy sees the change and puts its own configuration back.
        run = run_pyinfra("deploys/harden.py")
        assert run.returncode == 0, run.output
        assert run.changed_operations() == {
            "SSH server | Hardened sshd (validated, confirmed by a new login)": [target.name]
        }
        assert effective_for(lab, target, "gpuadmin")["kbdinteractiveauthentication"] == "no"
        assert effective_for(lab, target, "root")["passwordauthentication"] == "no"
        assert sshd_findings(target) == {}
    finally:
        sudo(lab, target, f"rm -f {' '.join(PLANTED)}")
    run = run_pyinfra("deploys/harden.py")
    assert run.returncode == 0, run.output
    assert run.changed_operations() == {}

"""Access ends with the inventory entry, on a lab node: a removed admin and an undeclared
account cannot log in, the deploy user always can (with sudo), and the drift check names an
account with login access that the inventory does not declare."""

from __future__ import annotations

import dataclasses
import runpy
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpunode.model import DesiredState
from lab import LOGIN_USER, Lab, LabNode

from .conftest import ROOT, drift_report, run_pyinfra, ssh, write_inventory

pytestmark = pytest.mark.lab

DEPLOY = "deploys/harden.py"
TEMP_ADMIN = "tempadmin"
INTRUDER = "intruder"
MODEL_FIELDS = {field.name for field in dataclasses.fields(DesiredState)}


def lab_group_data() -> dict[str, Any]:
    """The desired state inventories/group_data/lab.py declares for every lab node."""
    data = runpy.run_path(str(ROOT / "inventories" / "group_data" / "lab.py"))
    return {name: value for name, value in data.items() if name in MODEL_FIELDS}


def sudo(lab: Lab, node: LabNode, command: str) -> str:
    result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, result.stderr
    return result.stdout


def ssh_as(node: LabNode, lab: Lab, user: str, key: Path, command: str = "sudo -n true") -> int:
    """A fresh login as ``user`` with ``key``; the exit status (255: the login failed)."""
    return subprocess.run(
        [
            "ssh", "-i", str(key), "-o", f"UserKnownHostsFile={lab.known_hosts_path}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", "ConnectTimeout=10", f"{user}@{node.address}", command,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    ).returncode  # fmt: skip


def access_findings(node: LabNode) -> set[str]:
    """The drift check's accounts.* and sshd.* findings for ``node``."""
    return {
        finding["id"]
        for finding in drift_report(node)["findings"]
        if finding["id"].startswith(("accounts.", "sshd."))
    }


@pytest.fixture(scope="module")
def temp_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    key = tmp_path_factory.mktemp("keys") / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpunode-test", "-f", str(key)],
        check=True,
    )
    return key


@pytest.fixture(scope="module")
def target(lab: Lab, lab_nodes: list[LabNode]) -> Iterator[LabNode]:
    node = lab_nodes[0]
    run = run_pyinfra(DEPLOY)
    assert run.returncode == 0, run.output
    yield node
    # Leave the node as the lab inventory wants it, without the test's accounts.
    run_pyinfra(DEPLOY)
    sudo(lab, node, f"for u in {TEMP_ADMIN} {INTRUDER}; do userdel -r $u 2>/dev/null; done; true")


def test_removed_admin_loses_login_and_sudo_and_keeps_its_home(
    lab: Lab, target: LabNode, temp_key: Path, tmp_path: Path
) -> None:
    data = lab_group_data()
    public_key = temp_key.with_suffix(".pub").read_text().strip()
    with_temp_admin = {
        **data,
        "admin_users": [*data["admin_users"], {"name": TEMP_ADMIN, "ssh_keys": [public_key]}],
    }
    inventory = write_inventory(tmp_path / "more.py", lab, [target], {target.name: with_temp_admin})
    run = run_pyinfra(DEPLOY, inventory=inventory)
    assert run.returncode == 0, run.output
    assert ssh_as(target, lab, TEMP_ADMIN, temp_key, "sudo -n true && touch ~/work.txt") == 0

    # Removed from the inventory: the lab inventory no longer declares it.
    run = run_pyinfra(DEPLOY)
    assert run.returncode == 0, run.output
    assert ssh_as(target, lab, TEMP_ADMIN, temp_key, "true") == 255
    shadow = sudo(lab, target, f"getent shadow {TEMP_ADMIN}").strip().split(":")
    assert shadow[1].startswith("!")  # password locked
    assert shadow[7] == "1"  # expired since 1970-01-02: PAM refuses key logins too
    passwd = sudo(lab, target, f"getent passwd {TEMP_ADMIN}").strip().split(":")
    assert passwd[6] == "/usr/sbin/nologin"
    groups = sudo(lab, target, f"id -Gn {TEMP_ADMIN}").split()
    assert "gpunode-admins" not in groups and "gpunode-login" not in groups
    home = sudo(lab, target, f"ls -A /home/{TEMP_ADMIN} /home/{TEMP_ADMIN}/.ssh")
    assert "work.txt" in home and "authorized_keys" not in home
    assert {f"accounts.undeclared:{TEMP_ADMIN}", f"accounts.admin:{TEMP_ADMIN}"}.isdisjoint(
        access_findings(target)
    )

    # Declared again: its access comes back.
    run = run_pyinfra(DEPLOY, inventory=inventory)
    assert run.returncode == 0, run.output
    assert ssh_as(target, lab, TEMP_ADMIN, temp_key, "sudo -n true") == 0
    assert run_pyinfra(DEPLOY).returncode == 0
    assert ssh_as(target, lab, TEMP_ADMIN, temp_key, "true") == 255


def test_undeclared_account_with_a_key_cannot_log_in_and_is_reported_when_it_could(
    lab: Lab, target: LabNode, temp_key: Path
) -> None:
    public_key = temp_key.with_suffix(".pub").read_text().strip()
    sudo(
        lab,
        target,
        f"useradd --create-home --shell /bin/bash {INTRUDER} && "
        f"install -d -m 0700 -o {INTRUDER} -g {INTRUDER} /home/{INTRUDER}/.ssh && "
        f"echo {shlex.quote(public_key)} > /home/{INTRUDER}/.ssh/authorized_keys && "
        f"chown {INTRUDER}: /home/{INTRUDER}/.ssh/authorized_keys",
    )
    # Not in the login group: sshd's AllowGroups keeps it out, and drift has nothing to say.
    assert ssh_as(target, lab, INTRUDER, temp_key, "true") == 255
    assert f"accounts.undeclared:{INTRUDER}" not in access_findings(target)

    # Put into the login group by hand, it can log in: drift names it.
    sudo(lab, target, f"gpasswd -a {INTRUDER} gpunode-login")
    assert ssh_as(target, lab, INTRUDER, temp_key, "true") == 0
    assert f"accounts.undeclared:{INTRUDER}" in access_findings(target)

    # The deploy revokes it (it is a member of a group gpunode manages).
    run = run_pyinfra(DEPLOY)
    assert run.returncode == 0, run.output
    assert ssh_as(target, lab, INTRUDER, temp_key, "true") == 255
    assert access_findings(target) == set()


def test_revoking_an_account_whose_ssh_links_into_another_s_keys_refuses_the_node(
    lab: Lab, target: LabNode
) -> None:
    # The intruder links its ~/.ssh to the deploy user's: removing its authorized_keys through
    # the link would cut the deploy user's login to every node.
    deploy_keys = f"/home/{LOGIN_USER}/.ssh/authorized_keys"
    before = sudo(lab, target, f"sha1sum {deploy_keys}")
    sudo(
        lab,
        target,
        f"userdel -r {INTRUDER} 2>/dev/null; useradd --create-home --shell /bin/bash {INTRUDER} && "
        f"ln -s /home/{LOGIN_USER}/.ssh /home/{INTRUDER}/.ssh && "
        f"chown -h {INTRUDER}: /home/{INTRUDER}/.ssh && gpasswd -a {INTRUDER} gpunode-login",
    )
    try:
        run = run_pyinfra(DEPLOY)
        assert run.returncode != 0
        assert (
            f"{target.name}: revoking {INTRUDER}: ~{INTRUDER}/.ssh/authorized_keys leads to "
            f"{deploy_keys}" in run.output
        ), run.output[-3000:]
        assert "Nothing was changed." in run.output
        assert sudo(lab, target, f"sha1sum {deploy_keys}") == before
        assert "gpunode-login" in sudo(lab, target, f"id -Gn {INTRUDER}").split()
        assert ssh(lab, target, "sudo -n true").returncode == 0

        # Once the link is gone, the revocation goes through and the deploy user keeps its keys.
        sudo(lab, target, f"rm /home/{INTRUDER}/.ssh")
        run = run_pyinfra(DEPLOY)
        assert run.returncode == 0, run.output[-3000:]
        assert sudo(lab, target, f"sha1sum {deploy_keys}") == before
        assert "gpunode-login" not in sudo(lab, target, f"id -Gn {INTRUDER}").split()
    finally:
        sudo(lab, target, f"rm -f /home/{INTRUDER}/.ssh; userdel -r {INTRUDER} 2>/dev/null; true")


def test_deploy_user_keeps_its_login_and_sudo(lab: Lab, target: LabNode) -> None:
    assert ssh(lab, target, "sudo -n true").returncode == 0
    assert "gpunode-login" in sudo(lab, target, f"id -Gn {LOGIN_USER}").split()
    assert ssh_as(target, lab, LOGIN_USER, lab.key_path, "sudo -n true") == 0


def test_declared_deploy_user_without_the_deploy_key_is_refused_before_any_change(
    lab: Lab, target: LabNode, temp_key: Path, tmp_path: Path
) -> None:
    before = sudo(lab, target, f"sha1sum /home/{LOGIN_USER}/.ssh/authorized_keys")
    data = lab_group_data()
    other_key = temp_key.with_suffix(".pub").read_text().strip()
    declared = {
        **data,
        "admin_users": [*data["admin_users"], {"name": LOGIN_USER, "ssh_keys": [other_key]}],
    }
    inventory = write_inventory(tmp_path / "lockout.py", lab, [target], {target.name: declared})
    run = run_pyinfra(DEPLOY, inventory=inventory)
    assert run.returncode != 0
    assert (
        f"{target.name}: admin users refused: admin_users entry {LOGIN_USER} "
        "(the deploy user) does not list the key this deploy logs in with (SHA256:"
    ) in run.output
    assert "Nothing was changed." in run.output
    assert sudo(lab, target, f"sha1sum /home/{LOGIN_USER}/.ssh/authorized_keys") == before
    assert ssh(lab, target, "sudo -n true").returncode == 0


def test_second_run_changes_nothing(target: LabNode) -> None:
    run = run_pyinfra(DEPLOY)
    assert run.returncode == 0, run.output
    assert run.changed_operations() == {}

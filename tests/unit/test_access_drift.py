"""Drift: who can log in, evaluated per account from the control host's address (issue 12)."""

from __future__ import annotations

from typing import Any

from facts.accounts import ACCOUNTS_COMMAND, parse_accounts
from gpunode.distributions import BY_CODENAME
from gpunode.drift.rules import access_rules
from gpunode.expected.sshd import expected_effective
from gpunode.model import DesiredState, build_desired_state

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIYIq0UNQ8hVxzvZ2ZLhM4Z5hYt6s0x4dJ0W0l5xF2mQ gpuadmin"


def desired() -> DesiredState:
    state, problems = build_desired_state(
        {"admin_users": [{"name": "gpuadmin", "ssh_keys": [KEY]}]}
    )
    assert not problems, problems
    return state


def effective(**overrides: str) -> dict[str, list[str]]:
    settings = {
        key: [value]
        for key, value in expected_effective(desired().sshd, BY_CODENAME["bookworm"]).items()
    }
    return settings | {key: [value] for key, value in overrides.items()}


def login(groups: list[str], **overrides: Any) -> dict[str, Any]:
    return {
        "uid": 1001,
        "home": "/home/x",
        "shell": "/bin/bash",
        "shell_usable": True,
        "keys": 1,
        "expire_day": None,
        "password": "L",
        "groups": groups,
    } | overrides


def facts(per_user: dict[str, Any] | None = None, **accounts: dict[str, Any]) -> dict[str, Any]:
    on_node = {
        "debian": login(["debian", "sudo", "gpunode-login"]),
        "gpuadmin": login(["gpuadmin", "gpunode-admins", "gpunode-login"]),
    } | accounts
    users = {name: effective() for name in ("root", "debian", "gpuadmin")}
    return {
        "os": {
            "os_release": {"ID": "debian", "VERSION_ID": "12", "VERSION_CODENAME": "bookworm"},
            "architecture": "amd64",
            "problems": [],
        },
        "sshd": {
            "effective": effective(),
            "per_user": {"address": "10.213.0.1", "port": 22, "users": users | (per_user or {})},
            "accounts": {
                "state": "ok",
                "session_user": "debian",
                "today": 20000,
                "groups": {},
                "accounts": on_node,
            },
        },
    }


def findings(node_facts: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {
        finding_id: (expected, found)
        for finding_id, _, expected, found, _ in access_rules(desired(), node_facts)
    }


def test_hardened_node_with_its_admin_and_deploy_user_has_no_findings() -> None:
    assert findings(facts()) == {}


def test_match_user_override_is_reported_for_that_admin_only() -> None:
    node = facts({"gpuadmin": effective(passwordauthentication="yes")})
    assert findings(node) == {"sshd.user:gpuadmin.passwordauthentication": ("no", "yes")}


def test_an_override_everyone_gets_is_left_to_the_global_finding() -> None:
    node = facts()
    node["sshd"]["effective"] = effective(maxauthtries="6")
    node["sshd"]["per_user"]["users"] = {
        name: effective(maxauthtries="6") for name in ("root", "gpuadmin")
    }
    assert findings(node) == {}


def test_undeclared_account_with_keys_in_the_login_group_is_reported() -> None:
    node = facts(intruder=login(["intruder", "gpunode-login"]))
    assert findings(node) == {
        "accounts.undeclared:intruder": (
            "no SSH login for accounts the inventory does not declare",
            "intruder can log in (1 authorized keys)",
        )
    }


def test_undeclared_accounts_that_cannot_log_in_are_not_reported() -> None:
    node = facts(
        outside=login(["outside"]),  # AllowGroups keeps it out
        expired=login(["gpunode-login"], expire_day=1),
        nologin=login(["gpunode-login"], shell="/usr/sbin/nologin", shell_usable=False),
        keyless=login(["gpunode-login"], keys=0),
        root=login(["root", "gpunode-login"], uid=0),  # permit_root_login: no
    )
    assert findings(node) == {}


def test_without_allow_groups_every_account_with_keys_is_reported() -> None:
    loose = effective()
    del loose["allowgroups"]
    node = facts({name: loose for name in ("root", "debian", "gpuadmin")}, old=login(["old"]))
    node["sshd"]["effective"] = loose
    assert set(findings(node)) == {"accounts.undeclared:old"}


def test_declared_admin_that_cannot_log_in_is_reported() -> None:
    node = facts(gpuadmin=login(["gpuadmin"], expire_day=1))
    assert findings(node) == {"accounts.admin:gpuadmin": ("gpuadmin can log in", "cannot log in")}
    node["sshd"]["accounts"]["accounts"].pop("gpuadmin")
    assert findings(node) == {"accounts.admin:gpuadmin": ("gpuadmin can log in", "no such account")}


def test_unreadable_accounts_and_failed_evaluations_are_findings() -> None:
    node = facts({"gpuadmin": {"error": ["sshd: Bad configuration option"]}})
    assert "sshd.user:gpuadmin" in findings(node)
    node["sshd"]["accounts"] = parse_accounts([])
    assert "accounts.unreadable" in findings(node)


def test_accounts_parser_drops_what_is_not_an_account() -> None:
    parsed = parse_accounts(
        [
            "session_user debian",
            "today 20000",
            "group gpunode-login:x:1002:debian,gpuadmin,Bad;name",
            "group gpunode-admins",
            "account:gpuadmin:1001:yes:2:1:L:gpuadmin,gpunode-login:/bin/bash:/home/gpuadmin",
            "account:Evil$(x):0:yes:1::P::/bin/sh:/",
            "account:short:line",
        ]
    )
    assert parsed["groups"] == {"gpunode-admins": None, "gpunode-login": ["debian", "gpuadmin"]}
    assert set(parsed["accounts"]) == {"gpuadmin"}
    assert parsed["accounts"]["gpuadmin"]["keys"] == 2
    assert parsed["accounts"]["gpuadmin"]["expire_day"] == 1


def test_accounts_command_reads_both_key_files_and_shadow_expiry() -> None:
    assert '"$home/.ssh/authorized_keys2"' in ACCOUNTS_COMMAND
    assert "ex[$1]=$8" in ACCOUNTS_COMMAND

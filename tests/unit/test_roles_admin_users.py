"""Admin accounts: the sudoers drop-in is validated by visudo before it can become active;
removed admins lose access; the deploy user's login and sudo are proven to survive."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pyinfra.context import ctx_state
from pyinfra.facts.files import Directory, File, Link, Sha1File
from pyinfra.facts.server import AuthorizedKeys, Groups, Os, Users, Which
from pyinfra.operations import server

from facts.accounts import (
    KeyFileTargets,
    LoginAccounts,
    PasswdEntries,
    key_file_targets_command,
    parse_key_file_targets,
    parse_passwd_entries,
)
from gpunode.model import DesiredState, build_desired_state
from gpunode.refusal import REFUSED_EXIT, NodeRefused
from roles.admin_users import (
    access_risks,
    admin_account,
    deploy_public_key,
    group_membership,
    reinstated_account,
    removal_of_own_file,
    revocations,
    revoked_account,
    sudoers_dropin,
)

from .fakehost import commands_of

CONTENT = "%gpunode-admins ALL=(ALL:ALL) NOPASSWD: ALL\n"


def test_new_dropin_is_checked_before_it_is_moved_into_place() -> None:
    commands, _ = commands_of(
        sudoers_dropin, {Sha1File: None}, path="/etc/sudoers.d/x", content=CONTENT
    )
    assert commands == [
        "printf '%s' '%gpunode-admins ALL=(ALL:ALL) NOPASSWD: ALL\n' > /etc/sudoers.d/x.new",
        "visudo -c -q -f /etc/sudoers.d/x.new && chmod 0440 /etc/sudoers.d/x.new "
        "&& mv /etc/sudoers.d/x.new /etc/sudoers.d/x",
    ]


def test_identical_dropin_is_a_noop() -> None:
    digest = hashlib.sha1(CONTENT.encode()).hexdigest()
    commands, noops = commands_of(
        sudoers_dropin, {Sha1File: digest}, path="/etc/sudoers.d/x", content=CONTENT
    )
    assert commands == []
    assert noops == ["/etc/sudoers.d/x is up to date"]


# --- Access ends with the inventory entry (issue 12, item 6) ---------------------------


def _public_key() -> str:
    public = Ed25519PrivateKey.generate().public_key()
    return public.public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()


DEPLOY_KEY, OTHER_KEY = _public_key(), _public_key()


def account(**overrides: Any) -> dict[str, Any]:
    good = {
        "uid": 1001,
        "home": "/home/old admin",
        "shell": "/bin/bash",
        "shell_usable": True,
        "keys": 1,
        "expire_day": None,
        "password": "L",
        "groups": ["gpunode-admins", "gpunode-login"],
    }
    return good | overrides


def accounts_fact(accounts: dict[str, Any], **groups: list[str]) -> dict[type, Any]:
    value = {
        "state": "ok",
        "session_user": "debian",
        "today": 20000,
        "groups": {"gpunode-admins": [], "gpunode-login": []}
        | {name.replace("_", "-"): members for name, members in groups.items()},
        "accounts": accounts,
    }
    return {LoginAccounts: value}


def desired_with(*admins: dict[str, Any], **data: Any) -> DesiredState:
    state, problems = build_desired_state({"admin_users": list(admins), **data})
    assert not problems, problems
    return state


def key_targets(home: str, uid: int = 1001, **keys: tuple[int, str]) -> dict[str, Any]:
    """A KeyFileTargets value: each key file (authorized_keys, authorized_keys2) its owner and
    where it resolves."""
    return {
        "state": "ok",
        "uid": uid,
        "home": home,
        "keys": {
            f".ssh/{name}": {"uid": owner, "path": path} for name, (owner, path) in keys.items()
        },
    }


def test_removed_admin_is_expired_locked_keyless_and_leaves_both_groups() -> None:
    facts = accounts_fact(
        {"oldadmin": account()}, gpunode_admins=["oldadmin"], gpunode_login=["oldadmin"]
    )
    keys = "/home/old admin/.ssh/authorized_keys"
    facts[KeyFileTargets] = key_targets("/home/old admin", authorized_keys=(1001, keys))
    commands, noops = commands_of(revoked_account, facts, user="oldadmin")
    assert commands == [
        "usermod --lock --expiredate 1 --shell /usr/sbin/nologin oldadmin",
        removal_of_own_file(keys, 1001),
        "gpasswd -d oldadmin gpunode-admins >/dev/null",
        "gpasswd -d oldadmin gpunode-login >/dev/null",
    ]
    assert not any("userdel" in c or "rm -r" in c for c in commands)  # the home is kept
    assert noops == []


def test_removed_system_account_keeps_its_shell_and_expiry_but_loses_keys_and_groups() -> None:
    facts = accounts_fact(
        {"www-data": account(uid=33, home="/var/www", groups=["gpunode-login"])},
        gpunode_login=["www-data"],
    )
    facts[KeyFileTargets] = key_targets(
        "/var/www",
        uid=33,
        authorized_keys=(33, "/var/www/.ssh/authorized_keys"),
        authorized_keys2=(33, "/var/www/.ssh/authorized_keys2"),
    )
    commands, _ = commands_of(revoked_account, facts, user="www-data")
    assert commands == [
        removal_of_own_file("/var/www/.ssh/authorized_keys", 33),
        removal_of_own_file("/var/www/.ssh/authorized_keys2", 33),
        "gpasswd -d www-data gpunode-login >/dev/null",
    ]


@pytest.mark.parametrize(
    "targets",
    [
        # ~/.ssh a link to the deploy user's: the file resolves into another home.
        key_targets("/home/olduser", authorized_keys=(1000, "/home/debian/.ssh/authorized_keys")),
        # A link inside the home to a file another account owns (a hard link reads the same).
        key_targets("/home/olduser", authorized_keys=(0, "/home/olduser/.ssh/authorized_keys")),
        # /home/olduser2 starts with /home/olduser but is another home.
        key_targets("/home/olduser", authorized_keys=(1001, "/home/olduser2/.ssh/authorized_keys")),
        {"state": "unreadable", "reason": "line 'x'"},
    ],
    ids=["into-another-home", "not-its-own", "a-home-beside-it", "unreadable"],
)
def test_a_key_file_that_is_not_the_account_s_own_refuses_the_node(
    targets: dict[str, Any],
) -> None:
    facts = accounts_fact({"olduser": account(home="/home/olduser")}, gpunode_login=["olduser"])
    facts[KeyFileTargets] = targets
    with pytest.raises(NodeRefused) as refused:
        commands_of(revoked_account, facts, user="olduser")
    assert "node-1: revoking olduser" in refused.value.reason
    assert "Nothing was changed." in str(refused.value)


def _run(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)


def test_the_removal_takes_only_the_file_it_checked(tmp_path: Path) -> None:
    own = tmp_path / "olduser" / ".ssh" / "authorized_keys"
    own.parent.mkdir(parents=True)
    own.write_text("ssh-ed25519 AAAA olduser")
    assert _run(removal_of_own_file(str(own), os.getuid())).returncode == 0
    assert not own.exists()
    assert _run(removal_of_own_file(str(own), os.getuid())).returncode == 0  # gone: nothing to do

    # Swapped for a link into another account's keys after the fact read it: refused, kept.
    other = tmp_path / "debian" / ".ssh" / "authorized_keys"
    other.parent.mkdir(parents=True)
    other.write_text("ssh-ed25519 AAAA deploy")
    own.parent.rmdir()
    own.parent.symlink_to(other.parent)
    swapped = _run(removal_of_own_file(str(own), os.getuid()))
    assert swapped.returncode == REFUSED_EXIT
    assert "changed since it was checked" in swapped.stderr
    assert other.read_text() == "ssh-ed25519 AAAA deploy"
    # Not its owner's: refused, kept.
    assert _run(removal_of_own_file(str(other), os.getuid() + 1)).returncode == REFUSED_EXIT
    assert other.exists()


def test_key_file_targets_keep_clean_lines_and_refuse_odd_ones() -> None:
    assert parse_key_file_targets(
        [
            "home 1001 /home/old admin",
            "key .ssh/authorized_keys 1000 /home/debian/.ssh/authorized_keys",
        ]
    ) == key_targets("/home/old admin", authorized_keys=(1000, "/home/debian/.ssh/authorized_keys"))
    assert parse_key_file_targets([]) == KeyFileTargets.default()
    assert parse_key_file_targets(["home 1001 "])["home"] is None
    for odd in (
        ["home 1001 /home/u", "key .ssh/other 1001 /home/u/x"],
        ["home 1001 /home/u", "key .ssh/authorized_keys 1001 relative"],
        ["home 1001 /home/u", "key .ssh/authorized_keys 1001 /home/u/\x1b[2J"],
        ["key .ssh/authorized_keys 1001 /home/u/.ssh/authorized_keys"],
        ["something else"],
    ):
        assert parse_key_file_targets(odd)["state"] == "unreadable", odd


def test_key_file_targets_refuse_a_name_that_is_not_a_user_name() -> None:
    with pytest.raises(ValueError, match="not a user name"):
        key_file_targets_command("x; rm -rf /")


def test_revoked_account_is_a_noop() -> None:
    revoked = account(keys=0, expire_day=1, shell="/usr/sbin/nologin", groups=[])
    commands, noops = commands_of(
        revoked_account, accounts_fact({"oldadmin": revoked}), user="oldadmin"
    )
    assert commands == []
    assert noops == ["oldadmin is revoked"]


def test_declared_again_the_account_is_no_longer_expired() -> None:
    facts = accounts_fact({"gpuadmin": account(expire_day=1)})
    commands, _ = commands_of(reinstated_account, facts, user="gpuadmin")
    assert commands == ["usermod --expiredate '' gpuadmin"]
    commands, noops = commands_of(
        reinstated_account, accounts_fact({"gpuadmin": account()}), user="gpuadmin"
    )
    assert commands == [] and noops == ["gpuadmin is not expired"]


def test_group_membership_adds_and_removes_only_when_needed() -> None:
    facts = accounts_fact({}, gpunode_login=["gpuadmin"])
    assert commands_of(group_membership, facts, user="debian", group="gpunode-login")[0] == [
        "gpasswd -a debian gpunode-login >/dev/null"
    ]
    assert commands_of(group_membership, facts, user="gpuadmin", group="gpunode-login")[0] == []
    removed, _ = commands_of(
        group_membership, facts, user="gpuadmin", group="gpunode-login", member=False
    )
    assert removed == ["gpasswd -d gpuadmin gpunode-login >/dev/null"]


def test_managed_accounts_not_declared_are_revoked_but_never_the_deploy_user_or_root() -> None:
    desired = desired_with({"name": "gpuadmin", "ssh_keys": [OTHER_KEY]})
    facts = accounts_fact(
        {},
        gpunode_admins=["gpuadmin", "oldadmin", "debian"],
        gpunode_login=["gpuadmin", "nosudo", "root", "debian"],
    )
    assert revocations(desired, facts[LoginAccounts], login_user="debian") == [
        "nosudo",
        "oldadmin",
    ]


def test_undeclared_deploy_user_keeps_its_access() -> None:
    desired = desired_with({"name": "gpuadmin", "ssh_keys": [OTHER_KEY]})
    assert access_risks(desired, "debian", deploy_key=None, uses_sudo=True) == []


def test_declared_deploy_user_without_the_deploy_key_is_refused() -> None:
    desired = desired_with({"name": "debian", "ssh_keys": [OTHER_KEY]})
    (risk,) = access_risks(desired, "debian", deploy_key=DEPLOY_KEY, uses_sudo=True)
    assert risk.startswith(
        "admin_users entry debian (the deploy user) does not list the key this deploy logs in "
        "with (SHA256:"
    )
    (risk,) = access_risks(desired, "debian", deploy_key=None, uses_sudo=True)
    assert "cannot prove the next login works" in risk


def test_declared_deploy_user_with_its_key_and_sudo_passes() -> None:
    desired = desired_with({"name": "debian", "ssh_keys": [OTHER_KEY, DEPLOY_KEY + " me@host"]})
    assert access_risks(desired, "debian", deploy_key=DEPLOY_KEY, uses_sudo=True) == []


def test_declared_deploy_user_without_sudo_or_shell_is_refused() -> None:
    desired = desired_with(
        {"name": "debian", "ssh_keys": [DEPLOY_KEY], "sudo": False, "shell": "/usr/sbin/nologin"}
    )
    risks = access_risks(desired, "debian", deploy_key=DEPLOY_KEY, uses_sudo=True)
    assert risks == [
        "admin_users entry debian (the deploy user) has sudo: false, but this deploy uses sudo "
        "as debian",
        "admin_users entry debian (the deploy user) has the shell /usr/sbin/nologin, which "
        "cannot run the deploy's commands",
    ]


def test_deploy_key_is_derived_from_the_private_key(tmp_path: Path) -> None:
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    path = tmp_path / "id_ed25519"
    path.write_bytes(pem)
    path.chmod(0o600)
    assert deploy_public_key({"ssh_key": str(path)}) == public.decode()
    assert deploy_public_key({}) is None
    assert deploy_public_key({"ssh_key": str(tmp_path / "missing")}) is None


@pytest.mark.parametrize("mode", [0o640, 0o644, 0o604], ids=lambda mode: f"{mode:04o}")
def test_a_deploy_key_the_group_or_others_may_read_is_refused(tmp_path: Path, mode: int) -> None:
    private = Ed25519PrivateKey.generate()
    path = tmp_path / "id_ed25519"
    path.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    path.chmod(mode)
    with pytest.raises(NodeRefused) as refused:
        deploy_public_key({"ssh_key": str(path)})
    assert refused.value.reason == (
        f"admin users refused: ssh_key {path} is readable by others (mode {mode:04o}); "
        f"chmod 600 {path}"
    )


# --- admin_account: server.user's commands, from the managed accounts' entries only ------


def _passwd_facts(users: dict[str, dict[str, Any]], groups: set[str], keys: list[str]) -> dict:
    """The facts admin_account and server.user read, from one description of the node."""

    def entries(**kwargs: list[str]) -> dict[str, Any]:
        return {name: users[name] for name in kwargs["users"] if name in users}

    home_dirs = {entry["home"] for entry in users.values()}
    ssh_dirs = {f"{home}/.ssh" for home in home_dirs}

    def directory(path: str) -> Any:
        if path in home_dirs or path in ssh_dirs:
            name = path.split("/")[2]
            return {"user": name, "group": name, "mode": 700 if path in ssh_dirs else 755}
        return None

    def file(path: str) -> Any:
        name = path.split("/")[2]
        if name in users:
            return {"user": name, "group": name, "mode": 600}
        return None

    return {
        PasswdEntries: entries,
        Users: users,
        Groups: groups,
        Os: "Linux",
        Which: lambda command: f"/usr/sbin/{command}",
        Directory: directory,
        Link: lambda path: None,
        File: file,
        # The key files as they are: both operations hand them to user_authorized_keys.
        AuthorizedKeys: lambda user, path: keys,
        Sha1File: lambda path: None,
    }


def _entry(**overrides: Any) -> dict[str, Any]:
    entry = {
        "home": "/home/gpuadmin",
        "comment": None,
        "shell": "/bin/bash",
        "group": "gpuadmin",
        "groups": ["gpunode-admins", "gpunode-login"],
        "uid": 1001,
        "gid": 1001,
    }
    return entry | overrides


GROUPS = ["gpunode-login", "gpunode-admins"]


def _both(facts: dict, keys: list[str], groups: list[str] = GROUPS) -> tuple[list[str], list[str]]:
    """admin_account's commands and those of the server.user call it stands for."""
    # user_authorized_keys reads the state's working directory (for key file paths); pyinfra's
    # context is whatever an earlier test left, so both read this one.
    with ctx_state.use(SimpleNamespace(cwd=None)):
        return _commands_of_both(facts, keys, groups)


def _commands_of_both(
    facts: dict, keys: list[str], groups: list[str]
) -> tuple[list[str], list[str]]:
    ours, _ = commands_of(
        admin_account, facts, user="gpuadmin", shell="/bin/bash", groups=groups, public_keys=keys
    )
    pyinfra_s, _ = commands_of(
        server.user,
        facts,
        user="gpuadmin",
        shell="/bin/bash",
        home="/home/gpuadmin",
        create_home=True,
        groups=groups,
        append=True,
        public_keys=keys,
        delete_keys=True,
    )
    return ours, pyinfra_s


def test_admin_account_converged_is_what_server_user_does_and_changes_nothing() -> None:
    facts = _passwd_facts({"gpuadmin": _entry()}, {"gpuadmin"}, [DEPLOY_KEY])
    ours, pyinfra_s = _both(facts, [DEPLOY_KEY])
    assert ours == pyinfra_s
    assert not any(command.startswith(("useradd", "usermod")) for command in ours)


def test_admin_account_changes_shell_home_and_missing_groups_as_server_user_does() -> None:
    entry = _entry(shell="/bin/sh", home="/srv/gpuadmin", groups=["docker"])
    facts = _passwd_facts({"gpuadmin": entry}, {"gpuadmin", "docker"}, [DEPLOY_KEY])
    ours, pyinfra_s = _both(facts, [DEPLOY_KEY])
    assert ours == pyinfra_s
    assert ours[0] == (
        "usermod -d /home/gpuadmin -s /bin/bash -a -G gpunode-login,gpunode-admins gpuadmin"
    )


def test_admin_account_new_user_is_created_as_server_user_does() -> None:
    for groups in ({"gpunode-login"}, {"gpunode-login", "gpuadmin"}):
        facts = _passwd_facts({}, groups, [DEPLOY_KEY])
        ours, pyinfra_s = _both(facts, [DEPLOY_KEY], groups=["gpunode-login"])
        assert ours == pyinfra_s
        own_group = " -g gpuadmin" if "gpuadmin" in groups else ""
        assert ours[0] == (
            f"useradd -d /home/gpuadmin -s /bin/bash{own_group} -G gpunode-login -m gpuadmin"
        )


def test_passwd_entries_keep_whole_entries_and_secondary_groups_only() -> None:
    lines = [
        "entry gpuadmin:x:1001:1001:GPU admin|ops:/home/gpuadmin:/bin/bash|gpuadmin|"
        "gpuadmin gpunode-admins gpunode-login",
        "entry broken:x:1002",  # not a whole passwd entry
        "entry Bad Name:x:1:1::/:/bin/sh|g|g",  # not a user name
        "noise",
        "entry nogroups:x:abc:1003::/home/nogroups:/bin/sh||",
    ]
    assert parse_passwd_entries(lines) == {
        "gpuadmin": {
            "home": "/home/gpuadmin",
            "comment": "GPU admin|ops",
            "shell": "/bin/bash",
            "group": "gpuadmin",
            "groups": ["gpunode-admins", "gpunode-login"],
            "uid": 1001,
            "gid": 1001,
        },
        "nogroups": {
            "home": "/home/nogroups",
            "comment": None,
            "shell": "/bin/sh",
            "group": None,
            "groups": [],
            "uid": None,
            "gid": 1003,
        },
    }

"""Operator accounts: key-only logins with exclusively managed keys, passwordless sudo, and
access that ends when the account leaves the inventory.

gpunode manages the members of its two groups: gpunode-login, the only group sshd lets in
(``AllowGroups``), and gpunode-admins, which has passwordless sudo. Every declared admin is in
gpunode-login, and in gpunode-admins when it has sudo. A member of either group that the
inventory no longer declares is revoked: the account expires (PAM then refuses every login,
key logins included; a locked password alone does not stop key logins when sshd uses PAM),
its password is locked, its shell becomes nologin, its authorized_keys files are removed (only
where they resolve inside its own home and it owns them: a link into another account's keys
refuses the node) and it leaves both groups (a system account, uid below 1000, keeps its shell
and expiry, which belong to its package). Its home directory and files are kept, and its
running sessions are not ended (a job may be running). Declaring it again gives its access back.

The deploy user (the account pyinfra logs in as) is always in gpunode-login and is never
revoked. If the inventory does not declare it, gpunode changes nothing else about it. If it
does, its declared keys must include the key this deploy logs in with, it must have sudo when
the deploy uses sudo, and a usable shell: otherwise the node is refused before anything
changes. root is in gpunode-login only while ``sshd.permit_root_login`` lets it log in.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import os
import shlex
from collections.abc import Mapping
from typing import Any

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.files import Sha1File
from pyinfra.facts.server import Groups
from pyinfra.operations import files, server

from facts.accounts import (
    ADMIN_GROUP,
    LOGIN_GROUP,
    MANAGED_GROUPS,
    NOLOGIN_SHELL,
    KeyFileTargets,
    LoginAccounts,
    PasswdEntries,
    expired,
)
from gpunode.model import DesiredState
from gpunode.pyinfra_patches import inner
from gpunode.refusal import REFUSED_EXIT, NodeRefused
from gpunode.secret_files import SecretFileError, SecretFileExposed, read_secret_file

SUDOERS_PATH = f"/etc/sudoers.d/{ADMIN_GROUP}"
# Day 1 of 1970: long past, so the account is expired for good (0 is reserved by shadow(5)).
EXPIRED_SINCE_DAY = 1
FIRST_USER_UID = 1000  # Debian's UID_MIN: below it, system accounts
_UNUSABLE_SHELLS = ("nologin", "false")
MAX_PRIVATE_KEY_BYTES = 1 << 16


@operation()
def sudoers_dropin(path: str, content: str):
    """The sudoers drop-in ``path`` holds ``content``; it is checked by visudo before use.

    sudo ignores drop-ins whose names contain a dot, so the candidate is written beside the
    target as ``<path>.new`` and only moved into place once ``visudo -c`` accepts it: a
    broken file never becomes active.

    + path: the drop-in's path under ``/etc/sudoers.d`` (no dot in its name, or sudo ignores it)
    + content: the whole text of the drop-in, written as it is
    """
    wanted_sha1 = hashlib.sha1(content.encode()).hexdigest()
    if host.get_fact(Sha1File, path=path) == wanted_sha1:
        host.noop(f"{path} is up to date")
        return
    candidate = f"{path}.new"
    yield f"printf '%s' {shlex.quote(content)} > {candidate}"
    yield f"visudo -c -q -f {candidate} && chmod 0440 {candidate} && mv {candidate} {path}"


@operation()
def admin_account(user: str, shell: str, groups: list[str], public_keys: list[str]):
    """A declared admin's account: it exists with this shell, its home ``/home/<user>``
    (created from the skeleton) and at least these groups, and exactly these SSH keys.

    What ``server.user(user, shell=, home=, create_home=True, groups=, append=True,
    public_keys=, delete_keys=True)`` does, with the same commands, but reading only this
    account (``PasswdEntries``): pyinfra's ``Users`` fact reads every account on the node,
    and its lastlog, on every deploy.

    + user: the account's name
    + shell: its login shell
    + groups: groups it is at least in (others it is in are kept)
    + public_keys: the only keys in its authorized_keys
    """
    home = f"/home/{user}"
    existing = host.get_fact(PasswdEntries, users=[user]).get(user)
    group_list = ",".join(shlex.quote(group) for group in groups)
    group = None
    if existing is None:
        # As server.user: a group of the account's name that already exists becomes its
        # primary group, rather than useradd failing to create it.
        if user in host.get_fact(Groups):
            group = user
        args = ["-d", shlex.quote(home), "-s", shlex.quote(shell)]
        if group:
            args += ["-g", shlex.quote(group)]
        if groups:
            args += ["-G", group_list]
        yield " ".join(["useradd", *args, "-m", shlex.quote(user)])
    else:
        args = []
        if existing.get("home") != home:
            args += ["-d", shlex.quote(home)]
        if existing.get("shell") != shell:
            args += ["-s", shlex.quote(shell)]
        if groups and not set(groups) <= set(existing.get("groups") or []):
            args += ["-a", "-G", group_list]
        if args:
            yield " ".join(["usermod", *args, shlex.quote(user)])
    # Don't fail if the home directory exists as a link (as server.user).
    yield from inner(files.directory)(
        path=home, user=user, group=group or user, _no_fail_on_link=True
    )
    yield from inner(server.user_authorized_keys)(
        user=user,
        public_keys=public_keys,
        group=group,
        delete_keys=True,
        authorized_key_directory=f"{home}/.ssh",
        authorized_key_filename=None,
    )


def own_key_files(node: str, user: str, targets: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(resolved path, owner uid) of each authorized_keys file of ``user`` to remove.

    A revoked account's ``~/.ssh`` or key file may be a link (its owner made it) into another
    account's keys: removing through it would take that account's access. Only a file that
    resolves inside the account's own home and that the account owns is removed; anything
    else refuses the node (KeyFileTargets: links followed, node text checked).
    """
    what = f"{node}: revoking {user}"
    if targets.get("state") != "ok":
        reason = targets.get("reason") or targets.get("state")
        raise NodeRefused(f"{what}: where its authorized_keys lead cannot be read ({reason})")
    home, uid = str(targets.get("home") or ""), targets.get("uid")
    removals = []
    for name, target in sorted((targets.get("keys") or {}).items()):
        path, owner = target["path"], target["uid"]
        inside = bool(home) and path.startswith(f"{home.rstrip('/')}/")
        if not inside or owner != uid:
            raise NodeRefused(
                f"{what}: ~{user}/{name} leads to {path}, owned by uid {owner}, not a file of "
                f"{user}'s own (uid {uid}) in its home {home or '(none)'}; removing it could "
                f"take another account's keys. Look at ~{user}/.ssh by hand, remove the link, "
                "and run again"
            )
        removals.append((path, owner))
    return removals


def removal_of_own_file(path: str, owner: int) -> str:
    """``rm`` of ``path`` if it is still a file, not a link, owned by ``owner``: the account
    may change its home between the fact and this command."""
    quoted = shlex.quote(path)
    message = shlex.quote(f"{path} changed since it was checked (a link, or not uid {owner}'s)")
    return (
        f'if [ -f {quoted} ] && [ ! -L {quoted} ] && [ "$(realpath -e -- {quoted})" = {quoted} ]'
        f' && [ "$(stat -c %u -- {quoted})" = {owner} ]; then rm -f -- {quoted}; '
        f"elif [ -e {quoted} ] || [ -L {quoted} ]; then echo {message} >&2; exit {REFUSED_EXIT}; fi"
    )


def _members(accounts: Mapping[str, Any], group: str) -> list[str]:
    return list((accounts.get("groups") or {}).get(group) or [])


@operation()
def group_membership(user: str, group: str, member: bool = True):
    """``user`` is (or is not) a member of ``group``.

    + user: the account
    + group: one of gpunode's groups
    + member: whether it belongs
    """
    is_member = user in _members(host.get_fact(LoginAccounts), group)
    if is_member == member:
        host.noop(f"{user} {'is' if member else 'is not'} in {group}")
        return
    yield f"gpasswd {'-a' if member else '-d'} {shlex.quote(user)} {group} >/dev/null"


@operation()
def reinstated_account(user: str):
    """A declared admin's account is not expired (an earlier revocation is undone).

    + user: the declared admin
    """
    accounts = host.get_fact(LoginAccounts)
    account = (accounts.get("accounts") or {}).get(user)
    if account is None or not expired(account, accounts.get("today")):
        host.noop(f"{user} is not expired")
        return
    yield f"usermod --expiredate '' {shlex.quote(user)}"


@operation()
def revoked_account(user: str):
    """``user``, no longer declared, cannot log in or sudo: expired, password locked, shell
    nologin, no authorized_keys, in none of gpunode's groups. Its home directory is kept.

    + user: the account to revoke
    """
    accounts = host.get_fact(LoginAccounts)
    account = (accounts.get("accounts") or {}).get(user)
    name = shlex.quote(user)
    changed = False
    if account is not None:
        # A system account's shell and expiry belong to its package (an expired account runs
        # no cron jobs); it loses its keys and groups, and AllowGroups keeps it out.
        system_account = (account.get("uid") or 0) < FIRST_USER_UID
        if not system_account and (
            not expired(account, accounts.get("today"))
            or account.get("shell") != NOLOGIN_SHELL
            or account.get("password") != "L"
        ):
            yield (
                f"usermod --lock --expiredate {EXPIRED_SINCE_DAY} --shell {NOLOGIN_SHELL} {name}"
            )
            changed = True
        if account.get("keys"):
            targets = host.get_fact(KeyFileTargets, user=user)
            for path, owner in own_key_files(host.name, user, targets):
                yield removal_of_own_file(path, owner)
                changed = True
    for group in MANAGED_GROUPS:
        if user in _members(accounts, group):
            yield f"gpasswd -d {name} {group} >/dev/null"
            changed = True
    if not changed:
        host.noop(f"{user} is revoked")


def deploy_user(data: Any) -> str:
    """The account pyinfra logs in as: ``ssh_user``, else the local user (as SSH does)."""
    return str(data.get("ssh_user") or getpass.getuser())


def deploy_public_key(data: Any) -> str | None:
    """``type base64`` of the key this deploy logs in with; None if it cannot be known. A
    private key the group or others may read is refused, as the CA's is (OpenSSH's ssh
    refuses it too)."""
    path = data.get("ssh_key")
    if not path:
        return None
    path = os.path.expanduser(str(path))
    try:
        read_secret_file(path, "ssh_key", MAX_PRIVATE_KEY_BYTES)
    except SecretFileExposed as error:
        raise NodeRefused(f"admin users refused: {error}") from None
    except SecretFileError:
        pass  # unreadable: its .pub may still say which key it is
    try:
        import paramiko

        key = paramiko.PKey.from_path(path, passphrase=data.get("ssh_key_password"))
        return f"{key.get_name()} {key.get_base64()}"
    except Exception:  # an encrypted key without its passphrase, an odd format: try the .pub
        try:
            with open(f"{path}.pub", encoding="ascii") as public:
                kind, blob = public.read().split()[:2]
            return f"{kind} {blob}"
        except (OSError, ValueError, UnicodeDecodeError):
            return None


def _key_identity(key: str) -> tuple[str, str]:
    kind, _, rest = key.strip().partition(" ")
    return kind, rest.split(" ", 1)[0]


def fingerprint(key: str) -> str:
    _, blob = _key_identity(key)
    try:
        digest = hashlib.sha256(base64.b64decode(blob, validate=True)).digest()
    except ValueError:
        return "an unreadable key"
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def access_risks(
    desired: DesiredState, login_user: str, deploy_key: str | None, uses_sudo: bool
) -> list[str]:
    """Why converging the declared admins would cost the deploy user its key login or sudo."""
    declared = {user.name: user for user in desired.admin_users}
    user = declared.get(login_user)
    if user is None:
        return []  # an undeclared deploy user keeps its keys and sudo; it joins the login group
    risks = []
    entry = f"admin_users entry {login_user} (the deploy user)"
    if deploy_key is None:
        risks.append(
            f"{entry}: its authorized_keys are replaced by the declared keys, and the key this "
            "deploy logs in with cannot be read (set ssh_key to the private key's path), so "
            "gpunode cannot prove the next login works"
        )
    elif _key_identity(deploy_key) not in {_key_identity(key) for key in user.ssh_keys}:
        risks.append(
            f"{entry} does not list the key this deploy logs in with ({fingerprint(deploy_key)});"
            " its authorized_keys are replaced by the declared keys, so the next login would "
            "fail: add that key to its ssh_keys"
        )
    if uses_sudo and not user.sudo:
        risks.append(f"{entry} has sudo: false, but this deploy uses sudo as {login_user}")
    if os.path.basename(user.shell) in _UNUSABLE_SHELLS:
        risks.append(f"{entry} has the shell {user.shell}, which cannot run the deploy's commands")
    return risks


def revocations(desired: DesiredState, accounts: Mapping[str, Any], login_user: str) -> list[str]:
    """Accounts gpunode manages (members of its groups) that the inventory no longer declares."""
    managed = set(_members(accounts, ADMIN_GROUP)) | set(_members(accounts, LOGIN_GROUP))
    keep = {user.name for user in desired.admin_users} | {login_user, "root"}
    return sorted(managed - keep)


@deploy("Admin users")
def admin_users(desired: DesiredState) -> None:
    login_user = deploy_user(host.data)
    risks = access_risks(
        desired,
        login_user=login_user,
        deploy_key=deploy_public_key(host.data),
        uses_sudo=bool(host.data.get("_sudo")),
    )
    if risks:
        raise NodeRefused(f"{host.name}: admin users refused: " + "; ".join(risks))
    for group in MANAGED_GROUPS:
        server.group(name=f"Group {group}", group=group)
    for user in desired.admin_users:
        admin_account(
            name=f"Admin user {user.name}",
            user=user.name,
            shell=user.shell,
            # Other memberships (docker, video, ...) belong to the node, not to gpunode.
            groups=[LOGIN_GROUP, ADMIN_GROUP] if user.sudo else [LOGIN_GROUP],
            public_keys=list(user.ssh_keys),
        )
        reinstated_account(name=f"Admin user {user.name} not expired", user=user.name)
        if not user.sudo:
            group_membership(
                name=f"Revoke sudo from {user.name}",
                user=user.name,
                group=ADMIN_GROUP,
                member=False,
            )
    group_membership(
        name=f"Deploy user {login_user} may log in ({LOGIN_GROUP})",
        user=login_user,
        group=LOGIN_GROUP,
    )
    if login_user != "root":
        group_membership(
            name=f"root {'may' if desired.sshd.permit_root_login != 'no' else 'may not'} log in",
            user="root",
            group=LOGIN_GROUP,
            member=desired.sshd.permit_root_login != "no",
        )
    accounts = host.get_fact(LoginAccounts)
    for name in revocations(desired, accounts, login_user):
        revoked_account(name=f"Revoke {name} (no longer declared)", user=name)
    sudoers_dropin(
        name="Passwordless sudo for the admin group (admins have keys, no passwords)",
        path=SUDOERS_PATH,
        content=f"# Managed by gpunode\n%{ADMIN_GROUP} ALL=(ALL:ALL) NOPASSWD: ALL\n",
    )

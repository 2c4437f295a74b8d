"""Operator accounts: key-only logins with exclusively managed keys, passwordless sudo."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.files import Sha1File
from pyinfra.facts.server import Users
from pyinfra.operations import server

from gpunode.model import DesiredState

ADMIN_GROUP = "gpunode-admins"
SUDOERS_PATH = f"/etc/sudoers.d/{ADMIN_GROUP}"


@operation()
def sudoers_dropin(path: str, content: str):
    """The sudoers drop-in ``path`` holds ``content``; it is checked by visudo before use.

    sudo ignores drop-ins whose names contain a dot, so the candidate is written beside the
    target as ``<path>.new`` and only moved into place once ``visudo -c`` accepts it: a
    broken file never becomes active.
    """
    import hashlib

    wanted_sha1 = hashlib.sha1(content.encode()).hexdigest()
    if host.get_fact(Sha1File, path=path) == wanted_sha1:
        host.noop(f"{path} is up to date")
        return
    candidate = f"{path}.new"
    yield f"printf '%s' {_shell_quote(content)} > {candidate}"
    yield f"visudo -c -q -f {candidate} && chmod 0440 {candidate} && mv {candidate} {path}"


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


@deploy("Admin users")
def admin_users(desired: DesiredState) -> None:
    server.group(name=f"Group {ADMIN_GROUP}", group=ADMIN_GROUP)
    for user in desired.admin_users:
        groups = [ADMIN_GROUP] if user.sudo else []
        server.user(
            name=f"Admin user {user.name}",
            user=user.name,
            shell=user.shell,
            home=f"/home/{user.name}",
            create_home=True,
            groups=groups,
            # Other memberships (docker, video, ...) belong to the node, not to gpunode.
            append=True,
            public_keys=list(user.ssh_keys),
            delete_keys=True,
        )
    current_users = host.get_fact(Users)
    for user in desired.admin_users:
        if not user.sudo and ADMIN_GROUP in current_users.get(user.name, {}).get("groups", []):
            server.shell(
                name=f"Revoke sudo from {user.name}",
                commands=[f"gpasswd -d {user.name} {ADMIN_GROUP}"],
            )
    sudoers_dropin(
        name="Passwordless sudo for the admin group (admins have keys, no passwords)",
        path=SUDOERS_PATH,
        content=f"# Managed by gpunode\n%{ADMIN_GROUP} ALL=(ALL:ALL) NOPASSWD: ALL\n",
    )

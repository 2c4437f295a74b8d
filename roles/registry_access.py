"""Container registry credentials (``container_runtime.registry_logins``): NGC's ``nvcr.io``
with an API key, or any registry with a user name and password.

Each password is read on the control machine from its ``password_file``: refused when the
group or others may read it (``gpunode.secret_files``), or when it is empty, longer than
``MAX_PASSWORD_BYTES`` or holds anything but printable ASCII without spaces; an error names the
file, never its content. What results is ``/root/.docker/config.json`` (root's Docker client,
managed whole: a registry logged in to by hand and not declared is dropped), 0600 root:root in
a 0700 directory. It is compared by SHA-256, never shown: no diff, no command line and no log
carries it. It travels over SFTP into a directory only the login user and root may open, then
is moved into place by root (as the MUNGE key is, roles/slurm.py).

With no logins declared, a file gpunode wrote is left as found: removing root's Docker
credentials is the operator's call.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from io import BytesIO

from pyinfra import host
from pyinfra.api import OperationError, deploy, operation
from pyinfra.api.command import FileUploadCommand
from pyinfra.facts.files import File, Sha256File

from gpunode.expected.registry_access import (
    CONFIG_MODE,
    DOCKER_CLIENT_CONFIG,
    DOCKER_CLIENT_DIRECTORY,
    MAX_PASSWORD_BYTES,
    render_docker_config,
)
from gpunode.model import USER_NAME, DesiredState, RegistryLogin
from gpunode.secret_files import SecretFileError, read_secret_file

# Where the file waits between the login user's SFTP upload and root's move: tmpfs, a
# directory only the login user (and root) may open, removed once the file is in place.
STAGING_DIR = "/run/gpunode-registry"
_PASSWORD = re.compile(rb"[!-~]+")


def read_password(login: RegistryLogin, index: int) -> str:
    """The password of ``login`` from its file, one trailing newline dropped; an error names
    the setting and the file, never the content."""
    setting = f"container_runtime.registry_logins[{index}].password_file"
    try:
        raw = read_secret_file(login.password_file, setting, MAX_PASSWORD_BYTES)
    except SecretFileError as error:
        raise OperationError(str(error)) from None
    secret = raw[:-1] if raw.endswith(b"\n") else raw
    if not secret or len(secret) > MAX_PASSWORD_BYTES or not _PASSWORD.fullmatch(secret):
        raise OperationError(
            f"{setting} {login.password_file}: not one line of printable ASCII without spaces "
            f"(1 to {MAX_PASSWORD_BYTES} bytes, one trailing newline allowed)"
        )
    return secret.decode("ascii")


@operation()
def docker_client_credentials(logins: tuple[RegistryLogin, ...], login_user: str = "root"):
    """
    /root/.docker/config.json holds exactly the declared logins, 0600 root:root.

    + logins: the declared registry logins (passwords read from their files here)
    + login_user: the SSH user pyinfra uploads as (it alone may open the staging directory)
    """
    content = render_docker_config(
        [(login, read_password(login, index)) for index, login in enumerate(logins)]
    )
    wanted = hashlib.sha256(content).hexdigest()
    current = host.get_fact(Sha256File, path=DOCKER_CLIENT_CONFIG)
    info = host.get_fact(File, path=DOCKER_CLIENT_CONFIG)
    owned = False
    if info:
        owned = (info["mode"], info["user"], info["group"]) == (int(CONFIG_MODE), "root", "root")
    if current == wanted and owned:
        registries = ", ".join(login.registry for login in logins)
        host.noop(f"{DOCKER_CLIENT_CONFIG} holds the logins for {registries}, 0{CONFIG_MODE}")
        return
    if not re.fullmatch(USER_NAME, login_user):
        raise OperationError(f"login user {login_user!r} is not a user name")
    new = f"{DOCKER_CLIENT_CONFIG}.gpunode-new"
    yield (
        f"rm -rf {STAGING_DIR} && install -d -m 0700 -o {shlex.quote(login_user)} {STAGING_DIR}"
        f" && install -d -m 0700 -o root -g root {DOCKER_CLIENT_DIRECTORY}"
    )
    yield FileUploadCommand(BytesIO(content), new, remote_temp_filename=f"{STAGING_DIR}/config")
    yield (
        f"chown root:root {new} && chmod 0{CONFIG_MODE} {new} && mv -f {new} "
        f"{DOCKER_CLIENT_CONFIG} && rm -rf {STAGING_DIR}"
    )


def _login_user() -> str:
    user = host.data.get("ssh_user")
    return str(user) if user else "root"


@deploy("Container registry access")
def registry_access(desired: DesiredState) -> None:
    logins = desired.container_runtime.registry_logins
    if not logins:
        return
    docker_client_credentials(
        name=f"{DOCKER_CLIENT_CONFIG}: logins for " + ", ".join(login.registry for login in logins),
        logins=logins,
        login_user=_login_user(),
    )

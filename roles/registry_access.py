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

Registry mirrors (``container_runtime.registry_mirrors``) become containerd's
``/etc/containerd/certs.d/<registry>/hosts.toml`` (``gpunode.expected.registry_access``);
containerd reads them without a restart, but only where its config.toml names that directory
in the registry ``config_path``. gpunode does not edit config.toml (nvidia-ctk writes it): a
node whose config.toml does not name the directory is told so in the run, and the drift check
reports it. A hosts.toml gpunode wrote for a registry no longer declared is removed.
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
from pyinfra.operations import files

from facts.container_runtime import ContainerRuntimeConfig
from facts.registry_access import ManagedRegistryMirrors
from gpunode.expected.registry_access import (
    CONFIG_MODE,
    CONTAINERD_IMAGES_PLUGINS,
    DOCKER_CLIENT_CONFIG,
    DOCKER_CLIENT_DIRECTORY,
    HOSTS_DIRECTORY,
    MAX_PASSWORD_BYTES,
    hosts_toml_path,
    reads_hosts_directory,
    render_docker_config,
    render_hosts_toml,
)
from gpunode.model import USER_NAME, DesiredState, RegistryLogin, RegistryMirror
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


@operation()
def undeclared_mirrors_removed(declared: list[str]):
    """hosts.toml files gpunode wrote for registries no longer declared are removed.

    + declared: the registries with mirrors declared now
    """
    stale = [registry for registry in host.get_fact(ManagedRegistryMirrors)
             if registry not in declared]  # fmt: skip
    if not stale:
        host.noop("no registry mirror left from an earlier declaration")
        return
    for registry in stale:
        path = hosts_toml_path(registry)
        directory = shlex.quote(path.rsplit("/", 1)[0])
        yield f"rm -f {shlex.quote(path)} && (rmdir {directory} 2>/dev/null || true)"


@operation()
def containerd_reads_mirrors():
    """Says whether containerd's config.toml names the hosts directory (it changes nothing:
    nvidia-ctk owns config.toml)."""
    yield from ()  # a note, never a command
    state = host.get_fact(ContainerRuntimeConfig)["containerd"]
    if reads_hosts_directory(state.get("registry_config_path")):
        host.noop(f"containerd reads {HOSTS_DIRECTORY} (registry config_path)")
        return
    tables = " or ".join(
        f'[plugins."{plugin}".registry] (version {version})'
        for version, plugin in CONTAINERD_IMAGES_PLUGINS.items()
    )
    host.noop(
        f'containerd does not read {HOSTS_DIRECTORY} yet: add config_path = "{HOSTS_DIRECTORY}" '
        f"under {tables} in /etc/containerd/config.toml and restart containerd"
    )


def _registry_mirrors(mirrors: tuple[RegistryMirror, ...]) -> None:
    for mirror in mirrors:
        path = hosts_toml_path(mirror.registry)
        files.directory(
            name=f"{path.rsplit('/', 1)[0]}: {mirror.registry}'s hosts directory",
            path=path.rsplit("/", 1)[0], mode="755", user="root", group="root",
        )  # fmt: skip
        files.put(
            name=f"{path}: {mirror.registry} through " + ", ".join(mirror.mirrors),
            src=BytesIO(render_hosts_toml(mirror).encode()), dest=path, mode="644",
            user="root", group="root",
        )  # fmt: skip
    if mirrors:
        containerd_reads_mirrors(name="containerd reads the registry mirrors")


@deploy("Container registry access")
def registry_access(desired: DesiredState) -> None:
    runtime = desired.container_runtime
    undeclared_mirrors_removed(
        name="Registry mirrors no longer declared removed",
        declared=[mirror.registry for mirror in runtime.registry_mirrors],
    )
    _registry_mirrors(runtime.registry_mirrors)
    logins = runtime.registry_logins
    if not logins:
        return
    docker_client_credentials(
        name=f"{DOCKER_CLIENT_CONFIG}: logins for " + ", ".join(login.registry for login in logins),
        logins=logins,
        login_user=_login_user(),
    )

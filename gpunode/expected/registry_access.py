"""What ``container_runtime.registry_logins`` means on a node: root's Docker client
configuration with one ``auths`` entry per registry, and how the drift check reads it back
without its secrets.

Docker's client keeps the credentials ``docker login`` stores in ``$HOME/.docker/config.json``
(``/root/.docker/config.json`` for root: the ``docker login`` reference,
https://docs.docker.com/engine/reference/commandline/login/ as copied at
https://www.w3cschool.cn/doc_docker_1_11/docker_1_11-engine-reference-commandline-login-index.html,
read 2026-12-07), each entry's ``auth`` "a base64 encoded string from the concatenation of the
username, a colon, and the password" (containers-auth.json(5), the same format,
https://man.cx/containers-auth.json(5), read 2026-12-07). nerdctl reads the same file for
containerd; kubelet pulls with its own image pull secrets.

Registry mirrors are containerd's ``hosts.toml``, one per registry in
``/etc/containerd/certs.d/<registry>/`` (containerd's docs/hosts.md,
https://github.com/containerd/containerd/blob/main/docs/hosts.md, read 2026-12-07): each
``[host."<mirror>"]`` is tried in order, then ``server`` ("If all host(s) are tried then
server will be used as a fallback"); "to ensure *only* the mirror is utilised and the upstream
not consulted, set the mirror as the ``server``"; a public mirror gets ``pull`` alone ("A
public mirror should never be trusted to do a resolve action"); Docker Hub's server is
``https://registry-1.docker.io``. containerd reads the directory only where config.toml's
registry ``config_path`` names it, and "updates under this directory do not require
restarting the containerd daemon".

Used by ``roles.registry_access`` (which writes the file), ``facts.registry_access`` (what
it reads) and the drift rules.
"""

from __future__ import annotations

import base64
import json

from gpunode.model import RegistryLogin, RegistryMirror

DOCKER_CLIENT_DIRECTORY = "/root/.docker"
DOCKER_CLIENT_CONFIG = f"{DOCKER_CLIENT_DIRECTORY}/config.json"
CONFIG_MODE = "600"
# The largest password or API key accepted from a key file (NGC keys are far shorter).
MAX_PASSWORD_BYTES = 4096


def render_docker_config(logins: list[tuple[RegistryLogin, str]]) -> bytes:
    """config.json for ``(login, password)`` pairs: tab-indented as ``docker login`` writes
    it, so that each registry is a line ``"<registry>": {`` the fact can read alone."""
    auths = {
        login.registry: {
            "auth": base64.b64encode(f"{login.username}:{password}".encode()).decode("ascii")
        }
        for login, password in logins
    }
    return (json.dumps({"auths": auths}, indent="\t", sort_keys=True) + "\n").encode()


HOSTS_DIRECTORY = "/etc/containerd/certs.d"
HOSTS_MARKER = "# Managed by gpunode (container_runtime.registry_mirrors)"
# Where a registry's own API answers, where that is not the name images give it.
REGISTRY_SERVERS = {"docker.io": "https://registry-1.docker.io"}
# The CRI plugin table that holds ``registry.config_path``, by containerd config version.
CONTAINERD_IMAGES_PLUGINS = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.images"}


def hosts_toml_path(registry: str) -> str:
    return f"{HOSTS_DIRECTORY}/{registry}/hosts.toml"


def render_hosts_toml(mirror: RegistryMirror) -> str:
    """hosts.toml for one registry: the mirrors in order, then the registry itself (or, with
    ``upstream: false``, the last mirror as the server: the registry is never asked)."""
    for text in (mirror.registry, *mirror.mirrors):
        # Validated to URL and host-name characters: no quote, backslash or newline TOML
        # would read otherwise.
        if not text.isprintable() or any(char in text for char in '"\\ '):
            raise ValueError(f"refusing to render {text!r} into hosts.toml")
    capabilities = '["pull", "resolve"]' if mirror.resolve else '["pull"]'
    hosts = list(mirror.mirrors)
    if mirror.upstream:
        server = REGISTRY_SERVERS.get(mirror.registry, f"https://{mirror.registry}")
    else:
        server = hosts.pop()
    lines = [HOSTS_MARKER, f'server = "{server}"', ""]
    for host in hosts:
        lines += [f'[host."{host}"]', f"  capabilities = {capabilities}", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def reads_hosts_directory(config_path: str | None) -> bool:
    """Whether containerd's registry ``config_path`` (':'-separated) names the directory."""
    return HOSTS_DIRECTORY in (config_path or "").split(":")

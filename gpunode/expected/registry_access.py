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

Used by ``roles.registry_access`` (which writes the file), ``facts.registry_access`` (what
it reads) and the drift rules.
"""

from __future__ import annotations

import base64
import json

from gpunode.model import RegistryLogin

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

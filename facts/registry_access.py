"""Root's Docker client configuration as far as the drift check may know it: whether it
exists, its mode, and the registries it holds credentials for. Nothing else of the file
leaves the node: the command prints only its mode and the lines that open a registry's entry
(``"nvcr.io": {``), never an ``auth`` value."""

from __future__ import annotations

import re
import shlex
from typing import Any

from pyinfra.api import FactBase

from gpunode.expected.registry_access import DOCKER_CLIENT_CONFIG, HOSTS_DIRECTORY, HOSTS_MARKER
from gpunode.model import REGISTRY_HOST

_MODE = re.compile(r"mode ([0-7]{3,4})")
# A registry's entry as docker login and gpunode write it; nothing after the brace.
_ENTRY = re.compile(r'\s*"([^"]{1,260})": \{\s*')
# Keys of config.json that open an object but name no registry.
NOT_REGISTRIES = frozenset({"auths", "HttpHeaders", "credHelpers", "proxies", "plugins"})


def parse_registry_access(lines: list[str]) -> dict[str, Any]:
    """The command's lines -> {"state", "reason", "present", "mode", "registries"}; a line
    of another shape is ignored (it is never echoed: it could carry a secret)."""
    present = False
    mode = None
    registries: list[str] = []
    for line in lines:
        if line == "absent":
            return {"state": "ok", "reason": "", "present": False, "mode": None,
                    "registries": []}  # fmt: skip
        found_mode = _MODE.fullmatch(line.strip())
        if found_mode and mode is None:
            present, mode = True, found_mode[1].lstrip("0").rjust(3, "0")
            continue
        entry = _ENTRY.fullmatch(line)
        if entry and entry[1] not in NOT_REGISTRIES and re.fullmatch(REGISTRY_HOST, entry[1]):
            registries.append(entry[1])
    return {"state": "ok", "reason": "", "present": present, "mode": mode,
            "registries": sorted(set(registries))}  # fmt: skip


class RegistryAccess(FactBase[dict[str, Any]]):
    """
    Root's Docker client configuration: present, its mode, the registries it has logins for.

    .. code:: python

        {"state": "ok", "reason": "", "present": True, "mode": "600", "registries": ["nvcr.io"]}
    """

    def command(self) -> str:
        path = DOCKER_CLIENT_CONFIG
        # grep -E: only lines that open an object (a registry's entry), never an "auth" line.
        return (
            f"if [ -f {path} ]; then stat -c 'mode %a' {path}; "
            f'grep -E \'^[[:space:]]*"[^"]+": [{{]$\' {path}; else echo absent; fi; true'
        )

    def process(self, output: list[str]) -> dict[str, Any]:  # type: ignore[override]
        return parse_registry_access(list(output))

    @staticmethod
    def default() -> dict[str, Any]:
        return {"state": "ok", "reason": "", "present": False, "mode": None, "registries": []}


def parse_managed_hosts_files(lines: list[str]) -> list[str]:
    """The registries whose hosts.toml gpunode wrote (``grep -l`` output, one path a line)."""
    registries = []
    for line in lines:
        directory, _, name = line.strip().rpartition("/")
        parent, _, registry = directory.rpartition("/")
        if (
            name == "hosts.toml"
            and parent == HOSTS_DIRECTORY
            and re.fullmatch(REGISTRY_HOST, registry)
        ):
            registries.append(registry)
    return sorted(set(registries))


class ManagedRegistryMirrors(FactBase[list[str]]):
    """
    The registries under /etc/containerd/certs.d whose hosts.toml starts with gpunode's
    marker.

    .. code:: python

        ["docker.io", "nvcr.io"]
    """

    def command(self) -> str:
        marker = shlex.quote(f"^{HOSTS_MARKER}")
        return f"grep -l -- {marker} {HOSTS_DIRECTORY}/*/hosts.toml 2>/dev/null; true"

    def process(self, output: list[str]) -> list[str]:  # type: ignore[override]
        return parse_managed_hosts_files(list(output))

    @staticmethod
    def default() -> list[str]:
        return []

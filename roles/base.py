"""Base system: Debian package sources from data and the packages every node gets."""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import FindInFile
from pyinfra.operations import apt, files, server

from gpunode.model import DesiredState, Repositories

SOURCES_PATH = "/etc/apt/sources.list.d/debian.sources"
LEGACY_SOURCES_PATH = "/etc/apt/sources.list"
PROXY_PATH = "/etc/apt/apt.conf.d/80gpunode-proxy"


def render_debian_sources(repos: Repositories) -> str:
    """deb822 sources for bookworm, its updates and its security archive."""
    components = " ".join(repos.debian_components)
    keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    return (
        "# Managed by gpunode (apt.debian_mirror); local edits are replaced.\n"
        f"Types: deb\nURIs: {repos.debian_mirror}\nSuites: bookworm bookworm-updates\n"
        f"Components: {components}\nSigned-By: {keyring}\n\n"
        f"Types: deb\nURIs: {repos.debian_security_mirror}\nSuites: bookworm-security\n"
        f"Components: {components}\nSigned-By: {keyring}\n"
    )


@deploy("Base system")
def base_system(desired: DesiredState) -> None:
    repos = desired.apt
    sources = files.put(
        name="Debian package sources from data",
        src=StringIO(render_debian_sources(repos)),
        dest=SOURCES_PATH,
        mode="644",
    )
    # A one-line sources.list from the installer would duplicate every entry; it is moved
    # aside (kept, not deleted) so the operator can still see what it said.
    legacy_entries = host.get_fact(FindInFile, path=LEGACY_SOURCES_PATH, pattern=r"^\s*deb")
    if legacy_entries:
        server.shell(
            name="Move the installer's sources.list aside",
            commands=[f"mv {LEGACY_SOURCES_PATH} {LEGACY_SOURCES_PATH}.disabled-by-gpunode"],
        )
    if repos.proxy:
        proxy = files.put(
            name="apt proxy",
            src=StringIO(f'Acquire::http::Proxy "{repos.proxy}";\n'),
            dest=PROXY_PATH,
            mode="644",
        )
    else:
        proxy = files.file(name="No apt proxy", path=PROXY_PATH, present=False)
    apt.update(
        name="Refresh package lists after a source change",
        _if=lambda: sources.did_change() or proxy.did_change() or bool(legacy_entries),
    )
    apt.update(name="Package lists at most a day old", cache_time=86400)
    apt.packages(name="Base packages", packages=list(desired.base_packages))

"""Base system: the node's archive as apt sources from data (Debian's or Ubuntu's, the suites of
the node's own release, from its /etc/os-release, in the release's own format) and the
packages every node gets."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.facts.files import File, FindInFile, Sha1File
from pyinfra.facts.server import Date
from pyinfra.operations import apt, files, server

from facts.apt import AptIndexedRepositories, DpkgInterrupted, MirrorReachability
from facts.container_runtime import normalise_url
from gpunode.converge import this_node
from gpunode.distributions import SITE_DEBIAN_KEYRING, Distribution
from gpunode.expected.lynis import NEEDRESTART_CONF, render_needrestart_conf
from gpunode.model import DesiredState, Repositories
from gpunode.refusal import NodeRefused, refusal
from gpunode.schema import one_line

LEGACY_SOURCES_PATH = "/etc/apt/sources.list"
PROXY_PATH = "/etc/apt/apt.conf.d/80gpunode-proxy"
LOCK_TIMEOUT_PATH = "/etc/apt/apt.conf.d/80gpunode-lock-timeout"
# apt waits this long for another apt or dpkg (unattended-upgrades, a run that was cut off
# and whose apt still finishes on the node) instead of failing at once.
LOCK_TIMEOUT = 'DPkg::Lock::Timeout "300";\n'
DPKG_LOCK_WAIT_S = 300
# Finishes what dpkg was doing; local configuration files are kept, never replaced. dpkg has
# no lock timeout of its own (DPkg::Lock::Timeout is apt's): while another apt or dpkg holds
# the lock (the apt of a run cut off a moment ago still finishing on the node, whose
# journal the fact saw), it waits as apt would, then finishes whatever is left. Any other
# failure of dpkg, or a lock still held after the wait, fails the operation with dpkg's words.
DPKG_RECOVER = (
    "export LC_ALL=C DEBIAN_FRONTEND=noninteractive; waited=0; "
    "until out=$(dpkg --configure -a --force-confdef --force-confold 2>&1); do "
    'case "$out" in *"locked by another process"*) ;; *) printf "%s\\n" "$out" >&2; exit 1;; esac; '
    f'if [ "$waited" -ge {DPKG_LOCK_WAIT_S} ]; then '
    'printf "%s\\n" "$out" >&2; exit 1; fi; '
    "sleep 1; waited=$((waited + 1)); done; "
    'printf "%s\\n" "$out"; '
    f"apt-get -y -o DPkg::Lock::Timeout={DPKG_LOCK_WAIT_S} -f install"
)
# Written by apt's periodic job and by pyinfra's apt.update.
NEEDRESTART_BINARY = "/usr/sbin/needrestart"
UPDATE_STAMP_PATH = "/var/lib/apt/periodic/update-success-stamp"
LISTS_MAX_AGE_S = 86400


def archive_of(repos: Repositories, distribution: Distribution) -> tuple[str, str, str, str]:
    """(mirror, security mirror, components, the inventory key they come from) of the node's
    archive: apt.debian_* on Debian, apt.ubuntu_* on Ubuntu."""
    if distribution.is_ubuntu:
        return (
            repos.ubuntu_mirror, repos.ubuntu_security_mirror,
            " ".join(repos.ubuntu_components), "apt.ubuntu_mirror",
        )  # fmt: skip
    return (
        repos.debian_mirror, repos.debian_security_mirror,
        " ".join(repos.debian_components), "apt.debian_mirror",
    )  # fmt: skip


def render_archive_sources(repos: Repositories, distribution: Distribution) -> str:
    """The node's archive (release, updates, security) as apt sources, in the format its
    release uses (``distribution.apt_sources_format``), for ``apt_sources_path``."""
    if not distribution.is_ubuntu:
        return render_debian_sources(repos, distribution)
    mirror, security_mirror, components, key = archive_of(repos, distribution)
    keyring = distribution.archive_keyring
    header = f"# Managed by gpunode ({key}); local edits are replaced.\n"
    if distribution.apt_sources_format == "one-line":
        lines = [
            f"deb [signed-by={keyring}] {one_line(uri)} {suite} {components}"
            for uri, suites in (
                (mirror, distribution.suites), (security_mirror, distribution.security_suites),
            )
            for suite in suites
        ]  # fmt: skip
        return header + "\n".join(lines) + "\n"
    return header + "\n".join(
        f"Types: deb\nURIs: {one_line(uri)}\nSuites: {' '.join(suites)}\n"
        f"Components: {components}\nSigned-By: {keyring}\n"
        for uri, suites in (
            (mirror, distribution.suites), (security_mirror, distribution.security_suites),
        )
    )  # fmt: skip


def render_debian_sources(repos: Repositories, distribution: Distribution) -> str:
    """deb822 sources for the node's release, its updates and its security archive, signed by
    Debian's keyring or, where data gives one, the site mirror's (apt.debian_keyring)."""
    components = " ".join(repos.debian_components)
    keyring = SITE_DEBIAN_KEYRING if repos.debian_keyring else distribution.archive_keyring
    suites = " ".join(distribution.suites)
    security = " ".join(distribution.security_suites)
    return (
        "# Managed by gpunode (apt.debian_mirror); local edits are replaced.\n"
        f"Types: deb\nURIs: {one_line(repos.debian_mirror)}\nSuites: {suites}\n"
        f"Components: {components}\nSigned-By: {keyring}\n\n"
        f"Types: deb\nURIs: {one_line(repos.debian_security_mirror)}\nSuites: {security}\n"
        f"Components: {components}\nSigned-By: {keyring}\n"
    )


def render_proxy(proxy: str, direct_hosts: tuple[str, ...] = ()) -> str:
    # apt.conf has no escape: only validation (no quote, ';' or brace in a URL) keeps a
    # value from ending its string; the line itself is asserted here.
    lines = [one_line(f'Acquire::http::Proxy "{proxy}";')]
    lines += [one_line(f'Acquire::http::Proxy::{name} "DIRECT";') for name in direct_hosts]
    return "\n".join(lines) + "\n"


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def lists_due(max_age_s: int = LISTS_MAX_AGE_S) -> bool:
    """Whether apt's package lists are older than ``max_age_s`` (as pyinfra's apt.update
    judges it, so that this agrees with the update it guards)."""
    stamp = host.get_fact(File, path=UPDATE_STAMP_PATH)
    updated: datetime | None = stamp.get("mtime") if stamp else None
    if updated is None:
        return True
    now = datetime.fromtimestamp(host.get_fact(Date).timestamp(), UTC).replace(tzinfo=None)
    return updated <= now - timedelta(seconds=max_age_s)


def mirror_problems(found: dict[str, str | None], urls: list[str], node: str) -> list[str]:
    return [
        f"{node}: package mirror {url} is unreachable from the node: "
        f"{found.get(url, 'no answer') if url in found else 'not checked (no answer)'}"
        for url in urls
        if url not in found or found[url] is not None
    ]


@operation()
def package_mirrors_reachable(
    urls: list[str], proxy: str | None = None, direct_hosts: list[str] | None = None
):
    """Every mirror the coming apt update reads answers from the node, through ``proxy``
    (but for ``direct_hosts``); otherwise the host fails here, before its sources, lists or
    packages are touched.

    + urls: the files the update fetches first (each mirror's ``InRelease``), asked for from
      the node
    + proxy: the HTTP proxy apt uses (``apt.proxy``); None to ask the mirrors directly
    + direct_hosts: hosts apt reaches without the proxy (``apt.direct_hosts``)
    """
    found = host.get_fact(
        MirrorReachability, urls=urls, proxy=proxy, direct_hosts=direct_hosts or []
    )
    problems = mirror_problems(found, urls, host.name)
    if problems:
        yield refusal(
            "\n".join(problems)
            + "\nNothing was changed: package sources, lists and packages are as they were."
        )
    else:
        host.noop(f"{len(urls)} package mirror(s) answer")


def debian_release_files(repos: Repositories, distribution: Distribution) -> list[str]:
    """The first file the coming update reads from each of the node's archives (Debian's or
    Ubuntu's, by the node's release)."""
    mirror, security_mirror, _, _ = archive_of(repos, distribution)
    return [
        f"{mirror.rstrip('/')}/dists/{distribution.release_suite}/InRelease",
        f"{security_mirror.rstrip('/')}/dists/{distribution.security_suites[0]}/InRelease",
    ]


def finish_interrupted_package_change() -> None:
    """What dpkg left unfinished (a run or a node cut off in the middle of an install) is
    finished first: apt refuses every install until it is."""
    unfinished = host.get_fact(DpkgInterrupted)
    if unfinished:
        server.shell(
            name=f"Finish the interrupted package change ({unfinished[0]})",
            commands=[DPKG_RECOVER],
        )


def site_debian_keyring(repos: Repositories, distribution: Distribution) -> OperationMeta:
    """apt.debian_keyring on a Debian node, before the sources that name it; none where data
    gives none (or on Ubuntu, whose archive it does not sign), so that no key trusted for a
    mirror that was declared away stays trusted."""
    if repos.debian_keyring and not distribution.is_ubuntu:
        path = Path(repos.debian_keyring).expanduser()
        if not path.is_file():
            raise NodeRefused(
                f"{host.name}: apt.debian_keyring = {repos.debian_keyring!r}: no such file"
            )
        return files.put(
            name="Debian mirror signing keyring (apt.debian_keyring)",
            src=str(path),
            dest=SITE_DEBIAN_KEYRING,
            mode="644",
        )
    return files.file(
        name="No Debian mirror keyring of data's", path=SITE_DEBIAN_KEYRING, present=False
    )


@deploy("Package database")
def package_database() -> None:
    """For a deploy without the base system (deploys/nvidia.py): dpkg's unfinished work
    finished before its roles install anything."""
    finish_interrupted_package_change()


@deploy("Base system")
def base_system(desired: DesiredState) -> None:
    repos = desired.apt
    distribution, _ = this_node()
    sources_path = distribution.apt_sources_path
    sources_text = render_archive_sources(repos, distribution)
    proxy_text = render_proxy(repos.proxy, repos.direct_hosts) if repos.proxy else None
    proxy_changes = (
        host.get_fact(Sha1File, path=PROXY_PATH) != sha1(proxy_text)
        if proxy_text
        else bool(host.get_fact(File, path=PROXY_PATH))
    )
    if (
        host.get_fact(Sha1File, path=sources_path) != sha1(sources_text)
        or proxy_changes
        or lists_due()
    ):
        package_mirrors_reachable(
            name="Package mirrors answer",
            urls=debian_release_files(repos, distribution),
            proxy=repos.proxy,
            direct_hosts=list(repos.direct_hosts),
        )
    finish_interrupted_package_change()
    # needrestart (on every Ubuntu server) hooks apt: in its default interactive mode, under
    # apt's non-interactive front end, it restarts the services an upgrade touched, mid-run
    # (sshd, nvidia-persistenced, slurmd). Set to list only before any package changes.
    if host.get_fact(File, path=NEEDRESTART_BINARY):
        files.put(
            name="needrestart lists, never restarts",
            src=StringIO(render_needrestart_conf()),
            dest=NEEDRESTART_CONF,
            mode="644",
        )
    files.put(
        name="apt waits for a busy package database",
        src=StringIO(LOCK_TIMEOUT),
        dest=LOCK_TIMEOUT_PATH,
        mode="644",
    )
    keyring = site_debian_keyring(repos, distribution)
    sources = files.put(
        name=f"{distribution.pretty_name.split()[0]} package sources from data",
        src=StringIO(sources_text),
        dest=sources_path,
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
    if proxy_text:
        proxy = files.put(
            name="apt proxy",
            src=StringIO(proxy_text),
            dest=PROXY_PATH,
            mode="644",
        )
    else:
        proxy = files.file(name="No apt proxy", path=PROXY_PATH, present=False)
    # Also when apt has no lists for the declared mirror: a run cut off between writing the
    # sources and the update leaves them "unchanged" for the next run.
    mirror, _, _, _ = archive_of(repos, distribution)
    unindexed = normalise_url(mirror) not in host.get_fact(AptIndexedRepositories)
    apt.update(
        name="Refresh package lists after a source change",
        _if=lambda: (
            sources.did_change()
            or keyring.did_change()
            or proxy.did_change()
            or bool(legacy_entries)
            or unindexed
        ),
    )
    apt.update(name="Package lists at most a day old", cache_time=86400)
    apt.packages(name="Base packages", packages=list(desired.base_packages))

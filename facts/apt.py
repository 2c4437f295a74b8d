"""Whether the node can reach its package mirrors, asked the way apt itself fetches."""

from __future__ import annotations

import re
import shlex

from pyinfra.api import FactBase

# apt-helper ships with apt; it uses apt's own transports, proxy and TLS settings.
APT_HELPER = "/usr/lib/apt/apt-helper"


def parse_reachability(lines: list[str]) -> dict[str, str | None]:
    """``url<TAB>ok`` / ``url<TAB>fail<TAB>reason`` lines -> {url: None or reason}."""
    result: dict[str, str | None] = {}
    for line in lines:
        url, _, rest = line.partition("\t")
        status, _, reason = rest.partition("\t")
        if status in ("ok", "fail"):
            result[url] = None if status == "ok" else (reason.strip() or "no answer")
    return result


class MirrorReachability(FactBase[dict[str, str | None]]):
    """
    For each URL (a file a mirror serves, e.g. its InRelease), None if the node fetched it,
    else apt's reason. ``proxy`` is the HTTP proxy apt is to use (None: direct), bypassed
    for ``direct_hosts``.

    .. code:: python

        {"http://deb.debian.org/debian/dists/bookworm/InRelease": None,
         "http://mirror.example/debian/dists/bookworm/InRelease":
             "Could not connect to mirror.example:80 (10.0.0.9). - connect (111: ...)"}
    """

    # A network check: asked only when apt is about to fetch, never remembered between runs.
    cacheable = False

    def command(
        self, urls: list[str], proxy: str | None = None, direct_hosts: list[str] | None = None
    ) -> str:
        # Retries as apt's own default (3): a proxy's passing hiccup is not an unreachable
        # mirror (apt-cacher-ng answers an error while many nodes refresh the same file).
        options = (
            "-o Acquire::Retries=3 -o Acquire::http::Timeout=10 -o Acquire::https::Timeout=10 "
            "-o APT::Sandbox::User=root "
            f"-o Acquire::http::Proxy={shlex.quote(proxy or 'DIRECT')}"
        ) + "".join(
            f" -o Acquire::http::Proxy::{shlex.quote(name)}=DIRECT" for name in direct_hosts or []
        )
        checks = [
            f"if out=$({APT_HELPER} {options} download-file {shlex.quote(url)} "
            f"\"$dir/file\" 2>&1); then printf '%s\\tok\\n' {shlex.quote(url)}; "
            f"else printf '%s\\tfail\\t%s\\n' {shlex.quote(url)} "
            # apt writes the reason indented under its "Err:" line.
            "\"$(printf '%s\\n' \"$out\" | sed -n 's/^  *\\([^ ].*\\)$/\\1/p' | head -n 1)\"; "
            'fi; rm -f "$dir/file"'
            for url in urls
        ]
        return "dir=$(mktemp -d); " + "; ".join(checks) + '; rmdir "$dir"'

    def process(self, output: list[str]) -> dict[str, str | None]:  # type: ignore[override]
        return parse_reachability(list(output))


class DpkgInterrupted(FactBase[list[str]]):
    """
    What dpkg left unfinished (a run killed or a node rebooted in the middle of a package
    change): files pending in dpkg's journal and ``dpkg --audit``'s complaints. Empty when
    dpkg is consistent.

    .. code:: python

        ["journal: 0001", "The following packages are only half configured, ..."]
    """

    def command(self) -> str:
        return (
            'for f in /var/lib/dpkg/updates/*; do [ -e "$f" ] && echo "journal: ${f##*/}"; '
            "done; dpkg --audit 2>&1 | head -n 20; true"
        )

    def process(self, output: list[str]) -> list[str]:  # type: ignore[override]
        return [line for line in output if line.strip()]

    @staticmethod
    def default() -> list[str]:
        return []


# Which repositories apt has package lists for, without loading apt's cache: ``apt-get
# indextargets`` lists the index files of the configured sources that are on disk (those an
# ``apt update`` fetched), ``REPO_URI`` being the source's URL with a trailing slash.
_URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+")
INDEXED_REPOSITORIES_COMMAND = "apt-get indextargets --format '$(REPO_URI)' 'Created-By: Packages'"


def parse_index_targets(lines: list[str]) -> list[str]:
    """``apt-get indextargets --format '$(REPO_URI)'`` lines -> sorted URLs, no trailing slash."""
    return sorted({line.strip().rstrip("/") for line in lines if _URL.fullmatch(line.strip())})


class AptIndexedRepositories(FactBase[list[str]]):
    """
    Repository URLs apt has package lists for (they were in its sources at the last
    ``apt update``), without a trailing slash. A few milliseconds: unlike ``apt-cache
    policy``, this reads apt's configuration and sources only, never its package cache.

    .. code:: python

        ["http://deb.debian.org/debian", "http://deb.debian.org/debian-security",
         "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64"]
    """

    def command(self) -> str:
        return f"{INDEXED_REPOSITORIES_COMMAND} 2>/dev/null; true"

    def process(self, output: list[str]) -> list[str]:  # type: ignore[override]
        return parse_index_targets(list(output))

    @staticmethod
    def default() -> list[str]:
        return []

"""The operating systems gpunode runs on, as data: one row per release, with its sources.

A node's release is read from the node itself (``/etc/os-release``: facts/os_release.py) and
looked up here; nothing else in gpunode names a release. Everything that differs between
releases is a field of its row: the Debian suites apt reads, the path component of NVIDIA's
CUDA repository, the OpenSSH major version and the ssh-audit policy the hardened sshd meets.
Adding a release (Ubuntu 24.04 LTS, say) is a new row plus, where it differs in kind rather
than in value (no separate security suite host, another driver package family), a new field
with its Debian value as the default.

Standard library only: gpunode/expected reads it as it reads the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

# The placeholders an apt.*_url may hold, filled in from the node's own release (see
# ``fill_url``), so that one inventory serves a mixed fleet: {distro} -> debian12 / debian13
# and {arch} -> x86_64 / sbsa, as NVIDIA's CUDA repository names them; {dpkg_arch} -> amd64 /
# arm64, as the libnvidia-container repository names them (.../stable/deb/amd64).
DISTRO_PLACEHOLDER = "{distro}"
ARCH_PLACEHOLDER = "{arch}"
DPKG_ARCH_PLACEHOLDER = "{dpkg_arch}"
PLACEHOLDERS = (DISTRO_PLACEHOLDER, ARCH_PLACEHOLDER, DPKG_ARCH_PLACEHOLDER)


@dataclass(frozen=True)
class Architecture:
    """How one CPU architecture is named by dpkg, NVIDIA's repositories and the multiarch
    library directory.

    Source: NVIDIA CUDA repository layout, developer.download.nvidia.com/compute/cuda/repos/
    (``debian12/x86_64``, ``debian13/x86_64``, ``debian13/sbsa``), read 2026-12-01 through
    repository install scripts of 2026 (research notes §8); Debian multiarch tuples from
    wiki.debian.org/Multiarch/Tuples (read 2026-12-01).
    """

    dpkg: str  # `dpkg --print-architecture`
    cuda_repo: str  # the last path component of NVIDIA's CUDA repository
    multiarch: str  # /usr/lib/<multiarch>: where NVIDIA's libraries land
    uname: str  # `uname -m`


ARCHITECTURES: dict[str, Architecture] = {
    "amd64": Architecture("amd64", "x86_64", "x86_64-linux-gnu", "x86_64"),
    # Grace (GH200, GB200) nodes. Data only: no role has been run on arm64 yet.
    "arm64": Architecture("arm64", "sbsa", "aarch64-linux-gnu", "aarch64"),
}


@dataclass(frozen=True)
class Distribution:
    """One supported release, as its /etc/os-release names it."""

    os_id: str  # os-release ID
    version_id: str  # os-release VERSION_ID
    codename: str  # os-release VERSION_CODENAME
    pretty_name: str  # what messages call it
    # apt suites: the release itself and its updates (one mirror), and its security archive.
    suites: tuple[str, ...]
    security_suites: tuple[str, ...]
    # The release's component of NVIDIA's CUDA repository path: .../cuda/repos/<this>/<arch>.
    cuda_repo_distro: str
    # The branch of Debian's own nvidia-graphics-drivers in this release (non-free), what
    # nvidia_driver.source "debian" installs.
    distribution_driver_branch: str
    openssh_major: int
    # sshd has PerSourcePenalties (OpenSSH 9.8 and later), and so PerSourcePenaltyExemptList.
    per_source_penalties: bool
    # The ssh-audit built-in policy the hardened sshd passes (gpunode/expected/sshd.py holds
    # each policy's algorithm lists).
    ssh_audit_policy: str
    architectures: tuple[str, ...] = ("amd64", "arm64")
    sources: tuple[str, ...] = field(default=(), compare=False)

    @property
    def key(self) -> str:
        """The name the test fleet and messages use: the codename."""
        return self.codename

    @property
    def release_suite(self) -> str:
        return self.suites[0]


DISTRIBUTIONS: tuple[Distribution, ...] = (
    Distribution(
        os_id="debian",
        version_id="12",
        codename="bookworm",
        pretty_name="Debian 12 (bookworm)",
        suites=("bookworm", "bookworm-updates"),
        security_suites=("bookworm-security",),
        cuda_repo_distro="debian12",
        distribution_driver_branch="535",
        openssh_major=9,
        per_source_penalties=False,
        ssh_audit_policy="Hardened Debian 12 (version 3)",
        sources=(
            'os-release of debian:bookworm (ID=debian, VERSION_ID="12", '
            "VERSION_CODENAME=bookworm), read on a debian:bookworm system 2026-12-01",
            "NVIDIA CUDA repository .../compute/cuda/repos/debian12/x86_64/ (Release "
            "'created at: Thu, 28 Aug 2025'), read 2026-12-01",
            "packages.debian.org/bookworm/nvidia-driver: 535.261.03-1 [non-free], read 2026-12-01",
            "packages.debian.org bookworm openssh-server 1:9.2p1-2+deb12u7, read 2026-12-01",
            "ssh-audit 3.9.0 built-in policy 'Hardened Debian 12 (version 3)' "
            "(ssh-audit -L), read 2026-12-01",
        ),
    ),
    Distribution(
        os_id="debian",
        version_id="13",
        codename="trixie",
        pretty_name="Debian 13 (trixie)",
        suites=("trixie", "trixie-updates"),
        security_suites=("trixie-security",),
        cuda_repo_distro="debian13",
        distribution_driver_branch="550",
        openssh_major=10,
        per_source_penalties=True,
        ssh_audit_policy="Hardened Debian 13 (version 1)",
        sources=(
            "Debian 13 released 2025-08-09 (debian.org/News/2025/20250809), read 2026-12-01",
            'os-release of debian:trixie (ID=debian, VERSION_ID="13", '
            "VERSION_CODENAME=trixie), read on a debian:trixie system 2026-12-01",
            "NVIDIA CUDA repository .../compute/cuda/repos/debian13/x86_64/ and .../sbsa/ "
            "(cuda-keyring_1.1-1_all.deb), read 2026-12-01",
            "Debian trixie nvidia-graphics-drivers 550.163.01-2 (packages.debian.org "
            "trixie nvidia-driver), read 2026-12-01",
            "packages.debian.org trixie openssh 1:10.0p1-7+deb13u4, read 2026-12-01; a "
            "trixie node's ssh -V: OpenSSH_10.0p2 Debian-7+deb13u4 (2026-12-01)",
            "OpenSSH 9.8 release notes: PerSourcePenalties; sshd -T on trixie: "
            "persourcepenalties crash:90 authfail:5 noauth:1 ... (2026-12-01)",
            "ssh-audit 3.9.0 built-in policy 'Hardened Debian 13 (version 1)' "
            "(ssh-audit -L), read 2026-12-01",
        ),
    ),
)

BY_CODENAME: dict[str, Distribution] = {row.codename: row for row in DISTRIBUTIONS}
DEFAULT = BY_CODENAME["bookworm"]


def supported() -> str:
    """The supported releases, for messages: 'Debian 12 (bookworm), Debian 13 (trixie)'."""
    return ", ".join(row.pretty_name for row in DISTRIBUTIONS)


def find(os_id: str, version_id: str, codename: str = "") -> Distribution | None:
    """The row for an os-release's ID and VERSION_ID (VERSION_CODENAME must agree when
    given): None for a release gpunode does not support."""
    for row in DISTRIBUTIONS:
        if row.os_id == os_id and row.version_id == version_id:
            if codename and codename != row.codename:
                return None
            return row
    return None


class UnsupportedNode(ValueError):
    """The node's operating system or architecture is not a row of this table."""


def describe(os_release: dict[str, str]) -> str:
    name = os_release.get("PRETTY_NAME") or " ".join(
        filter(None, (os_release.get("ID"), os_release.get("VERSION_ID")))
    )
    return repr(name) if name else "an operating system without /etc/os-release"


def distribution_of(os_release: dict[str, str]) -> Distribution:
    """The row for a node's /etc/os-release fields, or UnsupportedNode naming what is."""
    row = find(
        os_release.get("ID", ""),
        os_release.get("VERSION_ID", ""),
        os_release.get("VERSION_CODENAME", ""),
    )
    if row is None:
        raise UnsupportedNode(
            f"the node runs {describe(os_release)}; gpunode supports {supported()}"
        )
    return row


def architecture_of(dpkg_architecture: str, distribution: Distribution) -> Architecture:
    if dpkg_architecture not in distribution.architectures:
        raise UnsupportedNode(
            f"the node's architecture is {dpkg_architecture!r}; gpunode supports "
            f"{', '.join(distribution.architectures)} on {distribution.pretty_name}"
        )
    return ARCHITECTURES[dpkg_architecture]


def platform_of(node_os: dict[str, Any]) -> tuple[Distribution, Architecture]:
    """The node's row and architecture from its NodeOs fact (facts/node.py); UnsupportedNode
    names what gpunode supports, and what of the node could not be read."""
    problems = [str(problem) for problem in node_os.get("problems") or []]
    try:
        distribution = distribution_of(node_os.get("os_release") or {})
    except UnsupportedNode as error:
        if problems:
            raise UnsupportedNode(f"{error} ({'; '.join(problems)})") from None
        raise
    architecture = node_os.get("architecture")
    if not isinstance(architecture, str):
        raise UnsupportedNode(
            f"the node's architecture could not be read ({'; '.join(problems) or 'no answer'})"
        )
    return distribution, architecture_of(architecture, distribution)


_PLACEHOLDER = re.compile(r"\{[^{}]*\}")


def placeholder_problem(url: str) -> str | None:
    """Why ``url``'s braces are not gpunode's placeholders, or None."""
    unknown = [found for found in _PLACEHOLDER.findall(url) if found not in PLACEHOLDERS]
    if unknown:
        return f"unknown placeholder {unknown[0]} (known: {', '.join(PLACEHOLDERS)})"
    stripped = _PLACEHOLDER.sub("", url)
    if "{" in stripped or "}" in stripped:
        return "an unmatched brace"
    return None


def without_placeholders(url: str, filler: str = "x") -> str:
    """``url`` with every placeholder replaced by a plain word, for URL validation."""
    for placeholder in PLACEHOLDERS:
        url = url.replace(placeholder, filler)
    return url


# A path segment naming a release as NVIDIA's repositories do (debian12, ubuntu2404).
_RELEASE_SEGMENT = re.compile(r"(debian|ubuntu)[0-9]{2,4}")


def fill_url(url: str, distribution: Distribution, architecture: Architecture) -> str:
    """``url`` for this node: ``{distro}`` -> e.g. debian13, ``{arch}`` -> e.g. x86_64,
    ``{dpkg_arch}`` -> e.g. amd64.

    A literal release in a URL without ``{distro}`` (``.../debian12/x86_64`` on a trixie
    node) is refused: apt would install another release's packages on the node.
    """
    if DISTRO_PLACEHOLDER not in url:
        segments = urlsplit(url).path.split("/")
        named = {segment for segment in segments if _RELEASE_SEGMENT.fullmatch(segment)}
        wrong = sorted(name for name in named if name != distribution.cuda_repo_distro)
        if wrong:
            raise UnsupportedNode(
                f"{url} is a repository for {wrong[0]}, but the node runs "
                f"{distribution.pretty_name} ({distribution.cuda_repo_distro}); write "
                f"{DISTRO_PLACEHOLDER} in its place so that each node gets its own"
            )
    return (
        url.replace(DISTRO_PLACEHOLDER, distribution.cuda_repo_distro)
        .replace(ARCH_PLACEHOLDER, architecture.cuda_repo)
        .replace(DPKG_ARCH_PLACEHOLDER, architecture.dpkg)
    )

"""The operating systems gpunode runs on, as data: one row per release, with its sources.

A node's release is read from the node itself (``/etc/os-release``: facts/os_release.py) and
looked up here; nothing else in gpunode names a release. Everything that differs between
releases is a field of its row: the Debian suites apt reads, the path component of NVIDIA's
CUDA repository, the OpenSSH major version and the ssh-audit policy the hardened sshd meets.
Adding a release is a new row plus, where it differs in kind rather than in value (another
archive and keyring, another apt sources format, another driver package family, another kernel
naming), a new field with its Debian value as the default: the Ubuntu rows are such rows.

Standard library only: gpunode/expected reads it as it reads the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal
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


# Where apt.debian_keyring (a site mirror's own signing key) is installed on a Debian node: a
# name of gpunode's own, never the file of Debian's keyring package.
SITE_DEBIAN_KEYRING = "/usr/share/keyrings/gpunode-debian-mirror-keyring.gpg"


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
    # nvidia_driver.source "debian" installs; None where the release is not Debian's.
    distribution_driver_branch: str | None
    openssh_major: int
    # sshd has PerSourcePenalties (OpenSSH 9.8 and later), and so PerSourcePenaltyExemptList.
    per_source_penalties: bool
    # The ssh-audit built-in policy the hardened sshd passes (gpunode/expected/sshd.py holds
    # each policy's algorithm lists).
    ssh_audit_policy: str
    architectures: tuple[str, ...] = ("amd64", "arm64")
    # The release's own archive as gpunode writes it (roles/base.py): from apt.debian_* on
    # Debian, apt.ubuntu_* on Ubuntu; signed by this keyring (the archive-keyring package's).
    archive_keyring: str = "/usr/share/keyrings/debian-archive-keyring.gpg"
    # The file that holds the archive's sources, in the release's own format: deb822
    # (``Types:``/``URIs:`` stanzas in a .sources file) or one-line (``deb URI suite
    # components`` in a .list file).
    apt_sources_path: str = "/etc/apt/sources.list.d/debian.sources"
    apt_sources_format: Literal["deb822", "one-line"] = "deb822"
    # The nvidia_driver.source values this release can install: its own archive's driver
    # ("debian": Debian non-free; "ubuntu": Ubuntu's restricted) and NVIDIA's repository.
    driver_sources: tuple[str, ...] = ("debian", "nvidia")
    # How ``uname -r`` names a kernel: Debian "6.1.0-28-amd64" (ABI, then the architecture or
    # cloud-amd64/rt-amd64); Ubuntu "6.8.0-49-generic" (ABI, then the flavour: generic,
    # nvidia, aws, ...), which Ubuntu's prebuilt NVIDIA module packages are named after.
    kernel_naming: Literal["debian", "ubuntu"] = "debian"
    # What configures the network (IPoIB interfaces): ifupdown's /etc/network/interfaces.d,
    # or netplan's /etc/netplan.
    network_configuration: Literal["ifupdown", "netplan"] = "ifupdown"
    # sshd starts from ssh.socket by default (Ubuntu 22.10 and later), where Port and
    # ListenAddress belong to the socket unit; roles/sshd.py runs sshd from ssh.service on
    # every release (the socket masked), as dev-sec's role does.
    sshd_socket_activated: bool = False
    # The security origins unattended-upgrades may install from (roles/unattended_upgrades.py)
    # and the apt.conf list they are written in. Debian: its security archive by codename
    # (the second form matches the archive's older Release layout).
    unattended_origins_list: Literal["Origins-Pattern", "Allowed-Origins"] = "Origins-Pattern"
    unattended_origins: tuple[str, ...] = (
        "origin=Debian,codename=${distro_codename}-security,label=Debian-Security",
        "origin=Debian,codename=${distro_codename},label=Debian-Security",
    )
    sources: tuple[str, ...] = field(default=(), compare=False)

    @property
    def is_ubuntu(self) -> bool:
        return self.os_id == "ubuntu"

    @property
    def key(self) -> str:
        """The name the test fleet and messages use: the codename."""
        return self.codename

    @property
    def release_suite(self) -> str:
        return self.suites[0]


# Ubuntu's own 50unattended-upgrades, security part: its release pocket (Ubuntu's security
# updates may pull new dependencies from it), its security pocket and Ubuntu Pro's ESM
# pockets (present only where the node has them). Copies of the default file in
# github.com/tryauuum/my-salt modules/apt/init.sls and public notes, read 2026-12-07.
UBUNTU_SECURITY_ORIGINS = (
    "${distro_id}:${distro_codename}",
    "${distro_id}:${distro_codename}-security",
    "${distro_id}ESMApps:${distro_codename}-apps-security",
    "${distro_id}ESM:${distro_codename}-infra-security",
)

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
    Distribution(
        os_id="ubuntu",
        version_id="22.04",
        codename="jammy",
        pretty_name="Ubuntu 22.04 LTS (jammy)",
        suites=("jammy", "jammy-updates"),
        security_suites=("jammy-security",),
        cuda_repo_distro="ubuntu2204",
        distribution_driver_branch=None,
        openssh_major=8,
        per_source_penalties=False,
        ssh_audit_policy="Hardened Ubuntu Server 22.04 LTS (version 6)",
        # arm64 Ubuntu is served from another archive (ports.ubuntu.com/ubuntu-ports), which
        # gpunode does not write yet.
        architectures=("amd64",),
        archive_keyring="/usr/share/keyrings/ubuntu-archive-keyring.gpg",
        # 22.04's installer writes one-line entries to /etc/apt/sources.list (moved aside by
        # roles/base.py, as on Debian); gpunode keeps the release's format in its own file.
        apt_sources_path="/etc/apt/sources.list.d/ubuntu.list",
        apt_sources_format="one-line",
        # NVIDIA's Ubuntu tree names its compute-only set otherwise than its Debian one
        # (libnvidia-compute-<branch> and nvidia-dkms-<branch>-open, research anchors §27):
        # not installed by roles/nvidia_driver.py yet, so not offered.
        driver_sources=("ubuntu",),
        kernel_naming="ubuntu",
        network_configuration="netplan",
        sshd_socket_activated=False,
        unattended_origins_list="Allowed-Origins",
        unattended_origins=UBUNTU_SECURITY_ORIGINS,
        sources=(
            'os-release of ubuntu:22.04 (ID=ubuntu, VERSION_ID="22.04", '
            "VERSION_CODENAME=jammy): github.com/beeware/briefcase "
            "tests/platforms/linux/os_release.py @3304e76, read 2026-12-07",
            "jammy's one-line sources (archive.ubuntu.com/ubuntu, jammy jammy-updates "
            "jammy-security, main restricted universe multiverse): github.com/shell382/sketch "
            "sources.list.d, read 2026-12-07",
            "NVIDIA CUDA repository .../compute/cuda/repos/ubuntu2204/x86_64/ "
            "(cuda-keyring_1.1-1_all.deb; research anchors §26), read 2026-12-07",
            "OpenSSH 8.9p1 on 22.04: server banners 'SSH-2.0-OpenSSH_8.9p1 Ubuntu-3ubuntu0.10' "
            "in public test data, read 2026-12-07",
            "ssh-audit built-in policy 'Hardened Ubuntu Server 22.04 LTS (version 6)': "
            "github.com/jtesta/ssh-audit src/ssh_audit/builtin_policies.py @1eb1105 "
            "(2026-06-20), read 2026-12-07",
            "ssh.socket activation from Ubuntu 22.10 on (22.04 runs ssh.service): dev-sec "
            "ssh-hardening notes (research anchors §9), read 2026-12-07",
        ),
    ),
    Distribution(
        os_id="ubuntu",
        version_id="24.04",
        codename="noble",
        pretty_name="Ubuntu 24.04 LTS (noble)",
        suites=("noble", "noble-updates"),
        security_suites=("noble-security",),
        cuda_repo_distro="ubuntu2404",
        distribution_driver_branch=None,
        openssh_major=9,
        per_source_penalties=False,
        ssh_audit_policy="Hardened Ubuntu Server 24.04 LTS (version 2)",
        architectures=("amd64",),
        archive_keyring="/usr/share/keyrings/ubuntu-archive-keyring.gpg",
        # 24.04 keeps its archive in deb822 form in this very file.
        apt_sources_path="/etc/apt/sources.list.d/ubuntu.sources",
        apt_sources_format="deb822",
        # NVIDIA's Ubuntu tree names its compute-only set otherwise than its Debian one
        # (libnvidia-compute-<branch> and nvidia-dkms-<branch>-open, research anchors §27):
        # not installed by roles/nvidia_driver.py yet, so not offered.
        driver_sources=("ubuntu",),
        kernel_naming="ubuntu",
        network_configuration="netplan",
        sshd_socket_activated=True,
        unattended_origins_list="Allowed-Origins",
        unattended_origins=UBUNTU_SECURITY_ORIGINS,
        sources=(
            'os-release of Ubuntu 24.04.3 LTS (ID=ubuntu, VERSION_ID="24.04", '
            "VERSION_CODENAME=noble): github.com/syunkitada/home "
            "docs/env/os/ubuntu/upgrade_to_24.04.md, read 2026-12-07",
            "noble's /etc/apt/sources.list.d/ubuntu.sources (deb822, Signed-By "
            "/usr/share/keyrings/ubuntu-archive-keyring.gpg, noble-security on its own "
            "stanza): github.com/christsui1228/setup set_apt_mirror.sh, read 2026-12-07",
            "NVIDIA CUDA repository .../compute/cuda/repos/ubuntu2404/x86_64/ "
            "(research anchors §26), read 2026-12-07",
            "openssh-server 1:9.6p1-3ubuntu13.18 in noble "
            "(packages.ubuntu.com/noble/net/openssh-server), read 2026-12-07: no "
            "PerSourcePenalties (9.8 and later)",
            "ssh-audit built-in policy 'Hardened Ubuntu Server 24.04 LTS (version 2)': "
            "github.com/jtesta/ssh-audit src/ssh_audit/builtin_policies.py @1eb1105 "
            "(2026-06-20), read 2026-12-07",
        ),
    ),
    Distribution(
        os_id="ubuntu",
        version_id="26.04",
        codename="resolute",
        pretty_name="Ubuntu 26.04 LTS (resolute)",
        suites=("resolute", "resolute-updates"),
        security_suites=("resolute-security",),
        cuda_repo_distro="ubuntu2604",
        distribution_driver_branch=None,
        openssh_major=10,
        per_source_penalties=True,
        ssh_audit_policy="Hardened Ubuntu Server 26.04 LTS (version 1)",
        architectures=("amd64",),
        archive_keyring="/usr/share/keyrings/ubuntu-archive-keyring.gpg",
        # As 24.04 (deb822 by default since then); not seen on a 26.04 node. apt reads it
        # either way, and a one-line sources.list is moved aside as on every release.
        apt_sources_path="/etc/apt/sources.list.d/ubuntu.sources",
        apt_sources_format="deb822",
        driver_sources=("ubuntu",),
        kernel_naming="ubuntu",
        network_configuration="netplan",
        sshd_socket_activated=True,
        unattended_origins_list="Allowed-Origins",
        unattended_origins=UBUNTU_SECURITY_ORIGINS,
        sources=(
            "packages.ubuntu.com names the release 'resolute (26.04LTS)' "
            "(packages.ubuntu.com/resolute/openssh-server), read 2026-12-07; os-release "
            'ID=ubuntu, VERSION_ID="26.04", VERSION_CODENAME=resolute in public test data '
            "and captures, read 2026-12-07",
            "NVIDIA CUDA repository .../compute/cuda/repos/ubuntu2604/x86_64 and /sbsa "
            "(CUDA 13.3, driver 610.43.02; cuda-repo-ubuntu2604-13-3-local_13.3.1-610.43.02-1 "
            "and cuda-keyring_1.1-1_all.deb) as public install scripts and Dockerfiles "
            "fetch it, read 2026-12-07 (not from NVIDIA's own documentation)",
            "openssh-server 1:10.2p1-2ubuntu3.6 in resolute "
            "(packages.ubuntu.com/resolute/openssh-server), read 2026-12-07: OpenSSH 10, "
            "PerSourcePenalties (9.8 and later)",
            "ssh-audit built-in policy 'Hardened Ubuntu Server 26.04 LTS (version 1)': "
            "github.com/jtesta/ssh-audit src/ssh_audit/builtin_policies.py @1eb1105 "
            "(2026-06-20), read 2026-12-07",
            "Canonical's prebuilt modules for resolute kernels "
            "(linux-modules-nvidia-580-server-open-7.0.0-1016-nvidia, resolute-updates; "
            "tests/fixtures/ubuntu-packages), read 2026-12-07",
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

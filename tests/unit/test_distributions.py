"""The distribution table, the node's release from its os-release, and what follows from it."""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from ssh_audit.builtin_policies import BUILTIN_POLICIES

from facts.node import NodeOs, parse_node_os, parse_os_release
from gpunode import framing
from gpunode.converge import RefusedNode, for_platform
from gpunode.distributions import (
    ARCHITECTURES,
    BY_CODENAME,
    DISTRIBUTIONS,
    SITE_DEBIAN_KEYRING,
    UnsupportedNode,
    distribution_of,
    fill_url,
    placeholder_problem,
    platform_of,
    supported,
)
from gpunode.drift.findings import Severity
from gpunode.expected.sshd import POLICIES, crypto_for, expected_effective, render_sshd_config
from gpunode.model import DesiredState, Sshd, build_desired_state
from gpunode.refusal import NodeRefused
from roles.base import (
    debian_release_files,
    render_archive_sources,
    render_debian_sources,
)

BOOKWORM, TRIXIE = BY_CODENAME["bookworm"], BY_CODENAME["trixie"]
JAMMY, NOBLE = BY_CODENAME["jammy"], BY_CODENAME["noble"]
FIXTURES = Path(__file__).parents[1] / "fixtures"
AMD64, ARM64 = ARCHITECTURES["amd64"], ARCHITECTURES["arm64"]
# ssh-audit announces these itself; they are never configured.
PSEUDO_KEX = {"ext-info-s", "kex-strict-s-v00@openssh.com"}


def os_release(os_id: str, version: str, codename: str = "") -> dict[str, str]:
    fields = {"ID": os_id, "VERSION_ID": version}
    return fields | ({"VERSION_CODENAME": codename} if codename else {})


# --- the table ---------------------------------------------------------------------------------


def test_each_release_is_one_row_with_its_suites_repository_and_policy() -> None:
    assert [(row.os_id, row.version_id, row.codename) for row in DISTRIBUTIONS] == [
        ("debian", "12", "bookworm"),
        ("debian", "13", "trixie"),
        ("ubuntu", "22.04", "jammy"),
        ("ubuntu", "24.04", "noble"),
        ("ubuntu", "26.04", "resolute"),
    ]
    assert TRIXIE.suites == ("trixie", "trixie-updates")
    assert TRIXIE.security_suites == ("trixie-security",)
    assert (BOOKWORM.cuda_repo_distro, TRIXIE.cuda_repo_distro) == ("debian12", "debian13")
    assert (BOOKWORM.distribution_driver_branch, TRIXIE.distribution_driver_branch) == (
        "535",
        "550",
    )
    assert (BOOKWORM.openssh_major, TRIXIE.openssh_major) == (9, 10)
    assert all(row.sources for row in DISTRIBUTIONS)


def test_ubuntu_rows_differ_in_kind_where_ubuntu_does() -> None:
    assert (JAMMY.cuda_repo_distro, NOBLE.cuda_repo_distro) == ("ubuntu2204", "ubuntu2404")
    assert NOBLE.suites == ("noble", "noble-updates")
    assert NOBLE.security_suites == ("noble-security",)
    assert (JAMMY.openssh_major, NOBLE.openssh_major) == (8, 9)
    # 24.04 keeps its archive in deb822 form; 22.04's is one-line.
    assert (NOBLE.apt_sources_format, NOBLE.apt_sources_path) == (
        "deb822",
        "/etc/apt/sources.list.d/ubuntu.sources",
    )
    assert JAMMY.apt_sources_format == "one-line"
    assert {JAMMY.archive_keyring, NOBLE.archive_keyring} == {
        "/usr/share/keyrings/ubuntu-archive-keyring.gpg"
    }
    # What differs in kind has Debian's value as the default.
    assert BOOKWORM.archive_keyring == "/usr/share/keyrings/debian-archive-keyring.gpg"
    assert (BOOKWORM.kernel_naming, NOBLE.kernel_naming) == ("debian", "ubuntu")
    assert (TRIXIE.network_configuration, JAMMY.network_configuration) == ("ifupdown", "netplan")
    # ssh.socket activation from 22.10 on: noble has it, jammy does not.
    assert (BOOKWORM.sshd_socket_activated, JAMMY.sshd_socket_activated) == (False, False)
    assert NOBLE.sshd_socket_activated
    assert (TRIXIE.driver_sources, NOBLE.driver_sources) == (("debian", "nvidia"), ("ubuntu",))
    assert NOBLE.distribution_driver_branch is None
    # Ubuntu's arm64 archive is another host (ports.ubuntu.com): not offered yet.
    assert JAMMY.architectures == NOBLE.architectures == ("amd64",)
    # 26.04: NVIDIA's ubuntu2604 tree, OpenSSH 10 with per-source penalties, and ssh-audit's
    # post-quantum-only policy (the same lists as Debian 13's).
    resolute = BY_CODENAME["resolute"]
    assert (resolute.cuda_repo_distro, resolute.openssh_major) == ("ubuntu2604", 10)
    assert resolute.per_source_penalties and resolute.sshd_socket_activated
    assert crypto_for(resolute) == crypto_for(TRIXIE)


def test_architectures_name_nvidia_s_repository_and_the_library_directory() -> None:
    assert (AMD64.cuda_repo, AMD64.multiarch) == ("x86_64", "x86_64-linux-gnu")
    assert (ARM64.cuda_repo, ARM64.multiarch) == ("sbsa", "aarch64-linux-gnu")


@pytest.mark.parametrize("row", DISTRIBUTIONS, ids=lambda row: row.codename)
def test_each_release_s_crypto_is_its_ssh_audit_policy(row: Any) -> None:
    # The installed ssh-audit's own policy: our lists are exactly its lists, in its order.
    policy = BUILTIN_POLICIES[row.ssh_audit_policy]
    crypto = crypto_for(row)
    assert list(crypto.kex) == [kex for kex in policy["kex"] if kex not in PSEUDO_KEX]
    assert list(crypto.ciphers) == policy["ciphers"]
    assert list(crypto.macs) == policy["macs"]
    assert set(POLICIES) == {row.ssh_audit_policy for row in DISTRIBUTIONS}


def test_trixie_s_sshd_offers_post_quantum_key_exchange_only() -> None:
    bookworm = expected_effective(Sshd(), BOOKWORM)
    trixie = expected_effective(Sshd(), TRIXIE)
    assert trixie["kexalgorithms"] == (
        "mlkem768x25519-sha256,sntrup761x25519-sha512,sntrup761x25519-sha512@openssh.com"
    )
    assert "curve25519-sha256" in bookworm["kexalgorithms"].split(",")
    assert trixie["macs"].split(",")[0] == "hmac-sha2-512-etm@openssh.com"
    # Everything else gpunode writes is the same on both releases.
    same = {key for key in bookworm if key not in ("kexalgorithms", "macs")}
    assert {key: bookworm[key] for key in same} == {key: trixie[key] for key in same}
    assert render_sshd_config(Sshd(), BOOKWORM) != render_sshd_config(Sshd(), TRIXIE)


# --- the node's release -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "row"),
    [
        (os_release("debian", "12", "bookworm"), "bookworm"),
        (os_release("debian", "13", "trixie"), "trixie"),
        (os_release("debian", "13"), "trixie"),
        (os_release("ubuntu", "24.04", "noble"), "noble"),
        (os_release("ubuntu", "22.04"), "jammy"),
        (os_release("ubuntu", "26.04", "resolute"), "resolute"),
    ],
)
def test_a_supported_release_is_found_by_id_and_version(fields: dict[str, str], row: str) -> None:
    assert distribution_of(fields) is BY_CODENAME[row]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        (os_release("ubuntu", "20.04", "focal") | {"PRETTY_NAME": "Ubuntu 20.04.6 LTS"}, "Ubuntu"),
        (os_release("ubuntu", "25.10", "questing"), "ubuntu 25.10"),
        (os_release("ubuntu", "24.04", "jammy"), "ubuntu 24.04"),
        (os_release("debian", "11", "bullseye"), "debian 11"),
        # testing/sid have no VERSION_ID; a codename that disagrees is not that release.
        ({"ID": "debian", "VERSION_CODENAME": "forky"}, "debian"),
        (os_release("debian", "13", "bookworm"), "debian 13"),
        ({}, "without /etc/os-release"),
    ],
)
def test_an_unsupported_release_is_refused_naming_what_is_supported(
    fields: dict[str, str], named: str
) -> None:
    with pytest.raises(UnsupportedNode) as refused:
        distribution_of(fields)
    assert named in str(refused.value)
    everything = (
        "Debian 12 (bookworm), Debian 13 (trixie), Ubuntu 22.04 LTS (jammy), "
        "Ubuntu 24.04 LTS (noble), Ubuntu 26.04 LTS (resolute)"
    )
    assert str(refused.value).endswith(f"gpunode supports {everything}")
    assert supported() == everything


@pytest.mark.parametrize(
    ("capture", "row"), [("ubuntu-22.04-jammy", "jammy"), ("ubuntu-24.04-noble", "noble")]
)
def test_a_real_ubuntu_os_release_is_its_row(capture: str, row: str) -> None:
    # Real /etc/os-release text (tests/fixtures/PROVENANCE.md), through the fact's parser.
    text = (FIXTURES / "os-release" / capture).read_text()
    output = framing.output_of(
        {
            "os-release": framing.PartOutput("os-release", text.splitlines(), [], 0),
            "architecture": framing.PartOutput("architecture", ["amd64"], [], 0),
        }
    )
    found = parse_node_os(output)
    assert found["problems"] == []
    assert found["os_release"]["ID_LIKE"] == "debian"
    assert platform_of(found) == (BY_CODENAME[row], AMD64)
    with pytest.raises(UnsupportedNode, match="'arm64'; gpunode supports amd64 on Ubuntu"):
        platform_of(found | {"architecture": "arm64"})


def test_the_architecture_comes_with_the_release() -> None:
    facts = {"os_release": os_release("debian", "13", "trixie"), "architecture": "arm64"}
    assert platform_of(facts) == (TRIXIE, ARM64)
    with pytest.raises(UnsupportedNode, match="'riscv64'; gpunode supports amd64, arm64"):
        platform_of(facts | {"architecture": "riscv64"})
    with pytest.raises(UnsupportedNode, match=r"could not be read \(dpkg is not installed"):
        platform_of(facts | {"architecture": None, "problems": ["dpkg is not installed"]})


def test_the_node_os_fact_reads_this_machine() -> None:
    # The fact's real command on the machine running the tests (a Debian 12 or 13 host).
    fact = NodeOs()
    output = subprocess.run(["sh", "-c", fact.command()], capture_output=True, text=True)
    found = fact.process(output.stdout.splitlines())
    with open("/etc/os-release") as handle:
        wanted, _ = parse_os_release(handle.read().splitlines())
    assert found["os_release"] == wanted and found["problems"] == []
    assert (
        found["architecture"]
        == subprocess.run(
            ["dpkg", "--print-architecture"], capture_output=True, text=True
        ).stdout.strip()
    )
    assert platform_of(found)[0].codename == wanted["VERSION_CODENAME"]


def test_os_release_parsing_keeps_what_it_can_read() -> None:
    fields, problems = parse_os_release(
        [
            'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"',
            "ID=debian",
            "VERSION_ID='13'",
            "# a comment",
            'VERSION_CODENAME="trixie',  # unterminated quote
            "ID_LIKE=" + "x" * 500,
            'HOME_URL="https://www.debian.org/"',  # not a key gpunode reads
            "garbage",
        ]
    )
    assert fields == {
        "PRETTY_NAME": "Debian GNU/Linux 13 (trixie)",
        "ID": "debian",
        "VERSION_ID": "13",
    }
    assert problems == [
        "VERSION_CODENAME: unreadable value",
        "ID_LIKE: value of unexpected characters or length",
    ]


def test_a_node_without_os_release_or_dpkg_says_so() -> None:
    output = framing.output_of(
        {
            "os-release": framing.PartOutput("os-release", [], [], 1),
            "architecture": framing.PartOutput("architecture", absent=True),
        }
    )
    found = parse_node_os(output)
    assert found == {
        "os_release": {},
        "architecture": None,
        "problems": ["os-release: no /etc/os-release", "architecture: dpkg is not installed"],
    }
    with pytest.raises(UnsupportedNode, match="without /etc/os-release; gpunode supports"):
        platform_of(found)
    assert parse_node_os(["garbage"])["problems"]


# --- repository URLs ---------------------------------------------------------------------------


def test_placeholders_become_the_node_s_release_and_architecture() -> None:
    url = "http://mirror/cuda/{distro}/{arch}"
    assert fill_url(url, TRIXIE, AMD64) == "http://mirror/cuda/debian13/x86_64"
    assert fill_url(url, BOOKWORM, ARM64) == "http://mirror/cuda/debian12/sbsa"
    toolkit = "http://mirror/libnvidia-container/stable/deb/{dpkg_arch}"
    assert fill_url(toolkit, TRIXIE, ARM64) == "http://mirror/libnvidia-container/stable/deb/arm64"


def test_a_url_naming_another_release_is_refused_on_the_node() -> None:
    literal = "http://mirror/cuda/debian12/x86_64"
    assert fill_url(literal, BOOKWORM, AMD64) == literal  # an old inventory keeps working
    with pytest.raises(UnsupportedNode) as refused:
        fill_url(literal, TRIXIE, AMD64)
    assert str(refused.value) == (
        "http://mirror/cuda/debian12/x86_64 is a repository for debian12, but the node runs "
        "Debian 13 (trixie) (debian13); write {distro} in its place so that each node gets "
        "its own"
    )
    with pytest.raises(UnsupportedNode, match="ubuntu2404"):
        fill_url("http://mirror/cuda/ubuntu2404/x86_64", BOOKWORM, AMD64)
    # Only a whole path segment names a release; a host name or a longer word does not.
    for url in ("http://mirror/mydebian12s/x", "http://debian12-mirror.example/cuda/x86_64"):
        assert fill_url(url, TRIXIE, AMD64) == url


def test_the_desired_state_for_a_node_has_its_urls_filled_in() -> None:
    desired = DesiredState()
    assert "{distro}/{arch}" in desired.apt.cuda_repo_url
    on_node = for_platform(desired, TRIXIE, AMD64)
    assert on_node.apt.cuda_repo_url == (
        "https://developer.download.nvidia.com/compute/cuda/repos/debian13/x86_64"
    )
    assert on_node.apt.container_toolkit_repo_url == (
        "https://nvidia.github.io/libnvidia-container/stable/deb/amd64"
    )
    assert on_node.sshd == desired.sshd and on_node.cuda == desired.cuda


def test_debian_s_driver_is_pinned_to_the_branch_the_node_s_release_ships() -> None:
    def on(distribution: Any, **driver: str) -> Any:
        state, problems = build_desired_state({"nvidia_driver": {"source": "debian", **driver}})
        assert problems == []
        return for_platform(state, distribution, AMD64)

    assert on(TRIXIE, version="550.163.01-2").nvidia_driver.version == "550.163.01-2"
    assert on(BOOKWORM, branch="535").nvidia_driver.branch == "535"
    assert on(TRIXIE).nvidia_driver.source == "debian"  # unpinned: what the release has
    with pytest.raises(UnsupportedNode) as refused:
        on(TRIXIE, version="535.261.03-1")
    assert str(refused.value) == (
        "nvidia_driver.source is 'debian' and pins branch 535, but Debian 13 (trixie) ships "
        "Debian's driver branch 550; pin that branch for this node, or use source: nvidia"
    )


def test_a_driver_source_the_release_does_not_offer_refuses_the_node() -> None:
    def on(distribution: Any, **driver: str) -> Any:
        state, problems = build_desired_state({"nvidia_driver": driver})
        assert problems == []
        return for_platform(state, distribution, AMD64)

    with pytest.raises(UnsupportedNode) as refused:
        on(NOBLE, source="debian")
    assert str(refused.value) == (
        "nvidia_driver.source is 'debian', which Ubuntu 24.04 LTS (noble) does not offer; "
        "use one of ubuntu for this node"
    )
    with pytest.raises(UnsupportedNode, match="'ubuntu', which Debian 13 \\(trixie\\)"):
        on(TRIXIE, source="ubuntu", branch="580")
    assert on(NOBLE, source="ubuntu", branch="580").nvidia_driver.branch == "580"
    # NVIDIA's Ubuntu tree is not installed from yet (its package names differ from Debian's).
    with pytest.raises(UnsupportedNode, match=r"'nvidia', which Ubuntu 22\.04 LTS"):
        on(JAMMY, source="nvidia", branch="580")
    assert on(JAMMY).apt.cuda_repo_url.endswith("/ubuntu2204/x86_64")
    assert on(TRIXIE).nvidia_driver.source == "none"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://mirror/cuda/{release}/x86_64", "unknown placeholder {release}"),
        ("http://mirror/cuda/{distro/x86_64", "an unmatched brace"),
        ("http://mirror/cuda/}{distro}", "an unmatched brace"),
    ],
)
def test_an_unknown_placeholder_is_an_inventory_problem(url: str, problem: str) -> None:
    assert placeholder_problem(url) is not None and problem in str(placeholder_problem(url))
    _, problems = build_desired_state({"apt": {"cuda_repo_url": url}})
    assert [(p.key, p.reason) for p in problems] == [("apt.cuda_repo_url", problem_of(url))]


def problem_of(url: str) -> str:
    return str(placeholder_problem(url))


def test_placeholder_urls_are_valid_inventory_data() -> None:
    state, problems = build_desired_state(
        {
            "apt": {
                "cuda_repo_url": "http://mirror:8089/nvidia/cuda/{distro}/{arch}",
                "container_toolkit_repo_url": "http://mirror/lnc/stable/deb/{dpkg_arch}",
            }
        }
    )
    assert problems == []
    assert state.apt.cuda_repo_url == "http://mirror:8089/nvidia/cuda/{distro}/{arch}"


# --- Debian sources -----------------------------------------------------------------------------


def test_debian_sources_are_the_node_s_release() -> None:
    repos = DesiredState().apt
    text = render_debian_sources(repos, TRIXIE)
    assert "Suites: trixie trixie-updates\n" in text
    assert "Suites: trixie-security\n" in text
    assert "bookworm" not in text
    assert debian_release_files(repos, TRIXIE) == [
        "http://deb.debian.org/debian/dists/trixie/InRelease",
        "http://deb.debian.org/debian-security/dists/trixie-security/InRelease",
    ]
    assert "Suites: bookworm bookworm-updates\n" in render_debian_sources(repos, BOOKWORM)
    assert render_archive_sources(repos, TRIXIE) == text


def test_a_re_signed_debian_mirror_is_trusted_by_its_own_keyring_and_debian_s_is_not() -> None:
    repos = replace(
        DesiredState().apt,
        debian_mirror="http://mirror.example/debian",
        debian_keyring="/etc/gpunode/site-mirror.gpg",
    )
    text = render_debian_sources(repos, BOOKWORM)
    # Both archives (release and security) name the site's keyring, and only it.
    assert text.count(f"Signed-By: {SITE_DEBIAN_KEYRING}\n") == 2
    assert "debian-archive-keyring" not in text
    assert "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n" in render_debian_sources(
        DesiredState().apt, BOOKWORM
    )
    # Ubuntu's archive is signed by Ubuntu's keyring whatever the Debian mirror's is.
    assert SITE_DEBIAN_KEYRING not in render_archive_sources(repos, NOBLE)


def test_ubuntu_24_04_sources_are_deb822_of_ubuntu_s_archive() -> None:
    repos = DesiredState().apt
    assert render_archive_sources(repos, NOBLE) == (
        "# Managed by gpunode (apt.ubuntu_mirror); local edits are replaced.\n"
        "Types: deb\nURIs: http://archive.ubuntu.com/ubuntu\nSuites: noble noble-updates\n"
        "Components: main restricted universe multiverse\n"
        "Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg\n"
        "\n"
        "Types: deb\nURIs: http://security.ubuntu.com/ubuntu\nSuites: noble-security\n"
        "Components: main restricted universe multiverse\n"
        "Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg\n"
    )
    assert debian_release_files(repos, NOBLE) == [
        "http://archive.ubuntu.com/ubuntu/dists/noble/InRelease",
        "http://security.ubuntu.com/ubuntu/dists/noble-security/InRelease",
    ]


def test_ubuntu_22_04_sources_are_one_line_entries_of_its_mirror() -> None:
    state, problems = build_desired_state(
        {"apt": {"ubuntu_mirror": "http://mirror.dc1/ubuntu/", "ubuntu_components": ["main"]}}
    )
    assert problems == []
    text = render_archive_sources(state.apt, JAMMY)
    keyring = "[signed-by=/usr/share/keyrings/ubuntu-archive-keyring.gpg]"
    assert text.splitlines()[1:] == [
        f"deb {keyring} http://mirror.dc1/ubuntu/ jammy main",
        f"deb {keyring} http://mirror.dc1/ubuntu/ jammy-updates main",
        f"deb {keyring} http://security.ubuntu.com/ubuntu jammy-security main",
    ]
    # Never Debian's archive on an Ubuntu node, nor Ubuntu's on a Debian one.
    assert "debian" not in text
    assert "ubuntu" not in render_archive_sources(state.apt, BOOKWORM)


def test_ubuntu_components_must_include_main() -> None:
    _, problems = build_desired_state({"apt": {"ubuntu_components": ["universe"]}})
    assert [(p.key, p.reason) for p in problems] == [("apt.ubuntu_components", "main is missing")]
    _, problems = build_desired_state({"apt": {"ubuntu_components": ["non-free"]}})
    # Debian's non-free is not an Ubuntu component (and main is missing then too).
    assert [p.key for p in problems] == ["apt.ubuntu_components[0]", "apt.ubuntu_components"]


def test_a_refused_node_s_roles_stop_at_the_first_thing_they_read() -> None:
    refused = RefusedNode("node-1: not converged: the node runs 'Ubuntu 24.04.1 LTS'")
    with pytest.raises(NodeRefused) as stopped:
        _ = refused.apt  # type: ignore[attr-defined]
    assert stopped.value.reason == "node-1: not converged: the node runs 'Ubuntu 24.04.1 LTS'"
    assert str(stopped.value).endswith("\nNothing was changed.")
    assert not hasattr(refused, "__deepcopy__")


# --- the drift check reads the release too -------------------------------------------------------

TRIXIE_OS = {
    "os_release": os_release("debian", "13", "trixie"),
    "architecture": "amd64",
    "problems": [],
}


def test_drift_judges_sshd_by_the_node_s_release() -> None:
    from .test_drift_rules import desired, findings, healthy_facts

    bookworm_sshd = healthy_facts()
    on_trixie = bookworm_sshd | {"os": TRIXIE_OS}
    assert findings(on_trixie) == {
        "sshd.kexalgorithms": Severity.WARNING,
        "sshd.macs": Severity.WARNING,
        "sshd.config": Severity.WARNING,
    }
    wanted = desired()
    trixie_sshd = {
        "effective": {k: [v] for k, v in expected_effective(wanted.sshd, TRIXIE).items()},
        "config_sha1": hashlib.sha1(render_sshd_config(wanted.sshd, TRIXIE).encode()).hexdigest(),
    }
    assert findings(on_trixie | {"sshd": trixie_sshd}) == {}


def test_drift_names_an_unsupported_or_unreadable_release() -> None:
    from .test_drift_rules import findings, healthy_facts

    ubuntu = {"os_release": os_release("ubuntu", "20.04", "focal"), "architecture": "amd64"}
    assert findings(healthy_facts() | {"os": ubuntu}) == {"os.release": Severity.CRITICAL}
    without = {key: value for key, value in healthy_facts().items() if key != "os"}
    assert findings(without) == {"os.unreadable": Severity.WARNING}
    assert findings(healthy_facts() | {"os": {"os_release": "debian"}}) == {
        "os.unreadable": Severity.WARNING
    }


def test_control_hosts_are_exempt_from_penalties_where_sshd_has_them() -> None:
    sshd = Sshd(penalty_exempt_networks=("10.0.0.5/32", "fd00::/8"))
    exempt = "PerSourcePenaltyExemptList 10.0.0.5/32,fd00::/8"
    assert exempt in render_sshd_config(sshd, TRIXIE).splitlines()
    assert expected_effective(sshd, TRIXIE)["persourcepenaltyexemptlist"] == "10.0.0.5/32,fd00::/8"
    # OpenSSH 9.2 has no per-source penalties and would refuse the keyword.
    assert "PerSourcePenalty" not in render_sshd_config(sshd, BOOKWORM)
    assert "PerSourcePenalty" not in render_sshd_config(Sshd(), TRIXIE)

"""`gpunode lab up` refuses bad sizes before it touches Docker or writes state."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpunode.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "0"], "--nodes 0: choose between 1 and 200"),
        (["--scratch-disks", "17"], "scratch disks: 17 of 1024 MiB asked; 1 to 16 per node"),
        (["--scratch-disks", "2", "--scratch-disk-mib", "100"], "2 of 100 MiB asked"),
        (["--profiles", "hgx-h100,dgx-x"], "unknown hardware profile(s) ['dgx-x']"),
        (["--release", "bullseye"], "--release 'bullseye': unknown release ['bullseye']"),
        (
            ["--release", "bookworm,sid"],
            "unknown release ['sid']; known: bookworm, trixie, noble, mixed",
        ),
        # Ubuntu rows without a lab image (only noble has one: lab.UBUNTU_LAB_BASES).
        (
            ["--release", "jammy"],
            "unknown release ['jammy']; known: bookworm, trixie, noble, mixed",
        ),
    ],
)
def test_bad_lab_sizes_are_refused_before_anything_is_made(
    args: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state_dir = tmp_path / "lab"
    monkeypatch.setenv("GPUNODE_LAB_DIR", str(state_dir))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # any use would fail
    assert main(["lab", "up", *args]) == 2
    assert message in capsys.readouterr().err
    assert not state_dir.exists()


def test_scratch_disks_default_to_none() -> None:
    args = build_parser().parse_args(["lab", "up"])
    assert (args.scratch_disks, args.nodes) == (0, 2)


def test_releases_are_given_to_nodes_in_turn() -> None:
    from lab import releases_of

    assert releases_of("bookworm") == ("bookworm",)
    assert releases_of("trixie") == ("trixie",)
    assert releases_of("mixed") == releases_of("bookworm,trixie,noble")
    assert releases_of("mixed") == ("bookworm", "trixie", "noble")
    assert build_parser().parse_args(["lab", "up"]).release == "bookworm"


def test_each_release_has_its_own_image() -> None:
    from lab import IMAGE_REPOSITORY, Lab, LabNode, debian_sources

    bookworm, trixie = Lab.image_tag_for("bookworm"), Lab.image_tag_for("trixie")
    assert bookworm.split(":")[0] == IMAGE_REPOSITORY == "gpunode-lab/debian12"
    assert trixie.split(":")[0] == "gpunode-lab/debian13"
    assert Lab().image_tag == bookworm
    assert "Suites: trixie trixie-updates\n" in debian_sources("trixie")
    assert "Suites: trixie-security\n" in debian_sources("trixie")
    # A lab recorded before releases existed is a bookworm lab.
    assert LabNode("lab-1", "c", "10.213.0.11", "a100").release == "bookworm"


def test_an_ubuntu_lab_node_is_built_from_its_debian_suite_and_dressed_as_the_release() -> None:
    from lab import (
        DEBIAN_LAB_RELEASES,
        NODE_PACKAGES,
        Lab,
        _customize_script,
        base_suite,
        node_packages,
        releases_of,
    )

    assert releases_of("noble") == ("noble",)
    assert "noble" in releases_of("mixed") and "noble" not in DEBIAN_LAB_RELEASES
    assert base_suite("noble") == "bookworm" and base_suite("trixie") == "trixie"
    assert Lab.image_tag_for("noble").split(":")[0] == "gpunode-lab/ubuntu2404"
    assert set(node_packages("noble")) - set(NODE_PACKAGES) == {
        "ufw", "needrestart", "unattended-upgrades", "apparmor", "netplan.io", "lsb-release",
    }  # fmt: skip
    assert node_packages("bookworm") == NODE_PACKAGES
    script = _customize_script("noble")
    fixture = (ROOT / "tests/fixtures/os-release/ubuntu-24.04-noble").read_text()
    assert f"<<'OSRELEASE'\n{fixture}OSRELEASE\n" in script
    assert 'ln -sf ../usr/lib/os-release "$1/etc/os-release"' in script
    assert 'DISTRIB_CODENAME=noble\nDISTRIB_DESCRIPTION="Ubuntu 24.04.3 LTS"\n' in script
    assert "systemctl disable ssh.service" in script and "systemctl enable ssh.socket" in script
    assert 'rm -f "$1/etc/apt/sources.list.d/debian.sources"' in script
    # Debian nodes are as before: no Ubuntu dressing.
    assert "os-release" not in _customize_script("bookworm")


def test_the_stand_in_ubuntu_archive_redirects_ubuntu_suites_to_debians() -> None:
    from lab.aptrepo import ubuntu_redirect

    debian = "http://deb.debian.org/debian"
    assert ubuntu_redirect("/ubuntu/dists/noble/InRelease") == f"{debian}/dists/bookworm/InRelease"
    assert (
        ubuntu_redirect("/ubuntu/dists/noble-backports/main/binary-amd64/Packages.xz")
        == f"{debian}/dists/bookworm-backports/main/binary-amd64/Packages.xz"
    )
    assert (
        ubuntu_redirect("/ubuntu-security/dists/noble-security/InRelease")
        == "http://deb.debian.org/debian-security/dists/bookworm-security/InRelease"
    )
    assert ubuntu_redirect("/ubuntu/pool/main/u/ufw/ufw_0.36.2-1_all.deb") == (
        f"{debian}/pool/main/u/ufw/ufw_0.36.2-1_all.deb"
    )
    # Not redirected: Ubuntu's driver packages, the stand-in's own suite and component
    # (lab.standin.ubuntu, served from the lab's build); the lab's own files, a release with
    # no lab node, a way out.
    for path in (
        "/ubuntu/dists/noble-updates/InRelease",
        "/ubuntu/dists/noble-updates/restricted/binary-amd64/Packages.gz",
        "/ubuntu/pool/restricted/n/nvidia-graphics-drivers/x.deb",
        "/cuda/debian12/x86_64/InRelease",
        "/ubuntu/dists/jammy/InRelease",
        "/ubuntu/../keyrings/x",
        "/ubuntu/indices/x",
    ):
        assert ubuntu_redirect(path) is None, path

"""`gpunode lab up` refuses bad sizes before it touches Docker or writes state."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpunode.cli import build_parser, main


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "0"], "--nodes 0: choose between 1 and 200"),
        (["--scratch-disks", "17"], "scratch disks: 17 of 1024 MiB asked; 1 to 16 per node"),
        (["--scratch-disks", "2", "--scratch-disk-mib", "100"], "2 of 100 MiB asked"),
        (["--profiles", "hgx-h100,dgx-x"], "unknown hardware profile(s) ['dgx-x']"),
        (["--release", "bullseye"], "--release 'bullseye': unknown release ['bullseye']"),
        (["--release", "bookworm,sid"], "unknown release ['sid']; known: bookworm, trixie, mixed"),
        # Ubuntu rows exist, but lab images are built from Debian's archive only.
        (["--release", "noble"], "unknown release ['noble']; known: bookworm, trixie, mixed"),
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
    assert releases_of("mixed") == releases_of("bookworm,trixie") == ("bookworm", "trixie")
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

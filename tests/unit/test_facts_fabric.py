"""The drift check's fabric facts: mounts and NCCL settings, parsed from real shell output."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import facts.fabric
from facts.fabric import Mounts, NcclSettings, parse_mounts, parse_nccl_settings
from gpunode import framing


def run(command: str) -> list[str]:
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    return result.stdout.splitlines()


def test_mounts_of_this_machine_include_root() -> None:
    mounts = Mounts().process(run(Mounts().command()))
    assert mounts["/"]["fstype"]
    assert "rw" in mounts["/"]["options"] or "ro" in mounts["/"]["options"]


def test_mounts_unescape_blanks_and_the_last_stacked_mount_wins() -> None:
    mounts = parse_mounts(
        [
            "/dev/nvme0n1 /raid xfs rw,relatime 0 0",
            "/dev/md127 /raid xfs rw,noatime 0 0",
            "/dev/sdb1 /mnt/with\\040blank ext4 ro 0 0",
            "garbage",
        ]
    )
    assert mounts == {
        "/raid": {"source": "/dev/md127", "fstype": "xfs", "options": ["rw", "noatime"]},
        "/mnt/with blank": {"source": "/dev/sdb1", "fstype": "ext4", "options": ["ro"]},
    }


def test_nccl_settings_read_from_both_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf, profile = tmp_path / "nccl.conf", tmp_path / "gpunode-nccl.sh"
    # No final newline: the next file's marker must still be found.
    conf.write_text("# Managed by gpunode\nNCCL_DEBUG=WARN\nNCCL_IB_HCA=mlx5_0:1,mlx5_1")
    profile.write_text("# Managed\nexport NCCL_SOCKET_IFNAME='^docker,lo'\nexport OTHER=1\n")
    monkeypatch.setattr(facts.fabric, "NCCL_FILES", {"conf": str(conf), "profile": str(profile)})
    assert NcclSettings().process(run(NcclSettings().command())) == {
        "conf": {"NCCL_DEBUG": "WARN", "NCCL_IB_HCA": "mlx5_0:1,mlx5_1"},
        "profile": {"NCCL_SOCKET_IFNAME": "^docker,lo"},
    }
    conf.write_text("gpunode:profile=present\n##gpunode-frame:0123456789abcdef:done\nNCCL_X=1")
    forged = NcclSettings().process(run(NcclSettings().command()))  # markers are file text
    assert forged["conf"] == {"NCCL_X": "1"}
    assert forged["profile"] == {"NCCL_SOCKET_IFNAME": "^docker,lo"}
    conf.unlink()
    assert NcclSettings().process(run(NcclSettings().command()))["conf"] is None


def test_nccl_conf_values_are_literal_and_profile_values_shell_words() -> None:
    settings = parse_nccl_settings(
        framing.output_of(
            {
                "conf": ["NCCL_DEBUG_SUBSYS='INIT'", "  # a comment"],
                "profile": ["export NCCL_DEBUG_SUBSYS='INIT'", "export NCCL_BROKEN='unbalanced"],
            }
        )
    )
    assert settings == {
        "conf": {"NCCL_DEBUG_SUBSYS": "'INIT'"},
        "profile": {"NCCL_DEBUG_SUBSYS": "INIT", "NCCL_BROKEN": "'unbalanced"},
    }

"""NvidiaPackages' installed-module part, run by the shell against a modinfo on PATH."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from facts.nvidia_packages import INSTALLED_MODULE_COMMAND, _installed_module

# Laid out as kmod's modinfo(8) prints a module: "field:" padded to 16 columns, then the
# value; srcversion and vermagic hold "version" too, but not at the line's start.
MODINFO_NVIDIA = """\
filename:       /lib/modules/6.1.0-28-amd64/updates/dkms/nvidia.ko
alias:          char-major-195-*
srcversion:     A1B2C3D4E5F60718293A4B5
version:        550.127.08
supported:      external
license:        Dual MIT/GPL
depends:        drm
retpoline:      Y
name:           nvidia
vermagic:       6.1.0-28-amd64 SMP preempt mod_unload modversions
parm:           NvSwitchRegDwords:NvSwitch regkey (charp)
parm:           version:not a field (charp)
"""


def run_with_modinfo(tmp_path: Path, output: str, status: int) -> list[str]:
    fake = tmp_path / "modinfo"
    (tmp_path / "answer").write_text(output)
    fake.write_text(
        f'#!/bin/sh\n[ "$*" = nvidia ] || exit 9\ncat {tmp_path}/answer\nexit {status}\n'
    )
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["sh", "-c", INSTALLED_MODULE_COMMAND], capture_output=True, text=True, env=env
    )
    return done.stdout.splitlines()


def test_one_modinfo_gives_the_version_and_licence(tmp_path: Path) -> None:
    lines = run_with_modinfo(tmp_path, MODINFO_NVIDIA, 0)
    assert lines == ["modinfo|550.127.08|Dual MIT/GPL"]
    assert _installed_module(lines) == {
        "version": "550.127.08",
        "flavour": "open",
        "source": "modinfo",
    }


def test_proprietary_licence_and_no_module(tmp_path: Path) -> None:
    proprietary = MODINFO_NVIDIA.replace("Dual MIT/GPL", "NVIDIA")
    assert _installed_module(run_with_modinfo(tmp_path, proprietary, 0))["flavour"] == (
        "proprietary"
    )
    not_found = "modinfo: ERROR: Module nvidia not found.\n"
    assert run_with_modinfo(tmp_path, not_found, 1) == []
    assert _installed_module(run_with_modinfo(tmp_path, "", 0)) is None

"""NvidiaPackages' installed-module part, run by the shell against a modinfo on PATH."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from facts import nvidia_packages
from facts.nvidia_packages import INSTALLED_MODULE_COMMAND, _installed_module
from gpunode import framing

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


# A dpkg status database of the states the fact meets: installed, held, removed with its
# configuration kept, purged (not listed by dpkg-query -W), a package of two architectures,
# a half-configured one, and the running kernel's headers.
STATUS_DATABASE = """\
Package: nvidia-open
Status: hold ok installed
Priority: optional
Architecture: amd64
Version: 590.48.01-1

Package: libcuda1
Status: install ok installed
Architecture: amd64
Multi-Arch: same
Version: 590.48.01-1
Description: NVIDIA CUDA Driver Library
 a continuation line: Version: 0.0

Package: libcuda1
Status: install ok installed
Architecture: i386
Multi-Arch: same
Version: 590.48.01-1

Package: nvidia-kernel-dkms
Status: deinstall ok config-files
Architecture: amd64
Version: 580.95.05-1

Package: cuda-toolkit-13-0
Status: purge ok not-installed
Architecture: amd64

Package: datacenter-gpu-manager-4-core
Status: install reinstreq half-configured
Architecture: amd64
Version: 1:4.4.1-1

Package: linux-headers-{release}
Status: install ok installed
Architecture: amd64
Version: 6.1.158-1

Package: bash
Status: install ok installed
Architecture: amd64
Version: 5.2.15-2+b8
"""


def read_both_ways(database: Path) -> dict[bool, dict[str, framing.PartOutput]]:
    """The installed and headers parts, in Python (the frame's one read of dpkg's database)
    and by dpkg-query itself (the real program, told to read ``database``)."""
    admindir = f"dpkg-query --admindir={database} "
    parts = [
        framing.Part(
            part.name,
            part.command.replace("dpkg-query ", admindir),
            # The database's directory, and dpkg-query's where the Python part lets it answer.
            python=None
            if part.python is None
            else part.python.replace(repr(nvidia_packages.DPKG_DIR), repr(str(database))).replace(
                "dpkg-query ", admindir
            ),
        )
        for part in nvidia_packages.NvidiaPackages().parts()
        if part.name in ("installed", "headers")
    ]
    read = {}
    for in_python in (True, False):
        command = framing.command(parts, python=in_python)
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
        frame = framing.parse(done.stdout.splitlines())
        read[in_python] = {name: frame.part(name) for name in ("installed", "headers")}
    return read


def test_dpkgs_database_read_in_python_is_what_dpkg_query_prints(tmp_path: Path) -> None:
    """On a database of every state the fact meets."""
    (tmp_path / "updates").mkdir()
    (tmp_path / "info").mkdir()
    (tmp_path / "status").write_text(STATUS_DATABASE.format(release=os.uname().release))
    read = read_both_ways(tmp_path)
    assert read[True] == read[False]
    assert read[True]["installed"].lines == [
        "iFR|datacenter-gpu-manager-4-core|1:4.4.1-1",
        "ii |libcuda1|590.48.01-1",
        "ii |libcuda1|590.48.01-1",
        "rc |nvidia-kernel-dkms|580.95.05-1",
        "hi |nvidia-open|590.48.01-1",
    ]
    assert read[True]["headers"].lines[0] == "status|ii "


def test_records_still_in_dpkgs_journal_are_left_to_dpkg_query(tmp_path: Path) -> None:
    """After an interrupted dpkg its journal (updates/) holds records the status file does not
    yet: the Python parts let dpkg-query answer, which applies them first."""
    (tmp_path / "updates").mkdir()
    (tmp_path / "info").mkdir()
    (tmp_path / "status").write_text(STATUS_DATABASE.format(release=os.uname().release))
    (tmp_path / "updates" / "0001").write_text(
        "Package: nvidia-kernel-dkms\nStatus: install ok installed\nArchitecture: amd64\n"
        "Version: 590.48.01-1\nMaintainer: x\nDescription: y\n"
    )
    read = read_both_ways(tmp_path)
    assert read[True] == read[False]
    assert "ii |nvidia-kernel-dkms|590.48.01-1" in read[True]["installed"].lines

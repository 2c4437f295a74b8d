"""A lab node's simulated UEFI firmware: Secure Boot and the machine owner keys (node side,
stdlib only).

A lab node is a container: no firmware of its own, and Docker masks ``/sys/firmware`` with an
empty read-only tmpfs, so facts/secure_boot.py finds no ``/sys/firmware/efi`` (a BIOS boot).
Only the firmware side is simulated; everything above it is the real thing:

- ``/sys/firmware`` gets a tmpfs of the lab's (``FIRMWARE_SOURCE``) with ``efi/efivars``, a bind
  mount of the node's NVRAM, ``efivars`` beside the hardware state (kept across container
  restarts, as a real NVRAM keeps its variables). Its files are efivarfs' layout: 4
  attribute bytes, then the value.
  ``SecureBoot`` and ``SetupMode`` (EFI global variables) are written from the state
  (``firmware.secure_boot``, ``firmware.setup_mode``), ``MokSBStateRT`` (shim's "validation
  disabled") where ``firmware.shim_validation`` is false.
- ``mokutil`` is Debian's real package (installed with apt where a test wants it). libefivar,
  which it reads the variables with, takes a directory for efivarfs only where its file system
  is efivarfs or ``EFIVARFS_PATH`` names it (efivar's efivarfs_probe): ``MOKUTIL_WRAPPER``, at
  ``/usr/local/sbin/mokutil`` ahead of ``/usr/bin`` in root's PATH and sudo's secure_path,
  runs the real one with ``EFIVARFS_PATH`` set. It is there only while the real one is: a
  dpkg hook (``DPKG_HOOK``) puts it there or takes it away after every dpkg run.
- ``mokutil --import <key>`` writes its request (``MokNew``, ``MokAuth``) to the NVRAM as it
  would on a real node; shim's MokManager enrols it at the next boot once someone confirms it
  at the console. ``console_enrol`` is that console step (``gpunode-lab-hw mok-manager``): the
  requested keys join ``MokListRT`` (the list shim gives the running system and
  ``mokutil --test-key``/``--list-enrolled`` read), and the request is gone.
- ``firmware.uefi`` false (the factory state of a lab node, as it always was): no
  ``/sys/firmware/efi`` at all, the NVRAM stays as it is.

Variable names and layouts: the UEFI specification (EFI_GLOBAL_VARIABLE GUID
8be4df61-93ca-11d2-aa0d-00e098032b8c: SecureBoot, SetupMode, one byte each), shim's
SHIM_LOCK_GUID 605dab50-e046-4300-abb6-3dd810dd8b23 (MokListRT, MokNew, MokAuth,
MokSBStateRT), lcp/mokutil src/mokutil.c @9ae73db13e2bf0c610b0dcced5410fd6dc61f68a; efivar's
efivarfs.c for ``EFIVARFS_PATH``; read 2026-12-07.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Any

from . import hwstate

FIRMWARE_DIR = "/sys/firmware"
EFIVARS_DIR = f"{FIRMWARE_DIR}/efi/efivars"
# Beside the hardware state: /var/lib/gpunode-lab/efivars on a node.
NVRAM_NAME = "efivars"
# The tmpfs's source name in /proc/self/mountinfo: the lab's mount, never Docker's mask.
FIRMWARE_SOURCE = "gpunode-lab-firmware"
EFI_GLOBAL = "8be4df61-93ca-11d2-aa0d-00e098032b8c"
SHIM_LOCK = "605dab50-e046-4300-abb6-3dd810dd8b23"
# EFI_VARIABLE_NON_VOLATILE | BOOTSERVICE_ACCESS | RUNTIME_ACCESS, and without NON_VOLATILE:
# SecureBoot, SetupMode and shim's *RT mirrors are volatile copies made at every boot.
NV_BS_RT = 7
BS_RT = 6
SECURE_BOOT = f"SecureBoot-{EFI_GLOBAL}"
SETUP_MODE = f"SetupMode-{EFI_GLOBAL}"
MOK_LIST_RT = f"MokListRT-{SHIM_LOCK}"
MOK_SB_STATE_RT = f"MokSBStateRT-{SHIM_LOCK}"
MOK_NEW = f"MokNew-{SHIM_LOCK}"
MOK_AUTH = f"MokAuth-{SHIM_LOCK}"

REAL_MOKUTIL = "/usr/bin/mokutil"
MOKUTIL_WRAPPER = "/usr/local/sbin/mokutil"
# The wrapper's text is kept here; the dpkg hook copies it to MOKUTIL_WRAPPER.
# Beside the doubles' code (hwsim.NODE_LIBRARY), not among the captured templates.
MOKUTIL_WRAPPER_SOURCE = "/usr/local/lib/gpunode-lab/mokutil"
MOKUTIL_WRAPPER_TEXT = f"""#!/bin/sh
# gpunode lab: Debian's real mokutil, reading the lab node's simulated UEFI variables
# (lab.hwsim.firmware): libefivar takes {EFIVARS_DIR} only where EFIVARFS_PATH names it.
EFIVARFS_PATH={EFIVARS_DIR}/
export EFIVARFS_PATH
exec {REAL_MOKUTIL} "$@"
"""
DPKG_HOOK = "/etc/dpkg/dpkg.cfg.d/gpunode-lab-mokutil"
DPKG_HOOK_TEXT = (
    "# gpunode lab (lab.hwsim.firmware): the mokutil wrapper is there while mokutil is.\n"
    f"post-invoke=if [ -x {REAL_MOKUTIL} ]; then install -m 0755 {MOKUTIL_WRAPPER_SOURCE} "
    f"{MOKUTIL_WRAPPER}; else rm -f {MOKUTIL_WRAPPER}; fi\n"
)
# Mounts /sys/firmware at every boot (the container's mounts are new at each start).
UNIT = "gpunode-lab-firmware.service"
UNIT_TEXT = b"""\
[Unit]
Description=The lab node's simulated UEFI firmware variables (/sys/firmware/efi/efivars)
DefaultDependencies=no
After=local-fs.target
Before=sysinit.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/gpunode-lab-hw firmware
RemainAfterExit=yes

[Install]
WantedBy=sysinit.target
"""


class FirmwareError(Exception):
    pass


def factory() -> dict[str, Any]:
    """A lab node's firmware as it always was: no UEFI boot (a BIOS boot)."""
    return {"uefi": False, "secure_boot": False, "setup_mode": False, "shim_validation": True}


def of(state: dict[str, Any]) -> dict[str, Any]:
    """The firmware part of a hardware state (a state written before it existed: factory)."""
    return {**factory(), **(state.get("firmware") or {})}


def _mounted(path: str, mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """The sources of the mounts at ``path``, bottom first."""
    sources = []
    with open(mountinfo, encoding="utf-8") as lines:
        for line in lines:
            fields = line.split()
            if len(fields) > 4 and fields[4] == path and " - " in line:
                sources.append(line.split(" - ", 1)[1].split()[1])
    return sources


def _write_variable(directory: Path, name: str, attributes: int, value: bytes) -> None:
    path = directory / name
    data = attributes.to_bytes(4, "little") + value
    with contextlib.suppress(FileNotFoundError):
        if path.read_bytes() == data:
            return
    temporary = directory / f".{name}.tmp"
    temporary.write_bytes(data)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


def nvram_dir() -> Path:
    return hwstate.state_path().parent / NVRAM_NAME


def on_node() -> bool:
    """Whether this is the node's own state (a state elsewhere is a test's: only its files
    change, nothing is mounted)."""
    return str(hwstate.state_path()) == hwstate.DEFAULT_STATE_PATH


def apply(state: dict[str, Any]) -> None:
    """Make the NVRAM's variables, and on the node /sys/firmware and the mokutil wrapper, what
    ``state``'s firmware says."""
    firmware = of(state)
    directory = nvram_dir()
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    _write_variable(directory, SECURE_BOOT, BS_RT, bytes([1 if firmware["secure_boot"] else 0]))
    _write_variable(directory, SETUP_MODE, BS_RT, bytes([1 if firmware["setup_mode"] else 0]))
    if firmware["shim_validation"]:
        (directory / MOK_SB_STATE_RT).unlink(missing_ok=True)
    else:
        _write_variable(directory, MOK_SB_STATE_RT, BS_RT, b"\x01")
    if on_node():
        _mount(bool(firmware["uefi"]), str(directory))
        sync_mokutil_wrapper()


def _mount(uefi: bool, nvram: str) -> None:
    ours = FIRMWARE_SOURCE in _mounted(FIRMWARE_DIR)
    if uefi and not ours:
        _run("mount", "-t", "tmpfs", "-o", "mode=0755,size=1m", FIRMWARE_SOURCE, FIRMWARE_DIR)
        os.makedirs(EFIVARS_DIR, mode=0o755)
        _run("mount", "--bind", nvram, EFIVARS_DIR)
    elif not uefi and ours:
        if _mounted(EFIVARS_DIR):
            _run("umount", EFIVARS_DIR)
        _run("umount", FIRMWARE_DIR)


def _run(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[:200]
        raise FirmwareError(f"{' '.join(command)}: {said}")


def sync_mokutil_wrapper(root: str = "") -> bool:
    """The wrapper where the real mokutil is installed, none where it is not (what the dpkg
    hook does); True where it is there."""
    wrapper = Path(root + MOKUTIL_WRAPPER)
    if not os.access(root + REAL_MOKUTIL, os.X_OK):
        wrapper.unlink(missing_ok=True)
        return False
    if not wrapper.exists() or wrapper.read_text(encoding="utf-8") != MOKUTIL_WRAPPER_TEXT:
        wrapper.write_text(MOKUTIL_WRAPPER_TEXT, encoding="utf-8")
    os.chmod(wrapper, 0o755)
    return True


def console_enrol() -> int:
    """What shim's MokManager does at the next boot when someone at the console confirms the
    pending enrolment: the requested keys (``MokNew``: EFI_SIGNATURE_LISTs, as ``MokList``
    holds them) join the enrolled ones, and the request is gone. Returns the bytes enrolled;
    raises FirmwareError where nothing was requested."""
    directory = nvram_dir()
    try:
        requested = (directory / MOK_NEW).read_bytes()[4:]
    except FileNotFoundError:
        raise FirmwareError("no enrolment request (mokutil --import) is pending") from None
    if not requested:
        raise FirmwareError(f"{MOK_NEW} holds no key")
    try:
        enrolled = (directory / MOK_LIST_RT).read_bytes()[4:]
    except FileNotFoundError:
        enrolled = b""
    _write_variable(directory, MOK_LIST_RT, BS_RT, enrolled + requested)
    for name in (MOK_NEW, MOK_AUTH):
        (directory / name).unlink(missing_ok=True)
    return len(requested)

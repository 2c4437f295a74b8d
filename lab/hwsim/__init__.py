"""Simulated GPU-server hardware for lab nodes (control side).

Lab nodes are Debian 12 systemd containers with no GPU, InfiniBand HCA or NVMe drive. They get
doubles of ``nvidia-smi``, ``ibstat`` and ``nvme`` that answer as the real tools do (layouts
from the real captures in ``tests/fixtures``) from a mutable state file, so deploys converge
settings for real and tests inject drift with ``gpunode-lab-hw``. Only lab nodes get them.

``node_files(profile, hostname)`` is everything to put on a node. Node layout:

- ``/usr/local/lib/gpunode-lab/gpunode_lab_hw/``: the node-side modules (stdlib only, run by the
  node's ``/usr/bin/python3``): ``hwstate``, ``nvidia_smi``, ``ibstat``, ``nvme``, ``hwctl``;
- ``/usr/bin/nvidia-smi``, ``/usr/sbin/ibstat``, ``/usr/sbin/nvme``,
  ``/usr/local/sbin/gpunode-lab-hw``, ``/usr/local/sbin/modinfo``: shell wrappers running
  those modules;
- ``/usr/local/share/gpunode-lab/``: the captured outputs used as templates;
- ``/etc/systemd/system/gpunode-lab-gpu-devices.service``: makes ``/dev/nvidiaN`` of the
  present GPUs at boot (``gpunode-lab-hw devices``), as the loaded driver would;
- ``/var/lib/gpunode-lab/hardware.json``: the hardware state (``profiles.initial_state``);
- the simulated UEFI firmware (``firmware``: Secure Boot and the machine owner keys under
  ``/sys/firmware/efi/efivars``, for the real mokutil): its boot unit
  ``/etc/systemd/system/gpunode-lab-firmware.service``, the mokutil wrapper's text and the dpkg
  hook that puts it at ``/usr/local/sbin/mokutil`` while mokutil is installed;
- ``/lib/modules/<release>/modules.dep`` listing ``nvidia.ko``, as depmod leaves it on a GPU
  node whose driver is built: the simulated GPUs have a loaded driver from the first boot, and
  Container Toolkit 1.18's ``nvidia-cdi-refresh`` units read that file. The container shares
  this machine's kernel, so ``<release>`` is this machine's.

A lab VM (``lab.vm``, ``node_files(..., vm=True)``) has a real kernel and real (emulated) NVMe
drives: it gets no ``nvme`` double (the real nvme-cli lists its drives) and no modules.dep
(its kernel's own is depmod's; the VM's first boot adds the ``nvidia.ko`` line to it), and a
unit that does at each of its (real) reboots what ``gpunode-lab-hw reboot`` does to a
container's GPUs (``VM_BOOT_UNIT``): the installed stand-in driver is the loaded one.

The lab dpkg-diverts ``DIVERTED_PATHS`` so installing the real packages cannot overwrite the
doubles.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from . import firmware, hwstate, modinfo
from .profiles import PROFILES, initial_state

__all__ = ["DIVERTED_PATHS", "PROFILES", "VM_DIVERTED_PATHS", "initial_state", "node_files"]

DIVERTED_PATHS = ("/usr/bin/nvidia-smi", "/usr/sbin/ibstat", "/usr/sbin/nvme")
# A VM's NVMe drives are real to its kernel: the real nvme-cli stays where it is.
REAL_IN_VMS = ("/usr/sbin/nvme",)
VM_DIVERTED_PATHS = tuple(path for path in DIVERTED_PATHS if path not in REAL_IN_VMS)

NODE_LIBRARY = "/usr/local/lib/gpunode-lab"
NODE_PACKAGE = "gpunode_lab_hw"
NODE_MODULES = ("hwstate", "nvidia_smi", "ibstat", "nvme", "hwctl", "firmware")
COMMANDS = {
    "/usr/bin/nvidia-smi": "nvidia_smi",
    "/usr/sbin/ibstat": "ibstat",
    "/usr/sbin/nvme": "nvme",
    "/usr/local/sbin/gpunode-lab-hw": "hwctl",
}
MODINFO_PATH = "/usr/local/sbin/modinfo"
# Makes /dev/nvidiaN at every boot (the container's /dev is new at each start); the lab
# enables it once the node has booted (``DEVICES_UNIT``).
DEVICES_UNIT = "gpunode-lab-gpu-devices.service"
DEVICES_UNIT_TEXT = b"""\
[Unit]
Description=Device files of the lab node's simulated GPUs (/dev/nvidiaN)
DefaultDependencies=no
After=local-fs.target
Before=sysinit.target slurmd.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/gpunode-lab-hw devices
RemainAfterExit=yes

[Install]
WantedBy=sysinit.target
"""
# A lab VM reboots for real (its kernel restarts), so its boot does what the lab's reboot
# command (``gpunode-lab-hw reboot``) does to a container's GPUs: the simulated GPUs load the
# installed stand-in driver, and lose the settings a driver does not keep. At every boot but
# the first (the seed that brings it is unpacked during the first boot, after systemd read its
# units), before the units that apply GPU settings at boot (hwctl.BOOT_UNITS).
VM_BOOT_UNIT = "gpunode-lab-vm-gpus.service"
VM_BOOT_UNIT_TEXT = b"""\
[Unit]
Description=The lab VM's simulated GPUs load the installed driver (a real reboot)
DefaultDependencies=no
After=local-fs.target
Before=sysinit.target gpunode-gpu-settings.service slurmd.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/gpunode-lab-hw reboot
RemainAfterExit=yes
"""
# Wanted by sysinit.target through a drop-in: the seed is a tar of plain files, no symlinks.
VM_BOOT_DROP_IN = (
    f"/etc/systemd/system/sysinit.target.d/{VM_BOOT_UNIT.removesuffix('.service')}.conf"
)
# The query doubles whose answers are replayed for the same state (hwstate, "replayed answers").
REPLAYED = ("nvidia_smi", "ibstat", "nvme")
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
# What depmod writes for a DKMS-built NVIDIA module (no dependencies of its own).
MODULES_DEP = b"updates/dkms/nvidia.ko:\n"
TEMPLATES = (
    "nvidia-smi-xml/a100-sxm4-v12.xml",
    "nvidia-smi-xml/a10g.xml",
    "nvidia-smi-capture/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt",
)


def simulator_paths() -> tuple[str, ...]:
    """Where in a node's system directories the doubles live (``lab up`` rewrites them): what
    the lab's file integrity check leaves out, as production has the real tools there."""
    paths = (
        NODE_LIBRARY,
        "/usr/local/share/gpunode-lab",
        *COMMANDS,
        MODINFO_PATH,
        *DIVERTED_PATHS,
        f"/etc/systemd/system/{DEVICES_UNIT}",
        f"/etc/systemd/system/multi-user.target.wants/{DEVICES_UNIT}",
        f"/etc/systemd/system/{firmware.UNIT}",
        f"/etc/systemd/system/sysinit.target.wants/{firmware.UNIT}",
        firmware.MOKUTIL_WRAPPER,
        firmware.DPKG_HOOK,
        # modules.dep of the host's kernel, whose modules a container does not have
        f"/usr/lib/modules/{os.uname().release}",
    )
    return tuple(dict.fromkeys(paths))


def node_files(profile: str, hostname: str, vm: bool = False) -> dict[str, tuple[bytes, int]]:
    """Absolute node path -> (content, mode) of every file a ``profile`` lab node needs
    (``vm``: a lab VM's, with its real NVMe drives and kernel modules)."""
    package = f"{NODE_LIBRARY}/{NODE_PACKAGE}"
    files = {
        f"{package}/__init__.py": (
            b'"""gpunode lab hardware doubles, installed from lab.hwsim."""\n',
            0o644,
        )
    }
    source = Path(__file__).parent
    for module in NODE_MODULES:
        files[f"{package}/{module}.py"] = ((source / f"{module}.py").read_bytes(), 0o644)
    code = code_digest()
    for command, module in COMMANDS.items():
        if vm and command in REAL_IN_VMS:
            continue
        files[command] = (_wrapper(command, module, code), 0o755)
    # Ahead of the real one in PATH: answers for the stand-in NVIDIA module only, in shell.
    files[MODINFO_PATH] = (modinfo.script().encode(), 0o755)
    files[f"/etc/systemd/system/{DEVICES_UNIT}"] = (DEVICES_UNIT_TEXT, 0o644)
    for template in TEMPLATES:
        files[f"{hwstate.DEFAULT_SHARE_DIR}/{Path(template).name}"] = (
            (FIXTURES / template).read_bytes(),
            0o644,
        )
    state = hwstate.dumps(initial_state(profile, hostname))
    files[hwstate.DEFAULT_STATE_PATH] = (state.encode(), 0o644)
    if vm:
        # A VM's firmware is qemu's own: nothing of it is simulated.
        files[f"/etc/systemd/system/{VM_BOOT_UNIT}"] = (VM_BOOT_UNIT_TEXT, 0o644)
        files[VM_BOOT_DROP_IN] = (f"[Unit]\nWants={VM_BOOT_UNIT}\n".encode(), 0o644)
    else:
        files[f"/lib/modules/{os.uname().release}/modules.dep"] = (MODULES_DEP, 0o644)
        files[f"/etc/systemd/system/{firmware.UNIT}"] = (firmware.UNIT_TEXT, 0o644)
        files[firmware.MOKUTIL_WRAPPER_SOURCE] = (firmware.MOKUTIL_WRAPPER_TEXT.encode(), 0o644)
        files[firmware.DPKG_HOOK] = (firmware.DPKG_HOOK_TEXT.encode(), 0o644)
    return files


def code_digest() -> str:
    """The doubles' code and templates, as the replayed answers' directory names them: an
    answer kept by other code is never replayed."""
    digest = hashlib.sha256()
    source = Path(__file__).parent
    for path in [source / f"{module}.py" for module in NODE_MODULES] + [
        FIXTURES / template for template in TEMPLATES
    ]:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _replay(module: str, code: str) -> str:
    """sh that replays an answer kept for this state and these arguments (see hwstate), and
    otherwise tells the double it may keep its answer."""
    answers = f"${{state%/*}}/{hwstate.ANSWERS_DIR}/{code}-${{digest%% *}}"
    return (
        f'state="${{{hwstate.STATE_ENV}:-{hwstate.DEFAULT_STATE_PATH}}}"\n'
        f"name={module}\n"
        'for argument in "$@"; do\n'
        '  case "$argument" in *..*|*[!A-Za-z0-9.,=_-]*) name=; break ;; esac\n'
        '  name="$name+$argument"\n'
        "done\n"
        'if [ -n "$name" ] && [ "${#name}" -le 200 ] && digest=$(md5sum < "$state" 2>/dev/null)'
        "; then\n"
        f'  answer="{answers}/$name"\n'
        '  if [ -f "$answer" ] && cat -- "$answer" 2>/dev/null; then exit 0; fi\n'
        f'  if [ -f "$answer{hwstate.ASCTIME_SUFFIX}" ] && '
        "now=$(LC_ALL=C date '+%a %b %e %H:%M:%S %Y') && "
        f'sed "s/{hwstate.ASCTIME_MARK}/$now/" -- "$answer{hwstate.ASCTIME_SUFFIX}" 2>/dev/null'
        "; then exit 0; fi\n"
        f'  export {hwstate.ANSWER_NAME_ENV}="$name" {hwstate.ANSWER_CODE_ENV}={code}\n'
        "fi\n"
    )


def _wrapper(command: str, module: str, code: str) -> bytes:
    # -P: the caller's working directory must not shadow the package. -S: the doubles are
    # standard library only, and every no-op deploy starts them a dozen times.
    run = (
        f"exec /usr/bin/env PYTHONPATH={NODE_LIBRARY} "
        f'/usr/bin/python3 -S -P -m {NODE_PACKAGE}.{module} "$@"\n'
    )
    dispatch = ""
    if module in REPLAYED:
        dispatch = _replay(module, code)
    return (
        f"#!/bin/sh\n# gpunode lab double of {Path(command).name}, from lab.hwsim.\n"
        + dispatch
        + run
    ).encode()

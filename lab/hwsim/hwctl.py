"""``gpunode-lab-hw``: read and change a lab node's simulated hardware (node side, stdlib).

Tests use it to look at what a deploy converged and to inject drift or faults::

    gpunode-lab-hw show [PATH]           # the state (or the part at PATH) as JSON
    gpunode-lab-hw set PATH VALUE        # e.g. set gpus.3.present false
    gpunode-lab-hw reboot                # what a reboot does to the GPUs (hwstate.reboot)
    gpunode-lab-hw reboot --boot         # ... then what the boot does for the GPU units
    gpunode-lab-hw devices               # /dev/nvidiaN of the GPUs, as the driver makes them
    gpunode-lab-hw firmware              # /sys/firmware as the state's firmware says (boot)
    gpunode-lab-hw mok-manager           # the console step: confirm the pending MOK enrolment

PATH is dotted, list positions are numbers: ``gpus.3.ecc_errors.volatile.dram_uncorrectable``,
``ib_ports.0.state``, ``firmware.secure_boot`` (lab.hwsim.firmware: a change of the firmware
takes effect at once). It must already exist, so a typo fails instead of adding a key nobody
reads. VALUE is JSON (``false``, ``12``, ``"Down"``); text that is not JSON is taken as a
string, so ``set ib_ports.0.state Down`` works unquoted.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from . import firmware, hwstate

USAGE = (
    "usage: gpunode-lab-hw show [PATH] | set PATH VALUE | reboot [--boot] | devices"
    " | firmware | mok-manager\n"
)
# The units a boot starts that read or change the GPUs, in the order systemd starts them:
# gpunode's GPU settings unit (roles.gpu_settings.BOOT_UNIT: Before=slurmd.service), slurmd.
BOOT_UNITS = ("gpunode-gpu-settings.service", "slurmd.service")
# The NVIDIA driver's character devices: major 195, minor the GPU's minor number
# (nvidia-modprobe makes /dev/nvidiaN so; nvidia-smi -q reports the minor number).
NVIDIA_MAJOR = 195
DEVICE_DIR_ENV = "GPUNODE_LAB_DEV_DIR"
EXIT_USAGE = 2


class BadPath(Exception):
    pass


def main(argv: Sequence[str]) -> int:
    command, *arguments = argv or [""]
    try:
        if command == "show" and len(arguments) <= 1:
            found = lookup(hwstate.load(), arguments[0]) if arguments else hwstate.load()
            sys.stdout.write(json.dumps(found, indent=2) + "\n")
        elif command == "set" and len(arguments) == 2:
            path, text = arguments
            with hwstate.mutate() as state:
                # A state written before the lab simulated firmware has its factory one.
                state.setdefault("firmware", firmware.factory())
                assign(state, path, parse_value(text))
            if path.split(".")[0] == "firmware":
                firmware.apply(hwstate.load())
        elif command == "firmware" and not arguments:
            firmware.apply(hwstate.load())
        elif command == "mok-manager" and not arguments:
            enrolled = firmware.console_enrol()
            sys.stdout.write(f"MokManager: {enrolled} bytes of keys enrolled (console confirmed)\n")
        elif command == "devices" and not arguments:
            make_device_files(hwstate.load(), os.environ.get(DEVICE_DIR_ENV, "/dev"))
        elif command == "reboot" and arguments in ([], ["--boot"]):
            with hwstate.mutate() as state:
                hwstate.reboot(state)
            if arguments:
                boot()
        else:
            sys.stderr.write(USAGE)
            return EXIT_USAGE
    except (BadPath, firmware.FirmwareError) as error:
        sys.stderr.write(f"gpunode-lab-hw: {error}\n")
        return 1
    return 0


def boot() -> None:
    """What the node's boot does after a reboot for the enabled ``BOOT_UNITS``: they start
    again, in one systemd transaction, so their own ordering (``Before=``/``After=``) decides
    which runs first, as at boot. The container itself keeps running. A unit that fails is
    said on stderr and does not fail the reboot, as a failed unit does not stop a boot."""
    units = [
        unit
        for unit in BOOT_UNITS
        if subprocess.run(
            ["systemctl", "is-enabled", "--quiet", unit], check=False, stdin=subprocess.DEVNULL
        ).returncode
        == 0
    ]
    if not units:
        return
    # Stopped first: restarting a running slurmd alone would not wait for the settings unit.
    subprocess.run(["systemctl", "stop", *units], check=False, stdin=subprocess.DEVNULL)
    started = subprocess.run(["systemctl", "start", *units], check=False, stdin=subprocess.DEVNULL)
    if started.returncode != 0:
        sys.stderr.write(f"gpunode-lab-hw: boot: a unit of {', '.join(units)} failed\n")


def make_device_files(state: Any, directory: str) -> list[str]:
    """/dev/nvidiaN (character device 195:N, mode 0666) for every present GPU, as the loaded
    driver has them made; made ones are kept, as on a node whose GPU falls off the bus later.

    Slurm's gres.conf names them (File=) and slurmd looks at them; nothing opens them.
    """
    made = []
    for gpu in state["gpus"]:
        minor = gpu.get("minor_number")
        if not gpu.get("present") or not isinstance(minor, int):
            continue
        path = os.path.join(directory, f"nvidia{minor}")
        try:
            if stat.S_ISCHR(os.stat(path).st_mode):
                continue
            os.unlink(path)
        except FileNotFoundError:
            pass
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, minor))
        os.chmod(path, 0o666)
        made.append(path)
    return made


def parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def lookup(state: Any, path: str) -> Any:
    found = state
    for step in path.split("."):
        found = _child(found, step, path)
    return found


def assign(state: Any, path: str, value: Any) -> None:
    parent_path, _, last = path.rpartition(".")
    parent = lookup(state, parent_path) if parent_path else state
    _child(parent, last, path)  # the key must exist already
    parent[int(last) if isinstance(parent, list) else last] = value


def _child(container: Any, step: str, path: str) -> Any:
    if isinstance(container, list) and step.isdigit() and int(step) < len(container):
        return container[int(step)]
    if isinstance(container, dict) and step in container:
        return container[step]
    raise BadPath(f"no {step!r} in state path {path!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

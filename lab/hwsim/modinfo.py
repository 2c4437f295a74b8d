"""``modinfo`` for a lab node's stand-in NVIDIA kernel module (node side, stdlib only).

A lab node is a container: it loads no kernel module, and the stand-in driver packages build
none. They record instead what a reboot would load (``hwstate.INSTALLED_DRIVER_VERSION_FILE``
and its flavour); this double answers ``modinfo [-F field] nvidia`` from that record, as the
real ``modinfo`` answers from the module a real package builds, so the product reads a lab
node exactly as a real one. Every other call goes to the real ``modinfo``.

It sits at ``/usr/local/sbin/modinfo``, ahead of ``/usr/sbin`` in sudo's secure_path and root's
PATH; nothing of the real kmod package is replaced.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from . import hwstate

REAL_MODINFO = ("/usr/sbin/modinfo", "/sbin/modinfo")
MODULE = "nvidia"
FLAVOUR_FILE = "installed-kernel-module-flavour"
# modinfo -F license of NVIDIA's modules: the open ones are dual-licensed.
LICENSES = {"open": "Dual MIT/GPL", "proprietary": "NVIDIA"}


def installed_module() -> dict[str, str] | None:
    """Fields of the installed stand-in module, or None when no stand-in driver is installed."""
    directory = hwstate.state_path().parent
    try:
        version = (directory / hwstate.INSTALLED_DRIVER_VERSION_FILE).read_text().strip()
    except OSError:
        return None
    if not version:
        return None
    try:
        flavour = (directory / FLAVOUR_FILE).read_text().strip()
    except OSError:
        flavour = "open"
    return {
        "filename": f"/lib/modules/{os.uname().release}/updates/dkms/nvidia.ko",
        "version": version,
        "license": LICENSES.get(flavour, LICENSES["open"]),
        "description": "NVIDIA kernel module (gpunode lab stand-in)",
    }


def answer(argv: Sequence[str]) -> tuple[int, str] | None:
    """(exit status, output) for a call about the NVIDIA module; None for any other call."""
    arguments = list(argv)
    field = None
    if len(arguments) == 3 and arguments[0] == "-F":
        field, arguments = arguments[1], arguments[2:]
    if arguments != [MODULE]:
        return None
    module = installed_module()
    if module is None:
        return None  # the real modinfo says the module is not found
    if field is None:
        return 0, "".join(
            f"{key}:{' ' * max(1, 16 - len(key))}{value}\n" for key, value in module.items()
        )
    return 0, f"{module[field]}\n" if field in module else ""


def main(argv: Sequence[str]) -> int:
    answered = answer(argv)
    if answered is not None:
        status, output = answered
        sys.stdout.write(output)
        return status
    for real in REAL_MODINFO:
        if os.access(real, os.X_OK):
            os.execv(real, [real, *argv])
    sys.stderr.write(f"modinfo: ERROR: Module {argv[-1] if argv else ''} not found.\n")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Double of nvme-cli's ``nvme list -o json`` for lab nodes, which have no NVMe drive.

It lists the ``nvme`` drives of the simulated hardware (``hwstate``) that are present, with the
keys and key order of nvme-cli 2.x (Debian 12 ships 2.3; ``json_list_item`` in
nvme-print-json.c) and the layout of its json-c pretty printer: two-space indent, no space
after the colon. No capture of this command is in ``tests/fixtures``; drive models and sizes
come from ``profiles``. Any other nvme-cli command fails with a message on stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from . import hwstate
from .hwstate import State

JSON_LIST_INVOCATIONS = (
    ["list", "-o", "json"],
    ["list", "-o=json"],
    ["list", "--output-format", "json"],
    ["list", "--output-format=json"],
)


def main(argv: Sequence[str]) -> int:
    if list(argv) not in JSON_LIST_INVOCATIONS:
        sys.stderr.write(
            f"nvme (gpunode lab double): not simulated: {' '.join(argv)!r} "
            "(only 'nvme list -o json' is)\n"
        )
        return 1
    drives = [drive for drive in hwstate.load()["nvme"] if drive["present"]]
    listing = {"Devices": [list_item(drive) for drive in drives]}
    sys.stdout.write(hwstate.answered(json.dumps(listing, indent=2, separators=(",", ":")) + "\n"))
    return 0


def list_item(drive: State) -> State:
    return {
        "NameSpace": drive["namespace"],
        "DevicePath": drive["device_path"],
        "GenericPath": drive["generic_path"],
        "Firmware": drive["firmware"],
        "ModelNumber": drive["model"],
        "SerialNumber": drive["serial"],
        "UsedBytes": drive["used_bytes"],
        "MaximumLBA": drive["physical_size"] // drive["sector_size"],
        "PhysicalSize": drive["physical_size"],
        "SectorSize": drive["sector_size"],
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

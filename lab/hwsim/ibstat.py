"""Double of ``ibstat`` (infiniband-diags) for lab nodes, which have no HCA (node side, stdlib).

It prints the ``ib_ports`` of the simulated hardware (``hwstate``) in the layout of the real
captures ``tests/fixtures/ibstat/ibstat.47.0.{a100,h100}.all.active.0``, line for line: CAs in
name order as ``umad_get_cas_names`` sorts them (mlx5_1, mlx5_10, mlx5_11, mlx5_2, ...), tab
indentation, no blank line between CAs.

``ibstat`` lists every CA, ``ibstat CA`` one of them, ``ibstat -l`` the CA names. A node with
no CA answers as ``ibstat`` does where the ``ib_umad`` module is not loaded.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from . import hwstate
from .hwstate import State

CA_FIELDS = (
    ("ca_type", "CA type"),
    ("number_of_ports", "Number of ports"),
    ("firmware_version", "Firmware version"),
    ("hardware_version", "Hardware version"),
    ("node_guid", "Node GUID"),
    ("system_image_guid", "System image GUID"),
)
PORT_FIELDS = (
    ("state", "State"),
    ("physical_state", "Physical state"),
    ("rate", "Rate"),
    ("base_lid", "Base lid"),
    ("lmc", "LMC"),
    ("sm_lid", "SM lid"),
    ("capability_mask", "Capability mask"),
    ("port_guid", "Port GUID"),
    ("link_layer", "Link layer"),
)
EXIT_PANIC = 255  # ibpanic() exits with -1


def main(argv: Sequence[str]) -> int:
    cas = cas_by_name(hwstate.load())
    pid = os.getpid()
    if not cas:
        sys.stderr.write(
            f"ibwarn: [{pid}] umad_init: can't read ABI version from "
            "/sys/class/infiniband_mad/abi_version (No such file or directory): "
            "is ib_umad module loaded?\n"
            f"ibpanic: [{pid}] main: can't init UMAD library: (No such file or directory)\n"
        )
        return EXIT_PANIC
    if list(argv) in (["-l"], ["--list_of_cas"]):
        sys.stdout.write(hwstate.answered("".join(f"{name}\n" for name in cas)))
        return 0
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        sys.stderr.write(f"ibstat (gpunode lab double): not simulated: {' '.join(argv)}\n")
        return EXIT_PANIC
    names = list(argv) or list(cas)
    for name in names:
        if name not in cas:
            sys.stderr.write(
                f"ibpanic: [{pid}] main: stat of IB device '{name}' failed: "
                "No such file or directory\n"
            )
            return EXIT_PANIC
    sys.stdout.write(hwstate.answered("".join(render_ca(name, cas[name]) for name in names)))
    return 0


def cas_by_name(state: State) -> dict[str, list[State]]:
    """Ports grouped by CA, CAs in the order ibstat lists them."""
    cas: dict[str, list[State]] = {}
    for port in state["ib_ports"]:
        cas.setdefault(port["ca"], []).append(port)
    return dict(sorted(cas.items()))


def render_ca(name: str, ports: list[State]) -> str:
    ca = {**ports[0], "number_of_ports": len(ports)}
    lines = [f"CA '{name}'"]
    lines += [f"\t{label}: {ca[key]}" for key, label in CA_FIELDS]
    for port in ports:
        lines.append(f"\tPort {port['port']}:")
        lines += [f"\t\t{label}: {port[key]}" for key, label in PORT_FIELDS]
    return "".join(f"{line}\n" for line in lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

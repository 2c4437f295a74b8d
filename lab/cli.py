"""``gpunode lab up/down/status``: the lab's commands, plugged into gpunode's command line.

gpunode's CLI knows no lab: it loads every ``gpunode.commands`` entry point (pyproject.toml
registers this module's ``register``), and each adds its own sub-command.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lab import (
    DEFAULT_PROFILES,
    DEFAULT_RELEASE,
    SCRATCH_DISK_MIB,
    Lab,
    LabError,
    LabNode,
    releases_of,
    vm,
)


def cmd_lab_up(args: argparse.Namespace) -> int:
    lab = Lab()
    # --nodes 0 --vms N: VMs only, the container nodes are left as they are.
    nodes: list[LabNode] = []
    if args.nodes or args.vms is None:
        nodes = lab.up(
            args.nodes,
            args.profiles.split(","),
            scratch_disks=args.scratch_disks,
            scratch_disk_mib=args.scratch_disk_mib,
            releases=releases_of(args.release),
        )
    vms: list[vm.LabVm] = []
    if args.vms is not None:
        vms = vm.up_vms(
            lab,
            args.vms,
            profiles=(args.vm_profiles or vm.DEFAULT_VM_PROFILE).split(","),
            releases=releases_of(args.release),
            memory_mib=args.vm_memory_mib,
            nvme_drives=args.vm_nvme_drives,
            nvme_mib=args.vm_nvme_mib,
            listed=not args.vms_unlisted,
        )
    print(
        f"{'node':<9} {'address':<14} {'profile':<10} {'release':<9} {'boot s':>7} {'RAM MiB':>8}"
    )
    for node in [*nodes, *vms]:
        kind = f"  VM, {node.accel}, kernel {node.kernel}" if isinstance(node, vm.LabVm) else ""
        print(
            f"{node.name:<9} {node.address:<14} {node.profile:<10} {node.release:<9} "
            f"{node.boot_s:>7.2f} {node.memory_mib:>8.1f}{kind}"
        )
    if args.slurm:
        controller = lab.slurm_up()
        members = ", ".join(node.name for node in lab.slurm_members()) or "none"
        print(
            f"Slurm controller {controller.name} at {controller.address} ({controller.release}: "
            f"slurmctld, munge); its nodes once converged: {members}"
        )
    if args.scratch_disks and nodes:
        disks = ", ".join(f"/dev/nvme{index}n1" for index in range(args.scratch_disks))
        print(f"scratch disks on every node: {disks} ({args.scratch_disk_mib} MiB each)")
    if vms:
        print(
            f"NVMe drives of every VM: {args.vm_nvme_drives} emulated, {args.vm_nvme_mib} MiB "
            "each (serials LABVM...)"
        )
    print(f"ssh -i {lab.key_path} -o UserKnownHostsFile={lab.known_hosts_path} debian@ADDRESS")
    return 0


def cmd_lab_down(args: argparse.Namespace) -> int:
    Lab().down(keep_image=args.keep_image)
    print("lab removed")
    return 0


def cmd_lab_status(_: argparse.Namespace) -> int:
    lab = Lab()
    print(f"lab {lab.name} in {lab.state_dir}")
    nodes, controller, guests = lab.nodes(), lab.slurm_controller(), lab.vms()
    if not (nodes or controller or guests):
        print("no lab nodes; bring some up with `gpunode lab up --nodes 2`")
        return 0
    print(f"{'name':<9} {'address':<14} {'profile':<10} release")
    for node in nodes:
        print(f"{node.name:<9} {node.address:<14} {node.profile:<10} {node.release}")
    if controller is not None:
        role = "slurmctld"
        print(f"{controller.name:<9} {controller.address:<14} {role:<10} {controller.release}")
    for guest in guests:
        state = "running" if vm.qemu_running(guest) else "stopped"
        print(
            f"{guest.name:<9} {guest.address:<14} {guest.profile:<10} {guest.release:<9} "
            f"VM {state}, {guest.accel}, kernel {guest.kernel}, "
            f"{len(guest.nvme_serials)} NVMe drives"
            + ("" if guest.listed else ", not in inventories/lab.py")
        )
    return 0


def reporting_lab_errors(command: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(command(args))
        except LabError as error:
            print(f"gpunode lab: {error}", file=sys.stderr)
            return 2

    return run


def register(commands: Any) -> None:
    """Add ``lab`` to gpunode's sub-commands (``commands``: argparse's sub-parsers)."""
    lab = commands.add_parser("lab", help="local fleet of Debian 12 / Debian 13 lab nodes")
    lab_commands = lab.add_subparsers(dest="lab_command", required=True)
    up = lab_commands.add_parser("up", help="bring up N nodes (keeps running ones)")
    up.add_argument("--nodes", type=int, default=2, help="container nodes (0 with --vms: VMs only)")
    up.add_argument(
        "--vms",
        type=int,
        default=None,
        metavar="N",
        help="also N VMs with a real kernel (qemu; KVM where it boots, else TCG), group vms",
    )
    up.add_argument(
        "--vms-unlisted",
        action="store_true",
        help="leave the VMs out of inventories/lab.py (the test suite's VM: its tests deploy "
        "with inventories of their own)",
    )
    up.add_argument(
        "--vm-profiles",
        default=None,
        help=f"hardware profiles of the VMs' doubles, in turn (default {vm.DEFAULT_VM_PROFILE})",
    )
    up.add_argument(
        "--vm-memory-mib", type=int, default=vm.DEFAULT_MEMORY_MIB, help="memory of each VM"
    )
    up.add_argument(
        "--vm-nvme-drives",
        type=int,
        default=vm.DEFAULT_NVME_DRIVES,
        help="emulated NVMe drives per VM",
    )
    up.add_argument(
        "--vm-nvme-mib", type=int, default=vm.DEFAULT_NVME_MIB, help="size of each NVMe drive"
    )
    up.add_argument(
        "--profiles",
        default=",".join(DEFAULT_PROFILES),
        help="hardware profiles, assigned to nodes in turn",
    )
    up.add_argument(
        "--release",
        default=DEFAULT_RELEASE,
        help="release of the nodes: bookworm, trixie, noble (an Ubuntu 24.04 lab node), a "
        "comma-separated list given to nodes in turn, or mixed (bookworm,trixie,noble)",
    )
    up.add_argument(
        "--scratch-disks",
        type=int,
        default=0,
        metavar="N",
        help="give every node N loop-device disks as /dev/nvme0n1.. (for the NVMe cache)",
    )
    up.add_argument(
        "--scratch-disk-mib", type=int, default=SCRATCH_DISK_MIB, help="size of each scratch disk"
    )
    up.add_argument(
        "--slurm",
        action="store_true",
        help="also a Slurm controller (slurmctld, munge) the nodes join when converged",
    )
    up.set_defaults(func=reporting_lab_errors(cmd_lab_up))
    down = lab_commands.add_parser("down", help="remove everything the lab made")
    down.add_argument(
        "--keep-image",
        action="store_true",
        help="keep the node and VM images, so the next `lab up` need not build them again",
    )
    down.set_defaults(func=reporting_lab_errors(cmd_lab_down))
    status = lab_commands.add_parser("status", help="list lab nodes")
    status.set_defaults(func=reporting_lab_errors(cmd_lab_status))

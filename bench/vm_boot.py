"""Lab VM boot time and memory per VM, and the time of a real reboot.

    .venv/bin/python bench/vm_boot.py [--vms 1] [--release bookworm] [--memory-mib 1024]
                                      [--reboot] [--rebuild]

The lab's VMs are removed first (containers are left alone), so boot times are those of new
VMs, booted in parallel; --rebuild also removes the VM image (its build time is printed on
stderr). Memory: the qemu process's resident set on the host, and what the guest itself uses
(MemTotal - MemAvailable). --reboot then reboots each VM for real, one after the other.
Prints one table; a measurement, not a test.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from lab import Lab
from lab import vm as lab_vm


def guest_used_mib(lab: Lab, vm: lab_vm.LabVm) -> float:
    result = subprocess.run(
        lab_vm.ssh_command(lab, vm, "cat /proc/meminfo"), capture_output=True, text=True
    )
    fields = {
        line.split(":")[0]: int(line.split()[1])
        for line in result.stdout.splitlines()
        if line.count(":") == 1 and len(line.split()) >= 2 and line.split()[1].isdigit()
    }
    return round((fields.get("MemTotal", 0) - fields.get("MemAvailable", 0)) / 1024, 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vms", type=int, default=1)
    parser.add_argument("--release", default="bookworm")
    parser.add_argument("--memory-mib", type=int, default=lab_vm.DEFAULT_MEMORY_MIB)
    parser.add_argument("--reboot", action="store_true")
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args()
    lab = Lab(log=lambda message: print(message, file=sys.stderr))
    lab_vm.down_vms(lab)
    if args.rebuild:
        lab_vm.remove_images()
    started = time.monotonic()
    vms = lab_vm.up_vms(lab, args.vms, releases=[args.release], memory_mib=args.memory_mib)
    total = time.monotonic() - started
    reboots = {vm.name: lab_vm.reboot(lab, vm) for vm in vms} if args.reboot else {}
    print(
        f"{'vm':<9} {'release':<9} {'accel':<5} {'kernel':<16} {'boot s':>7} "
        f"{'qemu RSS MiB':>12} {'guest used MiB':>14} {'reboot s':>8}"
    )
    for vm in vms:
        reboot = f"{reboots[vm.name]:>8.1f}" if vm.name in reboots else f"{'-':>8}"
        print(
            f"{vm.name:<9} {vm.release:<9} {vm.accel:<5} {vm.kernel:<16} {vm.boot_s:>7.1f} "
            f"{vm.memory_mib:>12.1f} {guest_used_mib(lab, vm):>14.1f} {reboot}"
        )
    print(
        f"{len(vms)} VM(s) of {args.memory_mib} MiB up in {total:.1f} s "
        "(image build and KVM probe included when they ran)"
    )


if __name__ == "__main__":
    main()

"""Drift check wall time and SSH commands per host on 1, 16 and 64 lab nodes.

    .venv/bin/python bench/drift.py [--sizes 1,16,64] [--repeat 3] [--bare]

The nodes are plain lab nodes (sshd and the hardware doubles; nothing deployed), in a lab
of their own (GPUNODE_LAB_NAME=gpunode-bench, subnet 10.213.50.0/24). The check reads the
whole fact set (GPU, IB, NVMe, sshd, firewall, TLS, packages, runtimes, NCCL, mounts) from
each, as the nightly job does; findings are many, since nothing was deployed. Each size is
timed ``--repeat`` times (the best and the median are shown), then the ratio to 1 node.
Every node runs on this one machine: its CPUs do every node's share of the check at once
(the GPU doubles are Python programs), so wall time here grows with the fleet where a real
fleet's would not; ``--bare`` removes the doubles, and the control side's own CPU time per
host is printed to show what does scale with the fleet.
Prints one table; a measurement, not a test.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from pyinfra.connectors.ssh import SSHConnector  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BENCH_LAB = {
    "GPUNODE_LAB_NAME": "gpunode-bench",
    "GPUNODE_LAB_DIR": str(ROOT / ".bench-lab"),
    "GPUNODE_LAB_SUBNET": "50",
}
os.environ.update(BENCH_LAB)
sys.path.insert(0, str(ROOT))

from gpunode.cli import load_inventory  # noqa: E402
from gpunode.drift import run_drift  # noqa: E402

GPUNODE = str(Path(sys.executable).with_name("gpunode"))


def measure(repeat: int) -> dict[str, Any]:
    """Time the drift check of the lab as it is now, ``repeat`` times, in this process."""
    commands: dict[str, int] = {}
    original = SSHConnector.run_shell_command

    def counting(self: SSHConnector, *a: Any, **k: Any) -> Any:
        commands[self.host.name] = commands.get(self.host.name, 0) + 1
        return original(self, *a, **k)

    SSHConnector.run_shell_command = counting  # type: ignore[method-assign]
    inventory_path = str(ROOT / "inventories" / "lab.py")
    walls, cpu = [], []
    for _ in range(repeat):
        commands.clear()
        inventory = load_inventory(inventory_path)
        started, started_cpu = time.monotonic(), time.process_time()
        result = run_drift(inventory, inventory_path, None)
        walls.append(time.monotonic() - started)
        cpu.append(time.process_time() - started_cpu)
    return {
        "walls": walls,
        "cpu_per_host_ms": 1000 * min(cpu) / max(1, len(result.checked_hosts)),
        "per_host": sorted(set(commands.values())),
        "checked": len(result.checked_hosts),
        "unreachable": len(result.unreachable),
        "findings": len(result.findings),
    }


def remove_hardware_doubles() -> None:
    from gpunode.lab import Lab

    lab = Lab()
    for node in lab.nodes():
        lab.client.containers.get(node.container).exec_run(
            ["sh", "-c", "rm -f $(command -v nvidia-smi ibstat nvme gpunode-lab-hw)"]
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1,16,64")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--bare",
        action="store_true",
        help="remove the hardware doubles from the nodes: sshd-only nodes, so that the lab "
        "host's CPUs are not spent simulating GPUs for every node at once",
    )
    parser.add_argument("--measure", action="store_true", help="(internal) one size, as JSON")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.repeat)))
        return
    best: dict[int, float] = {}
    print(f"{'nodes':>5} {'best s':>7} {'median s':>9} {'SSH commands/host':>18} "
          f"{'control CPU ms/host':>20} {'checked':>8} {'unreachable':>12} "
          f"{'findings':>9}")  # fmt: skip
    for size in [int(value) for value in args.sizes.split(",")]:
        subprocess.run(
            [GPUNODE, "lab", "up", "--nodes", str(size)],
            cwd=ROOT, check=True, capture_output=True,
        )  # fmt: skip
        if args.bare:
            remove_hardware_doubles()
        # A process per size: pyinfra remembers a known_hosts file once it has read it.
        run = subprocess.run(
            [sys.executable, __file__, "--measure", "--repeat", str(args.repeat)],
            cwd=ROOT, check=True, capture_output=True, text=True,
        )  # fmt: skip
        measured = json.loads(run.stdout)
        walls = measured["walls"]
        best[size] = min(walls)
        print(f"{size:>5} {min(walls):>7.2f} {statistics.median(walls):>9.2f} "
              f"{measured['per_host']!s:>18} {measured['cpu_per_host_ms']:>20.1f} "
              f"{measured['checked']:>8} "
              f"{measured['unreachable']:>12} {measured['findings']:>9}", flush=True)  # fmt: skip
    smallest = min(best)
    for size, wall in sorted(best.items()):
        print(f"{size} nodes / {smallest} node: {wall / best[smallest]:.2f}x")
    subprocess.run([GPUNODE, "lab", "down", "--keep-image"], cwd=ROOT, check=True)


if __name__ == "__main__":
    main()

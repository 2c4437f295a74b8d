"""Drift check wall time and SSH commands per host on 1, 16 and 64 lab nodes.

    .venv/bin/python bench/drift.py [--sizes 1,16,64] [--repeat 3]

The nodes are plain lab nodes (sshd and the hardware doubles; nothing deployed), in a lab
of their own (GPUNODE_LAB_NAME=gpunode-bench, subnet 10.213.50.0/24). The check reads the
whole fact set (GPU, IB, NVMe, sshd, firewall, TLS, packages, runtimes, NCCL, mounts) from
each, as the nightly job does; findings are many, since nothing was deployed. Each size is
timed ``--repeat`` times (the best and the median are shown), then the ratio to 1 node.
Prints one table; a measurement, not a test.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1,16,64")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    commands: dict[str, int] = {}
    original = SSHConnector.run_shell_command

    def counting(self: SSHConnector, *a: Any, **k: Any) -> Any:
        commands[self.host.name] = commands.get(self.host.name, 0) + 1
        return original(self, *a, **k)

    SSHConnector.run_shell_command = counting  # type: ignore[method-assign]
    inventory_path = str(ROOT / "inventories" / "lab.py")
    best: dict[int, float] = {}
    print(f"{'nodes':>5} {'best s':>7} {'median s':>9} {'SSH commands/host':>18} "
          f"{'checked':>8} {'findings':>9}")  # fmt: skip
    for size in [int(value) for value in args.sizes.split(",")]:
        subprocess.run(
            [GPUNODE, "lab", "up", "--nodes", str(size)],
            cwd=ROOT, check=True, capture_output=True,
        )  # fmt: skip
        walls = []
        for _ in range(args.repeat):
            commands.clear()
            inventory = load_inventory(inventory_path)
            started = time.monotonic()
            result = run_drift(inventory, inventory_path, None)
            walls.append(time.monotonic() - started)
        best[size] = min(walls)
        per_host = sorted(set(commands.values()))
        print(f"{size:>5} {min(walls):>7.2f} {statistics.median(walls):>9.2f} "
              f"{per_host!s:>18} {len(result.checked_hosts):>8} {len(result.findings):>9}",
              flush=True)  # fmt: skip
    smallest = min(best)
    for size, wall in sorted(best.items()):
        print(f"{size} nodes / {smallest} node: {wall / best[smallest]:.2f}x")
    subprocess.run([GPUNODE, "lab", "down", "--keep-image"], cwd=ROOT, check=True)


if __name__ == "__main__":
    main()

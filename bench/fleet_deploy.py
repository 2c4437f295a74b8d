"""Converge and no-op re-run of deploys/harden.py and deploys/gpu_node.py on 1, 4 and 16 nodes.

    .venv/bin/python bench/fleet_deploy.py [--sizes 1,4,16]

Each size gets fresh lab nodes in a lab of its own (GPUNODE_LAB_NAME=gpunode-bench, subnet
10.213.50.0/24; the shared lab is left alone), then: harden.py converge, harden.py no-op,
gpu_node.py converge (the rest of the stack), gpu_node.py no-op. Per run it prints wall time
and, per host, the SSH commands and file uploads pyinfra made (bench/counted_pyinfra.py);
then the 16-node / 1-node ratios. Prints one table; a measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH_LAB = {
    "GPUNODE_LAB_NAME": "gpunode-bench",
    "GPUNODE_LAB_DIR": str(ROOT / ".bench-lab"),
    "GPUNODE_LAB_SUBNET": "50",
}
RUNS = (
    ("deploys/harden.py", "converge"),
    ("deploys/harden.py", "no-op"),
    ("deploys/gpu_node.py", "converge"),
    ("deploys/gpu_node.py", "no-op"),
)


def run_deploy(deploy: str, env: dict[str, str], counts: Path) -> tuple[float, dict, int]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "counted_pyinfra.py"), "-y",
         "inventories/lab.py", deploy],
        cwd=ROOT, env={**env, "GPUNODE_BENCH_COUNTS": str(counts)},
        capture_output=True, text=True,
    )  # fmt: skip
    wall = time.monotonic() - started
    if result.returncode != 0:
        print(result.stdout[-4000:], result.stderr[-2000:], file=sys.stderr)
    return wall, json.loads(counts.read_text()), result.returncode


def package_cache_traffic(lab: Any) -> tuple[int, int]:
    """Bytes apt-cacher-ng fetched from upstream and served to nodes (its transfer log)."""
    log = Path(lab.state_dir) / "apt-cache" / "apt-cacher.log"
    totals = {"I": 0, "O": 0}
    for line in log.read_text().splitlines() if log.exists() else []:
        fields = line.split("|")
        if len(fields) >= 3 and fields[1] in totals and fields[2].isdigit():
            totals[fields[1]] += int(fields[2])
    return totals["I"], totals["O"]


def spread(values: list[int]) -> str:
    return f"{min(values)}" if min(values) == max(values) else f"{min(values)}-{max(values)}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1,4,16")
    args = parser.parse_args()
    os.environ.update(BENCH_LAB)
    sys.path.insert(0, str(ROOT))
    from lab import Lab

    plans = tempfile.mkdtemp(prefix="gpunode-bench-plans-")
    env = {**os.environ, "GPUNODE_FACT_PLAN_DIR": plans}
    walls: dict[tuple[str, str, int], float] = {}
    print(f"{'deploy':<20} {'run':<9} {'nodes':>5} {'wall s':>7} {'rc':>3} "
          f"{'SSH commands/host':>18} {'uploads/host':>13}")  # fmt: skip
    for size in [int(value) for value in args.sizes.split(",")]:
        lab = Lab(log=lambda message: print(message, file=sys.stderr))
        lab.down(keep_image=True)
        lab = Lab(log=lambda message: print(message, file=sys.stderr))
        lab.up(size)
        for deploy, kind in RUNS:
            with tempfile.NamedTemporaryFile(suffix=".json") as counts:
                wall, per_host, code = run_deploy(deploy, env, Path(counts.name))
            walls[(deploy, kind, size)] = wall
            commands = [host.get("commands", 0) for host in per_host.values()]
            uploads = [host.get("uploads", 0) for host in per_host.values()]
            print(f"{deploy:<20} {kind:<9} {size:>5} {wall:>7.1f} {code:>3} "
                  f"{spread(commands):>18} {spread(uploads or [0]):>13}", flush=True)  # fmt: skip
        fetched, served = package_cache_traffic(lab)
        print(f"{'':<20} {'apt cache':<9} {size:>5} fetched from mirrors {fetched / 2**20:.1f} "
              f"MiB, served to nodes {served / 2**20:.1f} MiB", flush=True)  # fmt: skip
    sizes = sorted({size for _, _, size in walls})
    if len(sizes) > 1:
        small, large = sizes[0], sizes[-1]
        print(f"\nwall time ratio {large} nodes / {small} node(s):")
        for deploy, kind in RUNS:
            ratio = walls[(deploy, kind, large)] / walls[(deploy, kind, small)]
            print(f"  {deploy:<20} {kind:<9} {ratio:.2f}")
    Lab().down(keep_image=True)


if __name__ == "__main__":
    main()

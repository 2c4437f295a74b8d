"""Lab boot time and memory per node, then first and second deploy run times.

    .venv/bin/python bench/lab_deploy.py [--nodes 2] [--fresh] [--release mixed]
        [--deploy deploys/gpu_node.py]

--fresh removes the lab's containers first (the image is kept) so boot and first-run times
are those of new nodes. Prints one table; a measurement, not a test.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from lab import Lab, releases_of

ROOT = Path(__file__).resolve().parents[1]


def timed_deploy(deploy: str) -> float:
    started = time.monotonic()
    subprocess.run(
        [str(Path(sys.executable).with_name("pyinfra")), "-y", "inventories/lab.py", deploy],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )  # fmt: skip
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--deploy", default="deploys/gpu_node.py")
    parser.add_argument("--release", default="mixed", help="bookworm, trixie or mixed")
    args = parser.parse_args()
    lab = Lab(log=lambda message: print(message, file=sys.stderr))
    if args.fresh:
        lab.down(keep_image=True)
    nodes = lab.up(args.nodes, releases=releases_of(args.release))
    first = timed_deploy(args.deploy)
    second = timed_deploy(args.deploy)
    print(f"{'node':<8} {'profile':<10} {'release':<9} {'boot s':>7} {'RAM MiB':>8}")
    for node in nodes:
        print(
            f"{node.name:<8} {node.profile:<10} {node.release:<9} {node.boot_s:>7.2f} "
            f"{node.memory_mib:>8.1f}"
        )
    print(f"{args.deploy} on {len(nodes)} nodes: first run {first:.1f} s, "
          f"second run {second:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()

"""Debian's lynis hardening index on a lab node, before and after gpunode's hardening.

    .venv/bin/python bench/lynis_index.py [--fresh] [--nodes 2] [--node lab-1]

Brings the lab up (--fresh: new containers from the kept image), installs lynis on one node,
runs ``lynis audit system --quick --no-colors`` and prints its "Hardening index : N"; then
runs deploys/os_hardening.py on every node twice (first converge and no-op rerun, timed), and
deploys/harden.py as well where it exists, and audits again. Prints where the remaining
points are lost. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from lynis import points_lost  # bench/lynis.py, beside this script

from lab import LOGIN_USER, Lab, LabNode

ROOT = Path(__file__).resolve().parents[1]
OWN_DEPLOY = "deploys/os_hardening.py"
FULL_DEPLOY = "deploys/harden.py"
LYNIS = "/usr/sbin/lynis"


def ssh(lab: Lab, node: LabNode, command: str) -> str:
    result = subprocess.run(
        [
            "ssh", "-i", str(lab.key_path), "-o", f"UserKnownHostsFile={lab.known_hosts_path}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
            f"{LOGIN_USER}@{node.address}", command,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"{node.name}: {command!r} failed: {result.stderr.strip()}")
    return result.stdout


def audit(lab: Lab, node: LabNode) -> tuple[int, list[tuple[str, int]]]:
    """(hardening index, [(test id, points lost)] worst first) from one lynis run."""
    report = ssh(lab, node, f"sudo {LYNIS} audit system --quick --no-colors 2>&1")
    found = re.search(r"Hardening index : (\d+)", report)
    if found is None:
        raise SystemExit(f"{node.name}: no hardening index in lynis output:\n{report[-2000:]}")
    lost, _totals = points_lost(ssh(lab, node, "sudo cat /var/log/lynis.log"))
    return int(found.group(1)), lost


def timed_deploy(deploy: str) -> float:
    started = time.monotonic()
    result = subprocess.run(
        [str(Path(sys.executable).with_name("pyinfra")), "-y", "inventories/lab.py", deploy],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise SystemExit(f"{deploy} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fresh", action="store_true", help="new containers first")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--node", default="lab-1", help="the node lynis audits")
    args = parser.parse_args()
    lab = Lab(log=lambda message: print(message, file=sys.stderr))
    if args.fresh:
        lab.down(keep_image=True)
    nodes = lab.up(args.nodes)
    node = next((n for n in nodes if n.name == args.node), None)
    if node is None:
        raise SystemExit(f"no lab node {args.node}; nodes: {', '.join(n.name for n in nodes)}")

    ssh(
        lab,
        node,
        "sudo apt-get update -qq && "
        "sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq lynis >/dev/null",
    )
    before, _ = audit(lab, node)
    print(f"before: Hardening index : {before}")

    first = timed_deploy(OWN_DEPLOY)
    rerun = timed_deploy(OWN_DEPLOY)
    print(
        f"{OWN_DEPLOY} on {len(nodes)} nodes: first converge {first:.1f} s, "
        f"no-op rerun {rerun:.1f} s"
    )
    own, _ = audit(lab, node)
    print(f"after {OWN_DEPLOY}: Hardening index : {own}")

    if (ROOT / FULL_DEPLOY).exists():
        timed_deploy(FULL_DEPLOY)
        full, lost = audit(lab, node)
        print(f"after {FULL_DEPLOY}: Hardening index : {full}")
    else:
        _, lost = audit(lab, node)
        print(f"({FULL_DEPLOY} does not exist yet)")
    print("points still lost, by lynis test: " + ", ".join(f"{t} {p}" for t, p in lost))


if __name__ == "__main__":
    main()

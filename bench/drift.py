"""Drift check wall time, SSH commands and CPU per host on 1, 16 and 64 lab nodes.

    .venv/bin/python bench/drift.py [--sizes 1,16,64] [--repeat 3] [--bare]

The nodes are plain lab nodes (sshd and the hardware doubles; nothing deployed), in a lab
of their own (GPUNODE_LAB_NAME=gpunode-bench, subnet 10.213.50.0/24). The check reads the
whole fact set (GPU, IB, NVMe, sshd, firewall, TLS, packages, runtimes, NCCL, mounts) from
each, as the nightly job does; findings are many, since nothing was deployed. ``--bare``
removes the hardware doubles first: sshd-only nodes.

Every lab node runs on this one machine, so the nodes' share of the work, which a real
fleet does in parallel on each node, is done here by the same few CPUs, one node after the
other. To tell that apart from what gpunode itself adds with fleet size, each size is also
measured as:

- floor: the same connections running only ``true`` (SSH login and sudo, nothing read);
- node CPU: what the nodes' containers spent per check (their cgroup's CPU time), and the
  control process's own CPU per host;
- end to end: ``gpunode drift`` as the nightly job runs it (start-up, inventory validation,
  gather, rules, report), its own process.

Each figure is the best of ``--repeat`` runs (the median of the check is shown too). Prints
one table; a measurement, not a test.
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
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from pyinfra.api import FactBase  # noqa: E402
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
from gpunode.drift.gather import gather_fact, make_state  # noqa: E402

GPUNODE = str(Path(sys.executable).with_name("gpunode"))
INVENTORY = str(ROOT / "inventories" / "lab.py")


class LoginOnly(FactBase):
    """Nothing read: what one SSH login (with sudo) costs, node and control side together."""

    def command(self) -> str:
        return "true"

    def process(self, output: list[str]) -> list[str]:
        return output


def container_cpu_s(containers: list[str]) -> float:
    """CPU seconds the containers have used so far (cgroup v1 cpuacct or v2 cpu.stat)."""
    ids = subprocess.run(
        ["docker", "inspect", "-f", "{{.Id}}", *containers],
        check=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    total = 0.0
    for container_id in ids:
        v1 = Path(f"/sys/fs/cgroup/cpuacct/docker/{container_id}/cpuacct.usage")
        v2 = Path(f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/cpu.stat")
        if v1.exists():
            total += int(v1.read_text()) / 1e9
        elif v2.exists():
            usage = next(line for line in v2.read_text().splitlines() if "usage_usec" in line)
            total += int(usage.split()[1]) / 1e6
        else:
            return float("nan")
    return total


def timed(repeat: int, containers: list[str], once: Callable[[], int]) -> dict[str, float]:
    """Best wall, median wall, control CPU and node CPU (both per host, of the best run)."""
    runs = []
    for _ in range(repeat):
        node_cpu = container_cpu_s(containers)
        started, started_cpu = time.monotonic(), time.process_time()
        hosts = once()
        wall, cpu = time.monotonic() - started, time.process_time() - started_cpu
        node_cpu = container_cpu_s(containers) - node_cpu
        runs.append((wall, 1000 * cpu / hosts, 1000 * node_cpu / hosts))
    best = min(runs)
    return {
        "best": best[0],
        "median": statistics.median(run[0] for run in runs),
        "control_ms": best[1],
        "node_ms": best[2],
    }


def measure(repeat: int, containers: list[str]) -> dict[str, Any]:
    """The check and the floor of the lab as it is now, ``repeat`` times each, in this process."""
    commands: dict[str, int] = {}
    original = SSHConnector.run_shell_command

    def counting(self: SSHConnector, *a: Any, **k: Any) -> Any:
        commands[self.host.name] = commands.get(self.host.name, 0) + 1
        return original(self, *a, **k)

    SSHConnector.run_shell_command = counting  # type: ignore[method-assign]
    outcome: dict[str, Any] = {}

    def check() -> int:
        commands.clear()
        result = run_drift(load_inventory(INVENTORY), INVENTORY, None)
        outcome.update(
            checked=len(result.checked_hosts),
            unreachable=len(result.unreachable),
            findings=len(result.findings),
            per_host=sorted(set(commands.values())),
        )
        return max(1, len(result.checked_hosts))

    def floor() -> int:
        inventory = load_inventory(INVENTORY)
        values, _ = gather_fact(make_state(inventory), LoginOnly, list(inventory))
        return max(1, len(values))

    return {"check": timed(repeat, containers, check), "floor": timed(repeat, containers, floor),
            **outcome}  # fmt: skip


def end_to_end(repeat: int) -> float:
    """Best wall time of ``gpunode drift`` as a command (exit 1: findings, expected here)."""
    walls = []
    for _ in range(repeat):
        started = time.monotonic()
        run = subprocess.run([GPUNODE, "drift", INVENTORY, "--json"], cwd=ROOT,
                             capture_output=True, text=True)  # fmt: skip
        walls.append(time.monotonic() - started)
        if run.returncode not in (0, 1):
            raise SystemExit(f"gpunode drift failed ({run.returncode}):\n{run.stderr}")
    return min(walls)


def remove_hardware_doubles(containers: list[str]) -> None:
    for container in containers:
        subprocess.run(
            ["docker", "exec", container, "sh", "-c",
             "rm -f /usr/bin/nvidia-smi /usr/sbin/ibstat /usr/sbin/nvme "
             "/usr/local/sbin/gpunode-lab-hw"],
            check=True,
        )  # fmt: skip


HEADER = (
    f"{'nodes':>5} {'check s':>8} {'median':>7} {'floor s':>8} {'end-to-end s':>13} "
    f"{'cmds/host':>10} {'node CPU ms/host':>17} {'floor node ms':>14} "
    f"{'control ms/host':>16} {'floor ctl ms':>13} {'checked':>8} {'unreach.':>9} "
    f"{'findings':>9}"
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
    from lab import Lab

    if args.measure:
        containers = [node.container for node in Lab().nodes()]
        print(json.dumps(measure(args.repeat, containers)))
        return
    rows: dict[int, dict[str, Any]] = {}
    print(HEADER)
    for size in [int(value) for value in args.sizes.split(",")]:
        subprocess.run(
            [GPUNODE, "lab", "up", "--nodes", str(size)],
            cwd=ROOT, check=True, capture_output=True,
        )  # fmt: skip
        containers = [node.container for node in Lab().nodes()]
        if args.bare:
            remove_hardware_doubles(containers)
        # A process per size: pyinfra remembers a known_hosts file once it has read it.
        run = subprocess.run(
            [sys.executable, __file__, "--measure", "--repeat", str(args.repeat)],
            cwd=ROOT, check=True, capture_output=True, text=True,
        )  # fmt: skip
        row = json.loads(run.stdout)
        row["end_to_end"] = end_to_end(args.repeat)
        rows[size] = row
        check, floor = row["check"], row["floor"]
        print(f"{size:>5} {check['best']:>8.2f} {check['median']:>7.2f} {floor['best']:>8.2f} "
              f"{row['end_to_end']:>13.2f} {row['per_host']!s:>10} {check['node_ms']:>17.0f} "
              f"{floor['node_ms']:>14.0f} {check['control_ms']:>16.1f} "
              f"{floor['control_ms']:>13.1f} {row['checked']:>8} {row['unreachable']:>9} "
              f"{row['findings']:>9}", flush=True)  # fmt: skip
    smallest = min(rows)
    base = rows[smallest]
    print(f"\nratios to {smallest} node(s): check / floor / end to end")
    for size, row in sorted(rows.items()):
        print(f"{size:>5}: {row['check']['best'] / base['check']['best']:.1f}x / "
              f"{row['floor']['best'] / base['floor']['best']:.1f}x / "
              f"{row['end_to_end'] / base['end_to_end']:.1f}x")  # fmt: skip
    subprocess.run([GPUNODE, "lab", "down", "--keep-image"], cwd=ROOT, check=True)


if __name__ == "__main__":
    main()

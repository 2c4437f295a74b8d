"""What a no-op costs on a converged lab: deploy wall time, node CPU, SSH commands, drift CPU.

    .venv/bin/python bench/noop.py [--repeat 3] [--no-converge] [--before REV]

On the lab as it is (``gpunode lab up`` first; GPUNODE_LAB_NAME / GPUNODE_LAB_SUBNET pick
it), converges every node twice with deploys/gpu_node.py (``--no-converge`` skips that, for
a lab already converged), then measures, best of ``--repeat`` runs each:

- ``gpu_node.py`` no-op on every node, and ``harden.py`` no-op on the first node alone
  (``--limit``): wall time of the pyinfra command, its own CPU (control side), the node-side
  CPU of each node (its container's cgroup CPU time over the run), SSH commands per host
  (bench/counted_pyinfra.py) and how many operations changed something (must be 0);
- ``gpunode drift inventories/lab.py``: the same figures per host.

``--before REV`` measures a checkout of REV first (a temporary git worktree, its own code and
fact plans, the same lab), then this checkout, and prints both tables: before and after from
one run of the bench.

Targets (issue 13): gpu_node.py no-op on 2 nodes <= 3 s; harden.py no-op on 1 node <= 1.5 s;
node-side CPU of a no-op <= 0.5 s per node; drift node-side CPU <= 150 ms per host.

Fact plans (gpunode/factcache.py) are kept under the lab's state directory, not the
user's cache, so that other labs' nodes of the same name do not share them
(GPUNODE_FACT_PLAN_DIR overrides).

Every lab node runs on this one machine, beside whatever else it runs: wall times include
waiting for its CPUs. Prints one table; a measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from lab import Lab  # noqa: E402

PYTHON = sys.executable
INVENTORY = "inventories/lab.py"
TARGETS = {
    "deploys/gpu_node.py": "<= 3 s wall, <= 500 ms node CPU per node",
    "deploys/harden.py": "<= 1.5 s wall, <= 500 ms node CPU",
    "gpunode drift": "<= 150 ms node CPU per host",
}


def container_cpu_s(container: str) -> float:
    """CPU seconds the container has used so far (cgroup v1 cpuacct or v2 cpu.stat)."""
    container_id = subprocess.run(
        ["docker", "inspect", "-f", "{{.Id}}", container],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    v1 = Path(f"/sys/fs/cgroup/cpuacct/docker/{container_id}/cpuacct.usage")
    v2 = Path(f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/cpu.stat")
    if v1.exists():
        return int(v1.read_text()) / 1e9
    if v2.exists():
        usage = next(line for line in v2.read_text().splitlines() if "usage_usec" in line)
        return int(usage.split()[1]) / 1e6
    return float("nan")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Run:
    wall_s: float
    control_cpu_s: float
    node_cpu_s: dict[str, float]  # node name -> CPU seconds its container spent
    commands: dict[str, int]  # host -> SSH shell commands
    changed: int  # operations that changed something (deploys); findings (drift)
    returncode: int
    output: str = field(repr=False)


def checkout_env(checkout: Path, plans: Path) -> dict[str, str]:
    """The environment that runs ``checkout``'s code (not the virtualenv's install)."""
    return {
        **os.environ,
        "PYTHONPATH": str(checkout),
        "GPUNODE_BENCH_CHECKOUT": str(checkout),
        "GPUNODE_FACT_PLAN_DIR": str(plans),
    }


def timed(
    command: list[str], containers: dict[str, str], counts_path: str, checkout: Path, env: dict
) -> Run:
    before = {name: container_cpu_s(container) for name, container in containers.items()}
    started, started_cpu = time.monotonic(), children_cpu_s()
    run = subprocess.run(
        command, cwd=checkout, capture_output=True, text=True,
        env={**env, "GPUNODE_BENCH_COUNTS": counts_path},
    )  # fmt: skip
    wall, cpu = time.monotonic() - started, children_cpu_s() - started_cpu
    node_cpu = {name: container_cpu_s(c) - before[name] for name, c in containers.items()}
    counts = json.loads(Path(counts_path).read_text()) if Path(counts_path).exists() else {}
    Path(counts_path).unlink(missing_ok=True)
    return Run(
        wall, cpu, node_cpu,
        {host: values.get("commands", 0) for host, values in counts.items()},
        changed_of(command, run.stdout), run.returncode, run.stdout + run.stderr,
    )  # fmt: skip


def changed_of(command: list[str], stdout: str) -> int:
    try:
        results = json.loads(stdout)
    except json.JSONDecodeError:
        return -1
    if "drift" in command:
        return len(results.get("findings", []))
    return sum(bool(op["success"]) for op in results["results"]["operations"])


def pyinfra(deploy: str, *extra: str) -> list[str]:
    return [PYTHON, str(BENCH / "counted_pyinfra.py"), "-y", "--json", INVENTORY, deploy, *extra]


def drift() -> list[str]:
    return [PYTHON, __file__, "--counted-drift", "drift", INVENTORY, "--json"]


def best_of(
    repeat: int, command: list[str], containers: dict[str, str], ok: set[int],
    checkout: Path, env: dict,
) -> Run:  # fmt: skip
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeat):
            run = timed(command, containers, f"{tmp}/counts.json", checkout, env)
            if run.returncode not in ok:
                raise SystemExit(f"{' '.join(command)} failed ({run.returncode}):\n{run.output}")
            runs.append(run)
    return min(runs, key=lambda run: run.wall_s)


def row(what: str, hosts: int, run: Run, node_names: list[str]) -> str:
    node_ms = "/".join(f"{1000 * run.node_cpu_s[name]:.0f}" for name in node_names)
    commands = "/".join(str(run.commands.get(name, 0)) for name in node_names)
    return (
        f"{what:<26} {hosts:>5} {run.wall_s:>7.2f} {1000 * run.control_cpu_s:>12.0f} "
        f"{node_ms:>15} {commands:>12} {run.changed:>8}   {TARGETS.get(what.split(' (')[0], '')}"
    )


def main() -> None:
    if sys.argv[1:2] == ["--counted-drift"]:
        # `gpunode drift ...` in this process, its SSH commands counted as for pyinfra.
        sys.path.insert(0, str(BENCH))
        # The measured checkout's gpunode, ahead of this one's.
        sys.path.insert(0, os.environ.get("GPUNODE_BENCH_CHECKOUT", str(ROOT)))
        for name in [
            module for module in sys.modules if module.split(".")[0] in ("gpunode", "lab")
        ]:
            del sys.modules[name]
        import counted_pyinfra  # noqa: F401  (counts on import, writes them at exit)

        from gpunode.cli import main as gpunode_main

        sys.argv = ["gpunode", *sys.argv[2:]]
        sys.exit(gpunode_main())
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-converge", action="store_true", help="the lab is converged")
    parser.add_argument("--before", metavar="REV", help="also measure this git revision, first")
    args = parser.parse_args()
    lab = Lab()
    nodes = lab.nodes()
    if not nodes:
        raise SystemExit("no lab nodes: run `gpunode lab up --nodes 2` first")
    # Every checkout drives the same lab: its state directory, name and subnet.
    os.environ["GPUNODE_LAB_DIR"] = str(lab.state_dir)
    os.environ["GPUNODE_LAB_NAME"] = lab.name
    os.environ["GPUNODE_LAB_SUBNET"] = lab.network_prefix.rsplit(".", 1)[1]
    if args.before:
        with tempfile.TemporaryDirectory() as tmp:
            old = Path(tmp) / "before"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old),
                            args.before], check=True, capture_output=True)  # fmt: skip
            try:
                measure(f"before: {args.before}", old, lab, nodes, args, Path(tmp) / "plans")
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)],
                               check=False, capture_output=True)  # fmt: skip
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    measure(f"after: this checkout ({head})", ROOT, lab, nodes, args,
            lab.state_dir / "fact-plans")  # fmt: skip


def measure(title: str, checkout: Path, lab: Lab, nodes: list, args: Any, plans: Path) -> None:
    env = checkout_env(checkout, plans)
    containers = {node.name: node.container for node in nodes}
    names = [node.name for node in nodes]
    if not args.no_converge:
        for _ in range(2):
            converge = subprocess.run(pyinfra("deploys/gpu_node.py"), cwd=checkout, env=env,
                                      capture_output=True, text=True)  # fmt: skip
            if converge.returncode != 0:
                raise SystemExit(f"converging failed:\n{converge.stdout}{converge.stderr}")
    first = names[0]
    full = best_of(args.repeat, pyinfra("deploys/gpu_node.py"), containers, {0}, checkout, env)
    harden = best_of(
        args.repeat, pyinfra("deploys/harden.py", "--limit", first), {first: containers[first]},
        {0}, checkout, env,
    )  # fmt: skip
    check = best_of(args.repeat, drift(), containers, {0, 1}, checkout, env)
    print(f"== {title}")
    print(f"best of {args.repeat}; node CPU and SSH commands per node ({'/'.join(names)})")
    print(f"{'what':<26} {'hosts':>5} {'wall s':>7} {'control ms':>12} {'node CPU ms':>15} "
          f"{'SSH cmds':>12} {'changed':>8}   target")  # fmt: skip
    print(row("deploys/gpu_node.py", len(nodes), full, names))
    print(row(f"deploys/harden.py ({first})", 1, harden, [first]))
    print(row("gpunode drift", len(nodes), check, names))
    print("('changed': operations that changed something, 0 for a no-op; findings for drift)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

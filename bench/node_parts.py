"""What each part of a no-op's node-side reads costs: CPU per fact, measured on a lab node.

    .venv/bin/python bench/node_parts.py [--repeat 5] [--node lab-1] [--top 25]
        [--deploy deploys/gpu_node.py | --drift] [--expand]

A no-op deploy reads its facts in one batched command per host (gpunode/factcache.py, from
the fact plan the previous run left); the drift check reads facts.node.NodeState in one.
This runs each of those facts' commands alone on the node, ``--repeat`` times, with sudo as
the batch does, and prints the CPU its processes used (the shell's ``times``: user + system
of the waited-for children, per run) beside the fact's name, largest first. ``--expand``
times the parts of a fact that is itself a frame (gpunode's batched facts) one by one too.

Needs the lab up and a fact plan (run the deploy once: bench/noop.py keeps its plans under
the lab's state directory; so does this, through GPUNODE_FACT_PLAN_DIR). A measurement
tool, not a test: every figure includes this machine's load.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab import Lab  # noqa: E402

# Facts a plan may name are only looked up among modules already imported (factcache never
# imports on a plan's word): the deploys import these.
FACT_MODULES = (
    "facts.accounts", "facts.apt", "facts.audit", "facts.container_runtime", "facts.fabric",
    "facts.firewall", "facts.freshness", "facts.gpu", "facts.hardware", "facts.kernel",
    "facts.node",
    "facts.nvidia_packages", "facts.run_lock", "facts.sshd", "facts.tls", "roles.cuda",
)  # fmt: skip
_TIMES = re.compile(r"(\d+)m([\d.]+)s\s+(\d+)m([\d.]+)s")


def deploy_parts(node: str, deploy: str) -> list[tuple[str, str, str | None]]:
    """(label, command, required program) of each fact in ``node``'s plan for ``deploy``."""
    from gpunode import factcache, pyinfra_patches

    for module in FACT_MODULES:
        importlib.import_module(module)
    sys.argv = ["pyinfra", "inventories/lab.py", deploy]  # the plan is keyed by the deploy
    parts = []
    for cls, kwargs, connector in factcache._load_plan(node):
        fact = cls()
        command = factcache._raw(pyinfra_patches.make_command(fact.command, kwargs))
        requires = pyinfra_patches.make_command(fact.requires_command, kwargs)
        short = ",".join(f"{k}={v}" for k, v in kwargs.items() if v not in (None, False, []))
        sudo = "" if connector.get("_sudo") else " (no sudo)"
        parts.append((f"{cls.__name__}({short[:60]}){sudo}", command, requires or None))
    return parts


def drift_parts() -> list[tuple[str, str, str | None]]:
    from facts.node import NodeState

    parts = []
    for name, cls in NodeState.FACTS.items():
        fact: Any = cls()
        requires = fact.requires_command() if callable(fact.requires_command) else None
        parts.append((f"{name} ({cls.__name__})", str(fact.command()), requires))
    return parts


def expanded(parts: list[tuple[str, str, str | None]]) -> list[tuple[str, str, str | None]]:
    """Each part, and for one that is a frame of its own, each of its inner parts too."""
    from facts.batch import FactBatch

    out = list(parts)
    for module in FACT_MODULES:
        mod = importlib.import_module(module)
        for cls in vars(mod).values():
            if isinstance(cls, type) and issubclass(cls, FactBatch) and cls is not FactBatch:
                for name, inner in cls.FACTS.items():
                    fact: Any = inner()
                    requires = fact.requires_command() if callable(fact.requires_command) else None
                    label = f"  {cls.__name__}.{name}"
                    if label not in {p[0] for p in out}:
                        out.append((label, str(fact.command()), requires))
    return out


def script(parts: list[tuple[str, str, str | None]], repeat: int) -> str:
    lines = ['PATH="$PATH:/usr/sbin:/sbin"', "times"]
    for index, (_, command, requires) in enumerate(parts):
        run = f"( {command}\n) >/dev/null 2>&1"
        if requires:
            run = f"if command -v {shlex.quote(requires)} >/dev/null 2>&1; then {run}; fi"
        lines.append(f"echo @@part {index}; i=0; while [ $i -lt {repeat} ]; do {run}; "
                     "i=$((i + 1)); done; times")  # fmt: skip
    return "\n".join(lines) + "\n"


def children_cpu(times_output: list[str]) -> float:
    """Children user + system seconds from the second line of ``times``."""
    match = _TIMES.search(times_output[1])
    if not match:
        raise ValueError(f"unexpected times output: {times_output}")
    m1, s1, m2, s2 = match.groups()
    return 60 * int(m1) + float(s1) + 60 * int(m2) + float(s2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--node", default=None)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--deploy", default="deploys/gpu_node.py")
    parser.add_argument("--drift", action="store_true")
    parser.add_argument("--expand", action="store_true")
    args = parser.parse_args()
    lab = Lab()
    os.environ.setdefault("GPUNODE_FACT_PLAN_DIR", str(lab.state_dir / "fact-plans"))
    nodes = {node.name: node for node in lab.nodes()}
    node = nodes[args.node or sorted(nodes)[0]]
    parts = drift_parts() if args.drift else deploy_parts(node.name, args.deploy)
    if args.expand:
        parts = expanded(parts)
    parts.insert(0, ("(empty subshell: the harness's own cost)", "true", None))
    ssh = ["ssh", "-i", str(lab.key_path), "-o", f"UserKnownHostsFile={lab.known_hosts_path}",
           "-o", "BatchMode=yes", f"debian@{node.address}", "sudo -H -n sh -s"]  # fmt: skip
    result = subprocess.run(ssh, input=script(parts, args.repeat), capture_output=True,
                            text=True, check=True)  # fmt: skip
    lines = result.stdout.splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith("@@part ")]
    cpu = [children_cpu(lines[0:2])] + [children_cpu(lines[m + 1 : m + 3]) for m in marks]
    costs = [(cpu[i + 1] - cpu[i]) / args.repeat for i in range(len(parts))]
    facts_total = sum(costs[1 : len(parts)]) if not args.expand else None
    ranked = sorted(zip(costs, [p[0] for p in parts], strict=True), reverse=True)
    print(f"node {node.name}, {len(parts) - 1} parts, CPU ms per run (mean of {args.repeat})")
    for cost, label in ranked[: args.top]:
        print(f"{1000 * cost:8.1f}  {label}")
    if facts_total is not None:
        print(f"{1000 * facts_total:8.1f}  total of the parts")


if __name__ == "__main__":
    main()

"""A rollout of the lab through real Slurm, one node rebooted by its driver role: time per
phase and node.

    .venv/bin/python bench/rollout.py [--job S]

Needs a converged lab with its Slurm controller (`gpunode lab up --nodes 2 --slurm`, then
`pyinfra inventories/lab.py deploys/gpu_node.py`). The first Slurm node's simulated GPUs are
set to run another driver than the installed one, so the converge reboots it (the lab's
reboot command); with --job S a job of S seconds runs on it first, which the drain waits
for. `gpunode rollout --batch 1` then goes through the nodes; each progress line is stamped
as it arrives. Prints one table; a measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab import Lab

ROOT = Path(__file__).resolve().parents[1]
GPUNODE = str(Path(sys.executable).with_name("gpunode"))
PROGRESS = re.compile(r"rollout \S+: (?P<node>[A-Za-z0-9._-]+): (?P<phase>[a-z-]+)\b")
# Phase -> the step that starts with it, as the table names them.
STEPS = {
    "draining": "drain + jobs",
    "converging": "converge",
    "checking": "return + gate",
    "resuming": "resume",
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", type=float, default=0, help="seconds of a job to wait for")
    args = parser.parse_args()
    lab = Lab()
    controller = lab.slurm_controller()
    members = lab.slurm_members()
    if controller is None or not members:
        raise SystemExit("no lab Slurm controller: gpunode lab up --nodes 2 --slurm, converge")
    container = lab.client.containers.get(controller.container)
    key = container.exec_run(["cat", "/etc/ssh/ssh_host_ed25519_key.pub"]).output.decode()
    work = Path(tempfile.mkdtemp(prefix="gpunode-bench-rollout-"))
    known_hosts = work / "known_hosts"
    known_hosts.write_text(f"{controller.address} {' '.join(key.split()[:2])}\n")
    scheduler_ssh = (
        f"-i {lab.key_path} -o UserKnownHostsFile={known_hosts} -o IdentitiesOnly=yes "
        f"debian@{controller.address}"
    )
    rebooted = members[0]
    ssh = [
        "ssh", "-i", str(lab.key_path), "-o", f"UserKnownHostsFile={lab.known_hosts_path}",
        f"debian@{rebooted.address}",
    ]  # fmt: skip
    command = "sudo gpunode-lab-hw set driver_version " + shlex.quote('"550.127.08"')
    subprocess.run([*ssh, command], check=True, capture_output=True)
    if args.job:
        container.exec_run(
            ["sbatch", "-w", rebooted.name, "-o", "/dev/null", "--wrap", f"sleep {args.job:g}"]
        )
        time.sleep(2)
    state = work / "state.json"
    argv = [
        GPUNODE, "rollout", "inventories/lab.py", "deploys/gpu_node.py", "--batch", "1",
        "--state", str(state), "--scheduler-ssh", scheduler_ssh, "--poll", "1",
    ]  # fmt: skip
    started = time.monotonic()
    stamps: dict[str, list[tuple[str, float]]] = {}
    with subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        assert process.stdout is not None
        output = []
        for line in process.stdout:
            output.append(line)
            match = PROGRESS.match(line)
            if match:
                stamps.setdefault(match["node"], []).append(
                    (match["phase"], time.monotonic() - started)
                )
    total = time.monotonic() - started
    if process.returncode != 0:
        raise SystemExit(f"rollout exit status {process.returncode}:\n{''.join(output)[-4000:]}")
    data = json.loads(state.read_text())
    header = f"{'node':<8} {'rebooted':<9}" + "".join(f"{step:>15}" for step in STEPS.values())
    print(header)
    for name, events in stamps.items():
        times = dict(events)
        ends = [*list(STEPS)[1:], "done"]
        cells = []
        for phase, end in zip(STEPS, ends, strict=True):
            if phase in times and end in times:
                cells.append(f"{times[end] - times[phase]:>13.1f} s")
            else:
                cells.append(f"{'-':>15}")
        rebooted_text = "yes" if data["nodes"][name]["rebooted"] else "no"
        print(f"{name:<8} {rebooted_text:<9}" + "".join(cells))
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in data["phase_seconds"].items())
    print(f"rollout of {len(stamps)} nodes: {total:.1f} s in all ({phases})")


if __name__ == "__main__":
    main()

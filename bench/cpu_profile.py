"""Where the CPU goes while a command runs (``./dev test`` above all): lab containers by lab,
the lab VMs' qemu, and the control side, with the programs that used it.

    python bench/cpu_profile.py [--interval 1] [--out FILE] -- ./dev test

The suite on a two-core machine is CPU-bound (./dev test's own line says how busy the CPUs
were), so its wall time falls only with less work: this says which work. It samples, every
``--interval`` seconds:

- each Docker container's CPU from its cgroup (cgroup v1 ``cpuacct`` or v2 ``cpu.stat``),
  grouped by lab (the container name without its ``-N`` node suffix), for the labs named by
  ``--labs`` (prefixes; the suite's own by default, not another checkout's);
- the CPU of each process of the command's own tree and of those labs' containers, by
  program name: a program that lives shorter than an interval is missed, and what the tree
  (exact, from ``wait4``'s rusage) or a lab's cgroup used beyond what was seen is shown as
  "(short-lived)";
- the whole machine's busy time from ``/proc/stat``, other work on it included.

It prints a table sorted by CPU seconds, and writes the same as JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from lab.cpu import (
    CLOCK_TICKS,
    cgroup_cpu_s,
    container_cgroups,
    container_names,
    lab_of,
)


def machine_busy_s() -> float:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(value) for value in fields]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks[:8]) - idle) / CLOCK_TICKS


def cgroup_pids(path: Path) -> set[int]:
    """The processes of a container's cgroup and of every cgroup below it (its systemd makes
    one per service)."""
    pids: set[int] = set()
    for procs in path.rglob("cgroup.procs"):
        try:
            pids.update(int(pid) for pid in procs.read_text().split())
        except (OSError, ValueError):
            continue
    return pids


def process_cpu() -> dict[int, tuple[str, float, float, int]]:
    """pid -> (program, CPU seconds, start time in ticks, parent pid): the start time tells a
    reused pid."""
    found: dict[int, tuple[str, float, float, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        rest = stat[stat.rindex(")") + 2 :].split()
        # After the name: state ppid ... utime(12) stime(13) ... starttime(20), 0-based here.
        cpu = (int(rest[11]) + int(rest[12])) / CLOCK_TICKS
        found[int(entry.name)] = (name, cpu, float(rest[19]), int(rest[1]))
    return found


def descendants(table: dict[int, tuple[str, float, float, int]], root: int) -> set[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for pid, (_, _, _, parent) in table.items():
        children[parent].append(pid)
    found, todo = {root}, [root]
    while todo:
        for child in children[todo.pop()]:
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def profile(command: list[str], interval: float, labs: tuple[str, ...]) -> tuple[int, dict]:
    """Runs ``command``; its CPU is its own process tree's (exact: wait4's rusage of every
    process it reaped) plus that of the containers whose lab name starts with one of ``labs``
    (other work on the machine, another lab's above all, is left out)."""
    names = container_names()
    start_busy = machine_busy_s()
    started = time.monotonic()
    first_container: dict[str, float] = {}
    last_container: dict[str, float] = {}
    # (pid, start) -> (program, CPU seconds, where) at the last sample that saw it.
    process_last: dict[tuple[int, float], tuple[str, float, str]] = {}
    for cid, path in container_cgroups().items():
        used = cgroup_cpu_s(path)
        if used is not None:
            first_container[f"{lab_of(names.get(cid, cid[:12]))}\t{cid}"] = used
    child = subprocess.Popen(command)
    rusage = None
    code = 0
    while True:
        waited, status, usage = os.wait4(child.pid, os.WNOHANG)
        cgroups = container_cgroups()
        if any(cid not in names for cid in cgroups):
            names = container_names()
        owner: dict[int, str] = {}
        for cid, path in cgroups.items():
            label = lab_of(names.get(cid, cid[:12]))
            used = cgroup_cpu_s(path)
            if used is None or not label.startswith(labs):
                continue
            key = f"{label}\t{cid}"
            first_container.setdefault(key, 0.0)
            last_container[key] = used
            for pid in cgroup_pids(path):
                owner[pid] = label
        table = process_cpu()
        ours = descendants(table, child.pid) if not waited else set()
        for pid, (name, cpu, begun, _) in table.items():
            where = owner.get(pid) or ("(command)" if pid in ours else None)
            if where:
                process_last[(pid, begun)] = (name, cpu, where)
        if waited:
            rusage = usage
            code = os.waitstatus_to_exitcode(status)
            break
        time.sleep(interval)
    wall = time.monotonic() - started
    busy = machine_busy_s() - start_busy
    command_cpu = rusage.ru_utime + rusage.ru_stime if rusage else 0.0

    by_lab: dict[str, float] = defaultdict(float)
    for key, used in last_container.items():
        by_lab[key.split("\t")[0]] += used - first_container.get(key, 0.0)
    programs: dict[tuple[str, str], float] = defaultdict(float)
    for name, cpu, where in process_last.values():
        programs[(where, name)] += cpu
    seen: dict[str, float] = defaultdict(float)
    for (where, _), cpu in programs.items():
        seen[where] += cpu
    for lab, used in by_lab.items():
        programs[(lab, "(short-lived)")] += max(0.0, used - seen[lab])
    programs[("(command)", "(short-lived)")] += max(0.0, command_cpu - seen["(command)"])
    report = {
        "command": command,
        "wall_s": round(wall, 1),
        "machine_busy_cpu_s": round(busy, 1),
        "command_tree_cpu_s": round(command_cpu, 1),
        "containers_cpu_s": {lab: round(cpu, 1) for lab, cpu in sorted(by_lab.items())},
        "programs": [
            {"where": where, "program": name, "cpu_s": round(cpu, 1)}
            for (where, name), cpu in sorted(programs.items(), key=lambda item: -item[1])
            if cpu >= 1.0
        ],
    }
    return code, report


def render(report: dict, top: int) -> str:
    lines = [
        f"wall {report['wall_s']:.0f} s, machine busy {report['machine_busy_cpu_s']:.0f} CPU-s "
        f"(all work on it), the command's own process tree {report['command_tree_cpu_s']:.0f} "
        "CPU-s",
        "containers by lab (CPU-s):",
        *(f"  {cpu:8.1f}  {lab}" for lab, cpu in report["containers_cpu_s"].items()),
        f"top {top} programs (CPU-s):",
        *(
            f"  {row['cpu_s']:8.1f}  {row['where']:<28} {row['program']}"
            for row in report["programs"][:top]
        ),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--out", type=Path, help="also write the report as JSON here")
    parser.add_argument("--top", type=int, default=40, help="programs listed in the table")
    parser.add_argument(
        "--labs",
        default="gpunode-lab",
        help="comma-separated prefixes of the lab names whose containers count",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    options = parser.parse_args(argv)
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    if not command:
        parser.error("give the command to profile after --")
    code, report = profile(command, options.interval, tuple(options.labs.split(",")))
    sys.stdout.write(render(report, options.top))
    if options.out:
        options.out.write_text(json.dumps(report, indent=2) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())

"""The test suite's tiers, and `./dev test`'s runner of them.

The suite has three tiers that need nothing of each other:

- ``unit``: tests/unit, no lab (CPU-bound, a few minutes);
- ``lab``: tests/integration on lab containers (``-m "not vm"``; mostly waiting on SSH, apt
  and dpkg in the nodes);
- ``vm``: tests/integration on a lab VM with a real kernel (``-m vm``; qemu under TCG on CI).

Run one after the other they cost their sum; run at once they cost about the longest. The
lab tier, the longest, is itself spread over ``GPUNODE_TEST_LAB_SHARDS`` labs (default 2):
each lab has a worker that takes the next test module from one queue and runs it as a pytest
of its own, so the labs stay busy until the queue is empty whatever each module costs, and
every module runs alone in its process (a module that leans on another's leftovers fails).
The queue starts with the modules that took longest (``tests/module_seconds.json``, written
by ``bench/suite.py --write-seconds`` from a run's reports). Modules marked ``own_lab`` use
none of the shared lab's nodes (they make a lab of their own beside it): they wait in a queue
of their own, which the unit and VM tiers' workers take from once their tier is done (each on
a lab identity of its own), so that a worker whose tier ended keeps the CPUs busy while the
shards run, and which the shards take from once theirs is empty. Each lab and the VM tier's lab
are labs of their own (state directory, name and subnet): no teardown of one removes what
another uses.

With several tiers, each pytest's output goes to ``.test-reports/`` (``unit.log``,
``vm.log``, ``lab/<module>.log``, with JUnit XML beside each, read by ``bench/suite.py``) and is
printed whole when it ends, so that logs never interleave; with one tier, pytest prints as it
goes. The run ends with each failed test and the end of what pytest said of it (CI shows only
the end of the output, where the logs of the jobs that ended first are gone), then one line of
where the time went, how busy the CPUs were and where
the CPU went (each job's own process tree, from ``wait4``, and its labs' containers and VMs,
from ``lab.cpu.LabCpuMeter``; ``.test-reports/cpu.json``).

``GPUNODE_TEST_SHUFFLE=<seed>|random`` (tests/conftest.py) shuffles the unit and VM tiers'
modules and the lab queue with one seed, printed first.

    python -m tests.tiers [--setup-s N] [--lint-s N] [unit] [lab] [vm] [-- pytest args]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

from lab import DEFAULT_NAME as DEFAULT_LAB_NAME
from lab.cpu import LabCpuMeter
from tests.conftest import SHUFFLE, shuffle_seed

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / ".test-reports"
MODULE_SECONDS = Path(__file__).with_name("module_seconds.json")
# What each job's CPU was (its own processes', its labs'), written at the end of a run.
CPU_REPORT = REPORTS / "cpu.json"
PYTEST = [sys.executable, "-m", "pytest"]
TIERS: dict[str, list[str]] = {
    "unit": ["tests/unit"],
    "lab": ["tests/integration", "-m", "not vm"],
    "vm": ["tests/integration", "-m", "vm"],
}
LAB_SHARDS = "GPUNODE_TEST_LAB_SHARDS"
DEFAULT_LAB_SHARDS = 2
# Subnets beside the session lab's (10.213.S.0/24): the VM tier's lab S+1, lab shard k
# S+10k; a lab tier's modules with labs of their own take their lab's subnet + 100 to + 105.
VM_SUBNET_OFFSET = 1
SHARD_SUBNET_STEP = 10
# Lab identities a run may use (shards and helping workers): subnets up to S+10*7+105.
SHARD_LIMIT = 8
# The marker of lab modules that need none of the shared lab's nodes (a lab of their own).
OWN_LAB = "own_lab"


def _beside(env: dict[str, str], suffix: str, subnet_offset: int) -> dict[str, str]:
    """``env`` with a lab of its own beside the session lab: its directory, name and subnet."""
    env = dict(env)
    state = Path(env.get("GPUNODE_LAB_DIR", ROOT / ".lab"))
    env["GPUNODE_LAB_DIR"] = str(state.with_name(f"{state.name}-{suffix}"))
    env["GPUNODE_LAB_NAME"] = env.get("GPUNODE_LAB_NAME", "gpunode-lab") + f"-{suffix}"
    env["GPUNODE_LAB_SUBNET"] = str(int(env.get("GPUNODE_LAB_SUBNET", "0")) + subnet_offset)
    return env


def tier_environment(
    tier: str, environ: dict[str, str] | None = None, shard: int = 0
) -> dict[str, str]:
    """The environment a pytest of ``tier`` runs in: the VM tier's lab is its own, and so is
    each lab shard's but the first (the session lab)."""
    env = dict(os.environ if environ is None else environ)
    if tier == "vm":
        return _beside(env, "vm", VM_SUBNET_OFFSET)
    if tier == "lab" and shard > 0:
        return _beside(env, f"shard{shard}", SHARD_SUBNET_STEP * shard)
    return env


def format_seconds(seconds: float) -> str:
    """``95.3`` -> ``1m35s``; under a minute, ``42s``."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    return f"{whole // 60}m{whole % 60:02d}s"


@dataclass
class Job:
    """One pytest process of a tier."""

    tier: str
    args: list[str]
    name: str
    returncode: int | None = None
    seconds: float = 0.0
    # CPU seconds of its own process tree (pytest and all it ran and waited for: pyinfra, ssh)
    # and of its labs' containers and VMs while it ran (lab.cpu.LabCpuMeter).
    tree_cpu_s: float = 0.0
    lab_cpu_s: float = 0.0

    @property
    def cpu_s(self) -> float:
        return self.tree_cpu_s + self.lab_cpu_s

    def paths(self) -> tuple[Path, Path]:
        """Its log and JUnit XML under .test-reports/."""
        stem = REPORTS / self.name
        return stem.with_name(stem.name + ".log"), stem.with_name(stem.name + ".xml")


@dataclass
class TierRun:
    name: str
    jobs: list[Job]
    workers: int = 1
    started: float = 0.0
    ended: float = 0.0
    # Names of the jobs that need none of the tier's shared lab (marker own_lab): other tiers'
    # workers take them once their own tier is done.
    own_lab: frozenset[str] = frozenset()
    # The lab identities its jobs ran on (shards, and the other tiers' workers that helped).
    labs_used: set[int] = field(default_factory=set)

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    @property
    def failed(self) -> list[Job]:
        return [job for job in self.jobs if job.returncode != 0]


class Runner:
    """Runs jobs, several at once, each its own process group; prints each log whole."""

    def __init__(self, to_log: bool, meter: LabCpuMeter | None = None) -> None:
        self.to_log = to_log
        self.meter = meter
        self.print_lock = threading.Lock()
        self.processes: set[subprocess.Popen] = set()
        self.stopping = False

    def run(self, job: Job, env: dict[str, str]) -> None:
        command = [*PYTEST, *job.args]
        output = None
        if self.to_log:
            log, xml = job.paths()
            log.parent.mkdir(parents=True, exist_ok=True)
            command.append(f"--junitxml={xml}")
            output = log.open("wb")
        started = time.monotonic()
        with self.print_lock:
            if self.stopping:
                job.returncode = -signal.SIGINT
                return
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT if output else None,
                start_new_session=self.to_log,
            )
            self.processes.add(process)
            # The lab a lab or VM job's nodes are on (and the labs of its own named after it).
            lab = env.get("GPUNODE_LAB_NAME", DEFAULT_LAB_NAME) if job.tier != "unit" else None
            if self.meter is not None and lab is not None:
                self.meter.hold(lab, job)
        if output is not None:
            output.close()
        # wait4: the exit status and the CPU of every process the job reaped, itself included.
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = job.returncode = os.waitstatus_to_exitcode(status)
        job.seconds = time.monotonic() - started
        job.tree_cpu_s = usage.ru_utime + usage.ru_stime
        if self.meter is not None and lab is not None:
            job.lab_cpu_s = self.meter.release(lab)
        with self.print_lock:
            self.processes.discard(process)
            if self.to_log:
                log, _ = job.paths()
                verdict = "passed" if job.returncode == 0 else f"FAILED ({job.returncode})"
                sys.stdout.write(
                    f"\n===== {job.name}: {verdict} in {format_seconds(job.seconds)}, "
                    f"CPU {job.cpu_s:.0f} s =====\n"
                )
                sys.stdout.flush()
                sys.stdout.buffer.write(log.read_bytes())
                sys.stdout.flush()

    def interrupt(self) -> None:
        with self.print_lock:
            self.stopping = True
            for process in self.processes:
                if self.to_log:
                    os.killpg(process.pid, signal.SIGINT)


def lab_modules(env: dict[str, str], marker: str = "") -> list[str]:
    """The integration test modules with container tests, as pytest collects them (``marker``:
    only those with tests of that marker)."""
    args = list(TIERS["lab"])
    if marker:
        args[-1] = f"({args[-1]}) and {marker}"
    collected = subprocess.run(
        [*PYTEST, *args, "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if collected.returncode != 0:
        raise SystemExit(f"collecting the lab tier failed:\n{collected.stdout}{collected.stderr}")
    return list(
        dict.fromkeys(
            line.split("::", 1)[0] for line in collected.stdout.splitlines() if "::" in line
        )
    )


def queue_order(modules: list[str], seconds: dict[str, float], seed: int | None) -> list[str]:
    """The lab queue: longest first (a module not timed yet first of all: it may be long);
    with a seed, shuffled instead."""
    if seed is not None:
        shuffled = list(modules)
        random.Random(seed).shuffle(shuffled)
        return shuffled
    return sorted(modules, key=lambda module: -seconds.get(module, float("inf")))


def recorded_seconds(path: Path = MODULE_SECONDS) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    modules = data.get("modules", {}) if isinstance(data, dict) else {}
    return {
        str(module): float(value)
        for module, value in modules.items()
        if isinstance(value, int | float)
    }


def shards_wanted(env: dict[str, str]) -> int:
    value = env.get(LAB_SHARDS, str(DEFAULT_LAB_SHARDS))
    if not value.isdigit() or not 1 <= int(value) <= SHARD_LIMIT:
        raise SystemExit(f"{LAB_SHARDS}={value!r}: a number of labs from 1 to {SHARD_LIMIT}")
    return int(value)


def plan(
    tiers: list[str], extra: list[str], env: dict[str, str], seed: int | None
) -> list[TierRun]:
    """One job per tier, but the lab tier in a full run: one job per module, on shards."""
    runs = []
    for tier in tiers:
        if tier == "lab" and len(tiers) > 1 and not extra:
            modules = queue_order(lab_modules(env), recorded_seconds(), seed)
            jobs = [
                Job("lab", [module, "-m", "not vm"], "lab/" + Path(module).stem)
                for module in modules
            ]
            own_lab = frozenset("lab/" + Path(module).stem for module in lab_modules(env, OWN_LAB))
            runs.append(
                TierRun(
                    "lab", jobs, workers=min(shards_wanted(env), len(jobs)) or 1, own_lab=own_lab
                )
            )
        else:
            runs.append(TierRun(tier, [Job(tier, [*TIERS[tier], *extra], tier)]))
    return runs


def execute(runs: list[TierRun], runner: Runner, env: dict[str, str]) -> None:
    """Every tier at once; a tier's workers take its jobs in turn. The lab tier's own-lab jobs
    wait in a queue of their own: the other tiers' workers take them once their tier is done,
    each on a lab identity of its own (lab shard numbers after the tier's), and the lab
    shards once their own queue is empty."""
    threads = []
    lab_run = next((run for run in runs if run.name == "lab" and run.own_lab), None)
    own_lab: queue.Queue[Job] = queue.Queue()
    helpers = iter(range(lab_run.workers if lab_run else 0, SHARD_LIMIT))
    helpers_lock = threading.Lock()

    def take(tier_run: TierRun, shard: int, pending: queue.Queue[Job]) -> None:
        shard_env = tier_environment(tier_run.name, env, shard)
        while True:
            try:
                job = pending.get_nowait()
            except queue.Empty:
                return
            tier_run.labs_used.add(shard)
            runner.run(job, shard_env)
            tier_run.ended = max(tier_run.ended, time.monotonic())

    def work(tier_run: TierRun, shard: int, pending: queue.Queue[Job]) -> None:
        try:
            take(tier_run, shard, pending)
        finally:
            tier_run.ended = max(tier_run.ended, time.monotonic())
        if lab_run is None or own_lab.empty():
            return
        if tier_run is lab_run:
            take(lab_run, shard, own_lab)
            return
        with helpers_lock:
            helper = next(helpers, None)
        if helper is not None:
            take(lab_run, helper, own_lab)

    for tier_run in runs:
        pending: queue.Queue[Job] = queue.Queue()
        for job in tier_run.jobs:
            (own_lab if tier_run is lab_run and job.name in tier_run.own_lab else pending).put(job)
        tier_run.started = time.monotonic()
        for shard in range(tier_run.workers):
            thread = threading.Thread(target=work, args=(tier_run, shard, pending))
            thread.start()
            threads.append(thread)
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=1)
    except KeyboardInterrupt:
        runner.interrupt()
        for thread in threads:
            thread.join()
        raise


def cpu_times(stat: str | None = None) -> tuple[int, int]:
    """(busy, total) jiffies of every CPU since boot, from /proc/stat's first line."""
    if stat is None:
        stat = Path("/proc/stat").read_text()
    fields = [int(value) for value in stat.splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """How busy the machine's CPUs were between two cpu_times(), 0..1: near 1, the tiers
    wait on the CPU and running more at once gains little; well below, they wait on I/O."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else 0.0


def time_line(
    runs: list[TierRun], setup_s: float | None, lint_s: float | None, total_s: float
) -> str:
    """One line of where the time went; setup and lint where ./dev timed them (None: not run)."""
    parts = []
    if setup_s is not None:
        parts.append(f"setup {format_seconds(setup_s)}")
    if lint_s is not None:
        parts.append(f"lint {format_seconds(lint_s)}")
    tiers = []
    for tier_run in runs:
        text = f"{tier_run.name} {format_seconds(tier_run.seconds)}"
        labs = len(tier_run.labs_used) or tier_run.workers
        if labs > 1:
            text += f" ({len(tier_run.jobs)} modules on {labs} labs)"
        tiers.append(text)
    if len(runs) > 1:
        tiers[-1] += " (tiers at once)"
    return "time: " + ", ".join([*parts, *tiers, f"total {format_seconds(total_s)}"])


def cpu_line(share: float, cpus: int | None) -> str:
    return f"CPU busy {share:.0%} of {cpus or '?'} CPUs while the tiers ran"


def machine_busy_s(before: tuple[int, int], after: tuple[int, int]) -> float:
    """CPU seconds the whole machine was busy between two cpu_times()."""
    return (after[0] - before[0]) / os.sysconf("SC_CLK_TCK")


def cpu_by_tier_line(runs: list[TierRun], busy_s: float) -> str:
    """Where the CPU went: each tier's (its processes and its labs'), and the rest of the
    machine's busy time (dockerd, the kernel, labs not the suite's, other work)."""
    parts = [f"{run.name} {sum(job.cpu_s for job in run.jobs):.0f}" for run in runs]
    counted = sum(job.cpu_s for run in runs for job in run.jobs)
    return (
        f"CPU-s: {', '.join(parts)}, other {max(0.0, busy_s - counted):.0f} "
        f"(machine busy {busy_s:.0f})"
    )


def cpu_report(runs: list[TierRun], busy_s: float, unheld_s: float) -> dict:
    """cpu.json: each job's wall and CPU seconds (bench/suite.py shows them by module)."""
    return {
        "machine_busy_cpu_s": round(busy_s, 1),
        "labs_not_the_suites_cpu_s": round(unheld_s, 1),
        "jobs": {
            job.name: {
                "tier": job.tier,
                "wall_s": round(job.seconds, 1),
                "tree_cpu_s": round(job.tree_cpu_s, 1),
                "lab_cpu_s": round(job.lab_cpu_s, 1),
            }
            for run in runs
            for job in run.jobs
            if job.returncode is not None
        },
    }


# How much of each failed test's report the run's last lines repeat: CI shows only the end of
# a run's output, where the logs of the jobs that ended first are long gone.
FAILURE_LINES = 40
FAILED_TESTS_SHOWN = 10


def printable(text: str) -> str:
    """Text a test reported (node output among it), without control characters but newline and
    tab."""
    return "".join(
        char if char in "\n\t" or (char.isprintable() and char != "\x7f") else "?" for char in text
    )


def failure_summary(job: Job) -> list[str]:
    """The failed tests of a job, each with the end of what pytest reported of it, from its JUnit
    XML; where that XML is missing or unreadable (the job died before writing it), the end of
    its log."""
    log, xml = job.paths()
    lines = [f"--- {job.name}: pytest exit {job.returncode}"]
    try:
        root = ElementTree.parse(xml).getroot()
    except (OSError, ElementTree.ParseError) as error:
        lines.append(f"(no test report: {printable(str(error))}; the end of its log follows)")
        try:
            tail = log.read_bytes().decode("utf-8", "replace").splitlines()[-FAILURE_LINES:]
        except OSError as log_error:
            tail = [f"(no log either: {log_error})"]
        return lines + [printable(line) for line in tail]
    failed = [
        (case, problem)
        for case in root.iter("testcase")
        for problem in case
        if problem.tag in ("failure", "error")
    ]
    if not failed:
        lines.append("(no test failed or erred in its report: pytest itself failed; see its log)")
    for case, problem in failed[:FAILED_TESTS_SHOWN]:
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        lines.append(f"{problem.tag.upper()} {printable(name)}")
        text = (problem.text or problem.get("message") or "").splitlines()
        if len(text) > FAILURE_LINES:
            lines.append(f"  ... (the first {len(text) - FAILURE_LINES} lines are in its log)")
        lines.extend("  " + printable(line) for line in text[-FAILURE_LINES:])
    if len(failed) > FAILED_TESTS_SHOWN:
        lines.append(f"... and {len(failed) - FAILED_TESTS_SHOWN} more failed tests (see its log)")
    return lines


def run(tiers: list[str], extra: list[str], setup_s: float | None, lint_s: float | None) -> int:
    began = time.monotonic()
    cpu_before = cpu_times()
    env = dict(os.environ)
    seed = shuffle_seed(env.get(SHUFFLE))
    if seed is not None:
        env[SHUFFLE] = str(seed)
        print(f"test modules shuffled: {SHUFFLE}={seed} runs them in this order again")
    runs = plan(tiers, extra, env, seed)
    several = len(runs) > 1 or any(len(tier_run.jobs) > 1 for tier_run in runs)
    meter = LabCpuMeter().start() if several else None
    try:
        execute(runs, Runner(to_log=several, meter=meter), env)
    finally:
        if meter is not None:
            meter.stop()
    print()
    if several:
        for tier_run in runs:
            for job in tier_run.failed:
                print("\n".join(failure_summary(job)))
    for tier_run in runs:
        failed = tier_run.failed
        verdict = (
            "passed"
            if not failed
            else "FAILED: "
            + ", ".join(f"{job.name} (pytest exit {job.returncode})" for job in failed)
        )
        print(f"tier {tier_run.name}: {verdict}")
    before = (setup_s or 0.0) + (lint_s or 0.0)
    print(time_line(runs, setup_s, lint_s, time.monotonic() - began + before))
    cpu_after = cpu_times()
    print(cpu_line(busy_share(cpu_before, cpu_after), os.cpu_count()))
    if meter is not None:
        busy_s = machine_busy_s(cpu_before, cpu_after)
        print(cpu_by_tier_line(runs, busy_s))
        CPU_REPORT.parent.mkdir(parents=True, exist_ok=True)
        CPU_REPORT.write_text(json.dumps(cpu_report(runs, busy_s, meter.unheld), indent=2) + "\n")
    failed_tiers = [tier_run.name for tier_run in runs if tier_run.failed]
    if failed_tiers:
        print("failed tiers: " + ", ".join(failed_tiers))
    return 1 if failed_tiers else 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in args:
        extra = args[args.index("--") + 1 :]
        args = args[: args.index("--")]
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("tiers", nargs="*", metavar="tier", help=", ".join(TIERS))
    parser.add_argument("--setup-s", type=float, default=None, help="seconds set-up took")
    parser.add_argument("--lint-s", type=float, default=None, help="seconds lint took")
    options = parser.parse_args(args)
    unknown = [tier for tier in options.tiers if tier not in TIERS]
    if unknown:
        parser.error(f"no tier {', '.join(unknown)}: the tiers are {', '.join(TIERS)}")
    tiers = list(dict.fromkeys(options.tiers)) or list(TIERS)
    return run(tiers, extra, options.setup_s, options.lint_s)


if __name__ == "__main__":
    sys.exit(main())

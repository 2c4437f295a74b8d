"""The test suite's tiers, and `./dev test`'s runner of them.

The suite has three tiers that need nothing of each other:

- ``unit``: tests/unit, no lab (CPU-bound, a few minutes);
- ``lab``: tests/integration on lab containers (``-m "not vm"``; mostly waiting on SSH and apt);
- ``vm``: tests/integration on a lab VM with a real kernel (``-m vm``; qemu under TCG on CI).

Run one after the other they cost their sum; run at once they cost about the longest, because
the lab tier mostly waits while the VM tier's emulated CPU and the unit tests compute. Each
tier is its own pytest process: the VM tier gets a lab of its own (state directory, name and
subnet), so that no teardown of one tier removes what the other uses.

With several tiers, each one's output goes to ``.test-reports/<tier>.log`` (with its JUnit
XML beside it, read by ``bench/suite.py`` for the per-module wall times) and is printed whole
when the tier ends, so that logs never interleave; with one tier, pytest prints as it goes.
The run ends with one line of where the time went.

    python tests/tiers.py [--setup-s N] [--lint-s N] [unit] [lab] [vm] [-- pytest args]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / ".test-reports"
PYTEST = [sys.executable, "-m", "pytest"]
TIERS: dict[str, list[str]] = {
    "unit": ["tests/unit"],
    "lab": ["tests/integration", "-m", "not vm"],
    "vm": ["tests/integration", "-m", "vm"],
}
# The VM tier's lab lives beside the session lab: its own directory, name and subnet
# (10.213.<session's + 1>.0/24; the lab tier's modules with labs of their own take
# the session's subnet + 100 to + 104).
VM_SUBNET_OFFSET = 1


def tier_environment(tier: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment ``tier``'s pytest runs in: the VM tier's lab is its own."""
    env = dict(os.environ if environ is None else environ)
    if tier == "vm":
        state = Path(env.get("GPUNODE_LAB_DIR", ROOT / ".lab"))
        env["GPUNODE_LAB_DIR"] = str(state.with_name(state.name + "-vm"))
        env["GPUNODE_LAB_NAME"] = env.get("GPUNODE_LAB_NAME", "gpunode-lab") + "-vm"
        subnet = int(env.get("GPUNODE_LAB_SUBNET", "0")) + VM_SUBNET_OFFSET
        env["GPUNODE_LAB_SUBNET"] = str(subnet)
    return env


def format_seconds(seconds: float) -> str:
    """``95.3`` -> ``1m35s``; under a minute, ``42s``."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    return f"{whole // 60}m{whole % 60:02d}s"


@dataclass
class TierRun:
    name: str
    process: subprocess.Popen
    started: float
    log: Path | None
    ended: float | None = None

    @property
    def seconds(self) -> float:
        return (self.ended or time.monotonic()) - self.started


def start(tier: str, extra: list[str], to_log: bool) -> TierRun:
    command = [*PYTEST, *TIERS[tier], *extra]
    log = None
    output = None
    if to_log:
        REPORTS.mkdir(exist_ok=True)
        log = REPORTS / f"{tier}.log"
        command.append(f"--junitxml={REPORTS / f'{tier}.xml'}")
        output = log.open("wb")
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=tier_environment(tier),
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT if output else None,
        # Its own process group: an interrupted run stops each tier and what it started.
        start_new_session=to_log,
    )
    if output is not None:
        output.close()
    return TierRun(tier, process, time.monotonic(), log)


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


def time_line(runs: list[TierRun], setup_s: float, lint_s: float, total_s: float) -> str:
    parts = []
    if setup_s:
        parts.append(f"setup {format_seconds(setup_s)}")
    if lint_s:
        parts.append(f"lint {format_seconds(lint_s)}")
    tiers = [f"{run.name} {format_seconds(run.seconds)}" for run in runs]
    if len(runs) > 1:
        tiers[-1] += " (at once)"
    return "time: " + ", ".join([*parts, *tiers, f"total {format_seconds(total_s)}"])


def cpu_line(share: float, cpus: int | None) -> str:
    return f"CPU busy {share:.0%} of {cpus or '?'} CPUs while the tiers ran"


def run(tiers: list[str], extra: list[str], setup_s: float, lint_s: float) -> int:
    began = time.monotonic()
    cpu_before = cpu_times()
    several = len(tiers) > 1
    runs = [start(tier, extra, to_log=several) for tier in tiers]
    pending = list(runs)
    try:
        while pending:
            for tier_run in list(pending):
                if tier_run.process.poll() is None:
                    continue
                tier_run.ended = time.monotonic()
                pending.remove(tier_run)
                if tier_run.log is not None:
                    sys.stdout.write(f"\n===== tier {tier_run.name}: {tier_run.log} =====\n")
                    sys.stdout.flush()
                    sys.stdout.buffer.write(tier_run.log.read_bytes())
                    sys.stdout.flush()
            if pending:
                time.sleep(1)
    except KeyboardInterrupt:
        for tier_run in pending:
            if several:
                os.killpg(tier_run.process.pid, signal.SIGINT)
        for tier_run in pending:
            tier_run.process.wait()
        raise
    failed = [run.name for run in runs if run.process.returncode != 0]
    for tier_run in runs:
        verdict = "passed" if tier_run.process.returncode == 0 else "FAILED"
        print(f"tier {tier_run.name}: {verdict} (pytest exit {tier_run.process.returncode})")
    print(time_line(runs, setup_s, lint_s, time.monotonic() - began + setup_s + lint_s))
    print(cpu_line(busy_share(cpu_before, cpu_times()), os.cpu_count()))
    if failed:
        print("failed tiers: " + ", ".join(failed))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in args:
        extra = args[args.index("--") + 1 :]
        args = args[: args.index("--")]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tiers", nargs="*", metavar="tier", help=", ".join(TIERS))
    parser.add_argument("--setup-s", type=float, default=0.0, help="seconds set-up took")
    parser.add_argument("--lint-s", type=float, default=0.0, help="seconds lint took")
    options = parser.parse_args(args)
    unknown = [tier for tier in options.tiers if tier not in TIERS]
    if unknown:
        parser.error(f"no tier {', '.join(unknown)}: the tiers are {', '.join(TIERS)}")
    tiers = list(dict.fromkeys(options.tiers)) or list(TIERS)
    return run(tiers, extra, options.setup_s, options.lint_s)


if __name__ == "__main__":
    sys.exit(main())

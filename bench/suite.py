"""Where the test suite's time goes: wall time per test module, per tier, from the JUnit XML
that `./dev test` leaves in .test-reports/ (tests/tiers.py: unit.xml, vm.xml, and one file per
lab module in lab/).

    python bench/suite.py [--reports .test-reports] [--top 40] [--write-seconds]

``--write-seconds`` records each lab module's seconds in tests/module_seconds.json, the order
in which the next run's lab queue starts (longest first), with the date of the run.

A module's time is the sum of its tests' times as pytest reports them (set-up, call and
tear-down each), so a module-scoped fixture counts in the module that first asks for it; a
session fixture (the lab's nodes) counts in the first module of its process: each lab module
is a process of its own, so each pays its lab's check (and a fresh lab's first converge).
The tiers run at once and the lab tier's modules on several labs, so the suite's wall time is
about its longest tier, not the sum printed here. Compare two runs' tables in review: a change that
adds minutes shows as a module that grew.

Where the run left ``cpu.json`` (tests/tiers.py), each tier's CPU seconds and each lab module's
are shown too: its own processes' (pytest, pyinfra, ssh) and its labs' containers' and VMs'.
On a CPU-bound machine a module's wall time is mostly waiting for the CPU that the others use;
its CPU seconds are what it costs the suite.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_of(classname: str) -> str:
    """pytest's JUnit classname (``tests.unit.test_model`` or ``tests.unit.test_x.TestY``)
    -> the module's path (``tests/unit/test_model.py``)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        if parts[end - 1].startswith("test_"):
            return "/".join(parts[:end]) + ".py"
    return classname


def module_times(report: Path) -> dict[str, tuple[float, int]]:
    """Module -> (seconds, number of tests) in one tier's JUnit XML."""
    times: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for case in ElementTree.parse(report).iter("testcase"):
        entry = times[module_of(case.get("classname", "?"))]
        entry[0] += float(case.get("time", "0") or 0)
        entry[1] += 1
    return {module: (seconds, int(count)) for module, (seconds, count) in times.items()}


def job_cpu(reports: Path) -> dict[str, float]:
    """Job name (``unit``, ``vm``, ``lab/<module>``) -> CPU seconds, from the run's cpu.json;
    empty where the run left none."""
    try:
        jobs = json.loads((reports / "cpu.json").read_text())["jobs"]
        return {
            str(name): float(job["tree_cpu_s"]) + float(job["lab_cpu_s"])
            for name, job in jobs.items()
        }
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def module_cpu(cpu: dict[str, float], tier: str, module: str) -> str:
    """A lab module's CPU seconds (a job of its own), as a column; ``-`` for the others."""
    used = cpu.get(f"lab/{Path(module).stem}") if tier == "lab" else None
    return f"{used:.0f}" if used is not None else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=Path, default=ROOT / ".test-reports")
    parser.add_argument("--top", type=int, default=40, help="modules to list (default 40)")
    parser.add_argument(
        "--write-seconds", action="store_true", help="record the lab modules' seconds"
    )
    options = parser.parse_args(argv)
    reports = sorted(options.reports.rglob("*.xml"))
    if not reports:
        print(f"no JUnit reports in {options.reports}: run ./dev test first", file=sys.stderr)
        return 2
    by_tier: dict[str, dict[str, tuple[float, int]]] = defaultdict(dict)
    for report in reports:
        # unit.xml, vm.xml: the tier; lab/<module>.xml: the lab tier
        relative = report.relative_to(options.reports)
        tier = relative.parts[0] if len(relative.parts) > 1 else report.stem
        by_tier[tier].update(module_times(report))
    cpu = job_cpu(options.reports)
    rows = []
    for tier, times in sorted(by_tier.items()):
        total = sum(seconds for seconds, _ in times.values())
        tier_cpu = sum(used for name, used in cpu.items() if name.split("/")[0] == tier)
        used = f", CPU {tier_cpu:.0f} s" if cpu else ""
        print(f"tier {tier}: {total / 60:.1f} min in {len(times)} modules{used}")
        rows += [(seconds, tier, module, count) for module, (seconds, count) in times.items()]
    print(f"\n{'seconds':>8}  {'CPU-s':>6}  {'tier':<5} {'tests':>5}  module")
    for seconds, tier, module, count in sorted(rows, reverse=True)[: options.top]:
        print(f"{seconds:8.1f}  {module_cpu(cpu, tier, module):>6}  {tier:<5} {count:5d}  {module}")
    if options.write_seconds:
        record = {
            "measured": datetime.date.today().isoformat(),
            "how": "bench/suite.py --write-seconds after ./dev test (JUnit times per module)",
            "modules": {
                module: round(seconds, 1)
                for module, (seconds, _) in sorted(by_tier.get("lab", {}).items())
            },
        }
        path = ROOT / "tests" / "module_seconds.json"
        path.write_text(json.dumps(record, indent=2) + "\n")
        print(f"\nwrote {path.relative_to(ROOT)}: {len(record['modules'])} lab modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())

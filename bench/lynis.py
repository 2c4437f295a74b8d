"""lynis's hardening index on a fresh lab node, before and after deploys/harden.py with every
audit key on (AIDE, ClamAV, auditd, lynis, the audit tools), and the lynis items still lost.

    .venv/bin/python bench/lynis.py [--fresh] [--node lab-1]
    .venv/bin/python bench/lynis.py --vm [--node NAME]     # a lab VM (gpunode lab up --vms 1)

Each audit is ``lynis audit system --cronjob`` (the timer's command, roles/lynis.py); the
index and the lost items are read from /var/log/lynis-report.dat by gpunode's own parser
(facts.lynis): the test IDs of its warning[] and suggestion[] lines; the points each test
lost, and the index's points and total, from lynis's log (/var/log/lynis.log: a test's
"Performing test ID" line, then one "hardening points (N of M)" line for each item it
scores, lynis's AddHP, include/functions). --fresh: new containers
first (from the kept image). --vm: the audit runs on a lab VM, which must be up and listed
in inventories/lab.py (``gpunode lab up --vms 1``); this script never boots one. A
measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from facts.lynis import parse_report  # noqa: E402
from gpunode.expected.lynis import REPORT  # noqa: E402
from gpunode.model import FileIntegrity  # noqa: E402
from lab import LOGIN_USER, Lab, LabNode, hwsim, signatures  # noqa: E402

DEPLOY = "deploys/harden.py"
LOG = "/var/log/lynis.log"


def audit_on(lab: Lab) -> str:
    """``--data audit=...`` with every audit key on: AIDE (the lab's hardware doubles left
    out, as test_file_integrity.py does), ClamAV (signatures from the lab's own mirror, as
    test_malware_scan.py has them: ClamAV's official mirrors are out of the lab's reach),
    auditd, lynis and the audit tools (the model's defaults)."""
    mirror = lab.clamav_mirror_url
    return "audit=" + json.dumps(
        {
            "file_integrity": {
                "enabled": True,
                "exclude": [*FileIntegrity().exclude, *hwsim.simulator_paths()],
            },
            "malware_scan": {
                "enabled": True,
                "signatures": {
                    "private_mirror": mirror,
                    "custom_urls": [f"{mirror}/{signatures.DATABASE}"],
                    "official": False,
                },
            },
            "auditd": {"enabled": True},
            "lynis": {"enabled": True},
            "tools": {},
        }
    )


def points_lost(log: str) -> tuple[list[tuple[str, int]], tuple[int, int] | None]:
    """From lynis's log: [(test id, points it lost)], most first, and (points, total) of
    the index (its last "Currently having N points (out of M)")."""
    lost: dict[str, int] = {}
    test = "?"
    totals = None
    for line in log.splitlines():
        started = re.search(r"Performing test ID (\S+)", line)
        if started:
            test = started.group(1)
        points = re.search(r"hardening points \((\d+) of (\d+)\)", line)
        if points and int(points.group(2)) > int(points.group(1)):
            lost[test] = lost.get(test, 0) + int(points.group(2)) - int(points.group(1))
        having = re.search(r"Currently having (\d+) points \(out of (\d+)\)", line)
        if having:
            totals = (int(having.group(1)), int(having.group(2)))
    return sorted(lost.items(), key=lambda item: (-item[1], item[0])), totals


def ssh(lab: Lab, node: LabNode, command: str) -> str:
    result = subprocess.run(
        [
            "ssh", "-i", str(lab.key_path), "-o", f"UserKnownHostsFile={lab.known_hosts_path}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
            f"{LOGIN_USER}@{node.address}", command,
        ],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"{node.name}: {command!r} failed: {result.stderr.strip()[-2000:]}")
    return result.stdout


def audit(lab: Lab, node: LabNode) -> tuple[int, list[str], str]:
    """(hardening index, sorted test IDs of the report's warnings and suggestions, the
    points each test lost and the index's points, in words)."""
    ssh(lab, node, "sudo /usr/sbin/lynis audit system --cronjob >/dev/null 2>&1")
    parsed = parse_report(ssh(lab, node, f"sudo cat {REPORT}"))
    report = parsed["report"]
    if report["hardening_index"] is None:
        raise SystemExit(f"{node.name}: no hardening index in {REPORT}: {parsed['problems']}")
    items = report["warnings"] + report["suggestions"]
    lost, totals = points_lost(ssh(lab, node, f"sudo cat {LOG}"))
    points = f"{totals[0]} of {totals[1]} points" if totals else "no points in the log"
    by_test = ", ".join(f"{test} {count}" for test, count in lost) or "none"
    return (
        report["hardening_index"],
        sorted({item["test"] for item in items}),
        f"{points}; lost by lynis test: {by_test}",
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fresh", action="store_true", help="new containers first")
    parser.add_argument("--vm", action="store_true", help="audit a lab VM (already up)")
    parser.add_argument("--node", default=None, help="the node or VM audited")
    parser.add_argument(
        "--no-before", action="store_true", help="no audit before the deploy (audited already)"
    )
    args = parser.parse_args()
    lab = Lab(log=lambda message: print(message, file=sys.stderr))
    if args.vm:
        nodes: list[LabNode] = [vm for vm in lab.vms() if vm.listed]
        if not nodes:
            raise SystemExit("no lab VM listed in inventories/lab.py: gpunode lab up --vms 1")
    else:
        if args.fresh:
            lab.down(keep_image=True)
        nodes = lab.up(1)
    node = next((n for n in nodes if n.name == (args.node or nodes[0].name)), None)
    if node is None:
        raise SystemExit(f"no node {args.node}; nodes: {', '.join(n.name for n in nodes)}")

    ssh(lab, node, "sudo apt-get update -qq && "
        "sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
        "lynis >/dev/null")  # fmt: skip
    if not args.no_before:
        before, _, before_points = audit(lab, node)
        print(f"{node.name} before {DEPLOY}: hardening index {before} ({before_points})")
    result = subprocess.run(
        [str(Path(sys.executable).with_name("pyinfra")), "-y", "inventories/lab.py", DEPLOY,
         "--limit", node.name, "--data", audit_on(lab)],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"{DEPLOY} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    after, lost, after_points = audit(lab, node)
    print(f"{node.name} after {DEPLOY} (audit keys on): hardening index {after} ({after_points})")
    print(f"lynis items still lost ({len(lost)}): {' '.join(lost)}")


if __name__ == "__main__":
    main()

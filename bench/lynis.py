"""lynis's hardening index on a fresh lab node, before and after deploys/harden.py with the
audit keys on (AIDE, auditd, lynis, the audit tools), and the lynis items still lost.

    .venv/bin/python bench/lynis.py [--fresh] [--node lab-1]
    .venv/bin/python bench/lynis.py --vm [--node NAME]     # a lab VM (gpunode lab up --vms 1)

Each audit is ``lynis audit system --cronjob`` (the timer's command, roles/lynis.py); the
index and the lost items are read from /var/log/lynis-report.dat by gpunode's own parser
(facts.lynis): the test IDs of its warning[] and suggestion[] lines. --fresh: new containers
first (from the kept image). --vm: the audit runs on a lab VM, which must be up and listed
in inventories/lab.py (``gpunode lab up --vms 1``); this script never boots one. A
measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from facts.lynis import parse_report  # noqa: E402
from gpunode.expected.lynis import REPORT  # noqa: E402
from gpunode.model import FileIntegrity  # noqa: E402
from lab import LOGIN_USER, Lab, LabNode, hwsim  # noqa: E402

DEPLOY = "deploys/harden.py"
# Every audit key on: AIDE (the lab's hardware doubles left out, as test_file_integrity.py
# does), auditd, lynis and the audit tools (the model's defaults).
AUDIT_ON = "audit=" + json.dumps(
    {
        "file_integrity": {
            "enabled": True,
            "exclude": [*FileIntegrity().exclude, *hwsim.simulator_paths()],
        },
        "auditd": {"enabled": True},
        "lynis": {"enabled": True},
        "tools": {},
    }
)


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


def audit(lab: Lab, node: LabNode) -> tuple[int, list[str]]:
    """(hardening index, sorted test IDs of the report's warnings and suggestions)."""
    ssh(lab, node, "sudo /usr/sbin/lynis audit system --cronjob >/dev/null 2>&1")
    parsed = parse_report(ssh(lab, node, f"sudo cat {REPORT}"))
    report = parsed["report"]
    if report["hardening_index"] is None:
        raise SystemExit(f"{node.name}: no hardening index in {REPORT}: {parsed['problems']}")
    items = report["warnings"] + report["suggestions"]
    return report["hardening_index"], sorted({item["test"] for item in items})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fresh", action="store_true", help="new containers first")
    parser.add_argument("--vm", action="store_true", help="audit a lab VM (already up)")
    parser.add_argument("--node", default=None, help="the node or VM audited")
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
    before, _ = audit(lab, node)
    print(f"{node.name} before {DEPLOY}: hardening index {before}")
    result = subprocess.run(
        [str(Path(sys.executable).with_name("pyinfra")), "-y", "inventories/lab.py", DEPLOY,
         "--limit", node.name, "--data", AUDIT_ON],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"{DEPLOY} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    after, lost = audit(lab, node)
    print(f"{node.name} after {DEPLOY} (audit keys on): hardening index {after}")
    print(f"lynis items still lost ({len(lost)}): {' '.join(lost)}")


if __name__ == "__main__":
    main()

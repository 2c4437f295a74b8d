"""auditd, lynis and the audit tools (roles.auditd, roles.lynis) on lab nodes: real packages,
a real lynis run, the real drift check.

audit.auditd, audit.lynis and audit.tools are turned on for this module's runs (``--data``,
given to the deploy and to the drift check alike, as an operator would). The nodes are
containers: their kernel (the host's) refuses audit, so auditd is a reported skip with its
reason, nothing installed, and an info finding in the drift report. One converge of
deploys/harden.py serves every test; at the end the audit packages are purged and a run with
the lab's settings (all off) leaves the nodes as the rest of the suite expects them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpunode.expected import auditd as expected_auditd
from gpunode.expected import lynis as expected_lynis
from gpunode.model import AuditTools
from lab import Lab, LabNode

from .conftest import PyinfraRun, lab_audit_data, run_pyinfra, ssh

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
GPUNODE = str(Path(sys.executable).with_name("gpunode"))
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
DEPLOY = "deploys/harden.py"
ON = {"auditd": {"enabled": True}, "lynis": {"enabled": True}, "tools": {}}
AUDIT = lab_audit_data(**ON)
TOOL_PACKAGES = expected_lynis.tool_packages(AuditTools())


def run_ok(lab: Lab, node: LabNode, command: str) -> str:
    result = ssh(lab, node, command)
    assert result.returncode == 0, f"{command}: {result.stdout} {result.stderr}"
    return result.stdout


def audit_findings(node: LabNode, audit: str = AUDIT) -> list[dict]:
    """The audit findings of ``gpunode drift`` for the node, as the nightly job runs it."""
    completed = subprocess.run(
        [GPUNODE, "drift", "inventories/lab.py", "--limit", node.name, "--data", audit, "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    findings = json.loads(completed.stdout)["findings"]
    return [f for f in findings if f["id"].startswith("audit.")]


@pytest.fixture(scope="module")
def converged(lab: Lab, lab_nodes: list[LabNode]) -> Iterator[PyinfraRun]:
    converge = run_pyinfra("-v", DEPLOY, "--data", AUDIT)  # -v: the noop lines, with reasons
    assert converge.returncode == 0, converge.output[-3000:]
    yield converge
    # As the rest of the suite expects the nodes: none of the audit packages (libpam-tmpdir
    # would give every later session its own $TMPDIR), the lab's settings (all off).
    purge = " ".join(["lynis", *TOOL_PACKAGES])
    for node in lab_nodes:
        ssh(lab, node, f"sudo DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq {purge}")
    off = run_pyinfra(DEPLOY)
    assert off.returncode == 0, off.output[-3000:]


def test_auditd_is_a_reported_skip_with_its_reason_and_nothing_installed(
    lab: Lab, lab_nodes: list[LabNode], converged: PyinfraRun
) -> None:
    for node in lab_nodes:
        said = re.findall(rf"\[{re.escape(node.name)}\] noop: auditd skipped: (.*)",
                          converged.output)  # fmt: skip
        assert len(said) == 1 and "the kernel refuses audit requests here (EPERM" in said[0]
        assert ssh(lab, node, "dpkg -s auditd").returncode != 0
        assert ssh(lab, node, f"test -e {expected_auditd.RULES_FILE}").returncode != 0
    findings = audit_findings(lab_nodes[0])
    skipped = [f for f in findings if f["id"] == "audit.auditd.skipped"]
    assert [f["severity"] for f in skipped] == ["info"], findings
    assert "EPERM" in skipped[0]["found"]


def test_the_lynis_items_are_in_place(
    lab: Lab, lab_nodes: list[LabNode], converged: PyinfraRun
) -> None:
    for node in lab_nodes:
        status = run_ok(lab, node, "dpkg-query -W -f '${Package} ${Status}\\n' "
                        + " ".join(["lynis", *TOOL_PACKAGES]))  # fmt: skip
        assert status.count("install ok installed") == len(TOOL_PACKAGES) + 1, status
        assert 'ENABLED="true"' in run_ok(lab, node, f"cat {expected_lynis.SYSSTAT_DEFAULTS}")
        assert "CRON_CHECK=weekly" in run_ok(lab, node, f"cat {expected_lynis.DEBSUMS_DEFAULTS}")
        conf = run_ok(lab, node, f"cat {expected_lynis.NEEDRESTART_CONF}")
        assert "$nrconf{restart} = 'l';" in conf
        assert "pam_tmpdir.so" in run_ok(lab, node, "cat /etc/pam.d/common-session")
        run_ok(lab, node, "test -f /var/log/account/pacct")
        modes = run_ok(lab, node, "stat -c '%a %n' /home/*").split("\n")
        assert all(line.split()[0] in ("750", "700") for line in modes if line), modes
        blacklist = run_ok(lab, node, "cat /etc/modprobe.d/gpunode-blacklist.conf")
        for module in ("usb-storage", "firewire-core", "dccp", "sctp", "rds", "tipc"):
            assert f"blacklist {module}\n" in blacklist
        timer = run_ok(lab, node, f"cat {expected_lynis.TIMER_DROP_IN}")
        assert "OnCalendar=*-*-* 04:30:00" in timer
        assert run_ok(lab, node, "systemctl is-enabled lynis.timer").strip() == "enabled"


def test_a_second_run_changes_nothing(converged: PyinfraRun) -> None:
    again = run_pyinfra(DEPLOY, "--data", AUDIT)
    assert again.returncode == 0, again.output[-3000:]
    assert again.changed_operations() == {}, again.changed_operations()


def test_a_later_run_still_uploads_files_with_libpam_tmpdir_in_place(
    lab: Lab, lab_nodes: list[LabNode], converged: PyinfraRun
) -> None:
    """libpam-tmpdir gives root's sudo sessions a $TMPDIR the login user cannot write:
    pyinfra's uploads go through /tmp (config.py), so a file to put back is put back."""
    for node in lab_nodes:
        run_ok(lab, node, f"sudo rm -f {expected_lynis.NEEDRESTART_CONF}")
        assert "/tmp/user/0" in run_ok(lab, node, "sudo -i sh -c 'echo $TMPDIR'")
    again = run_pyinfra(DEPLOY, "--data", AUDIT)
    assert again.returncode == 0, again.output[-3000:]
    for node in lab_nodes:
        conf = run_ok(lab, node, f"cat {expected_lynis.NEEDRESTART_CONF}")
        assert "$nrconf{restart} = 'l';" in conf


def test_a_lynis_run_is_read_by_the_fact_and_judged_by_the_drift_check(
    lab: Lab, lab_nodes: list[LabNode], converged: PyinfraRun
) -> None:
    node = lab_nodes[-1]
    # No report yet (the timer has not run; none left by an earlier lynis): a warning.
    run_ok(lab, node, f"sudo rm -f {expected_lynis.REPORT}")
    before = audit_findings(node)
    assert [(f["id"], f["severity"]) for f in before if "lynis" in f["id"]] == [
        ("audit.lynis.report", "warning")
    ]
    # The timer's service, run now (oneshot: returns once the report is written).
    run_ok(lab, node, "sudo systemctl start lynis.service")
    written = run_ok(lab, node, f"sudo grep -E '^hardening_index=' {expected_lynis.REPORT}")
    index = int(written.strip().split("=")[1])
    fact = subprocess.run(
        [PYINFRA, "inventories/lab.py", "fact", "facts.lynis.LynisReport", "--limit", node.name,
         "--data", AUDIT],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    # pyinfra prints a fact's data on stderr, between its progress lines.
    text = fact.stderr
    read = json.loads(text[text.index("{") : text.rindex("}") + 1])
    report = read[node.name]
    assert report["state"] == "ok" and report["problems"] == [], report
    assert report["report"]["hardening_index"] == index
    assert report["report"]["suggestions"], report
    # The floor at the index: no finding; above it: a warning naming lynis's test IDs.
    at_floor = lab_audit_data(**{**ON, "lynis": {"enabled": True, "min_hardening_index": index}})
    assert [f["id"] for f in audit_findings(node, at_floor) if "lynis" in f["id"]] == []
    above = lab_audit_data(
        **{**ON, "lynis": {"enabled": True, "min_hardening_index": min(index + 1, 100)}}
    )
    low = [f for f in audit_findings(node, above) if "lynis" in f["id"]]
    assert [(f["id"], f["severity"]) for f in low] == [("audit.lynis.index", "warning")]
    assert low[0]["found"].startswith(f"hardening index {index}; lynis tests with findings:")

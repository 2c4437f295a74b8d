"""File integrity (AIDE, roles.audit) on a lab node: real AIDE, real dpkg, real drift check.

audit.file_integrity is turned on for this module's runs (``--data``, given to the deploys
and to the drift check alike, as an operator would): a run's own changes are taken in, a
binary planted outside a run is a critical finding that a later run does not hide, a
package installed by apt is explained by dpkg, and an operator's accept clears the alerts.
The lab's hardware doubles, which ``gpunode lab up`` rewrites on the node, are left out as
production would have the real tools there. Other modules' runs leave the role off: it then
removes its timer, so what they change by hand is never checked.
"""

from __future__ import annotations

import json
import posixpath
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpunode.expected.audit import CONFIG, CONFIG_LINK, PROGRAM, STATE_DIR, SUMMARY, UNIT
from gpunode.model import FileIntegrity
from lab import Lab, LabNode, hwsim
from roles.kernel import SYSCTL_PATH

from .conftest import lab_audit_data, run_pyinfra, ssh

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
GPUNODE = str(Path(sys.executable).with_name("gpunode"))
DEPLOY = "deploys/harden.py"
IMPLANT = "/usr/local/bin/gpunode-test-implant"
AUDIT = lab_audit_data(
    file_integrity={
        "enabled": True,
        "exclude": [*FileIntegrity().exclude, *hwsim.simulator_paths()],
    }
)
# A sysctl no other test sets: a change of gpunode's own sysctl file, made by a run.
EXTRA_SYSCTL = 'kernel={"sysctls": {"vm.max_map_count": "262144"}}'


def run_ok(lab: Lab, node: LabNode, command: str) -> str:
    result = ssh(lab, node, command)
    assert result.returncode == 0, f"{command}: {result.stdout} {result.stderr}"
    return result.stdout


def summary(lab: Lab, node: LabNode) -> dict:
    return json.loads(run_ok(lab, node, f"sudo cat {SUMMARY}"))


def check_now(lab: Lab, node: LabNode) -> dict:
    """The nightly check, run now by its own unit (oneshot: returns once it has run)."""
    run_ok(lab, node, f"sudo systemctl start {UNIT}.service")
    return summary(lab, node)


def drift_findings(node: LabNode) -> list[dict]:
    """The file integrity findings of ``gpunode drift`` for the node, as the nightly job runs."""
    completed = subprocess.run(
        [GPUNODE, "drift", "inventories/lab.py", "--limit", node.name, "--data", AUDIT, "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    findings = json.loads(completed.stdout)["findings"]
    return [f for f in findings if f["id"].startswith("audit.file_integrity")]


@pytest.fixture(scope="module")
def node(lab: Lab, lab_nodes: list[LabNode]) -> Iterator[LabNode]:
    first = lab_nodes[0]
    converge = run_pyinfra(DEPLOY, "--limit", first.name, "--data", AUDIT)
    assert converge.returncode == 0, converge.output[-3000:]
    yield first
    # Leave the node as the rest of the suite expects it: no implant, no alert, and the role
    # off as the lab inventory has it (its timer and service removed).
    ssh(lab, first, f"sudo rm -f {IMPLANT}")
    ssh(lab, first, f"sudo python3 -I {PROGRAM} --config {CONFIG} --state {STATE_DIR} accept")
    off = run_pyinfra(DEPLOY, "--limit", first.name)
    assert off.returncode == 0, off.output[-3000:]


def test_the_database_is_built_and_checked_on_a_timer(lab: Lab, node: LabNode) -> None:
    run_ok(lab, node, f"sudo test -s {STATE_DIR}/aide.db")
    assert run_ok(lab, node, f"systemctl is-enabled {UNIT}.timer").strip() == "enabled"
    state = check_now(lab, node)
    assert state["last_check_kind"] == "check"
    assert state["alerts"] == [], state
    assert drift_findings(node) == []


def test_aide_s_configuration_is_found_where_lynis_looks_and_names_the_database(
    lab: Lab, node: LabNode
) -> None:
    # What lynis's FINT-4315 and FINT-4316 do: find aide.conf in /etc, check it with aide -D,
    # read database_in from it and look for that file.
    assert run_ok(lab, node, f"readlink {CONFIG_LINK}").strip() == CONFIG
    run_ok(lab, node, f"sudo aide --config={CONFIG_LINK} -D")
    database = run_ok(lab, node, f"grep '^database_in=' {CONFIG_LINK}").strip()
    assert database == f"database_in=file:{STATE_DIR}/aide.db"
    run_ok(lab, node, f"sudo test -s {STATE_DIR}/aide.db")


def test_a_second_run_changes_nothing(node: LabNode) -> None:
    again = run_pyinfra(DEPLOY, "--limit", node.name, "--data", AUDIT)
    assert again.returncode == 0, again.output[-3000:]
    assert again.changed_operations() == {}, again.changed_operations()


def test_a_runs_own_change_is_not_tampering(lab: Lab, node: LabNode) -> None:
    changed = run_pyinfra(DEPLOY, "--limit", node.name, "--data", AUDIT, "--data", EXTRA_SYSCTL)
    assert changed.returncode == 0, changed.output[-3000:]
    assert "262144" in run_ok(lab, node, f"cat {SYSCTL_PATH}")
    state = summary(lab, node)
    assert state["last_check_kind"] == "gpunode-run"
    assert state["last_explained"]["gpunode-run"] >= 1, state
    assert check_now(lab, node)["alerts"] == []
    assert drift_findings(node) == []


@pytest.fixture
def with_extra_sysctl(lab: Lab, node: LabNode) -> LabNode:
    """The node with EXTRA_SYSCTL in gpunode's sysctl file, put there by a run (as
    test_a_runs_own_change_is_not_tampering leaves it; a run of its own where that test did
    not run first, -k): a later run without it then has a change of its own to take in."""
    if "262144" not in run_ok(lab, node, f"cat {SYSCTL_PATH}"):
        added = run_pyinfra(DEPLOY, "--limit", node.name, "--data", AUDIT, "--data", EXTRA_SYSCTL)
        assert added.returncode == 0, added.output[-3000:]
    assert "262144" in run_ok(lab, node, f"cat {SYSCTL_PATH}")
    return node


def test_a_binary_planted_outside_a_run_is_critical_and_no_run_hides_it(
    lab: Lab, with_extra_sysctl: LabNode
) -> None:
    node = with_extra_sysctl
    run_ok(lab, node, f"sudo install -m 755 /bin/true {IMPLANT}")
    alerts = check_now(lab, node)["alerts"]
    assert [(a["kind"], a["path"]) for a in alerts] == [("added", IMPLANT)]
    findings = drift_findings(node)
    assert [(f["id"], f["severity"]) for f in findings] == [
        ("audit.file_integrity.changed", "critical")
    ]
    assert IMPLANT in findings[0]["found"]
    # A run that changes the node (it takes the extra sysctl out again) takes its own changes
    # in, never the implant's alert.
    back = run_pyinfra(DEPLOY, "--limit", node.name, "--data", AUDIT)
    assert back.returncode == 0, back.output[-3000:]
    assert "262144" not in run_ok(lab, node, f"cat {SYSCTL_PATH}")
    assert summary(lab, node)["last_check_kind"] == "gpunode-run"
    assert [a["path"] for a in summary(lab, node)["alerts"]] == [IMPLANT]
    assert [f["severity"] for f in drift_findings(node)] == ["critical"]
    # Removed, which the next check reports too, then accepted by an operator: clean again.
    run_ok(lab, node, f"sudo rm {IMPLANT}")
    assert ("removed", IMPLANT) in [(a["kind"], a["path"]) for a in check_now(lab, node)["alerts"]]
    run_ok(lab, node, f"sudo python3 -I {PROGRAM} --config {CONFIG} --state {STATE_DIR} accept")
    assert drift_findings(node) == []


def test_a_removal_before_a_run_is_an_alert_though_the_run_writes_beside_it(
    lab: Lab, node: LabNode
) -> None:
    # Removed before the run, in the directory where the run then rewrites gpunode's sysctl
    # file: that write moves the directory's ctime past the run's start, which alone would
    # take the removal in as the run's.
    planted = f"{posixpath.dirname(SYSCTL_PATH)}/60-gpunode-test-removed.conf"
    accept = f"sudo python3 -I {PROGRAM} --config {CONFIG} --state {STATE_DIR} accept"
    run_ok(lab, node, f"echo '# a file of the node' | sudo tee {planted} >/dev/null")
    check_now(lab, node)
    run_ok(lab, node, accept)
    run_ok(lab, node, f"sudo rm {planted}")
    extra = "262144" in run_ok(lab, node, f"cat {SYSCTL_PATH}")
    toggled = run_pyinfra(
        DEPLOY, "--limit", node.name, "--data", AUDIT, *([] if extra else ["--data", EXTRA_SYSCTL])
    )
    assert toggled.returncode == 0, toggled.output[-3000:]
    assert ("262144" in run_ok(lab, node, f"cat {SYSCTL_PATH}")) != extra  # the run wrote it
    state = summary(lab, node)
    assert state["last_check_kind"] == "gpunode-run"
    assert [(a["kind"], a["path"]) for a in state["alerts"]] == [("removed", planted)], state
    run_ok(lab, node, accept)


def test_a_changed_configuration_file_is_a_warning(lab: Lab, node: LabNode) -> None:
    run_ok(lab, node, "echo 'PermitRootLogin yes' | sudo tee -a /etc/ssh/ssh_config >/dev/null")
    try:
        alerts = check_now(lab, node)["alerts"]
        assert [(a["kind"], a["path"]) for a in alerts] == [("changed", "/etc/ssh/ssh_config")]
        assert [(f["id"], f["severity"]) for f in drift_findings(node)] == [
            ("audit.file_integrity.changed", "warning")
        ]
    finally:
        run_ok(lab, node, "sudo sed -i '$d' /etc/ssh/ssh_config")
        run_ok(lab, node, f"sudo systemctl start {UNIT}.service")
        run_ok(lab, node, f"sudo python3 -I {PROGRAM} --config {CONFIG} --state {STATE_DIR} accept")


def test_a_package_installed_with_apt_is_explained_by_dpkg(lab: Lab, node: LabNode) -> None:
    # A small Debian package, installed as an operator would, outside any gpunode run.
    apt = "sudo DEBIAN_FRONTEND=noninteractive apt-get"
    run_ok(lab, node, f"if dpkg -s tree >/dev/null 2>&1; then {apt} purge -y -q tree; fi")
    check_now(lab, node)
    run_ok(lab, node, f"{apt} update -q && {apt} install -y -q tree")
    try:
        state = check_now(lab, node)
        assert state["alerts"] == [], state
        assert state["last_explained"]["package"] >= 1, state
    finally:
        run_ok(lab, node, f"{apt} purge -y -q tree")
    state = check_now(lab, node)
    assert state["alerts"] == [], state  # gone while dpkg was busy: the package's doing

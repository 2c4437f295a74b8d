"""deploys/drift_timer.py installs the nightly drift check as a systemd timer, idempotently.

The control host is usually an admin machine; here a lab node stands in for it (the units
are what is tested, not a run of the check, which test_drift covers).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpunode.lab import Lab, LabNode

from .conftest import run_pyinfra, ssh, write_inventory

pytestmark = pytest.mark.lab

DEPLOY = "deploys/drift_timer.py"


def test_timer_installed_enabled_and_idempotent(
    lab: Lab, lab_nodes: list[LabNode], tmp_path: Path
) -> None:
    node = lab_nodes[0]
    data = {"x_drift_inventory": "inventories/prod.py", "x_drift_schedule": "*-*-* 04:10:00"}
    inventory = write_inventory(tmp_path / "control.py", lab, [node], {node.name: data})
    first = run_pyinfra(DEPLOY, inventory=inventory)
    assert first.returncode == 0, first.output
    unit = ssh(lab, node, "systemctl cat gpunode-drift.service gpunode-drift.timer").stdout
    assert "drift inventories/prod.py --baseline /var/lib/gpunode/drift/latest.json" in unit
    assert "--prometheus /var/lib/prometheus/node-exporter/gpunode_drift.prom" in unit
    assert "SuccessExitStatus=1" in unit
    assert "OnCalendar=*-*-* 04:10:00" in unit
    assert ssh(lab, node, "systemctl is-enabled gpunode-drift.timer").stdout.strip() == "enabled"
    assert ssh(lab, node, "systemctl is-active gpunode-drift.timer").stdout.strip() == "active"
    second = run_pyinfra(DEPLOY, inventory=inventory)
    assert second.returncode == 0, second.output
    assert second.changed_operations() == {}
    cleanup = (
        "sudo systemctl disable --now gpunode-drift.timer && sudo rm -f "
        "/etc/systemd/system/gpunode-drift.service /etc/systemd/system/gpunode-drift.timer && "
        "sudo systemctl daemon-reload"
    )
    assert ssh(lab, node, cleanup).returncode == 0


def test_missing_inventory_is_refused_before_any_change(
    lab: Lab, lab_nodes: list[LabNode], tmp_path: Path
) -> None:
    node = lab_nodes[0]
    data = {"x_drift_inventory": "inventories/nope.py"}
    inventory = write_inventory(tmp_path / "control.py", lab, [node], {node.name: data})
    run = run_pyinfra(DEPLOY, inventory=inventory)
    assert run.returncode != 0
    assert "x_drift_inventory = 'inventories/nope.py': no such file" in run.output
    assert ssh(lab, node, "test -e /etc/systemd/system/gpunode-drift.timer").returncode == 1

"""Kubernetes worker readiness on a lab node: what the role and the drift check make of a
node whose cgroup hierarchy is v1.

The lab's nodes are containers: their cgroup mount, swap and kernel modules are the lab
host's, and they may load no module. On a host with the v1 (or hybrid) hierarchy, which a
container then sees as a tmpfs at /sys/fs/cgroup, this module checks the refusal for real:
the node is refused before anything changes, with the reason, and the drift check reports
cgroup v1 and br_netfilter missing from what the node itself answers. A v2 host has no v1
node to offer, and the module says so instead of passing. What a converged worker looks like
is checked by tests/verify/test_kubernetes.py on a real node.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from lab import Lab, LabNode

from .conftest import ROOT, drift_report, run_pyinfra, ssh, write_inventory

pytestmark = pytest.mark.lab

DEPLOY = f"""\
import sys

sys.path.insert(0, {str(ROOT)!r})

from gpunode.inventory import desired_state
from roles.kubernetes import kubernetes_host

kubernetes_host(desired=desired_state())
"""
MODULES_LOAD = "/etc/modules-load.d/gpunode-kubernetes.conf"
WORKER = {
    "nvidia_driver": {"source": "debian"},
    "container_runtime": {"engines": ["containerd"]},
    "firewall": {"enabled": True, "admin_networks": ["0.0.0.0/0"]},
    "kubernetes": {"enabled": True, "pod_networks": ["10.244.0.0/16"]},
}


@pytest.fixture(scope="module")
def node(lab: Lab, lab_nodes: list[LabNode]) -> LabNode:
    chosen = lab_nodes[0]
    mounts = ssh(lab, chosen, "awk '$2 == \"/sys/fs/cgroup\" {print $3}' /proc/mounts").stdout
    mount = (mounts.split() or [""])[-1]  # the last mount at the path is the one seen
    if mount != "tmpfs":
        pytest.skip(
            f"this lab host's cgroup hierarchy is v2 ({mount!r} at /sys/fs/cgroup): "
            "its container nodes offer no v1 node to refuse"
        )
    return chosen


def test_a_cgroup_v1_node_is_refused_saying_why_and_unchanged(
    lab: Lab, node: LabNode, tmp_path: Path
) -> None:
    inventory = write_inventory(tmp_path / "inventory.py", lab, [node], {node.name: WORKER})
    deploy = tmp_path / "kubernetes_host_only.py"
    deploy.write_text(DEPLOY)
    refused = run_pyinfra("-v", str(deploy), inventory=inventory)
    assert refused.returncode != 0, refused.output
    assert "the node runs cgroup v1" in refused.output
    assert "systemd.unified_cgroup_hierarchy=1" in refused.output
    assert "Nothing was changed." in refused.output
    assert ssh(lab, node, f"test -e {shlex.quote(MODULES_LOAD)}").returncode != 0


def test_drift_reports_what_a_worker_lacks_here(lab: Lab, node: LabNode, tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "inventory.py", lab, [node], {node.name: WORKER})
    findings = {f["id"]: f for f in drift_report(node, inventory)["findings"]}
    assert findings["kubernetes.cgroup"]["severity"] == "critical"
    assert findings["kubernetes.cgroup"]["found"] == "v1"
    loaded = ssh(lab, node, "test -d /sys/module/br_netfilter").returncode == 0
    assert ("kubernetes.module:br_netfilter" in findings) is not loaded
    assert "kubernetes.unreadable" not in findings and "kubernetes.unread_line" not in findings

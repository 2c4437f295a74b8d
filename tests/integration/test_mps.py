"""MPS on a lab node: the compute mode the GPU settings role sets for it, the MPS role's
refusal where the control daemon's binary is missing, and the drift check's findings.

What this checks, and what it does not: the lab's nvidia-smi is a double of the GPU (its
compute mode is set, shown and forgotten at a reboot as on real hardware), so the GPU settings
role's compute mode, its boot script and the drift rule run against it for real. NVIDIA's
``nvidia-cuda-mps-control`` is in no stand-in repository and no lab node has it: the MPS role
is checked here only for what it does without it (refuses the node, naming the package, and
changes nothing); the daemon running and a client going through it need a real GPU
(tests/verify/test_kubernetes.py on such a node).
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import Lab, LabNode
from lab.hwsim.hwstate import DEFAULT_STATE_PATH
from roles.gpu_settings import BOOT_SCRIPT, BOOT_SETTINGS

from .conftest import ROOT, drift_report, run_pyinfra, ssh, write_inventory

pytestmark = pytest.mark.lab

DEPLOY = """\
import sys

sys.path.insert(0, {root!r})

from gpunode.inventory import desired_state
from roles.{module} import {role}

{role}(desired=desired_state())
"""
MPS_UNIT_PATH = "/etc/systemd/system/gpunode-mps.service"
COMPUTE_MODE_OPERATION = "GPU settings | GPU compute mode for MPS"
DATA = {
    "nvidia_driver": {"source": "debian"},
    # Only the compute mode is this module's business: every other setting left as found.
    "gpu_settings": {"persistence_mode": None},
    "mps": {"enabled": True, "gpus": [0, 1]},
}


def sudo(lab: Lab, node: LabNode, command: str) -> str:
    result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def compute_modes(lab: Lab, node: LabNode) -> list[str]:
    lines = sudo(lab, node, "nvidia-smi --query-gpu=index,compute_mode --format=csv,noheader")
    return [line.split(", ")[1] for line in lines.splitlines()]


@pytest.fixture(scope="module")
def node(lab: Lab, lab_nodes: list[LabNode]) -> Iterator[LabNode]:
    """The first lab node, its simulated hardware put back as found at the end."""
    chosen = lab_nodes[0]
    saved = sudo(lab, chosen, f"cat {DEFAULT_STATE_PATH}")
    yield chosen
    encoded = base64.b64encode(saved.encode()).decode()
    restore = f"{DEFAULT_STATE_PATH}.restore"
    sudo(lab, chosen, f"echo {encoded} | base64 -d > {restore} && chmod 644 {restore} && "
                      f"mv {restore} {DEFAULT_STATE_PATH}")  # fmt: skip


@pytest.fixture(scope="module")
def inventory(lab: Lab, node: LabNode, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("mps") / "inventory.py"
    return write_inventory(path, lab, [node], {node.name: DATA})


def deploy(tmp_path: Path, inventory: str, module: str, role: str) -> Any:
    path = tmp_path / f"{role}_only.py"
    path.write_text(DEPLOY.format(root=str(ROOT), module=module, role=role))
    return run_pyinfra("-v", str(path), inventory=inventory)


def test_the_gpu_settings_role_sets_exclusive_process_on_mps_gpus_once(
    lab: Lab, node: LabNode, inventory: str, tmp_path: Path
) -> None:
    others = compute_modes(lab, node)[2:]
    first = deploy(tmp_path, inventory, "gpu_settings", "gpu_settings")
    assert first.returncode == 0, first.output
    assert node.name in first.changed_operations().get(COMPUTE_MODE_OPERATION, [])
    modes = compute_modes(lab, node)
    assert modes[:2] == ["Exclusive_Process", "Exclusive_Process"]
    assert modes[2:] == others  # GPUs MPS does not serve are left as found
    second = deploy(tmp_path, inventory, "gpu_settings", "gpu_settings")
    assert second.returncode == 0, second.output
    assert second.changed_operations() == {}, second.changed_operations()
    assert "EXCLUSIVE_PROCESS=0,1" in sudo(lab, node, f"cat {BOOT_SETTINGS}").splitlines()


def test_after_a_reboot_the_boot_script_sets_the_compute_mode_again(
    lab: Lab, node: LabNode
) -> None:
    sudo(lab, node, "gpunode-lab-hw reboot")
    assert compute_modes(lab, node)[:2] == ["Default", "Default"]
    # What gpunode-gpu-settings.service runs at boot (the container's systemd does not boot
    # again on the simulated reboot).
    sudo(lab, node, BOOT_SCRIPT)
    assert compute_modes(lab, node)[:2] == ["Exclusive_Process", "Exclusive_Process"]


def test_without_nvidia_cuda_mps_control_the_node_is_refused_and_unchanged(
    lab: Lab, node: LabNode, inventory: str, tmp_path: Path
) -> None:
    assert ssh(lab, node, "test -e /usr/bin/nvidia-cuda-mps-control").returncode != 0
    refused = deploy(tmp_path, inventory, "mps", "mps")
    assert refused.returncode != 0, refused.output
    assert "nvidia-cuda-mps-control is not installed" in refused.output
    assert "nvidia-cuda-mps" in refused.output and "Nothing was changed." in refused.output
    assert ssh(lab, node, f"test -e {MPS_UNIT_PATH}").returncode != 0


def test_drift_reports_the_missing_daemon_and_a_compute_mode_changed_by_hand(
    lab: Lab, node: LabNode, inventory: str
) -> None:
    findings = {f["id"]: f for f in drift_report(node, inventory)["findings"]}
    assert findings["mps.control"]["severity"] == "critical"
    assert not any(key.startswith("mps.compute_mode") for key in findings), findings.keys()
    sudo(lab, node, "nvidia-smi -i 1 -c DEFAULT")
    findings = {f["id"]: f for f in drift_report(node, inventory)["findings"]}
    assert findings["mps.compute_mode:gpu1"]["found"] == "Default"
    assert "mps.compute_mode:gpu0" not in findings

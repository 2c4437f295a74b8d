"""tests/verify (testinfra) passes on converged nodes and catches what a stock node lacks."""

from __future__ import annotations

import shlex
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab import Lab, LabNode

from .conftest import ROOT, run_pyinfra, ssh, write_inventory

pytestmark = pytest.mark.lab

# The NVIDIA checks every converged lab node must pass (not skip): the lab inventory declares
# the driver, CUDA, docker, Fabric Manager (NVSwitch profiles), DCGM and GPU settings.
NVIDIA_CHECKS = (
    "test_driver_loaded_is_the_pinned_release",
    "test_driver_packages_installed_at_the_pin_and_held",
    "test_persistence_daemon_as_declared",
    "test_each_declared_cuda_toolkit_is_installed_held_and_runs",
    "test_the_default_cuda_is_behind_usr_local_cuda_and_on_path",
    "test_container_toolkit_installed_at_the_pin_and_held",
    "test_docker_has_the_nvidia_runtime_as_declared",
    "test_cdi_spec_names_every_gpu",
    "test_fabric_manager_runs_where_nvswitches_are_expected",
    "test_dcgm_host_engine_runs_where_declared",
    "test_the_declared_gpus_are_seen",
    "test_gpu_persistence_mode_as_declared",
)


@dataclass
class VerifyRun:
    code: int
    output: str
    passed: set[str]
    failed: set[str]

    @property
    def total(self) -> int:
        return len(self.passed) + len(self.failed)


def run_verify(inventory: str, junit: Path, *args: str, tests: str = "tests/verify") -> VerifyRun:
    """The verify suite (or one file of it) against an inventory: exit code, output and the
    ids of the tests that passed and failed (skipped ones are neither)."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", tests, "--inventory", inventory,
         f"--junitxml={junit}", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    passed, failed = set(), set()
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "")
        if case.find("failure") is not None or case.find("error") is not None:
            failed.add(name)
        elif case.find("skipped") is None:
            passed.add(name)
    return VerifyRun(result.returncode, result.stdout + result.stderr, passed, failed)


@pytest.fixture(scope="module")
def converged(lab_nodes: list[LabNode]) -> list[LabNode]:
    """The lab converged with its own inventory, once for the module's tests: each may run
    alone (-k), after any other module (test_nvidia_driver and test_cuda_stack leave the
    nodes without a driver)."""
    run = run_pyinfra("deploys/gpu_node.py")
    assert run.returncode == 0, run.output
    return lab_nodes


def test_converged_lab_passes_every_check(converged: list[LabNode], tmp_path: Path) -> None:
    run = run_verify("inventories/lab.py", tmp_path / "verify.xml")
    assert run.failed == set(), run.output
    assert run.code == 0
    assert run.total >= 40 * len(converged)
    for node in converged:
        ran = {check for check in NVIDIA_CHECKS if f"{check}[ssh://{node.name}]" in run.passed}
        assert ran == set(NVIDIA_CHECKS), (node.name, sorted(set(NVIDIA_CHECKS) - ran))


def test_nvidia_checks_fail_on_a_node_that_drifted(
    lab: Lab, converged: list[LabNode], tmp_path: Path
) -> None:
    # Drift two things on lab-1 behind gpunode's back, the way an operator's hand or a vendor
    # tool would.
    node = converged[0]

    def on_node(command: str) -> None:
        result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
        assert result.returncode == 0, (command, result.stderr)

    before = run_verify(
        "inventories/lab.py", tmp_path / "before.xml", "--limit", node.name,
        tests="tests/verify/test_nvidia.py",
    )  # fmt: skip
    assert before.failed == set(), before.output
    try:
        on_node("gpunode-lab-hw set gpus.0.persistence_mode Disabled")
        on_node("apt-mark unhold nvidia-driver-cuda >/dev/null")
        after = run_verify(
            "inventories/lab.py", tmp_path / "after.xml", "--limit", node.name,
            tests="tests/verify/test_nvidia.py",
        )  # fmt: skip
    finally:
        on_node("gpunode-lab-hw set gpus.0.persistence_mode Enabled")
        on_node("apt-mark hold nvidia-driver-cuda >/dev/null")
    assert after.code == 1, after.output
    host = f"ssh://{node.name}"
    assert after.failed == {
        f"test_gpu_persistence_mode_as_declared[{host}]",
        f"test_driver_packages_installed_at_the_pin_and_held[{host}]",
    }, after.output


def test_stock_debian_node_fails_the_hardening_checks(
    lab: Lab, lab_nodes: list[LabNode], tmp_path: Path
) -> None:
    # A lab of its own (name and a subnet 103 above this lab's): never another session's.
    stock = Lab(
        state_dir=tmp_path / "lab",
        name=f"{lab.name}-verifytest",
        subnet_index=int(lab.network_prefix.rsplit(".", 1)[1]) + 103,
    )
    try:
        nodes = stock.up(1, profiles=["pcie-a10g"])
        inventory = write_inventory(tmp_path / "stock.py", stock, nodes, {})
        run = run_verify(inventory, tmp_path / "verify.xml")
    finally:
        stock.down(keep_image=True)
    assert run.code == 1
    failed = run.failed
    host = "ssh://lab-1"
    for expected in (
        f"test_sshd_setting[{host}-sshd-12-passwordauthentication-no]",
        f"test_sshd_setting[{host}-sshd-23-loglevel-VERBOSE]",
        f"test_sshd_setting_from_data[{host}-sshd-38-maxauthtries]",
        f"test_sshd_crypto_is_exactly_the_hardened_list[{host}-sshd-01-ciphers-expected0]",
        f"test_sshd_50_rsa_host_key_is_4096_bits[{host}]",
        f"test_sshd_48_no_moduli_below_3072_bits[{host}]",
        f"test_sshd_33_banner_does_not_reveal_the_debian_version[{host}]",
    ):
        assert expected in failed, sorted(failed)

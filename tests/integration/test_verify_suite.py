"""tests/verify (testinfra) passes on converged nodes and catches what a stock node lacks."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from lab import Lab, LabNode

from .conftest import ROOT, run_pyinfra, write_inventory

pytestmark = pytest.mark.lab


def run_verify(inventory: str, junit: Path) -> tuple[int, set[str], int]:
    """(exit code, failed test ids, tests run) of the verify suite against an inventory."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/verify", "--inventory", inventory,
         f"--junitxml={junit}", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    cases = ElementTree.parse(junit).getroot().iter("testcase")
    failed, total = set(), 0
    for case in cases:
        total += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.add(case.get("name", ""))
    return result.returncode, failed, total


def test_converged_lab_passes_every_check(lab_nodes: list[LabNode], tmp_path: Path) -> None:
    assert run_pyinfra("deploys/gpu_node.py").returncode == 0
    code, failed, total = run_verify("inventories/lab.py", tmp_path / "verify.xml")
    assert failed == set()
    assert code == 0
    assert total >= 40 * len(lab_nodes)


def test_stock_debian_node_fails_the_hardening_checks(
    lab_nodes: list[LabNode], tmp_path: Path
) -> None:
    stock = Lab(state_dir=tmp_path / "lab", name="gpunode-verifytest", subnet_index=2)
    try:
        nodes = stock.up(1, profiles=["pcie-a10g"])
        inventory = write_inventory(tmp_path / "stock.py", stock, nodes, {})
        code, failed, _ = run_verify(inventory, tmp_path / "verify.xml")
    finally:
        stock.down(keep_image=True)
    assert code == 1
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

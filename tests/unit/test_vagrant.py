"""The Vagrantfile is valid and matches inventories/vagrant.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from gpunode.cli import load_inventory

ROOT = Path(__file__).resolve().parents[2]


def test_vagrant_validates_the_vagrantfile() -> None:
    result = subprocess.run(
        ["vagrant", "validate"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Vagrantfile validated successfully" in result.stdout


def test_vagrant_inventory_matches_the_vagrantfile() -> None:
    vagrantfile = (ROOT / "Vagrantfile").read_text()
    declared = dict(re.findall(r'"(gpunode-\d+)" => "([0-9.]+)"', vagrantfile))
    inventory = load_inventory(str(ROOT / "inventories" / "vagrant.py"))
    assert {host.name: host.data.ssh_hostname for host in inventory} == declared
    assert len(declared) == 2

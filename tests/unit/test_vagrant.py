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
    declared = re.findall(r'"(gpunode-\d+)" => \{ ip: "([0-9.]+)", box: "([^"]+)" \}', vagrantfile)
    inventory = load_inventory(str(ROOT / "inventories" / "vagrant.py"))
    assert {host.name: host.data.ssh_hostname for host in inventory} == {
        name: address for name, address, _ in declared
    }
    boxes = {name: box for name, _, box in declared}
    assert sorted(boxes.values()) == [
        "cloud-image/ubuntu-24.04",
        "debian/bookworm64",
        "debian/bookworm64",
    ]
    # The Ubuntu box is the inventory's Ubuntu group, the Debian ones its PCIe group.
    groups = {host.name: set(host.groups) for host in inventory}
    for name, box in boxes.items():
        assert ("ubuntu_nodes" in groups[name]) == box.startswith("cloud-image/ubuntu"), groups

"""The two VMs of the Vagrantfile (private network addresses fixed there).

`vagrant up` first; Vagrant's insecure key is replaced per box and kept under .vagrant/.
"""

from pathlib import Path

_machines = Path(__file__).resolve().parents[1] / ".vagrant" / "machines"


def _vm(name: str, address: str) -> tuple[str, dict]:
    key = _machines / name / "libvirt" / "private_key"
    return (
        name,
        {
            "ssh_hostname": address,
            "ssh_user": "vagrant",
            "ssh_key": str(key),
            "ssh_strict_host_key_checking": "accept-new",
            "_sudo": True,
        },
    )


pcie_nodes = [_vm("gpunode-1", "192.168.56.11"), _vm("gpunode-2", "192.168.56.12")]

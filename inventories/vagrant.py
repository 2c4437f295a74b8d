"""The VMs of the Vagrantfile (private network addresses fixed there): two Debian 12 PCIe
nodes and one Ubuntu 24.04 node (group ubuntu_nodes).

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
# A real Ubuntu 24.04 (its archive, ssh.socket, ufw, needrestart), for the hardening and
# base roles as on the Debian boxes (no GPU, so no driver: group_data/vagrant.py).
ubuntu_nodes = [_vm("gpunode-3", "192.168.56.13")]

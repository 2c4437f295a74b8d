"""The local lab fleet made by `gpunode lab up`; groups follow each node's hardware profile,
and each node's release (groups bookworm, trixie and noble: an Ubuntu 24.04 lab node, Debian's
packages arranged as noble, lab.UBUNTU_LAB_BASES). The lab's VMs (`lab up --vms N`:
a real kernel, real storage) are the group vms, apart from the profile groups: they carry their
profile's hardware doubles, but the profile groups' expectations are the containers'."""

from lab import UBUNTU_LAB_BASES, Lab

_lab = Lab()
_nodes = _lab.nodes()
# The test suite's VM is not listed: its tests reach it with their own inventories alone.
_vms = [vm for vm in _lab.vms() if vm.listed]
if not _nodes and not _vms:
    raise SystemExit("inventories/lab.py: no lab nodes; run `gpunode lab up --nodes 2` first")

# PCIe nodes have no HCA: NCCL uses sockets there (the lab group's NCCL_IB_HCA names one).
_NO_IB = {
    "nccl": {"env": {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1", "NCCL_DEBUG": "WARN"}}
}

# Slurm: the lab's controller, while `gpunode lab up --slurm` runs one; the nodes of its
# Debian release (one Slurm release per cluster: Lab.slurm_members) join it as dynamic nodes
# with the GRES of their simulated GPUs (roles/slurm.py). Without one, no node has Slurm.
_slurm_settings = _lab.slurm_settings()
_slurm_members = {node.name for node in _lab.slurm_members()}
_SLURM = {}
if _slurm_settings is not None:
    _SLURM = {
        "slurm": {
            "enabled": True,
            "controller": _slurm_settings.controller,
            "controller_address": _slurm_settings.controller_address,
            "cluster_name": _slurm_settings.cluster_name,
            "munge_key_file": _slurm_settings.munge_key_file,
            # Lab-only (Lab.slurm_settings says why): jobs tracked by process, not cgroups.
            "cgroup_enforcement": _slurm_settings.cgroup_enforcement,
        }
    }

# group_data/lab.py's tls, and each node's certificate names its address too: the lab's
# names resolve nowhere, and Prometheus verifies an exporter against the address it dials
# (gpunode.monitoring.scrape_address).
_TLS = {
    "enabled": True,
    "ca_directory": str(_lab.ca_dir),
    "ca_passphrase_file": str(_lab.ca_passphrase_file()),
}

# Ubuntu lab nodes (lab.UBUNTU_LAB_BASES says what they are): the NVIDIA driver from Ubuntu's
# own archive (nvidia_driver.source "ubuntu": Canonical's prebuilt module for the running
# kernel, else DKMS), which the lab's stand-in Ubuntu archive serves (lab.standin.ubuntu:
# noble-updates restricted, Ubuntu's package graph; the node's kernel release is simulated,
# lab.hwsim.kernel). 580.173.02-0ubuntu0.24.04.1 is noble's 580-server build
# (packages.ubuntu.com, read 2026-12-07); an NVSwitch node's Fabric Manager comes from the
# same archive (multiverse). CUDA, DCGM and its exporter come from NVIDIA's Ubuntu 24.04 tree
# and the Container Toolkit from its own repository, as the group data declares them (the
# stand-in's ubuntu2404 tree: lab/standin/world.toml); InfiniBand's user space from Ubuntu's
# archive (in the lab, Debian's packages behind it).
_UBUNTU_NVIDIA_STACK = {
    "nvidia_driver": {
        "source": "ubuntu",
        "branch": "580",
        "version": "580.173.02-0ubuntu0.24.04.1",
        "ubuntu_series": "server",
        "flavour": "open",
        "reboot": "if-needed",
    },
    # Ubuntu's Fabric Manager at the driver's version (group_data/all.py pins NVIDIA's).
    "fabric_manager": {"mode": "auto"},
}

_by_profile: dict[str, list] = {"hgx-h100": [], "a100": [], "pcie-a10g": []}
for _node in _nodes:
    _data = {
        "ssh_hostname": _node.address,
        "tls": {**_TLS, "ip_addresses": [_node.address]},
        **(_NO_IB if _node.profile == "pcie-a10g" else {}),
        **(_SLURM if _node.name in _slurm_members else {}),
        **(_UBUNTU_NVIDIA_STACK if _node.release in UBUNTU_LAB_BASES else {}),
    }
    _by_profile[_node.profile].append((_node.name, _data))

h100_nodes = _by_profile["hgx-h100"]
a100_nodes = _by_profile["a100"]
pcie_nodes = _by_profile["pcie-a10g"]

# By release (`gpunode lab up --release mixed`): names only, the data is the profile group's.
bookworm = [node.name for node in _nodes if node.release == "bookworm"]
trixie = [node.name for node in _nodes if node.release == "trixie"]
noble = [node.name for node in _nodes if node.release == "noble"]

vms = [
    (vm.name, {"ssh_hostname": vm.address, **(_NO_IB if vm.profile == "pcie-a10g" else {})})
    for vm in _vms
]

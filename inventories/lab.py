"""The local lab fleet made by `gpunode lab up`; groups follow each node's hardware profile,
and each node's Debian release (groups bookworm and trixie)."""

from lab import Lab

_nodes = Lab().nodes()
if not _nodes:
    raise SystemExit("inventories/lab.py: no lab nodes; run `gpunode lab up --nodes 2` first")

# PCIe nodes have no HCA: NCCL uses sockets there (the lab group's NCCL_IB_HCA names one).
_NO_IB = {
    "nccl": {"env": {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1", "NCCL_DEBUG": "WARN"}}
}

_by_profile: dict[str, list] = {"hgx-h100": [], "a100": [], "pcie-a10g": []}
for _node in _nodes:
    _data = {"ssh_hostname": _node.address, **(_NO_IB if _node.profile == "pcie-a10g" else {})}
    _by_profile[_node.profile].append((_node.name, _data))

h100_nodes = _by_profile["hgx-h100"]
a100_nodes = _by_profile["a100"]
pcie_nodes = _by_profile["pcie-a10g"]

# By release (`gpunode lab up --release mixed`): names only, the data is the profile group's.
bookworm = [node.name for node in _nodes if node.release == "bookworm"]
trixie = [node.name for node in _nodes if node.release == "trixie"]

"""Health remedies on one node, as ``gpunode drift --remedy`` decided them (gpunode/fleet).

* ``gpus_reset``: each named GPU (its PCI bus id) is reset with ``nvidia-smi -r -i``, once the
  node says no process uses it: a reset ends whatever runs on the GPU, so a GPU with compute
  processes (nvidia-smi's list, read now, not at the check) is refused before any GPU is
  reset, naming the processes, as is a GPU the node does not have or whose processes cannot
  be read. nvidia-smi decides whether the GPU can be reset alone; where it refuses, the run
  fails with its words and the remedy is left to an operator.
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import operation

from facts.gpu import GpuDevices
from gpunode.health.finding import gpu_bus_id
from gpunode.refusal import NodeRefused


@operation()
def gpus_reset(gpus: list[str]):
    """Each of ``gpus`` is reset, where no process uses any of them.

    + gpus: PCI bus ids as nvidia-smi -i takes them (``00000000:18:00.0``), checked by the
      deploy against that pattern
    """
    devices = host.get_fact(GpuDevices)
    if devices["state"] != "ok":
        raise NodeRefused(
            f"{host.name}: no GPU reset: the GPUs cannot be read: {devices['reason']}"
        )
    problem = (devices.get("listing_problems") or {}).get("compute_apps")
    if problem:
        raise NodeRefused(
            f"{host.name}: no GPU reset: whether processes use the GPUs is unknown: {problem}"
        )
    by_bus = {gpu_bus_id(gpu.get("pci_bus_id")): gpu for gpu in devices["gpus"]}
    missing = [bus for bus in gpus if bus not in by_bus]
    if missing:
        raise NodeRefused(f"{host.name}: no GPU reset: no GPU at {', '.join(missing)} on the node")
    busy = {bus: by_bus[bus]["compute_pids"] for bus in gpus if by_bus[bus]["compute_pids"]}
    if busy:
        used = "; ".join(
            f"GPU {by_bus[bus]['index']} ({bus}) by PIDs {', '.join(map(str, pids))}"
            for bus, pids in busy.items()
        )
        raise NodeRefused(
            f"{host.name}: no GPU reset: a reset ends what runs on the GPU, and processes use "
            f"it: {used}"
        )
    for bus in gpus:
        yield f"nvidia-smi -r -i {shlex.quote(bus)}"

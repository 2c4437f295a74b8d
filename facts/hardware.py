"""Hardware facts: the GPU report of the node-side probe, InfiniBand ports and their error
counters, NVMe drives.

Each fact is ONE shell command (one SSH round trip) from ``gpunode.probe.parsers.
SECTION_COMMANDS`` and is processed by that module's ``parse_section``, so a fact and a
composite drift fact that bundles several sections (``combined_command``) read the same
output the same way. A fact never fails the host: what could not be read is reported as
``{"state": "unreadable" | "absent", "command": ..., "reason": ...}``.
"""

from __future__ import annotations

from typing import Any

from pyinfra.api import FactBase

from gpunode import framing
from gpunode.probe.parsers import SECTION_COMMANDS, parse_section, probe_part, unreadable


def _no_output(section: str) -> dict[str, Any]:
    # pyinfra skips process() when a command prints nothing; ours always print an exit status.
    return unreadable(section, "the fact command printed nothing (connection or shell failure)")


class GpuReport(FactBase[dict[str, Any]]):
    """
    The node's GPUs and driver stack, from the probe ``gpunode/probe/gpu_probe.py``.

    The probe's source (and NVIDIA's ``pynvml`` unless ``ship_pynvml=False``) travels inside
    the command and runs with the node's ``python3``: nothing has to be installed. XID events
    are read from the kernel log since ``xid_since`` (ISO 8601; default: 24 hours ago). A
    report whose fields do not have the types the control side reads
    (``parsers.GPU_REPORT_SHAPE``) is unreadable, naming the first field that does not.

    .. code:: python

        {
            "schema": "gpunode.gpu-report/1",
            "state": "ok",  # driver_not_loaded / absent / unreadable: "reason" says why
            "source": "nvml",  # or "nvidia-smi" (-q -x, plus nvlink -s)
            "driver_version": "590.48.01",
            "cuda_driver_version": "13.1",
            "gpu_count": 8,
            "gpus": [{"index": 0, "uuid": "GPU-...", "persistence_mode": True, ...}],
            "kernel_module": {"state": "loaded", "version": "590.48.01", ...},
            "driver_versions": {"mismatch": False, ...},
            "fabric_manager": {"state": "active", ...},
            "xid_events": {"state": "ok", "events": [{"xid": 79, "pci": "0000:18:00", ...}]},
        }
    """

    def parts(self, xid_since: str | None = None, ship_pynvml: bool = True) -> list[framing.Part]:
        return [probe_part(xid_since=xid_since, ship_pynvml=ship_pynvml)]

    def command(self, xid_since: str | None = None, ship_pynvml: bool = True) -> str:
        return framing.command(self.parts(xid_since=xid_since, ship_pynvml=ship_pynvml))

    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_section("gpu", output)

    @staticmethod
    def default() -> dict[str, Any]:
        return _no_output("gpu_probe (python3 -)")


class InfinibandPorts(FactBase[dict[str, Any]]):
    """
    Every InfiniBand/RoCE HCA port ``ibstat`` lists.

    .. code:: python

        {
            "state": "ok",  # absent (no ibstat) / unreadable: "reason" says why
            "cas": [{"name": "mlx5_0", "ca_type": "MT4129", "firmware_version": "28.39.1002",
                     "ports": [...]}],
            "ports": [{"ca": "mlx5_0", "port": 1, "state": "Active",
                       "physical_state": "LinkUp", "rate": 400, "link_layer": "InfiniBand",
                       ...}],
            "problems": [],  # each line not read, also under its CA's "problems"
        }

    A field that cannot be read (a rate that is no number, a line longer than any ibstat
    prints) is None, with the reason in that port's (or CA's) ``"unreadable": {field: why}``.
    A line that is not understood is named in ``problems``; the other CAs are kept.
    """

    def command(self) -> str:
        return SECTION_COMMANDS["ibstat"]

    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_section("ibstat", output)

    @staticmethod
    def default() -> dict[str, Any]:
        return _no_output("ibstat")


class InfinibandCounters(FactBase[dict[str, Any]]):
    """
    The error counters of every RDMA device's ports, read from sysfs
    (``/sys/class/infiniband/<ca>/ports/<n>/counters/<name>``; no tool needed), those
    ``gpunode.probe.parsers.IB_COUNTER_NAMES`` names.

    .. code:: python

        {
            "state": "ok",  # unreadable: "reason" says why
            "ports": [{"ca": "mlx5_1", "port": 1,
                       "counters": {"symbol_error": 0, "link_downed": 255, ...}}],
            "problems": [],  # each line not read
        }

    A node without RDMA devices has no ports.
    """

    def command(self) -> str:
        return SECTION_COMMANDS["ib_counters"]

    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_section("ib_counters", output)

    @staticmethod
    def default() -> dict[str, Any]:
        return _no_output("ib_counters")


class NvmeDevices(FactBase[dict[str, Any]]):
    """
    NVMe namespaces from ``nvme list -o json``.

    .. code:: python

        {
            "state": "ok",  # absent (no nvme-cli) / unreadable: "reason" says why
            "devices": [{"device_path": "/dev/nvme0n1", "model": "...", "serial": "...",
                         "firmware": "...", "physical_size": 3840755982336, ...}],
        }
    """

    def command(self) -> str:
        return SECTION_COMMANDS["nvme"]

    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_section("nvme", output)

    @staticmethod
    def default() -> dict[str, Any]:
        return _no_output("nvme list -o json")

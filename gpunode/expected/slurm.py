"""Slurm as gpunode writes it on a GPU node: slurm.conf, gres.conf and cgroup.conf, and the
slurmd arguments of a dynamic node.

The node joins its cluster as a dynamic node (``slurmd -Z``, Slurm 22.05 and later): the
controller's slurm.conf lists no node, each slurmd registers itself with the GRES and
features given in ``--conf``, and ``PartitionName=... Nodes=ALL`` puts it in the partition.
So a GPU node is configured from its own facts alone, and the controller needs no change
when a node is added or its GPUs change. slurm.conf is the same file on every node and on the
controller (slurmctld warns about nodes whose file differs): it is rendered from the ``slurm``
settings only, never from a node's facts.

Configless mode (``slurmd --conf-server``, 20.02 and later) is not used: slurmd would then
take gres.conf from the controller too, and gres.conf is per node here, generated from the
node's GPUs (one ``Name=gpu Type=... File=/dev/nvidiaN`` line per GPU, N its minor number).

Sources (read 2026-12-01): slurmd(8) of Slurm 22.05.8 (Debian 12's slurmd 22.05.8-4+deb12u3)
and 24.05/24.11 (``-Z``, ``--conf``, ``--conf-server``); Slurm's dynamic_nodes.html
(``MaxNodeCount``, partitions with ``Nodes=ALL``); gres.conf(5) (``Name``, ``Type``,
``File``); cgroup.conf(5) (``ConstrainDevices``). Checked with Debian 12's packages: a
``slurmd -Z`` node with ``--conf "Gres=gpu:h100:8 Feature=h100"`` registers IDLE in a
``Nodes=ALL`` partition, and a job given ``--gres=gpu:2`` sees CUDA_VISIBLE_DEVICES=0,1.
Checked again on Debian 13 nodes with its slurmd 24.11.5-4+deb13u1 (slurmctld of the same).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpunode.model import SLURM_GRES_TYPE, Slurm

CONFIG_DIR = "/etc/slurm"
SLURM_CONF = f"{CONFIG_DIR}/slurm.conf"
GRES_CONF = f"{CONFIG_DIR}/gres.conf"
CGROUP_CONF = f"{CONFIG_DIR}/cgroup.conf"
MUNGE_KEY = "/etc/munge/munge.key"
SLURMD_SERVICE = "slurmd.service"
SLURMD_DROP_IN = f"/etc/systemd/system/{SLURMD_SERVICE}.d/gpunode.conf"
GPU_DEVICE = "/dev/nvidia{minor}"
MANAGED = "# Managed by gpunode (slurm); local edits are replaced on the next run.\n"

_GRES_TYPE = re.compile(SLURM_GRES_TYPE)
_NOT_IN_TYPE = re.compile(r"[^a-z0-9_.-]+")


@dataclass(frozen=True, order=True)
class GresGpu:
    """One GPU as gres.conf names it."""

    type: str
    file: str

    def line(self) -> str:
        return f"Name=gpu Type={self.type} File={self.file}"


def gpu_type_of(product_name: str | None) -> str | None:
    """The GRES type of a GPU product name: lowercase, NVIDIA's prefix dropped, every other
    character run that gres.conf cannot hold unquoted made one ``_``.

    'NVIDIA H100 80GB HBM3' -> 'h100_80gb_hbm3', 'NVIDIA A100-SXM4-80GB' -> 'a100-sxm4-80gb'.
    None when nothing is left (a name the driver did not give).
    """
    if not product_name:
        return None
    name = product_name.strip().lower()
    name = name.removeprefix("nvidia").strip()
    slug = _NOT_IN_TYPE.sub("_", name).strip("_.-")[:64]
    return slug if slug and _GRES_TYPE.fullmatch(slug) else None


def gres_gpus(
    gpus: Iterable[Mapping[str, Any]], gpu_type: str | None = None
) -> tuple[list[GresGpu], list[str]]:
    """The GRES of the GPUs a node reports (the GPU records of gpunode.probe.gpu_record),
    and why a GPU could not be named (no minor number, no product name)."""
    found: list[GresGpu] = []
    problems: list[str] = []
    for gpu in gpus:
        label = f"GPU {gpu.get('index')} ({gpu.get('pci_bus_id') or 'no PCI address'})"
        minor = gpu.get("minor_number")
        kind = gpu_type or gpu_type_of(gpu.get("name"))
        if not isinstance(minor, int) or isinstance(minor, bool) or not 0 <= minor < 256:
            problems.append(f"{label}: no minor number, so no device file")
        elif kind is None:
            problems.append(f"{label}: no product name to make a GRES type of")
        else:
            found.append(GresGpu(kind, GPU_DEVICE.format(minor=minor)))
    return sorted(found), problems


def gres_counts(gres: Iterable[GresGpu]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for gpu in gres:
        counts[gpu.type] = counts.get(gpu.type, 0) + 1
    return dict(sorted(counts.items()))


def gres_summary(gres: Iterable[GresGpu]) -> str:
    """'gpu:h100_80gb_hbm3:8' (comma-separated per type): Slurm's own Gres= notation."""
    return ",".join(f"gpu:{kind}:{count}" for kind, count in gres_counts(gres).items()) or "none"


def render_gres_conf(gres: Iterable[GresGpu]) -> str:
    lines = [gpu.line() for gpu in sorted(gres)]
    return (
        MANAGED
        + "# One line per GPU the driver reports: its GRES type and device file.\n"
        + "".join(f"{line}\n" for line in lines)
    )


def controller_host(slurm: Slurm) -> str:
    """SlurmctldHost's value: 'name' or 'name(address)'."""
    if slurm.controller_address:
        return f"{slurm.controller}({slurm.controller_address})"
    return str(slurm.controller)


def render_slurm_conf(slurm: Slurm) -> str:
    """The cluster's slurm.conf: the same on every node and on the controller."""
    if slurm.cgroup_enforcement:
        tracking = "ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\n"
    else:
        tracking = "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
    return (
        MANAGED
        + "# The nodes are dynamic (slurmd -Z): each registers itself with its GRES.\n"
        + f"ClusterName={slurm.cluster_name}\n"
        + f"SlurmctldHost={controller_host(slurm)}\n"
        + "AuthType=auth/munge\n"
        + "SlurmUser=slurm\n"
        + "StateSaveLocation=/var/lib/slurm/slurmctld\n"
        + "SlurmdSpoolDir=/var/lib/slurm/slurmd\n"
        + "SlurmctldLogFile=/var/log/slurm/slurmctld.log\n"
        + "SlurmdLogFile=/var/log/slurm/slurmd.log\n"
        + "MpiDefault=none\n"
        + tracking
        + "SelectType=select/cons_tres\n"
        + "SelectTypeParameters=CR_Core\n"
        + "GresTypes=gpu\n"
        + f"MaxNodeCount={slurm.max_node_count}\n"
        # Which DOWN nodes come back by themselves at their next registration: by default
        # (1) only those DOWN for not responding, never one an operator set DOWN.
        + f"ReturnToService={slurm.return_to_service}\n"
        + f"PartitionName={slurm.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
    )


def render_cgroup_conf(slurm: Slurm) -> str:
    constrain = "yes" if slurm.cgroup_enforcement else "no"
    return (
        MANAGED
        + "# A job's tasks may open only the GPUs (device files) it was given.\n"
        + f"ConstrainDevices={constrain}\n"
    )


def node_features(slurm: Slurm, gres: Iterable[GresGpu]) -> list[str]:
    """The node's features: every GPU type it has, then the declared ones."""
    return list(dict.fromkeys([*gres_counts(gres), *slurm.features]))


def node_conf(slurm: Slurm, gres: Iterable[GresGpu]) -> str:
    """slurmd's ``--conf``: the dynamic node's GRES and features (a slurm.conf node line)."""
    gres = list(gres)
    words = []
    if gres:
        words.append(f"Gres={gres_summary(gres)}")
    features = node_features(slurm, gres)
    if features:
        words.append(f"Feature={','.join(features)}")
    return " ".join(words)


def render_slurmd_drop_in(slurm: Slurm, gres: Iterable[GresGpu]) -> str:
    """slurmd's unit drop-in: a dynamic node with its GRES and features.

    ExecStart is replaced rather than $SLURMD_OPTIONS set: systemd splits that variable at
    whitespace, and ``--conf`` takes one argument with spaces. Type=simple with ``-D`` (in
    the foreground) on every release: Debian 12's unit is Type=simple, Debian 13's (Slurm
    24.11) Type=notify with ``--systemd``; one shape for both. Every word is of the model's
    patterns (no quote, backslash, ``%`` or ``$``), so the quoted argument is taken whole.
    """
    conf = node_conf(slurm, gres)
    arguments = f' --conf "{conf}"' if conf else ""
    return (
        MANAGED
        + "[Service]\n"
        + "Type=simple\n"
        + "ExecStart=\n"
        + f"ExecStart=/usr/sbin/slurmd -D -s -Z{arguments}\n"
    )

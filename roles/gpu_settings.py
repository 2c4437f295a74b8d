"""GPU settings applied with nvidia-smi, idempotently from the GpuDevices fact.

ECC and MIG changes only take effect after a GPU reset or reboot: once requested they show
as *pending* and are reported as such, never requested again on every run. The MIG layout
(GPU instances) is only laid out on a GPU whose MIG mode is current; it does not survive a
reset or reboot, so the next run lays it out again. Application clocks that a driver no longer
reports (deprecated by driver 590 on Hopper) are reported, never requested again and again.

What the driver forgets at a reboot (persistence mode, power limit, application clocks, MIG
instances) is applied again at every boot by gpunode-gpu-settings.service, from a file this
role writes, after the driver's persistence daemon and before slurmd: a node that reboots
(a rolling driver change) never takes jobs with the driver's defaults.
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Iterable
from io import StringIO
from typing import Any

from pyinfra import host
from pyinfra.api import OperationError, deploy, operation
from pyinfra.operations import files, systemd

from facts.gpu import GpuDevices
from facts.mps import MpsState
from gpunode.expected import mps as expected_mps
from gpunode.expected.gpu_settings import BOOT_UNIT
from gpunode.model import DesiredState, GpuSettings

BOOT_UNIT_PATH = f"/etc/systemd/system/{BOOT_UNIT}"
BOOT_SCRIPT = "/usr/local/sbin/gpunode-gpu-settings"
BOOT_SETTINGS = "/etc/gpunode/gpu-settings.conf"

# Plain sh: it runs before anything else of gpunode's is there to run. Its settings file is
# root's, 0644, written by this role from values the model has checked (numbers, MIG profile
# names); every value is passed as one quoted word.
BOOT_SCRIPT_TEXT = f"""#!/bin/sh
# Managed by gpunode (roles/gpu_settings.py): the GPU settings the driver forgets at a reboot,
# applied again at boot from {BOOT_SETTINGS} ({BOOT_UNIT}, before slurmd).
set -u
PERSISTENCE='' POWER_LIMIT_W='' APPLICATION_CLOCKS='' MIG_LAYOUT='' EXCLUSIVE_PROCESS=''
. {BOOT_SETTINGS}
status=0
run() {{
    echo "gpunode-gpu-settings: $*"
    "$@" || {{ echo "gpunode-gpu-settings: failed: $*" >&2; status=1; }}
}}
[ -n "$PERSISTENCE" ] && run nvidia-smi -pm "$PERSISTENCE"
[ -n "$POWER_LIMIT_W" ] && run nvidia-smi -pl "$POWER_LIMIT_W"
[ -n "$APPLICATION_CLOCKS" ] && run nvidia-smi -ac "$APPLICATION_CLOCKS"
# MPS's GPUs (the driver forgets the compute mode too): before gpunode-mps.service opens them.
if [ "$EXCLUSIVE_PROCESS" = all ]; then
    run nvidia-smi -c {expected_mps.EXCLUSIVE_PROCESS}
elif [ -n "$EXCLUSIVE_PROCESS" ]; then
    run nvidia-smi -i "$EXCLUSIVE_PROCESS" -c {expected_mps.EXCLUSIVE_PROCESS}
fi
if [ -n "$MIG_LAYOUT" ]; then
    # GPUs whose MIG mode is on and that hold no instance: the driver kept none.
    enabled=$(nvidia-smi --query-gpu=index,mig.mode.current --format=csv,noheader |
        sed -n 's/^\\([0-9]*\\), *Enabled$/\\1/p')
    for index in $enabled; do
        nvidia-smi mig -i "$index" -lgi >/dev/null 2>&1 && continue
        run nvidia-smi mig -i "$index" -cgi "$MIG_LAYOUT" -C
    done
fi
exit "$status"
"""

BOOT_UNIT_TEXT = f"""# Managed by gpunode (roles/gpu_settings.py)
[Unit]
Description=GPU settings declared by gpunode, applied again at boot (the driver keeps none)
After=systemd-modules-load.service nvidia-persistenced.service
Before=slurmd.service
ConditionPathExists={BOOT_SETTINGS}

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={BOOT_SCRIPT}

[Install]
WantedBy=multi-user.target
"""


def _report_or_noop() -> dict[str, Any] | None:
    """The GpuDevices report without its lost GPUs: a GPU that answers no query (every value
    "GPU is lost"...) takes no setting, and an nvidia-smi call on it would fail the run on
    every try; gpunode drift reports it (gpu.lost) with its remedy."""
    report: dict[str, Any] = host.get_fact(GpuDevices)
    if report["state"] != "ok":
        host.noop(f"GPU settings skipped: {report['reason']}")
        return None
    lost = [gpu for gpu in report["gpus"] if gpu.get("lost")]
    if lost:
        host.noop(f"GPU {_indexes(lost)} lost (answers no query): left out of GPU settings")
    return {**report, "gpus": [gpu for gpu in report["gpus"] if not gpu.get("lost")]}


def _gpus_or_noop() -> list[dict[str, Any]] | None:
    report = _report_or_noop()
    return None if report is None else list(report["gpus"])


def _indexes(gpus: list[dict[str, Any]]) -> str:
    return ",".join(str(gpu["index"]) for gpu in gpus)


def _index_argument(gpus: list[dict[str, Any]]) -> str:
    """The GPUs' indexes (node output) as one shell word for ``nvidia-smi -i``."""
    return shlex.quote(_indexes(gpus))


def _mode(enabled: bool) -> str:
    return "Enabled" if enabled else "Disabled"


def _power(gpu: dict[str, Any], limit: str) -> float | None:
    value: float | None = (gpu.get("power_w") or {}).get(limit)
    return value


def _mode_of(gpu: dict[str, Any], setting: str, which: str) -> bool | None:
    """The record's ecc_mode / mig_mode ``which`` (current, pending); None: no such mode."""
    value: bool | None = (gpu.get(f"{setting}_mode") or {}).get(which)
    return value


@operation()
def persistence_mode(enabled: bool = True):
    """Every GPU has persistence mode ``enabled`` (takes effect at once).

    + enabled: whether persistence mode is on (``gpu_settings.persistence_mode``)
    """
    gpus = _gpus_or_noop()
    if gpus is None:
        return
    wrong = [gpu for gpu in gpus if gpu["persistence_mode"] is not enabled]
    if not wrong:
        host.noop(f"persistence mode {_mode(enabled)} on all {len(gpus)} GPUs")
        return
    yield f"nvidia-smi -i {_index_argument(wrong)} -pm {int(enabled)}"


@operation()
def pending_mode(setting: str, enabled: bool):
    """Every GPU has ECC or MIG mode (``setting`` 'ecc' or 'mig') ``enabled``, now or pending.

    A GPU whose pending mode already matches is reported as waiting for a reset.

    + setting: which mode, ``ecc`` or ``mig``; GPUs that have no such mode are left out
    + enabled: whether the mode is on (``gpu_settings.ecc`` or ``gpu_settings.mig``)
    """
    gpus = _gpus_or_noop()
    if gpus is None:
        return
    flag = {"ecc": "-e", "mig": "-mig"}[setting]
    want = _mode(enabled)
    supported = [gpu for gpu in gpus if _mode_of(gpu, setting, "current") is not None]
    to_request = [gpu for gpu in supported if _mode_of(gpu, setting, "pending") is not enabled]
    awaiting_reset = [
        gpu
        for gpu in supported
        if _mode_of(gpu, setting, "pending") is enabled
        and _mode_of(gpu, setting, "current") is not enabled
    ]
    if awaiting_reset:
        host.noop(
            f"{setting.upper()} {want} pending a GPU reset or reboot on GPUs "
            f"{_indexes(awaiting_reset)}"
        )
    if to_request:
        yield f"nvidia-smi -i {_index_argument(to_request)} {flag} {int(enabled)}"
    elif not awaiting_reset:
        host.noop(f"{setting.upper()} {want} on all {len(supported)} GPUs that support it")


@operation()
def power_limit(watts: int):
    """Every GPU's power limit is ``watts``; a value outside a GPU's range is an error.

    + watts: the power limit in watts (``gpu_settings.power_limit_w``), the same for every GPU
    """
    gpus = _gpus_or_noop()
    if gpus is None:
        return
    for gpu in gpus:
        low, high = _power(gpu, "min_limit"), _power(gpu, "max_limit")
        if low is not None and high is not None and not low <= watts <= high:
            raise OperationError(
                f"gpu_settings.power_limit_w = {watts}: GPU {gpu['index']} ({gpu['name']}) "
                f"accepts {low:g} to {high:g} W"
            )
    wrong = [gpu for gpu in gpus if _power(gpu, "limit") != watts]
    if not wrong:
        host.noop(f"power limit {watts} W on all {len(gpus)} GPUs")
        return
    yield f"nvidia-smi -i {_index_argument(wrong)} -pl {watts}"


def _describe_supported(supported: dict[int, list[int]]) -> str:
    """'memory 1593 MHz with graphics 210 to 1410 MHz (81 clocks)', per memory clock."""
    return "; ".join(
        f"memory {memory} MHz with graphics {min(graphics)} to {max(graphics)} MHz "
        f"({len(graphics)} clocks)"
        for memory, graphics in sorted(supported.items(), reverse=True)
        if graphics
    )


@operation()
def application_clocks(memory_mhz: int, graphics_mhz: int):
    """Every GPU that has application clocks runs them at ``memory_mhz``/``graphics_mhz``.

    A GPU whose driver reports no application clocks (driver 590 on Hopper: "Requested
    functionality has been deprecated") is reported and left alone. A pair that a GPU does not
    list among its supported clocks is an error naming the GPU and what it supports.

    + memory_mhz: the memory clock in MHz (``gpu_settings.application_clocks.memory_mhz``)
    + graphics_mhz: the graphics clock in MHz, one the GPU supports with ``memory_mhz``
    """
    gpus = _gpus_or_noop()
    if gpus is None:
        return
    settable = [gpu for gpu in gpus if gpu["application_clocks_mhz"] is not None]
    for gpu in settable:
        supported = {entry["memory"]: entry["graphics"] for entry in gpu["supported_clocks_mhz"]}
        if supported and graphics_mhz not in supported.get(memory_mhz, ()):
            raise OperationError(
                f"gpu_settings.application_clocks = memory {memory_mhz} MHz, graphics "
                f"{graphics_mhz} MHz: GPU {gpu['index']} ({gpu['name']}) supports "
                f"{_describe_supported(supported)}"
            )
    without: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for gpu in gpus:
        if gpu["application_clocks_mhz"] is None:
            without.setdefault((gpu["name"], gpu["application_clocks_note"]), []).append(gpu)
    for (model, note), unsettable in without.items():
        host.noop(f"application clocks left alone on GPUs {_indexes(unsettable)} ({model}): {note}")
    wanted = {"memory": memory_mhz, "graphics": graphics_mhz}
    wrong = [gpu for gpu in settable if gpu["application_clocks_mhz"] != wanted]
    if wrong:
        yield f"nvidia-smi -i {_index_argument(wrong)} -ac {memory_mhz},{graphics_mhz}"
    elif settable:
        host.noop(
            f"application clocks {memory_mhz},{graphics_mhz} MHz on all {len(settable)} GPUs "
            "that have them"
        )


def _compute_slices(profile: str) -> int:
    """'3g.40gb' -> 3."""
    return int(profile.split("g.")[0])


def _layout_of(gpu: dict[str, Any]) -> Counter[str] | None:
    """The GPU's instances as a multiset of profiles; None if one lacks its default CI.

    The default compute instance spans its whole GPU instance and has its profile's name.
    """
    layout: Counter[str] = Counter()
    for instance in gpu["gpu_instances"]:
        computes = instance["compute_instances"]
        if len(computes) != 1 or computes[0]["profile"] != instance["profile"]:
            return None
        layout[instance["profile"]] += 1
    return layout


def _fits_placements(sizes_and_starts: list[tuple[int, list[int]]], taken: int = 0) -> bool:
    """Whether every (size, starts) instance gets its own memory slices (bit mask ``taken``)."""
    if not sizes_and_starts:
        return True
    (size, starts), rest = sizes_and_starts[0], sizes_and_starts[1:]
    for start in starts:
        slices = ((1 << size) - 1) << start
        if not taken & slices and _fits_placements(rest, taken | slices):
            return True
    return False


def _layout_problem(gpu: dict[str, Any], profiles: Iterable[str]) -> str:
    """Why ``profiles`` cannot be laid out on the GPU, from its own -lgip/-lgipp; '' if it can."""
    offered = gpu["mig_profiles"]
    wanted = Counter(profiles)
    unknown = sorted(name for name in wanted if name not in offered)
    if unknown:
        return f"no MIG profile {', '.join(unknown)} on this GPU"
    for name, count in wanted.items():
        if count > offered[name]["total"]:
            return f"{count} x {name}, but at most {offered[name]['total']} fit"
    capacity = max(_compute_slices(name) for name in offered)
    used = sum(_compute_slices(name) * count for name, count in wanted.items())
    if used > capacity:
        return f"{used} compute slices, but the GPU has {capacity}"
    placements = [
        (offered[name]["size"], offered[name]["placements"]) for name in wanted.elements()
    ]
    if all(size and starts for size, starts in placements) and not _fits_placements(
        sorted(placements, key=lambda placement: -placement[0])
    ):
        return "no placement gives every instance its own memory slices"
    return ""


def _creation_order(gpu: dict[str, Any], profiles: Iterable[str]) -> list[str]:
    """Largest first: the driver places each instance as it comes, so small ones first can
    leave no room for a large one ("Insufficient Resources")."""
    offered = gpu["mig_profiles"]
    return sorted(
        profiles,
        key=lambda name: (
            -(offered[name]["size"] or 0),
            -_compute_slices(name),
            -offered[name]["memory_gib"],
            name,
        ),
    )


def _offers(gpu: dict[str, Any]) -> str:
    offered = gpu["mig_profiles"]
    capacity = max((_compute_slices(name) for name in offered), default=0)
    each = ", ".join(f"{name} (up to {profile['total']})" for name, profile in offered.items())
    return f"{each}; {capacity} compute slices in all"


@operation()
def mig_layout(profiles: tuple[str, ...]):
    """Every GPU in MIG mode holds exactly ``profiles`` as GPU instances (a multiset of profile
    names), each with its default compute instance.

    A GPU whose MIG mode is only pending (or not yet requested) is reported and left alone
    until a reset or reboot makes it current. Instances that differ are destroyed and laid out
    again only while no compute process runs on that GPU; otherwise it is an error, since
    destroying them kills the workloads. A layout the GPU cannot hold is an error naming the
    GPU and what it offers.

    + profiles: the MIG profile names (``gpu_settings.mig_layout``, e.g. ``3g.40gb``), one per
      GPU instance; a name given twice makes two instances
    """
    report = _report_or_noop()
    if report is None:
        return
    gpus = list(report["gpus"])
    problems = report.get("listing_problems", {})
    wanted = Counter(profiles)
    shown = list(profiles)
    in_mig = [gpu for gpu in gpus if _mode_of(gpu, "mig", "current") is True]
    not_yet = [gpu for gpu in gpus if _mode_of(gpu, "mig", "current") is not True]
    pending = [gpu for gpu in not_yet if _mode_of(gpu, "mig", "pending") is True]
    off = [gpu for gpu in not_yet if _mode_of(gpu, "mig", "pending") is False]
    unsupported = [gpu for gpu in not_yet if _mode_of(gpu, "mig", "pending") is None]
    if pending:
        host.noop(
            f"MIG layout {shown} waits for a GPU reset or reboot (MIG mode pending) on GPUs "
            f"{_indexes(pending)}"
        )
    if off:
        host.noop(f"MIG layout {shown} needs MIG mode, which is off on GPUs {_indexes(off)}")
    if unsupported:
        host.noop(f"MIG layout {shown} left out on GPUs without MIG: {_indexes(unsupported)}")
    to_create: list[dict[str, Any]] = []
    to_replace: list[dict[str, Any]] = []
    for gpu in in_mig:
        for section in ("gpu_instances", "compute_instances", "mig_profiles"):
            if section in problems:
                raise OperationError(
                    f"GPU {gpu['index']}: cannot read its MIG instances: {problems[section]}"
                )
        if _layout_of(gpu) == wanted:
            continue
        problem = _layout_problem(gpu, profiles)
        if problem:
            raise OperationError(
                f"gpu_settings.mig_layout {shown} does not fit GPU {gpu['index']} "
                f"({gpu['name']}): {problem}; it offers {_offers(gpu)}"
            )
        if not gpu["gpu_instances"]:
            to_create.append(gpu)
            continue
        if "compute_apps" in problems:
            raise OperationError(
                f"GPU {gpu['index']}: its MIG instances differ from {shown}, and whether "
                f"workloads use them is unknown: {problems['compute_apps']}"
            )
        if gpu["compute_pids"]:
            found = sorted(instance["profile"] for instance in gpu["gpu_instances"])
            raise OperationError(
                f"GPU {gpu['index']} ({gpu['name']}) has MIG instances {found}, not {shown}; "
                "replacing them would kill the compute processes running on it (PIDs "
                f"{', '.join(map(str, gpu['compute_pids']))}): stop them first"
            )
        to_replace.append(gpu)
    changing = {gpu["index"] for gpu in to_create + to_replace}
    laid_out = [gpu for gpu in in_mig if gpu["index"] not in changing]
    if laid_out:
        host.noop(f"MIG layout {shown} on GPUs {_indexes(laid_out)}")
    for gpu in to_replace:
        index = shlex.quote(str(gpu["index"]))
        if any(instance["compute_instances"] for instance in gpu["gpu_instances"]):
            yield f"nvidia-smi mig -i {index} -dci"
        yield f"nvidia-smi mig -i {index} -dgi"
    for gpu in sorted(to_create + to_replace, key=lambda gpu: gpu["index"]):
        index = shlex.quote(str(gpu["index"]))
        order = shlex.quote(",".join(_creation_order(gpu, profiles)))
        yield f"nvidia-smi mig -i {index} -cgi {order} -C"


def boot_order(profiles: Iterable[str]) -> list[str]:
    """The boot's creation order when no GPU's profile table is at hand: most compute slices
    first (a large instance placed after small ones may find no room)."""
    return sorted(profiles, key=lambda name: (-_compute_slices(name), name))


def render_boot_settings(wanted: GpuSettings, exclusive: tuple[int, ...] | None = None) -> str:
    """The settings file the boot unit reads: shell assignments of checked values, quoted.
    ``exclusive``: the GPUs MPS wants in EXCLUSIVE_PROCESS mode (() all, None none)."""
    lines = ["# Managed by gpunode (roles/gpu_settings.py): what the boot unit applies again."]
    values: dict[str, str] = {}
    if wanted.persistence_mode is not None:
        values["PERSISTENCE"] = str(int(wanted.persistence_mode))
    if wanted.power_limit_w is not None:
        values["POWER_LIMIT_W"] = str(int(wanted.power_limit_w))
    if wanted.application_clocks is not None:
        clocks = wanted.application_clocks
        values["APPLICATION_CLOCKS"] = f"{int(clocks.memory_mhz)},{int(clocks.graphics_mhz)}"
    if wanted.mig and wanted.mig_layout:
        values["MIG_LAYOUT"] = ",".join(boot_order(wanted.mig_layout))
    if exclusive is not None:
        values["EXCLUSIVE_PROCESS"] = ",".join(str(int(i)) for i in exclusive) or "all"
    lines += [f"{name}={shlex.quote(value)}" for name, value in values.items()]
    return "\n".join(lines) + "\n"


def boot_settings(wanted: GpuSettings, exclusive: tuple[int, ...] | None = None) -> None:
    """The boot unit, its script and its settings file; enabled (it runs at the next boot:
    this run applies the settings itself)."""
    files.directory(name="Directory /etc/gpunode", path="/etc/gpunode", mode="755")
    files.put(
        name=f"{BOOT_SETTINGS} (applied again at boot)",
        src=StringIO(render_boot_settings(wanted, exclusive)), dest=BOOT_SETTINGS,
        mode="644", user="root", group="root",
    )  # fmt: skip
    files.put(
        name=f"{BOOT_SCRIPT}", src=StringIO(BOOT_SCRIPT_TEXT), dest=BOOT_SCRIPT, mode="755",
        user="root", group="root",
    )  # fmt: skip
    unit = files.put(
        name=f"{BOOT_UNIT_PATH} (before slurmd)", src=StringIO(BOOT_UNIT_TEXT),
        dest=BOOT_UNIT_PATH, mode="644", user="root", group="root",
    )  # fmt: skip
    systemd.daemon_reload(name="Reload systemd for the boot unit", _if=unit.did_change)
    systemd.service(
        name=f"{BOOT_UNIT} enabled for the next boot", service=BOOT_UNIT, running=None,
        enabled=True,
    )  # fmt: skip


@operation()
def exclusive_process(gpus: tuple[int, ...] = ()):
    """The GPUs MPS serves are in EXCLUSIVE_PROCESS compute mode (takes effect at once; gone
    at a reboot, when the boot unit sets it again). The GPU settings role is the one owner of
    compute mode: roles.mps only reads it.

    + gpus: GPU indexes (``mps.gpus``); empty: every GPU
    """
    report = _report_or_noop()
    if report is None:
        return
    state = host.get_fact(MpsState)
    modes = state["compute_modes"] or {}
    present = [gpu["index"] for gpu in report["gpus"]]
    missing = [index for index in gpus if index not in present]
    if missing:
        raise OperationError(
            f"mps.gpus names GPU {','.join(map(str, missing))}, and the node has GPUs "
            f"{','.join(map(str, present)) or 'none'}"
        )
    wanted = [index for index in present if not gpus or index in gpus]
    wrong = [i for i in wanted if modes.get(str(i)) != expected_mps.EXCLUSIVE_PROCESS_SHOWN]
    if not wrong:
        host.noop(f"compute mode {expected_mps.EXCLUSIVE_PROCESS} on GPUs {_join(wanted)}")
        return
    yield f"nvidia-smi -i {shlex.quote(_join(wrong))} -c {expected_mps.EXCLUSIVE_PROCESS}"


def _join(indexes: Iterable[int]) -> str:
    return ",".join(str(int(index)) for index in indexes)


@deploy("GPU settings")
def gpu_settings(desired: DesiredState) -> None:
    wanted = desired.gpu_settings
    if wanted.persistence_mode is not None:
        persistence_mode(name="GPU persistence mode", enabled=wanted.persistence_mode)
    if wanted.ecc is not None:
        pending_mode(name="GPU ECC mode", setting="ecc", enabled=wanted.ecc)
    if wanted.mig is not None:
        pending_mode(name="GPU MIG mode", setting="mig", enabled=wanted.mig)
    if wanted.mig and wanted.mig_layout:
        mig_layout(name="GPU MIG layout", profiles=wanted.mig_layout)
    if wanted.power_limit_w is not None:
        power_limit(name="GPU power limit", watts=wanted.power_limit_w)
    if wanted.application_clocks is not None:
        application_clocks(
            name="GPU application clocks",
            memory_mhz=wanted.application_clocks.memory_mhz,
            graphics_mhz=wanted.application_clocks.graphics_mhz,
        )
    exclusive = desired.exclusive_process_gpus
    if exclusive is not None:
        exclusive_process(name="GPU compute mode for MPS", gpus=exclusive)
    if host.get_fact(GpuDevices)["state"] == "ok":  # only where nvidia-smi answers
        boot_settings(wanted, exclusive)

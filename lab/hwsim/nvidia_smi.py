"""Double of ``nvidia-smi`` for lab nodes, which have no GPU (node side, stdlib only).

It answers from the simulated hardware in ``hwstate`` and its settings commands change it.
Output follows real captures (``tests/fixtures``, shipped to the node's share directory):

- ``-q -x``: the ``<gpu>`` element of a captured report is the per-GPU template, filled from
  the state: ``a10g.xml`` (DTD v11, driver 515) for generation r515, ``a100-sxm4-v12.xml``
  (DTD v12, driver 535) for r535, and for r590 the v12 template reshaped into what driver 590
  prints (the ``-q`` section of the H100 capture; element names as in v12 reports of later
  drivers: ``average_power_draw``/``instant_power_draw``, ``clocks_event_reasons_counters``...);
- ``--query-gpu``: valid names and aliases from the H100 capture's ``--help-query-gpu``, headers
  and units from its ``--query-gpu`` CSV; a valid field the double does not model reads [N/A];
- ``nvlink -s``: ``nvlink/good_nvlink_status.txt`` and ``bad_nvlink_status.txt``;
- ``nvlink -e``: ``nvlink/nvidia-smi.nvlink.errors.a100-sxm4-40gb.535.161.08`` (each link's
  replay, recovery and CRC counters, ``errors`` in the state; links of a GPU whose links are
  all inactive are not listed, as ``-s`` lists none);
- no arguments: the summary table of the H100 capture; ``-L`` and ``--version`` likewise;
- ``--query-compute-apps``: names and header from the H100 capture (``--help-query-compute-apps``
  and its per-process CSV), one row per process in the state (none unless a test adds some);
- ``mig -lgip``, ``-lgipp``, ``-lgi``, ``-lci`` (tables laid out as published real outputs of
  A100 80GB and H100 80GB), ``-cgi`` (profile names or ids, comma-separated, ``-C`` for the
  default compute instance), ``-dci`` and ``-dgi`` (all, or those ``-gi``/``-ci`` name); every
  one takes ``-i``. A new instance takes the free placement that blocks the fewest other
  placements, lowest start on a tie, which reproduces the instance ids of published outputs
  (seven 1g.10gb on an H100: ids 13, 11, 12, 7, 8, 9, 10; two 3g.40gb on an A100: 1, 2) and,
  as on the real GPU, makes creation order matter: small instances first can leave no room for
  a large one. The summary table and ``-L`` do not list MIG devices.

Settings: ``-pm``, ``-e`` and ``-mig`` (pending until ``-r`` or a reboot), ``-pl`` (checked
against the GPU's range), ``-ac``, ``-c`` (compute mode, by name or number), ``-r``; all take
``-i`` (index, UUID, PCI bus id or serial, comma-separated). Indexes count present GPUs in
state order, so a GPU that fell off the bus (``present: false``) shifts the ones after it, as
on a real node after re-enumeration. Exit
codes are those of nvidia-smi(1) RETURN VALUE. Messages are published real ones; the
"already set", "Not Supported" and reset messages follow their pattern but no real sample of
them was at hand. Nor was one of ``mig`` changes aimed at a GPU without MIG mode, which get
what the listings print then ("No MIG-enabled devices found."), of ``-lci`` or ``-dci`` with
no compute instance ("No compute instances found.", after -lgi's "No GPU instances found."),
nor of the exit codes of ``mig`` failures: 6 for "not found", 2 for an unknown profile, 255
(other error) for "Insufficient Resources" and "In use by another client". An option the double
does not simulate (``-q`` as text, ``-d``, ``-f``...) fails with a message on stderr rather than
pretending.
"""

from __future__ import annotations

import re
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from . import hwstate
from .hwstate import State

QUERY_CAPTURE = "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
HELP_QUERY_SECTION = "capabilities :: help-query-gpu"
QUERY_CSV_SECTION = "idle :: query-gpu (csv, what the exporter parses)"
HELP_QUERY_APPS_SECTION = "capabilities :: help-query-compute-apps"
QUERY_APPS_CSV_SECTION = "idle :: query-compute-apps (per-process)"

EXIT_INVALID_ARGUMENT = 2
EXIT_NOT_FOUND = 6
EXIT_DRIVER_NOT_LOADED = 9
EXIT_OTHER_ERROR = 255

DRIVER_NOT_LOADED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)
INVALID_ARGUMENTS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
DEPRECATED = "Requested functionality has been deprecated"
NOT_AVAILABLE = "[N/A]"  # --query-gpu's way of saying N/A
ALL_LINKS_INACTIVE = "NVML: Unable to retrieve NVLink information as all links are inactive"
WARNING_MOVING_ON = "Treating as warning and moving on."

VALUE_OPTIONS = {
    "-i": "id",
    "--id": "id",
    "-pm": "persistence_mode",
    "--persistence-mode": "persistence_mode",
    "-e": "ecc",
    "--ecc-config": "ecc",
    "-mig": "mig",
    "--multi-instance-gpu": "mig",
    "-pl": "power_limit",
    "--power-limit": "power_limit",
    "-ac": "applications_clocks",
    "--applications-clocks": "applications_clocks",
    "-c": "compute_mode",
    "--compute-mode": "compute_mode",
    "--query-gpu": "query_gpu",
    "--query-compute-apps": "query_compute_apps",
    "--format": "format",
}
FLAG_OPTIONS = {
    "-L": "list",
    "--list-gpus": "list",
    "-q": "query",
    "--query": "query",
    "-x": "xml",
    "--xml-format": "xml",
    "-r": "reset",
    "--gpu-reset": "reset",
    "--version": "version",
}

# NVML's clocks event reason bits, in the order nvidia-smi lists the reasons.
REASON_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "display_clocks_setting": 0x100,
}

Options = dict[str, Any]
Target = tuple[int, State]  # (nvidia-smi index, GPU state)


class Failure(Exception):
    """What the real tool prints on stdout when it fails, and its exit code."""

    def __init__(self, output: str, exit_code: int) -> None:
        super().__init__(output)
        self.output = output
        self.exit_code = exit_code


class Unsimulated(Exception):
    """A valid nvidia-smi invocation this double does not model."""


def main(argv: Sequence[str]) -> int:
    try:
        state = hwstate.load()
        if not state["driver_loaded"]:
            raise Failure(DRIVER_NOT_LOADED, EXIT_DRIVER_NOT_LOADED)
        sys.stdout.write(hwstate.answered(run(list(argv), state)))
    except Failure as failure:
        sys.stdout.write(failure.output)
        return failure.exit_code
    except Unsimulated as unsimulated:
        sys.stderr.write(f"nvidia-smi (gpunode lab double): not simulated: {unsimulated}\n")
        return EXIT_INVALID_ARGUMENT
    return 0


def run(argv: list[str], state: State) -> str:
    if argv[:1] == ["nvlink"]:
        return nvlink_status(argv[1:], state)
    if argv[:1] == ["mig"]:
        return mig(argv[1:], state)
    options = parse_options(argv)
    modifications = [name for name in MODIFICATIONS if name in options]
    if len(modifications) > 1:
        raise Failure(INVALID_ARGUMENTS, EXIT_INVALID_ARGUMENT)
    if modifications:
        name = modifications[0]
        with hwstate.mutate() as locked:
            return MODIFICATIONS[name](select(locked, options.get("id")), options[name])
    if options.get("version"):
        return version(state)
    if options.get("list"):
        return "".join(
            f"GPU {index}: {gpu['name']} (UUID: {gpu['uuid']})\n"
            for index, gpu in select(state, options.get("id"))
        )
    if "query_gpu" in options:
        return query_gpu(state, options)
    if "query_compute_apps" in options:
        return query_compute_apps(state, options)
    if options.get("query") and options.get("xml"):
        return render_xml(state, select(state, options.get("id")))
    if not options:
        return summary_table(state)
    raise Unsimulated(" ".join(argv))


def parse_options(argv: list[str]) -> Options:
    options: Options = {}
    tokens = iter(argv)
    for token in tokens:
        name, equals, value = token.partition("=")
        if name in VALUE_OPTIONS:
            if not equals:
                value = next(tokens, "")
            if not value:
                raise Failure(INVALID_ARGUMENTS, EXIT_INVALID_ARGUMENT)
            options[VALUE_OPTIONS[name]] = value
        elif token in FLAG_OPTIONS:
            options[FLAG_OPTIONS[token]] = True
        else:
            raise Unsimulated(token)
    return options


def visible_gpus(state: State) -> list[State]:
    return [gpu for gpu in state["gpus"] if gpu["present"]]


def select(state: State, ids: str | None) -> list[Target]:
    """The GPUs ``-i`` names (all when None); an unknown id fails like the real tool."""
    visible = list(enumerate(visible_gpus(state)))
    if ids is None:
        return visible
    targets = []
    for wanted in ids.split(","):
        matches = [
            (index, gpu)
            for index, gpu in visible
            if wanted in (str(index), gpu["uuid"], gpu["serial"])
            or _bus_key(wanted) == _bus_key(gpu["pci_bus_id"])
        ]
        if not matches:
            raise Failure("No devices were found\n", EXIT_NOT_FOUND)
        targets.extend(matches)
    return targets


def _bus_key(bus_id: str) -> tuple[int, int, str] | None:
    """'00000000:18:00.0', '0000:18:00.0' and '18:00.0' name the same device."""
    parts = bus_id.lower().split(":")
    if len(parts) not in (2, 3) or not all(re.fullmatch(r"[0-9a-f.]+", p) for p in parts):
        return None
    domain = int(parts[0], 16) if len(parts) == 3 else 0
    return domain, int(parts[-2], 16), parts[-1]


def _bus_parts(bus_id: str) -> tuple[str, str, str]:
    """'00000000:18:00.0' -> domain '00000000', bus '18', device '00'."""
    domain, bus, device_function = bus_id.split(":")
    return domain, bus, device_function.split(".")[0]


def version(state: State) -> str:
    driver = state["driver_version"]
    return (
        f"NVIDIA-SMI version  : {driver}\n"
        f"NVML version        : {'.'.join(driver.split('.')[:2])}\n"
        f"DRIVER version      : {driver}\n"
        f"CUDA Version        : {state['cuda_version']}\n"
    )


# --- settings -------------------------------------------------------------------------------


def _on_off(value: str) -> str:
    wanted = {"0": "Disabled", "disabled": "Disabled", "1": "Enabled", "enabled": "Enabled"}
    try:
        return wanted[value.lower()]
    except KeyError:
        raise Failure(INVALID_ARGUMENTS, EXIT_INVALID_ARGUMENT) from None


def set_persistence_mode(targets: list[Target], value: str) -> str:
    wanted = _on_off(value)
    lines = []
    for _, gpu in targets:
        bus = gpu["pci_bus_id"]
        if gpu["persistence_mode"] == wanted:
            lines.append(f"Persistence mode is already {wanted} for GPU {bus}.")
        else:
            gpu["persistence_mode"] = wanted
            lines.append(f"{wanted} persistence mode for GPU {bus}.")
    return "\n".join([*lines, "All done.", ""])


def set_ecc_mode(targets: list[Target], value: str) -> str:
    """Only the pending mode changes: ECC takes effect at the next reset or reboot."""
    wanted = _on_off(value)
    lines = []
    changed = False
    for _, gpu in targets:
        bus, ecc = gpu["pci_bus_id"], gpu["ecc_mode"]
        if ecc["current"] == "N/A":
            lines += [f"Unable to set the ECC mode for GPU {bus}: Not Supported", WARNING_MOVING_ON]
        elif ecc["pending"] == wanted:
            lines.append(f"ECC support is already {wanted} for GPU {bus}.")
        else:
            ecc["pending"] = wanted
            changed = True
            lines.append(f"{wanted} ECC support for GPU {bus}.")
    lines.append("All done.")
    if changed:
        lines.append("Reboot required.")
    return "\n".join([*lines, ""])


def set_mig_mode(targets: list[Target], value: str) -> str:
    """Only the pending mode changes: the double models a GPU busy with its clients."""
    wanted = _on_off(value)
    verb = "enable" if wanted == "Enabled" else "disable"
    lines = []
    for _, gpu in targets:
        bus, mig = gpu["pci_bus_id"], gpu["mig_mode"]
        if mig["current"] == "N/A":
            lines += [f"Unable to {verb} MIG Mode for GPU {bus}: Not Supported", WARNING_MOVING_ON]
        elif mig["current"] == wanted:
            mig["pending"] = wanted
            lines.append(f"{wanted} MIG Mode for GPU {bus}")
        else:
            mig["pending"] = wanted
            lines += [
                f"Warning: MIG mode is in pending {verb} state for GPU {bus}:Not Supported",
                "Reboot the system or try nvidia-smi --gpu-reset to make MIG mode effective "
                f"on GPU {bus}",
            ]
    return "\n".join([*lines, "All done.", ""])


def set_power_limit(targets: list[Target], value: str) -> str:
    """Every target is checked before any changes, as the real tool terminates early."""
    try:
        watts = float(value)
    except ValueError:
        raise Failure(INVALID_ARGUMENTS, EXIT_INVALID_ARGUMENT) from None
    for _, gpu in targets:
        power = gpu["power"]
        if not power["min_limit"] <= watts <= power["max_limit"]:
            raise Failure(
                f"Provided power limit {watts:.2f} W is not a valid power limit which should be "
                f"between {power['min_limit']:.2f} W and {power['max_limit']:.2f} W "
                f"for GPU {gpu['pci_bus_id']}\nTerminating early due to previous errors.\n",
                EXIT_INVALID_ARGUMENT,
            )
    lines = []
    for _, gpu in targets:
        previous, gpu["power"]["limit"] = gpu["power"]["limit"], watts
        lines.append(
            f"Power limit for GPU {gpu['pci_bus_id']} was set to {watts:.2f} W "
            f"from {previous:.2f} W."
        )
    return "\n".join([*lines, "All done.", ""])


def set_applications_clocks(targets: list[Target], value: str) -> str:
    match = re.fullmatch(r"(\d+),(\d+)", value)
    if not match:
        raise Failure(INVALID_ARGUMENTS, EXIT_INVALID_ARGUMENT)
    memory, graphics = int(match.group(1)), int(match.group(2))
    lines = []
    for _, gpu in targets:
        bus = gpu["pci_bus_id"]
        if gpu["applications_clocks"] is None:
            lines += [
                f"Setting applications clocks is not supported for GPU {bus}.",
                WARNING_MOVING_ON,
            ]
        elif not any(
            entry["memory"] == memory
            and entry["graphics_min"] <= graphics <= entry["graphics_max"]
            and (entry["graphics_max"] - graphics) % 15 == 0
            for entry in gpu["supported_clocks"]
        ):
            lines += [
                f'Specified clock combination "(MEM {memory}, SM {graphics})" is not supported '
                f"for GPU {bus}. Run 'nvidia-smi -q -d SUPPORTED_CLOCKS' to see list of "
                "supported clock combinations",
                WARNING_MOVING_ON,
            ]
        else:
            gpu["applications_clocks"] = {"graphics": graphics, "memory": memory}
            lines.append(
                f'Applications clocks set to "(MEM {memory}, SM {graphics})" for GPU {bus}'
            )
    return "\n".join([*lines, "All done.", ""])


# -c takes a name or its number (nvidia-smi(1): 0 DEFAULT, 2 PROHIBITED, 3 EXCLUSIVE_PROCESS;
# 1, EXCLUSIVE_THREAD, is gone from current drivers); --query-gpu prints the shown name.
COMPUTE_MODES = {
    "0": "Default", "default": "Default",
    "2": "Prohibited", "prohibited": "Prohibited",
    "3": "Exclusive_Process", "exclusive_process": "Exclusive_Process",
}  # fmt: skip


def compute_mode_of(gpu: State) -> str:
    """The GPU's compute mode; state written before the double modelled it has Default."""
    mode: str = gpu.get("compute_mode", "Default")
    return mode


def set_compute_mode(targets: list[Target], value: str) -> str:
    """Takes effect at once and is forgotten at a reboot. The message is the published one
    ("Set compute mode to EXCLUSIVE_PROCESS for GPU 00000000:00:06.0." then "All done.", as
    captured with ``nvidia-smi -i 0 --compute-mode 3`` and ``-c 3``)."""
    wanted = COMPUTE_MODES.get(value.lower())
    if wanted is None:
        raise Failure(INVALID_ARGUMENTS, EXIT_INVALID_ARGUMENT)
    lines = []
    for _, gpu in targets:
        gpu["compute_mode"] = wanted
        lines.append(f"Set compute mode to {wanted.upper()} for GPU {gpu['pci_bus_id']}.")
    return "\n".join([*lines, "All done.", ""])


# nvidia-smi's refusal to reset a GPU a process uses (its pattern, as the module docstring
# says of reset messages: no real sample was at hand).
RESET_IN_USE = (
    "Unable to reset this GPU because it's being used by some other process (e.g. CUDA "
    "application, graphics application like X server, monitoring application like other "
    "instance of nvidia-smi). Please first kill all processes using this GPU and all compute "
    "applications running in the system."
)


def reset_gpus(targets: list[Target], _requested: bool) -> str:
    """Every target reset, or none where a process uses one of them."""
    busy = [gpu for _, gpu in targets if gpu["compute_processes"]]
    if busy:
        lines = [f"GPU {gpu['pci_bus_id']}: {RESET_IN_USE}" for gpu in busy]
        raise Failure("\n".join(lines) + "\n", EXIT_OTHER_ERROR)
    lines = []
    for _, gpu in targets:
        hwstate.reset_gpu(gpu)
        lines.append(f"GPU {gpu['pci_bus_id']} was successfully reset.")
    return "\n".join([*lines, "All done.", ""])


MODIFICATIONS: dict[str, Callable[[list[Target], Any], str]] = {
    "persistence_mode": set_persistence_mode,
    "ecc": set_ecc_mode,
    "mig": set_mig_mode,
    "power_limit": set_power_limit,
    "applications_clocks": set_applications_clocks,
    "compute_mode": set_compute_mode,
    "reset": reset_gpus,
}


# --- nvlink -----------------------------------------------------------------------------------


# nvidia-smi nvlink -e's counters, in the order it prints them, by the state's names.
NVLINK_ERROR_COUNTERS = (("replay", "Replay Errors"), ("recovery", "Recovery Errors"),
                         ("crc", "CRC Errors"))  # fmt: skip


def nvlink_status(argv: list[str], state: State) -> str:
    options: Options = {}
    tokens = iter(argv)
    for token in tokens:
        if token in ("-s", "--status"):
            options["status"] = True
        elif token in ("-e", "--errorcounters"):
            options["errors"] = True
        elif token in ("-i", "--id"):
            options["id"] = next(tokens, None)
        elif token.startswith("--id="):
            options["id"] = token.partition("=")[2]
        else:
            raise Unsimulated(f"nvlink {token}")
    if options.get("errors") and not options.get("status"):
        return nvlink_errors(state, options.get("id"))
    if not options.get("status"):
        raise Unsimulated("nvlink without -s or -e")
    lines = []
    for index, gpu in select(state, options.get("id")):
        lines.append(f"GPU {index}: {gpu['name']} (UUID: {gpu['uuid']})")
        links = gpu["nvlinks"]
        if links and not any(link["active"] for link in links):
            lines.append(ALL_LINKS_INACTIVE)
            continue
        for number, link in enumerate(links):
            speed = gpu["nvlink_speed"] if link["active"] else "<inactive>"
            lines.append(f"\t Link {number}: {speed}")
    return "".join(f"{line}\n" for line in lines)


def nvlink_errors(state: State, selected: str | None) -> str:
    """Per link its three counters, a blank line after each link (the capture's layout)."""
    lines = []
    for index, gpu in select(state, selected):
        lines.append(f"GPU {index}: {gpu['name']} (UUID: {gpu['uuid']})")
        links = gpu["nvlinks"]
        if links and not any(link["active"] for link in links):
            lines.append(ALL_LINKS_INACTIVE)
            continue
        for number, link in enumerate(links):
            counts = link.get("errors") or {}
            for key, words in NVLINK_ERROR_COUNTERS:
                lines.append(f"\t Link {number}: {words}: {counts.get(key, 0)}")
            lines.append("")
    return "".join(f"{line}\n" for line in lines)


# --- mig ------------------------------------------------------------------------------------

MIG_VALUE_OPTIONS = {
    "-i": "id",
    "--id": "id",
    "-cgi": "create_gpu_instances",
    "--create-gpu-instance": "create_gpu_instances",
    "-gi": "gpu_instance_ids",
    "--gpu-instance-id": "gpu_instance_ids",
    "-ci": "compute_instance_ids",
    "--compute-instance-id": "compute_instance_ids",
}
MIG_FLAG_OPTIONS = {
    "-lgi": "list_gpu_instances",
    "--list-gpu-instances": "list_gpu_instances",
    "-lgip": "list_gpu_instance_profiles",
    "--list-gpu-instance-profiles": "list_gpu_instance_profiles",
    "-lgipp": "list_gpu_instance_placements",
    "--list-gpu-instance-possible-placements": "list_gpu_instance_placements",
    "-lci": "list_compute_instances",
    "--list-compute-instances": "list_compute_instances",
    "-C": "default_compute_instance",
    "--default-compute-instance": "default_compute_instance",
    "-dci": "destroy_compute_instances",
    "--destroy-compute-instance": "destroy_compute_instances",
    "-dgi": "destroy_gpu_instances",
    "--destroy-gpu-instance": "destroy_gpu_instances",
}
MIG_LISTINGS = (
    "list_gpu_instances",
    "list_gpu_instance_profiles",
    "list_gpu_instance_placements",
    "list_compute_instances",
)
MIG_CHANGES = ("create_gpu_instances", "destroy_compute_instances", "destroy_gpu_instances")
NO_MIG_DEVICES = "No MIG-enabled devices found.\n"
NO_GPU_INSTANCES = "No GPU instances found.\n"
NO_COMPUTE_INSTANCES = "No compute instances found.\n"
IN_USE = "In use by another client"
INSUFFICIENT_RESOURCES = "Insufficient Resources"
INVALID_ARGUMENT = "Invalid Argument"
LGI_RULE = "+" + "-" * 55 + "+"
LCI_RULE = "+" + "-" * 68 + "+"
LGIP_RULE = "+" + "-" * 77 + "+"


def mig(argv: list[str], state: State) -> str:
    options = _mig_options(argv)
    actions = [name for name in (*MIG_LISTINGS, *MIG_CHANGES) if name in options]
    if len(actions) != 1:
        raise Failure(INVALID_ARGUMENTS, EXIT_INVALID_ARGUMENT)
    action = actions[0]
    if action in MIG_LISTINGS:
        targets = _mig_targets(state, options.get("id"))
        listing = {
            "list_gpu_instances": list_gpu_instances,
            "list_gpu_instance_profiles": list_gpu_instance_profiles,
            "list_gpu_instance_placements": list_gpu_instance_placements,
            "list_compute_instances": list_compute_instances,
        }[action]
        return listing(targets)
    change = {
        "create_gpu_instances": create_gpu_instances,
        "destroy_compute_instances": destroy_compute_instances,
        "destroy_gpu_instances": destroy_gpu_instances,
    }[action]
    failed: Failure | None = None
    with hwstate.mutate() as locked:
        try:
            output = change(_mig_targets(locked, options.get("id")), options)
        except Failure as failure:
            # What was done before the failure stays done, as on the real GPU.
            failed = failure
    if failed is not None:
        raise failed
    return output


def _mig_options(argv: list[str]) -> Options:
    options: Options = {}
    tokens = iter(argv)
    for token in tokens:
        name, equals, value = token.partition("=")
        if name in MIG_VALUE_OPTIONS:
            if not equals:
                value = next(tokens, "")
            if not value:
                raise Failure(INVALID_ARGUMENTS, EXIT_INVALID_ARGUMENT)
            options[MIG_VALUE_OPTIONS[name]] = value
        elif token in MIG_FLAG_OPTIONS:
            options[MIG_FLAG_OPTIONS[token]] = True
        else:
            raise Unsimulated(f"mig {token}")
    return options


def _mig_targets(state: State, ids: str | None) -> list[Target]:
    """The selected GPUs that are in MIG mode now (a pending mode does not count)."""
    targets = [
        (index, gpu) for index, gpu in select(state, ids) if gpu["mig_mode"]["current"] == "Enabled"
    ]
    if not targets:
        raise Failure(NO_MIG_DEVICES, EXIT_NOT_FOUND)
    return targets


def _id_filter(text: str | None) -> set[int] | None:
    if text is None:
        return None
    try:
        return {int(part) for part in text.split(",")}
    except ValueError:
        raise Failure(INVALID_ARGUMENTS, EXIT_INVALID_ARGUMENT) from None


def _profile_by_id(gpu: State, profile_id: int) -> State:
    return next(profile for profile in gpu["mig_profiles"] if profile["id"] == profile_id)


def _occupied_slices(gpu: State) -> set[int]:
    return {
        position
        for instance in gpu["gpu_instances"]
        for position in range(instance["start"], instance["start"] + instance["size"])
    }


def _free_placements(gpu: State, profile: State, occupied: set[int]) -> list[int]:
    return [
        start
        for start in profile["placements"]
        if occupied.isdisjoint(range(start, start + profile["size"]))
    ]


def _free_count(gpu: State, profile: State) -> int:
    """How many more instances of ``profile`` fit now (Free of Free/Total)."""
    occupied = _occupied_slices(gpu)
    existing = sum(1 for i in gpu["gpu_instances"] if i["profile_id"] == profile["id"])
    fitting = 0
    for start in _free_placements(gpu, profile, occupied):
        slices = set(range(start, start + profile["size"]))
        if occupied.isdisjoint(slices):
            occupied |= slices
            fitting += 1
    return min(fitting, profile["instances"] - existing)


def _gpu_instance_id(start: int, size: int) -> int:
    """GPU instance ids name the place in the 8-slice tree (ids of published outputs)."""
    return {8: 0, 4: 1 if start == 4 else 2, 2: 3 + start // 2, 1: 7 + start}[size]


def _choose_placement(gpu: State, profile: State) -> int | None:
    """The free placement that blocks the fewest free placements of every profile."""
    occupied = _occupied_slices(gpu)
    candidates = _free_placements(gpu, profile, occupied)

    def blocked(start: int) -> int:
        taken = set(range(start, start + profile["size"]))
        return sum(
            not taken.isdisjoint(range(other, other + each["size"]))
            for each in gpu["mig_profiles"]
            for other in _free_placements(gpu, each, occupied)
        )

    return min(candidates, key=lambda start: (blocked(start), start), default=None)


def _resolve_profile(gpu: State, requested: str) -> State | None:
    wanted = requested.strip().removeprefix("MIG ").strip()
    for profile in gpu["mig_profiles"]:
        if wanted in (profile["name"], str(profile["id"])):
            return profile
    return None


def create_gpu_instances(targets: list[Target], options: Options) -> str:
    lines: list[str] = []
    requested = str(options["create_gpu_instances"]).split(",")
    for index, gpu in targets:
        for item in requested:
            profile = _resolve_profile(gpu, item)
            if profile is None:
                reason, code = INVALID_ARGUMENT, EXIT_INVALID_ARGUMENT
            else:
                start = _choose_placement(gpu, profile)
                existing = sum(1 for i in gpu["gpu_instances"] if i["profile_id"] == profile["id"])
                if start is not None and existing < profile["instances"]:
                    lines += _create(index, gpu, profile, start, options)
                    continue
                reason, code = INSUFFICIENT_RESOURCES, EXIT_OTHER_ERROR
            lines += [
                f"Unable to create a GPU instance on GPU {index:>2} using profile {item}: {reason}",
                f"Failed to create GPU instances: {reason}",
            ]
            raise Failure("".join(f"{line}\n" for line in lines), code)
    return "".join(f"{line}\n" for line in lines)


def _create(index: int, gpu: State, profile: State, start: int, options: Options) -> list[str]:
    instance_id = _gpu_instance_id(start, profile["size"])
    instance: State = {
        "id": instance_id,
        "profile_id": profile["id"],
        "start": start,
        "size": profile["size"],
        "compute_instances": [],
    }
    gpu["gpu_instances"].append(instance)
    name = f"MIG {profile['name']}"
    lines = [
        f"Successfully created GPU instance ID {instance_id:>2} on GPU {index:>2} "
        f"using profile {name} (ID {profile['id']:>2})"
    ]
    if options.get("default_compute_instance"):
        instance["compute_instances"].append(
            {"id": 0, "profile_id": profile["ci_profile_id"], "start": 0,
             "size": profile["compute_slices"]}
        )  # fmt: skip
        lines.append(
            f"Successfully created compute instance ID  0 on GPU {index:>2} GPU instance ID "
            f"{instance_id:>2} using profile {name} (ID {profile['ci_profile_id']:>2})"
        )
    return lines


def _selected_instances(gpu: State, options: Options) -> list[State]:
    wanted = _id_filter(options.get("gpu_instance_ids"))
    return sorted(
        (i for i in gpu["gpu_instances"] if wanted is None or i["id"] in wanted),
        key=lambda instance: instance["id"],
    )


def destroy_compute_instances(targets: list[Target], options: Options) -> str:
    wanted = _id_filter(options.get("compute_instance_ids"))
    lines: list[str] = []
    for index, gpu in targets:
        for instance in _selected_instances(gpu, options):
            for compute in sorted(instance["compute_instances"], key=lambda c: c["id"]):
                if wanted is not None and compute["id"] not in wanted:
                    continue
                if gpu["compute_processes"]:
                    lines += [
                        f"Unable to destroy compute instance ID {compute['id']:>2} from GPU "
                        f"{index:>2} GPU instance ID {instance['id']:>2}: {IN_USE}",
                        f"Failed to destroy compute instances: {IN_USE}",
                    ]
                    raise Failure("".join(f"{line}\n" for line in lines), EXIT_OTHER_ERROR)
                instance["compute_instances"].remove(compute)
                lines.append(
                    f"Successfully destroyed compute instance ID {compute['id']:>2} from GPU "
                    f"{index:>2} GPU instance ID {instance['id']:>2}"
                )
    if not lines:
        raise Failure(NO_COMPUTE_INSTANCES, EXIT_NOT_FOUND)
    return "".join(f"{line}\n" for line in lines)


def destroy_gpu_instances(targets: list[Target], options: Options) -> str:
    lines: list[str] = []
    failed = False
    for index, gpu in targets:
        for instance in _selected_instances(gpu, options):
            if instance["compute_instances"]:
                failed = True
                lines.append(
                    f"Unable to destroy GPU instance ID {instance['id']:>2} from GPU {index:>2}: "
                    f"{IN_USE}"
                )
                continue
            gpu["gpu_instances"].remove(instance)
            lines.append(
                f"Successfully destroyed GPU instance ID {instance['id']:>2} from GPU {index:>2}"
            )
    if not lines:
        raise Failure(NO_GPU_INSTANCES, EXIT_NOT_FOUND)
    if failed:
        lines.append(f"Failed to destroy GPU instances: {IN_USE}")
        raise Failure("".join(f"{line}\n" for line in lines), EXIT_OTHER_ERROR)
    return "".join(f"{line}\n" for line in lines)


def list_gpu_instance_profiles(targets: list[Target]) -> str:
    lines = [
        LGIP_RULE,
        f"| {'GPU instance profiles:':<76}|",
        "| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |",
        "|                              Free/Total   GiB              CE    JPEG  OFA  |",
        "|" + "=" * 77 + "|",
    ]
    for index, gpu in targets:
        for profile in gpu["mig_profiles"]:
            instances = f"{_free_count(gpu, profile)}/{profile['instances']}"
            memory = f"{profile['memory_mib'] / 1024:.2f}"
            lines += [
                f"|{index:>4}  {'MIG ' + profile['name']:<16}{profile['id']:>4}{instances:>8}"
                f"{'':8}{memory:<11}No{'':5}{profile['sm']:<3}{profile['dec']:>5}"
                f"{profile['enc']:>6}   |",
                f"|{'':60}{profile['ce']:>2}{profile['jpeg']:>6}{profile['ofa']:>6}   |",
                LGIP_RULE,
            ]
    return "".join(f"{line}\n" for line in lines)


def list_gpu_instance_placements(targets: list[Target]) -> str:
    lines = []
    for index, gpu in targets:
        for profile in gpu["mig_profiles"]:
            starts = ",".join(str(start) for start in profile["placements"])
            label = "Placements:" if len(profile["placements"]) > 1 else "Placement :"
            lines.append(
                f"GPU {index:>2} Profile ID {profile['id']:>2} {label} "
                f"{{{starts}}}:{profile['size']}"
            )
    return "".join(f"{line}\n" for line in lines)


def list_gpu_instances(targets: list[Target]) -> str:
    rows = []
    for index, gpu in targets:
        for instance in sorted(gpu["gpu_instances"], key=lambda i: i["id"]):
            profile = _profile_by_id(gpu, instance["profile_id"])
            placement = f"{instance['start']}:{instance['size']}"
            rows += [
                f"|{index:>4}  {'MIG ' + profile['name']:<16}{profile['id']:>6}"
                f"{instance['id']:>9}{placement:>13}     |",
                LGI_RULE,
            ]
    if not rows:
        raise Failure(NO_GPU_INSTANCES, EXIT_NOT_FOUND)
    header = [
        LGI_RULE,
        f"| {'GPU instances:':<54}|",
        "| GPU   Name             Profile  Instance   Placement  |",
        "|                          ID       ID       Start:Size |",
        "|" + "=" * 55 + "|",
    ]
    return "".join(f"{line}\n" for line in header + rows)


def list_compute_instances(targets: list[Target]) -> str:
    rows = []
    for index, gpu in targets:
        for instance in sorted(gpu["gpu_instances"], key=lambda i: i["id"]):
            profile = _profile_by_id(gpu, instance["profile_id"])
            for compute in sorted(instance["compute_instances"], key=lambda c: c["id"]):
                placement = f"{compute['start']}:{compute['size']}"
                rows += [
                    f"|{index:>4}{instance['id']:>7}       {'MIG ' + profile['name']:<16}"
                    f"{compute['profile_id']:>6}{compute['id']:>10}{placement:>13}     |",
                    LCI_RULE,
                ]
    if not rows:
        raise Failure(NO_COMPUTE_INSTANCES, EXIT_NOT_FOUND)
    header = [
        LCI_RULE,
        f"| {'Compute instances:':<67}|",
        "| GPU     GPU       Name             Profile   Instance   Placement  |",
        "|       Instance                       ID        ID       Start:Size |",
        "|         ID                                                         |",
        "|" + "=" * 68 + "|",
    ]
    return "".join(f"{line}\n" for line in header + rows)


# --- summary table ----------------------------------------------------------------------------


def summary_table(state: State) -> str:
    """The default ``nvidia-smi`` table, laid out as in the H100 capture."""
    hwstate.clock_read()
    rule = f"+{'-' * 41}+{'-' * 24}+{'-' * 22}+"
    lines = [
        f"{time.asctime()}       ",
        f"+{'-' * 89}+",
        f"| NVIDIA-SMI {state['driver_version']:<23}"
        f"Driver Version: {state['driver_version']:<15}"
        f"CUDA Version: {state['cuda_version']:<9}|",
        rule,
        _table_row(
            " GPU  Name                 Persistence-M",
            " Bus-Id          Disp.A",
            " Volatile Uncorr. ECC",
        ),
        _table_row(
            " Fan  Temp   Perf          Pwr:Usage/Cap",
            "           Memory-Usage",
            " GPU-Util  Compute M.",
        ),
        _table_row("", "", "               MIG M."),
        f"|{'=' * 41}+{'=' * 24}+{'=' * 22}|",
    ]
    for index, gpu in enumerate(visible_gpus(state)):
        ecc_errors = gpu["ecc_errors"]["volatile"]
        uncorrected = (
            str(ecc_errors["sram_uncorrectable"] + ecc_errors["dram_uncorrectable"])
            if gpu["ecc_mode"]["current"] == "Enabled"
            else "N/A"
        )
        persistence = "On" if gpu["persistence_mode"] == "Enabled" else "Off"
        fan = "N/A" if gpu["fan_speed"] is None else f"{gpu['fan_speed']}%"
        power, memory = gpu["power"], gpu["memory"]
        mig = gpu["mig_mode"]["current"]
        utilization = "N/A" if mig == "Enabled" else "0%"
        lines += [
            _table_row(
                f" {index:>3}  {gpu['name']:<30.30}{persistence:>3}",
                f" {gpu['pci_bus_id']:>18} Off",
                f" {uncorrected:>20}",
            ),
            _table_row(
                f" {fan:>3}   {gpu['temperature']['gpu']:>2}C    {gpu['performance_state']:<2}"
                f"{int(power['draw']):>15}W / {int(power['limit']):>4}W",
                f"{memory['used_mib']:>8}MiB / {memory['total_mib']:>6}MiB",
                f" {utilization:>7}      Default",
            ),
            _table_row("", "", f" {mig:>20}"),
            rule,
        ]
    lines += [
        "",
        f"+{'-' * 89}+",
        f"| {'Processes:':<88}|",
        "|  GPU   GI   CI              PID   Type   Process name" + " " * 24 + "GPU Memory |",
        "|        ID   ID" + " " * 63 + "Usage      |",
        f"|{'=' * 89}|",
        f"|  {'No running processes found':<87}|",
        f"+{'-' * 89}+",
    ]
    return "".join(f"{line}\n" for line in lines)


def _table_row(left: str, middle: str, right: str) -> str:
    return f"|{left:<41}|{middle:<24}|{right:<22}|"


# --- --query-gpu ------------------------------------------------------------------------------


# NamedTuples, not dataclasses: importing dataclasses (and inspect with it) is a large part
# of the start-up every nvidia-smi call pays.
class QueryCatalogue(NamedTuple):
    canonical: dict[str, str]  # every accepted name or alias -> canonical field name
    headers: dict[str, str]  # canonical field name -> header, with its unit where it has one


def load_query_catalogue(
    help_section: str = HELP_QUERY_SECTION, csv_section: str = QUERY_CSV_SECTION
) -> QueryCatalogue:
    """Field names of a ``--query-*`` switch from its ``--help-query-*`` capture section."""
    text = (hwstate.share_dir() / QUERY_CAPTURE).read_text(encoding="utf-8")
    sections = capture_sections(text)
    canonical = {}
    for line in sections[help_section].splitlines():
        if re.fullmatch(r'"[^"]+"( or "[^"]+")*', line):
            names = re.findall(r'"([^"]+)"', line)
            canonical.update(dict.fromkeys(names, names[0]))
    header_line = sections[csv_section].splitlines()[0]
    headers = {header.split(" [")[0]: header for header in header_line.split(", ")}
    return QueryCatalogue(canonical, headers)


def capture_sections(text: str) -> dict[str, str]:
    """Body of each section of an nvidia_gpu_exporter capture, keyed by its title line."""
    sections: dict[str, str] = {}
    lines = text.splitlines()
    position = 0
    while position < len(lines):
        if _is_rule(lines[position]) and position + 1 < len(lines):
            title = lines[position + 1].removeprefix("# ")
            header_end = position + 1
            while header_end < len(lines) and not _is_rule(lines[header_end]):
                header_end += 1
            body_end = header_end + 1
            while body_end < len(lines) and not _is_rule(lines[body_end]):
                body_end += 1
            sections[title] = "\n".join(lines[header_end + 1 : body_end])
            position = body_end
        else:
            position += 1
    return sections


def _is_rule(line: str) -> bool:
    # Every line of the capture is asked, on every --query-* call: no set per line.
    return len(line) >= 40 and line[0] == "#" and not line.strip("#")


class QueryRow:
    """One GPU's row of a --query-gpu answer (a plain class: ``index`` and ``count`` are
    tuple methods, so not a NamedTuple)."""

    __slots__ = ("count", "gpu", "index", "state")

    def __init__(self, state: State, gpu: State, index: int, count: int) -> None:
        self.state, self.gpu, self.index, self.count = state, gpu, index, count


def _mode_value(mode: str) -> str:
    return NOT_AVAILABLE if mode == "N/A" else mode


def _app_clock(key: str, which: str) -> Callable[[QueryRow], str]:
    def value(row: QueryRow) -> str:
        clocks = row.gpu[key]
        return f"[{DEPRECATED}]" if clocks is None else str(clocks[which])

    return value


def _ecc_count(kind: str, scope: str, memories: tuple[str, ...]) -> Callable[[QueryRow], str]:
    def value(row: QueryRow) -> str:
        errors = row.gpu["ecc_errors"][scope]
        return str(sum(errors[f"{memory}_{kind}"] for memory in memories))

    return value


def _reason_state(reason: str) -> Callable[[QueryRow], str]:
    def value(row: QueryRow) -> str:
        return "Active" if row.gpu["clocks_event_reasons"][reason] else "Not Active"

    return value


def _reasons_active(row: QueryRow) -> str:
    reasons = row.gpu["clocks_event_reasons"]
    return f"0x{sum(bit for name, bit in REASON_BITS.items() if reasons[name]):016X}"


def _query_fields() -> dict[str, Callable[[QueryRow], str]]:
    """Value of each modelled field, before units are added."""

    def gpu_value(*keys: str) -> Callable[[QueryRow], str]:
        def value(row: QueryRow) -> str:
            found: Any = row.gpu
            for key in keys:
                found = found[key]
            return NOT_AVAILABLE if found is None else str(found)

        return value

    def watts(key: str) -> Callable[[QueryRow], str]:
        return lambda row: f"{row.gpu['power'][key]:.2f}"

    fields: dict[str, Callable[[QueryRow], str]] = {
        "timestamp": lambda row: _timestamp(time.time()),
        "driver_version": lambda row: row.state["driver_version"],
        "count": lambda row: str(row.count),
        "index": lambda row: str(row.index),
        "name": gpu_value("name"),
        "serial": gpu_value("serial"),
        "uuid": gpu_value("uuid"),
        "pci.bus_id": gpu_value("pci_bus_id"),
        "pci.domain": lambda row: f"0x{int(_bus_parts(row.gpu['pci_bus_id'])[0], 16):04X}",
        "pci.bus": lambda row: f"0x{_bus_parts(row.gpu['pci_bus_id'])[1].upper()}",
        "pci.device": lambda row: f"0x{_bus_parts(row.gpu['pci_bus_id'])[2].upper()}",
        "pci.device_id": lambda row: f"0x{row.gpu['pci_device_id']}",
        "pci.sub_device_id": lambda row: f"0x{row.gpu['pci_sub_system_id']}",
        "pcie.link.gen.current": gpu_value("pcie", "gen_current"),
        "pcie.link.gen.gpucurrent": gpu_value("pcie", "gen_current"),
        "pcie.link.gen.max": gpu_value("pcie", "gen_max"),
        "pcie.link.gen.gpumax": gpu_value("pcie", "gen_max"),
        "pcie.link.width.current": gpu_value("pcie", "width_current"),
        "pcie.link.width.max": gpu_value("pcie", "width_max"),
        "persistence_mode": gpu_value("persistence_mode"),
        "vbios_version": gpu_value("vbios_version"),
        "inforom.img": gpu_value("inforom", "img"),
        "inforom.oem": gpu_value("inforom", "oem"),
        "inforom.ecc": gpu_value("inforom", "ecc"),
        "fan.speed": gpu_value("fan_speed"),
        "pstate": gpu_value("performance_state"),
        "compute_mode": lambda row: compute_mode_of(row.gpu),
        "compute_cap": gpu_value("compute_cap"),
        "memory.total": gpu_value("memory", "total_mib"),
        "memory.reserved": gpu_value("memory", "reserved_mib"),
        "memory.used": gpu_value("memory", "used_mib"),
        "memory.free": lambda row: str(
            row.gpu["memory"]["total_mib"]
            - row.gpu["memory"]["reserved_mib"]
            - row.gpu["memory"]["used_mib"]
        ),
        "utilization.gpu": lambda row: _utilization(row.gpu),
        "utilization.memory": lambda row: _utilization(row.gpu),
        "ecc.mode.current": lambda row: _mode_value(row.gpu["ecc_mode"]["current"]),
        "ecc.mode.pending": lambda row: _mode_value(row.gpu["ecc_mode"]["pending"]),
        "mig.mode.current": lambda row: _mode_value(row.gpu["mig_mode"]["current"]),
        "mig.mode.pending": lambda row: _mode_value(row.gpu["mig_mode"]["pending"]),
        "remapped_rows.correctable": gpu_value("remapped_rows", "correctable"),
        "remapped_rows.uncorrectable": gpu_value("remapped_rows", "uncorrectable"),
        "remapped_rows.pending": gpu_value("remapped_rows", "pending"),
        "remapped_rows.failure": gpu_value("remapped_rows", "failure"),
        "remapped_rows.histogram.max": gpu_value("remapped_rows", "histogram_max"),
        "temperature.gpu": gpu_value("temperature", "gpu"),
        "temperature.memory": gpu_value("temperature", "memory"),
        "power.draw": watts("draw"),
        "power.draw.average": watts("draw"),
        "power.draw.instant": watts("draw"),
        "power.limit": watts("limit"),
        "enforced.power.limit": watts("limit"),
        "power.default_limit": watts("default_limit"),
        "power.min_limit": watts("min_limit"),
        "power.max_limit": watts("max_limit"),
        "clocks.applications.graphics": _app_clock("applications_clocks", "graphics"),
        "clocks.applications.memory": _app_clock("applications_clocks", "memory"),
        "clocks.default_applications.graphics": _app_clock(
            "default_applications_clocks", "graphics"
        ),
        "clocks.default_applications.memory": _app_clock("default_applications_clocks", "memory"),
        "clocks_event_reasons.supported": lambda row: f"0x{sum(REASON_BITS.values()):016X}",
        "clocks_event_reasons.active": _reasons_active,
        "fabric.state": lambda row: (row.gpu["fabric"] or {}).get("state", NOT_AVAILABLE),
        "fabric.status": lambda row: (row.gpu["fabric"] or {}).get("status", NOT_AVAILABLE),
    }
    for clock in ("graphics", "sm", "memory", "video"):
        fields[f"clocks.current.{clock}"] = gpu_value("clocks", clock)
        fields[f"clocks.max.{clock}"] = gpu_value("max_clocks", clock)
    for reason in REASON_BITS:
        fields[f"clocks_event_reasons.{reason}"] = _reason_state(reason)
    for kind, word in (("correctable", "corrected"), ("uncorrectable", "uncorrected")):
        for scope in ("volatile", "aggregate"):
            prefix = f"ecc.errors.{word}.{scope}"
            fields[f"{prefix}.device_memory"] = _ecc_count(kind, scope, ("dram",))
            fields[f"{prefix}.dram"] = _ecc_count(kind, scope, ("dram",))
            fields[f"{prefix}.sram"] = _ecc_count(kind, scope, ("sram",))
            fields[f"{prefix}.total"] = _ecc_count(kind, scope, ("sram", "dram"))
    return fields


def _timestamp(now: float) -> str:
    hwstate.clock_read()
    return f"{time.strftime('%Y/%m/%d %H:%M:%S', time.localtime(now))}.{int(now * 1000) % 1000:03d}"


def _utilization(gpu: State) -> str:
    return NOT_AVAILABLE if gpu["mig_mode"]["current"] == "Enabled" else "0"


def _csv_formats(options: Options) -> list[str]:
    formats = str(options.get("format", "")).split(",")
    if "csv" not in formats or not set(formats) <= {"csv", "noheader", "nounits"}:
        raise Failure(INVALID_ARGUMENTS, EXIT_INVALID_ARGUMENT)
    return formats


def _requested_fields(catalogue: QueryCatalogue, requested: str) -> list[str]:
    """Canonical names of the requested fields; one unknown name fails the whole call."""
    names = []
    for name in requested.split(","):
        if name not in catalogue.canonical:
            raise Failure(
                f'Field "{name}" is not a valid field to query.\n\n', EXIT_INVALID_ARGUMENT
            )
        names.append(catalogue.canonical[name])
    return names


def _csv(
    catalogue: QueryCatalogue, names: list[str], rows: list[list[str]], formats: list[str]
) -> str:
    headers = [catalogue.headers.get(name, name) for name in names]
    units = [re.findall(r" \[(.+)\]$", header) for header in headers]
    lines = [] if "noheader" in formats else [", ".join(headers)]
    for row in rows:
        values = []
        for value, unit in zip(row, units, strict=True):
            if unit and "nounits" not in formats and not value.startswith("["):
                value = f"{value} {unit[0]}"
            values.append(value)
        lines.append(", ".join(values))
    return "".join(f"{line}\n" for line in lines)


def query_gpu(state: State, options: Options) -> str:
    formats = _csv_formats(options)
    catalogue = load_query_catalogue()
    names = _requested_fields(catalogue, str(options["query_gpu"]))
    fields = _query_fields()
    rows = []
    for index, gpu in select(state, options.get("id")):
        row = QueryRow(state, gpu, index, len(visible_gpus(state)))
        rows.append([fields[name](row) if name in fields else NOT_AVAILABLE for name in names])
    return _csv(catalogue, names, rows, formats)


def query_compute_apps(state: State, options: Options) -> str:
    """One row per compute process of the selected GPUs (under MIG: of their MIG devices)."""
    formats = _csv_formats(options)
    catalogue = load_query_catalogue(HELP_QUERY_APPS_SECTION, QUERY_APPS_CSV_SECTION)
    names = _requested_fields(catalogue, str(options["query_compute_apps"]))
    rows = []
    for _, gpu in select(state, options.get("id")):
        for process in gpu["compute_processes"]:
            values = {
                "timestamp": _timestamp(time.time()),
                "gpu_name": gpu["name"],
                "gpu_bus_id": gpu["pci_bus_id"],
                "gpu_serial": gpu["serial"],
                "gpu_uuid": gpu["uuid"],
                "pid": str(process["pid"]),
                "process_name": process["name"],
                "used_gpu_memory": str(process["used_memory_mib"]),
            }
            rows.append([values.get(name, NOT_AVAILABLE) for name in names])
    return _csv(catalogue, names, rows, formats)


# --- -q -x ------------------------------------------------------------------------------------


def render_xml(state: State, targets: list[Target]) -> str:
    generation = state["smi_generation"]
    text = (hwstate.share_dir() / state["smi_xml_template"]).read_text(encoding="utf-8")
    # ElementTree drops the XML declaration and DOCTYPE; keep the template's own lines.
    prologue = text.splitlines()[:2]
    if generation == "r590":
        prologue = ['<?xml version="1.0" ?>', prologue[1]]
    root = ElementTree.fromstring(text)
    gpu_template = _find(root, "gpu")
    for captured_gpu in root.findall("gpu"):
        root.remove(captured_gpu)
    _set(root, "timestamp", hwstate.asctime())
    _set(root, "driver_version", state["driver_version"])
    _set(root, "cuda_version", state["cuda_version"])
    _set(root, "attached_gpus", str(len(visible_gpus(state))))
    for _, gpu in targets:
        root.append(render_gpu(gpu_template, gpu, state))
    ElementTree.indent(root, space="    ")
    return "\n".join([*prologue, ElementTree.tostring(root, encoding="unicode"), ""])


def render_gpu(template: ElementTree.Element, gpu: State, state: State) -> ElementTree.Element:
    generation = state["smi_generation"]
    element = _clone(template)
    if generation == "r590":
        _reshape_for_r590(element)
    element.set("id", gpu["pci_bus_id"])

    def put(path: str, text: object) -> None:
        _set(element, path, "N/A" if text is None else str(text))

    put("product_name", gpu["name"])
    put("product_architecture", gpu["architecture"])
    put("persistence_mode", gpu["persistence_mode"])
    put("compute_mode", compute_mode_of(gpu))
    put("mig_mode/current_mig", gpu["mig_mode"]["current"])
    put("mig_mode/pending_mig", gpu["mig_mode"]["pending"])
    _replace(element, _mig_devices(template, gpu))
    put("serial", gpu["serial"])
    put("uuid", gpu["uuid"])
    put("minor_number", gpu["minor_number"])
    put("vbios_version", gpu["vbios_version"])
    if element.find("board_part_number") is not None:  # not in the v11 schema
        put("board_part_number", gpu["board_part_number"])
    put("gpu_part_number", gpu["gpu_part_number"])
    put("platformInfo/module_id" if generation == "r590" else "gpu_module_id", gpu["module_id"])
    put("inforom_version/img_version", gpu["inforom"]["img"])
    put("inforom_version/oem_object", gpu["inforom"]["oem"])
    put("inforom_version/ecc_object", gpu["inforom"]["ecc"])
    put("gsp_firmware_version", state["driver_version"])

    domain, bus, device = _bus_parts(gpu["pci_bus_id"])
    put("pci/pci_bus", bus)
    put("pci/pci_device", device)
    put("pci/pci_domain", domain[-4:])
    put("pci/pci_device_id", gpu["pci_device_id"])
    put("pci/pci_bus_id", gpu["pci_bus_id"])
    put("pci/pci_sub_system_id", gpu["pci_sub_system_id"])
    pcie = gpu["pcie"]
    link = "pci/pci_gpu_link_info"
    for name, value in (
        ("max_link_gen", pcie["gen_max"]),
        ("current_link_gen", pcie["gen_current"]),
        # Only in the v12 schema: the device's own view next to the negotiated one.
        ("device_current_link_gen", pcie["gen_current"]),
        ("max_device_link_gen", pcie["gen_max"]),
        ("max_host_link_gen", pcie["gen_max"]),
    ):
        if element.find(f"{link}/pcie_gen/{name}") is not None:
            put(f"{link}/pcie_gen/{name}", value)
    put(f"{link}/link_widths/max_link_width", f"{pcie['width_max']}x")
    put(f"{link}/link_widths/current_link_width", f"{pcie['width_current']}x")

    put("fan_speed", None if gpu["fan_speed"] is None else f"{gpu['fan_speed']} %")
    put("performance_state", gpu["performance_state"])
    reason = "clocks_throttle_reason" if generation == "r515" else "clocks_event_reason"
    for name, active in gpu["clocks_event_reasons"].items():
        put(f"{reason}s/{reason}_{name}", "Active" if active else "Not Active")

    memory = gpu["memory"]
    put("fb_memory_usage/total", f"{memory['total_mib']} MiB")
    put("fb_memory_usage/reserved", f"{memory['reserved_mib']} MiB")
    put("fb_memory_usage/used", f"{memory['used_mib']} MiB")
    free = memory["total_mib"] - memory["reserved_mib"] - memory["used_mib"]
    put("fb_memory_usage/free", f"{free} MiB")
    put("bar1_memory_usage/total", f"{gpu['bar1_total_mib']} MiB")
    put("bar1_memory_usage/used", "1 MiB")
    put("bar1_memory_usage/free", f"{gpu['bar1_total_mib'] - 1} MiB")
    mig_on = gpu["mig_mode"]["current"] == "Enabled"
    for counter in _find(element, "utilization"):
        counter.text = "N/A" if mig_on else "0 %"

    put("ecc_mode/current_ecc", gpu["ecc_mode"]["current"])
    put("ecc_mode/pending_ecc", gpu["ecc_mode"]["pending"])
    _replace(element, _ecc_errors(gpu["ecc_errors"], generation))
    _replace(element, _remapped_rows(gpu["remapped_rows"]))
    put("temperature/gpu_temp", f"{gpu['temperature']['gpu']} C")
    memory_temperature = gpu["temperature"]["memory"]
    put(
        "temperature/memory_temp", None if memory_temperature is None else f"{memory_temperature} C"
    )
    _replace(element, _power_readings(gpu, generation))

    for group, clocks in (("clocks", gpu["clocks"]), ("max_clocks", gpu["max_clocks"])):
        for name in ("graphics", "sm", "video"):
            put(f"{group}/{name}_clock", f"{clocks[name]} MHz")
        put(f"{group}/mem_clock", f"{clocks['memory']} MHz")
    put("max_customer_boost_clocks/graphics_clock", f"{gpu['max_clocks']['graphics']} MHz")
    for group in ("applications_clocks", "default_applications_clocks"):
        clocks = gpu[group]
        put(
            f"{group}/graphics_clock", DEPRECATED if clocks is None else f"{clocks['graphics']} MHz"
        )
        put(f"{group}/mem_clock", DEPRECATED if clocks is None else f"{clocks['memory']} MHz")
    _replace(element, _supported_clocks(gpu["supported_clocks"]))
    if gpu["fabric"] is not None:
        put("fabric/state", gpu["fabric"]["state"])
        put("fabric/status", gpu["fabric"]["status"])
    processes = _find(element, "processes")
    for process in list(processes):
        processes.remove(process)
    if processes.text is not None:
        processes.text = "\n" + " " * 8
    if generation == "r590":
        put("gpu_recovery_action", gpu.get("recovery_action", "None"))
    if gpu.get("lost"):
        # A GPU whose every NVML call answers GPU_IS_LOST: nvidia-smi prints that for each
        # value; the bus id stays (an attribute, from the PCI enumeration).
        for leaf in element.iter():
            if len(leaf) == 0 and (leaf.text or "").strip():
                leaf.text = "GPU is lost"
    return element


def _clone(element: ElementTree.Element) -> ElementTree.Element:
    """A deep copy of ``element`` (tag, attributes, text, tail, children): copy.deepcopy of a
    GPU's template walks it through copy's generic machinery, tens of milliseconds per GPU
    on every ``-q -x``."""
    clone = ElementTree.Element(element.tag, dict(element.attrib))
    clone.text, clone.tail = element.text, element.tail
    clone.extend([_clone(child) for child in element])
    return clone


def _find(parent: ElementTree.Element, path: str) -> ElementTree.Element:
    found = parent.find(path)
    if found is None:
        raise KeyError(f"nvidia-smi template has no <{path}> under <{parent.tag}>")
    return found


def _set(parent: ElementTree.Element, path: str, text: str) -> None:
    _find(parent, path).text = text


def _leaf(tag: str, text: str) -> ElementTree.Element:
    element = ElementTree.Element(tag)
    element.text = text
    return element


def _tree(tag: str, children: Mapping[str, str | ElementTree.Element]) -> ElementTree.Element:
    """``<tag>`` holding a leaf per (tag, text) item, or the item's element as it is."""
    element = ElementTree.Element(tag)
    for child_tag, content in children.items():
        if isinstance(content, str):
            content = _leaf(child_tag, content)
        element.append(content)
    return element


def _replace(
    gpu: ElementTree.Element, new: ElementTree.Element, old_tag: str | None = None
) -> None:
    """Put ``new`` where the child ``old_tag`` (default: same tag as ``new``) is."""
    old = _find(gpu, old_tag or new.tag)
    gpu[list(gpu).index(old)] = new


def _insert_after(gpu: ElementTree.Element, tag: str, *new: ElementTree.Element) -> None:
    position = list(gpu).index(_find(gpu, tag)) + 1
    for offset, element in enumerate(new):
        gpu.insert(position + offset, element)


def _mig_devices(template: ElementTree.Element, gpu: State) -> ElementTree.Element:
    """``None`` unless MIG is on and compute instances exist, then one entry per MIG device.

    A MIG device is a compute instance, listed by GPU instance id then compute instance id; the
    entry is shaped like the first one of the template (only the A100 capture has one).
    """
    element = ElementTree.Element("mig_devices")
    instances = gpu["gpu_instances"] if gpu["mig_mode"]["current"] == "Enabled" else []
    devices = [
        (instance, compute)
        for instance in sorted(instances, key=lambda i: i["id"])
        for compute in sorted(instance["compute_instances"], key=lambda c: c["id"])
    ]
    pattern = template.find("mig_devices/mig_device")
    if not devices or pattern is None:
        element.text = "\n" + " " * 12 + "None\n" + " " * 8
        return element
    for index, (instance, compute) in enumerate(devices):
        profile = _profile_by_id(gpu, instance["profile_id"])
        share = compute["size"] / profile["compute_slices"]
        entry = _clone(pattern)
        _set(entry, "index", str(index))
        _set(entry, "gpu_instance_id", str(instance["id"]))
        _set(entry, "compute_instance_id", str(compute["id"]))
        shared = "device_attributes/shared"
        _set(entry, f"{shared}/multiprocessor_count", str(int(profile["sm"] * share)))
        for tag, key in (
            ("copy_engine_count", "ce"),
            ("encoder_count", "enc"),
            ("decoder_count", "dec"),
            ("ofa_count", "ofa"),
            ("jpg_count", "jpeg"),
        ):
            _set(entry, f"{shared}/{tag}", str(profile[key]))
        _set(entry, "fb_memory_usage/total", f"{profile['memory_mib']} MiB")
        _set(entry, "fb_memory_usage/used", "0 MiB")
        _set(entry, "fb_memory_usage/free", f"{profile['memory_mib']} MiB")
        element.append(entry)
    return element


def _ecc_errors(errors: State, generation: str) -> ElementTree.Element:
    def counters(scope: str) -> dict[str, str]:
        counts = {name: str(value) for name, value in errors[scope].items()}
        if generation != "r590":
            return counts
        # Driver 590 splits uncorrectable SRAM errors by how they were caught.
        return {
            "sram_correctable": counts["sram_correctable"],
            "sram_uncorrectable_parity": "0",
            "sram_uncorrectable_secded": counts["sram_uncorrectable"],
            "dram_correctable": counts["dram_correctable"],
            "dram_uncorrectable": counts["dram_uncorrectable"],
        }

    element = ElementTree.Element("ecc_errors")
    for scope in ("volatile", "aggregate"):
        element.append(_tree(scope, counters(scope)))
    if generation == "r590":
        _find(element, "aggregate").append(_leaf("sram_threshold_exceeded", "No"))
        sources = dict.fromkeys(("sram_l2", "sram_sm", "sram_microcontroller", "sram_pcie"), "0")
        sources["sram_other"] = str(errors["aggregate"]["sram_uncorrectable"])
        element.append(_tree("aggregate_uncorrectable_sram_sources", sources))
    return element


def _remapped_rows(rows: State) -> ElementTree.Element:
    histogram = {
        "row_remapper_histogram_max": f"{rows['histogram_max']} bank(s)",
        **{
            f"row_remapper_histogram_{level}": "0 bank(s)"
            for level in ("high", "partial", "low", "none")
        },
    }
    return _tree(
        "remapped_rows",
        {
            "remapped_row_corr": str(rows["correctable"]),
            "remapped_row_unc": str(rows["uncorrectable"]),
            "remapped_row_pending": rows["pending"],
            "remapped_row_failure": rows["failure"],
            "row_remapper_histogram": _tree("row_remapper_histogram", histogram),
        },
    )


def _power_readings(gpu: State, generation: str) -> ElementTree.Element:
    power = gpu["power"]

    def watts(key: str) -> str:
        return f"{power[key]:.2f} W"

    state = {"power_state": gpu["performance_state"]}
    if generation == "r515":
        return _tree(
            "power_readings",
            {
                **state,
                "power_management": "Supported",
                "power_draw": watts("draw"),
                "power_limit": watts("limit"),
                "default_power_limit": watts("default_limit"),
                "enforced_power_limit": watts("limit"),
                "min_power_limit": watts("min_limit"),
                "max_power_limit": watts("max_limit"),
            },
        )
    draw = (
        {"average_power_draw": watts("draw"), "instant_power_draw": watts("draw")}
        if generation == "r590"
        else {"power_draw": watts("draw")}
    )
    limits = {
        "current_power_limit": watts("limit"),
        "requested_power_limit": watts("limit"),
        "default_power_limit": watts("default_limit"),
        "min_power_limit": watts("min_limit"),
        "max_power_limit": watts("max_limit"),
    }
    return _tree("gpu_power_readings", {**state, **draw, **limits})


def _supported_clocks(supported: list[State]) -> ElementTree.Element:
    element = ElementTree.Element("supported_clocks")
    for entry in supported:
        memory = ElementTree.SubElement(element, "supported_mem_clock")
        memory.append(_leaf("value", f"{entry['memory']} MHz"))
        for graphics in range(entry["graphics_max"], entry["graphics_min"] - 1, -15):
            memory.append(_leaf("supported_graphics_clock", f"{graphics} MHz"))
    return element


def _reshape_for_r590(gpu: ElementTree.Element) -> None:
    """Turn the driver 535 ``<gpu>`` template into the layout driver 590 prints.

    Additions and renames follow the ``-q`` section of the H100 590 capture; element names
    are those of v12 reports from later drivers. Static values are the capture's.
    """
    not_available = dict.fromkeys(("latest_timestamp", "latest_duration"), "N/A")
    _set(gpu, "display_mode", DEPRECATED)
    _insert_after(gpu, "display_mode", _leaf("display_attached", "Yes"))
    platform = dict.fromkeys(
        ("chassis_serial_number", "slot_number", "tray_index", "host_id", "peer_type"), "N/A"
    )
    # 590 reports the module id among the platform details, not on its own.
    _replace(
        gpu,
        _tree("platformInfo", {**platform, "module_id": "N/A", "gpu_fabric_guid": "N/A"}),
        old_tag="gpu_module_id",
    )
    _insert_after(gpu, "inforom_version", _tree("inforom_bbx_flush", not_available))
    _insert_after(gpu, "gpu_operation_mode", _leaf("c2c_mode", "Disabled"))
    _find(gpu, "gpu_virtualization_mode").append(_leaf("vgpu_heterogeneous_mode", "N/A"))
    # 590 prints no reset status; it reports a recovery action instead.
    _replace(gpu, _leaf("gpu_recovery_action", "None"), old_tag="gpu_reset_status")
    pci = _find(gpu, "pci")
    _insert_after(pci, "pci_domain", _leaf("pci_base_class", "3"), _leaf("pci_sub_class", "2"))
    counters = {
        f"clocks_event_reasons_counters_{name}": "0 us"
        for name in ("sw_power_cap", "sync_boost", "sw_therm_slowdown", "hw_therm_slowdown")
    }
    counters["clocks_event_reasons_counters_hw_power_brake"] = "0 us"
    _insert_after(
        gpu,
        "clocks_event_reasons",
        _tree("clocks_event_reasons_counters", counters),
        _leaf("sparse_operation_mode", "Disabled"),
    )
    _insert_after(
        gpu,
        "fbc_stats",
        _tree(
            "dram_encryption_mode",
            {"current_dram_encryption": "N/A", "pending_dram_encryption": "N/A"},
        ),
    )
    temperature = _find(gpu, "temperature")
    for old, new, value in (
        ("gpu_temp_tlimit", "gpu_temp_tlimit", "46 C"),
        ("gpu_temp_max_threshold", "gpu_temp_max_tlimit_threshold", "-8 C"),
        ("gpu_temp_slow_threshold", "gpu_temp_slow_tlimit_threshold", "-2 C"),
        ("gpu_temp_max_gpu_threshold", "gpu_temp_max_gpu_tlimit_threshold", "0 C"),
        ("gpu_temp_max_mem_threshold", "gpu_temp_max_mem_tlimit_threshold", "0 C"),
    ):
        _replace(temperature, _leaf(new, value), old_tag=old)
    _insert_after(
        gpu,
        "gpu_power_readings",
        _tree(
            "gpu_memory_power_readings", {"average_power_draw": "N/A", "instant_power_draw": "N/A"}
        ),
    )
    module = _find(gpu, "module_power_readings")
    _replace(module, _leaf("average_power_draw", "N/A"), old_tag="power_draw")
    _insert_after(module, "average_power_draw", _leaf("instant_power_draw", "N/A"))
    _insert_after(
        gpu,
        "module_power_readings",
        _leaf("power_smoothing", "N/A"),
        _tree(
            "power_profiles",
            {"power_profile_requested_profiles": "N/A", "power_profile_enforced_profiles": "N/A"},
        ),
    )
    gpu.remove(_find(gpu, "voltage"))
    health = dict.fromkeys(
        (
            "summary",
            "bandwidth",
            "route_recovery_in_progress",
            "route_unhealthy",
            "access_timeout_recovery",
            "incorrect_configuration",
        ),
        "N/A",
    )
    fabric = _find(gpu, "fabric")
    fabric.append(_leaf("cliqueId", "0"))
    fabric.append(_leaf("clusterUuid", "00000000-0000-0000-0000-000000000000"))
    fabric.append(_tree("health", health))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

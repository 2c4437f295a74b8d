"""Hardware state shared by the lab's vendor-tool doubles (node side, stdlib only).

Lab nodes are systemd containers without GPUs, InfiniBand HCAs or NVMe drives. The doubles of
``nvidia-smi``, ``ibstat`` and ``nvme`` answer from one JSON file, the node's simulated hardware,
and the settings commands write to it, so a deploy can converge settings and a test can inject
drift (``gpunode-lab-hw set ...``). Layout of the file: see ``profiles.initial_state``.

The file is ``/var/lib/gpunode-lab/hardware.json`` (env ``GPUNODE_LAB_HW_STATE`` overrides it);
the captured vendor outputs used as templates live in ``/usr/local/share/gpunode-lab``
(env ``GPUNODE_LAB_HW_SHARE``).

Writers take an exclusive ``flock`` on a side lock file for the whole read-modify-write and
replace the file atomically; readers need no lock because they only ever see a whole file.
This module also holds the state transitions that more than one double performs (GPU reset,
reboot), so ``nvidia-smi -r`` and ``gpunode-lab-hw reboot`` cannot drift apart.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STATE_ENV = "GPUNODE_LAB_HW_STATE"
SHARE_ENV = "GPUNODE_LAB_HW_SHARE"
DEFAULT_STATE_PATH = "/var/lib/gpunode-lab/hardware.json"
DEFAULT_SHARE_DIR = "/usr/local/share/gpunode-lab"

State = dict[str, Any]


def state_path() -> Path:
    return Path(os.environ.get(STATE_ENV) or DEFAULT_STATE_PATH)


def share_dir() -> Path:
    return Path(os.environ.get(SHARE_ENV) or DEFAULT_SHARE_DIR)


def load() -> State:
    with state_path().open(encoding="utf-8") as handle:
        state: State = json.load(handle)
    return state


def dumps(state: State) -> str:
    return json.dumps(state, indent=2) + "\n"


@contextlib.contextmanager
def mutate() -> Iterator[State]:
    """Yield the state for changing; it is written back only if the block ends without error."""
    path = state_path()
    with open(f"{path}.lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = load()
        yield state
        _write_atomically(path, dumps(state))


def _write_atomically(path: Path, text: str) -> None:
    # Imported here: only writers need it, and every query command's start-up would pay.
    import tempfile

    with tempfile.NamedTemporaryFile(
        "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", delete=False
    ) as temporary:
        temporary.write(text)
        temporary.flush()
        os.fsync(temporary.fileno())
    # mkstemp creates 0600; non-root users may run the query commands, as on a real node.
    os.chmod(temporary.name, 0o644)
    os.replace(temporary.name, path)


def reset_gpu(gpu: State) -> None:
    """What a GPU reset does: pending ECC/MIG modes take effect, volatile state is lost.

    MIG GPU and compute instances are volatile too: the driver keeps no MIG layout across a
    reset or reboot, so whoever wants one creates it again.
    """
    for mode in ("ecc_mode", "mig_mode"):
        gpu[mode]["current"] = gpu[mode]["pending"]
    gpu["gpu_instances"] = []
    for counter in gpu["ecc_errors"]["volatile"]:
        gpu["ecc_errors"]["volatile"][counter] = 0


# Written by the lab's stand-in NVIDIA kernel module packages (lab.standin.catalogue,
# INSTALLED_DRIVER_VERSION_PATH), beside the state file: the driver a reboot loads.
INSTALLED_DRIVER_VERSION_FILE = "installed-driver-version"


def reboot(state: State) -> None:
    """What a reboot does to every GPU: a reset, plus the settings the driver does not keep.

    Persistence mode, power limit, application clocks (nvidia-smi(1)) and MIG instances are
    not persistent across a reboot; a deploy has to apply them again at every boot. Where a
    stand-in driver package recorded its version, the reboot loads that driver
    (``driver_version``).
    """
    installed = state_path().parent / INSTALLED_DRIVER_VERSION_FILE
    with contextlib.suppress(OSError):
        version = installed.read_text(encoding="utf-8").strip()
        if version:
            state["driver_version"] = version
    for gpu in state["gpus"]:
        reset_gpu(gpu)
        gpu["compute_processes"] = []  # a reboot ends every process
        gpu["persistence_mode"] = "Disabled"
        gpu["power"]["limit"] = gpu["power"]["default_limit"]
        if gpu["applications_clocks"] is not None:
            gpu["applications_clocks"] = dict(gpu["default_applications_clocks"])

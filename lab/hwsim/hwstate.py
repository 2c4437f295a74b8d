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
import string
import time
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
    global _loaded_digest
    data = state_path().read_bytes()
    if os.environ.get(ANSWER_NAME_ENV):
        import hashlib  # only a query its wrapper may replay pays for it

        _loaded_digest = hashlib.md5(data).hexdigest()
    state: State = json.loads(data)
    return state


# --- replayed answers ---------------------------------------------------------------------
#
# A query's answer depends on the state, its arguments and the doubles' code alone (the clock
# aside, see ASCTIME_MARK), so the command wrappers (lab.hwsim.node_files) replay an answer
# given before for the same state with ``cat``, without a Python start-up that costs ten
# times the query: every no-op deploy and drift check asks the same questions of the same
# state. Answers live beside the state file, under ``answers/<code>-<md5 of the state>/``:
# a state written in any way (a test restoring a saved copy too) is another digest, and
# answers of other states are removed when one is kept. The wrapper exports the answer's
# name (the double and its arguments) and the code's digest; the double keeps its answer
# only when it read the state once, changed nothing, printed nothing on stderr, exited 0 and
# read no clock.

ANSWER_NAME_ENV = "GPUNODE_LAB_HW_ANSWER"
ANSWER_CODE_ENV = "GPUNODE_LAB_HW_CODE"
ANSWERS_DIR = "answers"
# Stands for time.asctime() in a kept answer; the wrapper puts the time of the replay there.
ASCTIME_MARK = "@@gpunode-lab-asctime@@"
ASCTIME_SUFFIX = ".asctime"
# The characters a wrapper lets into an answer's name (a file name): no "/", no "..".
_NAME_CHARACTERS = frozenset(string.ascii_letters + string.digits + ".,=_+-")
_CODE_CHARACTERS = frozenset(string.hexdigits.lower())

_loaded_digest: str | None = None
_mutated = False
_clock_read = False
_asctime_marked = False


def asctime() -> str:
    """time.asctime(), or its mark in an answer that may be kept."""
    global _asctime_marked
    if os.environ.get(ANSWER_NAME_ENV):
        _asctime_marked = True
        return ASCTIME_MARK
    return time.asctime()


def clock_read() -> None:
    """The answer holds a reading of the clock other than asctime(): it is not kept."""
    global _clock_read
    _clock_read = True


def answered(output: str) -> str:
    """What to print for a successful answer ``output``; it is kept for replay if it may be."""
    if _asctime_marked:
        with contextlib.suppress(OSError):
            _keep(output, ASCTIME_SUFFIX)
        return output.replace(ASCTIME_MARK, time.asctime())
    with contextlib.suppress(OSError):
        _keep(output, "")
    return output


def _keep(output: str, suffix: str) -> None:
    name = os.environ.get(ANSWER_NAME_ENV) or ""
    code = os.environ.get(ANSWER_CODE_ENV) or ""
    if _mutated or _clock_read or _loaded_digest is None:
        return
    if not (0 < len(name) <= 200 and set(name) <= _NAME_CHARACTERS and ".." not in name):
        return
    if not (8 <= len(code) <= 64 and set(code) <= _CODE_CHARACTERS):
        return
    answers = state_path().parent / ANSWERS_DIR
    here = f"{code}-{_loaded_digest}"
    directory = answers / here
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    _write_atomically(directory / f"{name}{suffix}", output)
    for other in answers.iterdir():
        if other.name != here:
            import shutil

            shutil.rmtree(other, ignore_errors=True)


def dumps(state: State) -> str:
    return json.dumps(state, indent=2) + "\n"


@contextlib.contextmanager
def mutate() -> Iterator[State]:
    """Yield the state for changing; it is written back only if the block ends without error."""
    global _mutated
    _mutated = True
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
    """What a GPU reset does: pending ECC/MIG modes take effect, volatile state (volatile ECC
    counts, NVLink error counters) is lost, a pending row remap is done and a recovery action
    asking for a reset is answered.

    MIG GPU and compute instances are volatile too: the driver keeps no MIG layout across a
    reset or reboot, so whoever wants one creates it again.
    """
    for mode in ("ecc_mode", "mig_mode"):
        gpu[mode]["current"] = gpu[mode]["pending"]
    gpu["gpu_instances"] = []
    for counter in gpu["ecc_errors"]["volatile"]:
        gpu["ecc_errors"]["volatile"][counter] = 0
    for link in gpu.get("nvlinks") or []:  # NVLink error counters count since the last reset
        for counter in link.get("errors") or {}:
            link["errors"][counter] = 0
    # A reset is what a recovery action of "Reset" asks for; once done the driver asks for
    # nothing (a fault that stays is set again by the test).
    if gpu.get("recovery_action") in ("Reset", "GPU Reset"):
        gpu["recovery_action"] = "None"
    # Pending row remaps and page retirements take effect at the reset.
    rows = gpu.get("remapped_rows")
    if isinstance(rows, dict) and rows.get("pending") == "Yes":
        rows["pending"] = "No"


# Written by the lab's stand-in NVIDIA kernel module packages (lab.standin.catalogue,
# INSTALLED_DRIVER_VERSION_PATH), beside the state file: the driver a reboot loads.
INSTALLED_DRIVER_VERSION_FILE = "installed-driver-version"
# And the CUDA version that driver reports (the highest its release supports).
INSTALLED_DRIVER_CUDA_VERSION_FILE = "installed-driver-cuda-version"


def reboot(state: State) -> None:
    """What a reboot does to every GPU: a reset, plus the settings the driver does not keep.

    Persistence mode, power limit, application clocks (nvidia-smi(1)) and MIG instances are
    not persistent across a reboot; a deploy has to apply them again at every boot. Where a
    stand-in driver package recorded its version, the reboot loads that driver
    (``driver_version``) and reports its CUDA version (``cuda_version``).
    """
    directory = state_path().parent
    with contextlib.suppress(OSError):
        version = (directory / INSTALLED_DRIVER_VERSION_FILE).read_text(encoding="utf-8").strip()
        if version:
            state["driver_version"] = version
    with contextlib.suppress(OSError):
        cuda = (directory / INSTALLED_DRIVER_CUDA_VERSION_FILE).read_text(encoding="utf-8")
        if cuda.strip():
            state["cuda_version"] = cuda.strip()
    for gpu in state["gpus"]:
        reset_gpu(gpu)
        gpu["compute_processes"] = []  # a reboot ends every process
        # A lost GPU comes back at a reboot and the driver asks for no recovery (the remedy
        # NVIDIA gives both; one whose fault stays is set lost again by the test).
        if "lost" in gpu:
            gpu["lost"] = False
        if "recovery_action" in gpu:
            gpu["recovery_action"] = "None"
        gpu["persistence_mode"] = "Disabled"
        gpu["compute_mode"] = "Default"  # the driver keeps no compute mode across a reboot
        gpu["power"]["limit"] = gpu["power"]["default_limit"]
        if gpu["applications_clocks"] is not None:
            gpu["applications_clocks"] = dict(gpu["default_applications_clocks"])

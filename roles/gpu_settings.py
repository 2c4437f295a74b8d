"""GPU settings applied with nvidia-smi, idempotently from the GpuDevices fact.

ECC and MIG changes only take effect after a GPU reset or reboot: once requested they show
as *pending* and are reported as such, never requested again on every run.
"""

from __future__ import annotations

from typing import Any

from pyinfra import host
from pyinfra.api import OperationError, deploy, operation

from facts.gpu import GpuDevices
from gpunode.model import DesiredState


def _gpus_or_noop() -> list[dict[str, Any]] | None:
    report = host.get_fact(GpuDevices)
    if report["state"] != "ok":
        host.noop(f"GPU settings skipped: {report['reason']}")
        return None
    return list(report["gpus"])


def _indexes(gpus: list[dict[str, Any]]) -> str:
    return ",".join(str(gpu["index"]) for gpu in gpus)


def _mode(enabled: bool) -> str:
    return "Enabled" if enabled else "Disabled"


@operation()
def persistence_mode(enabled: bool = True):
    """Every GPU has persistence mode ``enabled`` (takes effect at once)."""
    gpus = _gpus_or_noop()
    if gpus is None:
        return
    wrong = [gpu for gpu in gpus if gpu["persistence_mode"] != _mode(enabled)]
    if not wrong:
        host.noop(f"persistence mode {_mode(enabled)} on all {len(gpus)} GPUs")
        return
    yield f"nvidia-smi -i {_indexes(wrong)} -pm {int(enabled)}"


@operation()
def pending_mode(setting: str, enabled: bool):
    """Every GPU has ECC or MIG mode (``setting`` 'ecc' or 'mig') ``enabled``, now or pending.

    A GPU whose pending mode already matches is reported as waiting for a reset.
    """
    gpus = _gpus_or_noop()
    if gpus is None:
        return
    flag = {"ecc": "-e", "mig": "-mig"}[setting]
    want = _mode(enabled)
    supported = [gpu for gpu in gpus if gpu[f"{setting}_current"] in ("Enabled", "Disabled")]
    to_request = [gpu for gpu in supported if gpu[f"{setting}_pending"] != want]
    awaiting_reset = [
        gpu
        for gpu in supported
        if gpu[f"{setting}_pending"] == want and gpu[f"{setting}_current"] != want
    ]
    if awaiting_reset:
        host.noop(
            f"{setting.upper()} {want} pending a GPU reset or reboot on GPUs "
            f"{_indexes(awaiting_reset)}"
        )
    if to_request:
        yield f"nvidia-smi -i {_indexes(to_request)} {flag} {int(enabled)}"
    elif not awaiting_reset:
        host.noop(f"{setting.upper()} {want} on all {len(supported)} GPUs that support it")


@operation()
def power_limit(watts: int):
    """Every GPU's power limit is ``watts``; a value outside a GPU's range is an error."""
    gpus = _gpus_or_noop()
    if gpus is None:
        return
    for gpu in gpus:
        low, high = gpu["power_min_w"], gpu["power_max_w"]
        if low is not None and high is not None and not low <= watts <= high:
            raise OperationError(
                f"gpu_settings.power_limit_w = {watts}: GPU {gpu['index']} ({gpu['name']}) "
                f"accepts {low:g} to {high:g} W"
            )
    wrong = [gpu for gpu in gpus if gpu["power_limit_w"] != watts]
    if not wrong:
        host.noop(f"power limit {watts} W on all {len(gpus)} GPUs")
        return
    yield f"nvidia-smi -i {_indexes(wrong)} -pl {watts}"


@deploy("GPU settings")
def gpu_settings(desired: DesiredState) -> None:
    wanted = desired.gpu_settings
    if wanted.persistence_mode is not None:
        persistence_mode(name="GPU persistence mode", enabled=wanted.persistence_mode)
    if wanted.ecc is not None:
        pending_mode(name="GPU ECC mode", setting="ecc", enabled=wanted.ecc)
    if wanted.mig is not None:
        pending_mode(name="GPU MIG mode", setting="mig", enabled=wanted.mig)
    if wanted.power_limit_w is not None:
        power_limit(name="GPU power limit", watts=wanted.power_limit_w)

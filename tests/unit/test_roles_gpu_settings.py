"""GPU settings operations: GpuDevices fact in, nvidia-smi commands or no-op notes out."""

from __future__ import annotations

from typing import Any

import pytest
from pyinfra.api import OperationError

from facts.gpu import GpuDevices
from roles.gpu_settings import pending_mode, persistence_mode, power_limit

from .fakehost import commands_of


def gpu(index: int, **settings: Any) -> dict[str, Any]:
    base = {
        "index": index,
        "name": "NVIDIA H100 80GB HBM3",
        "persistence_mode": "Disabled",
        "ecc_current": "Enabled",
        "ecc_pending": "Enabled",
        "mig_current": "Disabled",
        "mig_pending": "Disabled",
        "power_limit_w": 700.0,
        "power_min_w": 200.0,
        "power_max_w": 700.0,
    }
    return base | settings


def facts(*gpus: dict[str, Any]) -> dict[type, Any]:
    return {GpuDevices: {"state": "ok", "reason": "", "gpus": list(gpus)}}


def test_persistence_set_only_on_gpus_that_lack_it() -> None:
    commands, _ = commands_of(
        persistence_mode, facts(gpu(0), gpu(1, persistence_mode="Enabled"), gpu(2)), enabled=True
    )
    assert commands == ["nvidia-smi -i 0,2 -pm 1"]


def test_persistence_noop_when_all_enabled() -> None:
    commands, noops = commands_of(
        persistence_mode, facts(gpu(0, persistence_mode="Enabled")), enabled=True
    )
    assert commands == []
    assert noops == ["persistence mode Enabled on all 1 GPUs"]


@pytest.mark.parametrize(
    ("state", "reason"),
    [("absent", "nvidia-smi is not installed"), ("unreadable", "NVIDIA driver is not loaded")],
)
def test_no_readable_gpus_is_a_reported_noop(state: str, reason: str) -> None:
    commands, noops = commands_of(
        persistence_mode, {GpuDevices: {"state": state, "reason": reason, "gpus": []}}
    )
    assert commands == []
    assert noops == [f"GPU settings skipped: {reason}"]


def test_ecc_change_is_requested_once_then_reported_pending() -> None:
    commands, _ = commands_of(pending_mode, facts(gpu(0), gpu(1)), setting="ecc", enabled=False)
    assert commands == ["nvidia-smi -i 0,1 -e 0"]
    # After the request the driver shows it pending: no second request, a clear note instead.
    commands, noops = commands_of(
        pending_mode, facts(gpu(0, ecc_pending="Disabled")), setting="ecc", enabled=False
    )
    assert commands == []
    assert noops == ["ECC Disabled pending a GPU reset or reboot on GPUs 0"]


def test_mig_skips_gpus_that_do_not_support_it() -> None:
    commands, noops = commands_of(
        pending_mode,
        facts(gpu(0, mig_current="N/A", mig_pending="N/A")),
        setting="mig",
        enabled=True,
    )
    assert commands == []
    assert noops == ["MIG Enabled on all 0 GPUs that support it"]


def test_power_limit_applied_where_different() -> None:
    commands, _ = commands_of(power_limit, facts(gpu(0), gpu(1, power_limit_w=500.0)), watts=500)
    assert commands == ["nvidia-smi -i 0 -pl 500"]


def test_power_limit_outside_range_is_an_error_naming_gpu_and_range() -> None:
    expected = r"GPU 0 \(NVIDIA H100 80GB HBM3\) accepts 200 to 700 W"
    with pytest.raises(OperationError, match=expected):
        commands_of(power_limit, facts(gpu(0)), watts=900)

"""IMEX (GB200/GB300 NVL72) and nvlsm: what the model says is needed, and the role's commands."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from facts.nvidia_packages import NvidiaPackages
from gpunode.model import build_desired_state
from roles.imex import (
    CHANNELS_SCRIPT,
    CHANNELS_SERVICE,
    IMEX_SERVICE,
    imex_package,
    imex_services,
    render_channels_unit,
    render_nodes_config,
)
from roles.nvidia_driver import APT_INSTALL

from .fakehost import commands_of

GB200 = {
    "nvidia_driver": {"source": "nvidia", "branch": "580", "version": "580.95.05-1"},
    "expected_hardware": {"gpu_model": "NVIDIA GB200", "nvswitch": True},
    "imex": {"nodes": ["10.0.0.1", "10.0.0.2"]},
}


def state(data: dict[str, Any]) -> Any:
    desired, problems = build_desired_state(data)
    assert problems == []
    return desired


@pytest.mark.parametrize(
    ("model", "nvswitch", "imex", "nvlsm"),
    [
        ("NVIDIA GB200", True, True, True),
        ("NVIDIA GB300", True, True, True),
        ("NVIDIA B200", True, False, True),  # HGX B200: NVSwitch, single node
        ("NVIDIA H100 80GB HBM3", True, False, False),  # Hopper: Fabric Manager alone
        ("NVIDIA B200", False, False, False),
    ],
)
def test_what_the_expected_hardware_needs(
    model: str, nvswitch: bool, imex: bool, nvlsm: bool
) -> None:
    data = {**GB200, "expected_hardware": {"gpu_model": model, "nvswitch": nvswitch}}
    desired = state(data)
    assert (desired.needs_imex, desired.needs_nvlsm) == (imex, nvlsm)


def test_imex_without_its_domain_or_nvidias_driver_is_refused() -> None:
    _, problems = build_desired_state({**GB200, "imex": {}})
    assert [problem.key for problem in problems] == ["imex.nodes"]
    debian = {**GB200, "nvidia_driver": {"source": "debian"}}
    _, problems = build_desired_state(debian)
    assert "imex.mode" in [problem.key for problem in problems]
    _, problems = build_desired_state({**GB200, "imex": {"nodes": ["10.0.0.1; reboot"]}})
    assert "imex.nodes[0]" in [problem.key for problem in problems]


def node(installed: dict[str, str], held: tuple[str, ...] = (), loaded: str | None = None):
    return {
        "packages": {"nvidia-kernel-open-dkms": "580.95.05-1", **installed},
        "held": sorted(held),
        "loaded_module": {"version": loaded, "flavour": "open", "source": "procfs"}
        if loaded
        else None,
        "installed_module": {"version": "580.95.05", "flavour": "open", "source": "modinfo"},
    }


def test_imex_is_installed_at_the_driver_version_and_held() -> None:
    commands, _ = commands_of(
        imex_package, {NvidiaPackages: node({})}, branch="580", version="580.95.05-1"
    )
    assert commands == [f"{APT_INSTALL} nvidia-imex=580.95.05-1", "apt-mark hold nvidia-imex"]
    installed = {"nvidia-imex": "580.95.05-1"}
    commands, noops = commands_of(
        imex_package,
        {NvidiaPackages: node(installed, held=("nvidia-imex",))},
        branch="580",
        version="580.95.05-1",
    )
    assert commands == [] and noops == ["nvidia-imex 580.95.05-1 installed and held"]
    commands, _ = commands_of(
        imex_package, {NvidiaPackages: node({})}, branch="570", version="570.195.03-1"
    )
    assert commands[0].endswith("nvidia-imex-570=570.195.03-1")


def services(facts: dict[str, Any], enabled: bool, running: bool, **kwargs: Any):
    units = (CHANNELS_SERVICE, IMEX_SERVICE)
    return commands_of(
        imex_services,
        {
            NvidiaPackages: facts,
            SystemdEnabled: dict.fromkeys(units, enabled),
            SystemdStatus: dict.fromkeys(units, running),
        },
        branch="580",
        **kwargs,
    )


def test_services_start_with_their_driver_and_wait_for_a_reboot_otherwise() -> None:
    installed = {"nvidia-imex": "580.95.05-1"}
    commands, _ = services(node(installed, loaded="580.95.05"), enabled=False, running=False)
    assert commands == [
        f"systemctl enable {CHANNELS_SERVICE} {IMEX_SERVICE}",
        f"systemctl start {CHANNELS_SERVICE} {IMEX_SERVICE}",
    ]
    commands, noops = services(node(installed, loaded="570.195.03"), enabled=True, running=False)
    assert commands == []
    assert noops == ["nvidia-imex not started: pending a reboot into driver 580.95.05 "
                     "(loaded: 570.195.03)"]  # fmt: skip
    commands, noops = services(node(installed, loaded="580.95.05"), enabled=True, running=True)
    assert commands == [] and noops == ["IMEX channels created and nvidia-imex running"]
    commands, _ = services(
        node(installed, loaded="580.95.05"), enabled=True, running=True, daemon_reload=True
    )
    assert commands == ["systemctl daemon-reload"]


def test_channel_unit_and_nodes_file() -> None:
    unit = render_channels_unit(4)
    assert "ExecStart=/usr/local/sbin/gpunode-imex-channels 4\n" in unit
    assert f"Before={IMEX_SERVICE}\n" in unit and "RemainAfterExit=yes\n" in unit
    assert render_nodes_config(("10.0.0.1", "10.0.0.2")) == "10.0.0.1\n10.0.0.2\n"


def test_channel_script_is_valid_sh_and_refuses_without_the_driver() -> None:
    assert subprocess.run(["sh", "-n"], input=CHANNELS_SCRIPT, text=True).returncode == 0
    # This machine's /proc/devices has no nvidia-caps-imex-channels: a clear error, no mknod.
    result = subprocess.run(
        ["sh", "-s", "2"], input=CHANNELS_SCRIPT, text=True, capture_output=True
    )
    assert result.returncode == 1
    assert "nvidia-caps-imex-channels is not in /proc/devices" in result.stderr

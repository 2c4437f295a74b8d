"""DCGM role: package and service facts in, apt and systemctl commands (or no-ops) out."""

from __future__ import annotations

from typing import Any

import pytest
from pyinfra.api import DeployError
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from facts.container_runtime import AptPackagePolicy, DpkgPackageState
from roles.cuda import held_packages, require_offered
from roles.dcgm import DCGM_PACKAGE, EXPORTER_PACKAGE, service_enabled_and_running

from .fakehost import commands_of, dpkg_of, fake_host

CUDA_URL = "http://mirror.example:8089/cuda/debian12/x86_64"
UNIT = "nvidia-dcgm.service"


def systemd(running: bool | None, enabled: bool | None) -> dict[type, Any]:
    """Fact values as pyinfra reports them; None: systemd does not know the unit (yet)."""
    return {
        SystemdStatus: {} if running is None else {UNIT: running},
        SystemdEnabled: {} if enabled is None else {UNIT: enabled},
    }


@pytest.mark.parametrize(
    ("running", "enabled", "expected"),
    [
        (None, None, [f"systemctl enable {UNIT}", f"systemctl start {UNIT}"]),  # fresh install
        (False, False, [f"systemctl enable {UNIT}", f"systemctl start {UNIT}"]),
        (True, False, [f"systemctl enable {UNIT}"]),
        (False, True, [f"systemctl start {UNIT}"]),
    ],
)
def test_dcgm_service_enabled_and_started(
    running: bool | None, enabled: bool | None, expected: list[str]
) -> None:
    commands, _ = commands_of(
        service_enabled_and_running, systemd(running, enabled), service="nvidia-dcgm"
    )
    assert commands == expected


def test_dcgm_service_noop() -> None:
    commands, noops = commands_of(
        service_enabled_and_running, systemd(True, True), service="nvidia-dcgm"
    )
    assert commands == []
    assert noops == [f"{UNIT} is enabled and running"]


def dcgm_policy(indexed: bool = True, installed: str | None = None) -> dict[type, Any]:
    versions = [{"version": v, "urls": [CUDA_URL]} for v in ("1:3.3.9", "1:3.3.8")]
    return {
        AptPackagePolicy: {
            "indexed_urls": [CUDA_URL] if indexed else [],
            "packages": {
                DCGM_PACKAGE: {
                    "installed": installed,
                    "held": installed is not None,
                    "candidate": "1:3.3.9",
                    "versions": versions,
                }
            },
        },
        DpkgPackageState: dpkg_of(
            {DCGM_PACKAGE: {"installed": installed, "held": installed is not None}}
        ),
    }


def test_dcgm_pinned_version_is_installed_and_held() -> None:
    commands, _ = commands_of(
        held_packages,
        dcgm_policy(),
        packages=[DCGM_PACKAGE],
        repository_url=CUDA_URL,
        version="1:3.3.8",
    )
    assert commands[0].endswith(
        "--no-install-recommends --allow-downgrades --allow-change-held-packages "
        "datacenter-gpu-manager=1:3.3.8"
    )
    assert commands[1] == "apt-mark hold datacenter-gpu-manager"


def test_dcgm_at_its_pin_is_a_noop() -> None:
    commands, noops = commands_of(
        held_packages,
        dcgm_policy(installed="1:3.3.8"),
        packages=[DCGM_PACKAGE],
        repository_url=CUDA_URL,
        version="1:3.3.8",
    )
    assert commands == []
    assert noops == ["datacenter-gpu-manager 1:3.3.8 installed and held"]


def test_missing_exporter_is_refused_before_anything_changes() -> None:
    with fake_host(dcgm_policy()), pytest.raises(DeployError) as error:
        require_offered([EXPORTER_PACKAGE], CUDA_URL)
    assert f"dcgm-exporter is not offered by {CUDA_URL}" in str(error.value)
    assert "Nothing was changed" in str(error.value)


def test_offered_packages_pass_the_check() -> None:
    with fake_host(dcgm_policy()) as host:
        require_offered([DCGM_PACKAGE], CUDA_URL, version="1:3.3.8")
        require_offered([DCGM_PACKAGE], CUDA_URL)
    assert host.noops == []


def test_pin_the_mirror_lacks_is_refused_unless_already_installed() -> None:
    with fake_host(dcgm_policy()), pytest.raises(DeployError, match=r"1:4\.0\.0 is not offered"):
        require_offered([DCGM_PACKAGE], CUDA_URL, version="1:4.0.0")
    with fake_host(dcgm_policy(installed="1:4.0.0")):
        require_offered([DCGM_PACKAGE], CUDA_URL, version="1:4.0.0")


def test_exporter_of_an_unindexed_repository_is_checked_on_the_node() -> None:
    with fake_host(dcgm_policy(indexed=False)):
        require_offered([EXPORTER_PACKAGE], CUDA_URL)  # cannot know yet: no refusal
    commands, _ = commands_of(
        held_packages,
        dcgm_policy(indexed=False),
        packages=[EXPORTER_PACKAGE],
        repository_url=CUDA_URL,
    )
    assert f"gpunode: dcgm-exporter is not offered by {CUDA_URL}" in commands[0]
    assert "exit 1" in commands[0]

"""DCGM role: package and service facts in, apt and systemctl commands (or no-ops) out."""

from __future__ import annotations

from typing import Any

import pytest
from pyinfra.api import DeployError
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from facts.container_runtime import AptPackagePolicy, DpkgPackageState
from facts.nvidia_packages import NvidiaPackages
from gpunode.expected.packages import DCGM3_PACKAGE as DCGM_PACKAGE
from gpunode.expected.packages import DCGM_EXPORTER_PACKAGE as EXPORTER_PACKAGE
from gpunode.expected.packages import dcgm_packages
from gpunode.model import build_desired_state
from roles.cuda import held_packages, require_offered
from roles.dcgm import (
    EXPORTER_WEB_CONFIG_PATH,
    dcgm3_replaced,
    other_cuda_parts_removed,
    render_exporter_drop_in,
    render_exporter_web_config,
    service_enabled_and_running,
)
from roles.node_exporter import render_web_config as node_exporter_web_config

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
    assert f"datacenter-gpu-manager-exporter is not offered by {CUDA_URL}" in str(error.value)
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
    assert f"gpunode: datacenter-gpu-manager-exporter is not offered by {CUDA_URL}" in commands[0]
    assert "exit 1" in commands[0]


# --- DCGM 4 -----------------------------------------------------------------------------------


def test_dcgm4_is_its_core_and_the_part_for_the_cuda_major() -> None:
    assert dcgm_packages(4, 13) == (
        "datacenter-gpu-manager-4-core",
        "datacenter-gpu-manager-4-cuda13",
    )
    assert dcgm_packages(4, 12)[1] == "datacenter-gpu-manager-4-cuda12"
    assert dcgm_packages(3, 12) == ("datacenter-gpu-manager",)


@pytest.mark.parametrize(
    ("data", "cuda_major"),
    [
        ({"nvidia_driver": {"source": "nvidia", "branch": "580"}}, 13),
        ({"nvidia_driver": {"source": "nvidia", "branch": "570"}}, 12),
        ({"nvidia_driver": {"source": "nvidia", "branch": "630"}}, 13),  # not in the table yet
        ({"nvidia_driver": {"source": "debian"}, "cuda": {"versions": ["12.4"]}}, 12),
        ({"nvidia_driver": {"source": "nvidia", "branch": "580"}, "dcgm": {"cuda_major": 12}}, 12),
    ],
)
def test_the_cuda_major_of_dcgm4_follows_the_driver_then_the_toolkits(
    data: dict[str, Any], cuda_major: int
) -> None:
    state, problems = build_desired_state(data)
    assert problems == []
    assert state.dcgm_cuda_major == cuda_major


def test_dcgm4_without_any_cuda_major_is_refused_naming_the_key() -> None:
    _, problems = build_desired_state({"dcgm": {"enabled": True}})
    assert [problem.key for problem in problems] == ["dcgm.cuda_major"]


@pytest.mark.parametrize(
    ("dcgm", "key", "reason"),
    [
        ({"version": "1:3.3.9", "major": 4}, "dcgm.version", "not a DCGM 4 release"),
        ({"version": "1:3.3.9", "exporter": True}, "dcgm.exporter", "with DCGM 4 only"),
        ({"exporter_version": "4.9.0-1"}, "dcgm.exporter_version", "exporter is false"),
        ({"exporter": True, "tls": False}, "dcgm.exporter", "TLS with the node certificate"),
        (
            {"version": "1:4.6.0-1", "exporter": True, "exporter_version": "4.9.0-1"},
            "dcgm.exporter_version",
            "DCGM Exporter 4.9.0 is paired with DCGM 4.7.0, 4.7.1, not 4.6.0",
        ),
    ],
)
def test_dcgm_data_that_cannot_be_installed_as_asked_is_refused(
    dcgm: dict[str, Any], key: str, reason: str
) -> None:
    tls = dcgm.pop("tls", True)
    data = {
        "nvidia_driver": {"source": "nvidia", "branch": "580"},
        "tls": {"enabled": tls},
        "dcgm": {"enabled": True, **dcgm},
    }
    _, problems = build_desired_state(data)
    assert [(problem.key, reason in problem.reason) for problem in problems] == [(key, True)]


def test_dcgm3_by_its_version_and_a_known_exporter_pair_are_accepted() -> None:
    _, problems = build_desired_state(
        {
            "nvidia_driver": {"source": "nvidia", "branch": "580"},
            "dcgm": {"enabled": True, "version": "1:3.3.9"},
        }
    )
    assert problems == []
    state, problems = build_desired_state(
        {
            "nvidia_driver": {"source": "nvidia", "branch": "580"},
            "tls": {"enabled": True},
            "dcgm": {
                "enabled": True, "version": "1:4.7.0-1", "exporter": True,
                "exporter_version": "4.9.0-1",
            },
        }
    )  # fmt: skip
    assert problems == []
    assert state.dcgm.release_major == 4


def test_dcgm3_is_removed_with_its_hold_before_dcgm4_arrives() -> None:
    facts = {DpkgPackageState: dpkg_of({DCGM_PACKAGE: {"installed": "1:3.3.9", "held": True}})}
    commands, _ = commands_of(dcgm3_replaced, facts, packages=list(dcgm_packages(4, 13)))
    assert commands[0] == "apt-mark unhold datacenter-gpu-manager"
    assert commands[1].endswith("apt-get remove -y -q --allow-change-held-packages "
                                "datacenter-gpu-manager")  # fmt: skip


def test_no_dcgm3_means_nothing_to_replace() -> None:
    facts = {DpkgPackageState: dpkg_of({DCGM_PACKAGE: {"installed": None, "held": False}})}
    commands, noops = commands_of(dcgm3_replaced, facts, packages=list(dcgm_packages(4, 13)))
    assert commands == []
    assert noops == ["datacenter-gpu-manager (DCGM 3) is not installed"]


def test_the_exporter_gets_node_exporters_tls_settings_with_the_node_key_itself() -> None:
    web = render_exporter_web_config()
    # The same settings, line for line, but for the header and the key: the packaged unit
    # runs the exporter as root (lab/standin/catalogue.py EXPORTER_UNIT), which reads node.key.
    node = node_exporter_web_config()
    differing = set(web.splitlines()) ^ set(node.splitlines())
    assert {line for line in differing if not line.startswith("#")} == {
        "  key_file: /etc/gpunode/tls/node.key",
        "  key_file: /etc/gpunode/node-exporter/node.key",
    }
    assert "  min_version: TLS13\n  max_version: TLS13\n" in web
    assert "  client_auth_type: RequireAndVerifyClientCert\n" in web


def test_the_drop_in_replaces_the_packaged_command_with_the_web_configuration() -> None:
    lines = render_exporter_drop_in().splitlines()
    start = lines.index("[Service]")
    assert lines[start + 1 :] == [
        "ExecStart=",
        "ExecStart=/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/default-counters.csv "
        f"--address=:9400 --web-config-file={EXPORTER_WEB_CONFIG_PATH}",
    ]


def test_the_part_for_the_old_cuda_major_goes_before_the_new_one_comes() -> None:
    """12 -> 13: DCGM's cuda12 part, held at its version, would stop the next DCGM upgrade
    (it needs the core at exactly its own); it goes, its hold lifted; the core stays."""
    packages = list(dcgm_packages(4, 13))
    installed = {
        "datacenter-gpu-manager-4-core": "1:4.6.0-1",
        "datacenter-gpu-manager-4-cuda12": "1:4.6.0-1",
        "datacenter-gpu-manager-exporter": "4.8.3-1",
    }
    facts = {"packages": installed, "held": sorted(installed)}
    commands, _ = commands_of(other_cuda_parts_removed, {NvidiaPackages: facts}, packages=packages)
    assert commands == [
        "apt-mark unhold datacenter-gpu-manager-4-cuda12",
        "DEBIAN_FRONTEND=noninteractive apt-get remove -y -q --allow-change-held-packages "
        "datacenter-gpu-manager-4-cuda12",
    ]
    # The node's own part installed: nothing to remove.
    facts = {"packages": {**installed, "datacenter-gpu-manager-4-cuda13": "1:4.6.0-1"}, "held": []}
    del facts["packages"]["datacenter-gpu-manager-4-cuda12"]
    commands, noops = commands_of(
        other_cuda_parts_removed, {NvidiaPackages: facts}, packages=packages
    )
    assert commands == []
    assert noops == ["no DCGM part for another CUDA major is installed"]

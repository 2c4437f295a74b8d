"""MPS: the model's section, the daemon's unit, compute mode in the GPU settings role, the
MPS role's decisions, the fact's parser and the drift rule.

The control daemon itself is NVIDIA's binary, in no stand-in repository: these tests check
the unit gpunode writes and the commands it runs, never a running MPS server.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from pyinfra.facts.files import File
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from facts.gpu import GpuDevices
from facts.mps import COMPUTE_MODES_COMMAND, MpsState, parse_compute_modes, parse_mps
from gpunode import framing
from gpunode.drift.rules import evaluate
from gpunode.expected import mps as expected
from gpunode.model import (
    MPS_DEFAULT_LOG_DIRECTORY,
    MPS_DEFAULT_PIPE_DIRECTORY,
    DesiredState,
    build_desired_state,
)
from gpunode.refusal import NodeRefused
from roles import mps as mps_role
from roles.gpu_settings import BOOT_SCRIPT_TEXT, exclusive_process, render_boot_settings

from .fakehost import commands_of, fake_host

DRIVER = {"nvidia_driver": {"source": "debian"}}


def state(data: dict[str, Any]) -> DesiredState:
    desired, problems = build_desired_state({**DRIVER, **data})
    assert problems == [], [p.render("inv", "h") for p in problems]
    return desired


def problems_of(data: dict[str, Any]) -> dict[str, str]:
    _, problems = build_desired_state({**DRIVER, **data})
    return {problem.key: problem.reason for problem in problems}


# --- the model ------------------------------------------------------------------------------


def test_the_directories_default_to_nvidias_documented_ones() -> None:
    desired = state({"mps": {"enabled": True}})
    assert desired.mps.pipe_directory == MPS_DEFAULT_PIPE_DIRECTORY == "/tmp/nvidia-mps"
    assert desired.mps.log_directory == MPS_DEFAULT_LOG_DIRECTORY == "/var/log/nvidia-mps"
    assert desired.exclusive_process_gpus == ()


@pytest.mark.parametrize(
    ("mps", "key"),
    [
        ({"pinned_device_memory_limit": {"0": "1T"}}, "mps.pinned_device_memory_limit.0"),
        ({"pinned_device_memory_limit": {"0": "1G;x"}}, "mps.pinned_device_memory_limit.0"),
        ({"pinned_device_memory_limit": {"16": "1G"}}, "mps.pinned_device_memory_limit.16"),
        ({"gpus": [0], "pinned_device_memory_limit": {"1": "1G"}},
         "mps.pinned_device_memory_limit.1"),
        ({"gpus": [0, 0]}, "mps.gpus"),
        ({"gpus": [16]}, "mps.gpus[0]"),
        ({"active_thread_percentage": 0}, "mps.active_thread_percentage"),
        ({"active_thread_percentage": 101}, "mps.active_thread_percentage"),
        ({"pipe_directory": "/etc/nvidia-mps"}, "mps.pipe_directory"),
        ({"pipe_directory": "/tmp/a b"}, "mps.pipe_directory"),
        ({"pipe_directory": "/tmp"}, "mps.pipe_directory"),
        ({"log_directory": "/tmp/nvidia-mps"}, "mps.log_directory"),
    ],
)  # fmt: skip
def test_bad_mps_data_is_refused_naming_its_key(mps: dict[str, Any], key: str) -> None:
    assert key in problems_of({"mps": {"enabled": True, **mps}})


def test_mps_on_mig_is_refused_saying_what_nvidia_requires() -> None:
    found = problems_of(
        {
            "mps": {"enabled": True},
            "gpu_settings": {"mig": True},
            "expected_hardware": {"gpu_model": "NVIDIA H100 80GB HBM3"},
        }
    )
    assert "serves whole GPUs, and gpu_settings.mig is true" in found["mps.enabled"]


def test_mps_without_a_driver_or_on_a_gpu_the_node_lacks_is_refused() -> None:
    _, problems = build_desired_state({"mps": {"enabled": True}})
    assert "mps.enabled" in {p.key for p in problems}
    found = problems_of({"mps": {"enabled": True, "gpus": [0, 2]},
                         "expected_hardware": {"gpu_count": 2}})  # fmt: skip
    assert set(found) == {"mps.gpus[1]"}


def test_disabled_mps_wants_no_compute_mode() -> None:
    assert state({}).exclusive_process_gpus is None
    no_exclusive = state({"mps": {"enabled": True, "exclusive_process": False}})
    assert no_exclusive.exclusive_process_gpus is None


# --- the unit -------------------------------------------------------------------------------


def test_the_unit_carries_the_declared_environment() -> None:
    desired = state(
        {
            "mps": {
                "enabled": True,
                "gpus": [1, 0],
                "active_thread_percentage": 50,
                "pinned_device_memory_limit": {"1": "512M", "0": "2G"},
            }
        }
    )
    unit = expected.render_unit(desired)
    assert 'Environment="CUDA_VISIBLE_DEVICES=1,0"' in unit
    assert 'Environment="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50"' in unit
    assert 'Environment="CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2G,1=512M"' in unit
    assert 'Environment="CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"' in unit
    assert 'Environment="CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps"' in unit
    assert "ExecStart=/usr/bin/nvidia-cuda-mps-control -d\n" in unit
    assert "ExecStop=/bin/sh -c 'echo quit | /usr/bin/nvidia-cuda-mps-control'" in unit
    assert "PIDFile=/tmp/nvidia-mps/nvidia-cuda-mps-control.pid" in unit
    assert "After=" in unit and "gpunode-gpu-settings.service" in unit


def test_every_gpu_means_no_visible_devices_and_no_optional_variables() -> None:
    unit = expected.render_unit(state({"mps": {"enabled": True}}))
    assert "CUDA_VISIBLE_DEVICES" not in unit
    assert "ACTIVE_THREAD_PERCENTAGE" not in unit and "PINNED_DEVICE_MEM_LIMIT" not in unit


def test_systemd_reads_the_unit_without_complaint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    analyze = subprocess.run(["which", "systemd-analyze"], capture_output=True, check=False)
    if analyze.returncode != 0:
        pytest.skip("systemd-analyze is not installed on this control host")
    path = tmp_path / expected.UNIT
    path.write_text(expected.render_unit(state({"mps": {"enabled": True, "gpus": [0]}})))
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    # The binary is absent here: that is the only complaint allowed.
    complaints = [
        line for line in done.stderr.splitlines()
        if line.strip() and "nvidia-cuda-mps-control" not in line and "install" not in line
    ]  # fmt: skip
    assert complaints == []


# --- compute mode: the GPU settings role ----------------------------------------------------


def gpu(index: int) -> dict[str, Any]:
    return {"index": index, "name": "NVIDIA H100 80GB HBM3", "lost": False}


def facts(modes: dict[str, str], *indexes: int) -> dict[type, Any]:
    report = {"state": "ok", "reason": "", "gpus": [gpu(i) for i in indexes]}
    mps = {"compute_modes": modes, "nvidia_smi": True, "control_installed": True}
    return {GpuDevices: report, MpsState: mps}


def test_exclusive_process_is_set_only_where_it_is_not() -> None:
    modes = {"0": "Exclusive_Process", "1": "Default", "2": "Default"}
    commands, _ = commands_of(exclusive_process, facts(modes, 0, 1, 2), gpus=())
    assert commands == ["nvidia-smi -i 1,2 -c EXCLUSIVE_PROCESS"]
    commands, _ = commands_of(exclusive_process, facts(modes, 0, 1, 2), gpus=(0, 2))
    assert commands == ["nvidia-smi -i 2 -c EXCLUSIVE_PROCESS"]
    done = {str(i): "Exclusive_Process" for i in range(3)}
    commands, noops = commands_of(exclusive_process, facts(done, 0, 1, 2), gpus=())
    assert commands == [] and noops == ["compute mode EXCLUSIVE_PROCESS on GPUs 0,1,2"]


def test_a_gpu_named_for_mps_that_the_node_lacks_is_an_error() -> None:
    from pyinfra.api import OperationError

    with pytest.raises(OperationError, match=r"mps\.gpus names GPU 3"):
        commands_of(exclusive_process, facts({"0": "Default"}, 0), gpus=(3,))


def test_the_boot_unit_sets_the_compute_mode_again() -> None:
    assert "EXCLUSIVE_PROCESS='all'" not in render_boot_settings(state({}).gpu_settings, None)
    everything = render_boot_settings(state({}).gpu_settings, ())
    assert "EXCLUSIVE_PROCESS=all" in everything
    assert "EXCLUSIVE_PROCESS=0,2" in render_boot_settings(state({}).gpu_settings, (0, 2))
    assert 'nvidia-smi -i "$EXCLUSIVE_PROCESS" -c EXCLUSIVE_PROCESS' in BOOT_SCRIPT_TEXT


def test_the_boot_script_applies_the_compute_mode(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The boot script, run by sh with a recording nvidia-smi, from the rendered settings."""
    settings = tmp_path / "gpu-settings.conf"
    log = tmp_path / "calls"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    smi.chmod(0o755)
    for exclusive, call in (((0, 2), "-i 0,2 -c EXCLUSIVE_PROCESS"), ((), "-c EXCLUSIVE_PROCESS")):
        settings.write_text(render_boot_settings(state({}).gpu_settings, exclusive))
        script = BOOT_SCRIPT_TEXT.replace("/etc/gpunode/gpu-settings.conf", str(settings))
        log.write_text("")
        done = subprocess.run(
            ["sh", "-c", script], capture_output=True, text=True, check=False,
            env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert log.read_text().splitlines() == ["-pm 1", call]


# --- the MPS role ---------------------------------------------------------------------------


def service_facts(enabled: bool, running: bool) -> dict[type, Any]:
    return {
        SystemdEnabled: {expected.UNIT: enabled},
        SystemdStatus: {expected.UNIT: running},
    }


def test_the_service_is_enabled_started_and_restarted_on_a_changed_unit() -> None:
    commands, _ = commands_of(mps_role.mps_service, service_facts(False, False))
    assert commands == [f"systemctl enable {expected.UNIT}", f"systemctl start {expected.UNIT}"]
    commands, _ = commands_of(mps_role.mps_service, service_facts(True, True), restart=True)
    assert commands == ["systemctl daemon-reload", f"systemctl restart {expected.UNIT}"]
    commands, noops = commands_of(mps_role.mps_service, service_facts(True, True))
    assert commands == [] and noops == [f"{expected.UNIT} enabled and running"]


def test_a_node_whose_driver_comes_in_this_run_gets_the_unit_enabled_not_started() -> None:
    commands, noops = commands_of(mps_role.mps_service, service_facts(False, False), start=False)
    assert commands == [f"systemctl enable {expected.UNIT}"]
    assert "comes with the driver" in noops[0]


def test_mps_off_removes_gpunodes_unit_or_notes_there_is_none() -> None:
    commands, _ = commands_of(mps_role.mps_removed, {File: {"size": 100}})
    assert commands == [
        f"systemctl disable --now {expected.UNIT}", f"rm -f {expected.UNIT_PATH}",
        "systemctl daemon-reload",
    ]  # fmt: skip
    commands, noops = commands_of(mps_role.mps_removed, {File: None})
    assert commands == [] and "MPS is not run here" in noops[0]


def test_a_driver_without_the_control_binary_refuses_the_node_naming_the_package() -> None:
    desired = state({"mps": {"enabled": True}})
    node = {MpsState: {"control_installed": False, "nvidia_smi": True, "compute_modes": {}}}
    with fake_host(node), pytest.raises(NodeRefused, match="nvidia-cuda-mps"):
        mps_role.mps._inner(desired)  # type: ignore[attr-defined]


# --- the fact -------------------------------------------------------------------------------


def test_compute_modes_are_read_and_a_strange_line_is_named() -> None:
    modes, problems = parse_compute_modes(["0, Default", "1, Exclusive_Process", "2, Sideways"])
    assert modes == {"0": "Default", "1": "Exclusive_Process"}
    assert problems == [f"{COMPUTE_MODES_COMMAND}: '2, Sideways'"]


def run_frame(python: bool) -> framing.FrameOutput:
    command = framing.command(MpsState().parts(), python=python)
    done = subprocess.run(["sh", "-c", command], capture_output=True, check=False)
    return framing.parse(done.stdout.decode("utf-8", "surrogateescape").splitlines())


def test_the_control_binarys_python_part_answers_as_its_shell_command() -> None:
    """Here, where the binary is absent (the unit's state part is the same code as auditd's,
    compared against a real systemd in tests/integration/test_deploy.py)."""
    in_python, in_shell = run_frame(True), run_frame(False)
    assert in_python.part("control") == in_shell.part("control")
    assert in_shell.part("control").exit_status == 1


def test_the_fact_reads_a_whole_frame() -> None:
    output = framing.output_of(
        {
            "compute_modes": framing.PartOutput("compute_modes", ["0, Exclusive_Process"], [], 0),
            "active": framing.PartOutput("active", ["failed"], [], 3),
            "control": framing.PartOutput("control", [], [], 0),
        }
    )
    value = parse_mps(output)
    assert value["compute_modes"] == {"0": "Exclusive_Process"}
    assert value["active"] is False and value["unit_state"] == "failed"
    assert value["control_installed"] is True


# --- drift ----------------------------------------------------------------------------------


def drift(section: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    section = {"state": "ok", "reason": "", "problems": [], **section}
    return {f.id: f for f in evaluate("node-1", state(data), {"mps": section})
            if f.id.startswith("mps")}  # fmt: skip


HEALTHY = {
    "compute_modes": {"0": "Exclusive_Process", "1": "Exclusive_Process"},
    "nvidia_smi": True,
    "active": True,
    "unit_state": "active",
    "control_installed": True,
}
ON = {"mps": {"enabled": True}}


def test_a_running_daemon_on_exclusive_gpus_is_no_finding() -> None:
    assert drift(HEALTHY, ON) == {}
    assert drift({**HEALTHY, "active": False}, {}) == {}  # not declared: not checked


def test_a_stopped_daemon_is_critical_naming_the_unit() -> None:
    found = drift({**HEALTHY, "active": False, "unit_state": "failed"}, ON)
    assert list(found) == ["mps.daemon"]
    assert found["mps.daemon"].found == "failed" and expected.UNIT in found["mps.daemon"].fix


def test_a_compute_mode_changed_back_is_critical_per_gpu() -> None:
    modes = {"0": "Exclusive_Process", "1": "Default"}
    found = drift({**HEALTHY, "compute_modes": modes}, ON)
    assert list(found) == ["mps.compute_mode:gpu1"]
    assert found["mps.compute_mode:gpu1"].found == "Default"
    only_zero = {"mps": {"enabled": True, "gpus": [0]}}
    assert drift({**HEALTHY, "compute_modes": modes}, only_zero) == {}


def test_a_missing_binary_and_an_unreadable_section_are_findings() -> None:
    assert list(drift({**HEALTHY, "control_installed": False}, ON)) == ["mps.control"]
    found = drift({"state": "unreadable", "reason": "mps: exit status 1"}, ON)
    assert list(found) == ["mps.unreadable"]
    assert list(drift({**HEALTHY, "compute_modes": "Default"}, ON)) == ["mps.unreadable"]

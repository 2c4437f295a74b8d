"""GPU settings operations: GpuDevices fact in, nvidia-smi commands or no-op notes out."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import OperationError

from facts.gpu import GpuDevices
from gpunode.model import build_desired_state
from roles.gpu_settings import (
    application_clocks,
    mig_layout,
    pending_mode,
    persistence_mode,
    power_limit,
)

from .fakehost import commands_of

DEPRECATED = "Requested functionality has been deprecated"


# The GPU record's fields (gpunode.probe.gpu_record) that the roles read.
POWER = {
    "draw": 80.0,
    "limit": 700.0,
    "default_limit": 700.0,
    "min_limit": 200.0,
    "max_limit": 700.0,
}
NO_MIG = {"current": None, "pending": None}  # nvidia-smi's "N/A": the GPU has no MIG
MIG_PENDING = {"current": False, "pending": True}


def gpu(index: int, **settings: Any) -> dict[str, Any]:
    base = {
        "index": index,
        "name": "NVIDIA H100 80GB HBM3",
        "persistence_mode": False,
        "ecc_mode": {"current": True, "pending": True},
        "mig_mode": {"current": False, "pending": False},
        "power_w": POWER,
        "application_clocks_mhz": None,
        "application_clocks_note": DEPRECATED,
        "supported_clocks_mhz": [{"memory": 2619, "graphics": list(range(345, 1981, 15))}],
        "mig_profiles": {},
        "gpu_instances": [],
        "compute_pids": [],
    }
    return base | settings


def facts(*gpus: dict[str, Any], problems: dict[str, str] | None = None) -> dict[type, Any]:
    report = {"state": "ok", "reason": "", "gpus": list(gpus), "listing_problems": problems or {}}
    return {GpuDevices: report}


def test_persistence_set_only_on_gpus_that_lack_it() -> None:
    commands, _ = commands_of(
        persistence_mode, facts(gpu(0), gpu(1, persistence_mode=True), gpu(2)), enabled=True
    )
    assert commands == ["nvidia-smi -i 0,2 -pm 1"]


def test_a_lost_gpu_takes_no_setting_and_is_named() -> None:
    """A lost GPU's values are all unknown (gpu_record's lost): no nvidia-smi call on it."""
    lost = gpu(1, persistence_mode=None, power_w={}, lost=True)
    commands, noops = commands_of(persistence_mode, facts(gpu(0), lost, gpu(2)), enabled=True)
    assert commands == ["nvidia-smi -i 0,2 -pm 1"]
    assert noops == ["GPU 1 lost (answers no query): left out of GPU settings"]
    commands, _ = commands_of(power_limit, facts(gpu(0), lost), watts=500)
    assert commands == ["nvidia-smi -i 0 -pl 500"]


def test_persistence_noop_when_all_enabled() -> None:
    commands, noops = commands_of(
        persistence_mode, facts(gpu(0, persistence_mode=True)), enabled=True
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
        pending_mode,
        facts(gpu(0, ecc_mode={"current": True, "pending": False})),
        setting="ecc",
        enabled=False,
    )
    assert commands == []
    assert noops == ["ECC Disabled pending a GPU reset or reboot on GPUs 0"]


def test_mig_skips_gpus_that_do_not_support_it() -> None:
    commands, noops = commands_of(
        pending_mode,
        facts(gpu(0, mig_mode=NO_MIG)),
        setting="mig",
        enabled=True,
    )
    assert commands == []
    assert noops == ["MIG Enabled on all 0 GPUs that support it"]


def test_power_limit_applied_where_different() -> None:
    commands, _ = commands_of(
        power_limit, facts(gpu(0), gpu(1, power_w=POWER | {"limit": 500.0})), watts=500
    )
    assert commands == ["nvidia-smi -i 0 -pl 500"]


def test_power_limit_outside_range_is_an_error_naming_gpu_and_range() -> None:
    expected = r"GPU 0 \(NVIDIA H100 80GB HBM3\) accepts 200 to 700 W"
    with pytest.raises(OperationError, match=expected):
        commands_of(power_limit, facts(gpu(0)), watts=900)


# --- application clocks ---------------------------------------------------------------------


def a100(index: int, **settings: Any) -> dict[str, Any]:
    a100_settings = {
        "name": "NVIDIA A100-SXM4-80GB",
        "application_clocks_mhz": {"memory": 1593, "graphics": 1275},
        "application_clocks_note": "",
        "supported_clocks_mhz": [{"memory": 1593, "graphics": list(range(210, 1411, 15))}],
    }
    return gpu(index, **(a100_settings | settings))


def test_application_clocks_set_only_where_they_differ() -> None:
    done = {"memory": 1593, "graphics": 1215}
    commands, noops = commands_of(
        application_clocks,
        facts(a100(0), a100(1, application_clocks_mhz=done), a100(2)),
        memory_mhz=1593,
        graphics_mhz=1215,
    )
    assert commands == ["nvidia-smi -i 0,2 -ac 1593,1215"]
    assert noops == []


def test_application_clocks_already_set_are_a_noop() -> None:
    done = {"memory": 1593, "graphics": 1215}
    commands, noops = commands_of(
        application_clocks,
        facts(a100(0, application_clocks_mhz=done), a100(1, application_clocks_mhz=done)),
        memory_mhz=1593,
        graphics_mhz=1215,
    )
    assert commands == []
    assert noops == ["application clocks 1593,1215 MHz on all 2 GPUs that have them"]


def test_deprecated_application_clocks_are_reported_never_requested() -> None:
    """Driver 590 on Hopper: a note with the driver's words on every run, and no command."""
    commands, noops = commands_of(
        application_clocks, facts(gpu(0), gpu(1)), memory_mhz=2619, graphics_mhz=1980
    )
    assert commands == []
    assert noops == [
        f"application clocks left alone on GPUs 0,1 (NVIDIA H100 80GB HBM3): {DEPRECATED}"
    ]


def test_mixed_node_sets_the_gpus_that_have_application_clocks() -> None:
    commands, noops = commands_of(
        application_clocks, facts(gpu(0), a100(1)), memory_mhz=1593, graphics_mhz=1410
    )
    assert commands == ["nvidia-smi -i 1 -ac 1593,1410"]
    assert noops == [
        f"application clocks left alone on GPUs 0 (NVIDIA H100 80GB HBM3): {DEPRECATED}"
    ]


@pytest.mark.parametrize(("memory", "graphics"), [(1593, 1500), (1593, 1214), (1215, 1275)])
def test_unsupported_clock_pair_is_an_error_naming_gpu_and_supported_clocks(
    memory: int, graphics: int
) -> None:
    expected = (
        rf"memory {memory} MHz, graphics {graphics} MHz: GPU 1 \(NVIDIA A100-SXM4-80GB\) "
        r"supports memory 1593 MHz with graphics 210 to 1410 MHz \(81 clocks\)"
    )
    with pytest.raises(OperationError, match=expected):
        commands_of(
            application_clocks,
            facts(a100(0, supported_clocks_mhz=[]), a100(1)),
            memory_mhz=memory,
            graphics_mhz=graphics,
        )


# --- MIG layout -----------------------------------------------------------------------------

# -lgip/-lgipp of an A100 80GB as GpuDevices reads them: (id, total, GiB, placements, size).
A100_PROFILES = {
    name: {"id": pid, "free": total, "total": total, "memory_gib": gib, "placements": starts,
           "size": size}
    for name, pid, total, gib, starts, size in (
        ("1g.10gb", 19, 7, 9.5, list(range(7)), 1),
        ("1g.10gb+me", 20, 1, 9.5, list(range(7)), 1),
        ("1g.20gb", 15, 4, 19.5, [0, 2, 4, 6], 2),
        ("2g.20gb", 14, 3, 19.5, [0, 2, 4], 2),
        ("3g.40gb", 9, 2, 39.25, [0, 4], 4),
        ("4g.40gb", 5, 1, 39.25, [0], 4),
        ("7g.80gb", 0, 1, 79.0, [0], 8),
    )
}  # fmt: skip
OFFERS = (
    "it offers 1g.10gb (up to 7), 1g.10gb+me (up to 1), 1g.20gb (up to 4), 2g.20gb (up to 3), "
    "3g.40gb (up to 2), 4g.40gb (up to 1), 7g.80gb (up to 1); 7 compute slices in all"
)


def instance(gi: int, profile: str, *computes: str) -> dict[str, Any]:
    """A GPU instance as GpuDevices reads it; ``computes`` name its compute instances."""
    return {
        "id": gi,
        "profile": profile,
        "profile_id": A100_PROFILES[profile]["id"],
        "start": 0,
        "size": A100_PROFILES[profile]["size"],
        "compute_instances": [
            {"id": n, "profile": name, "profile_id": 0} for n, name in enumerate(computes)
        ],
    }


def mig_gpu(index: int, *instances: dict[str, Any], **settings: Any) -> dict[str, Any]:
    return a100(
        index,
        mig_mode={"current": True, "pending": True},
        mig_profiles=A100_PROFILES,
        gpu_instances=list(instances),
        **settings,
    )


HALVES = ("3g.40gb", "3g.40gb")


def test_layout_created_on_gpus_in_mig_mode_without_instances() -> None:
    commands, noops = commands_of(mig_layout, facts(mig_gpu(0), mig_gpu(1)), profiles=HALVES)
    assert commands == [
        "nvidia-smi mig -i 0 -cgi 3g.40gb,3g.40gb -C",
        "nvidia-smi mig -i 1 -cgi 3g.40gb,3g.40gb -C",
    ]
    assert noops == []


def test_matching_layout_is_a_noop() -> None:
    halves = [instance(1, "3g.40gb", "3g.40gb"), instance(2, "3g.40gb", "3g.40gb")]
    commands, noops = commands_of(
        mig_layout, facts(mig_gpu(0, *halves), mig_gpu(1, *halves)), profiles=HALVES
    )
    assert commands == []
    assert noops == ["MIG layout ['3g.40gb', '3g.40gb'] on GPUs 0,1"]


def test_layout_is_a_multiset_not_a_sequence() -> None:
    present = [instance(3, "2g.20gb", "2g.20gb"), instance(1, "3g.40gb", "3g.40gb")]
    commands, _ = commands_of(
        mig_layout, facts(mig_gpu(0, *present)), profiles=("3g.40gb", "2g.20gb")
    )
    assert commands == []


def test_instances_are_created_largest_first() -> None:
    """The driver places each as it comes: 1g,1g,2g before 3g leaves no room for the 3g."""
    commands, _ = commands_of(
        mig_layout, facts(mig_gpu(0)), profiles=("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb")
    )
    assert commands == ["nvidia-smi mig -i 0 -cgi 3g.40gb,2g.20gb,1g.10gb,1g.10gb -C"]


def test_mig_mode_pending_reports_and_creates_nothing() -> None:
    commands, noops = commands_of(
        mig_layout,
        facts(a100(0, mig_mode=MIG_PENDING), a100(1, mig_mode=MIG_PENDING)),
        profiles=HALVES,
    )
    assert commands == []
    assert noops == [
        "MIG layout ['3g.40gb', '3g.40gb'] waits for a GPU reset or reboot (MIG mode pending) "
        "on GPUs 0,1"
    ]


def test_mig_mode_off_or_unsupported_reports_and_creates_nothing() -> None:
    commands, noops = commands_of(
        mig_layout,
        facts(a100(0), gpu(1, mig_mode=NO_MIG), mig_gpu(2)),
        profiles=HALVES,
    )
    assert commands == ["nvidia-smi mig -i 2 -cgi 3g.40gb,3g.40gb -C"]
    assert noops == [
        "MIG layout ['3g.40gb', '3g.40gb'] needs MIG mode, which is off on GPUs 0",
        "MIG layout ['3g.40gb', '3g.40gb'] left out on GPUs without MIG: 1",
    ]


def test_differing_instances_are_replaced_when_no_process_runs() -> None:
    sevenths = [instance(7 + n, "1g.10gb", "1g.10gb") for n in range(7)]
    commands, _ = commands_of(mig_layout, facts(mig_gpu(0, *sevenths)), profiles=HALVES)
    assert commands == [
        "nvidia-smi mig -i 0 -dci",
        "nvidia-smi mig -i 0 -dgi",
        "nvidia-smi mig -i 0 -cgi 3g.40gb,3g.40gb -C",
    ]


def test_instance_without_its_default_compute_instance_is_laid_out_again() -> None:
    """A GPU instance without a compute instance gives no MIG device; -dci has nothing to do."""
    bare = [instance(1, "3g.40gb"), instance(2, "3g.40gb")]
    commands, _ = commands_of(mig_layout, facts(mig_gpu(0, *bare)), profiles=HALVES)
    assert commands == ["nvidia-smi mig -i 0 -dgi", "nvidia-smi mig -i 0 -cgi 3g.40gb,3g.40gb -C"]
    split = [instance(1, "3g.40gb", "1c.3g.40gb", "1c.3g.40gb"), instance(2, "3g.40gb", "3g.40gb")]
    commands, _ = commands_of(mig_layout, facts(mig_gpu(0, *split)), profiles=HALVES)
    assert commands[:2] == ["nvidia-smi mig -i 0 -dci", "nvidia-smi mig -i 0 -dgi"]


def test_replacing_instances_in_use_is_refused_and_nothing_runs() -> None:
    whole = instance(0, "7g.80gb", "7g.80gb")
    busy = facts(mig_gpu(0), mig_gpu(1, whole, compute_pids=[4242, 4243]))
    expected = (
        r"GPU 1 \(NVIDIA A100-SXM4-80GB\) has MIG instances \['7g.80gb'\], not "
        r"\['3g.40gb', '3g.40gb'\]; replacing them would kill the compute processes running on "
        r"it \(PIDs 4242, 4243\): stop them first"
    )
    with pytest.raises(OperationError, match=expected):
        commands_of(mig_layout, busy, profiles=HALVES)


def test_processes_on_a_gpu_that_only_needs_creating_do_not_block_it() -> None:
    commands, _ = commands_of(mig_layout, facts(mig_gpu(0, compute_pids=[1])), profiles=HALVES)
    assert commands == ["nvidia-smi mig -i 0 -cgi 3g.40gb,3g.40gb -C"]


def test_unknown_processes_refuse_a_replacement() -> None:
    whole = instance(0, "7g.80gb", "7g.80gb")
    problems = {"compute_apps": "nvidia-smi --query-compute-apps=...: unexpected line 'x'"}
    with pytest.raises(OperationError, match="whether workloads use them is unknown"):
        commands_of(mig_layout, facts(mig_gpu(0, whole), problems=problems), profiles=HALVES)


def test_unreadable_instance_listing_is_an_error_not_an_empty_gpu() -> None:
    problems = {"gpu_instances": "nvidia-smi mig -lgi: unexpected line 'Failed ...'"}
    with pytest.raises(OperationError, match="GPU 0: cannot read its MIG instances"):
        commands_of(mig_layout, facts(mig_gpu(0), problems=problems), profiles=HALVES)


@pytest.mark.parametrize(
    ("layout", "reason"),
    [
        (("3g.20gb",), "no MIG profile 3g.20gb on this GPU"),
        (("4g.40gb", "4g.40gb"), "2 x 4g.40gb, but at most 1 fit"),
        (("3g.40gb", "3g.40gb", "2g.20gb"), "8 compute slices, but the GPU has 7"),
        (("4g.40gb", "2g.20gb", "2g.20gb"), "8 compute slices, but the GPU has 7"),
        # 7 compute slices, but 4g and 3g both need 4 of the 8 memory slices: 12.
        (("4g.40gb", "1g.20gb", "1g.20gb", "1g.20gb"), "no placement gives every instance"),
    ],
)
def test_layout_that_does_not_fit_is_an_error_naming_gpu_and_offers(
    layout: tuple[str, ...], reason: str
) -> None:
    with pytest.raises(OperationError) as raised:
        commands_of(mig_layout, facts(mig_gpu(0)), profiles=layout)
    message = str(raised.value)
    assert message.startswith(
        f"gpu_settings.mig_layout {list(layout)} does not fit GPU 0 (NVIDIA A100-SXM4-80GB): "
        f"{reason}"
    )
    assert message.endswith(OFFERS)


# --- the boot unit: what the driver forgets, applied again at every boot ---------------------


def boot_run(tmp_path: Path, settings: str, mig: str = "0, Enabled\n1, Disabled\n") -> list[str]:
    """The boot script as systemd runs it, its settings file and nvidia-smi in ``tmp_path``
    (a stand-in nvidia-smi that records its arguments; GPU 0 in MIG mode, without instances)."""
    from roles.gpu_settings import BOOT_SCRIPT_TEXT, BOOT_SETTINGS

    (tmp_path / "gpu-settings.conf").write_text(settings)
    log = tmp_path / "calls"
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {log}\n'
        'case "$*" in\n'
        f"  --query-gpu=*) printf '{mig}' ;;\n"
        "  'mig -i 0 -lgi') exit 6 ;;\n"
        "esac\n"
    )
    fake.chmod(0o755)
    script = tmp_path / "gpunode-gpu-settings"
    script.write_text(BOOT_SCRIPT_TEXT.replace(BOOT_SETTINGS, str(tmp_path / "gpu-settings.conf")))
    done = subprocess.run(
        ["sh", str(script)], env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return log.read_text().splitlines() if log.exists() else []


def test_the_boot_settings_file_holds_what_is_declared_quoted() -> None:
    from roles.gpu_settings import render_boot_settings

    wanted = build_desired_state(
        {"gpu_settings": {"persistence_mode": True, "power_limit_w": 500, "mig": True,
                          "mig_layout": ["1g.10gb", "3g.40gb", "3g.40gb"],
                          "application_clocks": {"memory_mhz": 1593, "graphics_mhz": 1410}}}
    )[0].gpu_settings  # fmt: skip
    assert render_boot_settings(wanted).splitlines()[1:] == [
        "PERSISTENCE=1",
        "POWER_LIMIT_W=500",
        "APPLICATION_CLOCKS=1593,1410",
        "MIG_LAYOUT=3g.40gb,3g.40gb,1g.10gb",  # the largest first
    ]
    nothing = build_desired_state({"gpu_settings": {"persistence_mode": None}})[0].gpu_settings
    assert render_boot_settings(nothing).splitlines()[1:] == []


def test_the_boot_script_applies_each_declared_setting_and_lays_out_mig(tmp_path: Path) -> None:
    calls = boot_run(
        tmp_path,
        "PERSISTENCE=1\nPOWER_LIMIT_W=500\nAPPLICATION_CLOCKS=1593,1410\n"
        "MIG_LAYOUT=3g.40gb,3g.40gb\n",
    )
    assert calls == [
        "-pm 1",
        "-pl 500",
        "-ac 1593,1410",
        "--query-gpu=index,mig.mode.current --format=csv,noheader",
        "mig -i 0 -lgi",
        "mig -i 0 -cgi 3g.40gb,3g.40gb -C",  # GPU 1 is not in MIG mode
    ]


def test_the_boot_script_leaves_undeclared_settings_and_existing_instances(
    tmp_path: Path,
) -> None:
    (tmp_path / "power").mkdir()
    assert boot_run(tmp_path / "power", "POWER_LIMIT_W=300\n") == ["-pl 300"]
    # GPU 1 in MIG mode already holds instances (-lgi lists them): left as they are.
    (tmp_path / "mig").mkdir()
    calls = boot_run(tmp_path / "mig", "MIG_LAYOUT=7g.80gb\n", mig="1, Enabled\n")
    assert calls[-2:] == ["--query-gpu=index,mig.mode.current --format=csv,noheader",
                          "mig -i 1 -lgi"]  # fmt: skip


def test_the_boot_unit_runs_before_slurmd_after_the_persistence_daemon() -> None:
    from roles.gpu_settings import BOOT_SCRIPT, BOOT_SETTINGS, BOOT_UNIT_TEXT

    lines = BOOT_UNIT_TEXT.splitlines()
    assert "Before=slurmd.service" in lines
    assert "After=systemd-modules-load.service nvidia-persistenced.service" in lines
    assert f"ExecStart={BOOT_SCRIPT}" in lines and "Type=oneshot" in lines
    assert f"ConditionPathExists={BOOT_SETTINGS}" in lines

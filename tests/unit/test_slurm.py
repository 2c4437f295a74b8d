"""Slurm: the model's settings, the files rendered from them and from the GPU facts, the MUNGE
key's operation (never showing the key), the GRES fact and the drift rule on it."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import OperationError
from pyinfra.api.command import FileUploadCommand
from pyinfra.facts.files import File, Sha256File

from facts.slurm import SlurmGres, parse_gres_conf
from gpunode.drift.findings import Severity
from gpunode.drift.rules import slurm_rules
from gpunode.expected.slurm import (
    GresGpu,
    gpu_type_of,
    gres_gpus,
    node_conf,
    render_cgroup_conf,
    render_gres_conf,
    render_slurm_conf,
    render_slurmd_drop_in,
)
from gpunode.model import DesiredState, Slurm, build_desired_state
from roles.slurm import MUNGE_KEY, STAGING_DIR, munge_key, read_munge_key

from .fakehost import fake_host

KEY = b"0123456789abcdef" * 8 + b"\n"
KEY_SHA = hashlib.sha256(KEY).hexdigest()
ENABLED = {
    "enabled": True,
    "controller": "slurmctl",
    "controller_address": "10.0.0.10",
    "munge_key_file": "/srv/munge.key",
}


def gpu(index: int, name: str = "NVIDIA H100 80GB HBM3", minor: Any = None) -> dict[str, Any]:
    return {
        "index": index,
        "name": name,
        "minor_number": index if minor is None else minor,
        "pci_bus_id": f"00000000:{index:02X}:00.0",
    }


def slurm_state(**overrides: Any) -> DesiredState:
    state, problems = build_desired_state({"slurm": {**ENABLED, **overrides}})
    assert problems == []
    return state


# --- model ---------------------------------------------------------------------------------


def test_enabled_slurm_needs_its_controller_and_key() -> None:
    _, problems = build_desired_state({"slurm": {"enabled": True}})
    assert {problem.key for problem in problems} == {"slurm.controller", "slurm.munge_key_file"}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cluster_name", "Lab"),  # slurmdbd keeps cluster names lowercase
        ("partition", "gpu nodes"),
        ("features", ["ok", "a$b"]),
        ("gpu_type", "H100"),
        ("controller", "ctl;reboot"),
        ("controller_address", "10.0.0"),
        ("munge_key_file", "relative/munge.key"),
    ],
)
def test_slurm_words_that_would_break_a_slurm_file_are_refused(key: str, value: Any) -> None:
    _, problems = build_desired_state({"slurm": {**ENABLED, key: value}})
    assert {problem.key.split("[")[0] for problem in problems} == {f"slurm.{key}"}
    bad = value[-1] if isinstance(value, list) else value  # a list: its last word is bad
    assert any(problem.value == bad for problem in problems)


def test_slurm_is_off_by_default() -> None:
    state, problems = build_desired_state({})
    assert problems == [] and state.slurm.enabled is False


# --- rendered files ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "h100_80gb_hbm3"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("NVIDIA A10G", "a10g"),
        ("Tesla V100-SXM2-32GB", "tesla_v100-sxm2-32gb"),
        ("NVIDIA", None),
        ("", None),
        (None, None),
    ],
)
def test_the_gres_type_comes_from_the_product_name(name: str | None, expected: str | None) -> None:
    assert gpu_type_of(name) == expected


def test_gres_conf_has_one_line_per_gpu_with_its_device_file() -> None:
    gres, problems = gres_gpus([gpu(1), gpu(0), gpu(2, minor=5)])
    assert problems == []
    text = render_gres_conf(gres)
    assert [line for line in text.splitlines() if not line.startswith("#")] == [
        "Name=gpu Type=h100_80gb_hbm3 File=/dev/nvidia0",
        "Name=gpu Type=h100_80gb_hbm3 File=/dev/nvidia1",
        "Name=gpu Type=h100_80gb_hbm3 File=/dev/nvidia5",
    ]


def test_a_gpu_without_minor_number_or_name_is_left_out_and_named() -> None:
    gres, problems = gres_gpus([gpu(0), gpu(1, minor="x"), gpu(2, name="")])
    assert gres == [GresGpu("h100_80gb_hbm3", "/dev/nvidia0")]
    assert len(problems) == 2
    assert "GPU 1" in problems[0] and "minor number" in problems[0]
    assert "GPU 2" in problems[1] and "product name" in problems[1]


def test_a_declared_gpu_type_wins_over_the_product_name() -> None:
    gres, _ = gres_gpus([gpu(0), gpu(1)], gpu_type="h100")
    assert {g.type for g in gres} == {"h100"}


def test_the_dynamic_node_registers_its_gres_and_features() -> None:
    state = slurm_state(features=["ib", "nvlink"])
    gres, _ = gres_gpus([gpu(i) for i in range(8)])
    assert (
        node_conf(state.slurm, gres) == "Gres=gpu:h100_80gb_hbm3:8 Feature=h100_80gb_hbm3,ib,nvlink"
    )
    drop_in = render_slurmd_drop_in(state.slurm, gres)
    assert "ExecStart=\n" in drop_in
    assert (
        'ExecStart=/usr/sbin/slurmd -D -s -Z --conf "Gres=gpu:h100_80gb_hbm3:8 '
        'Feature=h100_80gb_hbm3,ib,nvlink"\n'
    ) in drop_in
    assert "Type=simple\n" in drop_in


def test_mixed_gpus_give_one_gres_per_type() -> None:
    gres, _ = gres_gpus([gpu(0), gpu(1, name="NVIDIA A10G")])
    assert (
        node_conf(Slurm(), gres)
        == "Gres=gpu:a10g:1,gpu:h100_80gb_hbm3:1 Feature=a10g,h100_80gb_hbm3"
    )


def test_slurm_conf_is_the_clusters_and_names_no_node() -> None:
    text = render_slurm_conf(slurm_state(cluster_name="lab", partition="batch").slurm)
    lines = text.splitlines()
    assert "ClusterName=lab" in lines
    assert "SlurmctldHost=slurmctl(10.0.0.10)" in lines
    assert "GresTypes=gpu" in lines
    assert "PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP" in lines
    assert "ProctrackType=proctrack/cgroup" in lines and "TaskPlugin=task/cgroup" in lines
    assert not any(line.startswith("NodeName=") for line in lines)
    assert (
        "SlurmctldHost=slurmctl"
        in render_slurm_conf(slurm_state(controller_address=None).slurm).splitlines()
    )


def test_an_operators_down_node_is_not_brought_back_by_its_next_registration() -> None:
    # ReturnToService=2 returned every DOWN node at its slurmd's next registration, a node an
    # operator set DOWN ("PSU fault") too; 1 returns only those DOWN for not responding.
    lines = render_slurm_conf(slurm_state().slurm).splitlines()
    assert "ReturnToService=1" in lines and "ReturnToService=2" not in lines
    assert (
        "ReturnToService=0"
        in render_slurm_conf(slurm_state(return_to_service=0).slurm).splitlines()
    )
    assert (
        "ReturnToService=2"
        in render_slurm_conf(slurm_state(return_to_service=2).slurm).splitlines()
    )


@pytest.mark.parametrize("wrong", [3, -1, "2", True, None])
def test_return_to_service_outside_slurms_values_is_refused(wrong: Any) -> None:
    _, problems = build_desired_state({"slurm": {**ENABLED, "return_to_service": wrong}})
    assert [problem.key for problem in problems] == ["slurm.return_to_service"]


def test_without_cgroup_enforcement_jobs_are_tracked_by_process() -> None:
    wanted = slurm_state(cgroup_enforcement=False).slurm
    lines = render_slurm_conf(wanted).splitlines()
    assert "ProctrackType=proctrack/linuxproc" in lines and "TaskPlugin=task/none" in lines
    assert "ConstrainDevices=no" in render_cgroup_conf(wanted).splitlines()
    assert "ConstrainDevices=yes" in render_cgroup_conf(slurm_state().slurm).splitlines()


# --- the MUNGE key ------------------------------------------------------------------------


def key_file(tmp_path: Path, content: bytes = KEY, mode: int = 0o600) -> str:
    path = tmp_path / "munge.key"
    path.write_bytes(content)
    path.chmod(mode)
    return str(path)


def munge_facts(sha: str | None, mode: int = 400, user: str = "munge") -> dict[type, Any]:
    info = None if sha is None else {"mode": mode, "user": user, "group": "munge"}
    return {Sha256File: sha, File: info}


def run_munge_key(facts: dict[type, Any], **kwargs: Any) -> tuple[list[Any], list[str]]:
    with fake_host(facts) as host:
        commands = list(munge_key._inner(**kwargs))
    return commands, host.noops


def test_the_clusters_key_in_place_is_left_alone(tmp_path: Path) -> None:
    commands, noops = run_munge_key(munge_facts(KEY_SHA), key_file=key_file(tmp_path))
    assert commands == []
    assert noops == [f"{MUNGE_KEY} is the cluster's key, 0400 munge:munge"]


@pytest.mark.parametrize(
    "facts",
    [munge_facts(None), munge_facts("b" * 64), munge_facts(KEY_SHA, mode=600),
     munge_facts(KEY_SHA, user="root")],
    ids=["missing", "other-key", "mode", "owner"],
)  # fmt: skip
def test_the_key_is_uploaded_from_a_file_object_and_never_shown(
    tmp_path: Path, facts: dict[type, Any]
) -> None:
    commands, _ = run_munge_key(facts, key_file=key_file(tmp_path), login_user="debian")
    staging, upload, install = commands
    assert str(staging) == (f"rm -rf {STAGING_DIR} && install -d -m 0700 -o debian {STAGING_DIR}")
    assert isinstance(upload, FileUploadCommand)
    assert upload.src.read() == KEY
    assert upload.remote_temp_filename == f"{STAGING_DIR}/key"
    new = f"{MUNGE_KEY}.gpunode-new"
    assert upload.dest == new
    assert str(install) == (
        f"chown munge:munge {new} && chmod 0400 {new} && mv -f {new} {MUNGE_KEY}"
        f" && rm -rf {STAGING_DIR}"
    )
    shown = " ".join(str(command) for command in commands) + repr(commands)
    assert KEY.decode().strip() not in shown and KEY.decode()[:16] not in shown


def test_an_unusable_key_file_stops_the_run_without_its_content(tmp_path: Path) -> None:
    with pytest.raises(OperationError, match="No such file"):
        read_munge_key(str(tmp_path / "missing"))
    short = key_file(tmp_path, b"secret-but-short")
    with pytest.raises(OperationError, match="16 bytes") as error:
        read_munge_key(short)
    assert "secret-but-short" not in str(error.value)


@pytest.mark.parametrize(
    "mode", [0o640, 0o604, 0o644, 0o620, 0o404], ids=lambda mode: f"{mode:04o}"
)
def test_a_key_file_the_group_or_others_may_read_is_refused_as_the_ca_s_key_is(
    tmp_path: Path, mode: int
) -> None:
    path = key_file(tmp_path, mode=mode)
    with pytest.raises(OperationError) as error:
        read_munge_key(path)
    assert str(error.value) == (
        f"slurm.munge_key_file {path} is readable by others (mode {mode:04o}); chmod 600 {path}"
    )
    assert KEY.decode()[:16] not in str(error.value)
    assert read_munge_key(key_file(tmp_path, mode=0o400)) == KEY


def test_a_login_name_that_is_no_user_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OperationError, match="not a user name"):
        run_munge_key(munge_facts(None), key_file=key_file(tmp_path), login_user="a b")


# --- the GRES fact and its drift rule ------------------------------------------------------


def test_the_gres_fact_reads_gpu_lines_and_names_what_it_cannot_read() -> None:
    read = parse_gres_conf(
        [
            "# Managed by gpunode",
            "Name=gpu Type=a100 File=/dev/nvidia0",
            "File=/dev/nvidia1 Name=gpu Type=a100  # in another order",
            "Name=nic File=/dev/infiniband/uverbs0",
            "Name=gpu Type=a100 File=/dev/nvidia2 `reboot`",
        ]
    )
    assert read["gres"] == [
        {"name": "gpu", "type": "a100", "file": "/dev/nvidia0"},
        {"name": "gpu", "type": "a100", "file": "/dev/nvidia1"},
    ]
    assert read["problems"] == ["line 5: 'Name=gpu Type=a100 File=/dev/nvidia2 `reboot`'"]


def test_no_gres_conf_is_absent_not_empty() -> None:
    fact = SlurmGres()
    assert fact.process(["# gres.conf", "# absent"])["state"] == "absent"
    assert fact.process(["# gres.conf"]) == {
        "state": "ok",
        "reason": "",
        "gres": [],
        "problems": [],
    }


def node_facts(gpu_count: int, listed: int, kind: str = "h100_80gb_hbm3") -> dict[str, Any]:
    return {
        "gpu": {"state": "ok", "gpus": [gpu(i) for i in range(gpu_count)]},
        "slurm": {
            "state": "ok",
            "gres": [
                {"name": "gpu", "type": kind, "file": f"/dev/nvidia{i}"} for i in range(listed)
            ],
            "problems": [],
        },
    }


def test_gres_matching_the_gpus_is_no_finding() -> None:
    assert list(slurm_rules(slurm_state(), node_facts(8, 8))) == []


def test_a_gpu_gone_from_the_node_but_in_gres_conf_is_critical() -> None:
    facts = node_facts(8, 8)
    del facts["gpu"]["gpus"][3]
    ((finding_id, severity, expected, found, fix),) = slurm_rules(slurm_state(), facts)
    assert (finding_id, severity) == ("slurm.gres", Severity.CRITICAL)
    assert expected == "GRES gpu:h100_80gb_hbm3:7 (the node's 7 GPUs)"
    assert found == "gres.conf gpu:h100_80gb_hbm3:8; no GPU of the node at /dev/nvidia3"
    assert "drain" in fix


def test_a_gpu_missing_from_gres_conf_or_of_another_type_is_critical() -> None:
    ((_, severity, _, found, _),) = slurm_rules(slurm_state(), node_facts(8, 7))
    assert severity == Severity.CRITICAL and "GPUs not in gres.conf: /dev/nvidia7" in found
    ((finding_id, _, _, found, _),) = slurm_rules(slurm_state(), node_facts(2, 2, kind="a100"))
    assert finding_id == "slurm.gres" and found == "gres.conf gpu:a100:2"


def test_no_gres_conf_on_a_slurm_node_is_a_warning_and_nothing_without_slurm() -> None:
    facts = node_facts(8, 0)
    facts["slurm"] = SlurmGres.default()
    ((finding_id, severity, *_),) = slurm_rules(slurm_state(), facts)
    assert (finding_id, severity) == ("slurm.gres_conf", Severity.WARNING)
    assert list(slurm_rules(build_desired_state({})[0], node_facts(8, 0))) == []

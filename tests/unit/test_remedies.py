"""Health remedies gpunode carries out (gpunode drift --remedy): which, where, how often, how."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from facts.gpu import GpuDevices
from gpunode.drift.findings import DriftResult, Finding, Severity
from gpunode.drift.output import render_json, render_prometheus
from gpunode.fleet import remedies
from gpunode.health import judge as judge_health
from gpunode.health.finding import gpu_bus_id
from gpunode.model import Health, build_desired_state
from gpunode.refusal import NodeRefused
from roles.remedy import gpus_reset

from .fakehost import commands_of

BUS = "00000000:18:00.0"
OTHER_BUS = "00000000:2A:00.0"
NOW = 1_796_000_000.0
RESET_RECOVERY = Health(actions={"gpu.recovery_action": "reset_gpu"})


def health_finding(host: str = "node-1", failure_class: str = "gpu.recovery_action",
                   remedy: str = "reset_gpu", gpu: str = BUS, id_: str = "gpu.recovery_action:0",
                   ) -> Finding:  # fmt: skip
    return Finding(id_, host, Severity.CRITICAL, "no recovery action", "GPU_RESET", "reset",
                   failure_class=failure_class, evidence="GPU 0", confidence="reported",
                   remedy=remedy, gpu=gpu)  # fmt: skip


def decide(findings: list[Finding], health: Health = RESET_RECOVERY,
           scheduled: dict | None = None, history: remedies.History | None = None,
           ) -> list[remedies.Remedy]:  # fmt: skip
    result = DriftResult(findings=findings, checked_hosts=sorted({f.host for f in findings}))
    return remedies.plan(result, lambda host: health, scheduled or {},
                         history or remedies.History(Path("/nonexistent")), NOW)  # fmt: skip


# --- which findings, which GPUs ------------------------------------------------------------


def test_the_drivers_reset_request_on_an_opted_in_class_is_carried_out_on_that_gpu() -> None:
    (remedy,) = decide(
        [health_finding(), health_finding(gpu=OTHER_BUS, id_="gpu.recovery_action:3")]
    )
    assert (remedy.host, remedy.action, remedy.gpus) == ("node-1", "reset_gpu", (BUS, OTHER_BUS))
    assert remedy.withheld == ""
    assert remedy.failure_classes == ("gpu.recovery_action",)


@pytest.mark.parametrize(
    ("finding", "health"),
    [
        pytest.param(health_finding(), Health(), id="no-class-opted-in"),
        pytest.param(health_finding(failure_class="memory.row_remap_pending"), RESET_RECOVERY,
                     id="another-class"),
        pytest.param(health_finding(remedy="reboot"), RESET_RECOVERY, id="a-reboot-is-asked"),
        pytest.param(Finding("sshd.port", "node-1", Severity.CRITICAL, "22", "2222", "deploy"),
                     RESET_RECOVERY, id="no-health-finding"),
    ],
)  # fmt: skip
def test_nothing_is_decided_where_the_inventory_does_not_let_gpunode(
    finding: Finding, health: Health
) -> None:
    assert decide([finding], health) == []


def test_the_probes_findings_name_their_gpu_as_nvidia_smi_takes_it() -> None:
    """A GPU reset acts on one GPU: the health judges give its bus id (recovery action,
    memory, XIDs), in nvidia-smi -i's form whatever form the driver or the log wrote."""
    gpu = {"index": 0, "pci_bus_id": "00000000:18:00.0", "recovery_action": 1,
           "remapped_rows": {"pending": True}}  # fmt: skip
    xid = {"pci": "0000:2a:00", "xid": 46, "message": "GPU timeout", "time": None}
    report = {"gpus": [gpu], "xid_events": {"events": [xid]}}
    found = {f.id: f.gpu for f in judge_health(report)}
    assert found["gpu.recovery_action:0"] == BUS
    assert found["gpu.row_remap_pending:0"] == BUS
    assert found["gpu.xid:46:0000:2a:00"] == OTHER_BUS
    assert [gpu_bus_id(text) for text in ("18:00.0", "0000:18:00", "bus 18", "")] == [
        BUS, BUS, "", "",
    ]  # fmt: skip


# --- when not ------------------------------------------------------------------------------


def test_a_finding_that_names_no_gpu_is_left_to_an_operator() -> None:
    (remedy,) = decide([health_finding(gpu="")])
    assert remedy.withheld == "the findings name no one GPU to reset"


def test_a_scheduled_node_is_reset_only_drained_and_idle() -> None:
    (remedy,) = decide([health_finding()], scheduled={"node-1": ["4711", "4712"]})
    assert remedy.withheld.startswith("jobs still run on the drained node (4711, 4712)")
    (remedy,) = decide([health_finding()], scheduled={"node-1": "the node takes jobs (idle)"})
    assert remedy.withheld == "the node takes jobs (idle)"
    (remedy,) = decide([health_finding()], scheduled={"node-1": []})
    assert remedy.withheld == ""


def test_past_the_rate_limit_a_node_is_left_to_a_person(tmp_path: Path) -> None:
    history = remedies.History(tmp_path / "history.json")
    done = remedies.Remedy("node-1", "reset_gpu", (BUS,), ("gpu.recovery_action:0",),
                           ("gpu.recovery_action",), outcome="done")  # fmt: skip
    history.record(done, NOW - 3600)
    (remedy,) = decide([health_finding()], history=history)
    assert remedy.withheld == (
        "1 remedies on this node in the last 24 h (health.action_limit 1): a fault that comes "
        "back needs a person"
    )
    # Another node's, or one older than the window, does not count.
    wide = Health(actions=RESET_RECOVERY.actions, action_limit=2)
    assert decide([health_finding()], wide, history=history)[0].withheld == ""
    assert decide([health_finding(host="node-2")], history=history)[0].withheld == ""
    history.entries[0]["at"] = NOW - 25 * 3600
    assert decide([health_finding()], history=history)[0].withheld == ""


# --- the history ---------------------------------------------------------------------------


def test_the_history_is_kept_between_checks_and_old_entries_go(tmp_path: Path) -> None:
    path = tmp_path / "state" / "remedies.json"
    history = remedies.History.load(path)
    assert history.entries == []
    done = remedies.Remedy("node-1", "reset_gpu", (BUS,), ("x",), ("gpu.recovery_action",),
                           outcome="done")  # fmt: skip
    history.record(done, NOW - 48 * 3600)
    history.record(done, NOW)
    history.save(keep_since=NOW - 24 * 3600)
    again = remedies.History.load(path)
    assert [entry["at"] for entry in again.entries] == [NOW]
    assert again.count("node-1", NOW - 60) == 1


@pytest.mark.parametrize("text", ["{", '{"version": 1}', '{"version": 9, "entries": []}',
                                  '{"version": 1, "entries": [{"at": 1}]}', "[]"])  # fmt: skip
def test_a_history_that_cannot_be_read_stops_every_remedy(tmp_path: Path, text: str) -> None:
    path = tmp_path / "remedies.json"
    path.write_text(text)
    with pytest.raises(remedies.HistoryError, match="no remedy is carried out"):
        remedies.History.load(path)


# --- carrying out --------------------------------------------------------------------------


def test_the_deploy_runs_for_the_node_alone_with_the_gpus_in_its_own_variable() -> None:
    seen: dict[str, Any] = {}

    def runner(argv: Any, env: Any) -> tuple[int, str]:
        seen.update(argv=list(argv), env=dict(env))
        return 0, "ok"

    (remedy,) = decide([health_finding(), health_finding(gpu=OTHER_BUS, id_="b")])
    done = remedies.carry_out(remedy, "inventories/prod.py", runner, python="python3")
    assert seen["argv"] == ["python3", "-m", "pyinfra", "-y", "inventories/prod.py",
                            "deploys/remedy.py", "--limit", "node-1"]  # fmt: skip
    assert seen["env"] == {"GPUNODE_REMEDY_GPUS": f"{BUS},{OTHER_BUS}"}
    assert done.outcome == "done"

    def failing(argv: Any, env: Any) -> tuple[int, str]:
        return 1, "--> Starting\n    [node-1] no GPU reset: processes use it: GPU 0\n"

    failed = remedies.carry_out(remedy, "inventories/prod.py", failing)
    assert failed.outcome.startswith("failed (pyinfra exit 1): --> Starting / [node-1] no GPU")
    with pytest.raises(ValueError):
        remedies.carry_out(remedies.Remedy("n", "reset_gpu", ("18:00.0; reboot",), (), ()),
                           "inv.py", runner)  # fmt: skip


def test_the_report_carries_each_remedy_in_json_and_prometheus() -> None:
    result = DriftResult(findings=[health_finding()], checked_hosts=["node-1"])
    assert "remedies" not in json.loads(render_json(result))
    (remedy,) = decide([health_finding()])
    withheld = remedies.Remedy("node-2", "reset_gpu", (), ("y",), ("gpu.recovery_action",),
                               withheld="the findings name no one GPU to reset")  # fmt: skip
    result.remedies = [
        remedies.replace(remedy, outcome="done").as_dict(), withheld.as_dict(),
    ]  # fmt: skip
    document = json.loads(render_json(result))
    assert document["remedies"][0] == {
        "host": "node-1", "action": "reset_gpu", "gpus": [BUS],
        "findings": ["gpu.recovery_action:0"], "failure_classes": ["gpu.recovery_action"],
        "withheld": "", "outcome": "done",
    }  # fmt: skip
    lines = render_prometheus(result).splitlines()
    assert ('gpunode_health_remedy{host="node-1",action="reset_gpu",'
            'failure_class="gpu.recovery_action",outcome="done"} 1') in lines  # fmt: skip
    assert ('gpunode_health_remedy{host="node-2",action="reset_gpu",'
            'failure_class="gpu.recovery_action",outcome="withheld"} 1') in lines  # fmt: skip


# --- on the node ---------------------------------------------------------------------------


def devices(pids: dict[str, list[int]], problems: dict[str, str] | None = None) -> dict:
    return {
        "state": "ok", "reason": "", "listing_problems": problems or {},
        "gpus": [{"index": i, "pci_bus_id": bus, "compute_pids": pids.get(bus, [])}
                 for i, bus in enumerate((BUS, OTHER_BUS))],
    }  # fmt: skip


def test_an_idle_gpu_is_reset_alone() -> None:
    commands, _ = commands_of(gpus_reset, {GpuDevices: devices({})}, gpus=[OTHER_BUS])
    assert commands == [f"nvidia-smi -r -i {OTHER_BUS}"]


@pytest.mark.parametrize(
    ("facts", "gpus", "why"),
    [
        pytest.param(devices({BUS: [4242]}), [BUS, OTHER_BUS],
                     f"processes use it: GPU 0 ({BUS}) by PIDs 4242", id="in-use"),
        pytest.param(devices({}, {"compute_apps": "nvidia-smi failed"}), [BUS],
                     "whether processes use the GPUs is unknown", id="processes-unknown"),
        pytest.param(devices({}), ["00000000:99:00.0"], "no GPU at 00000000:99:00.0",
                     id="no-such-gpu"),
        pytest.param({"state": "unreadable", "reason": "driver not loaded"}, [BUS],
                     "the GPUs cannot be read: driver not loaded", id="unreadable"),
    ],
)  # fmt: skip
def test_a_reset_that_would_end_running_work_or_miss_is_refused_before_any(
    facts: dict, gpus: list[str], why: str
) -> None:
    with pytest.raises(NodeRefused, match="no GPU reset") as refused:
        commands_of(gpus_reset, {GpuDevices: facts}, gpus=gpus)
    assert why in refused.value.reason


# --- the inventory -------------------------------------------------------------------------


def test_health_actions_name_known_classes_and_only_remedies_gpunode_carries_out() -> None:
    state, problems = build_desired_state(
        {"health": {"actions": {"gpu.recovery_action": "reset_gpu"}, "action_limit": 2}}
    )
    assert problems == [] and state.health.action_limit == 2
    for actions, words in [({"gpu.recovery_actions": "reset_gpu"}, "unknown failure class"),
                           ({"gpu.lost": "reboot"}, "not a remedy gpunode carries out"),
                           ({"gpu.lost": "reset_gpu\nreboot"}, "control character")]:  # fmt: skip
        _, problems = build_desired_state({"health": {"actions": actions}})
        assert len(problems) == 1 and words in problems[0].render("inv.py", "n"), problems


def test_a_run_that_cannot_start_is_a_failed_remedy_not_a_crash() -> None:
    code, words = remedies.pyinfra_runner(["/nonexistent/python3", "-m", "pyinfra"], {})
    assert code == 127 and "could not be started" in words

"""gpunode.scheduler: Slurm's commands as the interface runs them, and its output read."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gpunode.scheduler import (
    NodeStatus,
    SchedulerError,
    SlurmScheduler,
    gpunode_reason,
    parse_sinfo,
    shell_runner,
)


class Recorder:
    def __init__(self, answers: dict[str, tuple[int, str, str]] | None = None) -> None:
        self.calls: list[list[str]] = []
        self.answers = answers or {}

    def __call__(self, argv: Sequence[str]) -> tuple[int, str, str]:
        self.calls.append(list(argv))
        return self.answers.get(argv[0], (0, "", ""))


def test_sinfo_lists_each_node_once_with_its_state_and_reason() -> None:
    # sinfo -h -N -o '%N|%T|%E' lists a node once per partition it is in.
    report = parse_sinfo(
        [
            "lab-1|drained|gpunode: rollout r1",
            "lab-1|drained|gpunode: rollout r1",
            "lab-2|idle|none",
            "lab-3|draining*|bad fan, ticket 42",
            "lab-4|mixed~|reason | with a bar",
            "garbage",
            "lab 5|idle|none",
        ]
    )
    assert report.nodes == {
        "lab-1": NodeStatus("lab-1", "drained", "gpunode: rollout r1"),
        "lab-2": NodeStatus("lab-2", "idle", None),
        "lab-3": NodeStatus("lab-3", "draining", "bad fan, ticket 42", responding=False),
        "lab-4": NodeStatus("lab-4", "mixed", "reason | with a bar"),
    }
    assert report.problems == ["line 6: 'garbage'", "line 7: 'lab 5|idle|none'"]
    assert report.nodes["lab-1"].drained_by_gpunode
    assert report.nodes["lab-3"].drained and not report.nodes["lab-3"].drained_by_gpunode
    assert not report.nodes["lab-2"].drained


def test_drain_resume_and_jobs_are_slurms_own_commands() -> None:
    recorder = Recorder({"squeue": (0, "101\n102_3\n", "")})
    slurm = SlurmScheduler(recorder)
    slurm.drain("lab-1", gpunode_reason("rollout r1, batch 2"))
    slurm.resume("lab-1")
    assert slurm.running_jobs("lab-1") == ["101", "102_3"]
    assert recorder.calls == [
        ["scontrol", "update", "NodeName=lab-1", "State=DRAIN",
         "Reason=gpunode: rollout r1, batch 2"],
        ["scontrol", "update", "NodeName=lab-1", "State=RESUME"],
        ["squeue", "--noheader", "--nodelist", "lab-1", "--states",
         "RUNNING,COMPLETING,CONFIGURING,SUSPENDED", "--format", "%i"],
    ]  # fmt: skip


def test_status_asks_for_the_nodes_and_keeps_only_them() -> None:
    recorder = Recorder({"sinfo": (0, "lab-1|idle|none\nlab-9|idle|none\n", "")})
    report = SlurmScheduler(recorder).status(["lab-1", "lab-2"])
    assert recorder.calls == [
        ["sinfo", "--noheader", "--Node", "--nodes", "lab-1,lab-2", "--format", "%N|%T|%E"]
    ]
    assert list(report.nodes) == ["lab-1"]


@pytest.mark.parametrize("node", ["lab-1;reboot", "-x", "", "a" * 80])
def test_a_node_name_is_checked_before_anything_runs(node: str) -> None:
    recorder = Recorder()
    with pytest.raises(SchedulerError, match="not a node name"):
        SlurmScheduler(recorder).resume(node)
    assert recorder.calls == []


@pytest.mark.parametrize("reason", ["two\nlines", "a|b", "$(reboot)", "x" * 201])
def test_a_reason_slurm_or_sinfo_would_misread_is_refused(reason: str) -> None:
    recorder = Recorder()
    with pytest.raises(SchedulerError, match="drain reason"):
        SlurmScheduler(recorder).drain("lab-1", reason)
    assert recorder.calls == []


def test_a_failed_command_is_an_error_naming_it() -> None:
    answer = (1, "", "slurm_update error: Invalid node name specified\n")
    with pytest.raises(SchedulerError, match="scontrol update: exit status 1: slurm_update"):
        SlurmScheduler(Recorder({"scontrol": answer})).resume("lab-1")


def test_unreadable_job_ids_are_an_error_not_a_guess() -> None:
    slurm = SlurmScheduler(Recorder({"squeue": (0, "101\nnot-a-job\n", "")}))
    with pytest.raises(SchedulerError, match="unreadable job ids"):
        slurm.running_jobs("lab-1")


def test_the_shell_runner_quotes_every_word() -> None:
    seen: list[str] = []

    def execute(line: str) -> tuple[int, str, str]:
        seen.append(line)
        return 0, "", ""

    SlurmScheduler(shell_runner(execute)).drain("lab-1", gpunode_reason("rollout (r1)"))
    assert seen == ["scontrol update NodeName=lab-1 State=DRAIN 'Reason=gpunode: rollout (r1)'"]

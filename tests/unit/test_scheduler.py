"""gpunode.scheduler: Slurm's commands as the interface runs them, and its output read."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gpunode import scheduler
from gpunode.scheduler import (
    NodeStatus,
    SchedulerError,
    SlurmScheduler,
    gpunode_reason,
    parse_sinfo,
    shell_runner,
)

MARK = "gpunode-0123456789abcdef:"


def sinfo_output(*lines: str, mark: str = MARK) -> str:
    return "".join(f"{mark}{line}\n" for line in lines)


class Recorder:
    def __init__(self, answers: dict[str, tuple[int, str, str]] | None = None) -> None:
        self.calls: list[list[str]] = []
        self.answers = answers or {}

    def __call__(self, argv: Sequence[str]) -> tuple[int, str, str]:
        self.calls.append(list(argv))
        return self.answers.get(argv[0], (0, "", ""))


def test_sinfo_lists_each_node_once_with_its_state_and_reason() -> None:
    # sinfo -h -N -o '<mark>%N|%T|%E' lists a node once per partition it is in.
    report = parse_sinfo(
        sinfo_output(
            "lab-1|drained|gpunode: rollout r1",
            "lab-1|drained|gpunode: rollout r1",
            "lab-2|idle|none",
            "lab-3|draining*|bad fan, ticket 42",
            "lab-4|mixed~|reason | with a bar",
            "garbage",
            "lab 5|idle|none",
        ),
        MARK,
    )
    assert report.nodes == {
        "lab-1": NodeStatus("lab-1", "drained", "gpunode: rollout r1"),
        "lab-2": NodeStatus("lab-2", "idle", None),
        "lab-3": NodeStatus("lab-3", "draining", "bad fan, ticket 42", responding=False),
        "lab-4": NodeStatus("lab-4", "mixed", "reason | with a bar"),
    }
    assert report.problems == ["line 6: garbage", "line 7: lab 5|idle|none"]
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
    class Sinfo(Recorder):
        def __call__(self, argv: Sequence[str]) -> tuple[int, str, str]:
            self.calls.append(list(argv))
            mark = argv[-1].removesuffix("%N|%T|%E")
            return 0, sinfo_output("lab-1|idle|none", "lab-9|idle|none", mark=mark), ""

    recorder = Sinfo()
    report = SlurmScheduler(recorder).status(["lab-1", "lab-2"])
    [argv] = recorder.calls
    assert argv[:-1] == ["sinfo", "--noheader", "--Node", "--nodes", "lab-1,lab-2", "--format"]
    assert argv[-1].startswith("gpunode-") and argv[-1].endswith(":%N|%T|%E")
    assert list(report.nodes) == ["lab-1"]
    # A marker of its own for every call: a reason written before it cannot hold it.
    SlurmScheduler(recorder).status(["lab-1"])
    assert recorder.calls[0][-1] != recorder.calls[1][-1]
    assert scheduler.new_record_mark() != scheduler.new_record_mark()


class Sinfo(Recorder):
    """sinfo as Slurm runs it: each node's line in the format asked for, the marker included."""

    def __init__(self, *records: str) -> None:
        super().__init__()
        self.records = records

    def __call__(self, argv: Sequence[str]) -> tuple[int, str, str]:
        self.calls.append(list(argv))
        mark = argv[-1].removesuffix("%N|%T|%E")
        return 0, sinfo_output(*self.records, mark=mark), ""


@pytest.mark.parametrize(
    "separator",
    ["\n", "\r\n", "\u2028", "\u2029", "\x85", "\x1c", "\x1d", "\x1e", "\x0b", "\x0c"],
)
def test_a_reason_cannot_forge_a_line_of_sinfo(separator: str) -> None:
    # A person (or a tool) wrote a reason that, split on its separator, reads as records making
    # lab-3 (unknown to Slurm) an idle node and lab-2 (in truth DOWN) a node gpunode drained;
    # it may know an earlier call's marker, never this one's.
    earlier = "gpunode-ffffffffffffffff:"
    forged = separator.join(
        ["PSU fault", "lab-3|idle|none", f"{earlier}lab-2|drained|gpunode: rollout x"]
    )
    sinfo = Sinfo("lab-2|down|PSU fault, ticket 7", f"lab-1|down|{forged}")
    report = SlurmScheduler(sinfo).status(["lab-1", "lab-2", "lab-3"])
    assert set(report.nodes) == {"lab-1", "lab-2"}
    assert report.nodes["lab-2"] == NodeStatus("lab-2", "down", "PSU fault, ticket 7")
    lab1 = report.nodes["lab-1"]
    assert lab1.state == "down" and lab1.reason is not None
    # The reason is kept whole and cleaned: one line, no separator left in it.
    assert lab1.reason.startswith("PSU fault") and "lab-3|idle|none" in lab1.reason
    assert lab1.reason.isprintable()
    assert report.problems == []


def test_a_hostile_line_before_any_record_is_named_cleaned() -> None:
    report = parse_sinfo(f"\x1b]0;owned\x07lab-1|idle|none\n{MARK}lab-2|idle|none\n", MARK)
    assert list(report.nodes) == ["lab-2"]
    assert report.problems == ["line 1: \\x1b]0;owned\\x07lab-1|idle|none"]


def test_down_fail_and_someone_elses_drain_are_held_by_someone_else() -> None:
    held = parse_sinfo(
        sinfo_output(
            "a|down|PSU fault", "b|fail|memtest", "c|failing|ecc", "d|drained|ticket 9",
            "e|down*|Not responding", "f|drained|gpunode: rollout r1", "g|idle|none",
            "h|draining|gpunode: drift gpu.xid:79",
        ),
        MARK,
    ).nodes  # fmt: skip
    assert {name for name, node in held.items() if node.held_by_someone_else} == set("abcde")


def test_squeue_output_is_split_on_newlines_only() -> None:
    slurm = SlurmScheduler(Recorder({"squeue": (0, "101\u2028102\n", "")}))
    with pytest.raises(SchedulerError, match="unreadable job ids 101\\\\u2028102"):
        slurm.running_jobs("lab-1")


def test_a_scheduler_error_is_safe_to_print() -> None:
    answer = (1, "", "slurm_update error: \x1b[2J\x1b]0;owned\x07 node\u2028x\n")
    with pytest.raises(SchedulerError) as error:
        SlurmScheduler(Recorder({"scontrol": answer})).resume("lab-1")
    assert str(error.value).isprintable() and "\\x1b[2J" in str(error.value)


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

"""Node output costs the control side time in proportion to its size, and its size is capped.

No test here measures time. Instead: every regex the control side applies to node output is
checked statically (its parse tree) for the constructs that backtrack super-linearly, the
long-blank ibstat line of the issue parses with its rate unreadable and the rest kept, and
the line and output caps hold.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import re
import re._constants as sre_constants  # type: ignore[import-not-found]
import re._parser as sre_parse  # type: ignore[import-not-found]
from types import ModuleType
from typing import Any, ClassVar

import pytest
from pyinfra.api import FactBase

import facts.batch
import facts.fabric
import facts.gpu
import facts.hardware
import gpunode.framing
import gpunode.probe.gpu_probe
import gpunode.probe.gpu_record
import gpunode.probe.parsers
from facts.batch import FactBatch
from facts.hardware import InfinibandPorts
from gpunode import framing
from gpunode.probe.gpu_probe import MAX_LINE_CHARS, parse_nvlink_status, parse_xid_events
from gpunode.probe.parsers import (
    MAX_OUTPUT_CHARS,
    parse_ib_flaps,
    parse_ibstat,
    parse_page_retirement,
    parse_query_text,
    parse_section,
)

from .test_parsers import read, section_output

CONTROL_SIDE_MODULES = [
    gpunode.probe.parsers,
    gpunode.probe.gpu_probe,
    gpunode.probe.gpu_record,
    facts.gpu,
    facts.fabric,
    facts.hardware,
    facts.batch,
    gpunode.framing,
]

# --- a static check of the patterns -----------------------------------------------------------

ALPHABET = [chr(code) for code in range(0x180)] + ["\u00a0", "\u2028", "\u3000", "\u0660"]
CATEGORIES = {
    sre_constants.CATEGORY_DIGIT: r"\d",
    sre_constants.CATEGORY_NOT_DIGIT: r"\D",
    sre_constants.CATEGORY_SPACE: r"\s",
    sre_constants.CATEGORY_NOT_SPACE: r"\S",
    sre_constants.CATEGORY_WORD: r"\w",
    sre_constants.CATEGORY_NOT_WORD: r"\W",
}
REPEATS = {sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, sre_constants.POSSESSIVE_REPEAT}


def _category(code: Any) -> set[str]:
    return {c for c in ALPHABET if re.fullmatch(CATEGORIES[code], c)}


def _class(items: list[tuple[Any, Any]]) -> set[str]:
    chars: set[str] = set()
    negate = False
    for op, av in items:
        if op is sre_constants.NEGATE:
            negate = True
        elif op is sre_constants.LITERAL:
            chars.add(chr(av))
        elif op is sre_constants.RANGE:
            chars |= {c for c in ALPHABET if av[0] <= ord(c) <= av[1]}
        elif op is sre_constants.CATEGORY:
            chars |= _category(av)
    return set(ALPHABET) - chars if negate else chars


def chars_of(items: Any) -> set[str]:
    """Every character any item of ``items`` can match (an over-approximation for groups)."""
    chars: set[str] = set()
    for op, av in items:
        if op is sre_constants.LITERAL:
            chars.add(chr(av))
        elif op is sre_constants.NOT_LITERAL:
            chars |= set(ALPHABET) - {chr(av)}
        elif op is sre_constants.ANY:
            chars |= set(ALPHABET) - {"\n"}
        elif op is sre_constants.IN:
            chars |= _class(av)
        elif op is sre_constants.CATEGORY:
            chars |= _category(av)
        elif op in REPEATS:
            chars |= chars_of(av[2])
        elif op is sre_constants.SUBPATTERN:
            chars |= chars_of(av[-1])
        elif op is sre_constants.BRANCH:
            for branch in av[1]:
                chars |= chars_of(branch)
    return chars


def _unbounded(item: tuple[Any, Any]) -> bool:
    op, av = item
    return op in REPEATS and av[1] == sre_constants.MAXREPEAT


def _flat(items: Any) -> list[tuple[Any, Any]]:
    """A sequence with its groups opened: ``(\\S.*?)\\s+`` is ``\\S``, ``.*?``, ``\\s+``."""
    flat = []
    for op, av in items:
        if op is sre_constants.SUBPATTERN:
            flat += _flat(av[-1])
        else:
            flat.append((op, av))
    return flat


def _sequences(items: Any) -> list[list[tuple[Any, Any]]]:
    """``items`` and every sequence nested in it (repeat bodies, alternatives)."""
    found = [_flat(items)]
    for op, av in items:
        if op in REPEATS:
            found += _sequences(av[2])
        elif op is sre_constants.SUBPATTERN:
            found += _sequences(av[-1])[1:]
        elif op is sre_constants.BRANCH:
            for branch in av[1]:
                found += _sequences(branch)
    return found


def backtracking_risks(pattern: str) -> list[str]:
    """Constructs that let a backtracking engine take super-linear time:

    - an unbounded repeat inside an unbounded repeat (``(a+)+``);
    - two unbounded repeats in one sequence that can match the same character, where the
      first could also match everything between them (``(.*?)\\s*``, ``\\S.*?\\s+:``,
      ``.*x.*``): every split of a long run between the two is tried.
    """
    risks = []
    for sequence in _sequences(sre_parse.parse(pattern)):
        for position, item in enumerate(sequence):
            if not _unbounded(item):
                continue
            body = item[1][2]
            if any(_unbounded(inner) for inner in itertools.chain(*_sequences(body))):
                risks.append(f"nested unbounded repeats at item {position}")
            own = chars_of([item])
            for later in range(position + 1, len(sequence)):
                other = sequence[later]
                if _unbounded(other) and own & chars_of([other]):
                    risks.append(f"items {position} and {later} split the same characters")
                    break
                if not chars_of([other]) <= own:
                    break
    return risks


def patterns_in(module: ModuleType) -> list[str]:
    """Every regex the module's code names: compiled at module level or passed to re.*."""
    found = [
        value.pattern
        for value in vars(module).values()
        if isinstance(value, re.Pattern) and isinstance(value.pattern, str)
    ]
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "re"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append(node.args[0].value)
    return found


@pytest.mark.parametrize(
    "pattern",
    [
        r"(\t{1,2})([A-Za-z][A-Za-z ]*): ?(.*?)\s*",  # ibstat's field pattern before
        r"( *)(\S.*?)\s+: ?(.*?)\s*",  # nvidia-smi -q value lines before
        r"( *)(\S.*?)\s*",
        r"\s*Link (\d+): (.*?)\s*",
        r"(a+)+b",
        r"x.*=.*;",
    ],
)
def test_the_static_check_sees_the_patterns_that_were_quadratic(pattern: str) -> None:
    assert backtracking_risks(pattern)


@pytest.mark.parametrize("module", CONTROL_SIDE_MODULES, ids=lambda module: module.__name__)
def test_no_control_side_pattern_can_backtrack_super_linearly(module: ModuleType) -> None:
    patterns = patterns_in(module)
    risky = {pattern: backtracking_risks(pattern) for pattern in patterns}
    assert {pattern: risks for pattern, risks in risky.items() if risks} == {}


def test_the_modules_patterns_are_all_seen() -> None:
    # The AST scan finds inline patterns too, so a new inline regex is checked like the rest.
    assert r"[0-9]+" in patterns_in(gpunode.probe.parsers)
    assert gpunode.probe.parsers._IBSTAT_KEY.pattern in patterns_in(gpunode.probe.parsers)


# --- the issue's ibstat line, and the caps ----------------------------------------------------

LONG_RATE = "\t\tRate: a" + " " * 32000 + "b"
IBSTAT = "ibstat/ibstat.47.0.h100.all.active.0"


def test_a_long_blank_run_in_an_ibstat_value_leaves_the_rate_unreadable_and_the_rest() -> None:
    text = read(IBSTAT)
    lines = text.splitlines()
    rate_line = next(n for n, line in enumerate(lines) if line.startswith("\t\tRate:"))
    lines[rate_line] = LONG_RATE
    result = parse_ibstat("\n".join(lines) + "\n")
    assert result["state"] == "ok"
    first = result["ports"][0]
    assert first["rate"] is None
    assert first["unreadable"] == {
        "rate": f"line {rate_line + 1} is {len(LONG_RATE)} characters long "
        f"(over {MAX_LINE_CHARS}): not read"
    }
    assert (first["state"], first["physical_state"], first["link_layer"]) == (
        "Active",
        "LinkUp",
        "Ethernet",
    )
    untouched = parse_ibstat(text)["ports"]
    assert result["ports"][1:] == untouched[1:]
    assert {key: value for key, value in first.items() if key not in ("rate", "unreadable")} == {
        key: value for key, value in untouched[0].items() if key != "rate"
    }


def test_the_ibstat_field_regex_never_sees_more_than_the_line_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[int] = []
    key = gpunode.probe.parsers._IBSTAT_KEY

    class Watching:
        def fullmatch(self, text: str) -> Any:
            seen.append(len(text))
            return key.fullmatch(text)

    monkeypatch.setattr(gpunode.probe.parsers, "_IBSTAT_KEY", Watching())
    text = read(IBSTAT).replace("\t\tRate: 400", LONG_RATE, 1)
    assert parse_ibstat(text)["state"] == "ok"
    assert seen and max(seen) <= MAX_LINE_CHARS


def test_a_rate_that_is_not_a_number_is_unreadable_not_text() -> None:
    text = read(IBSTAT).replace("\t\tRate: 400", "\t\tRate: fast", 1)
    port = parse_ibstat(text)["ports"][0]
    assert port["rate"] is None
    assert port["unreadable"] == {"rate": "'fast' is not a rate in Gb/s"}


def test_the_issue_ibstat_line_through_the_fact_keeps_the_port() -> None:
    text = read(IBSTAT).replace("\t\tRate: 400", LONG_RATE, 1)
    result = InfinibandPorts().process(section_output(text.splitlines()))
    assert result["state"] == "ok"
    assert result["ports"][0]["rate"] is None


def test_long_blank_runs_in_nvidia_smi_query_text_read_as_before() -> None:
    _, gpus = parse_query_text(
        "GPU 00000000:18:00.0\n    Retired Pages\n"
        f"        Single Bit ECC{' ' * 20000}: 2{' ' * 20000}\n"
        f"        Pending Page Blacklist{' ' * 3}:{' ' * 20000}\n"
    )
    assert gpus == [
        (
            "00000000:18:00.0",
            {"Retired Pages": {"Single Bit ECC": "2", "Pending Page Blacklist": ""}},
        )
    ]


def test_an_over_long_nvidia_smi_query_line_is_named_unreadable() -> None:
    text = read("page-retirement/orig_nvsmi8_output.txt") + "x" * (MAX_LINE_CHARS + 1) + "\n"
    result = parse_page_retirement(text)
    assert result["state"] == "unreadable"
    assert f"characters long (over {MAX_LINE_CHARS})" in result["reason"]


def test_an_over_long_nvlink_line_is_named_unreadable() -> None:
    long_line = "\t Link 0: " + " " * 10000 + "x GB/s"
    result = parse_nvlink_status(f"GPU 0: NVIDIA H100 (UUID: GPU-1)\n{long_line}\n")
    assert result["state"] == "unreadable"
    assert f"line 2 is {len(long_line)} characters long" in result["reason"]


def test_long_blank_runs_in_nvlink_lines_read_as_before() -> None:
    text = "GPU 0: NVIDIA H100 (UUID: GPU-1)\n\t Link 0: 26.562 GB/s" + " " * 4000 + "\n"
    (gpu,) = parse_nvlink_status(text)["gpus"]
    assert (gpu["uuid"], gpu["active"], gpu["links"][0]["speed_gbps"]) == ("GPU-1", 1, 26.562)


def test_an_over_long_kernel_line_is_read_by_its_head() -> None:
    line = "2026-01-01T00:00:00+0000 node kernel: NVRM: Xid (PCI:0000:18:00): 79, " + "x" * 90000
    (event,) = parse_xid_events(line + "\n")["events"]
    assert (event["xid"], event["pci"]) == (79, "0000:18:00")
    assert len(event["message"]) < MAX_LINE_CHARS


def test_an_over_long_syslog_line_is_read_by_its_head() -> None:
    line = "Jan  1 00:00:00 node systemd-networkd[1]: ib0: Lost carrier" + " " * 90000
    assert parse_ib_flaps(line + "\n")["unparsed_lines"] == 0


def test_section_output_over_the_total_cap_is_unreadable() -> None:
    lines = section_output(["x" * 1000] * (MAX_OUTPUT_CHARS // 1000 + 1))
    result = parse_section("ibstat", lines)
    assert result["state"] == "unreadable"
    assert f"(over {MAX_OUTPUT_CHARS})" in result["reason"]


class Echo(FactBatch):
    from facts.node import NodeState

    FACTS: ClassVar[dict[str, Any]] = {"ib": InfinibandPorts, "gpu": NodeState.FACTS["gpu"]}


def test_a_batch_section_with_an_over_long_line_is_unreadable_and_the_others_read() -> None:
    ibstat = section_output(read(IBSTAT).splitlines())
    output = framing.output_of(
        # The GPU probe is a part of the batch's own (FactBatch runs a fact's parts itself).
        {"ib": ibstat, "gpu.python3": ["{" + " " * (facts.batch.MAX_LINE_CHARS + 1)]}
    )
    values = Echo().process(output)
    assert values["ib"]["state"] == "ok"
    assert values["gpu"]["state"] == "unreadable"
    assert f"over {facts.batch.MAX_LINE_CHARS}" in values["gpu"]["reason"]
    assert values["complete"] is True


def test_a_batch_past_the_total_cap_is_unreadable_from_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(facts.batch, "MAX_OUTPUT_CHARS", 10_000)
    ibstat = section_output(read(IBSTAT).splitlines())
    output = framing.output_of({"ib": ibstat, "gpu.python3": ["x" * 1000] * 20})
    values = Echo().process(output)
    assert values["ib"]["state"] == "ok"
    assert values["gpu"]["state"] == "unreadable"
    assert "passed 10000 characters" in values["gpu"]["reason"]


class NeedsMissingTool(FactBase[dict[str, Any]]):
    requires_command = "gpunode-no-such-tool"

    def command(self) -> str:
        return "gpunode-no-such-tool --list"

    @staticmethod
    def default() -> dict[str, Any]:
        return {"state": "absent"}


class Exits(FactBase[list[str]]):
    def command(self) -> str:
        return "echo 'Failed to connect' >&2; echo half; exit 4"


class Says(FactBase[list[str]]):
    def command(self) -> str:
        return "echo said; echo noise >&2"

    def process(self, output: list[str]) -> list[str]:  # type: ignore[override]
        return list(output)


class Mixed(FactBatch):
    FACTS: ClassVar[dict[str, Any]] = {"missing": NeedsMissingTool, "exits": Exits, "says": Says}


def test_a_batch_reads_each_fact_as_pyinfra_would_alone() -> None:
    import subprocess

    done = subprocess.run(["sh", "-c", Mixed().command()], capture_output=True, text=True)
    values = Mixed().process(done.stdout.splitlines())
    assert values["missing"] == {"state": "absent"}  # its default, as pyinfra gives it
    assert values["exits"] == {
        "state": "unreadable",
        "reason": "exits: exit status 4: Failed to connect",
    }
    assert values["says"] == ["said"]  # stdout only, as pyinfra hands it to process()
    assert values["complete"] is True


class Framed(FactBase[dict[str, Any]]):
    """A fact of framing parts, one of them Python, one run only after another."""

    def parts(self) -> list[framing.Part]:
        return [
            framing.Part("here", "[ -e /proc/self ]", python="import os, sys\nsys.exit(0)"),
            framing.Part("then", "echo kernel", after="here", python="print('kernel')"),
            framing.Part("fails", "echo why >&2; exit 2"),
        ]

    def command(self) -> str:
        return framing.command(self.parts())

    def process(self, output: list[str]) -> dict[str, Any]:  # type: ignore[override]
        frame = framing.parse(output, ["here", "then", "fails"])
        return {
            name: (part.lines, part.stderr, part.exit_status) for name, part in frame.parts.items()
        }


class WithFramed(FactBatch):
    FACTS: ClassVar[dict[str, Any]] = {"framed": Framed, "says": Says}


def test_a_batch_runs_a_facts_parts_as_its_own_and_hands_it_what_it_would_read_alone() -> None:
    import subprocess

    command = WithFramed().command()
    assert "part:framed.then" in command and command.count("python3 -I -S -") == 1
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    values = WithFramed().process(done.stdout.splitlines())
    alone = subprocess.run(["sh", "-c", Framed().command()], capture_output=True, text=True)
    assert values["framed"] == Framed().process(alone.stdout.splitlines())
    assert values["framed"]["then"] == (["kernel"], [], 0)
    assert values["framed"]["fails"] == ([], ["why"], 2)
    assert values["says"] == ["said"]


def test_a_facts_part_cut_short_in_a_batch_makes_that_fact_unreadable_alone() -> None:
    output = framing.output_of(
        {
            "framed.here": framing.PartOutput("framed.here", [], [], 0),
            "framed.then": framing.PartOutput("framed.then", ["ker"], [], None),
        },
        complete=False,
    )
    values = WithFramed().process(output)
    assert values["framed"]["state"] == "unreadable"
    assert values["framed"]["reason"].startswith("framed: then: cut short")
    assert values["says"]["state"] == "unreadable"  # never reached

"""Fuzzed input never breaks a parser: the answer is data, or unreadable with a reason.

Inputs: random text and bytes, every real capture cut at random points, the nvidia-smi XML
with random elements removed, random JSON for nvme-cli and the probe's report, and random
framed section output. "internal parser error" (a parser bug caught by its guard) fails too.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpunode.framing import PREFIX
from gpunode.probe.parsers import (
    SECTION_COMMANDS,
    parse_gpu_report,
    parse_ib_flaps,
    parse_ibstat,
    parse_nvidia_smi_xml,
    parse_nvlink_status,
    parse_nvme_list,
    parse_page_retirement,
    parse_section,
    parse_xid_events,
)
from gpunode.probe.query_text import parse_query_gpus
from gpunode.scheduler import SchedulerError, SlurmScheduler

from .test_parsers import FIXTURE_CASES, read

# 100 inputs for each of the 140 cases (14,000 in all): the suite's budget (issue 30) over the
# 200 it had; a parser guard that breaks on a cut or mangled capture shows within them.
FUZZ = settings(
    max_examples=100,
    deadline=None,
    database=None,  # no .hypothesis directory in the checkout
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
Parser = Callable[[str], dict[str, Any]]
PARSERS: dict[str, Parser] = {
    "nvidia_smi_xml": parse_nvidia_smi_xml,
    "nvlink": parse_nvlink_status,
    "page_retirement": parse_page_retirement,
    "ibstat": parse_ibstat,
    "nvme": parse_nvme_list,
    "xid": parse_xid_events,
    "ib_flaps": parse_ib_flaps,
    "gpu": parse_gpu_report,
    "query_gpus": parse_query_gpus,
}
STATES = {"ok", "unreadable", "absent", "driver_not_loaded"}


def check(result: Any) -> None:
    """The contract: a dict that says what it is, and why when it is not data."""
    assert isinstance(result, dict)
    assert result["state"] in STATES
    assert isinstance(result["command"], str) and result["command"]
    if result["state"] != "ok":
        assert isinstance(result["reason"], str) and result["reason"]
        assert not result["reason"].startswith("internal parser error"), result["reason"]
    json.dumps(result)  # what a fact returns must serialize


# Text with the characters these formats are made of, so that fuzzing reaches past line 1.
FORMAT_TEXT = st.lists(
    st.sampled_from([*"GPU 0:1.xX()<>/\t\n =-'\"{}[],AaLinkCAPort", "\n\t\t", "GPU ", "CA '"]),
    max_size=200,
).map("".join)


@pytest.mark.parametrize("name", list(PARSERS))
@FUZZ
@given(text=st.one_of(st.text(max_size=2000), FORMAT_TEXT))
def test_random_text(name: str, text: str) -> None:
    check(PARSERS[name](text))


@pytest.mark.parametrize("name", list(PARSERS))
@FUZZ
@given(data=st.binary(max_size=2000))
def test_random_bytes(name: str, data: bytes) -> None:
    # pyinfra hands facts text; a node's tool can print any bytes, decoded leniently.
    check(PARSERS[name](data.decode("utf-8", errors="replace")))
    check(PARSERS[name](data.decode("latin-1")))


CAPTURE_PARAMETERS = [
    pytest.param(relative, extract, parse, id=f"{relative}:{label}")
    for relative, cases in FIXTURE_CASES.items()
    for label, extract, parse in cases
]


@pytest.mark.parametrize(("relative", "extract", "parse"), CAPTURE_PARAMETERS)
@FUZZ
@given(cut=st.floats(min_value=0.0, max_value=1.0))
def test_truncated_real_captures(relative: str, extract: Any, parse: Parser, cut: float) -> None:
    text = extract(read(relative))
    check(parse(text[: int(len(text) * cut)]))


@pytest.mark.parametrize(("relative", "extract", "parse"), CAPTURE_PARAMETERS)
@FUZZ
@given(data=st.data())
def test_real_captures_with_a_line_dropped_or_mangled(
    relative: str, extract: Any, parse: Parser, data: st.DataObject
) -> None:
    lines = extract(read(relative)).splitlines()
    position = data.draw(st.integers(min_value=0, max_value=max(len(lines) - 1, 0)))
    replacement = data.draw(
        st.sampled_from(["", "garbage", "\t", "  : ", lines[position][:3] if lines else ""])
    )
    mangled = [*lines[:position], replacement, *lines[position + 1 :]]
    check(parse("\n".join(mangled)))


XML_CAPTURES = ["a100-sxm4-v12.xml", "tesla-t4.xml", "a10g.xml"]


@pytest.mark.parametrize("capture", XML_CAPTURES)
@FUZZ
@given(data=st.data())
def test_xml_with_elements_removed(capture: str, data: st.DataObject) -> None:
    root = ElementTree.fromstring(read(f"nvidia-smi-xml/{capture}"))
    parents = [(parent, child) for parent in root.iter() for child in parent]
    chosen = data.draw(st.sets(st.integers(min_value=0, max_value=len(parents) - 1), max_size=40))
    for index in sorted(chosen, reverse=True):
        parent, child = parents[index]
        if child in list(parent):
            parent.remove(child)
    result = parse_nvidia_smi_xml(ElementTree.tostring(root, encoding="unicode"))
    check(result)
    if result["state"] == "ok":
        assert len(result["gpus"]) == len(root.findall("gpu"))


@pytest.mark.parametrize("capture", XML_CAPTURES)
@FUZZ
@given(data=st.data())
def test_xml_with_values_replaced(capture: str, data: st.DataObject) -> None:
    root = ElementTree.fromstring(read(f"nvidia-smi-xml/{capture}"))
    leaves = [element for element in root.iter() if len(element) == 0]
    values = st.sampled_from(["N/A", "", "[Not Supported]", "-1", "1e9", "Active", "0x10", "nan"])
    for index in data.draw(
        st.sets(st.integers(min_value=0, max_value=len(leaves) - 1), max_size=60)
    ):
        leaves[index].text = data.draw(st.one_of(values, st.text(max_size=10)))
    check(parse_nvidia_smi_xml(ElementTree.tostring(root, encoding="unicode")))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=30,
)
NVME_DEVICE = st.dictionaries(
    st.sampled_from(
        ["DevicePath", "ModelNumber", "SerialNumber", "PhysicalSize", "NameSpace", "Firmware"]
    ),
    JSON_VALUES,
)


@FUZZ
@given(
    document=st.one_of(
        JSON_VALUES, st.fixed_dictionaries({"Devices": st.lists(NVME_DEVICE, max_size=4)})
    )
)
def test_random_nvme_json(document: Any) -> None:
    result = parse_nvme_list(json.dumps(document))
    check(result)
    if result["state"] == "ok":
        assert len(result["devices"]) == len(document["Devices"])


@FUZZ
@given(
    report=st.one_of(
        JSON_VALUES,
        st.fixed_dictionaries(
            {"schema": st.just("gpunode.gpu-report/1"), "state": JSON_VALUES, "gpus": JSON_VALUES},
            optional={"kernel_module": JSON_VALUES, "reason": JSON_VALUES},
        ),
    )
)
def test_random_probe_reports(report: Any) -> None:
    check(parse_gpu_report(json.dumps(report)))


TAG = f"{PREFIX}0123456789abcdef:"
PART_NAME = st.sampled_from(["ibstat", "nvme", "x", ""]) | st.text(max_size=8)
SECTION_LINE = st.one_of(
    st.text(max_size=60),
    st.builds(
        lambda name, n: f"{TAG}exit:{name}:{n}", PART_NAME, st.integers(min_value=-3, max_value=300)
    ),
    st.builds(lambda text: f"{TAG}stderr:{text}", st.text(max_size=30)),
    st.builds(lambda name: f"{TAG}absent:{name}", PART_NAME),
    st.builds(lambda name: f"{TAG}part:{name}", PART_NAME),
    st.builds(lambda text: f"{TAG}{text}", st.text(max_size=12)),
    st.just(f"{TAG}done"),
    st.just(f"{TAG}begin"),
)


@pytest.mark.parametrize("name", list(SECTION_COMMANDS))
@FUZZ
@given(lines=st.lists(SECTION_LINE, max_size=20), header=st.booleans())
def test_random_section_output(name: str, lines: list[str], header: bool) -> None:
    check(parse_section(name, [f"{TAG}begin", *lines] if header else lines))


# --- the scheduler's output (gpunode/scheduler.py), through its public interface ------------

ASKED = ("gpu-01", "gpu-02")
# What has forged or broken a line: every line boundary str.splitlines knows (sinfo ends its
# records with "\n" only), the separator, state suffixes, and a whole forged record.
SCHEDULER_TEXT = st.lists(
    st.one_of(
        st.sampled_from(
            [*"\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029|*~#!%$@^- \t\x00\x1b",
             "gpu-02|idle|", "gpu-01", "drained", "(null)", "none"]
        ),
        st.text(max_size=6),
    ),
    max_size=12,
).map("".join)  # fmt: skip
STATES_SEEN = st.sampled_from(["idle", "mixed", "allocated", "drained", "draining*", "down*"])


def runner_printing(stdout: str, code: int = 0) -> Any:
    def run(argv: Any) -> tuple[int, str, str]:
        return code, stdout, ""

    return run


@FUZZ
@given(text=st.one_of(st.text(max_size=400), SCHEDULER_TEXT), code=st.sampled_from([0, 1]))
def test_any_sinfo_output_is_a_report_or_a_scheduler_error(text: str, code: int) -> None:
    try:
        report = SlurmScheduler(runner_printing(text, code)).status(list(ASKED))
    except SchedulerError as error:
        assert code != 0 and str(error)
        return
    assert set(report.nodes) <= set(ASKED)
    for name, status in report.nodes.items():
        assert status.name == name and status.state
    assert all(isinstance(problem, str) for problem in report.problems)


@FUZZ
@given(
    reasons=st.lists(SCHEDULER_TEXT, min_size=1, max_size=2),
    states=st.lists(STATES_SEEN, min_size=2, max_size=2),
)
def test_a_drain_reason_never_forges_another_nodes_record(
    reasons: list[str], states: list[str]
) -> None:
    # sinfo prints a reason as it was stored, any text, "\n" included, after the call's own
    # record marker (the format's text before %N, as it was asked for).
    def sinfo(argv: Any) -> tuple[int, str, str]:
        mark = argv[-1].removesuffix("%N|%T|%E")
        records = [
            f"{mark}{ASKED[index]}|{states[index]}|{reason}" for index, reason in enumerate(reasons)
        ]
        return 0, "\n".join(records) + "\n", ""

    report = SlurmScheduler(sinfo).status(list(ASKED))
    printed = {ASKED[index]: states[index] for index in range(len(reasons))}
    assert set(report.nodes) == set(printed)
    for name, status in report.nodes.items():
        assert status.state == printed[name].rstrip("*")


@FUZZ
@given(text=st.one_of(st.text(max_size=300), SCHEDULER_TEXT))
def test_any_squeue_output_is_job_ids_or_a_scheduler_error(text: str) -> None:
    try:
        jobs = SlurmScheduler(runner_printing(text)).running_jobs(ASKED[0])
    except SchedulerError as error:
        assert "squeue" in str(error)
        return
    assert all(re.fullmatch(r"[0-9]+(_[0-9]+|\+[0-9]+)?", job) for job in jobs)

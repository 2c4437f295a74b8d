"""Node output nested deeper than any tool prints is refused where it enters, as a finding: never
a RecursionError that crashes a deploy's fact read, nor an "internal parser error".

Python's json and tomllib recurse once per level of nesting (a RecursionError past about a
thousand), and so does copy.deepcopy of the value (past about three hundred): the fact cache
copies every value it keeps.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from pyinfra.api import FactBase
from pyinfra.api.state import StateStage

from facts.audit import parse_summary
from facts.container_runtime import parse_containerd_config, parse_docker_config
from facts.malware_scan import parse_result
from gpunode import factcache
from gpunode.probe.parsers import parse_dcgm_diag, parse_gpu_report, parse_nvme_list

DEEP = 100_000


def deep_array(depth: int = DEEP) -> str:
    return "[" * depth + "]" * depth


def deep_object(key: str, depth: int = DEEP) -> str:
    return "{" + f'"{key}": ' + deep_array(depth) + "}"


@pytest.mark.parametrize(
    "parse",
    [parse_gpu_report, parse_nvme_list, parse_dcgm_diag],
    ids=["gpu-probe", "nvme-list", "dcgmi-diag"],
)
@pytest.mark.parametrize("depth", [DEEP, 900, 33])
def test_a_deep_tool_report_is_unreadable_naming_its_nesting(parse: Any, depth: int) -> None:
    result = parse(deep_object("Devices", depth))
    assert result["state"] == "unreadable"
    assert "nested deeper than 32 levels" in result["reason"]
    assert "internal parser error" not in result["reason"]


@pytest.mark.parametrize("depth", [DEEP, 900])
def test_a_deep_daemon_json_is_an_error_of_the_file_not_a_crash(depth: int) -> None:
    state = parse_docker_config(deep_object("default-runtime", depth))
    assert state["present"] is True
    assert "nested deeper than 32 levels" in state["error"]
    assert state["default_runtime"] is None


def test_a_deep_containerd_config_is_an_error_of_the_file_not_a_crash() -> None:
    state = parse_containerd_config("version = 2\nx = " + deep_array(5000) + "\n")
    assert state["present"] is True
    assert "nested too deep" in state["error"]


@pytest.mark.parametrize("depth", [5000, 200])
def test_a_deep_but_valid_toml_value_is_refused_before_anything_copies_it(depth: int) -> None:
    state = parse_containerd_config("version = 2\nx = " + deep_array(depth) + "\n")
    assert "nested" in state["error"]


@pytest.mark.parametrize("parse", [parse_result, parse_summary], ids=["malware-scan", "aide"])
def test_a_deep_audit_result_is_a_problem_of_the_file(parse: Any) -> None:
    fields, problems = parse(deep_object("infected"))
    assert fields == {}
    assert any("nested deeper than 32 levels" in problem for problem in problems), problems


class Deep(FactBase):
    def command(self) -> str:
        return "true"


def test_the_fact_cache_hands_back_a_value_too_deep_to_copy_and_keeps_none_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fact whose value nests deep (a parser of the node's output that kept the nesting)
    is returned as pyinfra read it: copying it to keep would raise RecursionError."""
    value: Any = []
    for _ in range(5000):
        value = [value]
    monkeypatch.setitem(
        factcache._installed, "_get_fact", SimpleNamespace(original=lambda *args: value)
    )
    monkeypatch.setattr(factcache, "_values", {})
    monkeypatch.setattr(factcache, "_asked", {})
    monkeypatch.setattr(factcache, "_prefetched", {"node-1"})
    monkeypatch.setattr(factcache.pyinfra_patches, "fact_arguments", lambda *args: ({}, {}))
    state = SimpleNamespace(current_stage=StateStage.Prepare, failed_hosts=[])
    host = SimpleNamespace(name="node-1")
    assert factcache._cached_get_fact(state, host, Deep) is value
    assert factcache._values == {"node-1": {}}
    shallow = {"a": [1, 2]}
    monkeypatch.setitem(
        factcache._installed, "_get_fact", SimpleNamespace(original=lambda *args: shallow)
    )
    monkeypatch.setattr(factcache, "_values", {})
    assert factcache._cached_get_fact(state, host, Deep) == shallow
    assert list(factcache._values["node-1"].values()) == [shallow]


def test_a_json_document_within_the_limit_still_reads() -> None:
    assert parse_docker_config(json.dumps({"default-runtime": "nvidia"}))["error"] is None

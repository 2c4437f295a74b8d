"""Cleaned node text is safe for every report, and cleaning is done once: again changes nothing."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpunode.sanitize as sanitize
from gpunode.sanitize import (
    CUT_MARK,
    MAX_DEPTH,
    TOO_DEEP,
    Int,
    ListOf,
    MapOf,
    Maybe,
    Record,
    Str,
    clean_text,
    clean_tree,
)

UNSAFE = {*map(chr, range(0x20)), *map(chr, range(0x7F, 0xA0)), "\u2028", "\u2029", "\u202e"}
# Any code point, lone surrogates included, with the unsafe ones drawn often.
ANY_TEXT = st.text(
    st.sampled_from(sorted(UNSAFE | {chr(0xD800), chr(0xDFFF), "\\", "x", " "}))
    | st.characters(exclude_categories=())
)


@settings(max_examples=500, deadline=None, database=None)
@given(text=ANY_TEXT, limit=st.integers(min_value=len(CUT_MARK), max_value=300))
def test_clean_text_is_safe_bounded_and_idempotent(text: str, limit: int) -> None:
    cleaned = clean_text(text, limit)
    assert not UNSAFE & set(cleaned)
    assert not any(0xD800 <= ord(c) <= 0xDFFF for c in cleaned)
    assert len(cleaned) <= limit
    assert clean_text(cleaned, limit) == cleaned
    cleaned.encode("utf-8")
    element = ElementTree.Element("e", value=cleaned)
    element.text = cleaned
    parsed = ElementTree.fromstring(ElementTree.tostring(element, encoding="unicode"))
    assert parsed.get("value") == cleaned
    assert len(cleaned.splitlines()) <= 1


def test_printable_text_is_unchanged() -> None:
    assert clean_text("NVIDIA H100 80GB HBM3 — ü ß 中") == "NVIDIA H100 80GB HBM3 — ü ß 中"


def test_controls_are_written_as_visible_escapes() -> None:
    assert clean_text("a\x1b[2J\nb\x00\x0b\t\ud800\u2028\x9b") == (
        "a\\x1b[2J\\nb\\x00\\x0b\\t\\ud800\\u2028\\x9b"
    )


def test_clean_tree_cleans_keys_and_values_and_stops_at_depth() -> None:
    tree = {"a\nb": ["x\x1b", ("y", 1, None, 2.5, True)], "n": {1: "z\x00"}}
    assert clean_tree(tree) == {"a\\nb": ["x\\x1b", ["y", 1, None, 2.5, True]], "n": {1: "z\\x00"}}
    deep: list = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    walked = clean_tree(deep)
    for _ in range(MAX_DEPTH):
        walked = walked[0]
    assert walked == TOO_DEEP
    json.dumps(clean_tree(deep))


def test_shapes_name_the_first_value_that_does_not_fit() -> None:
    shape = Record({"gpus": ListOf(Record({"count": Maybe(Int)})), "names": MapOf(Str)})
    assert shape.problem({"gpus": [{"count": 1}, {"count": None}], "names": {"a": "b"}}) is None
    assert shape.problem({"gpus": [{}, {"count": True}]}, "gpu") == (
        "gpu.gpus[1].count: True is not an integer"
    )
    assert shape.problem({"names": {"a": 3}}) == "names.a: 3 is not a string"
    assert shape.problem([]) == "the value: [] is not an object"


# --- JSON nested deeper than a reader walks ---------------------------------------------------


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_json_nested_up_to_the_limit_is_read_and_one_level_more_is_refused() -> None:
    assert sanitize.parse_json(nested(MAX_DEPTH)) is not None
    assert sanitize.parse_json('{"a": [1, {"b": []}]}') == {"a": [1, {"b": []}]}
    with pytest.raises(sanitize.NestedTooDeep, match=f"nested deeper than {MAX_DEPTH} levels"):
        sanitize.parse_json(nested(MAX_DEPTH + 1))


def test_json_nested_a_hundred_thousand_deep_is_refused_as_text_that_is_not_json() -> None:
    """Python's own parser raises RecursionError at about a thousand levels: a crash where a
    reader expects ValueError (what it catches for text that is not JSON)."""
    with pytest.raises(json.JSONDecodeError):
        sanitize.parse_json(nested(100_000))
    with pytest.raises(ValueError, match="nested deeper"):
        sanitize.parse_json('{"a":' * 100_000 + "1" + "}" * 100_000)


def test_brackets_inside_json_strings_do_not_count_as_nesting() -> None:
    text = json.dumps({"line": '[[[[\\" {{{{' + "]" * 50, "deep": "[" * 100})
    assert sanitize.parse_json(text) == json.loads(text)


def test_a_value_nested_deeper_than_the_limit_is_told_without_recursion() -> None:
    value: Any = []
    for _ in range(100_000):
        value = [value]
    assert sanitize.nested_deeper_than(value)
    assert sanitize.nested_deeper_than({"a": [{"b": 1}]}, 2)
    assert not sanitize.nested_deeper_than({"a": [{"b": 1}]}, 3)
    assert not sanitize.nested_deeper_than(json.loads(nested(MAX_DEPTH)))

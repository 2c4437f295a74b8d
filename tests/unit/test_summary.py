"""The end-of-run line that names the failed nodes."""

from __future__ import annotations

from gpunode.summary import summary_line


def test_nothing_failed_prints_nothing() -> None:
    assert summary_line([], 4, {}) is None


def test_failed_nodes_are_named_with_where_and_a_limit_to_rerun() -> None:
    line = summary_line(
        ["node-9", "node-2"],
        16,
        {"node-2": "at Base system | Package mirrors answer", "node-9": "could not connect: x"},
    )
    assert line == (
        "gpunode: 2 of 16 host(s) failed: node-2 (at Base system | Package mirrors answer); "
        "node-9 (could not connect: x). Re-run them with --limit node-2,node-9"
    )

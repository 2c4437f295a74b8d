"""tests/conftest.py: GPUNODE_TEST_SHUFFLE runs the test modules in an order drawn from a
seed, each module's tests as written, and the same seed gives the same order."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.conftest import shuffle_seed, shuffled_by_module


@dataclass
class Item:
    nodeid: str


ITEMS = [
    Item(f"tests/unit/test_{module}.py::test_{index}")
    for module in ("a", "b", "c", "d", "e", "f")
    for index in range(3)
]


def modules_of(items: list[Item]) -> list[str]:
    return list(dict.fromkeys(item.nodeid.split("::")[0] for item in items))


def test_modules_move_together_and_keep_their_tests_in_order() -> None:
    shuffled = shuffled_by_module(ITEMS, seed=7)  # type: ignore[arg-type]
    assert sorted(shuffled, key=lambda item: item.nodeid) == ITEMS
    for module in modules_of(ITEMS):
        run = [item.nodeid for item in shuffled if item.nodeid.startswith(module)]
        assert run == [f"{module}::test_{index}" for index in range(3)]
    # each module's tests are next to each other
    assert len(modules_of(shuffled)) == 6


def test_a_seed_gives_one_order_and_seeds_give_others() -> None:
    orders = {tuple(modules_of(shuffled_by_module(ITEMS, seed))) for seed in range(20)}  # type: ignore[arg-type]
    assert len(orders) > 10
    assert shuffled_by_module(ITEMS, 3) == shuffled_by_module(list(ITEMS), 3)  # type: ignore[arg-type]


def test_the_seed_is_read_from_the_setting() -> None:
    assert shuffle_seed(None) is None and shuffle_seed("") is None
    assert shuffle_seed("1234") == 1234
    drawn = shuffle_seed("random")
    assert drawn is not None and drawn > 0
    with pytest.raises(pytest.UsageError, match="GPUNODE_TEST_SHUFFLE='x1': a seed"):
        shuffle_seed("x1")

"""What every tier of the suite shares: its test modules in a shuffled order, on request.

``GPUNODE_TEST_SHUFFLE=<seed>`` (or ``random``: a seed is drawn) runs the collected test
modules in an order drawn from that seed, each module's tests still in their written order (a
module-scoped fixture serves them in turn). The seed is printed in pytest's header, so that a
failure in one order can be run again in the same order. A module that passes only after
another one ran is relying on state it did not arrange: this is how it is found.
"""

from __future__ import annotations

import os
import random

import pytest

SHUFFLE = "GPUNODE_TEST_SHUFFLE"
_seed_key = pytest.StashKey[int | None]()


def shuffle_seed(value: str | None) -> int | None:
    """The seed ``GPUNODE_TEST_SHUFFLE`` asks for: None for no shuffle."""
    if value is None or value == "":
        return None
    if value == "random":
        return random.SystemRandom().randrange(1, 2**31)
    if not value.isdigit():
        raise pytest.UsageError(f"{SHUFFLE}={value!r}: a seed (digits) or 'random'")
    return int(value)


def shuffled_by_module(items: list[pytest.Item], seed: int) -> list[pytest.Item]:
    """``items`` with their modules in an order drawn from ``seed``; within a module, as
    written."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    order = sorted(modules)
    random.Random(seed).shuffle(order)
    return [item for module in order for item in modules[module]]


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_seed_key] = shuffle_seed(os.environ.get(SHUFFLE))


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = config.stash.get(_seed_key, None)
    if seed is None:
        return None
    return f"test modules shuffled: {SHUFFLE}={seed} runs them in this order again"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seed = config.stash.get(_seed_key, None)
    if seed is not None:
        items[:] = shuffled_by_module(items, seed)

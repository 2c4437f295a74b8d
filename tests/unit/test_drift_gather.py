"""The gatherer gives each host a deadline: one that stalls (in its login, its read, anywhere)
is not checked, with the reason, and every other host is still gathered; one whose answer is
refused (too much of it) is not checked, with the reader's reason.

Hosts here are stand-ins that never touch a network (the read is replaced); a stall is a
greenlet that sleeps, as a read waiting on a silent node does under gevent.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import gevent
import gevent.pool
import pytest

import gpunode.drift.gather as gather
from gpunode.remote_script import Limits, NodeOutputRefused

# Short, so that the stalled host's deadline passes soon; never asserted on.
SHORT = Limits(max_bytes=1 << 20, max_lines=1000, deadline_s=0.2)
# How long the test waits for the gatherer before calling it hung.
HUNG_AFTER_S = 60


class StandInHost:
    def __init__(self, name: str, stalls_in: str = "") -> None:
        self.name, self.groups = name, ["gpu"]
        self.stalls_in = stalls_in
        self.connected = False
        self.disconnected = False

    def connect(self, show_errors: bool = False, raise_exceptions: bool = True) -> None:
        if self.stalls_in == "connect":
            gevent.sleep(3600)
        self.connected = True

    def disconnect(self) -> None:
        self.connected = False
        self.disconnected = True


def read(state: Any, host: StandInHost, fact: Any, kwargs: Any, limits: Any = None) -> Any:
    if host.stalls_in == "read":
        gevent.sleep(3600)
    if host.name == "floods":
        raise NodeOutputRefused("answered more than 1048576 bytes or 1000 lines: stopped reading")
    return {"complete": True, "host": host.name}


@pytest.fixture
def gathered(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(gather, "read_fact", read)
    monkeypatch.setattr(gather, "CONNECT_GRACE_S", 0.1, raising=False)

    def run(hosts: list[StandInHost]) -> Any:
        state = SimpleNamespace(pool=gevent.pool.Pool(8))
        worker = gevent.spawn(gather.gather_fact, state, object, hosts, limits=SHORT)
        worker.join(timeout=HUNG_AFTER_S)
        assert worker.ready(), "the gatherer hung on a stalled host"
        return worker.get()

    return run


@pytest.mark.parametrize("stalls_in", ["connect", "read"])
def test_a_stalled_host_is_not_checked_and_the_others_are(gathered: Any, stalls_in: str) -> None:
    hosts = [StandInHost("node-1"), StandInHost("stalls", stalls_in), StandInHost("node-3")]
    values, unreachable = gathered(hosts)
    assert values == {name: {"complete": True, "host": name} for name in ("node-1", "node-3")}
    assert list(unreachable) == ["stalls"]
    assert unreachable["stalls"].startswith("no whole answer within")
    assert not any(host.connected for host in hosts)


def test_a_host_whose_answer_is_refused_is_not_checked_with_the_readers_reason(
    gathered: Any,
) -> None:
    values, unreachable = gathered([StandInHost("node-1"), StandInHost("floods")])
    assert list(values) == ["node-1"]
    assert unreachable == {
        "floods": "answered more than 1048576 bytes or 1000 lines: stopped reading"
    }


# bench/drift_memory.py (64 hosts, 2026-12-07): the check's own peak over 64 hosts that
# answer as a node does (97 MiB), and what one host's answer at the cap costs while it is
# decoded and parsed, the widest text it can be (the rest of the 274 MiB of that run).
CHECK_MIB = 100
ONE_HOST_DECODED_MIB = 60


def test_the_drift_units_memory_ceiling_holds_every_host_read_to_its_cap() -> None:
    """Every host read at once (make_state's parallelism) may hold its answer up to the cap
    while it is read; gevent decodes and parses one host at a time. The unit's MemoryMax must
    hold all of that, or a hostile fleet would have the check killed, blind."""
    import inspect

    from gpunode.expected.timers import DRIFT_MEMORY_MAX_MIB

    parallel = inspect.signature(gather.make_state).parameters["parallel"].default
    answers_mib = parallel * gather.HOST_LIMITS.max_bytes / (1 << 20)
    assert CHECK_MIB + answers_mib + ONE_HOST_DECODED_MIB <= DRIFT_MEMORY_MAX_MIB


@pytest.mark.parametrize("given", ["0", "-5", "abc", "nan", "90000"])
def test_a_host_timeout_that_is_no_positive_number_of_seconds_is_refused_naming_it(
    given: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpunode.cli import main

    assert main(["drift", "inventories/lab.py", "--host-timeout", given]) == 2  # a usage error
    assert f"--host-timeout: {given!r}: seconds" in capsys.readouterr().err


def test_a_host_timeout_reaches_the_check() -> None:
    from gpunode.cli import build_parser

    args = build_parser().parse_args(["drift", "inventories/lab.py", "--host-timeout", "90"])
    assert args.host_timeout == 90

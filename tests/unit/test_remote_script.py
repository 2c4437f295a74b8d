"""A node's answer is read as bytes, within bounds: a byte that is not UTF-8 is replaced and
the rest still read; a flood is cut while reading; a stall ends at the deadline.

The channel is a stand-in for paramiko's (the same methods, the bytes a node would send);
the clock is a counter the wait advances, so no test waits for real time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from gpunode import pyinfra_patches, remote_script
from gpunode.remote_script import (
    CHUNK_BYTES,
    Limits,
    NodeOutputRefused,
    read_channel,
    run,
)

LIMITS = Limits(max_bytes=1 << 20, max_lines=10_000, deadline_s=60)


class FakeChannel:
    """What a paramiko channel running a command shows its reader: ``sent`` is a stream of
    (stream name, bytes) the node writes; ``ends``: whether it then exits (with ``status``)."""

    def __init__(
        self, sent: Iterator[tuple[str, bytes]] | list[tuple[str, bytes]], ends: bool = True,
        status: int = 0,
    ) -> None:  # fmt: skip
        self.sent = iter(sent)
        self.ends = ends
        self.status = status
        self.pending: tuple[str, bytes] | None = None
        self.handed_out = 0
        self.stdin = b""
        self.stdin_closed = False
        self.eof_received = False
        self.closed = False
        self.status_event = threading.Event()
        self._advance()

    def _advance(self) -> None:
        self.pending = next(self.sent, None)
        if self.pending is None and self.ends:
            self.eof_received = True
            self.status_event.set()

    def settimeout(self, timeout: float) -> None:
        pass

    def sendall(self, data: bytes) -> None:
        self.stdin += data

    def shutdown_write(self) -> None:
        self.stdin_closed = True

    def recv_ready(self) -> bool:
        return self.pending is not None and self.pending[0] == "stdout"

    def recv_stderr_ready(self) -> bool:
        return self.pending is not None and self.pending[0] == "stderr"

    def _take(self, size: int) -> bytes:
        assert self.pending is not None
        stream, data = self.pending
        taken, rest = data[:size], data[size:]
        self.handed_out += len(taken)
        if rest:
            self.pending = (stream, rest)
        else:
            self._advance()
        return taken

    def recv(self, size: int) -> bytes:
        return self._take(size)

    def recv_stderr(self, size: int) -> bytes:
        return self._take(size)

    def exit_status_ready(self) -> bool:
        return self.status_event.is_set()

    def recv_exit_status(self) -> int:
        assert self.status_event.is_set(), "would wait for ever"
        return self.status

    def close(self) -> None:
        self.closed = True


class Clock:
    """Seconds that pass only when the reader waits."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits = 0

    def __call__(self) -> float:
        return self.now

    def wait(self, channel: Any, timeout: float) -> None:
        self.waits += 1
        self.now += timeout


def read(channel: FakeChannel, limits: Limits = LIMITS) -> Any:
    clock = Clock()
    return read_channel(channel, "script", limits, clock=clock, wait=clock.wait)


def test_a_byte_that_is_not_utf8_is_replaced_and_everything_after_it_is_read() -> None:
    channel = FakeChannel([
        ("stdout", b"first\nbad \xff byte"),
        ("stdout", b" then more\n" + b"line\n" * 1000),
        ("stderr", b"warn \xfe\n"),
        ("stdout", b"caf\xc3"),  # a character split between two reads is one character
        ("stdout", b"\xa9\nlast"),
    ])  # fmt: skip
    output = read(channel)
    assert output.stdout_lines == ["first", "bad \ufffd byte then more", *["line"] * 1000,
                                   "café", "last"]  # fmt: skip
    assert output.stderr_lines == ["warn \ufffd"]
    assert output.exit_status == 0
    assert channel.stdin == b"script\n" and channel.stdin_closed


def test_the_exit_status_comes_back() -> None:
    assert read(FakeChannel([("stdout", b"x\n")], status=3)).exit_status == 3


def endless(stream: str, data: bytes) -> Iterator[tuple[str, bytes]]:
    while True:
        yield stream, data


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_flood_is_refused_once_the_cap_is_read_and_no_more_is_read(stream: str) -> None:
    channel = FakeChannel(endless(stream, b"y" * 4096), ends=False)
    with pytest.raises(NodeOutputRefused, match=r"more than 1048576 bytes"):
        read(channel)
    assert channel.handed_out <= LIMITS.max_bytes + CHUNK_BYTES


def test_a_flood_of_short_lines_is_refused_at_the_line_cap() -> None:
    channel = FakeChannel(endless("stdout", b"\n" * 1000), ends=False)
    with pytest.raises(NodeOutputRefused, match=r"10000 lines"):
        read(channel)
    assert channel.handed_out <= LIMITS.max_lines + CHUNK_BYTES


def test_a_node_that_stalls_is_refused_at_the_deadline() -> None:
    channel = FakeChannel([("stdout", b"begin\n")], ends=False)
    with pytest.raises(NodeOutputRefused, match=r"no whole answer within 60 s"):
        read(channel)


def test_a_node_that_never_exits_after_its_eof_is_refused_at_the_deadline() -> None:
    channel = FakeChannel([("stdout", b"all\n")], ends=False)
    channel.eof_received = True  # output closed, no exit status ever
    with pytest.raises(NodeOutputRefused, match=r"no whole answer"):
        read(channel)


def test_output_at_the_caps_is_read_whole() -> None:
    limits = Limits(max_bytes=100 * 100, max_lines=100, deadline_s=60)
    channel = FakeChannel([("stdout", (b"x" * 99 + b"\n") * 10)] * 10)
    assert read(channel, limits).stdout_lines == ["x" * 99] * 100


def test_run_reads_the_channel_it_started_closes_it_and_prints_node_text_cleaned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    channel = FakeChannel([("stdout", b"\x1b]0;owned\x07 \xff\nfine\n")])
    started: list[Any] = []

    def exec_command(host: Any, command: Any, arguments: Any, timeout: Any = None) -> Any:
        started.append((command.get_raw_value(), arguments))
        return channel

    monkeypatch.setattr(pyinfra_patches, "exec_command", exec_command)
    echoed: list[str] = []  # pyinfra's echo: what its CLI prints (-vvv), a no-op elsewhere
    monkeypatch.setattr(remote_script, "echo", lambda message, **kwargs: echoed.append(message))
    host = SimpleNamespace(name="node-1", print_prefix="[node-1] ")
    output = run(host, "echo hi", {"_sudo": True}, LIMITS, print_output=True)
    assert output.stdout_lines == ["\x1b]0;owned\x07 \ufffd", "fine"]
    ((command, arguments),) = started
    assert command.startswith('eval "$(cat)"  # gpunode script sha256:')
    assert arguments == {"_sudo": True}
    assert channel.stdin == b"echo hi\n" and channel.closed
    printed = "\n".join(echoed)
    assert "\x1b" not in printed and "\x07" not in printed
    assert "[node-1] \\x1b]0;owned\\x07 \ufffd" in printed

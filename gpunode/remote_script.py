"""A long shell script run on a host from its standard input, its answer read with bounds.

sudo logs the whole command line of what it runs, cut in pieces of about a kilobyte: the
one-command fact batches (the drift check's ~100 kB, a deploy's ~50 kB) made one to two
hundred journal entries on every node at every run, and the node's journald and sudo
spent more CPU on them than the facts cost. Sent on stdin, the script leaves one short
line in sudo's log, naming it by its digest (-vv prints the script, as pyinfra prints a
fact's command).

The script is read whole (``$(cat)``) before any of it runs, so a program in it that reads
its standard input finds it at its end and never eats the rest of the script.

What the node sends back is untrusted, and ``run`` reads it so: as bytes, decoded as UTF-8,
each byte that is not UTF-8 replaced by U+FFFD (one bad byte is a problem of the text it is
in, for the facts' parsers to report, not a lost node), with ``Limits`` enforced while it
reads: past
``max_bytes`` or ``max_lines`` or ``deadline_s`` the channel is closed and
``NodeOutputRefused`` names why, so no node makes the control side hold unbounded output or
wait for ever. (pyinfra's own reader decodes each line strictly: a byte that is not UTF-8
killed it, left the rest of the output unread, and the node, its window full, never exited.)
"""

from __future__ import annotations

import hashlib
import select
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyinfra.api import StringCommand
from pyinfra.api.output import echo

from gpunode import pyinfra_patches
from gpunode.sanitize import MAX_REPORT_TEXT_CHARS, clean_text

# The shell reads all of stdin, then runs it; the digest in the comment is what sudo logs.
_RUNNER = 'eval "$(cat)"'
# What one read of the channel takes at most: paramiko's own window is 2 MiB.
CHUNK_BYTES = 1 << 16


def script_command(script: str) -> tuple[StringCommand, str]:
    """(the command to run, what to give it on stdin: ``_stdin``) for ``script``."""
    digest = hashlib.sha256(script.encode()).hexdigest()[:16]
    return StringCommand(f"{_RUNNER}  # gpunode script sha256:{digest}"), script


@dataclass(frozen=True)
class Limits:
    """How much of a node's answer is read (stdout and stderr together), and for how long."""

    max_bytes: int
    max_lines: int
    deadline_s: float


class NodeOutputRefused(RuntimeError):
    """The node's answer was not read whole: too much of it, or not all of it in time."""


@dataclass
class ScriptOutput:
    exit_status: int
    stdout_lines: list[str]
    stderr_lines: list[str]


def run(
    host: Any,
    script: str,
    connector_arguments: dict[str, Any],
    limits: Limits,
    print_input: bool = False,
    print_output: bool = False,
) -> ScriptOutput:
    """Run ``script`` on ``host`` (sent on stdin, with pyinfra's connector arguments: sudo,
    user...) and read its answer within ``limits``; raises NodeOutputRefused past them."""
    command, stdin = script_command(script)
    if print_input:
        echo(f"{host.print_prefix}>>> {command} <<< {script}", err=True)
    channel = pyinfra_patches.exec_command(
        host, command, connector_arguments, timeout=limits.deadline_s
    )
    if channel is None:
        output = _run_through_pyinfra(host, command, stdin, connector_arguments, limits)
    else:
        try:
            output = read_channel(channel, stdin, limits)
        finally:
            channel.close()
    if print_output:  # node text on the operator's terminal: cleaned, as in every report
        for line in output.stdout_lines:
            echo(f"{host.print_prefix}{clean_text(line, MAX_REPORT_TEXT_CHARS)}", err=True)
    return output


def _run_through_pyinfra(
    host: Any, command: StringCommand, stdin: str, arguments: dict[str, Any], limits: Limits
) -> ScriptOutput:
    """A host not reached over SSH (pyinfra's @local: the control host running a deploy of its
    own, trusted as this process is): pyinfra's reader, the limits checked after it."""
    arguments = {**arguments, "_stdin": stdin, "_timeout": max(1, round(limits.deadline_s))}
    try:
        ok, output = host.run_shell_command(command, **arguments)
    except TimeoutError:
        raise NodeOutputRefused(_late(limits)) from None
    stdout = output.stdout_lines if output else []
    stderr = output.stderr_lines if output else []
    lines = [*stdout, *stderr]
    if len(lines) > limits.max_lines or sum(len(line) + 1 for line in lines) > limits.max_bytes:
        raise NodeOutputRefused(_too_much(limits))
    return ScriptOutput(0 if ok else 1, stdout, stderr)


def _late(limits: Limits) -> str:
    return f"no whole answer within {limits.deadline_s:g} s: stopped waiting"


def _too_much(limits: Limits) -> str:
    return (
        f"answered more than {limits.max_bytes} bytes or {limits.max_lines} lines: stopped reading"
    )


def _wait(channel: Any, timeout: float) -> None:
    """Until ``channel`` has something to read, or ``timeout`` seconds (a paramiko channel's
    fileno() is readable while it holds stdout or stderr data, and for ever after its EOF:
    then the exit status is what is waited for)."""
    if channel.eof_received or channel.closed:
        channel.status_event.wait(timeout)
    else:
        select.select([channel], [], [], timeout)


def read_channel(
    channel: Any,
    stdin: str,
    limits: Limits,
    clock: Callable[[], float] = time.monotonic,
    wait: Callable[[Any, float], None] = _wait,
) -> ScriptOutput:
    """Send ``stdin`` to a channel running a command, read its stdout and stderr within
    ``limits`` and its exit status. Raises NodeOutputRefused past a limit (the caller closes
    the channel: nothing more is read)."""
    deadline = clock() + limits.deadline_s
    channel.settimeout(max(0.001, limits.deadline_s))
    data = stdin if stdin.endswith("\n") else stdin + "\n"  # as pyinfra's write_stdin sends it
    try:
        channel.sendall(data.encode())
        channel.shutdown_write()
    except TimeoutError:
        raise NodeOutputRefused(_late(limits)) from None
    stdout, stderr = bytearray(), bytearray()
    lines = 0

    def over() -> bool:
        return len(stdout) + len(stderr) > limits.max_bytes or lines > limits.max_lines

    while True:
        while not over() and channel.recv_stderr_ready():
            chunk = channel.recv_stderr(CHUNK_BYTES)
            stderr += chunk
            lines += chunk.count(b"\n")
        while not over() and channel.recv_ready():
            chunk = channel.recv(CHUNK_BYTES)
            stdout += chunk
            lines += chunk.count(b"\n")
        if over():
            raise NodeOutputRefused(_too_much(limits))
        done = channel.eof_received or channel.closed
        if done and channel.exit_status_ready():
            if not channel.recv_ready() and not channel.recv_stderr_ready():
                break
            continue
        remaining = deadline - clock()
        if remaining <= 0:
            raise NodeOutputRefused(_late(limits))
        wait(channel, remaining)
    return ScriptOutput(channel.recv_exit_status(), _lines(stdout), _lines(stderr))


def _lines(data: bytearray) -> list[str]:
    """Lines as pyinfra makes them (split at newlines, the last one's dropped), each byte that
    is not UTF-8 replaced by U+FFFD."""
    if not data:
        return []
    text = data.decode("utf-8", errors="replace")
    found = text.split("\n")
    if found[-1] == "":
        found.pop()
    return found

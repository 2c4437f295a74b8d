"""One exit-status contract for every gpunode command, and how an error reaches the operator.

A nightly job must tell "the fleet has a problem" (1) from "the job itself is broken" (2):
a missing inventory, invalid data or an unreadable file is never reported as drift.
"""

from __future__ import annotations

import json
import os
import sys

from gpunode.sanitize import clean_text

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command ended by Ctrl-C
EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE, as a shell reports `cat` after `| head` stopped reading

EXIT_STATUS = {
    EXIT_CLEAN: "clean: nothing found, every host done",
    EXIT_FINDINGS: "findings, or hosts that failed or could not be checked",
    EXIT_USAGE: "usage or configuration error, nothing changed (arguments, inventory path, "
    "invalid inventory data, a file that cannot be read or written)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C), locks released",
}


def epilog(own: dict[int, str] | None = None) -> str:
    """The contract as ``--help`` prints it; ``own``: a command's meanings in its place."""
    meanings = {**EXIT_STATUS, **(own or {})}
    return "exit status: " + "; ".join(f"{code} {text}" for code, text in sorted(meanings.items()))


class ConfigurationError(Exception):
    """What the operator must fix before a command can run (exit status 2): one line that
    names what is wrong and where."""


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``1 host``, ``2 hosts``, ``0 findings``."""
    return f"{count} {noun if count == 1 else (many or noun + 's')}"


def error_document(message: str, code: int) -> str:
    """The JSON document a ``--json`` command prints when it fails: stdout is a document
    whatever happened, so a reader of it never meets an empty or half-written stream."""
    return json.dumps({"error": message, "exit_code": code}, indent=2) + "\n"


def report_error(command: str, message: str, code: int, as_json: bool) -> int:
    """One line on stderr (and the JSON document on stdout with ``--json``); returns ``code``."""
    line = clean_text(message, 2000)
    print(f"{command}: {line}", file=sys.stderr)
    if as_json:
        sys.stdout.write(error_document(line, code))
    return code


def silence_stdout() -> None:
    """After the reader of stdout went away (``| head``): what is still buffered, and what
    Python flushes at exit, goes nowhere instead of ending in a BrokenPipeError traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)

"""A long shell script run on a host from its standard input, not from its command line.

sudo logs the whole command line of what it runs, cut in pieces of about a kilobyte: the
one-command fact batches (the drift check's ~100 kB, a deploy's ~50 kB) made one to two
hundred journal entries on every node at every run, and the node's journald and sudo
spent more CPU on them than the facts cost. Sent on stdin, the script leaves one short
line in sudo's log, naming it by its digest (-vv prints the script, as pyinfra prints a
fact's command).

The script is read whole (``$(cat)``) before any of it runs, so a program in it that reads
its standard input finds it at its end and never eats the rest of the script.
"""

from __future__ import annotations

import hashlib

from pyinfra.api import StringCommand

# The shell reads all of stdin, then runs it; the digest in the comment is what sudo logs.
_RUNNER = 'eval "$(cat)"'


def script_command(script: str) -> tuple[StringCommand, str]:
    """(the command to run, what to give it on stdin: ``_stdin``) for ``script``."""
    digest = hashlib.sha256(script.encode()).hexdigest()[:16]
    return StringCommand(f"{_RUNNER}  # gpunode script sha256:{digest}"), script

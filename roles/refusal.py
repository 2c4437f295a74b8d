"""Failing one host with a clear message, the way pyinfra fails a host: a command that fails.

An OperationError raised while pyinfra executes stops the whole run, every host with it; a
refusal that concerns one node (it is locked, its mirror is down) must fail that node alone
and let the others finish. So the refusal is the operation's one command: it prints the
message on stderr, where pyinfra shows it under the host's name, and exits non-zero.
"""

from __future__ import annotations

import shlex

from pyinfra.api import StringCommand

REFUSED_EXIT = 75  # EX_TEMPFAIL: nothing was done, try again once the cause is gone


def refusal(message: str) -> StringCommand:
    return StringCommand(f"echo {shlex.quote(message)} >&2; exit {REFUSED_EXIT}")

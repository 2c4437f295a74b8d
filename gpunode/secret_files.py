"""Secrets gpunode reads on the control host, held to the CA's rule (gpunode.pki): a file
that anyone but its owner may read or write is refused, naming the file, its mode and the fix,
never its content.

What is read this way: the cluster's MUNGE key (``slurm.munge_key_file``, roles/slurm.py),
the private key a deploy logs in with (``ssh_key``, read by roles/admin_users.py to prove
the deploy user keeps its login) and the drift check's key (``x_drift_ssh_key``,
deploys/drift_timer.py). The mode is read from the descriptor the content is read from, so
the file checked is the file read.
"""

from __future__ import annotations

import os
import stat


class SecretFileError(Exception):
    """A secret file that cannot be read, or may be read by others; the message says which."""


class SecretFileExposed(SecretFileError):
    """A secret file the group or others may read or write: refused, whatever reads it."""


def read_secret_file(path: str, setting: str, max_bytes: int) -> bytes:
    """Up to ``max_bytes + 1`` bytes of ``path`` (the caller checks the length), refused when
    the group or others have any access to it (``setting``: what named it, for the message)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        raise SecretFileError(f"{setting} {path}: {error.strerror}") from None
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise SecretFileError(f"{setting} {path}: not a regular file")
        if mode & 0o077:
            raise SecretFileExposed(
                f"{setting} {path} is readable by others (mode {stat.S_IMODE(mode):04o}); "
                f"chmod 600 {path}"
            )
        with os.fdopen(descriptor, "rb", closefd=False) as handle:
            return handle.read(max_bytes + 1)
    finally:
        os.close(descriptor)

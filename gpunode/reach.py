"""Proof that the control side can still get in: a brand-new SSH login to a host.

A change that could cut SSH (sshd config, firewall) is only kept once a *new* connection
succeeds; the connection pyinfra already holds proves nothing, since established sessions
survive both an sshd reload and a firewall that still allows established traffic.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import paramiko


def fresh_login(
    host: Any, port: int | None = None, timeout: float = 15.0, settle_s: float = 10.0
) -> str | None:
    """Log in to ``host`` anew, exactly as the deploy does, and run ``sudo -n true``.

    Returns None on success, else a one-line reason. ``port`` overrides the inventory's
    (the new sshd port, when that is what just changed). A refused connection is retried
    for ``settle_s`` seconds: sshd re-executes itself on reload and listens again shortly.
    """
    deadline = time.monotonic() + settle_s
    while True:
        error = _login_once(host, port, timeout)
        if error is None or "Unable to connect" not in error or time.monotonic() > deadline:
            return error
        time.sleep(0.5)


def _login_once(host: Any, port: int | None, timeout: float) -> str | None:
    data = host.data
    client = paramiko.SSHClient()
    known_hosts = data.get("ssh_known_hosts_file")
    with contextlib.suppress(FileNotFoundError):
        client.load_host_keys(os.path.expanduser(known_hosts or "~/.ssh/known_hosts"))
    if data.get("ssh_strict_host_key_checking") == "yes":
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    else:
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    key = data.get("ssh_key")
    address = data.get("ssh_hostname") or host.name
    try:
        client.connect(
            hostname=address,
            port=port or data.get("ssh_port") or 22,
            username=data.get("ssh_user"),
            key_filename=os.path.expanduser(key) if key else None,
            look_for_keys=not key,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
        )
        check = "sudo -n true" if data.get("_sudo") else "true"
        _, stdout, stderr = client.exec_command(check, timeout=timeout)
        status = stdout.channel.recv_exit_status()
        if status != 0:
            return f"logged in but `{check}` failed: {stderr.read().decode().strip()[:200]}"
        return None
    except (OSError, paramiko.SSHException) as error:
        return f"new SSH login to {address} failed: {type(error).__name__}: {error}"
    finally:
        client.close()

"""Proof that the control side can still get in: a brand-new SSH login to a host.

A change that could cut SSH (sshd config, firewall) is only kept once a *new* connection
succeeds; the connection pyinfra already holds proves nothing, since established sessions
survive both an sshd reload and a firewall that still allows established traffic.
"""

from __future__ import annotations

import contextlib
import os
import socket
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


# A node that stops answering (powered off, kernel hung, network cut) sends no reset: without
# this, a read on its connection waits for TCP's own give-up, about 15 minutes.
KEEPALIVE_S = 10
DEAD_AFTER_S = 45


def detect_dead_peer(
    host: Any, keepalive_s: int = KEEPALIVE_S, dead_after_s: int = DEAD_AFTER_S
) -> bool:
    """Make ``host``'s open SSH connection fail once the node has not acknowledged anything
    for ``dead_after_s`` seconds: SSH keepalives every ``keepalive_s`` seconds give TCP
    something to acknowledge, and TCP_USER_TIMEOUT aborts when it is not. Returns whether
    the connection could be set up so (False: not an SSH connection, nothing to do)."""
    client = getattr(getattr(host, "connector", None), "client", None)
    transport = client.get_transport() if client is not None else None
    if transport is None:
        return False
    transport.set_keepalive(keepalive_s)
    sock = transport.sock
    if not hasattr(sock, "setsockopt"):
        return False
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (
        ("TCP_KEEPIDLE", keepalive_s),
        ("TCP_KEEPINTVL", keepalive_s),
        ("TCP_USER_TIMEOUT", dead_after_s * 1000),
    ):
        if hasattr(socket, option):  # Linux; elsewhere the SSH keepalive alone remains
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    return True

"""mlkem768x25519-sha256 for paramiko: a real handshake over a socket pair, both ends paramiko.

Against OpenSSH 10 it is exercised by every integration test on a Debian 13 lab node.
"""

from __future__ import annotations

import hashlib
import socket
import threading
from typing import Any

import paramiko
import pytest

from gpunode import ssh_kex


class _Server(paramiko.ServerInterface):
    def get_allowed_auths(self, username: str) -> str:
        return "none"

    def check_auth_none(self, username: str) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, bytes]]:
    """(K, H) of every key exchange, as each end sets them (paramiko forgets K after use)."""
    seen: list[tuple[Any, bytes]] = []
    original = paramiko.Transport._set_K_H  # type: ignore[attr-defined]

    def recording(self: Any, k: Any, h: bytes) -> None:
        seen.append((k, h))
        original(self, k, h)

    monkeypatch.setattr(paramiko.Transport, "_set_K_H", recording)
    return seen


def handshake(kex: tuple[str, ...]) -> tuple[Any, Any]:
    """(client transport, server transport) after a handshake offering only ``kex``."""
    ssh_kex.install()
    left, right = socket.socketpair()
    server = paramiko.Transport(right)
    server.add_server_key(paramiko.RSAKey.generate(2048))
    server.get_security_options().kex = kex
    started = threading.Event()

    def serve() -> None:
        server.start_server(event=started, server=_Server())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = paramiko.Transport(left)
    client.get_security_options().kex = kex
    client.start_client(timeout=20)
    started.wait(20)
    return client, server


def test_both_ends_agree_on_keys_and_talk(secrets: list[tuple[Any, bytes]]) -> None:
    client, server = handshake((ssh_kex.NAME,))
    try:
        assert client.is_active() and server.is_active()
        (server_k, server_h), (client_k, client_h) = secrets  # one per end
        assert isinstance(client_k, ssh_kex.HybridSecret) and client_k == server_k
        assert client_h == server_h and len(client_h) == hashlib.sha256().digest_size
        client.auth_none("anyone")
        channel = client.open_session()
        accepted = server.accept(20)
        assert accepted is not None
        channel.sendall(b"over the hybrid keys")
        assert accepted.recv(64) == b"over the hybrid keys"
    finally:
        client.close()
        server.close()


def test_other_methods_still_use_an_mpint_secret(secrets: list[tuple[Any, bytes]]) -> None:
    client, server = handshake(("curve25519-sha256@libssh.org",))
    try:
        assert client.is_active() and [type(k) for k, _ in secrets] == [int, int]
        client.auth_none("anyone")
        assert client.is_authenticated()
    finally:
        client.close()
        server.close()


def test_the_method_is_offered_first_once() -> None:
    ssh_kex.install()
    ssh_kex.install()
    preferred = paramiko.Transport._preferred_kex  # type: ignore[attr-defined]
    assert preferred[0] == ssh_kex.NAME and preferred.count(ssh_kex.NAME) == 1


def test_k_is_a_string_in_the_exchange_hash() -> None:
    secret = ssh_kex.shared_secret(b"\x01" * 32, b"\x02" * 32)
    assert secret == hashlib.sha256(b"\x01" * 32 + b"\x02" * 32).digest()
    digest = ssh_kex.exchange_hash((b"V_C", b"V_S", b"I_C", b"I_S"), b"K_S", b"C", b"S", secret)
    framed = b"".join(
        len(part).to_bytes(4, "big") + part
        for part in (b"V_C", b"V_S", b"I_C", b"I_S", b"K_S", b"C", b"S", bytes(secret))
    )
    assert digest == hashlib.sha256(framed).digest()


def test_a_short_peer_value_is_refused() -> None:
    engine = ssh_kex.KexMlkem768X25519(transport=None)
    engine.transport = type("T", (), {"server_mode": True})()
    engine.x25519_key = ssh_kex.X25519PrivateKey.generate()
    message = paramiko.Message()
    message.add_string(b"short")
    message.rewind()
    with pytest.raises(paramiko.SSHException, match="client value of 5 bytes"):
        engine.parse_next(30, message)


def test_an_unsupported_paramiko_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ssh_kex.importlib.metadata, "version", lambda name: "9.9.9")
    with pytest.raises(ssh_kex.UnsupportedParamiko, match=r"paramiko 9\.9\.9 is installed"):
        ssh_kex.install()

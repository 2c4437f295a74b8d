"""The post-quantum key exchange mlkem768x25519-sha256, for paramiko (pyinfra's SSH client).

Debian 13's hardened sshd (ssh-audit's "Hardened Debian 13 (version 1)") offers post-quantum
hybrid key exchanges only: mlkem768x25519-sha256 and sntrup761x25519-sha512. paramiko 4.0
knows neither, so without this module pyinfra, the drift check and the sshd role's own
confirming login could not reach a hardened trixie node at all. ML-KEM-768 and X25519 come
from ``cryptography`` (FIPS 203 ML-KEM, cryptography >= 47); this module only frames them as
SSH does.

The method (draft-ietf-sshm-mlkem-hybrid-kex-03; OpenSSH 9.9 kexmlkem768x25519.c, read
2026-12-01), on the messages of ECDH key exchange (RFC 5656 section 4):

- client -> server SSH_MSG_KEX_ECDH_INIT: string C_INIT = ML-KEM-768 encapsulation key
  (1184 bytes) || client X25519 public key (32 bytes);
- server -> client SSH_MSG_KEX_ECDH_REPLY: string K_S (host key), string S_REPLY = ML-KEM-768
  ciphertext (1088 bytes) || server X25519 public key (32 bytes), string signature of H;
- K = SHA-256(ML-KEM shared secret || X25519 shared secret), encoded as a *string*, not an
  mpint, both in H = SHA-256(V_C || V_S || I_C || I_S || K_S || C_INIT || S_REPLY || K) and
  in the key derivation (RFC 4253 section 7.2).

paramiko derives keys with K as an mpint; for this method ``Transport._compute_key`` is
replaced by one that writes K as a string. That is paramiko's private API: ``install``
refuses a paramiko release it was not written for (SUPPORTED_PARAMIKO).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from typing import Any

import paramiko
from cryptography.hazmat.primitives import constant_time, serialization
from cryptography.hazmat.primitives.asymmetric import mlkem
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from paramiko.common import byte_chr
from paramiko.message import Message
from paramiko.ssh_exception import SSHException

NAME = "mlkem768x25519-sha256"
SUPPORTED_PARAMIKO = ("4.0.0",)
MLKEM768_PUBLIC = 1184
MLKEM768_CIPHERTEXT = 1088
X25519_PUBLIC = 32

_MSG_KEX_ECDH_INIT, _MSG_KEX_ECDH_REPLY = 30, 31


class HybridSecret(bytes):
    """K of a hybrid method: the 32-byte hash, written as an SSH string (not an mpint)."""


def _raw(key: X25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _x25519(private: X25519PrivateKey, peer: bytes) -> bytes:
    secret = private.exchange(X25519PublicKey.from_public_bytes(peer))
    if constant_time.bytes_eq(secret, b"\x00" * 32):
        raise SSHException("peer's X25519 public value has the wrong order")
    return secret


def shared_secret(mlkem_secret: bytes, x25519_secret: bytes) -> HybridSecret:
    return HybridSecret(hashlib.sha256(mlkem_secret + x25519_secret).digest())


def exchange_hash(
    versions_and_kexinits: tuple[bytes, bytes, bytes, bytes],
    host_key: bytes,
    client_init: bytes,
    server_reply: bytes,
    secret: HybridSecret,
) -> bytes:
    """H, from V_C, V_S, I_C, I_S (client's first), K_S, C_INIT, S_REPLY and K."""
    message = Message()
    message.add(*versions_and_kexinits)
    message.add_string(host_key)
    message.add_string(client_init)
    message.add_string(server_reply)
    message.add_string(bytes(secret))
    return hashlib.sha256(message.asbytes()).digest()


class KexMlkem768X25519:
    """paramiko key-exchange engine for mlkem768x25519-sha256 (client and server)."""

    hash_algo = hashlib.sha256

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.mlkem_key: mlkem.MLKEM768PrivateKey | None = None
        self.x25519_key: X25519PrivateKey | None = None

    def start_kex(self) -> None:
        self.x25519_key = X25519PrivateKey.generate()
        if self.transport.server_mode:
            self.transport._expect_packet(_MSG_KEX_ECDH_INIT)
            return
        self.mlkem_key = mlkem.MLKEM768PrivateKey.generate()
        message = Message()
        message.add_byte(byte_chr(_MSG_KEX_ECDH_INIT))
        message.add_string(self._client_init())
        self.transport._send_message(message)
        self.transport._expect_packet(_MSG_KEX_ECDH_REPLY)

    def _client_init(self) -> bytes:
        assert self.mlkem_key is not None and self.x25519_key is not None
        return self.mlkem_key.public_key().public_bytes_raw() + _raw(self.x25519_key.public_key())

    def parse_next(self, ptype: int, message: Message) -> None:
        if self.transport.server_mode and ptype == _MSG_KEX_ECDH_INIT:
            return self._server_reply(message)
        if not self.transport.server_mode and ptype == _MSG_KEX_ECDH_REPLY:
            return self._client_finish(message)
        raise SSHException(f"{NAME} asked to handle packet type {ptype}")

    def _server_reply(self, message: Message) -> None:
        assert self.x25519_key is not None
        client_init = message.get_string()
        if len(client_init) != MLKEM768_PUBLIC + X25519_PUBLIC:
            raise SSHException(f"{NAME}: client value of {len(client_init)} bytes")
        encapsulation_key = mlkem.MLKEM768PublicKey.from_public_bytes(client_init[:MLKEM768_PUBLIC])
        mlkem_secret, ciphertext = encapsulation_key.encapsulate()
        x25519_secret = _x25519(self.x25519_key, client_init[MLKEM768_PUBLIC:])
        server_reply = ciphertext + _raw(self.x25519_key.public_key())
        secret = shared_secret(mlkem_secret, x25519_secret)
        transport = self.transport
        host_key = transport.get_server_key().asbytes()
        digest = exchange_hash(
            (
                transport.remote_version,
                transport.local_version,
                transport.remote_kex_init,
                transport.local_kex_init,
            ),
            host_key,
            client_init,
            server_reply,
            secret,
        )
        transport._set_K_H(secret, digest)
        signature = transport.get_server_key().sign_ssh_data(digest, transport.host_key_type)
        reply = Message()
        reply.add_byte(byte_chr(_MSG_KEX_ECDH_REPLY))
        reply.add_string(host_key)
        reply.add_string(server_reply)
        reply.add_string(signature)
        transport._send_message(reply)
        transport._activate_outbound()

    def _client_finish(self, message: Message) -> None:
        assert self.mlkem_key is not None and self.x25519_key is not None
        host_key = message.get_string()
        server_reply = message.get_string()
        signature = message.get_binary()
        if len(server_reply) != MLKEM768_CIPHERTEXT + X25519_PUBLIC:
            raise SSHException(f"{NAME}: server value of {len(server_reply)} bytes")
        mlkem_secret = self.mlkem_key.decapsulate(server_reply[:MLKEM768_CIPHERTEXT])
        x25519_secret = _x25519(self.x25519_key, server_reply[MLKEM768_CIPHERTEXT:])
        secret = shared_secret(mlkem_secret, x25519_secret)
        transport = self.transport
        digest = exchange_hash(
            (
                transport.local_version,
                transport.remote_version,
                transport.local_kex_init,
                transport.remote_kex_init,
            ),
            host_key,
            self._client_init(),
            server_reply,
            secret,
        )
        transport._set_K_H(secret, digest)
        transport._verify_key(host_key, signature)
        transport._activate_outbound()


def _add_secret(message: Message, secret: Any) -> None:
    if isinstance(secret, HybridSecret):
        message.add_string(bytes(secret))
    else:
        message.add_mpint(secret)


def _compute_key(self: Any, id: str, nbytes: int) -> bytes:
    """paramiko 4.0's Transport._compute_key (RFC 4253 section 7.2), with K written as the
    method encodes it: a string for a hybrid method, an mpint for every other."""
    message = Message()
    _add_secret(message, self.K)
    message.add_bytes(self.H)
    message.add_byte(id.encode())
    message.add_bytes(self.session_id)
    hash_algo = getattr(self.kex_engine, "hash_algo", None) or hashlib.sha1
    out = sofar = hash_algo(message.asbytes()).digest()
    while len(out) < nbytes:
        message = Message()
        _add_secret(message, self.K)
        message.add_bytes(self.H)
        message.add_bytes(sofar)
        digest = hash_algo(message.asbytes()).digest()
        out += digest
        sofar += digest
    return out[:nbytes]


class UnsupportedParamiko(RuntimeError):
    """The installed paramiko is not one this module was written for."""


def installed() -> bool:
    """Whether paramiko offers the method (``install`` ran in this process)."""
    return NAME in paramiko.Transport._preferred_kex  # type: ignore[attr-defined]


def install() -> None:
    """paramiko offers mlkem768x25519-sha256 first, before its own methods (idempotent)."""
    version = importlib.metadata.version("paramiko")
    if version not in SUPPORTED_PARAMIKO:
        raise UnsupportedParamiko(
            f"paramiko {version} is installed; gpunode's {NAME} key exchange replaces "
            f"paramiko's private Transport._compute_key and was written for paramiko "
            f"{', '.join(SUPPORTED_PARAMIKO)}: check gpunode/ssh_kex.py against it"
        )
    transport: Any = paramiko.Transport  # its kex tables are private and untyped
    transport._kex_info[NAME] = KexMlkem768X25519
    if NAME not in transport._preferred_kex:
        transport._preferred_kex = (NAME, *transport._preferred_kex)
    transport._compute_key = _compute_key

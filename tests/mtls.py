"""Scraping an exporter over mutual TLS the way Prometheus does, and the ways it must fail.

Shared by the unit test that runs a real node_exporter with gpunode's web configuration and
the lab test that scrapes the nodes. Certificates come from gpunode's own CA code
(``gpunode.pki``); the "other CA" is made here with ``cryptography``.
"""

from __future__ import annotations

import base64
import datetime
import socket
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpunode import pki
from gpunode.model import Tls


@dataclass(frozen=True)
class ClientCertificate:
    certificate: Path
    key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def write_node_files(
    directory: Path, authority: pki.CertificateAuthority, address: str = "127.0.0.1"
) -> ec.EllipticCurvePrivateKey:
    """A node's TLS files as gpunode installs them, in ``directory``: node.crt (issued by
    ``authority`` for ``address``, for serving), node.key and ca.crt; returns the key."""
    key = ec.generate_private_key(ec.SECP256R1())
    wanted = pki.wanted_certificate(address, Tls(enabled=True))
    certificate = pki.issue_certificate(authority, key.public_key(), wanted)
    (directory / "node.crt").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    _write_key(directory / "node.key", key)
    (directory / "ca.crt").write_text(authority.certificate_pem)
    return key


def issue_client(
    authority: pki.CertificateAuthority,
    name: str,
    directory: Path,
    usage: pki.Usage = "client",
) -> ClientCertificate:
    """A certificate for ``name`` from ``authority`` with its key, written to ``directory``:
    as gpunode issues a monitoring host's scraper certificate (clientAuth only), or with
    ``usage="server"`` as it issues a node certificate, here presented as a client."""
    key = ec.generate_private_key(ec.SECP256R1())
    if usage == "server":  # what roles/tls.py asks for
        wanted = pki.wanted_certificate(name, Tls(enabled=True))
    else:
        wanted = pki.wanted_certificate(name, Tls(enabled=True), usage=usage)
    certificate = pki.issue_certificate(authority, key.public_key(), wanted)
    paths = ClientCertificate(directory / f"{name}.crt", directory / f"{name}.key")
    paths.certificate.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    _write_key(paths.key, key)
    return paths


def foreign_client(directory: Path) -> ClientCertificate:
    """A client certificate from a CA that is not gpunode's (self-made here)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Another CA")])
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "intruder")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = ClientCertificate(directory / "foreign.crt", directory / "foreign.key")
    paths.certificate.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    _write_key(paths.key, key)
    return paths


def client_context(
    ca_file: Path,
    client: ClientCertificate | None,
    maximum: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED,
) -> ssl.SSLContext:
    """Verifies the exporter against ``ca_file`` (gpunode's CA) and its name."""
    context = ssl.create_default_context(cafile=str(ca_file))
    context.maximum_version = maximum
    if client is not None:
        context.load_cert_chain(str(client.certificate), str(client.key))
    return context


def basic_auth_get(
    url: str, context: ssl.SSLContext | None, credentials: tuple[str, bytes] | None
) -> tuple[int | None, str]:
    """(HTTP status or None, body or why) of a GET of ``url``, as a web user with
    ``credentials`` (user, password) where given: a refusal is an answer, never an exception."""
    request = urllib.request.Request(url)
    if credentials is not None:
        token = base64.b64encode(credentials[0].encode() + b":" + credentials[1]).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as error:
        return None, repr(error)


@dataclass(frozen=True)
class Scrape:
    status: int | None  # None: no HTTP answer
    body: str
    error: str
    # The exporter's certificate serial number (hex, as ssl gives it); None without a handshake.
    peer_serial: str | None = None


def scrape(
    address: str,
    port: int,
    context: ssl.SSLContext,
    server_name: str | None = None,
    timeout: float = 10.0,
) -> Scrape:
    """GET /metrics from ``address``, verifying the exporter's certificate names
    ``server_name`` (default: the address), as Prometheus' ``tls_config.server_name`` does.

    A refused handshake or a connection the exporter closes is an answer (status None and
    why), never an exception.
    """
    name = server_name or address
    request = f"GET /metrics HTTP/1.0\r\nHost: {name}:{port}\r\n\r\n".encode()
    try:
        with (
            socket.create_connection((address, port), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=name) as connection,
        ):
            peer_serial = (connection.getpeercert() or {}).get("serialNumber")
            connection.sendall(request)
            chunks = []
            while chunk := connection.recv(65536):
                chunks.append(chunk)
    except (ssl.SSLError, OSError) as error:  # ConnectionError, timeouts included
        return Scrape(None, "", repr(error))
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode(errors="replace")
    parts = status_line.split()
    if len(parts) < 2 or not parts[1].isdigit():
        return Scrape(None, "", f"no HTTP status line: {status_line[:120]!r}", peer_serial)
    return Scrape(int(parts[1]), body.decode(errors="replace"), "", peer_serial)

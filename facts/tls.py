"""The node's TLS certificate and whether its key (which never leaves the node) matches it.

The fact command prints the certificate blocks of the certificate file (only those: a file
that also holds a private key prints nothing of it; the control side parses what it gets)
and the PUBLIC key derived from the node key with ``openssl pkey -pubout``. The private key
itself is never printed.
"""

from __future__ import annotations

import datetime
import shlex
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from pyinfra.api import FactBase

from gpunode import framing
from gpunode.pki import certificate_names

TLS_DIR = "/etc/gpunode/tls"
KEY_PATH = f"{TLS_DIR}/node.key"
CERT_PATH = f"{TLS_DIR}/node.crt"
CA_PATH = f"{TLS_DIR}/ca.crt"
# The monitoring host's client certificate for scraping (for node.key, clientAuth only):
# roles/prometheus.py installs it beside the rest of what its Prometheus reads.
SCRAPER_CERT_PATH = "/etc/prometheus/gpunode/scraper.crt"

BEGIN_CERTIFICATE = "-----BEGIN CERTIFICATE-----"
END_CERTIFICATE = "-----END CERTIFICATE-----"
# The certificate blocks of the file, each from its BEGIN line to its END line. Printing the
# text itself, not ``openssl x509``'s re-encoding of it: openssl costs 20 ms of node CPU to
# start, the control side parses the PEM all the same.
_CERT_PYTHON = r"""
import sys
inside = False
try:
    with open(path, "rb") as certificate:
        for line in certificate:
            if inside or begin in line:
                sys.stdout.buffer.write(line)
                inside = not (inside and end in line)
except OSError as error:
    print(f"{path}: {error.strerror}", file=sys.stderr)
    sys.exit(2)
"""
_EXISTS_PYTHON = "import os, sys\nsys.exit(0 if os.path.exists(path) else 1)\n"


def certificate_command(path: str) -> str:
    return f"sed -n '/{BEGIN_CERTIFICATE}/,/{END_CERTIFICATE}/p' {shlex.quote(path)}"


def public_key_command(path: str) -> str:
    return f"openssl pkey -in {shlex.quote(path)} -pubout"


CERT_COMMAND = certificate_command(CERT_PATH)
PUBLIC_KEY_COMMAND = public_key_command(KEY_PATH)
LABELS = {"certificate": (CERT_PATH, CERT_COMMAND), "public-key": (KEY_PATH, PUBLIC_KEY_COMMAND)}


def node_certificate_parts(
    cert_path: str = CERT_PATH, key_path: str = KEY_PATH
) -> list[framing.Part]:
    """Per label: whether its file exists, then its command, only where it does. The
    certificate is read by Python where the node has it (its existence test too: a part
    runs after another of its own kind)."""
    cert, key = shlex.quote(cert_path), shlex.quote(key_path)
    return [
        framing.Part(
            "certificate-exists",
            f"[ -e {cert} ]",
            python=framing.python_source(_EXISTS_PYTHON, path=cert_path),
        ),
        # The tool's complaint is why the file is unreadable: stderr is part of the text.
        framing.Part(
            "certificate",
            f"{certificate_command(cert_path)} 2>&1",
            after="certificate-exists",
            stderr="merge",
            python=framing.python_source(
                _CERT_PYTHON,
                path=cert_path,
                begin=BEGIN_CERTIFICATE.encode(),
                end=END_CERTIFICATE.encode(),
            ),
        ),
        framing.Part("public-key-exists", f"[ -e {key} ]"),
        framing.Part(
            "public-key", f"{public_key_command(key_path)} 2>&1", after="public-key-exists"
        ),
    ]


def _split(lines: list[str]) -> dict[str, tuple[str, list[str], int | None]] | None:
    """Label -> (state 'ok'/'absent'/'failed', body lines, exit code); None if garbled."""
    frame = framing.parse(lines, [part.name for part in node_certificate_parts()])
    sections: dict[str, tuple[str, list[str], int | None]] = {}
    for label in LABELS:
        exists, body = frame.part(f"{label}-exists"), frame.part(label)
        if body.skipped and exists.exit_status == 1 and not exists.lines:
            sections[label] = ("absent", [], None)
        elif body.exit_status is not None and body.problem is None:
            code = body.exit_status
            lines_read = [line.rstrip("\r\n") for line in body.lines]
            sections[label] = ("ok" if code == 0 else "failed", lines_read, code)
        else:
            return None
    return sections


def parse_node_certificate(
    lines: list[str], now: datetime.datetime | None = None, cert_path: str = CERT_PATH
) -> dict[str, Any]:
    """Turn the fact command's output (for the certificate at ``cert_path``) into a report;
    never raises on bad output."""
    now = now or datetime.datetime.now(datetime.UTC)
    cert_command = certificate_command(cert_path)
    sections = _split(lines)
    if sections is None:
        return _unreadable(
            f"`{cert_command}` / `{PUBLIC_KEY_COMMAND}` printed output in no known shape"
        )
    key_state, key_reason, public_key = _public_key(*sections["public-key"])
    key = _key(key_state, key_reason) | {"public_key_pem": public_key}
    cert_state, cert_body, cert_exit = sections["certificate"]
    if cert_state == "absent":
        return _empty("absent", f"{cert_path} does not exist") | key
    if cert_state == "failed":
        reason = f"`{cert_command}` failed (exit {cert_exit}): {_brief(cert_body)}"
        return _empty("unreadable", reason) | key
    pem = "\n".join(cert_body).strip() + "\n"
    try:
        certificate = x509.load_pem_x509_certificate(pem.encode())
    except ValueError:
        reason = f"`{cert_command}` printed no PEM certificate: {_brief(cert_body)}"
        return _empty("unreadable", reason) | key
    dns_names, ip_addresses = certificate_names(certificate)
    if key_state == "present" and public_key is not None:
        matches = _public_der_of_pem(public_key) == certificate.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        key_state = "matches" if matches else "mismatch"
    not_after = certificate.not_valid_after_utc
    return {
        "state": "present",
        "reason": "",
        "dns_names": dns_names,
        "ip_addresses": ip_addresses,
        "not_after": not_after.isoformat(),
        "days_to_expiry": (not_after - now).days,
        "issuer": certificate.issuer.rfc4514_string(),
        "serial": f"{certificate.serial_number:x}",
        "certificate_pem": pem,
        "public_key_pem": public_key,
        **_key(key_state, key_reason),
    }


def _public_key(state: str, body: list[str], exit_code: int | None) -> tuple[str, str, str | None]:
    """(key state 'present'/'absent'/'unreadable', reason, public key PEM)."""
    if state == "absent":
        return "absent", f"{KEY_PATH} does not exist", None
    if state == "failed":
        return (
            "unreadable",
            f"`{PUBLIC_KEY_COMMAND}` failed (exit {exit_code}): {_brief(body)}",
            None,
        )
    pem = "\n".join(body).strip() + "\n"
    if _public_der_of_pem(pem) is None:
        return "unreadable", f"`{PUBLIC_KEY_COMMAND}` printed no PEM public key", None
    return "present", "", pem


def _public_der_of_pem(pem: str) -> bytes | None:
    try:
        key = serialization.load_pem_public_key(pem.encode())
    except (ValueError, TypeError):
        return None
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _brief(body: list[str]) -> str:
    text = " ".join(line.strip() for line in body if line.strip())
    return text[:200] or "no output"


def _key(state: str, reason: str) -> dict[str, Any]:
    return {"key": state, "key_matches": state == "matches", "key_reason": reason}


def _empty(state: str, reason: str) -> dict[str, Any]:
    return {
        "state": state,
        "reason": reason,
        "dns_names": [],
        "ip_addresses": [],
        "not_after": None,
        "days_to_expiry": None,
        "issuer": None,
        "serial": None,
        "certificate_pem": None,
        "public_key_pem": None,
        **_key("absent", ""),
    }


def _unreadable(reason: str) -> dict[str, Any]:
    return _empty("unreadable", reason) | _key("unreadable", reason)


class NodeCertificate(FactBase):
    """
    The node certificate in /etc/gpunode/tls and whether node.key belongs to it.

    .. code:: python

        {
            "state": "present",  # or "absent" / "unreadable" (reason names the command)
            "reason": "",
            "dns_names": ["node1", "node1.cluster.example"],
            "ip_addresses": ["10.0.0.11"],
            "not_after": "2026-05-01T12:00:00+00:00",
            "days_to_expiry": 300,
            "issuer": "CN=gpunode internal CA 2025-05-01 1a2b3c4d,O=gpunode",
            "serial": "5f3e...",  # hex
            "key": "matches",  # or "mismatch" / "present" (no cert) / "absent" / "unreadable"
            "key_matches": True,
            "key_reason": "",
            "certificate_pem": "-----BEGIN CERTIFICATE-----...",
            "public_key_pem": "-----BEGIN PUBLIC KEY-----...",
        }
    """

    def parts(self) -> list[framing.Part]:
        return node_certificate_parts()

    def command(self) -> str:
        return framing.command(self.parts())

    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_node_certificate(list(output))


class ScraperCertificate(NodeCertificate):
    """
    The monitoring host's scraper certificate (``SCRAPER_CERT_PATH``) and whether node.key
    belongs to it: the report of ``NodeCertificate``.
    """

    def parts(self) -> list[framing.Part]:
        return node_certificate_parts(SCRAPER_CERT_PATH)

    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_node_certificate(list(output), cert_path=SCRAPER_CERT_PATH)

"""The internal CA on the control machine, and what it signs for nodes.

The CA's private key is created here, stored encrypted with mode 0600 in a 0700 directory,
and never leaves the control machine. The encryption is OpenSSH's private key format:
AES-256-CTR under a key derived from the passphrase with bcrypt-pbkdf, ``CA_KEY_KDF_ROUNDS``
rounds (``ssh-keygen -p -a ROUNDS -f ca.key`` changes the passphrase). A passphrase shorter
than ``MIN_PASSPHRASE_CHARS`` is refused. A key written by an older gpunode (PKCS#8 with
PBKDF2, 2048 iterations) still loads, and is re-encrypted in the current format right away.

The CA certificate is not put into the nodes' system trust store: it sits beside the node
certificate (``/etc/gpunode/tls/ca.crt``) for the services that are configured with it, so
a leaked CA key cannot make the nodes trust any other site.

Node keys are made on the nodes; only their certificate requests come here, are checked
against what the inventory declares, and are signed.

What a certificate may be used for is one thing only (extendedKeyUsage): a node certificate
serves (serverAuth), and only a monitoring host's scraper certificate is a client
(clientAuth). The exporters require a client certificate from this CA, and their TLS stack
(Go's crypto/tls, which exporter-toolkit serves with: golang/go src/crypto/tls
handshake_server.go verifies a client's chain for ExtKeyUsageClientAuth, read 2026-12-07;
OpenSSL does the same as a server) checks that it is for clientAuth: so a node, whose
certificate is for serving only, cannot scrape any other node's exporter. A certificate from
an older gpunode, for both, is re-issued.

Where the CA lives (first that is set):

``GPUNODE_CA_DIR``, else the inventory's ``tls.ca_directory``, else ``~/.local/share/gpunode/ca``
    the directory holding ``ca.key`` and ``ca.crt``.
``GPUNODE_CA_PASSPHRASE``, ``GPUNODE_CA_PASSPHRASE_FILE``, else ``tls.ca_passphrase_file``
    the passphrase of ``ca.key``, given directly or as a file (mode 0600) holding it.

The environment wins: it is the operator's choice for this one run.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import logging
import os
import re
import secrets
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from pyinfra.api.exceptions import PyinfraError

from gpunode.model import DNS_NAME, Tls

CA_DIR_VARIABLE = "GPUNODE_CA_DIR"
PASSPHRASE_VARIABLE = "GPUNODE_CA_PASSPHRASE"
PASSPHRASE_FILE_VARIABLE = "GPUNODE_CA_PASSPHRASE_FILE"
DEFAULT_CA_DIR = Path("~/.local/share/gpunode/ca")
CA_KEY_NAME = "ca.key"
CA_CERT_NAME = "ca.crt"

logger = logging.getLogger("pyinfra")

# bcrypt-pbkdf rounds for the CA key: each guess at the passphrase costs this many bcrypt
# runs (ssh-keygen's own default is 16).
CA_KEY_KDF_ROUNDS = 100
MIN_PASSPHRASE_CHARS = 16
OPENSSH_KEY_HEADER = b"-----BEGIN OPENSSH PRIVATE KEY-----"

CA_VALIDITY_DAYS = 3652
CA_CURVE = ec.SECP384R1
CA_SIGNATURE_HASH = hashes.SHA384
# Curves a node key may use; the role makes P-256 keys.
NODE_KEY_CURVES = ("secp256r1", "secp384r1")
# What a certificate is for: "server" (a node certificate: serverAuth only) or "client" (a
# monitoring host's scraper certificate: clientAuth only).
Usage = Literal["server", "client"]
EXTENDED_KEY_USAGE: dict[str, x509.ObjectIdentifier] = {
    "server": ExtendedKeyUsageOID.SERVER_AUTH,
    "client": ExtendedKeyUsageOID.CLIENT_AUTH,
}
# Certificates start a little in the past so a node whose clock lags accepts them at once.
CLOCK_SKEW = datetime.timedelta(minutes=5)

HOW_TO_SET_PASSPHRASE = (
    f"set {PASSPHRASE_VARIABLE} to the passphrase, or {PASSPHRASE_FILE_VARIABLE} to a file "
    "(mode 0600) holding it"
)
HOW_TO_CHANGE_PASSPHRASE = "ssh-keygen -p -a {rounds} -f {key_path}"


class PkiError(PyinfraError):
    """Something gpunode refuses to certify or sign with; the message says what to do."""


class CaError(PkiError):
    """The CA cannot be used (no passphrase, wrong passphrase, unsafe permissions...)."""


class CsrRefused(PkiError):
    """A node's certificate request does not match what the inventory declares for it."""


# --- the CA ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CertificateAuthority:
    """The loaded CA: its certificate, and its private key, decrypted (in memory only) the
    first time something is signed with it (``private_key``, ``unlock``).

    The key's bcrypt KDF costs about a second of CPU by design; a run where every node
    certificate is valid needs only the CA certificate and so never pays it, and the key
    exists in this process's memory only on runs that sign."""

    directory: Path
    certificate: x509.Certificate
    # Decrypts the key (raising CaError: wrong passphrase, not the certificate's key).
    key_source: Callable[[], ec.EllipticCurvePrivateKey] = field(repr=False, compare=False)
    _unlocked: list[ec.EllipticCurvePrivateKey] = field(
        default_factory=list, repr=False, compare=False
    )

    @property
    def certificate_pem(self) -> str:
        return self.certificate.public_bytes(serialization.Encoding.PEM).decode()

    @property
    def private_key(self) -> ec.EllipticCurvePrivateKey:
        if not self._unlocked:
            self._unlocked.append(_off_the_event_loop(self.key_source))
        return self._unlocked[0]

    def unlock(self) -> None:
        """Decrypt the key now (CaError if the passphrase is wrong): for a caller that must
        know before it changes anything that it will be able to sign."""
        _ = self.private_key


def _off_the_event_loop(work: Callable[[], Any]) -> Any:
    """Run ``work`` in gevent's thread pool from a greenlet of pyinfra's event loop (the KDF
    releases the GIL: only the host that needs the key waits, every other host's greenlet
    goes on), else here: outside any greenlet there is no loop to keep going."""
    greenlet = sys.modules.get("greenlet")
    if greenlet is None or greenlet.getcurrent().parent is None:
        return work()
    import gevent

    return gevent.get_hub().threadpool.apply(work)


def ca_directory(env: Mapping[str, str] = os.environ, configured: str | None = None) -> Path:
    """The CA's directory: the environment's, else the inventory's (``configured``)."""
    return Path(env.get(CA_DIR_VARIABLE) or configured or DEFAULT_CA_DIR).expanduser()


def ca_passphrase(
    env: Mapping[str, str] = os.environ, configured_file: str | None = None
) -> bytes | None:
    """The passphrase from the environment, else from the inventory's file; None if neither."""
    if env.get(PASSPHRASE_VARIABLE):
        return env[PASSPHRASE_VARIABLE].encode()
    file_name = env.get(PASSPHRASE_FILE_VARIABLE) or configured_file
    if not file_name:
        return None
    named_by = (
        PASSPHRASE_FILE_VARIABLE if env.get(PASSPHRASE_FILE_VARIABLE) else "tls.ca_passphrase_file"
    )
    path = Path(file_name).expanduser()
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except OSError as error:
        raise CaError(f"{named_by}={file_name}: cannot read it ({error.strerror})") from None
    if mode & 0o077:
        raise CaError(
            f"passphrase file {path} is readable by others (mode {_mode(mode)}); chmod 600 {path}"
        )
    passphrase = text.rstrip("\r\n")
    if not passphrase:
        raise CaError(f"passphrase file {path} is empty")
    return passphrase.encode()


def open_ca(
    directory: Path, passphrase: bytes | None, create: bool = True
) -> CertificateAuthority | None:
    """Load the CA in ``directory``, creating it first when absent and ``create`` is true.

    Returns None only when the CA is absent and ``create`` is false (a dry run). Raises
    CaError, with nothing changed on disk, when the passphrase is missing, short or wrong,
    the key's permissions are unsafe, or the directory holds half a CA. A key encrypted the
    old way is re-encrypted on load, unless ``create`` is false (a dry run changes nothing).
    """
    key_path, cert_path = directory / CA_KEY_NAME, directory / CA_CERT_NAME
    if key_path.exists() or cert_path.exists():
        return _load_ca(directory, passphrase, reencrypt=create)
    if passphrase is None:
        raise CaError(
            f"no CA in {directory} yet, and no passphrase to protect a new one with: "
            f"{HOW_TO_SET_PASSPHRASE} (and {CA_DIR_VARIABLE} to choose another directory)"
        )
    if _too_short(passphrase):
        raise CaError(
            f"the passphrase for a new CA (from {_passphrase_source()}) is shorter than "
            f"{MIN_PASSPHRASE_CHARS} characters; choose a longer one"
        )
    if not create:
        return None
    return _create_ca(directory, passphrase)


def _too_short(passphrase: bytes) -> bool:
    return len(passphrase.decode("utf-8", errors="replace")) < MIN_PASSPHRASE_CHARS


def encrypted_key_pem(private_key: ec.EllipticCurvePrivateKey, passphrase: bytes) -> bytes:
    """The CA key as gpunode stores it (OpenSSH format, bcrypt-pbkdf, AES-256-CTR)."""
    encryption = (
        serialization.PrivateFormat.OpenSSH.encryption_builder()
        .kdf_rounds(CA_KEY_KDF_ROUNDS)
        .build(passphrase)
    )
    return private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, encryption
    )


def openssh_key_encryption(key_pem: bytes) -> tuple[str, str, int] | None:
    """(cipher, KDF, KDF rounds) of an OpenSSH-format private key; None for any other
    format. Read from the key's unencrypted header, without the passphrase."""
    if not key_pem.startswith(OPENSSH_KEY_HEADER):
        return None
    body = b"".join(key_pem.splitlines()[1:-1])
    try:
        blob = base64.b64decode(body, validate=True)
    except ValueError:
        return None
    magic = b"openssh-key-v1\0"
    if not blob.startswith(magic):
        return None
    fields: list[bytes] = []
    offset = len(magic)
    for _ in range(3):  # cipher name, KDF name, KDF options
        length = int.from_bytes(blob[offset : offset + 4], "big")
        fields.append(blob[offset + 4 : offset + 4 + length])
        offset += 4 + length
    cipher, kdf, options = fields
    rounds = 0
    if kdf == b"bcrypt" and len(options) >= 8:
        salt_length = int.from_bytes(options[:4], "big")
        rounds = int.from_bytes(options[4 + salt_length : 8 + salt_length], "big")
    return cipher.decode(errors="replace"), kdf.decode(errors="replace"), rounds


def _load_ca(directory: Path, passphrase: bytes | None, reencrypt: bool) -> CertificateAuthority:
    key_path, cert_path = directory / CA_KEY_NAME, directory / CA_CERT_NAME
    for present, missing in ((key_path, cert_path), (cert_path, key_path)):
        if present.exists() and not missing.exists():
            raise CaError(
                f"incomplete CA in {directory}: {present.name} without {missing.name}; "
                "restore it from your backup, or move the directory aside to start a new CA"
            )
    for path, loosest in ((directory, 0o700), (key_path, 0o600)):
        mode = path.stat().st_mode
        if mode & 0o777 & ~loosest:
            raise CaError(
                f"{path} has mode {_mode(mode)}; the CA key must be private to you: "
                f"chmod {loosest:o} {path}"
            )
    if passphrase is None:
        raise CaError(f"the CA key {key_path} is encrypted: {HOW_TO_SET_PASSPHRASE}")
    if _too_short(passphrase):
        raise CaError(
            f"the passphrase of the CA key {key_path} (from {_passphrase_source()}) is shorter "
            f"than {MIN_PASSPHRASE_CHARS} characters; change it to a longer one with "
            f"`{HOW_TO_CHANGE_PASSPHRASE.format(rounds=CA_KEY_KDF_ROUNDS, key_path=key_path)}` "
            "and set the new one; nothing was changed"
        )
    try:
        certificate = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except ValueError:
        raise CaError(f"{cert_path} is not a PEM certificate") from None

    secret: bytes = passphrase

    def decrypted_key() -> ec.EllipticCurvePrivateKey:
        return _decrypt_ca_key(key_path, cert_path, certificate, secret, reencrypt)

    return CertificateAuthority(directory, certificate, decrypted_key)


def _decrypt_ca_key(
    key_path: Path,
    cert_path: Path,
    certificate: x509.Certificate,
    passphrase: bytes,
    reencrypt: bool,
) -> ec.EllipticCurvePrivateKey:
    """The CA key, decrypted and checked against the CA certificate; a key encrypted the old
    way is re-encrypted on the way (``reencrypt``: not in a dry run)."""
    key_pem = key_path.read_bytes()
    try:
        if key_pem.startswith(OPENSSH_KEY_HEADER):
            private_key: Any = serialization.load_ssh_private_key(key_pem, passphrase)
        else:  # PKCS#8 PEM, as gpunode wrote it before it used the OpenSSH format
            private_key = serialization.load_pem_private_key(key_pem, passphrase)
    except TypeError:
        raise CaError(f"the CA key {key_path} is not encrypted; refusing to use it") from None
    except ValueError:
        raise CaError(
            f"wrong passphrase for the CA key {key_path} (from {_passphrase_source()}); "
            "nothing was changed"
        ) from None
    if not isinstance(private_key, ec.EllipticCurvePrivateKey) or _public_der(
        private_key.public_key()
    ) != _public_der(certificate.public_key()):
        raise CaError(f"{key_path} is not the key of {cert_path}")
    encryption = openssh_key_encryption(key_pem)
    weaker = encryption is None or encryption[1] != "bcrypt" or encryption[2] < CA_KEY_KDF_ROUNDS
    if weaker and reencrypt:
        _replace_private(key_path, encrypted_key_pem(private_key, passphrase))
        logger.warning(
            f"re-encrypted the CA key {key_path} with bcrypt-pbkdf ({CA_KEY_KDF_ROUNDS} rounds); "
            "backups of the old file still have the old, weaker encryption"
        )
    return private_key


def _create_ca(directory: Path, passphrase: bytes) -> CertificateAuthority:
    if directory.exists():
        mode = directory.stat().st_mode
        if mode & 0o077:
            raise CaError(
                f"CA directory {directory} has mode {_mode(mode)}; it must be private: "
                f"chmod 700 {directory}, or point {CA_DIR_VARIABLE} at a directory that does "
                "not exist yet"
            )
    else:
        directory.parent.mkdir(parents=True, exist_ok=True)
        directory.mkdir(mode=0o700)
        directory.chmod(0o700)  # mkdir's mode is subject to the umask

    private_key = ec.generate_private_key(CA_CURVE())
    now = _now()
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpunode"),
            # A random tag keeps two CAs apart by name, not only by key.
            x509.NameAttribute(
                NameOID.COMMON_NAME, f"gpunode internal CA {now:%Y-%m-%d} {secrets.token_hex(4)}"
            ),
        ]
    )
    public_key = private_key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=CA_VALIDITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(key_cert_sign=True, crl_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .sign(private_key, CA_SIGNATURE_HASH())
    )
    _write_new(directory / CA_KEY_NAME, encrypted_key_pem(private_key, passphrase), 0o600)
    _write_new(
        directory / CA_CERT_NAME, certificate.public_bytes(serialization.Encoding.PEM), 0o644
    )
    return CertificateAuthority(directory, certificate, lambda: private_key)


def _key_usage(**granted: bool) -> x509.KeyUsage:
    """keyUsage with only ``granted`` bits set."""
    bits = (
        "digital_signature", "content_commitment", "key_encipherment", "data_encipherment",
        "key_agreement", "key_cert_sign", "crl_sign", "encipher_only", "decipher_only",
    )  # fmt: skip
    return x509.KeyUsage(**{bit: granted.get(bit, False) for bit in bits})


def _write_new(path: Path, content: bytes, mode: int) -> None:
    """Write a file that must not exist yet, created with ``mode`` from the start."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)  # the umask may have narrowed it
        os.link(temporary, path)  # fails if the path appeared meanwhile: never overwrite
    finally:
        temporary.unlink(missing_ok=True)


def _replace_private(path: Path, content: bytes) -> None:
    """Replace ``path`` with ``content`` atomically, 0600 from the first byte: a crash
    leaves either the old file or the new one, never half of one."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


_opened: dict[Path, CertificateAuthority] = {}


def certificate_authority(
    tls: Tls, create: bool = True, env: Mapping[str, str] = os.environ
) -> CertificateAuthority | None:
    """The CA that ``tls`` and the environment name, loaded once per process (``open_ca``:
    its key is decrypted when first used)."""
    directory = ca_directory(env, tls.ca_directory)
    if directory not in _opened:
        authority = open_ca(directory, ca_passphrase(env, tls.ca_passphrase_file), create=create)
        if authority is None:
            return None
        _opened[directory] = authority
    return _opened[directory]


def _passphrase_source() -> str:
    if os.environ.get(PASSPHRASE_VARIABLE):
        return PASSPHRASE_VARIABLE
    if os.environ.get(PASSPHRASE_FILE_VARIABLE):
        return PASSPHRASE_FILE_VARIABLE
    return "tls.ca_passphrase_file"


def _mode(st_mode: int) -> str:
    return f"{stat.S_IMODE(st_mode):04o}"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _public_der(public_key: Any) -> bytes:
    return bytes(
        public_key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


# --- what a node's certificate should say --------------------------------------------------------


@dataclass(frozen=True)
class WantedCertificate:
    """The names, lifetime and renewal window a node's certificate must have."""

    host_name: str
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]
    validity_days: int
    renew_before_days: int
    usage: Usage = "server"

    @property
    def names(self) -> tuple[frozenset[str], frozenset[str]]:
        """(DNS names, IP addresses), normalised for comparison."""
        return _normalise(self.dns_names, self.ip_addresses)

    def describe(self) -> str:
        return ", ".join([*self.dns_names, *self.ip_addresses])

    def subject_alt_names(self) -> str:
        """The names in openssl's ``subjectAltName`` syntax, for the node's CSR."""
        return ",".join(
            [f"DNS:{name}" for name in self.dns_names]
            + [f"IP:{address}" for address in self.ip_addresses]
        )


def wanted_certificate(host_name: str, tls: Tls, usage: Usage = "server") -> WantedCertificate:
    """The host's inventory name (a DNS name or an IP address) plus tls.names/ip_addresses,
    for ``usage`` (a node certificate serves; a monitoring host's scraper certificate is a
    client)."""
    dns_names: list[str] = []
    ip_addresses: list[str] = []
    if _is_ip_address(host_name):
        ip_addresses.append(str(ipaddress.ip_address(host_name)))
    elif re.fullmatch(DNS_NAME, host_name) and not host_name.startswith("*"):
        dns_names.append(host_name)
    else:
        raise PkiError(
            f"host name {host_name!r} is neither a DNS name nor an IP address, so it cannot be "
            "named in a certificate; rename the host in the inventory"
        )
    for name in tls.names:
        if name.lower() not in {existing.lower() for existing in dns_names}:
            dns_names.append(name)
    for address in tls.ip_addresses:
        normalised = str(ipaddress.ip_address(address))
        if normalised not in ip_addresses:
            ip_addresses.append(normalised)
    return WantedCertificate(
        host_name=host_name,
        dns_names=tuple(dns_names),
        ip_addresses=tuple(ip_addresses),
        validity_days=tls.validity_days,
        renew_before_days=tls.renew_before_days,
        usage=usage,
    )


def _is_ip_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _normalise(dns_names: Any, ip_addresses: Any) -> tuple[frozenset[str], frozenset[str]]:
    return (
        frozenset(str(name).lower() for name in dns_names),
        frozenset(str(ipaddress.ip_address(str(address))) for address in ip_addresses),
    )


def certificate_names(certificate: x509.Certificate) -> tuple[list[str], list[str]]:
    """(DNS names, IP addresses) of a certificate's or request's subjectAltName."""
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    return (
        list(san.get_values_for_type(x509.DNSName)),
        [str(address) for address in san.get_values_for_type(x509.IPAddress)],
    )


# --- signing --------------------------------------------------------------------------------


def sign_csr(
    authority: CertificateAuthority,
    csr_pem: bytes,
    wanted: WantedCertificate,
    expected_public_key_pem: bytes | None = None,
    now: datetime.datetime | None = None,
) -> x509.Certificate:
    """Sign a node's CSR after checking it; raises CsrRefused when it does not fit.

    Checked: the request is signed by its own key (the node holds that key), the key is an EC
    key on an accepted curve, it is ``expected_public_key_pem`` when the caller knows the
    node's key, and it requests exactly the wanted names. The certificate's names come from
    the inventory, never from the request.
    """
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError:
        raise CsrRefused(f"{wanted.host_name}: the node sent no PEM certificate request") from None
    if not csr.is_signature_valid:
        raise CsrRefused(f"{wanted.host_name}: the request's self-signature does not verify")
    public_key = csr.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey) or (
        public_key.curve.name not in NODE_KEY_CURVES
    ):
        raise CsrRefused(
            f"{wanted.host_name}: the request's key is not an EC key on "
            + " or ".join(NODE_KEY_CURVES)
        )
    if expected_public_key_pem is not None:
        expected = serialization.load_pem_public_key(expected_public_key_pem)
        if _public_der(expected) != _public_der(public_key):
            raise CsrRefused(
                f"{wanted.host_name}: the request is not for the key in the node's key file"
            )
    requested = _normalise(*_csr_names(csr))
    if requested != wanted.names:
        raise CsrRefused(
            f"{wanted.host_name}: the request names {_describe(requested)}, but the inventory "
            f"declares {_describe(wanted.names)}"
        )
    return issue_certificate(authority, public_key, wanted, now=now)


def _csr_names(csr: x509.CertificateSigningRequest) -> tuple[list[str], list[str]]:
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    return (
        list(san.get_values_for_type(x509.DNSName)),
        [str(address) for address in san.get_values_for_type(x509.IPAddress)],
    )


def _describe(names: tuple[frozenset[str], frozenset[str]]) -> str:
    listed = sorted(names[0]) + sorted(names[1])
    return ", ".join(listed) if listed else "no names"


def issue_certificate(
    authority: CertificateAuthority,
    public_key: ec.EllipticCurvePublicKey,
    wanted: WantedCertificate,
    now: datetime.datetime | None = None,
) -> x509.Certificate:
    """A certificate for ``public_key`` for ``wanted.usage`` alone (serverAuth, or
    clientAuth), valid ``wanted.validity_days`` from ``now``, never beyond the CA's own
    expiry."""
    now = now or _now()
    ca_certificate = authority.certificate
    not_after = min(
        now + datetime.timedelta(days=wanted.validity_days), ca_certificate.not_valid_after_utc
    )
    alt_names: list[x509.GeneralName] = [x509.DNSName(name) for name in wanted.dns_names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(a)) for a in wanted.ip_addresses]
    ca_key_id = ca_certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, wanted.host_name)]))
        .issuer_name(ca_certificate.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True), critical=True)
        .add_extension(x509.ExtendedKeyUsage([EXTENDED_KEY_USAGE[wanted.usage]]), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_key_id.value),
            critical=False,
        )
        .sign(authority.private_key, CA_SIGNATURE_HASH())
    )


def extended_key_usages(certificate: x509.Certificate) -> tuple[str, ...]:
    """What ``certificate`` may be used for, as ``Usage`` names ("server", "client"), in
    that order; any other purpose by its dotted OID."""
    try:
        purposes = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        # No extendedKeyUsage at all: TLS stacks accept it for every purpose.
        return ("server", "client")
    names = {oid: name for name, oid in EXTENDED_KEY_USAGE.items()}
    known = tuple(name for name in EXTENDED_KEY_USAGE if EXTENDED_KEY_USAGE[name] in purposes)
    others = tuple(oid.dotted_string for oid in purposes if oid not in names)
    return known + others


# --- when to re-issue --------------------------------------------------------------------------


def reissue_reason(
    report: Mapping[str, Any],
    wanted: WantedCertificate,
    ca_certificate: x509.Certificate | None,
    now: datetime.datetime,
) -> str | None:
    """Why the node's certificate must be issued anew, or None when it is fine as it is.

    ``report`` is the NodeCertificate fact; ``ca_certificate`` the current CA's (None when the
    CA does not exist yet, in a dry run). Nothing else (a changed validity_days, say) causes a
    re-issue: a valid certificate is kept until it nears its expiry.
    """
    if report["state"] == "absent":
        return "no certificate on the node"
    if report["state"] != "present":
        return f"the node's certificate is unreadable: {report['reason']}"
    if report["key"] != "matches":
        return {
            "absent": "the node has no key",
            "unreadable": f"the node's key is unreadable: {report.get('key_reason', '')}",
        }.get(report["key"], "the node's key does not match its certificate")
    has = _normalise(report["dns_names"], report["ip_addresses"])
    if has != wanted.names:
        return (
            f"names differ: the certificate has {_describe(has)}, wanted {_describe(wanted.names)}"
        )
    if ca_certificate is None:
        return "the CA does not exist yet; it is created on the first real run"
    certificate = x509.load_pem_x509_certificate(report["certificate_pem"].encode())
    try:
        certificate.verify_directly_issued_by(ca_certificate)
    except (ValueError, TypeError, InvalidSignature):
        return f"not signed by the current CA (issuer: {report['issuer']})"
    usages = extended_key_usages(certificate)
    if usages != (wanted.usage,):
        why = f"it is for {', '.join(usages) or 'no named use'}; wanted {wanted.usage} only"
        if wanted.usage == "server" and "client" in usages:
            why += " (a node certificate must not act as a client)"
        return why
    left = certificate.not_valid_after_utc - now
    if left <= datetime.timedelta(days=wanted.renew_before_days):
        return (
            f"expires {certificate.not_valid_after_utc:%Y-%m-%d}, inside the renewal window "
            f"of {wanted.renew_before_days} days"
        )
    return None

"""TLS role operations (facts in, commands out), the NodeCertificate fact, the signing callback."""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pyinfra.api import FunctionCommand
from pyinfra.connectors.util import CommandOutput, OutputLine
from pyinfra.facts.files import File, Link

from facts.tls import (
    CERT_COMMAND,
    KEY_PATH,
    NodeCertificate,
    node_certificate_parts,
    parse_node_certificate,
)
from gpunode import framing, pki
from gpunode.framing import PREFIX
from gpunode.model import Tls
from gpunode.pki import CaError, CertificateAuthority, WantedCertificate
from roles.tls import (
    TRUST_LINK,
    TRUST_PATH,
    ca_not_system_trusted,
    issue_node_certificate,
    node_certificate,
    node_key_private,
)

from .fakehost import commands_of, fake_host
from .test_pki import tls_part

NOW = datetime.datetime(2025, 6, 1, 12, 0, tzinfo=datetime.UTC)
WANTED = pki.wanted_certificate(
    "node-1", Tls(enabled=True, names=("node-1.cluster.example",), ip_addresses=("10.0.0.11",))
)
KEY_GENERATION = (
    "umask 077 && rm -f /etc/gpunode/tls/node.key.new && openssl genpkey -algorithm EC "
    "-pkeyopt ec_paramgen_curve:P-256 -out /etc/gpunode/tls/node.key.new "
    "&& chown root:root /etc/gpunode/tls/node.key.new "
    "&& mv -f /etc/gpunode/tls/node.key.new /etc/gpunode/tls/node.key"
)


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    created = pki.open_ca(tmp_path_factory.mktemp("tls") / "ca", b"unit test passphrase")
    assert created is not None
    return created


def public_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def fact_lines(certificate: x509.Certificate | None, public_key_pem: str | None) -> list[str]:
    pem = certificate.public_bytes(serialization.Encoding.PEM).decode() if certificate else None
    return framing.output_of(
        tls_part("certificate", pem.splitlines() if pem is not None else None)
        | tls_part("public-key", public_key_pem.splitlines() if public_key_pem else None)
    )


def operation_output(operation: Any, facts: dict[type, Any], **kwargs: Any) -> tuple[list, list]:
    """(command objects, no-op messages): FunctionCommands are kept to look inside."""
    with fake_host(facts) as host:
        commands = list(operation._inner(**kwargs))
    return commands, host.noops


# --- the NodeCertificate fact ---------------------------------------------------------------------


def test_fact_command_prints_only_public_material() -> None:
    command = NodeCertificate().command()
    assert "openssl pkey -in /etc/gpunode/tls/node.key -pubout" in command
    assert CERT_COMMAND in command
    assert "cat " not in command


def test_fact_reports_a_present_certificate_and_a_matching_key(
    authority: CertificateAuthority,
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = pki.issue_certificate(authority, key.public_key(), WANTED, now=NOW)
    report = parse_node_certificate(
        fact_lines(certificate, public_pem(key)), now=NOW + datetime.timedelta(days=65)
    )
    assert report["state"] == "present"
    assert report["dns_names"] == ["node-1", "node-1.cluster.example"]
    assert report["ip_addresses"] == ["10.0.0.11"]
    assert report["not_after"] == "2026-06-01T12:00:00+00:00"
    assert report["days_to_expiry"] == 300
    assert report["issuer"] == authority.certificate.subject.rfc4514_string()
    assert report["serial"] == f"{certificate.serial_number:x}"
    assert (report["key"], report["key_matches"]) == ("matches", True)


def test_fact_reports_a_key_that_does_not_match(authority: CertificateAuthority) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = pki.issue_certificate(authority, key.public_key(), WANTED, now=NOW)
    other = public_pem(ec.generate_private_key(ec.SECP256R1()))
    report = parse_node_certificate(fact_lines(certificate, other), now=NOW)
    assert (report["state"], report["key"], report["key_matches"]) == ("present", "mismatch", False)


def test_fact_reports_nothing_there() -> None:
    report = parse_node_certificate(fact_lines(None, None), now=NOW)
    assert (report["state"], report["key"], report["key_matches"]) == ("absent", "absent", False)
    assert report["reason"] == "/etc/gpunode/tls/node.crt does not exist"


def test_fact_reports_a_failing_command_as_unreadable_naming_it() -> None:
    lines = framing.output_of(
        tls_part("certificate", ["Could not read certificate from /etc/gpunode/tls/node.crt"], 1)
        | tls_part("public-key", ["Could not read key from /etc/gpunode/tls/node.key"], 1)
    )
    report = parse_node_certificate(lines, now=NOW)
    assert report["state"] == "unreadable"
    assert report["reason"] == (
        f"`{CERT_COMMAND}` failed (exit 1): Could not read "
        "certificate from /etc/gpunode/tls/node.crt"
    )
    assert report["key"] == "unreadable"
    assert "`openssl pkey -in /etc/gpunode/tls/node.key -pubout` failed" in report["key_reason"]


TOKEN = "0123456789abcdef"
CERTIFICATE_ONLY = framing.output_of(tls_part("certificate", []), token=TOKEN, complete=False)


@pytest.mark.parametrize(
    "lines",
    [
        [],
        ["sudo: a password is required"],
        CERTIFICATE_ONLY,  # no key section
        [*CERTIFICATE_ONLY[:-1], f"{PREFIX}{TOKEN}:exit:certificate:x"],  # a garbled status
        framing.output_of(tls_part("certificate", ["garbage"]) | tls_part("public-key", None)),
    ],
)
def test_fact_turns_garbage_into_an_unreadable_state(lines: list[str]) -> None:
    report = parse_node_certificate(lines, now=NOW)
    assert report["state"] == "unreadable"
    assert f"`{CERT_COMMAND}`" in report["reason"]


# --- node_certificate --------------------------------------------------------------------------


def test_fine_certificate_is_a_noop(authority: CertificateAuthority) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = pki.issue_certificate(authority, key.public_key(), WANTED, now=NOW)
    report = parse_node_certificate(fact_lines(certificate, public_pem(key)), now=NOW)
    commands, noops = commands_of(
        node_certificate, {NodeCertificate: report}, wanted=WANTED, authority=authority, now=NOW
    )
    assert commands == []
    assert noops == [
        "certificate for node-1, node-1.cluster.example, 10.0.0.11 valid until 2026-06-01 "
        "(365 days)"
    ]


def test_node_without_a_key_makes_one_then_gets_a_certificate(
    authority: CertificateAuthority,
) -> None:
    report = parse_node_certificate(fact_lines(None, None), now=NOW)
    commands, noops = operation_output(
        node_certificate, {NodeCertificate: report}, wanted=WANTED, authority=authority, now=NOW
    )
    assert noops == []
    assert [str(command) for command in commands[:1]] == [KEY_GENERATION]
    assert isinstance(commands[1], FunctionCommand)
    assert commands[1].function is issue_node_certificate
    assert commands[1].kwargs["expected_public_key_pem"] is None  # the key is made just before
    assert commands[1].kwargs["reason"] == "no certificate on the node"
    assert len(commands) == 2


def test_certificate_for_other_names_is_reissued_for_the_existing_key(
    authority: CertificateAuthority,
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    old_names = pki.wanted_certificate("node-1", Tls(enabled=True))
    certificate = pki.issue_certificate(authority, key.public_key(), old_names, now=NOW)
    report = parse_node_certificate(fact_lines(certificate, public_pem(key)), now=NOW)
    commands, _ = operation_output(
        node_certificate, {NodeCertificate: report}, wanted=WANTED, authority=authority, now=NOW
    )
    assert len(commands) == 1 and isinstance(commands[0], FunctionCommand)
    assert commands[0].kwargs["expected_public_key_pem"] == public_pem(key)
    assert commands[0].kwargs["reason"].startswith("names differ")


def test_the_ca_key_is_decrypted_while_preparing_and_only_where_a_certificate_is_due(
    authority: CertificateAuthority, tmp_path: Path
) -> None:
    # The same CA on disk, opened with a wrong passphrase: its certificate checks a valid
    # node certificate (nothing to sign, nothing decrypted, no error); where one is due the
    # wrong passphrase stops the operation before it yields anything to run.
    copy = tmp_path / "ca"
    shutil.copytree(authority.directory, copy)
    wrong = pki.open_ca(copy, b"not the unit test passphrase", create=False)
    assert wrong is not None
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = pki.issue_certificate(authority, key.public_key(), WANTED, now=NOW)
    valid = parse_node_certificate(fact_lines(certificate, public_pem(key)), now=NOW)
    commands, noops = operation_output(
        node_certificate, {NodeCertificate: valid}, wanted=WANTED, authority=wrong, now=NOW
    )
    assert commands == [] and len(noops) == 1
    missing = parse_node_certificate(fact_lines(None, None), now=NOW)
    with pytest.raises(CaError, match="wrong passphrase for the CA key"):
        operation_output(
            node_certificate, {NodeCertificate: missing}, wanted=WANTED, authority=wrong, now=NOW
        )


def test_unreadable_key_is_made_anew(authority: CertificateAuthority) -> None:
    lines = framing.output_of(
        tls_part("certificate", None) | tls_part("public-key", ["Could not read key"], 1)
    )
    report = parse_node_certificate(lines, now=NOW)
    commands, _ = operation_output(
        node_certificate, {NodeCertificate: report}, wanted=WANTED, authority=authority, now=NOW
    )
    assert str(commands[0]) == KEY_GENERATION
    assert isinstance(commands[1], FunctionCommand)


# --- the signing callback -----------------------------------------------------------------------


class CallbackHost:
    """The slice of pyinfra's Host the callback uses; the 'node' answers with a real CSR."""

    def __init__(self, csr_stdout: str, command_ok: bool = True) -> None:
        self.csr_stdout = csr_stdout
        self.command_ok = command_ok
        self.commands: list[str] = []
        self.uploads: dict[str, str] = {}
        self.messages: list[str] = []

    def run_shell_command(self, command: Any, **arguments: Any) -> tuple[bool, CommandOutput]:
        self.commands.append(str(command))
        assert arguments["_sudo"] is True
        if str(command).startswith("openssl req"):
            lines = [OutputLine("stdout", line) for line in self.csr_stdout.splitlines()]
            return True, CommandOutput(lines)
        return self.command_ok, CommandOutput([OutputLine("stderr", "verify failed")])

    def put_file(self, source: Any, remote_path: str, **arguments: Any) -> bool:
        self.uploads[remote_path] = source.read()
        return True

    def log(self, message: str, **_: Any) -> None:
        self.messages.append(message)

    def log_styled(self, message: str, **_: Any) -> None:
        self.messages.append(message)


def csr_pem(key: ec.EllipticCurvePrivateKey, wanted: WantedCertificate) -> str:
    alt_names: list[x509.GeneralName] = [x509.DNSName(name) for name in wanted.dns_names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(a)) for a in wanted.ip_addresses]
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, wanted.host_name)]))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
        .decode()
    )


def run_callback(host: CallbackHost, authority: CertificateAuthority, **kwargs: Any) -> bool:
    state = SimpleNamespace(print_output=False, print_input=False)
    arguments = {"expected_public_key_pem": None, **kwargs}
    return issue_node_certificate(
        state,
        host,
        wanted=WANTED,
        reason="no certificate on the node",
        authority=authority,
        connector_arguments={"_sudo": True},
        **arguments,
    )


def test_callback_signs_the_nodes_csr_and_installs_a_verified_certificate(
    authority: CertificateAuthority,
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    host = CallbackHost(csr_pem(key, WANTED))
    assert run_callback(host, authority, expected_public_key_pem=public_pem(key)) is True
    assert host.commands == [
        "openssl req -new -key /etc/gpunode/tls/node.key -subj /CN=node-1 "
        "-addext subjectAltName=DNS:node-1,DNS:node-1.cluster.example,IP:10.0.0.11",
        "openssl verify -purpose sslserver -CAfile /etc/gpunode/tls/ca.crt "
        "/etc/gpunode/tls/node.crt.new "
        ">/dev/null && chown root:root /etc/gpunode/tls/node.crt.new "
        "&& chmod 644 /etc/gpunode/tls/node.crt.new "
        "&& mv -f /etc/gpunode/tls/node.crt.new /etc/gpunode/tls/node.crt",
    ]
    uploaded = x509.load_pem_x509_certificate(
        host.uploads["/etc/gpunode/tls/node.crt.new"].encode()
    )
    uploaded.verify_directly_issued_by(authority.certificate)
    assert uploaded.public_key() == key.public_key()
    assert "PRIVATE KEY" not in "".join(host.uploads.values())


def test_callback_refuses_a_csr_with_other_names_and_installs_nothing(
    authority: CertificateAuthority,
) -> None:
    other = pki.wanted_certificate("node-1", Tls(enabled=True, names=("evil.example",)))
    host = CallbackHost(csr_pem(ec.generate_private_key(ec.SECP256R1()), other))
    assert run_callback(host, authority) is False
    assert host.uploads == {}
    assert len(host.commands) == 1
    assert "certificate refused" in host.messages[0] and "evil.example" in host.messages[0]


def test_callback_fails_when_the_certificate_does_not_verify_on_the_node(
    authority: CertificateAuthority,
) -> None:
    host = CallbackHost(csr_pem(ec.generate_private_key(ec.SECP256R1()), WANTED), command_ok=False)
    assert run_callback(host, authority) is False
    assert "not installed: verify failed" in host.messages[-1]


# --- node_key_private and ca_not_system_trusted ----------------------------------------------


def test_missing_key_is_left_to_node_certificate() -> None:
    commands, noops = commands_of(node_key_private, {File: None})
    assert commands == []
    assert "node_certificate makes it 0600" in noops[0]


def test_key_readable_by_others_is_made_private() -> None:
    commands, _ = commands_of(
        node_key_private, {File: {"mode": 644, "user": "root", "group": "root"}}
    )
    assert commands == [
        "chown root:root /etc/gpunode/tls/node.key && chmod 600 /etc/gpunode/tls/node.key"
    ]


def test_private_key_file_is_a_noop() -> None:
    commands, noops = commands_of(
        node_key_private, {File: {"mode": 600, "user": "root", "group": "root"}}
    )
    assert (commands, noops) == ([], ["/etc/gpunode/tls/node.key is 0600 root:root"])


LINKED = {"link_target": TRUST_PATH}
UNTRUST = f"rm -f {TRUST_PATH} && update-ca-certificates --fresh >/dev/null"


def test_ca_out_of_the_trust_store_is_a_noop() -> None:
    commands, noops = commands_of(ca_not_system_trusted, {File: None, Link: None})
    assert commands == []
    assert noops == ["the gpunode CA is not in the system trust store"]


@pytest.mark.parametrize(
    ("installed", "linked"),
    [({"mode": 644}, LINKED), ({"mode": 644}, None), (None, LINKED)],
    ids=["trusted", "copied-not-taken-in", "dangling-link"],
)
def test_a_ca_an_earlier_run_trusted_is_taken_out(
    installed: dict[str, Any] | None, linked: dict[str, Any] | None
) -> None:
    commands, _ = commands_of(ca_not_system_trusted, {File: installed, Link: linked})
    assert commands == [UNTRUST]
    assert TRUST_PATH == "/usr/local/share/ca-certificates/gpunode-ca.crt"
    assert TRUST_LINK == "/etc/ssl/certs/gpunode-ca.pem"


@pytest.mark.parametrize("in_python", [True, False])
def test_fact_prints_the_certificate_blocks_and_never_a_key_beside_them(
    tmp_path: Path, authority: CertificateAuthority, in_python: bool
) -> None:
    """A file that also holds the private key (an operator's combined PEM): the fact reads
    the certificate, and the key's text never reaches the control side. Run for real, by
    the shell's commands and by the frame's Python process alike."""
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = pki.issue_certificate(authority, key.public_key(), WANTED, now=NOW)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    combined = tmp_path / "node.crt"
    combined.write_bytes(
        b"comment line\n" + key_pem + certificate.public_bytes(serialization.Encoding.PEM)
    )
    command = framing.command(
        node_certificate_parts(str(combined), str(tmp_path / "node.key")), python=in_python
    )
    printed = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert "PRIVATE KEY" not in printed.stdout
    assert key_pem.decode().splitlines()[1] not in printed.stdout
    report = parse_node_certificate(printed.stdout.splitlines(), now=NOW)
    assert (report["state"], report["serial"]) == ("present", f"{certificate.serial_number:x}")
    assert (report["key"], report["key_reason"]) == ("absent", f"{KEY_PATH} does not exist")

"""The control machine's CA: created safely, refused when misused, signs only what fits."""

from __future__ import annotations

import datetime
import ipaddress
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from facts.tls import CERT_COMMAND, parse_node_certificate
from gpunode import framing, pki
from gpunode.framing import PartOutput
from gpunode.model import Tls
from gpunode.pki import CaError, CertificateAuthority, CsrRefused, PkiError, WantedCertificate

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
Issued = tuple[ec.EllipticCurvePrivateKey, x509.Certificate]

PASSPHRASE = b"correct horse battery staple"
NOW = datetime.datetime(2025, 6, 1, 12, 0, tzinfo=datetime.UTC)
# The rounds a real CA key gets; the tests below use fewer, so that each CA they make is
# quick, except where the real number is what is tested.
STRONG_KDF_ROUNDS: int = getattr(pki, "CA_KEY_KDF_ROUNDS", 0)  # 0: none before it existed
TEST_KDF_ROUNDS = 2


@pytest.fixture(autouse=True)
def quick_kdf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pki, "CA_KEY_KDF_ROUNDS", TEST_KDF_ROUNDS, raising=False)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def snapshot(directory: Path) -> dict[str, tuple[bytes, int, int]]:
    return {
        path.name: (path.read_bytes(), path.stat().st_mtime_ns, mode_of(path))
        for path in sorted(directory.iterdir())
    }


@pytest.fixture
def ca_dir(tmp_path: Path) -> Path:
    return tmp_path / "ca"


@pytest.fixture
def authority(ca_dir: Path) -> CertificateAuthority:
    created = pki.open_ca(ca_dir, PASSPHRASE)
    assert created is not None
    return created


def wanted(names: tuple[str, ...] = ("node1.cluster.example",), **tls: Any) -> WantedCertificate:
    return pki.wanted_certificate(
        "node1", Tls(enabled=True, names=names, ip_addresses=("10.0.0.11",), **tls)
    )


def node_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def make_csr(
    key: PrivateKey, dns_names: list[str], ip_addresses: tuple[str, ...] | list[str] = ()
) -> bytes:
    """What `openssl req -new -key node.key -addext subjectAltName=...` prints on a node."""
    alt_names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node1")])
    )
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def public_pem(key: PrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


# --- the CA ------------------------------------------------------------------------------------


def test_new_ca_has_an_encrypted_key_private_to_its_owner(
    ca_dir: Path, authority: CertificateAuthority
) -> None:
    assert mode_of(ca_dir) == 0o700
    assert mode_of(ca_dir / "ca.key") == 0o600
    assert sorted(path.name for path in ca_dir.iterdir()) == ["ca.crt", "ca.key"]
    key_pem = (ca_dir / "ca.key").read_bytes()
    assert key_pem.startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
    with pytest.raises(TypeError):  # unusable without the passphrase
        serialization.load_ssh_private_key(key_pem, None)
    assert serialization.load_ssh_private_key(key_pem, PASSPHRASE) is not None


def old_format_key(private_key: ec.EllipticCurvePrivateKey, passphrase: bytes) -> bytes:
    """The CA key as gpunode wrote it before: PKCS#8, PBKDF2 with 2048 iterations."""
    return private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(passphrase),
    )


def test_new_ca_key_is_derived_with_bcrypt_pbkdf_not_pbkdf2(
    ca_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pki, "CA_KEY_KDF_ROUNDS", STRONG_KDF_ROUNDS)
    assert pki.open_ca(ca_dir, PASSPHRASE) is not None
    key_pem = (ca_dir / "ca.key").read_bytes()
    assert not key_pem.startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")  # PKCS#8/PBKDF2
    assert pki.openssh_key_encryption(key_pem) == ("aes256-ctr", "bcrypt", STRONG_KDF_ROUNDS)
    assert STRONG_KDF_ROUNDS >= 64
    # ssh-keygen reads it too: that is how an operator changes the passphrase.
    public = subprocess.run(
        ["ssh-keygen", "-y", "-P", PASSPHRASE.decode(), "-f", str(ca_dir / "ca.key")],
        capture_output=True,
        text=True,
    )
    assert public.returncode == 0, public.stderr
    assert public.stdout.startswith("ecdsa-sha2-nistp384 ")


def test_a_short_passphrase_is_refused_for_a_new_ca(ca_dir: Path) -> None:
    with pytest.raises(CaError, match="shorter than 16 characters; choose a longer one"):
        pki.open_ca(ca_dir, b"fifteen chars!!")
    assert not ca_dir.exists()
    assert pki.open_ca(ca_dir, b"sixteen chars!!!") is not None


def test_a_key_encrypted_the_old_way_still_loads_and_is_re_encrypted(
    ca_dir: Path, authority: CertificateAuthority
) -> None:
    key_path = ca_dir / "ca.key"
    key_path.write_bytes(old_format_key(authority.private_key, PASSPHRASE))
    assert key_path.read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
    with pytest.raises(CaError, match="wrong passphrase"):
        unlocked(pki.open_ca(ca_dir, b"not the passphrase"))
    assert key_path.read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")

    assert unlocked(pki.open_ca(ca_dir, PASSPHRASE, create=False)) is not None  # a dry run
    assert key_path.read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")

    loaded = pki.open_ca(ca_dir, PASSPHRASE)
    assert loaded is not None and loaded.certificate == authority.certificate
    assert loaded.private_key.private_numbers() == authority.private_key.private_numbers()
    migrated = key_path.read_bytes()
    assert pki.openssh_key_encryption(migrated) == ("aes256-ctr", "bcrypt", TEST_KDF_ROUNDS)
    assert mode_of(key_path) == 0o600
    assert sorted(path.name for path in ca_dir.iterdir()) == ["ca.crt", "ca.key"]
    assert unlocked(pki.open_ca(ca_dir, PASSPHRASE)) is not None
    assert key_path.read_bytes() == migrated, "re-encrypted once, then left alone"


def test_a_short_passphrase_of_an_existing_ca_is_refused_with_how_to_change_it(
    ca_dir: Path, authority: CertificateAuthority
) -> None:
    key_path = ca_dir / "ca.key"
    key_path.write_bytes(old_format_key(authority.private_key, b"short"))
    before = snapshot(ca_dir)
    with pytest.raises(CaError) as refused:
        pki.open_ca(ca_dir, b"short")
    assert "shorter than 16 characters" in str(refused.value)
    change = f"ssh-keygen -p -a {TEST_KDF_ROUNDS} -f {key_path}"
    assert change in str(refused.value)
    assert snapshot(ca_dir) == before
    # What the message says works, and the CA is usable with the new passphrase.
    changed = subprocess.run(
        [*change.split(), "-P", "short", "-N", PASSPHRASE.decode()], capture_output=True
    )
    assert changed.returncode == 0, changed.stderr
    loaded = pki.open_ca(ca_dir, PASSPHRASE)
    assert loaded is not None and loaded.certificate == authority.certificate


def test_new_ca_certificate_is_a_ten_year_leaf_only_ca(authority: CertificateAuthority) -> None:
    certificate = authority.certificate
    constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical
    assert (constraints.value.ca, constraints.value.path_length) == (True, 0)
    usage = certificate.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign and not usage.digital_signature
    lifetime = certificate.not_valid_after_utc - certificate.not_valid_before_utc
    assert 3650 <= lifetime.days <= 3653
    public_key = certificate.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    assert public_key.curve.name in ("secp256r1", "secp384r1")
    certificate.verify_directly_issued_by(certificate)


def test_existing_ca_is_reused_unchanged(ca_dir: Path, authority: CertificateAuthority) -> None:
    before = snapshot(ca_dir)
    again = pki.open_ca(ca_dir, PASSPHRASE)
    assert again is not None
    assert again.certificate == authority.certificate
    assert snapshot(ca_dir) == before


def unlocked(authority: CertificateAuthority | None) -> CertificateAuthority | None:
    """``authority`` with its key decrypted (what signing does first)."""
    if authority is not None:
        authority.unlock()
    return authority


def test_wrong_passphrase_is_refused_and_nothing_changes(
    ca_dir: Path, authority: CertificateAuthority
) -> None:
    before = snapshot(ca_dir)
    opened = pki.open_ca(ca_dir, b"not the passphrase")
    assert opened is not None and opened.certificate == authority.certificate
    with pytest.raises(CaError, match=r"wrong passphrase for the CA key .*nothing was changed"):
        opened.unlock()
    assert snapshot(ca_dir) == before


def test_the_key_is_decrypted_only_when_something_is_signed(
    ca_dir: Path, authority: CertificateAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bcrypt KDF is the CA's cost by design: a run with nothing to sign never pays it.
    decrypted: list[bytes] = []
    real = serialization.load_ssh_private_key

    def counting(data: bytes, password: bytes | None, *args: Any, **kwargs: Any) -> Any:
        decrypted.append(data)
        return real(data, password, *args, **kwargs)

    monkeypatch.setattr(serialization, "load_ssh_private_key", counting)
    opened = pki.open_ca(ca_dir, PASSPHRASE)
    assert opened is not None and opened.certificate_pem == authority.certificate_pem
    assert decrypted == []
    opened.unlock()
    opened.unlock()
    key = opened.private_key
    assert len(decrypted) == 1
    assert key.private_numbers() == authority.private_key.private_numbers()


def test_no_passphrase_for_a_new_ca_says_how_to_set_one(ca_dir: Path) -> None:
    with pytest.raises(CaError) as refused:
        pki.open_ca(ca_dir, None)
    message = str(refused.value)
    assert "GPUNODE_CA_PASSPHRASE " in message and "GPUNODE_CA_PASSPHRASE_FILE" in message
    assert not ca_dir.exists()


def test_no_passphrase_for_an_existing_ca_is_refused(
    ca_dir: Path, authority: CertificateAuthority
) -> None:
    with pytest.raises(CaError, match="is encrypted: set GPUNODE_CA_PASSPHRASE"):
        pki.open_ca(ca_dir, None)


def test_dry_run_does_not_create_the_ca(ca_dir: Path) -> None:
    assert pki.open_ca(ca_dir, PASSPHRASE, create=False) is None
    assert not ca_dir.exists()


def test_readable_ca_key_is_refused(ca_dir: Path, authority: CertificateAuthority) -> None:
    (ca_dir / "ca.key").chmod(0o644)
    with pytest.raises(CaError, match=r"mode 0644.*chmod 600"):
        pki.open_ca(ca_dir, PASSPHRASE)


def test_new_ca_is_not_made_in_a_shared_directory(ca_dir: Path) -> None:
    ca_dir.mkdir(mode=0o755)
    ca_dir.chmod(0o755)
    with pytest.raises(CaError, match="chmod 700"):
        pki.open_ca(ca_dir, PASSPHRASE)
    assert list(ca_dir.iterdir()) == []


def test_half_a_ca_is_refused_never_replaced(ca_dir: Path, authority: CertificateAuthority) -> None:
    (ca_dir / "ca.crt").unlink()
    key_before = (ca_dir / "ca.key").read_bytes()
    with pytest.raises(CaError, match="incomplete CA"):
        pki.open_ca(ca_dir, PASSPHRASE)
    assert (ca_dir / "ca.key").read_bytes() == key_before
    assert not (ca_dir / "ca.crt").exists()


def test_passphrase_comes_from_the_variable_or_a_private_file(tmp_path: Path) -> None:
    assert pki.ca_passphrase({}) is None
    assert pki.ca_passphrase({"GPUNODE_CA_PASSPHRASE": "direct"}) == b"direct"
    secret_file = tmp_path / "passphrase"
    secret_file.write_text("from file\n")
    secret_file.chmod(0o600)
    env = {"GPUNODE_CA_PASSPHRASE_FILE": str(secret_file)}
    assert pki.ca_passphrase(env) == b"from file"
    assert pki.ca_passphrase({**env, "GPUNODE_CA_PASSPHRASE": "direct"}) == b"direct"
    secret_file.chmod(0o644)
    with pytest.raises(CaError, match="readable by others"):
        pki.ca_passphrase(env)
    with pytest.raises(CaError, match="cannot read it"):
        pki.ca_passphrase({"GPUNODE_CA_PASSPHRASE_FILE": str(tmp_path / "missing")})


def test_ca_directory_defaults_to_the_users_data_directory() -> None:
    assert pki.ca_directory({}) == Path("~/.local/share/gpunode/ca").expanduser()
    assert pki.ca_directory({"GPUNODE_CA_DIR": "/srv/ca"}) == Path("/srv/ca")


def test_inventory_names_the_ca_and_the_environment_wins(tmp_path: Path) -> None:
    configured = str(tmp_path / "inventory-ca")
    assert pki.ca_directory({}, configured) == tmp_path / "inventory-ca"
    assert pki.ca_directory({"GPUNODE_CA_DIR": "/srv/ca"}, configured) == Path("/srv/ca")
    passphrase_file = tmp_path / "passphrase"
    passphrase_file.write_text("from the inventory's file\n")
    passphrase_file.chmod(0o600)
    assert pki.ca_passphrase({}, str(passphrase_file)) == b"from the inventory's file"
    direct = {"GPUNODE_CA_PASSPHRASE": "from the environment"}
    assert pki.ca_passphrase(direct, str(passphrase_file)) == b"from the environment"


def test_unreadable_inventory_passphrase_file_is_named_by_its_key(tmp_path: Path) -> None:
    with pytest.raises(CaError, match=r"tls\.ca_passphrase_file=.*missing: cannot read it"):
        pki.ca_passphrase({}, str(tmp_path / "missing"))


def test_certificate_authority_opens_the_ca_the_inventory_names(tmp_path: Path) -> None:
    passphrase_file = tmp_path / "passphrase"
    passphrase_file.write_bytes(PASSPHRASE + b"\n")
    passphrase_file.chmod(0o600)
    tls = Tls(
        enabled=True,
        ca_directory=str(tmp_path / "ca"),
        ca_passphrase_file=str(passphrase_file),
    )
    assert pki.certificate_authority(tls, create=False, env={}) is None, "nothing made on --dry"
    created = pki.certificate_authority(tls, env={})
    assert created is not None
    assert sorted(path.name for path in (tmp_path / "ca").iterdir()) == ["ca.crt", "ca.key"]


def test_certificate_authority_opens_each_ca_once_and_decrypts_its_key_on_use(
    tmp_path: Path, authority: CertificateAuthority, ca_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pki, "_opened", {})
    tls = Tls(enabled=True, ca_directory=str(ca_dir))
    right = {"GPUNODE_CA_PASSPHRASE": PASSPHRASE.decode()}
    opened = pki.certificate_authority(tls, env=right)
    assert opened is not None and pki.certificate_authority(tls, env=right) is opened
    assert opened.private_key.private_numbers() == authority.private_key.private_numbers()
    # A wrong passphrase: the CA certificate is usable; the same CaError where it signs.
    monkeypatch.setattr(pki, "_opened", {})
    wrong = {"GPUNODE_CA_PASSPHRASE": "not the passphrase at all"}
    before = snapshot(ca_dir)
    refused = pki.certificate_authority(tls, env=wrong)
    assert refused is not None and refused.certificate == authority.certificate
    with pytest.raises(CaError, match=r"wrong passphrase for the CA key .*nothing was changed"):
        refused.unlock()
    assert snapshot(ca_dir) == before


# --- names --------------------------------------------------------------------------------


def test_wanted_names_are_the_host_name_plus_declared_names() -> None:
    declared = Tls(
        enabled=True, names=("node1", "NODE1.example", "node1.example"), ip_addresses=("10.0.0.1",)
    )
    names = pki.wanted_certificate("node1", declared)
    assert names.dns_names == ("node1", "NODE1.example")
    assert names.ip_addresses == ("10.0.0.1",)
    assert names.subject_alt_names() == "DNS:node1,DNS:NODE1.example,IP:10.0.0.1"


def test_a_host_named_by_address_gets_an_ip_name() -> None:
    names = pki.wanted_certificate("10.0.0.7", Tls(enabled=True, names=("n7.example",)))
    assert (names.dns_names, names.ip_addresses) == (("n7.example",), ("10.0.0.7",))


def test_a_host_name_that_cannot_be_certified_is_refused() -> None:
    with pytest.raises(PkiError, match="neither a DNS name nor an IP address"):
        pki.wanted_certificate("node_1/evil", Tls(enabled=True))


# --- signing ------------------------------------------------------------------------------


def test_signed_certificate_names_the_node_for_serving_only(
    authority: CertificateAuthority,
) -> None:
    key = node_key()
    request = wanted(validity_days=90)
    csr = make_csr(key, ["node1", "node1.cluster.example"], ["10.0.0.11"])
    certificate = pki.sign_csr(authority, csr, request, public_pem(key), now=NOW)

    certificate.verify_directly_issued_by(authority.certificate)
    assert pki.certificate_names(certificate) == (["node1", "node1.cluster.example"], ["10.0.0.11"])
    usage = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    # For serving only: a node's certificate cannot scrape another node's exporter.
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca is False
    assert certificate.not_valid_after_utc == NOW + datetime.timedelta(days=90)
    assert certificate.not_valid_before_utc <= NOW
    assert certificate.public_key() == key.public_key()
    assert certificate.subject.rfc4514_string() == "CN=node1"


def test_csr_name_order_and_case_do_not_matter(authority: CertificateAuthority) -> None:
    key = node_key()
    csr = make_csr(key, ["NODE1.cluster.example", "node1"], ["10.0.0.11"])
    certificate = pki.sign_csr(authority, csr, wanted(), now=NOW)
    # The certificate carries the inventory's names, not the request's spelling.
    assert pki.certificate_names(certificate)[0] == ["node1", "node1.cluster.example"]


@pytest.mark.parametrize(
    ("dns_names", "ip_addresses", "problem"),
    [
        (["node1", "node1.cluster.example", "evil.example"], ["10.0.0.11"], "evil.example"),
        (["node1"], ["10.0.0.11"], "the request names node1, 10.0.0.11,"),
        (["node1", "node1.cluster.example"], ["10.0.0.99"], "10.0.0.99"),
        ([], [], "the request names no names"),
    ],
)
def test_csr_whose_names_differ_from_the_wanted_ones_is_refused(
    authority: CertificateAuthority, dns_names: list[str], ip_addresses: list[str], problem: str
) -> None:
    csr = make_csr(node_key(), dns_names, ip_addresses)
    with pytest.raises(CsrRefused) as refused:
        pki.sign_csr(authority, csr, wanted(), now=NOW)
    assert problem in str(refused.value)
    assert "inventory declares node1, node1.cluster.example, 10.0.0.11" in str(refused.value)


def test_csr_for_another_key_than_the_nodes_is_refused(authority: CertificateAuthority) -> None:
    csr = make_csr(node_key(), ["node1", "node1.cluster.example"], ["10.0.0.11"])
    with pytest.raises(CsrRefused, match="not for the key in the node's key file"):
        pki.sign_csr(authority, csr, wanted(), expected_public_key_pem=public_pem(node_key()))


def test_csr_with_a_key_of_another_kind_is_refused(authority: CertificateAuthority) -> None:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    csr = make_csr(rsa_key, ["node1", "node1.cluster.example"], ["10.0.0.11"])
    with pytest.raises(CsrRefused, match="not an EC key"):
        pki.sign_csr(authority, csr, wanted())


def test_garbage_instead_of_a_csr_is_refused(authority: CertificateAuthority) -> None:
    with pytest.raises(CsrRefused, match="no PEM certificate request"):
        pki.sign_csr(authority, b"sudo: a password is required\n", wanted())


def test_certificate_never_outlives_its_ca(authority: CertificateAuthority) -> None:
    late = authority.certificate.not_valid_after_utc - datetime.timedelta(days=10)
    certificate = pki.issue_certificate(authority, node_key().public_key(), wanted(), now=late)
    assert certificate.not_valid_after_utc == authority.certificate.not_valid_after_utc


# --- when to re-issue -----------------------------------------------------------------------------


def tls_part(label: str, lines: list[str] | None, exit_code: int = 0) -> dict[str, PartOutput]:
    """The two parts of the NodeCertificate fact for one file: it exists, and what its
    openssl command printed (None: the file does not exist, the command did not run)."""
    if lines is None:
        return {
            f"{label}-exists": PartOutput(f"{label}-exists", [], [], 1),
            label: PartOutput(label, skipped=True),
        }
    return {
        f"{label}-exists": PartOutput(f"{label}-exists", [], [], 0),
        label: PartOutput(label, lines, [], exit_code),
    }


def fact_output(certificate: x509.Certificate | None, key: PrivateKey | None) -> list[str]:
    """What the NodeCertificate fact command prints for this certificate and key."""
    pem = certificate.public_bytes(serialization.Encoding.PEM).decode() if certificate else None
    public = public_pem(key).decode() if key is not None else None
    return framing.output_of(
        tls_part("certificate", pem.splitlines() if pem is not None else None)
        | tls_part("public-key", public.splitlines() if public is not None else None)
    )


@pytest.fixture
def issued(authority: CertificateAuthority) -> Issued:
    """A node key and the certificate the CA issued for it at NOW, for wanted()."""
    key = node_key()
    return key, pki.issue_certificate(authority, key.public_key(), wanted(), now=NOW)


def reason(
    authority: CertificateAuthority, lines: list[str], days_later: int = 0, **wants: Any
) -> str | None:
    when = NOW + datetime.timedelta(days=days_later)
    report = parse_node_certificate(lines, now=when)
    return pki.reissue_reason(report, wanted(**wants), authority.certificate, when)


def test_a_fine_certificate_is_kept(authority: CertificateAuthority, issued: Issued) -> None:
    key, certificate = issued
    assert reason(authority, fact_output(certificate, key), days_later=300) is None


def test_no_certificate_is_issued(authority: CertificateAuthority) -> None:
    assert reason(authority, fact_output(None, node_key())) == "no certificate on the node"
    assert reason(authority, fact_output(None, None)) == "no certificate on the node"


def test_an_unreadable_certificate_is_issued_anew(authority: CertificateAuthority) -> None:
    lines = framing.output_of(
        tls_part("certificate", ["Could not read certificate"], exit_code=1)
        | tls_part("public-key", public_pem(node_key()).decode().splitlines())
    )
    assert f"unreadable: `{CERT_COMMAND}` failed" in str(reason(authority, lines))


def test_names_differing_cause_a_reissue(authority: CertificateAuthority, issued: Issued) -> None:
    key, certificate = issued
    why = reason(authority, fact_output(certificate, key), names=("other.example",))
    assert why == (
        "names differ: the certificate has node1, node1.cluster.example, 10.0.0.11, "
        "wanted node1, other.example, 10.0.0.11"
    )


def test_key_not_matching_causes_a_reissue(authority: CertificateAuthority, issued: Issued) -> None:
    _, certificate = issued
    assert reason(authority, fact_output(certificate, node_key())) == (
        "the node's key does not match its certificate"
    )
    assert reason(authority, fact_output(certificate, None)) == "the node has no key"


def test_certificate_from_another_ca_causes_a_reissue(tmp_path: Path, issued: Issued) -> None:
    key, certificate = issued
    other = pki.open_ca(tmp_path / "other-ca", PASSPHRASE)
    assert other is not None
    why = reason(other, fact_output(certificate, key))
    assert why is not None and why.startswith("not signed by the current CA (issuer: CN=gpunode")


def test_expiry_inside_the_renewal_window_causes_a_reissue(
    authority: CertificateAuthority,
    issued: Issued,
) -> None:
    key, certificate = issued
    lines = fact_output(certificate, key)
    # Issued for 365 days: 31 days left is outside a 30-day window, 30 days left inside it.
    assert reason(authority, lines, days_later=334, renew_before_days=30) is None
    why = reason(authority, lines, days_later=335, renew_before_days=30)
    assert why is not None and "inside the renewal window of 30 days" in why
    assert reason(authority, lines, days_later=300, renew_before_days=90) is not None


def test_a_scraper_certificate_is_for_clients_only(authority: CertificateAuthority) -> None:
    key = node_key()
    csr = make_csr(key, ["node1", "node1.cluster.example"], ["10.0.0.11"])
    scraper = pki.wanted_certificate(
        "node1",
        Tls(enabled=True, names=("node1.cluster.example",), ip_addresses=("10.0.0.11",)),
        usage="client",
    )
    certificate = pki.sign_csr(authority, csr, scraper, public_pem(key), now=NOW)
    usage = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert pki.extended_key_usages(certificate) == ("client",)


def old_style_certificate(
    authority: CertificateAuthority, key: ec.EllipticCurvePrivateKey
) -> x509.Certificate:
    """A node certificate as gpunode issued them before: for serving and as a client."""
    issued = pki.issue_certificate(authority, key.public_key(), wanted(), now=NOW)
    builder = x509.CertificateBuilder(
        issuer_name=issued.issuer,
        subject_name=issued.subject,
        public_key=issued.public_key(),
        serial_number=issued.serial_number,
        not_valid_before=issued.not_valid_before_utc,
        not_valid_after=issued.not_valid_after_utc,
    )
    for extension in issued.extensions:
        value = extension.value
        if isinstance(value, x509.ExtendedKeyUsage):
            value = x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            )
        builder = builder.add_extension(value, extension.critical)
    return builder.sign(authority.private_key, hashes.SHA384())


def test_a_node_certificate_that_can_act_as_a_client_is_issued_anew(
    authority: CertificateAuthority,
) -> None:
    key = node_key()
    lines = fact_output(old_style_certificate(authority, key), key)
    assert reason(authority, lines, days_later=1) == (
        "it is for server, client; wanted server only (a node certificate must not act as a client)"
    )


def test_a_scraper_certificate_that_could_serve_is_issued_anew(
    authority: CertificateAuthority, issued: Issued
) -> None:
    key, certificate = issued  # a node certificate: for serving
    report = parse_node_certificate(fact_output(certificate, key), now=NOW)
    scraper = pki.wanted_certificate(
        "node1",
        Tls(enabled=True, names=("node1.cluster.example",), ip_addresses=("10.0.0.11",)),
        usage="client",
    )
    assert pki.reissue_reason(report, scraper, authority.certificate, NOW) == (
        "it is for server; wanted client only"
    )


def test_a_dry_run_before_the_ca_exists_predicts_a_reissue(issued: Issued) -> None:
    key, certificate = issued
    report = parse_node_certificate(fact_output(certificate, key), now=NOW)
    why = pki.reissue_reason(report, wanted(), None, NOW)
    assert why == "the CA does not exist yet; it is created on the first real run"

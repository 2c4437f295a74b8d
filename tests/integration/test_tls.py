"""deploys/tls.py on lab nodes: issue, keep, re-issue; node keys stay on the nodes."""

from __future__ import annotations

import base64
import datetime
import json
import os
import secrets
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpunode import pki
from gpunode.model import Tls
from lab import Lab, LabNode
from roles.tls import TRUST_LINK, TRUST_PATH

from .conftest import ROOT, PyinfraRun, run_pyinfra, ssh

pytestmark = pytest.mark.lab

DEPLOY = "deploys/tls.py"
CERTIFICATE_OP = "TLS | Node certificate"
BASE_TLS: dict[str, Any] = {
    "enabled": True,
    "names": ["gpu.lab.example"],
    "ip_addresses": ["192.0.2.10"],
}
SKIPPED_DIRS = {".venv", ".git", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


def tls_data(**overrides: Any) -> list[str]:
    return ["--data", "tls=" + json.dumps({**BASE_TLS, **overrides})]


@dataclass
class Control:
    """The control side of these tests: their own CA, passphrase and temporary directory."""

    ca_dir: Path
    passphrase: str
    scratch: Path

    def authority(self) -> pki.CertificateAuthority:
        authority = pki.open_ca(self.ca_dir, self.passphrase.encode(), create=False)
        assert authority is not None
        return authority


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Control]:
    root = tmp_path_factory.mktemp("tls-control")
    passphrase = secrets.token_urlsafe(24)
    passphrase_file = root / "passphrase"
    passphrase_file.write_text(passphrase + "\n")
    passphrase_file.chmod(0o600)
    scratch = root / "tmp"
    scratch.mkdir()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GPUNODE_CA_DIR", str(root / "ca"))
        env.setenv("GPUNODE_CA_PASSPHRASE_FILE", str(passphrase_file))
        env.delenv("GPUNODE_CA_PASSPHRASE", raising=False)
        # pyinfra's own temporary files land here, where the key scan below looks.
        env.setenv("TMPDIR", str(scratch))
        yield Control(root / "ca", passphrase, scratch)


@dataclass
class Converged:
    run: PyinfraRun
    started: float
    nodes: list[LabNode]
    planted_ca_pem: str


@pytest.fixture(scope="module")
def converged(lab: Lab, lab_nodes: list[LabNode], control: Control) -> Converged:
    # As an earlier gpunode left them: a CA in the system trust store (here a stand-in).
    planted_ca_pem = stand_in_ca_pem()
    planted = shlex.quote(planted_ca_pem)
    for node in lab_nodes:
        wipe = (
            f"sudo rm -rf /etc/gpunode/tls && printf %s {planted} | sudo tee {TRUST_PATH} "
            f">/dev/null && sudo update-ca-certificates >/dev/null && test -L {TRUST_LINK}"
        )
        assert ssh(lab, node, wipe).returncode == 0
    started = time.time()
    run = run_pyinfra("-vvv", *tls_data(), DEPLOY)
    assert run.returncode == 0, run.output
    return Converged(run, started, lab_nodes, planted_ca_pem)


def stand_in_ca_pem() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpunode stand-in CA")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


def node_certificate(lab: Lab, node: LabNode) -> x509.Certificate:
    result = ssh(lab, node, "cat /etc/gpunode/tls/node.crt")
    assert result.returncode == 0, result.stderr
    return x509.load_pem_x509_certificate(result.stdout.encode())


def node_public_key(lab: Lab, node: LabNode) -> ec.EllipticCurvePublicKey:
    result = ssh(lab, node, "sudo openssl pkey -in /etc/gpunode/tls/node.key -pubout")
    assert result.returncode == 0, result.stderr
    key = serialization.load_pem_public_key(result.stdout.encode())
    assert isinstance(key, ec.EllipticCurvePublicKey)
    return key


def names_of(certificate: x509.Certificate) -> tuple[list[str], list[str]]:
    return pki.certificate_names(certificate)


def changed(run: PyinfraRun) -> set[tuple[str, str]]:
    return {(name, host) for name, hosts in run.changed_operations().items() for host in hosts}


def new_private_key_files(since: float, roots: list[Path]) -> list[Path]:
    """Files under ``roots`` written since ``since`` that hold a PEM private key."""
    found = []
    for root in roots:
        for directory, subdirectories, file_names in os.walk(root):
            subdirectories[:] = [name for name in subdirectories if name not in SKIPPED_DIRS]
            for file_name in file_names:
                path = Path(directory, file_name)
                try:
                    info = path.lstat()
                    if not path.is_file() or info.st_mtime < since or info.st_size > 1 << 20:
                        continue
                    if b"PRIVATE KEY" in path.read_bytes():
                        found.append(path)
                except OSError:
                    continue
    return found


def assert_reveals_no_secret(output: str, passphrase: str) -> None:
    """Checked as booleans: a failing comparison must not print the secret it found."""
    private_key_printed = "PRIVATE KEY" in output
    passphrase_printed = passphrase in output
    assert not private_key_printed, "pyinfra's output holds a private key"
    assert not passphrase_printed, "pyinfra's output holds the CA passphrase"


def test_converge_issues_a_certificate_on_each_node(
    lab: Lab, converged: Converged, control: Control
) -> None:
    assert changed(converged.run) >= {(CERTIFICATE_OP, node.name) for node in converged.nodes}
    ca_pem = (control.ca_dir / "ca.crt").read_text()
    for node in converged.nodes:
        verify = ssh(
            lab, node, "openssl verify -CAfile /etc/gpunode/tls/ca.crt /etc/gpunode/tls/node.crt"
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr
        # The system bundle, which curl, Python and Go trust, does not hold the CA, and the
        # one an earlier run put there is gone, links and all.
        system = ssh(
            lab,
            node,
            "openssl verify -CAfile /etc/ssl/certs/ca-certificates.crt /etc/gpunode/tls/node.crt",
        )
        assert system.returncode != 0, system.stdout
        left = ssh(lab, node, f"test -e {TRUST_PATH} || test -L {TRUST_LINK}")
        assert left.returncode == 1, left.stdout + left.stderr
        bundle = ssh(lab, node, "cat /etc/ssl/certs/ca-certificates.crt").stdout
        assert bundle.count("BEGIN CERTIFICATE") > 50  # Debian's own CAs are all still there
        assert converged.planted_ca_pem.splitlines()[1] not in bundle
        assert ssh(lab, node, "cat /etc/gpunode/tls/ca.crt").stdout == ca_pem
        certificate = node_certificate(lab, node)
        assert names_of(certificate) == ([node.name, "gpu.lab.example"], ["192.0.2.10"])
        lifetime = certificate.not_valid_after_utc - certificate.not_valid_before_utc
        assert datetime.timedelta(days=365) <= lifetime <= datetime.timedelta(days=365, hours=1)


def test_node_key_is_made_on_the_node_and_never_leaves_it(
    lab: Lab, converged: Converged, control: Control
) -> None:
    for node in converged.nodes:
        owner = ssh(lab, node, "sudo stat -c '%a %U %G' /etc/gpunode/tls/node.key")
        assert owner.stdout.strip() == "600 root root"
        assert node_public_key(lab, node) == node_certificate(lab, node).public_key()
    scanned = [ROOT, lab.state_dir, control.ca_dir.parent, control.scratch]
    found = new_private_key_files(converged.started, scanned)
    assert found == [control.ca_dir / "ca.key"]
    assert_reveals_no_secret(converged.run.output, control.passphrase)


def test_second_run_changes_nothing_and_prints_no_private_key(
    converged: Converged, control: Control
) -> None:
    second = run_pyinfra("-vvv", *tls_data(), DEPLOY)
    assert second.returncode == 0, second.output
    assert second.changed_operations() == {}
    assert second.results is not None
    assert second.results["results"]["totals"]["error"] == 0
    # -vvv prints every fact's output, read now from nodes that hold a key.
    assert "BEGIN PUBLIC KEY" in second.output
    assert_reveals_no_secret(second.output, control.passphrase)


def test_tls_disabled_leaves_the_node_alone(lab: Lab, converged: Converged) -> None:
    serials = {node.name: node_certificate(lab, node).serial_number for node in converged.nodes}
    # The exporters serve only with the node certificate: they go off with TLS (in the data;
    # deploys/tls.py does not touch them).
    no_tls = ["--data", 'tls={"enabled": false}', "--data", 'node_exporter={"enabled": false}',
              "--data", 'dcgm={"enabled": false, "exporter": false}']  # fmt: skip
    run = run_pyinfra("-v", *no_tls, DEPLOY)
    assert run.returncode == 0, run.output
    assert run.changed_operations() == {}
    assert "noop: tls.enabled is false" in run.output
    for node in converged.nodes:
        assert node_certificate(lab, node).serial_number == serials[node.name]


def test_changed_names_are_reissued_for_the_same_key(lab: Lab, converged: Converged) -> None:
    keys = {node.name: node_public_key(lab, node) for node in converged.nodes}
    renamed = run_pyinfra(*tls_data(names=["gpu.lab.example", "gpu2.lab.example"]), DEPLOY)
    assert renamed.returncode == 0, renamed.output
    assert changed(renamed) == {(CERTIFICATE_OP, node.name) for node in converged.nodes}
    for node in converged.nodes:
        certificate = node_certificate(lab, node)
        assert names_of(certificate)[0] == [node.name, "gpu.lab.example", "gpu2.lab.example"]
        assert certificate.public_key() == keys[node.name]

    restored = run_pyinfra(*tls_data(), DEPLOY)
    assert restored.returncode == 0, restored.output
    assert changed(restored) == {(CERTIFICATE_OP, node.name) for node in converged.nodes}
    for node in converged.nodes:
        assert names_of(node_certificate(lab, node))[0] == [node.name, "gpu.lab.example"]


def test_dry_run_predicts_the_reissue_of_a_certificate_near_expiry(
    lab: Lab, converged: Converged, control: Control
) -> None:
    node = converged.nodes[-1]
    wanted = pki.wanted_certificate(node.name, Tls(**BASE_TLS))
    issued_at = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=365 - 5)
    expiring = pki.issue_certificate(
        control.authority(), node_public_key(lab, node), wanted, now=issued_at
    )
    pem = base64.b64encode(expiring.public_bytes(serialization.Encoding.PEM)).decode()
    install = f"echo {pem} | base64 -d | sudo tee /etc/gpunode/tls/node.crt >/dev/null"
    assert ssh(lab, node, install).returncode == 0
    assert node_certificate(lab, node) == expiring

    dry = run_pyinfra("--dry", *tls_data(), DEPLOY)
    assert dry.returncode == 0, dry.output
    assert dry.results is not None
    predicted = {
        (op["name"], host) for op in dry.results["plan"] for host in op["hosts_with_change"]
    }
    assert predicted == {(CERTIFICATE_OP, node.name)}
    assert node_certificate(lab, node) == expiring, "--dry changed the node"

    real = run_pyinfra(*tls_data(), DEPLOY)
    assert real.returncode == 0, real.output
    assert changed(real) == predicted
    renewed = node_certificate(lab, node)
    assert renewed.serial_number != expiring.serial_number
    left = renewed.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert left > datetime.timedelta(days=364)


def test_wrong_passphrase_stops_the_run_before_any_change(
    lab: Lab, converged: Converged, control: Control
) -> None:
    serials = {node.name: node_certificate(lab, node).serial_number for node in converged.nodes}
    wrong = "not-" + control.passphrase
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GPUNODE_CA_PASSPHRASE", wrong)
        # New names: had the run gone on, every node would have been re-issued.
        run = run_pyinfra(*tls_data(names=["other.lab.example"]), DEPLOY)
    assert run.returncode != 0
    assert "wrong passphrase for the CA key" in run.output
    assert_reveals_no_secret(run.output, wrong)
    for node in converged.nodes:
        assert node_certificate(lab, node).serial_number == serials[node.name]

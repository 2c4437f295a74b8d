"""TLS checks: a node certificate from the internal CA, its key private to root, the CA out
of the system trust store."""

from __future__ import annotations

from typing import Any

import pytest

from gpunode.model import DesiredState

TLS_DIR = "/etc/gpunode/tls"
KEY_PATH = f"{TLS_DIR}/node.key"
CERT_PATH = f"{TLS_DIR}/node.crt"
CA_PATH = f"{TLS_DIR}/ca.crt"
# Where update-ca-certificates would take the CA into the system store from, and the link
# it would make there.
TRUST_PATH = "/usr/local/share/ca-certificates/gpunode-ca.crt"
TRUST_LINK = "/etc/ssl/certs/gpunode-ca.pem"


@pytest.fixture
def wanted(desired: DesiredState) -> DesiredState:
    if not desired.tls.enabled:
        pytest.skip("tls.enabled is false for this host in the inventory")
    return desired


def test_node_key_is_private_to_root(host: Any, wanted: DesiredState) -> None:
    key = host.file(KEY_PATH)
    assert (key.user, key.group, key.mode) == ("root", "root", 0o600)


def test_certificate_verifies_against_the_ca(host: Any, wanted: DesiredState) -> None:
    assert host.run(f"openssl verify -CAfile {CA_PATH} {CERT_PATH}").rc == 0


def test_certificate_names_the_host(host: Any, wanted: DesiredState) -> None:
    text = host.check_output(f"openssl x509 -in {CERT_PATH} -noout -ext subjectAltName")
    for name in wanted.tls.names:
        assert f"DNS:{name}" in text


def test_certificate_is_outside_the_renewal_window(host: Any, wanted: DesiredState) -> None:
    seconds = wanted.tls.renew_before_days * 86400
    assert host.run(f"openssl x509 -in {CERT_PATH} -noout -checkend {seconds}").rc == 0


def test_ca_is_not_in_the_system_trust_store(host: Any, wanted: DesiredState) -> None:
    assert not host.file(TRUST_PATH).exists
    assert not host.file(TRUST_LINK).exists
    # Only what is pointed at ca.crt trusts the node certificate; the system store does not.
    assert host.run(f"openssl verify {CERT_PATH}").rc != 0


def test_certificate_serves_and_cannot_act_as_a_client(host: Any, wanted: DesiredState) -> None:
    """For serverAuth only: presented as a client, no exporter admits it."""
    text = host.check_output(f"openssl x509 -in {CERT_PATH} -noout -ext extendedKeyUsage")
    assert text.splitlines()[1:] == ["    TLS Web Server Authentication"], text
    assert host.run(f"openssl verify -purpose sslclient -CAfile {CA_PATH} {CERT_PATH}").rc != 0

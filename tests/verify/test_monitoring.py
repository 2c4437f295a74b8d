"""Monitoring checks: node_exporter serves only TLS 1.3 with the node's certificate from
gpunode's CA, and only to the monitoring host's scraper (a client certificate of gpunode's
CA for client authentication): neither a client without one nor a node's own certificate
gets the metrics; the node key stays root's, the exporter reads its copy."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
from tls_handshake import client_certificate_refused, server_certificate_verified

from gpunode.model import DesiredState

TLS_DIR = "/etc/gpunode/tls"
KEY_PATH = f"{TLS_DIR}/node.key"
CERT_PATH = f"{TLS_DIR}/node.crt"
CA_PATH = f"{TLS_DIR}/ca.crt"
KEY_COPY_PATH = "/etc/gpunode/node-exporter/node.key"
GROUP = "gpunode-exporters"


@pytest.fixture
def wanted(desired: DesiredState) -> DesiredState:
    if not desired.node_exporter.enabled:
        pytest.skip("node_exporter.enabled is false for this host in the inventory")
    return desired


def s_client(host: Any, port: int, *options: str) -> Any:
    """GET /metrics with openssl's client on the node; its output holds the HTTP answer."""
    command = (
        "printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' | timeout 20 openssl s_client -quiet "
        f"-connect 127.0.0.1:{port} -CAfile {CA_PATH} "
        + " ".join(shlex.quote(option) for option in options)
    )
    return host.run(command)


def test_node_exporter_runs(host: Any, wanted: DesiredState) -> None:
    assert host.package("prometheus-node-exporter").is_installed
    service = host.service("prometheus-node-exporter")
    assert service.is_enabled and service.is_running


def test_the_exporter_reads_a_copy_of_the_key_not_the_key(host: Any, wanted: DesiredState) -> None:
    key, copy = host.file(KEY_PATH), host.file(KEY_COPY_PATH)
    assert (key.user, key.group, key.mode) == ("root", "root", 0o600)
    assert (copy.user, copy.group, copy.mode) == ("root", GROUP, 0o640)
    assert copy.sha256sum == key.sha256sum


def test_tls13_is_served_with_a_certificate_from_gpunodes_ca(
    host: Any, wanted: DesiredState
) -> None:
    # The node's certificate verifies against gpunode's CA (openssl prints each depth it
    # verified); the metrics themselves go to the monitoring host's scraper certificate
    # alone, which no node holds.
    answer = s_client(host, wanted.node_exporter.port, "-tls1_3")
    assert server_certificate_verified(answer.stderr), answer.stderr[-400:]


def test_the_nodes_own_certificate_gets_no_metrics(host: Any, wanted: DesiredState) -> None:
    # A node certificate serves, it is no client: another node holding one cannot scrape.
    answer = s_client(
        host, wanted.node_exporter.port, "-tls1_3", "-cert", CERT_PATH, "-key", KEY_PATH
    )
    assert "HTTP/1.0 200" not in answer.stdout, answer.stdout[:300]
    assert client_certificate_refused(answer.stderr), answer.stderr[-300:]


def test_no_client_certificate_gets_no_metrics(host: Any, wanted: DesiredState) -> None:
    answer = s_client(host, wanted.node_exporter.port, "-tls1_3")
    assert "HTTP/1.0 200" not in answer.stdout, answer.stdout[:300]


def test_tls12_is_refused(host: Any, wanted: DesiredState) -> None:
    answer = s_client(
        host, wanted.node_exporter.port, "-tls1_2", "-cert", CERT_PATH, "-key", KEY_PATH
    )
    assert answer.rc != 0 and "HTTP/1.0 200" not in answer.stdout
    assert "protocol version" in answer.stdout + answer.stderr, answer.stderr[-300:]

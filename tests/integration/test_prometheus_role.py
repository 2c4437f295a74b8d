"""deploys/monitoring.py on a lab node as the monitoring host: Debian's prometheus with the
configuration gpunode.monitoring generates from the lab inventory scrapes every lab node's
node_exporter and DCGM exporter over mutual TLS with the host's own scraper certificate
(clientAuth only); its web UI and API answer over TLS 1.3 to its web user alone; a second
run changes nothing, a lost scraper key is predicted by --dry and restored, and neither the
key nor the web password is ever in the run's output; the host's firewall opens Prometheus'
port to prometheus.client_networks only."""

from __future__ import annotations

import json
import secrets
import shlex
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from facts.tls import SCRAPER_CERT_PATH
from gpunode.model import DCGM_EXPORTER_PORT, DesiredState
from lab import Lab, LabNode
from roles.prometheus import SCRAPER_KEY_PATH, WEB_CONFIG_PATH
from tests.mtls import basic_auth_get, client_context
from tests.prometheus_server import wait_for

from .conftest import lab_desired_state, run_pyinfra, ssh

pytestmark = pytest.mark.lab

DEPLOY = "deploys/monitoring.py"
SCRAPER_KEY_OP = f"prometheus | Scraper key {SCRAPER_KEY_PATH} (node.key's copy for prometheus)"
SCRAPER_CERT_OP = f"prometheus | Scraper certificate {SCRAPER_CERT_PATH} (a client only)"
WEB_USER = "grafana"
UP_TIMEOUT = 120


@pytest.fixture(scope="module")
def web_password(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bytes]:
    """(the password file on the control side, 0600, and the password in it)."""
    password = secrets.token_urlsafe(24).encode()
    path = tmp_path_factory.mktemp("web") / "prometheus.password"
    path.write_bytes(password + b"\n")
    path.chmod(0o600)
    return str(path), password


@pytest.fixture(scope="module")
def settings(web_password: tuple[str, bytes]) -> dict[str, Any]:
    return {
        "enabled": True,
        "scrape_interval_seconds": 5,
        "evaluation_interval_seconds": 5,
        "web_user": WEB_USER,
        "web_password_file": web_password[0],
    }


@pytest.fixture(scope="module")
def ca_file() -> Path:
    desired: DesiredState = lab_desired_state()
    assert desired.tls.ca_directory
    return Path(desired.tls.ca_directory) / "ca.crt"


def sudo(lab: Lab, node: LabNode, command: str) -> str:
    result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, f"{node.name}: {command}: {result.stderr}"
    return result.stdout


def monitoring_run(node: LabNode, settings: dict[str, Any], *extra: str):  # type: ignore[no-untyped-def]
    """deploys/monitoring.py with prometheus enabled on ``node`` alone (--limit)."""
    data = ["--data", "prometheus=" + json.dumps(settings)]
    return run_pyinfra(*extra, "--limit", node.name, *data, DEPLOY)


@pytest.fixture(scope="module")
def monitoring_host(
    lab: Lab, lab_nodes: list[LabNode], settings: dict[str, Any], web_password: tuple[str, bytes]
) -> LabNode:
    # The nodes' exporters, certificates and firewall as deploys/gpu_node.py leaves them.
    converged = run_pyinfra("deploys/gpu_node.py")
    assert converged.returncode == 0, converged.output[-6000:]
    node = lab_nodes[-1]
    run = monitoring_run(node, settings)
    assert run.returncode == 0, run.output[-6000:]
    assert_secrets_not_in(lab, node, web_password[1], run.output)
    return node


def assert_secrets_not_in(lab: Lab, node: LabNode, password: bytes, output: str) -> None:
    """Neither the node key, nor the web password, nor its hash is in a run's output."""
    key = sudo(lab, node, "cat /etc/gpunode/tls/node.key")
    lines = [line for line in key.splitlines() if line and "-----" not in line]
    assert lines and not any(line in output for line in lines), "the key is in the output"
    assert password.decode() not in output, "the web password is in the output"
    web = sudo(lab, node, f"cat {WEB_CONFIG_PATH}")
    (hashed,) = [line.split(": ", 1)[1].strip('"') for line in web.splitlines() if "$2" in line]
    assert hashed not in output, "the web password's hash is in the output"


def api(
    node: LabNode,
    path: str,
    ca_file: Path,
    credentials: tuple[str, bytes] | None,
    scheme: str = "https",
) -> tuple[int | None, str]:
    """(HTTP status or None, body or why) of Prometheus' ``path`` on ``node``, from the
    control side (in the lab's admin network), verifying the host's node certificate."""
    context = client_context(ca_file, None) if scheme == "https" else None
    return basic_auth_get(f"{scheme}://{node.address}:9090{path}", context, credentials)


def targets(node: LabNode, ca_file: Path, password: bytes) -> list[dict]:
    status, body = api(node, "/api/v1/targets?state=active", ca_file, (WEB_USER, password))
    if status != 200:
        return []
    return list(json.loads(body)["data"]["activeTargets"])


def test_the_monitoring_host_scrapes_every_lab_node_over_mutual_tls(
    lab: Lab,
    lab_nodes: list[LabNode],
    monitoring_host: LabNode,
    ca_file: Path,
    web_password: tuple[str, bytes],
) -> None:
    def every_node_up() -> list[dict] | None:
        found = targets(monitoring_host, ca_file, web_password[1])
        # Each node's node_exporter and DCGM exporter.
        wanted = 2 * len(lab_nodes)
        healthy = len(found) == wanted and all(t["health"] == "up" for t in found)
        return found if healthy else None

    found = wait_for("every lab node up in the host's Prometheus", every_node_up, UP_TIMEOUT)
    assert {t["labels"]["host"] for t in found} == {node.name for node in lab_nodes}
    assert {t["scrapeUrl"] for t in found} == {
        f"https://{node.address}:{port}/metrics"
        for node in lab_nodes
        for port in (9100, DCGM_EXPORTER_PORT)
    }
    # gpunode's rules are loaded.
    status, body = api(monitoring_host, "/api/v1/rules", ca_file, (WEB_USER, web_password[1]))
    assert status == 200, body
    rules = json.loads(body)
    names = {rule["name"] for group in rules["data"]["groups"] for rule in group["rules"]}
    assert {"GpuMissing", "GpuXidCritical", "GpunodeExporterDown"} <= names
    for path, owned in ((SCRAPER_KEY_PATH, "640 root prometheus"),
                        (WEB_CONFIG_PATH, "640 root prometheus"),
                        (SCRAPER_CERT_PATH, "644 root root")):  # fmt: skip
        assert sudo(lab, monitoring_host, f"stat -c '%a %U %G' {path}").split() == owned.split()
    # The scraper's certificate is a client's alone; the node certificate serves alone.
    purposes = {
        SCRAPER_CERT_PATH: "TLS Web Client Authentication",
        "/etc/gpunode/tls/node.crt": "TLS Web Server Authentication",
    }
    for path, purpose in purposes.items():
        shown = sudo(lab, monitoring_host, f"openssl x509 -in {path} -noout -ext extendedKeyUsage")
        assert shown.splitlines()[1:] == [f"    {purpose}"], (path, shown)


def test_prometheus_answers_its_web_user_alone_over_tls(
    monitoring_host: LabNode, ca_file: Path, web_password: tuple[str, bytes]
) -> None:
    path = "/api/v1/query?query=up"
    status, body = api(monitoring_host, path, ca_file, (WEB_USER, web_password[1]))
    assert status == 200 and '"status":"success"' in body, (status, body)
    for credentials in (None, (WEB_USER, b"not the password"), ("admin", web_password[1])):
        status, body = api(monitoring_host, path, ca_file, credentials)
        assert status == 401 and "success" not in body, (credentials, status, body)
    # In the clear: no metrics, whatever the credentials.
    status, body = api(monitoring_host, path, ca_file, (WEB_USER, web_password[1]), "http")
    assert status != 200 and "success" not in body, (status, body)
    # TLS 1.2: refused.
    context = client_context(ca_file, None, maximum=ssl.TLSVersion.TLSv1_2)
    try:
        urllib.request.urlopen(f"https://{monitoring_host.address}:9090/-/ready", context=context)
    except (urllib.error.URLError, OSError) as error:
        assert "VERSION" in repr(error).upper(), error
    else:
        raise AssertionError("TLS 1.2 was accepted")


def test_second_run_changes_nothing(monitoring_host: LabNode, settings: dict[str, Any]) -> None:
    again = monitoring_run(monitoring_host, settings)
    assert again.returncode == 0, again.output[-6000:]
    assert again.changed_operations() == {}


def test_a_lost_scraper_key_is_predicted_and_restored(
    lab: Lab, monitoring_host: LabNode, settings: dict[str, Any], web_password: tuple[str, bytes]
) -> None:
    sudo(lab, monitoring_host, f"rm -f {SCRAPER_KEY_PATH}")
    dry = monitoring_run(monitoring_host, settings, "--dry")
    assert dry.returncode == 0, dry.output[-6000:]
    assert dry.results is not None
    predicted = {(op["name"], h) for op in dry.results["plan"] for h in op["hosts_with_change"]}
    assert predicted == {(SCRAPER_KEY_OP, monitoring_host.name)}
    repair = monitoring_run(monitoring_host, settings)
    assert repair.returncode == 0, repair.output[-6000:]
    changed = {(name, h) for name, hosts in repair.changed_operations().items() for h in hosts}
    assert changed == predicted
    assert_secrets_not_in(lab, monitoring_host, web_password[1], dry.output + repair.output)


def test_a_password_file_others_can_read_is_refused_and_nothing_changes(
    monitoring_host: LabNode, settings: dict[str, Any], web_password: tuple[str, bytes]
) -> None:
    path = Path(web_password[0])
    path.chmod(0o640)
    try:
        refused = monitoring_run(monitoring_host, settings)
    finally:
        path.chmod(0o600)
    assert refused.returncode != 0
    assert f"prometheus.web_password_file {path} is readable by others (mode 0640)" in (
        refused.output
    ), refused.output[-3000:]
    assert web_password[1].decode() not in refused.output
    assert "Nothing was changed." in refused.output
    assert f"{monitoring_host.name} (refused before any change)" in refused.output


@pytest.fixture
def prometheus_for_the_control_side_only(
    lab: Lab, lab_nodes: list[LabNode], monitoring_host: LabNode, settings: dict[str, Any]
) -> Iterator[str]:
    """The monitoring host's firewall without the lab's fabric network (which lets the nodes
    reach each other on every port), and Prometheus' port open to the control side alone
    (prometheus.client_networks). Yields the control side's address; the host's firewall as
    the lab inventory has it is restored afterwards."""
    control = ssh(lab, monitoring_host, "echo $SSH_CLIENT")
    assert control.returncode == 0, control.stderr
    address = control.stdout.split()[0]
    narrowed = {"enabled": True, "admin_networks": [f"{address}/32"],
                "monitoring_networks": [f"{address}/32"]}  # fmt: skip
    run = monitoring_run(
        monitoring_host,
        {**settings, "client_networks": [f"{address}/32"]},
        "--data",
        "firewall=" + json.dumps(narrowed),
    )
    assert run.returncode == 0, run.output[-6000:]
    yield address
    restored = monitoring_run(monitoring_host, settings)
    assert restored.returncode == 0, restored.output[-6000:]


def test_prometheus_is_unreachable_from_outside_its_client_networks(
    lab: Lab,
    lab_nodes: list[LabNode],
    monitoring_host: LabNode,
    ca_file: Path,
    web_password: tuple[str, bytes],
    prometheus_for_the_control_side_only: str,
) -> None:
    outsider = next(node for node in lab_nodes if node != monitoring_host)
    live = sudo(lab, monitoring_host, "nft list chain inet gpunode input")
    assert "tcp dport 9090 accept" in live, live
    # From the client network (the control side): Prometheus answers its web user.
    status, body = api(monitoring_host, "/-/ready", ca_file, (WEB_USER, web_password[1]))
    assert status == 200, body
    # From another lab node, outside it: dropped (the connect hangs until the timeout).
    probe = ssh(lab, outsider, f"timeout 3 bash -c '</dev/tcp/{monitoring_host.address}/9090'")
    assert probe.returncode == 124, (probe.returncode, probe.stderr)

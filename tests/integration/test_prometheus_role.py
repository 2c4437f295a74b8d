"""deploys/monitoring.py on a lab node as the monitoring host: Debian's prometheus with the
configuration gpunode.monitoring generates from the lab inventory scrapes every lab node's
node_exporter and DCGM exporter over mutual TLS with the host's gpunode certificate; a second
run changes nothing, a lost scraper key is predicted by --dry and restored, and the key is
never in the run's output; the host's firewall opens Prometheus' port to
prometheus.client_networks only."""

from __future__ import annotations

import json
import shlex
import urllib.request
from collections.abc import Iterator

import pytest

from gpunode.model import DCGM_EXPORTER_PORT
from lab import Lab, LabNode
from roles.prometheus import SCRAPER_KEY_PATH
from tests.prometheus_server import wait_for

from .conftest import run_pyinfra, ssh

pytestmark = pytest.mark.lab

DEPLOY = "deploys/monitoring.py"
SCRAPER_KEY_OP = f"prometheus | Scraper key {SCRAPER_KEY_PATH} (node.key's copy for prometheus)"
SETTINGS = {"enabled": True, "scrape_interval_seconds": 5, "evaluation_interval_seconds": 5}
UP_TIMEOUT = 120


def sudo(lab: Lab, node: LabNode, command: str) -> str:
    result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, f"{node.name}: {command}: {result.stderr}"
    return result.stdout


def monitoring_run(node: LabNode, *extra: str, settings: dict | None = None):  # type: ignore[no-untyped-def]
    """deploys/monitoring.py with prometheus enabled on ``node`` alone (--limit)."""
    data = ["--data", "prometheus=" + json.dumps(settings or SETTINGS)]
    return run_pyinfra(*extra, "--limit", node.name, *data, DEPLOY)


@pytest.fixture(scope="module")
def monitoring_host(lab: Lab, lab_nodes: list[LabNode]) -> LabNode:
    # The nodes' exporters, certificates and firewall as deploys/gpu_node.py leaves them.
    converged = run_pyinfra("deploys/gpu_node.py")
    assert converged.returncode == 0, converged.output[-6000:]
    node = lab_nodes[-1]
    run = monitoring_run(node)
    assert run.returncode == 0, run.output[-6000:]
    assert_key_not_in(lab, node, run.output)
    return node


def assert_key_not_in(lab: Lab, node: LabNode, output: str) -> None:
    key = sudo(lab, node, "cat /etc/gpunode/tls/node.key")
    lines = [line for line in key.splitlines() if line and "-----" not in line]
    assert lines and not any(line in output for line in lines), "the key is in the output"


def targets(lab: Lab, node: LabNode) -> list[dict]:
    answer = ssh(lab, node, "curl -sf http://127.0.0.1:9090/api/v1/targets?state=active")
    if answer.returncode != 0:
        return []
    return list(json.loads(answer.stdout)["data"]["activeTargets"])


def test_the_monitoring_host_scrapes_every_lab_node_over_mutual_tls(
    lab: Lab, lab_nodes: list[LabNode], monitoring_host: LabNode
) -> None:
    def every_node_up() -> list[dict] | None:
        found = targets(lab, monitoring_host)
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
    rules = json.loads(sudo(lab, monitoring_host, "curl -sf http://127.0.0.1:9090/api/v1/rules"))
    names = {rule["name"] for group in rules["data"]["groups"] for rule in group["rules"]}
    assert {"GpuMissing", "GpuXidCritical", "GpunodeExporterDown"} <= names
    assert sudo(lab, monitoring_host, f"stat -c '%a %U %G' {SCRAPER_KEY_PATH}").split() == [
        "640", "root", "prometheus",
    ]  # fmt: skip


def test_second_run_changes_nothing(monitoring_host: LabNode) -> None:
    again = monitoring_run(monitoring_host)
    assert again.returncode == 0, again.output[-6000:]
    assert again.changed_operations() == {}


def test_a_lost_scraper_key_is_predicted_and_restored(lab: Lab, monitoring_host: LabNode) -> None:
    sudo(lab, monitoring_host, f"rm -f {SCRAPER_KEY_PATH}")
    dry = monitoring_run(monitoring_host, "--dry")
    assert dry.returncode == 0, dry.output[-6000:]
    assert dry.results is not None
    predicted = {(op["name"], h) for op in dry.results["plan"] for h in op["hosts_with_change"]}
    assert predicted == {(SCRAPER_KEY_OP, monitoring_host.name)}
    repair = monitoring_run(monitoring_host)
    assert repair.returncode == 0, repair.output[-6000:]
    changed = {(name, h) for name, hosts in repair.changed_operations().items() for h in hosts}
    assert changed == predicted
    assert_key_not_in(lab, monitoring_host, dry.output + repair.output)


@pytest.fixture
def prometheus_for_the_control_side_only(
    lab: Lab, lab_nodes: list[LabNode], monitoring_host: LabNode
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
    settings = {**SETTINGS, "client_networks": [f"{address}/32"]}
    run = monitoring_run(
        monitoring_host, "--data", "firewall=" + json.dumps(narrowed), settings=settings
    )
    assert run.returncode == 0, run.output[-6000:]
    yield address
    restored = monitoring_run(monitoring_host)
    assert restored.returncode == 0, restored.output[-6000:]


def test_prometheus_is_unreachable_from_outside_its_client_networks(
    lab: Lab,
    lab_nodes: list[LabNode],
    monitoring_host: LabNode,
    prometheus_for_the_control_side_only: str,
) -> None:
    outsider = next(node for node in lab_nodes if node != monitoring_host)
    live = sudo(lab, monitoring_host, "nft list chain inet gpunode input")
    assert "tcp dport 9090 accept" in live, live
    # From the client network (the control side): Prometheus answers.
    url = f"http://{monitoring_host.address}:9090/-/ready"
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.status == 200
    # From another lab node, outside it: dropped (the connect hangs until the timeout).
    probe = ssh(lab, outsider, f"timeout 3 bash -c '</dev/tcp/{monitoring_host.address}/9090'")
    assert probe.returncode == 124, (probe.returncode, probe.stderr)

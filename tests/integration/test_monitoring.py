"""deploys/gpu_node.py's monitoring on lab nodes: node_exporter and DCGM's exporter (the lab's
stand-in, honouring the same web configuration) over mutual TLS 1.3, scraped from the control
side as Prometheus would, with the GPU probe's and DCGM's metrics; every other client refused;
the firewall opening the exporters' ports to the monitoring networks only. A real
Prometheus, configured by gpunode.monitoring from the lab inventory with gpunode's rules,
scrapes every node and turns an injected fault into a firing alert, which clears when the
fault is fixed."""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import shlex
import ssl
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpunode import pki
from gpunode.expected.firewall import render_ruleset
from gpunode.model import DCGM_EXPORTER_PORT, DesiredState
from gpunode.monitoring import DCGM_EXPORTER_JOB, NODE_EXPORTER_JOB
from lab import Lab, LabNode
from roles.dcgm import EXPORTER_UNIT, EXPORTER_WEB_CONFIG_PATH
from roles.gpu_metrics import METRICS_FILE
from roles.node_exporter import GROUP, KEY_COPY_PATH
from tests.mtls import ClientCertificate, client_context, foreign_client, issue_client, scrape
from tests.prometheus_server import FAULT_NAMES, Prometheus, lab_faults, lab_prometheus, wait_for

from .conftest import lab_desired_state, run_pyinfra, ssh, write_inventory

pytestmark = pytest.mark.lab

DEPLOY = "deploys/gpu_node.py"
KEY_COPY_OP = f"node_exporter | Node key copy {KEY_COPY_PATH} for the exporters' group"


def sudo(lab: Lab, node: LabNode, command: str) -> str:
    result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, f"{node.name}: {command}: {result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def desired() -> DesiredState:
    state = lab_desired_state()
    assert state.node_exporter.enabled and state.gpu_metrics.enabled
    assert state.dcgm.enabled and state.dcgm.exporter
    return state


@pytest.fixture(scope="module")
def ports(desired: DesiredState) -> tuple[int, int]:
    """node_exporter's port and DCGM's exporter's: the same mutual TLS on both."""
    return desired.node_exporter.port, DCGM_EXPORTER_PORT


@pytest.fixture(scope="module")
def converged(lab: Lab, lab_nodes: list[LabNode], desired: DesiredState) -> list[LabNode]:
    run = run_pyinfra(DEPLOY)
    assert run.returncode == 0, run.output[-6000:]
    for node in lab_nodes:
        # The probe's timer first fires a minute after boot: write the textfile now.
        sudo(lab, node, "systemctl start gpunode-gpu-metrics.service")
    return lab_nodes


@pytest.fixture(scope="module")
def ca_file(lab: Lab, desired: DesiredState) -> Path:
    assert desired.tls.ca_directory
    return Path(desired.tls.ca_directory) / "ca.crt"


@pytest.fixture(scope="module")
def scraper(desired: DesiredState, tmp_path_factory: pytest.TempPathFactory) -> ClientCertificate:
    """A client certificate issued by the lab's gpunode CA, as the scraper gets one."""
    authority = pki.certificate_authority(desired.tls, create=False)
    assert authority is not None, "the lab CA does not exist after the converge"
    return issue_client(authority, "prometheus.lab", tmp_path_factory.mktemp("scraper"))


def test_a_scraper_with_a_gpunode_certificate_gets_the_probes_metrics(
    converged: list[LabNode], desired: DesiredState, ca_file: Path, scraper: ClientCertificate
) -> None:
    for node in converged:
        answer = scrape(
            node.address,
            desired.node_exporter.port,
            client_context(ca_file, scraper),
            server_name=node.name,  # the node certificate names the inventory host
        )
        assert answer.status == 200, f"{node.name}: {answer.error}"
        body = answer.body
        assert re.search(r'^gpunode_gpu_probe_ok\{state="ok"\} 1$', body, re.M), node.name
        gpus = re.search(r"^gpunode_gpus (\d+)$", body, re.M)
        assert gpus and int(gpus.group(1)) > 0, node.name
        assert "gpunode_gpu_temperature_celsius{" in body
        assert re.search(r"^node_textfile_scrape_error 0$", body, re.M)
        assert (
            'gpunode_tls_certificate_not_after_timestamp_seconds{path="/etc/gpunode/tls/node.crt"}'
            in body
        )


def test_dcgms_exporter_serves_the_simulated_gpus_over_mutual_tls(
    lab: Lab, converged: list[LabNode], ca_file: Path, scraper: ClientCertificate
) -> None:
    for node in converged:
        answer = scrape(
            node.address, DCGM_EXPORTER_PORT, client_context(ca_file, scraper), node.name
        )
        assert answer.status == 200, f"{node.name}: {answer.error}"
        gpus = sudo(lab, node, "nvidia-smi --query-gpu=uuid --format=csv,noheader").split()
        served = re.findall(r'^DCGM_FI_DEV_GPU_TEMP\{gpu="\d+",UUID="([^"]+)"', answer.body, re.M)
        assert sorted(served) == sorted(gpus) and gpus, (node.name, answer.body[:2000])


def test_a_scraper_without_a_client_certificate_is_refused(
    converged: list[LabNode], ports: tuple[int, int], ca_file: Path
) -> None:
    node = converged[0]
    for port in ports:
        answer = scrape(node.address, port, client_context(ca_file, None), node.name)
        assert answer.status is None and answer.body == "", (port, answer)


def test_a_client_certificate_from_another_ca_is_refused(
    converged: list[LabNode], ports: tuple[int, int], ca_file: Path, tmp_path: Path
) -> None:
    node = converged[0]
    context = client_context(ca_file, foreign_client(tmp_path))
    for port in ports:
        answer = scrape(node.address, port, context, node.name)
        assert answer.status is None, (port, answer)


def test_a_nodes_own_certificate_cannot_scrape_another_node(
    lab: Lab,
    converged: list[LabNode],
    ports: tuple[int, int],
    ca_file: Path,
    tmp_path: Path,
) -> None:
    """A node's certificate and key, as gpunode installed them on it, presented to another
    node's exporters: refused, on both ports (the certificate is for serving only)."""
    holder, target = converged[0], converged[1]
    node = ClientCertificate(tmp_path / "node.crt", tmp_path / "node.key")
    node.certificate.write_text(sudo(lab, holder, "cat /etc/gpunode/tls/node.crt"))
    node.key.touch(mode=0o600)
    node.key.write_text(sudo(lab, holder, "cat /etc/gpunode/tls/node.key"))
    shown = sudo(lab, holder, "openssl x509 -in /etc/gpunode/tls/node.crt -noout -ext "
                 "extendedKeyUsage")  # fmt: skip
    assert shown.splitlines()[1:] == ["    TLS Web Server Authentication"], shown
    for port in ports:
        answer = scrape(target.address, port, client_context(ca_file, node), target.name)
        assert answer.status is None and answer.body == "", (port, answer)


def test_tls_12_is_refused(
    converged: list[LabNode], ports: tuple[int, int], ca_file: Path, scraper: ClientCertificate
) -> None:
    node = converged[0]
    for port in ports:
        context = client_context(ca_file, scraper, maximum=ssl.TLSVersion.TLSv1_2)
        answer = scrape(node.address, port, context, node.name)
        assert answer.status is None and "VERSION" in answer.error.upper(), (port, answer)
        # And as an operator would try it, with openssl's own client.
        tried = subprocess.run(
            ["openssl", "s_client", "-tls1_2", "-connect", f"{node.address}:{port}",
             "-CAfile", str(ca_file), "-cert", str(scraper.certificate), "-key", str(scraper.key)],
            input="", capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert tried.returncode != 0, (port, tried.stdout)
        assert "protocol version" in tried.stdout + tried.stderr, (port, tried.stderr)


def test_the_node_key_stays_roots_and_the_exporter_reads_its_copy(
    lab: Lab, converged: list[LabNode]
) -> None:
    for node in converged:
        assert sudo(lab, node, "stat -c '%a %U %G' /etc/gpunode/tls/node.key").split() == [
            "600", "root", "root",
        ]  # fmt: skip
        assert sudo(lab, node, f"stat -c '%a %U %G' {KEY_COPY_PATH}").split() == [
            "640", "root", GROUP,
        ]  # fmt: skip
        assert (
            sudo(lab, node, f"cmp /etc/gpunode/tls/node.key {KEY_COPY_PATH} && echo same").strip()
            == "same"
        )
        # The exporter runs as Debian's unprivileged user, with the group that reads the copy.
        status = sudo(lab, node, "systemctl show -p MainPID --value prometheus-node-exporter")
        groups = sudo(lab, node, f"ps -o user:32=,supgrp:200= -p {status.strip()}").split()
        assert groups[0] == "prometheus" and GROUP in groups[1].split(","), groups
        # DCGM's exporter runs as root (NVIDIA's unit), which reads node.key itself, with
        # the web configuration from gpunode's drop-in.
        pid = sudo(lab, node, f"systemctl show -p MainPID --value {EXPORTER_UNIT}").strip()
        assert sudo(lab, node, f"ps -o user:32= -p {pid}").strip() == "root"
        command = sudo(lab, node, f"tr '\\0' ' ' < /proc/{pid}/cmdline")
        assert f"--web-config-file={EXPORTER_WEB_CONFIG_PATH}" in command, command
        web = sudo(lab, node, f"cat {EXPORTER_WEB_CONFIG_PATH}")
        assert "  key_file: /etc/gpunode/tls/node.key\n" in web, web


def test_the_firewall_opens_the_exporter_port_to_the_monitoring_networks_only(
    lab: Lab, converged: list[LabNode], desired: DesiredState
) -> None:
    assert desired.node_exporter.port in desired.exporter_ports
    assert DCGM_EXPORTER_PORT in desired.exporter_ports
    rendered = render_ruleset(desired.firewall, desired.sshd.port, desired.exporter_ports)
    ports = ", ".join(str(port) for port in desired.exporter_ports)
    wanted = f"ip saddr @monitoring_ipv4 tcp dport {{ {ports} }} accept"
    assert wanted in rendered
    for node in converged:
        assert sudo(lab, node, "sha256sum < /etc/gpunode/firewall.nft").split()[0] == (
            hashlib.sha256(rendered.encode()).hexdigest()
        )
        live = sudo(lab, node, "nft list chain inet gpunode input")
        assert re.search(rf"ip saddr @monitoring_ipv4 tcp dport {{ {ports} }} accept", live)


# Scrape and rule evaluation interval of the test's Prometheus (seconds).
INTERVAL = 2
# Generous bounds against a hung run; the waits end as soon as what they wait for happens.
UP_TIMEOUT = 120
ALERT_TIMEOUT = 90
GROUP_OF_PROFILE = {"hgx-h100": "h100_nodes", "a100": "a100_nodes", "pcie-a10g": "pcie_nodes"}


@pytest.fixture(scope="module")
def prometheus(
    converged: list[LabNode],
    ca_file: Path,
    scraper: ClientCertificate,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Prometheus]:
    directory = tmp_path_factory.mktemp("prometheus")
    with lab_prometheus(directory, ca_file, scraper.certificate, scraper.key, INTERVAL) as server:
        seen: list[list[dict]] = []

        def every_node_up() -> bool:
            seen[:] = [server.targets()]
            # Each node's node_exporter and DCGM exporter.
            wanted = 2 * len(converged)
            return len(seen[0]) == wanted and all(t["health"] == "up" for t in seen[0])

        try:
            wait_for("every lab node's exporter to be up", every_node_up, UP_TIMEOUT)
        except AssertionError as error:
            raise AssertionError(f"{error}: {seen} {server.log_tail()}") from None
        yield server


def test_a_real_prometheus_scrapes_every_lab_node_over_mutual_tls(
    prometheus: Prometheus, converged: list[LabNode], desired: DesiredState
) -> None:
    by_host = {
        (target["labels"]["job"], target["labels"]["host"]): target
        for target in prometheus.targets()
    }
    jobs = {NODE_EXPORTER_JOB: desired.node_exporter.port, DCGM_EXPORTER_JOB: DCGM_EXPORTER_PORT}
    assert set(by_host) == {(job, node.name) for job in jobs for node in converged}
    for (job, host), target in by_host.items():
        node = next(node for node in converged if node.name == host)
        assert target["health"] == "up" and target["lastError"] == "", target
        assert target["scrapeUrl"] == f"https://{node.address}:{jobs[job]}/metrics"
        assert target["labels"]["group"] == GROUP_OF_PROFILE[node.profile]
    # DCGM's series came through too, labelled by host.
    temperatures = prometheus.api("query?query=DCGM_FI_DEV_GPU_TEMP")["result"]
    assert {sample["metric"]["host"] for sample in temperatures} == {n.name for n in converged}
    # The probe's textfile came through the exporter into Prometheus, labelled by host.
    gpus = prometheus.api("query?query=gpunode_gpus")["result"]
    counts = {sample["metric"]["host"]: int(sample["value"][1]) for sample in gpus}
    assert set(counts) == {node.name for node in converged} and min(counts.values()) > 0


def probe_textfile(lab: Lab, node: LabNode, desired: DesiredState) -> str:
    """Run the node's GPU probe now (its timer would, within gpu_metrics.interval_minutes)
    and return the textfile it wrote."""
    sudo(lab, node, "systemctl start gpunode-gpu-metrics.service")
    return sudo(lab, node, f"cat {desired.gpu_metrics.textfile_dir}/{METRICS_FILE}")


@pytest.mark.parametrize("fault_name", FAULT_NAMES)
def test_an_injected_fault_fires_its_alert_and_clears_after_the_fix(
    lab: Lab,
    converged: list[LabNode],
    desired: DesiredState,
    prometheus: Prometheus,
    fault_name: str,
) -> None:
    node = next(node for node in converged if node.profile == "hgx-h100")
    bus_id = sudo(lab, node, "gpunode-lab-hw show gpus.0.pci_bus_id").strip().strip('"')
    fault = lab_faults(bus_id)[fault_name]
    labels = {"host": node.name, **dict(fault.labels)}
    healthy = probe_textfile(lab, node, desired)
    assert not re.search(fault.shows, healthy, re.M), healthy
    # Healthy: once the rules have been evaluated on this textfile, the alert is silent.
    wait_for_evaluation_after(prometheus, time.time())
    assert prometheus.firing(fault.alert, **labels) == []
    sudo(lab, node, fault.inject)
    try:
        faulty = probe_textfile(lab, node, desired)
        assert re.search(fault.shows, faulty, re.M), faulty
        (alert,) = wait_for(
            f"{fault.alert} firing for {labels}",
            lambda: prometheus.firing(fault.alert, **labels),
            ALERT_TIMEOUT,
        )
        assert alert["labels"]["severity"] in ("critical", "warning"), alert
        assert (
            node.name in alert["annotations"]["summary"]
            or node.address in (alert["annotations"]["summary"])
        ), alert
    finally:
        sudo(lab, node, fault.fix)
    fixed = probe_textfile(lab, node, desired)
    assert not re.search(fault.shows, fixed, re.M), fixed
    wait_for(
        f"{fault.alert} to clear for {labels}",
        lambda: not prometheus.firing(fault.alert, **labels),
        ALERT_TIMEOUT,
    )


def test_no_scrape_fails_across_a_certificate_renewal(
    converged: list[LabNode],
    desired: DesiredState,
    prometheus: Prometheus,
    ca_file: Path,
    scraper: ClientCertificate,
) -> None:
    """roles/tls.py re-issues the node certificate (here: for a changed name, then back);
    the running exporter serves each new one at once and Prometheus never fails a scrape."""
    node = converged[0]
    ports = (desired.node_exporter.port, DCGM_EXPORTER_PORT)
    instances = "|".join(f"{node.address}:{port}" for port in ports)

    def served_serial() -> str | None:
        """The serial both exporters serve (they read the same node.crt)."""
        served = {
            scrape(node.address, port, client_context(ca_file, scraper)).peer_serial
            for port in ports
        }
        assert len(served) == 1, served
        return served.pop()

    before = served_serial()
    assert before is not None
    start = time.time()
    wait_for_evaluation_after(prometheus, start)
    tls = {
        "enabled": True,
        "ca_directory": desired.tls.ca_directory,
        "ca_passphrase_file": desired.tls.ca_passphrase_file,
        "ip_addresses": [node.address],
        "names": ["renewed.lab.example"],
    }
    renewed = run_pyinfra(
        "--limit", node.name, "--data", "tls=" + json.dumps(tls), "deploys/tls.py"
    )
    assert renewed.returncode == 0, renewed.output[-6000:]
    assert node.name in renewed.changed_operations().get("TLS | Node certificate", [])
    during = served_serial()
    assert during not in (None, before)
    restored = run_pyinfra("--limit", node.name, "deploys/tls.py")
    assert restored.returncode == 0, restored.output[-6000:]
    assert served_serial() not in (None, before, during)
    wait_for_evaluation_after(prometheus, time.time())
    window = int(time.time() - start) + 1
    query = urllib.parse.quote(f'up{{instance=~"{instances}"}}[{window}s]')
    found = prometheus.api(f"query?query={query}")["result"]
    assert len(found) == len(ports), found
    for series in found:
        values = [value for _, value in series["values"]]
        # Scrapes before, during and after both renewals: every one of them succeeded.
        assert len(values) >= 3 and set(values) == {"1"}, (series["metric"], values)


def wait_for_evaluation_after(prometheus: Prometheus, moment: float) -> None:
    """Until every rule group has been evaluated on scrapes made after ``moment`` (Unix
    time): a scrape of every target after it, then an evaluation after those scrapes."""

    def scraped() -> float | None:
        stamps = [unix_time(target["lastScrape"]) for target in prometheus.targets()]
        return max(stamps) if stamps and min(stamps) > moment else None

    latest = wait_for("a scrape of every target", scraped, ALERT_TIMEOUT)
    wait_for(
        "a rule evaluation after it",
        lambda: all(
            unix_time(group["lastEvaluation"]) > latest
            for group in prometheus.api("rules")["groups"]
        ),
        ALERT_TIMEOUT,
    )


def unix_time(stamp: str) -> float:
    """Prometheus' RFC 3339 time stamps (nanoseconds, Z or an offset) as Unix time."""
    text = re.sub(r"(\.\d{6})\d*", r"\1", stamp.replace("Z", "+00:00"))
    return datetime.datetime.fromisoformat(text).timestamp()


def test_second_run_changes_nothing(converged: list[LabNode]) -> None:
    second = run_pyinfra(DEPLOY)
    assert second.returncode == 0, second.output[-6000:]
    assert second.changed_operations() == {}


def test_a_lost_key_copy_is_predicted_and_restored(
    lab: Lab, converged: list[LabNode], desired: DesiredState, ca_file: Path,
    scraper: ClientCertificate,
) -> None:  # fmt: skip
    node = converged[0]
    sudo(lab, node, f"rm -f {KEY_COPY_PATH}")
    dry = run_pyinfra("--dry", DEPLOY)
    assert dry.returncode == 0, dry.output[-6000:]
    assert dry.results is not None
    predicted = {(op["name"], h) for op in dry.results["plan"] for h in op["hosts_with_change"]}
    assert predicted == {(KEY_COPY_OP, node.name)}
    repair = run_pyinfra(DEPLOY)
    assert repair.returncode == 0, repair.output[-6000:]
    changed = {(name, h) for name, hosts in repair.changed_operations().items() for h in hosts}
    assert changed == predicted
    answer = scrape(
        node.address, desired.node_exporter.port, client_context(ca_file, scraper), node.name
    )
    assert answer.status == 200, answer.error


@pytest.fixture
def monitoring_network_only(
    lab: Lab, converged: list[LabNode], desired: DesiredState, tmp_path: Path
) -> Iterator[str]:
    """The nodes' firewall without the lab's fabric network (which lets the nodes reach each
    other on every port): the exporter's port open to the control side alone. Yields the
    control side's address; the lab's own firewall is restored afterwards."""
    control = ssh(lab, converged[0], "echo $SSH_CLIENT")
    assert control.returncode == 0, control.stderr
    address = control.stdout.split()[0]
    data = {
        "firewall": {
            "enabled": True,
            "admin_networks": [f"{address}/32"],
            "monitoring_networks": [f"{address}/32"],
        },
        "tls": {
            "enabled": True,
            "ca_directory": desired.tls.ca_directory,
            "ca_passphrase_file": desired.tls.ca_passphrase_file,
        },
        "node_exporter": {"enabled": True, "port": desired.node_exporter.port},
        "dcgm": {"enabled": True, "exporter": True, "cuda_major": 13},
    }
    inventory = write_inventory(
        tmp_path / "monitoring.py", lab, converged, {node.name: data for node in converged}
    )
    narrowed = run_pyinfra("deploys/firewall.py", inventory=inventory)
    assert narrowed.returncode == 0, narrowed.output[-6000:]
    yield address
    restored = run_pyinfra("deploys/firewall.py")
    assert restored.returncode == 0, restored.output[-6000:]


def test_the_exporter_is_unreachable_from_outside_the_monitoring_networks(
    lab: Lab,
    converged: list[LabNode],
    desired: DesiredState,
    ca_file: Path,
    scraper: ClientCertificate,
    monitoring_network_only: str,
) -> None:
    target, outsider = converged[0], converged[1]
    for port in (desired.node_exporter.port, DCGM_EXPORTER_PORT):
        # From the monitoring network (the control side): served.
        answer = scrape(target.address, port, client_context(ca_file, scraper), target.name)
        assert answer.status == 200, (port, answer.error)
        # From the second node, outside it: dropped (the connect hangs until the timeout).
        probe = ssh(lab, outsider, f"timeout 3 bash -c '</dev/tcp/{target.address}/{port}'")
        assert probe.returncode == 124, (port, probe.returncode, probe.stderr)

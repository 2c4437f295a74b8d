"""gpunode.monitoring: the Prometheus configuration and file_sd targets made from an inventory.

The rendered configuration is read back with a YAML parser and checked by the real
``promtool check config`` (with real certificate files from gpunode's CA code and the shipped
rules), which is what the prometheus role runs before it restarts the server.
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from gpunode import pki
from gpunode.inventory import InvalidInventory, validate_hosts
from gpunode.model import DesiredState, ExpectedHardware, NodeExporter, Tls
from gpunode.monitoring import (
    DCGM_EXPORTER,
    DCGM_EXPORTER_JOB,
    NODE_EXPORTER_JOB,
    InventoryHost,
    MonitoringError,
    ScraperTls,
    inventory_hosts,
    render_file_sd,
    render_prometheus_config,
    scrape_address,
    scrape_targets,
    shipped_rule_files,
)
from tests.mtls import issue_client

from . import prometheus_tools as promtool

EXPORTING = {"tls": {"enabled": True}, "node_exporter": {"enabled": True}}
TLS = ScraperTls("/etc/gpunode/tls/ca.crt", "/etc/prometheus/gpunode/scraper.crt",
                 "/etc/prometheus/gpunode/scraper.key")  # fmt: skip


def fake_inventory(hosts: list[tuple[str, dict[str, Any], list[str]]]) -> list[SimpleNamespace]:
    """What gpunode.monitoring reads of a pyinfra Inventory: name, data.get, groups."""
    return [
        SimpleNamespace(name=name, data=data, groups=[*groups, "prod"])
        for name, data, groups in hosts
    ]


def fleet_and_inventory(
    hosts: list[tuple[str, dict[str, Any], list[str]]],
) -> list[InventoryHost]:
    fleet = validate_hosts("inventories/prod.py", [(name, data) for name, data, _ in hosts])
    return inventory_hosts(fake_inventory(hosts), fleet)


def test_one_target_per_exporting_host_with_its_host_and_group_labels() -> None:
    hosts = fleet_and_inventory([
        ("gpu-1.dc1.example.net", {**EXPORTING, "ssh_hostname": "10.0.0.1",
         "expected_hardware": {"gpu_model": "NVIDIA H100 80GB HBM3"}}, ["h100_nodes", "rack1"]),
        ("gpu-2.dc1.example.net", {"ssh_hostname": "10.0.0.2"}, ["h100_nodes"]),
        ("10.0.0.3", dict(EXPORTING), ["pcie_nodes"]),
    ])  # fmt: skip
    entries = json.loads(render_file_sd(scrape_targets(hosts)))
    assert entries == [
        {
            # Dialled by name: the certificate names no address, the name it always has.
            "targets": ["gpu-1.dc1.example.net:9100"],
            "labels": {"host": "gpu-1.dc1.example.net", "group": "h100_nodes",
                       "groups": ",h100_nodes,rack1,", "gpu_model": "NVIDIA H100 80GB HBM3"},
        },  # gpu-2: no node_exporter, no target
        {
            "targets": ["10.0.0.3:9100"],
            "labels": {"host": "10.0.0.3", "group": "pcie_nodes", "groups": ",pcie_nodes,"},
        },
    ]  # fmt: skip


def test_a_dcgm_target_per_host_with_dcgm_exporter_on_its_port_with_the_same_labels() -> None:
    dcgm = {"enabled": True, "exporter": True, "cuda_major": 13}
    hosts = fleet_and_inventory([
        ("gpu-1.dc1.example.net", {**EXPORTING, "dcgm": dcgm}, ["h100_nodes"]),
        ("gpu-2.dc1.example.net", dict(EXPORTING), ["h100_nodes"]),  # no DCGM exporter
        ("10.0.0.3", {"tls": {"enabled": True}, "dcgm": dcgm}, ["pcie_nodes"]),
    ])  # fmt: skip
    entries = json.loads(render_file_sd(scrape_targets(hosts, DCGM_EXPORTER)))
    assert entries == [
        {
            "targets": ["gpu-1.dc1.example.net:9400"],
            "labels": {"host": "gpu-1.dc1.example.net", "group": "h100_nodes",
                       "groups": ",h100_nodes,"},
        },
        {
            "targets": ["10.0.0.3:9400"],
            "labels": {"host": "10.0.0.3", "group": "pcie_nodes", "groups": ",pcie_nodes,"},
        },
    ]  # fmt: skip
    # The node_exporter job is not changed by it: 10.0.0.3 runs no node_exporter.
    assert [t.host for t in scrape_targets(hosts)] == [
        "gpu-1.dc1.example.net", "gpu-2.dc1.example.net",
    ]  # fmt: skip


def test_two_hosts_scraped_at_one_address_are_refused_by_validation_naming_both() -> None:
    same = {**EXPORTING, "ssh_hostname": "10.0.0.1", "tls": {"enabled": True,
            "ip_addresses": ["10.0.0.1"]}}  # fmt: skip
    with pytest.raises(InvalidInventory) as refused:
        validate_hosts(
            "inventories/prod.py",
            [("gpu-1.example", same), ("gpu-2.example", same), ("gpu-3.example", EXPORTING)],
        )
    assert refused.value.lines == [
        "inventories/prod.py: host gpu-2.example: node_exporter.port = '10.0.0.1:9100': hosts "
        "gpu-1.example and gpu-2.example are both scraped at 10.0.0.1:9100; accepted: one "
        "scrape address (ssh_hostname or the host name, and port) per exporter of each host"
    ]
    # DCGM's exporter of one host at another's node_exporter port and address: the same.
    dcgm_port = {**same, "node_exporter": {"enabled": True, "port": 9400}}
    dcgm = {**same, "node_exporter": {"enabled": False},
            "dcgm": {"enabled": True, "exporter": True, "cuda_major": 13}}  # fmt: skip
    with pytest.raises(
        InvalidInventory, match=r"hosts a\.example and b\.example .* 10\.0\.0\.1:9400"
    ):
        validate_hosts("inventories/prod.py", [("a.example", dcgm_port), ("b.example", dcgm)])
    # One address, different ports: two exporters of one host, or of two hosts, are fine.
    other_port = {**same, "node_exporter": {"enabled": True, "port": 9101}}
    validate_hosts("inventories/prod.py", [("a.example", same), ("b.example", other_port)])


def test_the_address_is_dialled_where_the_certificate_names_it() -> None:
    named = DesiredState(tls=Tls(enabled=True, ip_addresses=("10.0.0.1",)))
    unnamed = DesiredState(tls=Tls(enabled=True))
    assert scrape_address(InventoryHost("gpu-1.example", named, "10.0.0.1")) == "10.0.0.1"
    assert scrape_address(InventoryHost("gpu-1.example", unnamed, "10.0.0.1")) == "gpu-1.example"
    # A DNS ssh_hostname is not what the certificate names either.
    assert scrape_address(InventoryHost("gpu-1.example", named, "bmc.example")) == "gpu-1.example"
    v6 = DesiredState(tls=Tls(enabled=True, ip_addresses=("fd00::1",)),
                      node_exporter=NodeExporter(enabled=True, port=9101))  # fmt: skip
    (target,) = scrape_targets([InventoryHost("gpu-6.example", v6, "fd00:0::1")])
    assert target.address == "[fd00::1]:9101"


def test_two_hosts_scraped_at_one_address_are_refused() -> None:
    state = DesiredState(
        tls=Tls(enabled=True, ip_addresses=("10.0.0.1",)), node_exporter=NodeExporter(enabled=True)
    )
    refused = re.escape("'b.example' are both scraped at 10.0.0.1:9100")
    with pytest.raises(MonitoringError, match=refused):
        scrape_targets(
            [
                InventoryHost("a.example", state, "10.0.0.1"),
                InventoryHost("b.example", state, "10.0.0.1"),
            ]
        )


def test_a_label_value_that_is_not_printable_text_is_refused() -> None:
    # The model refuses this already; the renderer does not rely on it.
    state = DesiredState(
        tls=Tls(enabled=True), node_exporter=NodeExporter(enabled=True),
        expected_hardware=ExpectedHardware(gpu_model='H100"\n- targets: [evil:1]'),
    )  # fmt: skip
    with pytest.raises(MonitoringError, match="printable text"):
        scrape_targets([InventoryHost("gpu-1.example", state)])


def test_a_host_without_validated_state_is_refused() -> None:
    fleet = validate_hosts("inventories/prod.py", [])
    with pytest.raises(MonitoringError, match="no validated desired state"):
        inventory_hosts(fake_inventory([("gpu-1.example", {}, [])]), fleet)


def render(**overrides: Any) -> str:
    arguments: dict[str, Any] = {
        "tls": TLS,
        "file_sd_files": ["/etc/prometheus/gpunode/targets/node-exporter.json"],
        "rule_files": ["/etc/prometheus/gpunode/rules/gpunode-alerts.yml"],
        "scrape_interval_seconds": 30,
        "evaluation_interval_seconds": 15,
        **overrides,
    }
    return render_prometheus_config(**arguments)


def test_the_config_scrapes_over_mutual_tls_13_with_gpunodes_rules() -> None:
    config = yaml.safe_load(render())
    assert config["global"] == {
        "scrape_interval": "30s", "scrape_timeout": "10s", "evaluation_interval": "15s",
    }  # fmt: skip
    assert config["rule_files"] == ["/etc/prometheus/gpunode/rules/gpunode-alerts.yml"]
    (job,) = config["scrape_configs"]
    assert job["job_name"] == NODE_EXPORTER_JOB
    assert job["scheme"] == "https"
    assert job["tls_config"] == {
        "ca_file": TLS.ca_file, "cert_file": TLS.cert_file, "key_file": TLS.key_file,
        "min_version": "TLS13", "insecure_skip_verify": False,
    }  # fmt: skip
    assert job["file_sd_configs"] == [
        {"files": ["/etc/prometheus/gpunode/targets/node-exporter.json"],
         "refresh_interval": "60s"},
    ]  # fmt: skip
    # With DCGM's exporters' targets: a second job, the same TLS.
    dcgm_files = ["/etc/prometheus/gpunode/targets/dcgm-exporter.json"]
    node, dcgm = yaml.safe_load(render(dcgm_file_sd_files=dcgm_files))["scrape_configs"]
    assert node == job and dcgm["job_name"] == DCGM_EXPORTER_JOB
    assert {k: v for k, v in dcgm.items() if k not in ("job_name", "file_sd_configs")} == {
        k: v for k, v in job.items() if k not in ("job_name", "file_sd_configs")
    }
    assert dcgm["file_sd_configs"][0]["files"] == dcgm_files
    # A short interval shortens the timeout with it (Prometheus refuses timeout > interval).
    assert yaml.safe_load(render(scrape_interval_seconds=2))["global"]["scrape_timeout"] == "2s"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"rule_files": ["rules/gpunode-alerts.yml"]}, "rule file"),
        ({"rule_files": ['/etc/x.yml"\nscrape_configs: []']}, "rule file"),
        ({"tls": ScraperTls("/ca.crt", "/c.crt", "/etc/../key")}, "client key"),
        ({"file_sd_files": []}, "no file_sd"),
        ({"scrape_interval_seconds": 0}, "scrape interval"),
        ({"scrape_interval_seconds": True}, "scrape interval"),
        ({"scrape_interval_seconds": 5, "scrape_timeout_seconds": 6}, "scrape timeout"),
        ({"evaluation_interval_seconds": 90000}, "evaluation interval"),
    ],
)
def test_bad_inputs_are_refused_naming_what(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(MonitoringError, match=message):
        render(**overrides)


def test_promtool_accepts_the_config_with_the_shipped_rules(tmp_path: Path) -> None:
    authority = pki.open_ca(tmp_path / "ca", secrets.token_urlsafe(24).encode(), create=True)
    assert authority is not None
    scraper = issue_client(authority, "prometheus.example", tmp_path)
    targets = tmp_path / "node-exporter.json"
    state = DesiredState(tls=Tls(enabled=True), node_exporter=NodeExporter(enabled=True))
    targets.write_text(render_file_sd(scrape_targets([InventoryHost("gpu-1.example", state)])))
    config = tmp_path / "prometheus.yml"
    config.write_text(
        render(
            tls=ScraperTls(str(tmp_path / "ca" / "ca.crt"), str(scraper.certificate),
                           str(scraper.key)),
            file_sd_files=[str(targets)],
            rule_files=[str(path) for path in shipped_rule_files()],
        )
    )  # fmt: skip
    checked = promtool.run("check", "config", config)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout and "rule files found" in checked.stdout, checked.stdout
    # And it does refuse: a client key that is not there.
    scraper.key.unlink()
    refused = promtool.run("check", "config", config)
    assert refused.returncode != 0, refused.stdout

"""A real Prometheus (Debian's /usr/bin/prometheus) run on the control side for tests and
bench/alert_delay.py, with a configuration rendered by the product's own functions
(``gpunode.monitoring``) from the lab inventory, and its HTTP API read back.

The rules are gpunode's shipped ones. Only their ``for:`` holds (5 to 15 minutes, there so a
blip does not page anyone) are set to 0 in the copy Prometheus loads here: a test of how the
lab's real series reach an alert cannot wait them out, and the holds themselves are tested
by promtool (tests/unit/promtool/). Every expression, label and annotation is as shipped.
"""

from __future__ import annotations

import json
import pickle
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpunode.monitoring import (
    ScraperTls,
    ScrapeTarget,
    render_file_sd,
    render_prometheus_config,
    shipped_rule_files,
)

PROMETHEUS = "/usr/bin/prometheus"
ROOT = Path(__file__).resolve().parents[1]
# Loading an inventory as pyinfra does imports pyinfra's CLI package, which monkey-patches the
# importing process with gevent: the scrape targets are read in a process of their own, so that
# a test session's process stays as it was (whatever module asked first).
TARGETS_SCRIPT = """
import pickle
import sys

from gpunode.cli import load_inventory
from gpunode.inventory import fleet_of
from gpunode.monitoring import DCGM_EXPORTER, inventory_hosts, scrape_targets

inventory = sys.argv[1]
hosts = inventory_hosts(load_inventory(inventory), fleet_of(load_inventory(inventory), inventory))
with open(sys.argv[2], "wb") as out:
    pickle.dump((scrape_targets(hosts), scrape_targets(hosts, DCGM_EXPORTER)), out)
"""
FAULT_NAMES = ("xid-79", "gpu-removed", "persistence-off")


@dataclass(frozen=True)
class Fault:
    """A fault injected into a lab node of the hgx-h100 profile (8 GPUs, persistence mode
    wanted on), the alert it must raise, and how it is fixed: commands run as root."""

    alert: str
    inject: str
    fix: str
    # What the probe's textfile shows once it has seen the fault (a regular expression).
    shows: str
    labels: tuple[tuple[str, str], ...] = ()


def lab_faults(gpu0_bus_id: str) -> dict[str, Fault]:
    """The faults, by name; ``gpu0_bus_id`` is GPU 0's (``gpunode-lab-hw show
    gpus.0.pci_bus_id``), which the XID's kernel message names."""
    pci = f"{gpu0_bus_id[4:8]}:{gpu0_bus_id[9:14]}"  # 00000000:18:00.0 -> 0000:18:00, as NVRM
    message = f"NVRM: Xid (PCI:{pci}): 79, pid=4242, name=alert-test, GPU has fallen off the bus."
    return {
        "xid-79": Fault(
            alert="GpuXidCritical",
            inject=f"logger -t kernel {shlex.quote(message)}",
            # journald forgets an entry only with its file. On a real node the alert stays
            # while the event is in the probe's 24 h window, by design: XID 79 needs an
            # operator, and the alert is not resolved by the GPU coming back.
            fix="journalctl --rotate --vacuum-files=1",
            shows=rf'^gpunode_gpu_xid_events\{{xid="79",pci="{pci}",gpu="0"\}} 1$',
            labels=(("xid", "79"), ("pci", pci)),
        ),
        "gpu-removed": Fault(
            alert="GpuMissing",
            inject="gpunode-lab-hw set gpus.1.present false",
            fix="gpunode-lab-hw set gpus.1.present true",
            shows=r"^gpunode_gpus 7$",  # of the profile's 8
        ),
        "persistence-off": Fault(
            alert="GpuPersistenceModeOff",
            inject="nvidia-smi -i 2 -pm 0",
            fix="nvidia-smi -i 2 -pm 1",
            shows=r'^gpunode_gpu_persistence_mode\{gpu="2",[^}]*\} 0$',
            labels=(("gpu", "2"),),
        ),
    }


def prometheus_binary() -> str:
    path = shutil.which("prometheus") or (PROMETHEUS if Path(PROMETHEUS).exists() else None)
    assert path, "prometheus is not installed: apt-get install --no-install-recommends prometheus"
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def rules_without_holds(directory: Path) -> list[str]:
    """The shipped rule files, copied into ``directory`` with every ``for:`` removed."""
    copies = []
    for path in shipped_rule_files():
        document = yaml.safe_load(path.read_text())
        for group in document["groups"]:
            for rule in group["rules"]:
                rule.pop("for", None)
        copy = directory / path.name
        copy.write_text(yaml.safe_dump(document, sort_keys=False))
        copies.append(str(copy))
    return copies


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}", timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets?state=active")["activeTargets"])

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.api("alerts")["alerts"])

    def firing(self, name: str, **labels: str) -> list[dict[str, Any]]:
        """The firing alerts called ``name`` whose labels include ``labels``."""
        return [
            alert
            for alert in self.alerts()
            if alert["state"] == "firing"
            and alert["labels"].get("alertname") == name
            and all(alert["labels"].get(key) == value for key, value in labels.items())
        ]

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def wait_for(what: str, check: Callable[[], Any], timeout: float, poll: float = 0.25) -> Any:
    """``check()``'s first truthy answer, polled until ``timeout`` seconds pass (a generous
    bound against a hung run, never a measurement)."""
    deadline = time.monotonic() + timeout
    answer = check()
    while not answer:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll)
        answer = check()
    return answer


def inventory_targets(inventory: str) -> tuple[list[ScrapeTarget], list[ScrapeTarget]]:
    """The inventory's node_exporter and DCGM exporter scrape targets (gpunode.monitoring),
    worked out by a process of its own (TARGETS_SCRIPT)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "targets.pickle"
        done = subprocess.run(
            [sys.executable, "-c", TARGETS_SCRIPT, inventory, str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"scrape targets of {inventory}: {done.stdout}{done.stderr}")
        node_targets, dcgm_targets = pickle.loads(out.read_bytes())  # our own process's
    return list(node_targets), list(dcgm_targets)


@contextmanager
def lab_prometheus(
    directory: Path,
    ca_file: Path,
    client_certificate: Path,
    client_key: Path,
    interval_seconds: int = 2,
    inventory: str = "inventories/lab.py",
) -> Iterator[Prometheus]:
    """Prometheus scraping the lab inventory's node_exporters and DCGM exporters over mutual
    TLS."""
    targets, dcgm_targets = inventory_targets(inventory)
    assert targets, f"{inventory} has no host with node_exporter enabled"
    rules = directory / "rules"
    rules.mkdir()
    file_sd = directory / "node-exporter.json"
    file_sd.write_text(render_file_sd(targets))
    dcgm_file_sd = directory / "dcgm-exporter.json"
    dcgm_file_sd.write_text(render_file_sd(dcgm_targets))
    config = directory / "prometheus.yml"
    config.write_text(
        render_prometheus_config(
            tls=ScraperTls(str(ca_file), str(client_certificate), str(client_key)),
            file_sd_files=[str(file_sd)],
            dcgm_file_sd_files=[str(dcgm_file_sd)],
            rule_files=rules_without_holds(rules),
            scrape_interval_seconds=interval_seconds,
            evaluation_interval_seconds=interval_seconds,
        )
    )
    port = free_port()
    log = directory / "prometheus.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={config}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    server = Prometheus(f"http://127.0.0.1:{port}", process, log)
    try:

        def ready() -> bool:
            assert process.poll() is None, f"prometheus exited: {server.log_tail()}"
            try:
                with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as answer:
                    return bool(answer.status == 200)
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_for("prometheus to be ready", ready, timeout=60)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

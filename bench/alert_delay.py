"""How long a fault on a lab node takes to become a firing alert in a real Prometheus.

    PYTHONPATH=. .venv/bin/python bench/alert_delay.py [--interval 2] [--repeat 3]

Needs a converged lab with an hgx-h100 node (`gpunode lab up`, then deploys/gpu_node.py).
Prometheus runs here, configured by gpunode.monitoring from inventories/lab.py with the
shipped rules, their ``for:`` holds removed (tests/prometheus_server.py says why: with them,
add the hold to every figure). For every fault of the lab's catalogue (XID 79 in the kernel
log, a GPU removed, persistence mode off) it injects the fault, runs the node's GPU probe at
once (in production its timer runs it every gpu_metrics.interval_minutes: add up to that),
and reads the alert's ``activeAt`` from the HTTP API. Printed per fault, best and median of
``--repeat`` runs:

- probe: fault injected until the probe's textfile holds it (the probe's own run);
- to firing: textfile written until Prometheus' rule evaluation made the alert active
  (bounded by one scrape interval plus one evaluation interval);
- total: fault injected until the alert fired.

A measurement, not a test; the lab test (tests/integration/test_monitoring.py) checks that
each alert fires and clears.
"""

from __future__ import annotations

import argparse
import datetime
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpunode import pki  # noqa: E402
from lab import LOGIN_USER, Lab, LabNode  # noqa: E402
from roles.gpu_metrics import METRICS_FILE  # noqa: E402
from tests.mtls import issue_client  # noqa: E402
from tests.prometheus_server import (  # noqa: E402
    FAULT_NAMES,
    Prometheus,
    lab_faults,
    lab_prometheus,
    wait_for,
)

TIMEOUT = 120


def sudo(lab: Lab, node: LabNode, command: str) -> str:
    result = subprocess.run(
        ["ssh", "-i", str(lab.key_path), "-o", f"UserKnownHostsFile={lab.known_hosts_path}",
         "-o", "BatchMode=yes", f"{LOGIN_USER}@{node.address}",
         f"sudo sh -c {shlex.quote(command)}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"{node.name}: {command}: {result.stderr}")
    return result.stdout


def unix_time(stamp: str) -> float:
    text = re.sub(r"(\.\d{6})\d*", r"\1", stamp.replace("Z", "+00:00"))
    return datetime.datetime.fromisoformat(text).timestamp()


def measure(lab: Lab, node: LabNode, prometheus: Prometheus, name: str) -> tuple[float, float]:
    bus_id = sudo(lab, node, "gpunode-lab-hw show gpus.0.pci_bus_id").strip().strip('"')
    fault = lab_faults(bus_id)[name]
    labels = {"host": node.name, **dict(fault.labels)}
    textfile = f"/var/lib/prometheus/node-exporter/{METRICS_FILE}"
    injected = time.time()
    sudo(lab, node, fault.inject)
    try:
        sudo(lab, node, "systemctl start gpunode-gpu-metrics.service")
        written = float(sudo(lab, node, f"stat -c %.9Y {textfile}").strip())
        if not re.search(fault.shows, sudo(lab, node, f"cat {textfile}"), re.M):
            raise SystemExit(f"{name}: the probe's textfile does not show the fault")
        (alert,) = wait_for(
            f"{fault.alert} firing", lambda: prometheus.firing(fault.alert, **labels), TIMEOUT
        )
        active = unix_time(alert["activeAt"])
    finally:
        sudo(lab, node, fault.fix)
        sudo(lab, node, "systemctl start gpunode-gpu-metrics.service")
    wait_for(
        f"{fault.alert} cleared", lambda: not prometheus.firing(fault.alert, **labels), TIMEOUT
    )
    return written - injected, active - written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=int, default=2, help="scrape and evaluation seconds")
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    lab = Lab()
    node = next((n for n in lab.nodes() if n.profile == "hgx-h100"), None)
    if node is None:
        raise SystemExit("no hgx-h100 lab node: gpunode lab up --profiles hgx-h100")
    from tests.integration.conftest import lab_desired_state

    desired = lab_desired_state()
    authority = pki.certificate_authority(desired.tls, create=False)
    if authority is None or desired.tls.ca_directory is None:
        raise SystemExit("no lab CA: converge the lab first")
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        scraper = issue_client(authority, "prometheus.lab", directory)
        ca_file = Path(desired.tls.ca_directory) / "ca.crt"
        with lab_prometheus(
            directory, ca_file, scraper.certificate, scraper.key, options.interval
        ) as prometheus:
            wait_for(
                "every target up",
                lambda: all(t["health"] == "up" for t in prometheus.targets()),
                TIMEOUT,
            )
            print(f"scrape and evaluation interval {options.interval} s, node {node.name}")
            print(f"{'fault':<18}{'probe s':>16}{'to firing s':>16}{'total s':>16}")
            for name in FAULT_NAMES:
                runs = [measure(lab, node, prometheus, name) for _ in range(options.repeat)]
                columns = []
                for values in ([p for p, _ in runs], [f for _, f in runs],
                               [p + f for p, f in runs]):  # fmt: skip
                    columns.append(f"{min(values):.2f} ({statistics.median(values):.2f})")
                print(f"{name:<18}" + "".join(f"{column:>16}" for column in columns))
    print("best (median); add the probe timer's period and the rules' for: holds in production")
    return 0


if __name__ == "__main__":
    sys.exit(main())

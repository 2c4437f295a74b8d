"""Install the nightly drift check on the control host (a systemd service and timer).

    pyinfra @local deploys/drift_timer.py --data x_drift_inventory=inventories/prod.py

It runs `gpunode drift` against the inventory every night, keeps the JSON report (and uses
yesterday's as the baseline, so new findings stand out), writes a JUnit file for CI
dashboards and a Prometheus textfile for node_exporter. Data (all optional but the first):
x_drift_inventory, x_drift_schedule (systemd OnCalendar, default 05:30 daily),
x_drift_output_dir (default /var/lib/gpunode/drift), x_drift_textfile (default
/var/lib/prometheus/node-exporter/gpunode_drift.prom).
"""

import shlex
import sys
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import DeployError
from pyinfra.operations import files, systemd

PROJECT = Path(__file__).resolve().parents[1]
UNIT = "gpunode-drift"

inventory = host.data.get("x_drift_inventory")
if not inventory:
    raise DeployError("x_drift_inventory is not set: --data x_drift_inventory=inventories/prod.py")
if not (PROJECT / inventory).is_file():
    raise DeployError(f"x_drift_inventory = {inventory!r}: no such file under {PROJECT}")
schedule = host.data.get("x_drift_schedule", "*-*-* 05:30:00")
output_dir = host.data.get("x_drift_output_dir", "/var/lib/gpunode/drift")
textfile = host.data.get("x_drift_textfile", "/var/lib/prometheus/node-exporter/gpunode_drift.prom")
gpunode = Path(sys.executable).with_name("gpunode")
latest = f"{output_dir}/latest.json"
command = " ".join(
    shlex.quote(part)
    for part in [
        str(gpunode), "drift", inventory, "--baseline", latest, "--write-baseline", latest,
        "--junit", f"{output_dir}/latest.xml", "--prometheus", textfile,
    ]
)  # fmt: skip

service = f"""[Unit]
Description=gpunode nightly drift check ({inventory})
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
WorkingDirectory={PROJECT}
ExecStart={command}
# 1 means drift was found and reported: the check itself worked.
SuccessExitStatus=1
"""
timer = f"""[Unit]
Description=Run the gpunode drift check nightly

[Timer]
OnCalendar={schedule}
RandomizedDelaySec=10min
Persistent=true

[Install]
WantedBy=timers.target
"""

files.directory(name=f"Directory {output_dir}", path=output_dir, mode="750")
service_op = files.put(
    name=f"{UNIT}.service", src=StringIO(service), dest=f"/etc/systemd/system/{UNIT}.service"
)
timer_op = files.put(
    name=f"{UNIT}.timer", src=StringIO(timer), dest=f"/etc/systemd/system/{UNIT}.timer"
)
systemd.daemon_reload(
    name="Reload systemd after a unit change",
    _if=lambda: service_op.did_change() or timer_op.did_change(),
)
systemd.service(name=f"{UNIT}.timer enabled", service=f"{UNIT}.timer", running=True, enabled=True)

"""The GPU metrics unit: what the probe is told to write and compare."""

from __future__ import annotations

import shlex

from roles.gpu_metrics import INSTALL_DIR, METRICS_FILE, render_units


def exec_start(service: str) -> list[str]:
    (line,) = [line for line in service.splitlines() if line.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


def test_the_unit_passes_what_the_inventory_expects_and_writes_the_textfile_last() -> None:
    service, timer = render_units(
        "/var/lib/prometheus/node-exporter",
        5,
        expected_gpus=8,
        expected_nvlinks=18,
        certificates=("/etc/gpunode/tls/node.crt",),
        expected_persistence=True,
    )
    assert exec_start(service) == [
        "/usr/bin/python3", "-I", f"{INSTALL_DIR}/gpu_probe.py",
        "--expected-gpus", "8", "--expected-nvlinks", "18", "--expected-persistence", "on",
        "--certificate", "/etc/gpunode/tls/node.crt",
        "--prometheus", f"/var/lib/prometheus/node-exporter/{METRICS_FILE}",
    ]  # fmt: skip
    assert "OnUnitActiveSec=5min" in timer


def test_nothing_expected_passes_nothing() -> None:
    service, _ = render_units("/srv/textfile", 1, expected_persistence=False)
    assert exec_start(service)[3:] == [
        "--expected-persistence", "off", "--prometheus", f"/srv/textfile/{METRICS_FILE}",
    ]  # fmt: skip

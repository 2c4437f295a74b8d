"""Node-local GPU health metrics: the probe writes a node_exporter textfile every few minutes.

The same probe the drift check runs over SSH is installed on the node (with the pure-Python
pynvml beside it, so the node needs no pip, and its textfile renderer) and run by a systemd
timer; Prometheus then sees XIDs, ECC, row remapping and throttling between nightly drift
checks. The metric names are ``gpunode.probe.textfile``'s; monitoring/ alerts on them.
"""

from __future__ import annotations

import shlex

from pyinfra.api import deploy
from pyinfra.operations import files

from facts.tls import CERT_PATH
from gpunode.model import DesiredState
from gpunode.probe.parsers import PROBE_INSTALL_DIR, installed_probe_files
from roles.scheduled_units import no_scheduled_unit, scheduled_unit

# The drift check runs this copy when its checksums are its own probe's (probe_command).
INSTALL_DIR = PROBE_INSTALL_DIR
UNIT = "gpunode-gpu-metrics"
METRICS_FILE = "gpunode_gpu.prom"
PROBE_FILE_NAMES = {
    "gpu_probe.py": "GPU probe",
    "gpu_record.py": "GPU record parser (the probe loads it from beside itself)",
    "textfile.py": "GPU metrics renderer (the probe loads it from beside itself)",
    "pynvml.py": "pynvml (pure Python, shipped so the node needs no pip)",
}


def probe_arguments(
    metrics_file: str,
    expected_gpus: int | None = None,
    expected_nvlinks: int | None = None,
    certificates: tuple[str, ...] = (),
    expected_persistence: bool | None = None,
) -> str:
    """The probe's options for writing ``metrics_file``, which comes last.

    The expected counts (``expected_hardware``) and persistence mode (``gpu_settings``) are
    written beside what is found, for the alert rules in monitoring/ to compare; each
    certificate's notAfter is written for the expiry alert (node_exporter has no metric of
    its own for it).
    """
    words: list[str] = []
    if expected_gpus is not None:
        words += ["--expected-gpus", str(expected_gpus)]
    if expected_nvlinks is not None:
        words += ["--expected-nvlinks", str(expected_nvlinks)]
    if expected_persistence is not None:
        words += ["--expected-persistence", "on" if expected_persistence else "off"]
    for certificate in certificates:
        words += ["--certificate", certificate]
    words += ["--prometheus", metrics_file]
    return " ".join(shlex.quote(word) for word in words)


def render_units(
    textfile_dir: str,
    interval_minutes: int,
    expected_gpus: int | None = None,
    expected_nvlinks: int | None = None,
    certificates: tuple[str, ...] = (),
    expected_persistence: bool | None = None,
) -> tuple[str, str]:
    arguments = probe_arguments(
        f"{textfile_dir}/{METRICS_FILE}",
        expected_gpus,
        expected_nvlinks,
        certificates,
        expected_persistence,
    )
    service = (
        "[Unit]\nDescription=gpunode GPU health metrics for node_exporter\n\n"
        "[Service]\nType=oneshot\n"
        f"ExecStart=/usr/bin/python3 -I {INSTALL_DIR}/gpu_probe.py {arguments}\n"
        "Nice=10\n"
    )
    timer = (
        "[Unit]\nDescription=Run the gpunode GPU probe periodically\n\n"
        f"[Timer]\nOnBootSec=1min\nOnUnitActiveSec={interval_minutes}min\n\n"
        "[Install]\nWantedBy=timers.target\n"
    )
    return service, timer


@deploy("GPU health metrics")
def gpu_metrics(desired: DesiredState) -> None:
    wanted = desired.gpu_metrics
    if not wanted.enabled:
        no_scheduled_unit(UNIT, "GPU metrics")
        return
    files.directory(name=f"Directory {INSTALL_DIR}", path=INSTALL_DIR, mode="755")
    # Exactly the files the drift check verifies before it runs the installed copy.
    for file_name, source in installed_probe_files().items():
        files.put(
            name=PROBE_FILE_NAMES.get(file_name, file_name),
            src=str(source),
            dest=f"{INSTALL_DIR}/{file_name}",
            mode="644",
        )
    files.directory(name=f"Directory {wanted.textfile_dir}", path=wanted.textfile_dir, mode="755")
    hardware = desired.expected_hardware
    service, timer_text = render_units(
        wanted.textfile_dir,
        wanted.interval_minutes,
        expected_gpus=hardware.gpu_count,
        expected_nvlinks=hardware.nvlink_links_per_gpu,
        # The node certificate the exporters serve (roles.tls), for the expiry alert.
        certificates=(CERT_PATH,) if desired.tls.enabled else (),
        expected_persistence=desired.gpu_settings.persistence_mode,
    )
    scheduled_unit(UNIT, service, timer_text)

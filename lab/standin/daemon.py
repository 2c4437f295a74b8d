"""Stand-in NVIDIA daemons for lab nodes (node side, stdlib only).

Installed as ``/usr/bin/nvidia-persistenced``, ``/usr/bin/nv-fabricmanager``,
``/usr/bin/nv-hostengine``, ``/usr/bin/nvidia-imex`` and ``/usr/bin/dcgm-exporter``; the name it
runs under picks the behaviour. Each answers its
``--version`` like the real daemon and otherwise stays running, doing nothing, until stopped
(SIGTERM), so systemd units behave as on a real node:

- ``nvidia-persistenced``: forks (``Type=forking`` unit) unless ``--foreground``; fails, like the
  real one, when the driver does not answer (``nvidia-smi`` fails).
- ``nv-fabricmanager``: forks; fails unless the loaded driver, as ``nvidia-smi`` reports it, has
  exactly this Fabric Manager's version (the real one refuses a mismatched driver).
- ``nv-hostengine`` (DCGM): ``-n`` stays in the foreground (the ``nvidia-dcgm`` unit), else forks.
- ``nvidia-imex``: forks; fails when the driver does not answer.
- ``dcgm-exporter``: stays in the foreground (its unit is ``Type=simple``) and serves
  ``GET /metrics`` on ``-a``/``--address`` (default ``:9400``, as the real exporter): one
  ``DCGM_FI_DEV_*`` gauge per GPU for temperature, power, utilization and framebuffer use, read
  from ``nvidia-smi --query-gpu`` (on lab nodes: the simulated GPUs), in Prometheus' text
  format. Its metric names and labels follow dcgm-exporter's; the set is a small subset.

Each writes its pid file, e.g. ``/var/run/nvidia-persistenced/nvidia-persistenced.pid``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

STANDIN_VERSION = "0.0.0"  # replaced with the package's version when it is built

PR_SET_NAME = 15


@dataclass(frozen=True)
class Daemon:
    pid_file: str
    version_flags: tuple[str, ...]
    version_text: str
    foreground_flags: tuple[str, ...] = ()
    needs_driver: bool = False
    needs_matching_driver: bool = False
    always_foreground: bool = False
    serves_metrics: bool = False


DAEMONS = {
    "nvidia-persistenced": Daemon(
        pid_file="/var/run/nvidia-persistenced/nvidia-persistenced.pid",
        version_flags=("-v", "--version"),
        version_text="nvidia-persistenced:  version {version}\n",
        foreground_flags=("-f", "--foreground"),
        needs_driver=True,
    ),
    "nv-fabricmanager": Daemon(
        pid_file="/var/run/nvidia-fabricmanager/nv-fabricmanager.pid",
        version_flags=("-v", "--version"),
        version_text="Fabric Manager version is : {version}\n",
        needs_driver=True,
        needs_matching_driver=True,
    ),
    "nv-hostengine": Daemon(
        pid_file="/var/run/nvidia-hostengine/nv-hostengine.pid",
        version_flags=("-v", "--version"),
        version_text="version : {version}\narch : x86_64\nbuildtype : Release\n",
        foreground_flags=("-n", "--no-daemon"),
    ),
    "nvidia-imex": Daemon(
        pid_file="/var/run/nvidia-imex/nvidia-imex.pid",
        version_flags=("-v", "--version"),
        version_text="IMEX version is: {version}\n",
        needs_driver=True,
    ),
    "dcgm-exporter": Daemon(
        pid_file="/var/run/dcgm-exporter/dcgm-exporter.pid",
        version_flags=("-v", "--version"),
        version_text="dcgm-exporter version {version} (gpunode lab stand-in)\n",
        always_foreground=True,
        serves_metrics=True,
    ),
}

# (nvidia-smi --query-gpu field, DCGM field) pairs the stand-in exporter serves.
EXPORTER_FIELDS = (
    ("temperature.gpu", "DCGM_FI_DEV_GPU_TEMP"),
    ("power.draw", "DCGM_FI_DEV_POWER_USAGE"),
    ("utilization.gpu", "DCGM_FI_DEV_GPU_UTIL"),
    ("memory.used", "DCGM_FI_DEV_FB_USED"),
)
EXPORTER_DEFAULT_ADDRESS = ":9400"


def loaded_driver_version() -> str | None:
    """The driver version nvidia-smi reports, or None when it cannot talk to a driver."""
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    return lines[0] if result.returncode == 0 and lines else None


def main(argv: Sequence[str], name: str | None = None) -> int:
    name = name or Path(sys.argv[0]).name
    daemon = DAEMONS.get(name)
    if daemon is None:
        sys.stderr.write(f"gpunode lab stand-in daemon: unknown name {name!r}\n")
        return 2
    if any(argument in daemon.version_flags for argument in argv):
        sys.stdout.write(daemon.version_text.format(version=STANDIN_VERSION))
        return 0
    if daemon.needs_driver:
        loaded = loaded_driver_version()
        if loaded is None:
            sys.stderr.write(f"{name} failed to initialize: the NVIDIA driver is not loaded.\n")
            return 1
        if daemon.needs_matching_driver and loaded != STANDIN_VERSION:
            sys.stderr.write(
                f"fabric manager NVIDIA GPU driver interface version {STANDIN_VERSION} don't "
                f"match with driver version {loaded}. Please update with matching NVIDIA driver "
                "package.\n"
            )
            return 1
    foreground = daemon.always_foreground or any(a in daemon.foreground_flags for a in argv)
    if not foreground:
        _daemonize(daemon)
    if daemon.serves_metrics:
        _serve_metrics(name, daemon, _address(argv))
    else:
        _run(name, daemon)
    return 0


def _address(argv: Sequence[str]) -> tuple[str, int]:
    """dcgm-exporter's ``-a``/``--address`` (``[host]:port``); default ``:9400``."""
    address = EXPORTER_DEFAULT_ADDRESS
    for index, argument in enumerate(argv):
        if argument in ("-a", "--address") and index + 1 < len(argv):
            address = argv[index + 1]
        elif argument.startswith("--address="):
            address = argument.split("=", 1)[1]
    host, _, port = address.rpartition(":")
    return host, int(port)


def metrics_text(query: str | None = None) -> str:
    """The exporter's /metrics body for the GPUs ``nvidia-smi`` lists (``query``: its CSV
    output, for tests). A value nvidia-smi does not give as a number is left out."""
    fields = ",".join(["index", "uuid", "name"] + [smi for smi, _ in EXPORTER_FIELDS])
    if query is None:
        result = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        query = result.stdout if result.returncode == 0 else ""
    rows = [[cell.strip() for cell in line.split(",")] for line in query.splitlines()]
    rows = [row for row in rows if len(row) == 3 + len(EXPORTER_FIELDS)]
    lines: list[str] = []
    for column, (_, metric) in enumerate(EXPORTER_FIELDS, start=3):
        lines += [f"# HELP {metric} {metric} (gpunode lab stand-in).", f"# TYPE {metric} gauge"]
        for row in rows:
            try:
                value = float(row[column])
            except ValueError:
                continue
            labels = f'gpu="{row[0]}",UUID="{row[1]}",modelName="{row[2]}"'
            lines.append(f"{metric}{{{labels}}} {value:g}")
    return "\n".join(lines) + "\n"


def _serve_metrics(name: str, daemon: Daemon, address: tuple[str, int]) -> None:
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404)
                return
            body = metrics_text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(address, Handler)
    _write_pid_file(daemon)

    _stop_on_signals(daemon)
    sys.stderr.write(f"{name} {STANDIN_VERSION} serving on {address[0]}:{address[1]}\n")
    sys.stderr.flush()
    server.serve_forever()


def _daemonize(daemon: Daemon) -> None:
    """Fork; the parent exits once the child has written its pid file (Type=forking)."""
    ready_read, ready_write = os.pipe()
    if os.fork() > 0:
        os.close(ready_write)
        os.read(ready_read, 1)
        os._exit(0)
    os.close(ready_read)
    os.setsid()
    _write_pid_file(daemon)
    os.write(ready_write, b"1")
    os.close(ready_write)
    devnull = os.open(os.devnull, os.O_RDWR)
    for stream in (0, 1):
        os.dup2(devnull, stream)


def _stop_on_signals(daemon: Daemon) -> None:
    """SIGTERM and SIGINT end the daemon, its pid file removed (as systemd's stop expects)."""

    def stop(_signal: int, _frame: object) -> None:
        with contextlib.suppress(OSError):
            Path(daemon.pid_file).unlink()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def _write_pid_file(daemon: Daemon) -> None:
    path = Path(daemon.pid_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{os.getpid()}\n")


def _run(name: str, daemon: Daemon) -> None:
    _write_pid_file(daemon)
    with contextlib.suppress(OSError, AttributeError):
        # ps and pgrep show the daemon's own name, not python3.
        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)

    _stop_on_signals(daemon)
    sys.stderr.write(f"{name} {STANDIN_VERSION} started (gpunode lab stand-in)\n")
    sys.stderr.flush()
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

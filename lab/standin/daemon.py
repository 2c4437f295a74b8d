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
  ``--web-config-file`` (dcgm-exporter's flag: NVIDIA/dcgm-exporter pkg/cmd/app.go,
  ``CLIWebConfigFile``, read 2026-12-02) names an exporter-toolkit web configuration: its
  ``tls_server_config`` is honoured for real with Python's ssl module (the TLS versions it
  allows, its certificate and key, ``RequireAndVerifyClientCert`` against ``client_ca_file``),
  the file, certificate and key read again for every new connection as exporter-toolkit does;
  a key it does not know is an error at start (exporter-toolkit reads the file strictly).

Each writes its pid file, e.g. ``/var/run/nvidia-persistenced/nvidia-persistenced.pid``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import ssl
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

# exporter-toolkit's tls_server_config keys the stand-in knows (docs/web-configuration.md of
# prometheus/exporter-toolkit, read 2026-12-02), and its TLS version names.
WEB_CONFIG_KEYS = frozenset(
    {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"}
)
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
CLIENT_AUTH_TYPES = {
    "NoClientCert": ssl.CERT_NONE,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}


# A client that connects and says nothing holds its thread no longer than this.
HANDSHAKE_TIMEOUT_S = 30


class WebConfigError(ValueError):
    """A web configuration the stand-in cannot serve; the message says why."""


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
        web_config = _option(argv, "--web-config-file")
        if web_config is not None:
            try:
                tls_context(web_config)  # refused at start, as the real exporter does
            except (WebConfigError, OSError, ssl.SSLError) as error:
                sys.stderr.write(f"{name}: web configuration {web_config}: {error}\n")
                return 1
        _serve_metrics(name, daemon, _address(argv), web_config)
    else:
        _run(name, daemon)
    return 0


def _option(argv: Sequence[str], flag: str, *aliases: str) -> str | None:
    """The value of a string flag given as ``--flag value`` or ``--flag=value`` (urfave/cli
    also takes one dash); the last one wins."""
    names = {flag, flag[1:], *aliases}
    value = None
    for index, argument in enumerate(argv):
        if argument in names and index + 1 < len(argv):
            value = argv[index + 1]
        elif "=" in argument and argument.split("=", 1)[0] in names:
            value = argument.split("=", 1)[1]
    return value


def _address(argv: Sequence[str]) -> tuple[str, int]:
    """dcgm-exporter's ``-a``/``--address`` (``[host]:port``); default ``:9400``."""
    address = _option(argv, "--address", "-a") or EXPORTER_DEFAULT_ADDRESS
    host, _, port = address.rpartition(":")
    return host, int(port)


def read_web_config(path: str) -> dict[str, str]:
    """``tls_server_config`` of an exporter-toolkit web configuration, in the one shape the
    stand-in reads (no YAML library on the node): that key, then ``key: value`` lines
    indented under it; comments and blank lines ignored."""
    settings: dict[str, str] = {}
    section = None
    for number, raw in enumerate(Path(path).read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        key, colon, value = line.strip().partition(":")
        if not colon:
            raise WebConfigError(f"line {number}: not a 'key: value' line")
        if not line.startswith(" "):
            if value.strip() or key != "tls_server_config":
                raise WebConfigError(f"line {number}: {key!r} is not a key the stand-in reads")
            section = key
            continue
        if section is None or key not in WEB_CONFIG_KEYS:
            raise WebConfigError(f"line {number}: field {key} not found in type web.TLSConfig")
        settings[key] = value.strip().strip('"')
    return settings


def tls_context(path: str) -> ssl.SSLContext:
    """The server context the web configuration at ``path`` asks for, read now."""
    settings = read_web_config(path)
    for needed in ("cert_file", "key_file"):
        if needed not in settings:
            raise WebConfigError(f"tls_server_config.{needed} is missing")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.minimum_version = TLS_VERSIONS[settings.get("min_version", "TLS12")]
        context.maximum_version = TLS_VERSIONS[settings.get("max_version", "TLS13")]
        context.verify_mode = CLIENT_AUTH_TYPES[settings.get("client_auth_type", "NoClientCert")]
    except KeyError as error:
        raise WebConfigError(f"unknown value {error.args[0]!r}") from None
    if context.verify_mode == ssl.CERT_REQUIRED:
        if "client_ca_file" not in settings:
            raise WebConfigError("RequireAndVerifyClientCert without client_ca_file")
        context.load_verify_locations(cafile=settings["client_ca_file"])
    context.load_cert_chain(settings["cert_file"], settings["key_file"])
    return context


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


def _serve_metrics(
    name: str, daemon: Daemon, address: tuple[str, int], web_config: str | None = None
) -> None:
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

    class TlsServer(http.server.ThreadingHTTPServer):
        """Each connection's handshake in its own thread, with a context made from the web
        configuration as it is now (a renewed certificate is served at once); a client the
        configuration refuses gets no HTTP at all."""

        def finish_request(  # type: ignore[override]
            self, request: socket.socket, client_address: object
        ) -> None:
            assert web_config is not None
            request.settimeout(HANDSHAKE_TIMEOUT_S)
            try:
                connection = tls_context(web_config).wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError, WebConfigError):
                return  # the handshake failed: socketserver closes the socket
            try:
                super().finish_request(connection, client_address)  # type: ignore[arg-type]
            finally:
                with contextlib.suppress(OSError):
                    connection.close()

    server_class = http.server.ThreadingHTTPServer if web_config is None else TlsServer
    server = server_class(address, Handler)
    _write_pid_file(daemon)

    _stop_on_signals(daemon)
    scheme = "https" if web_config else "http"
    where = f"{address[0]}:{address[1]}"
    sys.stderr.write(f"{name} {STANDIN_VERSION} serving {scheme} on {where}\n")
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

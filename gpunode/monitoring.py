"""What the monitoring host's Prometheus loads, generated from the inventory.

Three texts, one source of truth: the validated desired state of every host.

``render_file_sd``
    file-based service discovery targets (``file_sd_configs``), one file per exporter: a
    target per host whose node_exporter is enabled (``scrape_targets``), and per host with
    ``dcgm.exporter`` (``scrape_targets(hosts, DCGM_EXPORTER)``), each labelled ``host`` (the
    inventory name), ``group`` (its first inventory group) and ``groups`` (all of them,
    Prometheus' ``,a,b,`` list idiom), and ``gpu_model`` where ``expected_hardware.gpu_model``
    says.
``render_prometheus_config``
    the server's configuration: a job per exporter (``gpunode-node-exporter``,
    ``gpunode-dcgm-exporter``), each ``scheme: https`` with a ``tls_config`` verifying every
    exporter against gpunode's CA and presenting a client certificate issued by it, TLS 1.3
    only; the shipped rules (``monitoring/rules``) as ``rule_files``.
``render_web_config``
    Prometheus' own web configuration (``--web.config.file``): its web UI and HTTP API over
    TLS 1.3 only, with the host's node certificate, to ``prometheus.web_user`` alone (HTTP
    basic authentication against a bcrypt hash of the password in
    ``prometheus.web_password_file``, a file on the control machine that never leaves it).
``scrape_address``
    where Prometheus dials a host (``gpunode.model.scrape_host``, which inventory validation
    uses too: two hosts scraped at one address are refused before any host is touched).

The texts are YAML whose every string is a JSON string (JSON's escapes are YAML's), so no
inventory value can break out of its place; numbers and paths are checked before rendering.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import bcrypt

from gpunode.inventory import Fleet
from gpunode.model import (
    DCGM_EXPORTER_PORT,
    PROMETHEUS_WEB_USER,
    DesiredState,
    check_absolute_path,
    scrape_host,
)
from gpunode.sanitize import clean_text

# The scrape job of gpunode's node_exporters; monitoring/rules reads it (up{job=~"gpunode-.*"}).
NODE_EXPORTER_JOB = "gpunode-node-exporter"
DCGM_EXPORTER_JOB = "gpunode-dcgm-exporter"
# The exporters gpunode runs on a node, as scrape_targets names them.
Exporter = Literal["node_exporter", "dcgm_exporter"]
NODE_EXPORTER: Exporter = "node_exporter"
DCGM_EXPORTER: Exporter = "dcgm_exporter"
# What gpunode ships for Prometheus, beside this package.
SHIPPED_RULES_DIR = Path(__file__).resolve().parents[1] / "monitoring" / "rules"
# Prometheus label values gpunode writes: printable text of bounded length.
MAX_LABEL_CHARS = 256


# The web password: bcrypt reads at most 72 bytes of it (and the bcrypt package refuses
# more); fewer than 16 characters is a password a scan of the monitoring network can guess.
MIN_WEB_PASSWORD_CHARS = 16
MAX_WEB_PASSWORD_BYTES = 72
# bcrypt's cost for the web password's hash: exporter-toolkit checks a password against it
# once, then caches the result (prometheus/exporter-toolkit docs/web-configuration.md, "About
# bcrypt": cost 10 takes about 70 ms; read 2026-12-07).
WEB_PASSWORD_BCRYPT_COST = 12
# A bcrypt hash in the modular crypt format exporter-toolkit (Go's x/crypto/bcrypt) reads.
BCRYPT_HASH = re.compile(r"\$2[aby]\$[0-9]{2}\$[./A-Za-z0-9]{53}")


class MonitoringError(ValueError):
    """A value the Prometheus configuration cannot be made from; the message says which."""


@dataclass(frozen=True)
class InventoryHost:
    """What the scrape configuration needs of one inventory host."""

    name: str
    desired: DesiredState
    # pyinfra's ssh_hostname (None: the name is dialled).
    address: str | None = None
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class ScrapeTarget:
    host: str
    address: str  # what Prometheus dials: host:port ([v6]:port)
    labels: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ScraperTls:
    """The scraper's side of mutual TLS: paths on the host Prometheus runs on."""

    ca_file: str
    cert_file: str
    key_file: str


def inventory_hosts(inventory: Any, fleet: Fleet) -> list[InventoryHost]:
    """The hosts of a pyinfra Inventory with their validated desired state, in inventory
    order; their groups are the inventory's own, without the one pyinfra names after the
    inventory file (which every host of it is in)."""
    file_group = Path(fleet.source).stem
    found = []
    for host in inventory:
        if host.name not in fleet.hosts:
            raise MonitoringError(f"host {host.name!r} has no validated desired state")
        address = host.data.get("ssh_hostname")
        groups = tuple(group for group in host.groups if group not in (file_group, "all"))
        found.append(
            InventoryHost(
                host.name, fleet.hosts[host.name], str(address) if address else None, groups
            )
        )
    return found


def scrape_address(host: InventoryHost) -> str:
    """The name or address Prometheus dials for ``host`` (see the module's docstring)."""
    dialled = scrape_host(host.name, host.desired, host.address)
    if dialled is None:
        raise MonitoringError(f"host {host.name!r} is neither a DNS name nor an IP address")
    return dialled


def exporter_port(desired: DesiredState, exporter: Exporter) -> int | None:
    """The port ``exporter`` serves on a host, or None where gpunode runs none there."""
    if exporter == NODE_EXPORTER:
        return desired.node_exporter.port if desired.node_exporter.enabled else None
    if desired.dcgm.enabled and desired.dcgm.exporter:
        return DCGM_EXPORTER_PORT
    return None


def scrape_targets(
    hosts: Iterable[InventoryHost], exporter: Exporter = NODE_EXPORTER
) -> list[ScrapeTarget]:
    """One target per host that runs ``exporter``, in the order given."""
    targets = []
    seen: dict[str, str] = {}
    for host in hosts:
        port = exporter_port(host.desired, exporter)
        if port is None:
            continue
        dialled = scrape_address(host)
        address = f"[{dialled}]:{port}" if ":" in dialled else f"{dialled}:{port}"
        if address in seen:
            raise MonitoringError(
                f"hosts {seen[address]!r} and {host.name!r} are both scraped at {address}"
            )
        seen[address] = host.name
        labels = [("host", host.name)]
        if host.groups:
            labels += [("group", host.groups[0]), ("groups", f",{','.join(host.groups)},")]
        if host.desired.expected_hardware.gpu_model:
            labels.append(("gpu_model", host.desired.expected_hardware.gpu_model))
        targets.append(ScrapeTarget(host.name, address, tuple((k, _label(v)) for k, v in labels)))
    return targets


def _label(value: str) -> str:
    cleaned = clean_text(value)
    if cleaned != value or not value or len(value) > MAX_LABEL_CHARS:
        raise MonitoringError(
            f"label value {value!r} is not printable text of 1 to {MAX_LABEL_CHARS} characters"
        )
    return value


def render_file_sd(targets: Sequence[ScrapeTarget]) -> str:
    """``file_sd_configs`` targets (JSON, which Prometheus reads by the .json suffix)."""
    entries = [{"targets": [target.address], "labels": dict(target.labels)} for target in targets]
    return json.dumps(entries, indent=2) + "\n"


def shipped_rule_files(directory: Path = SHIPPED_RULES_DIR) -> list[Path]:
    """gpunode's alerting and recording rules, as the repository ships them."""
    found = sorted(directory.glob("*.yml"))
    if not found:
        raise MonitoringError(f"no rule files in {directory}")
    return found


def _path(value: str, what: str) -> str:
    problem = check_absolute_path(value)
    if problem is not None:
        raise MonitoringError(f"{what} {value!r}: {problem}")
    return value


def _seconds(value: int, what: str, low: int = 1, high: int = 86400) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise MonitoringError(f"{what} {value!r} is not a whole number of seconds {low}-{high}")
    return f"{value}s"


def _q(text: str) -> str:
    return json.dumps(text)


def render_prometheus_config(
    *,
    tls: ScraperTls,
    file_sd_files: Sequence[str],
    rule_files: Sequence[str],
    scrape_interval_seconds: int,
    evaluation_interval_seconds: int,
    scrape_timeout_seconds: int | None = None,
    refresh_interval_seconds: int = 60,
    dcgm_file_sd_files: Sequence[str] = (),
) -> str:
    """prometheus.yml: an https job of gpunode's node_exporters, found in ``file_sd_files``,
    and one of DCGM's exporters where ``dcgm_file_sd_files`` are given; the same TLS for both.

    The timeout defaults to 10 s, or the interval where that is shorter (Prometheus refuses
    a timeout longer than the interval).
    """
    interval = _seconds(scrape_interval_seconds, "scrape interval")
    evaluation = _seconds(evaluation_interval_seconds, "evaluation interval")
    timeout_value = (
        min(10, scrape_interval_seconds) if scrape_timeout_seconds is None
        else scrape_timeout_seconds
    )  # fmt: skip
    timeout = _seconds(timeout_value, "scrape timeout", high=scrape_interval_seconds)
    refresh = _seconds(refresh_interval_seconds, "file_sd refresh interval")
    if not file_sd_files:
        raise MonitoringError("no file_sd target files")
    lines = [
        "# Managed by gpunode (gpunode.monitoring); local edits are replaced on the next run.",
        "global:",
        f"  scrape_interval: {interval}",
        f"  scrape_timeout: {timeout}",
        f"  evaluation_interval: {evaluation}",
        "rule_files:",
        *(f"  - {_q(_path(path, 'rule file'))}" for path in rule_files),
        "scrape_configs:",
        *_job(NODE_EXPORTER_JOB, tls, file_sd_files, refresh),
    ]
    if dcgm_file_sd_files:
        lines += _job(DCGM_EXPORTER_JOB, tls, dcgm_file_sd_files, refresh)
    return "\n".join(lines) + "\n"


def _job(name: str, tls: ScraperTls, file_sd_files: Sequence[str], refresh: str) -> list[str]:
    return [
        f"  - job_name: {_q(name)}",
        "    scheme: https",
        "    tls_config:",
        f"      ca_file: {_q(_path(tls.ca_file, 'CA file'))}",
        f"      cert_file: {_q(_path(tls.cert_file, 'client certificate'))}",
        f"      key_file: {_q(_path(tls.key_file, 'client key'))}",
        "      min_version: TLS13",
        "      insecure_skip_verify: false",
        "    file_sd_configs:",
        "      - files:",
        *(f"          - {_q(_path(path, 'file_sd file'))}" for path in file_sd_files),
        f"        refresh_interval: {refresh}",
    ]


# --- Prometheus' own web server -----------------------------------------------------------


@dataclass(frozen=True)
class WebPassword:
    """The web password, which nothing prints: pyinfra shows an unnamed operation's
    arguments (and puts them in --json), a traceback its frames' values."""

    secret: bytes = field(repr=False)

    def __str__(self) -> str:
        return "<the web password>"


def read_web_password(path: str) -> WebPassword:
    """The password in ``prometheus.web_password_file``; an error names the file and why,
    never its content. A file others may read is refused, as the CA's passphrase file is."""
    try:
        mode = os.stat(path).st_mode
        with open(path, "rb") as handle:
            text = handle.read(4096)
    except OSError as error:
        raise MonitoringError(f"prometheus.web_password_file {path}: {error.strerror}") from None
    if mode & 0o077:
        raise MonitoringError(
            f"prometheus.web_password_file {path} is readable by others (mode "
            f"{stat.S_IMODE(mode):04o}); chmod 600 {path}"
        )
    password = text.rstrip(b"\r\n")
    if len(password.decode("utf-8", errors="replace")) < MIN_WEB_PASSWORD_CHARS:
        raise MonitoringError(
            f"prometheus.web_password_file {path}: the password is shorter than "
            f"{MIN_WEB_PASSWORD_CHARS} characters"
        )
    if len(password) > MAX_WEB_PASSWORD_BYTES or any(b < 0x20 or b == 0x7F for b in password):
        raise MonitoringError(
            f"prometheus.web_password_file {path}: the password must be one line of at most "
            f"{MAX_WEB_PASSWORD_BYTES} bytes (bcrypt reads no more), without control characters"
        )
    return WebPassword(password)


def web_password_hash(password: WebPassword, current: str | None = None) -> str:
    """A bcrypt hash of ``password``: ``current`` (the hash the host has now) where it is
    one and matches, so that a second run changes nothing; else a new one, salted anew."""
    secret = password.secret
    matches = current is not None and BCRYPT_HASH.fullmatch(current) is not None
    if matches and current is not None and bcrypt.checkpw(secret, current.encode()):
        return current
    return bcrypt.hashpw(secret, bcrypt.gensalt(rounds=WEB_PASSWORD_BCRYPT_COST)).decode()


def web_user_line_prefix(user: str) -> str:
    """How ``render_web_config`` begins the line of ``user``'s hash (a fact finds it by it)."""
    return f"  {_q(user)}: "


def hash_in_web_config_line(line: str, user: str) -> str | None:
    """The bcrypt hash on a line of the host's web configuration (node output: anything
    that is not exactly a quoted bcrypt hash after the user's prefix is None)."""
    prefix = web_user_line_prefix(user)
    if not line.startswith(prefix):
        return None
    try:
        value = json.loads(line[len(prefix) :])
    except ValueError:
        return None
    return value if isinstance(value, str) and BCRYPT_HASH.fullmatch(value) else None


def render_web_config(*, certificate: str, key: str, user: str, password_hash: str) -> str:
    """Prometheus' web configuration (exporter-toolkit's format, as for the exporters:
    prometheus/exporter-toolkit docs/web-configuration.md, read 2026-12-07): TLS 1.3 only
    with ``certificate`` and ``key``, and ``user`` with ``password_hash`` the one user that
    may use the web UI and HTTP API."""
    if not re.fullmatch(PROMETHEUS_WEB_USER, user):
        raise MonitoringError(f"web user {user!r} is not a word of {PROMETHEUS_WEB_USER}")
    if not BCRYPT_HASH.fullmatch(password_hash):
        raise MonitoringError("the web password's hash is not a bcrypt hash")
    lines = [
        "# Managed by gpunode (gpunode.monitoring); local edits are replaced on the next run.",
        "# TLS 1.3 only; the web UI and HTTP API to prometheus.web_user alone.",
        "tls_server_config:",
        f"  cert_file: {_q(_path(certificate, 'web certificate'))}",
        f"  key_file: {_q(_path(key, 'web key'))}",
        "  min_version: TLS13",
        "  max_version: TLS13",
        "basic_auth_users:",
        f"{web_user_line_prefix(user)}{_q(password_hash)}",
    ]
    return "\n".join(lines) + "\n"

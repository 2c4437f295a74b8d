"""prometheus role (the monitoring host): its configuration, the promtool gate before a new
configuration replaces the live one (run for real with promtool), the scraper key copy and
certificate; its web server: a real Prometheus serving the role's web configuration answers
its web user over TLS 1.3 alone, and the model refuses a monitoring host without a password."""

from __future__ import annotations

import hashlib
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from pyinfra.api import FunctionCommand
from pyinfra.api.command import FileUploadCommand
from pyinfra.facts.files import File, FindInFile, Sha256File

from facts.tls import SCRAPER_CERT_PATH, ScraperCertificate, parse_node_certificate
from gpunode import pki
from gpunode.inventory import InvalidInventory, validate_hosts
from gpunode.model import DesiredState, NodeExporter, Prometheus, Tls
from gpunode.monitoring import (
    DCGM_EXPORTER_JOB,
    NODE_EXPORTER_JOB,
    MonitoringError,
    WebPassword,
    read_web_password,
    render_web_config,
    shipped_rule_files,
    web_password_hash,
)
from roles.prometheus import (
    CANDIDATE_PATH,
    DCGM_TARGETS_PATH,
    RULES_DIR,
    SCRAPER_KEY_PATH,
    TARGETS_PATH,
    WEB_CANDIDATE_PATH,
    WEB_CONFIG_PATH,
    check_command,
    checked_config,
    render_config,
    render_defaults,
    render_host_web_config,
    scraper_certificate,
    scraper_key,
    web_check_command,
    web_config,
)
from roles.tls import issue_node_certificate
from tests.mtls import basic_auth_get, client_context, write_node_files
from tests.prometheus_server import free_port, prometheus_binary

from . import prometheus_tools as promtool
from .fakehost import commands_of, fake_host

KEY_SHA = "a" * 64
MONITORING = DesiredState(
    tls=Tls(enabled=True),
    node_exporter=NodeExporter(enabled=True),
    prometheus=Prometheus(enabled=True, scrape_interval_seconds=15, evaluation_interval_seconds=20),
)


def test_the_config_names_the_hosts_certificate_the_copy_of_its_key_and_the_rules() -> None:
    config = yaml.safe_load(render_config(MONITORING))
    assert config["global"]["scrape_interval"] == "15s"
    assert config["global"]["evaluation_interval"] == "20s"
    assert config["rule_files"] == [f"{RULES_DIR}/{path.name}" for path in shipped_rule_files()]
    node, dcgm = config["scrape_configs"]
    assert (node["job_name"], dcgm["job_name"]) == (NODE_EXPORTER_JOB, DCGM_EXPORTER_JOB)
    for job in (node, dcgm):
        assert job["scheme"] == "https"
        assert job["tls_config"]["ca_file"] == "/etc/gpunode/tls/ca.crt"
        # Its own client certificate, not the node certificate (which serves only).
        assert job["tls_config"]["cert_file"] == SCRAPER_CERT_PATH
        assert job["tls_config"]["key_file"] == SCRAPER_KEY_PATH
        assert job["tls_config"]["min_version"] == "TLS13"
    assert node["file_sd_configs"][0]["files"] == [TARGETS_PATH]
    assert dcgm["file_sd_configs"][0]["files"] == [DCGM_TARGETS_PATH]
    assert render_defaults(9090, 15).splitlines()[-1] == (
        'ARGS="--config.file=/etc/prometheus/prometheus.yml --web.listen-address=:9090 '
        '--web.config.file=/etc/prometheus/gpunode/web.yml --storage.tsdb.retention.time=15d"'
    )


def test_the_live_config_is_left_alone_when_it_is_gpunodes() -> None:
    content = render_config(MONITORING)
    facts = {Sha256File: hashlib.sha256(content.encode()).hexdigest()}
    commands, noops = commands_of(checked_config, facts, content=content)
    assert commands == [] and noops == ["/etc/prometheus/prometheus.yml is gpunode's configuration"]


def test_a_new_config_is_uploaded_beside_the_live_one_and_checked_before_it_replaces_it() -> None:
    content = render_config(MONITORING)
    with fake_host({Sha256File: "b" * 64}):
        commands = list(checked_config._inner(content=content))
    upload, check = commands
    assert isinstance(upload, FileUploadCommand) and upload.dest == CANDIDATE_PATH
    assert upload.src.getvalue() == content
    assert check == check_command()


@pytest.fixture
def live(tmp_path: Path) -> Path:
    path = tmp_path / "prometheus.yml"
    path.write_text("# the running server's configuration\nglobal: {}\n")
    return path


def run_check(candidate: Path, live: Path) -> subprocess.CompletedProcess[str]:
    promtool.promtool()  # fails, not skips, where promtool is missing
    return subprocess.run(
        ["sh", "-c", check_command(str(candidate), str(live))],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_config_promtool_accepts_replaces_the_live_one(tmp_path: Path, live: Path) -> None:
    candidate = tmp_path / "prometheus.yml.gpunode-new"
    candidate.write_text("global:\n  scrape_interval: 30s\nscrape_configs: []\n")
    result = run_check(candidate, live)
    assert result.returncode == 0, result.stdout + result.stderr
    assert live.read_text() == "global:\n  scrape_interval: 30s\nscrape_configs: []\n"
    assert not candidate.exists()


@pytest.mark.parametrize(
    "broken",
    [
        "global:\n  scrape_interval: soon\n",  # not a duration
        "rule_files: [/nonexistent/rules.yml]\nscrape_configs:\n  - job_name: a\n"
        "    tls_config: {cert_file: /nonexistent.crt, key_file: /nonexistent.key}\n",
    ],
    ids=["bad-duration", "missing-files"],
)
def test_a_config_promtool_refuses_changes_nothing(tmp_path: Path, live: Path, broken: str) -> None:
    before = live.read_text()
    candidate = tmp_path / "prometheus.yml.gpunode-new"
    candidate.write_text(broken)
    result = run_check(candidate, live)
    assert result.returncode != 0
    assert "is unchanged" in result.stderr
    assert live.read_text() == before and not candidate.exists()


def key_facts(copy_sha: str | None, mode: int = 640, group: str = "prometheus") -> dict[type, Any]:
    def sha(path: str) -> str | None:
        return KEY_SHA if path == "/etc/gpunode/tls/node.key" else copy_sha

    info = None if copy_sha is None else {"mode": mode, "user": "root", "group": group}
    return {Sha256File: sha, File: info}


def test_a_current_scraper_key_is_left_alone() -> None:
    commands, noops = commands_of(scraper_key, key_facts(KEY_SHA))
    assert commands == [] and noops == [f"{SCRAPER_KEY_PATH} is node.key's, 0640 root:prometheus"]


@pytest.mark.parametrize(
    "facts",
    [key_facts(None), key_facts("b" * 64), key_facts(KEY_SHA, mode=644),
     key_facts(KEY_SHA, group="gpunode-exporters")],
    ids=["missing", "stale", "mode", "group"],
)  # fmt: skip
def test_a_missing_stale_or_exposed_scraper_key_is_copied_on_the_host(
    facts: dict[type, Any],
) -> None:
    commands, _ = commands_of(scraper_key, facts)
    new = f"{SCRAPER_KEY_PATH}.new"
    # Copied on the host: the key's bytes are in no command and never reach the control side.
    assert commands == [
        f"umask 077 && rm -f {new} && cp /etc/gpunode/tls/node.key {new} && "
        f"chown root:prometheus {new} && chmod 0640 {new} && mv -f {new} {SCRAPER_KEY_PATH}"
    ]


def test_a_key_made_in_this_run_is_copied_after_it() -> None:
    commands, _ = commands_of(scraper_key, key_facts(KEY_SHA), key_will_be_made=True)
    assert len(commands) == 1 and commands[0].startswith("umask 077 && ")


# --- the scraper's own client certificate ------------------------------------------------------

NOW = pki._now()


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> pki.CertificateAuthority:
    created = pki.open_ca(tmp_path_factory.mktemp("ca") / "ca", b"unit test passphrase 16+")
    assert created is not None
    return created


def certificate_lines(certificate: Any, key: ec.EllipticCurvePrivateKey) -> list[str]:
    """What the ScraperCertificate fact prints for a certificate and node.key."""
    from gpunode import framing

    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    pem = certificate.public_bytes(serialization.Encoding.PEM).decode()

    def part(name: str, lines: list[str]) -> dict[str, framing.PartOutput]:
        return {
            f"{name}-exists": framing.PartOutput(f"{name}-exists", [], [], 0),
            name: framing.PartOutput(name, lines, [], 0),
        }

    return framing.output_of(
        part("certificate", pem.splitlines()) | part("public-key", public.decode().splitlines())
    )


SCRAPER = pki.wanted_certificate("mon-1", Tls(enabled=True), usage="client")


def test_a_current_scraper_certificate_is_left_alone(authority: pki.CertificateAuthority) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    issued = pki.issue_certificate(authority, key.public_key(), SCRAPER)
    report = parse_node_certificate(certificate_lines(issued, key), cert_path=SCRAPER_CERT_PATH)
    commands, noops = commands_of(
        scraper_certificate, {ScraperCertificate: report}, wanted=SCRAPER, authority=authority
    )
    assert commands == [] and len(noops) == 1 and noops[0].startswith("certificate for mon-1")


def test_the_node_certificate_as_the_scraper_certificate_is_replaced_by_a_client_one(
    authority: pki.CertificateAuthority,
) -> None:
    """What the host had before: its node certificate (for serving) scraping. The scraper's
    certificate is issued anew, for clientAuth, at its own path; node.key is never remade."""
    key = ec.generate_private_key(ec.SECP256R1())
    node = pki.issue_certificate(
        authority, key.public_key(), pki.wanted_certificate("mon-1", Tls(enabled=True))
    )
    report = parse_node_certificate(certificate_lines(node, key), cert_path=SCRAPER_CERT_PATH)
    with fake_host({ScraperCertificate: report}):
        (command,) = list(scraper_certificate._inner(wanted=SCRAPER, authority=authority))
    assert isinstance(command, FunctionCommand) and command.function is issue_node_certificate
    assert command.kwargs["certificate_path"] == SCRAPER_CERT_PATH
    assert command.kwargs["wanted"].usage == "client"
    assert command.kwargs["reason"] == "it is for server; wanted client only"


def test_a_node_key_made_in_this_run_gets_a_scraper_certificate_after_it(
    authority: pki.CertificateAuthority,
) -> None:
    absent = parse_node_certificate([], cert_path=SCRAPER_CERT_PATH)
    with fake_host({ScraperCertificate: absent}):
        commands = list(
            scraper_certificate._inner(wanted=SCRAPER, authority=authority, key_will_be_made=True)
        )
    # Only the signing: roles/tls.py makes the key, earlier in the run.
    (command,) = commands
    assert isinstance(command, FunctionCommand)
    assert command.kwargs["expected_public_key_pem"] is None


# --- the web configuration: its password's hash, never the password ----------------------------

PASSWORD = b"correct horse battery staple web"
SECRET = WebPassword(PASSWORD)
PREVIOUS = WebPassword(b"the password before this one")


def password_file(directory: Path, mode: int = 0o600, content: bytes = PASSWORD + b"\n") -> str:
    path = directory / "prometheus-web.password"
    path.write_bytes(content)
    path.chmod(mode)
    return str(path)


def test_the_web_password_is_read_from_a_private_file(tmp_path: Path) -> None:
    password = read_web_password(password_file(tmp_path))
    assert password.secret == PASSWORD
    # What pyinfra or a traceback would print of it.
    assert PASSWORD.decode() not in f"{password} {password!r}"


@pytest.mark.parametrize(
    ("mode", "content", "message"),
    [
        (0o640, PASSWORD, "readable by others \\(mode 0640\\); chmod 600"),
        (0o604, PASSWORD, "readable by others \\(mode 0604\\)"),
        (0o600, b"short\n", "shorter than 16 characters"),
        (0o600, b"x" * 73, "at most 72 bytes"),
        (0o600, b"sixteen chars or\x1bmore", "without control characters"),
    ],
    ids=["group", "world", "short", "long", "control"],
)
def test_an_exposed_or_unusable_web_password_is_refused_without_showing_it(
    tmp_path: Path, mode: int, content: bytes, message: str
) -> None:
    path = password_file(tmp_path, mode, content)
    with pytest.raises(MonitoringError, match=message) as refused:
        read_web_password(path)
    assert path in str(refused.value) and content.decode(errors="replace") not in str(refused.value)


def web_facts(text: str | None, mode: int = 640, group: str = "prometheus") -> dict[type, Any]:
    lines = None if text is None else [line for line in text.splitlines() if '": "$2' in line]
    sha = None if text is None else hashlib.sha256(text.encode()).hexdigest()
    info = None if text is None else {"mode": mode, "user": "root", "group": group}
    return {FindInFile: lines, Sha256File: sha, File: info}


def test_a_web_configuration_whose_hash_matches_the_password_is_left_alone() -> None:
    live = render_host_web_config("gpunode", web_password_hash(SECRET))
    commands, noops = commands_of(web_config, web_facts(live), user="gpunode", password=SECRET)
    assert commands == [] and noops == [f"{WEB_CONFIG_PATH} serves TLS 1.3 to gpunode alone"]


@pytest.mark.parametrize(
    "facts",
    [
        web_facts(None),
        web_facts(render_host_web_config("gpunode", web_password_hash(PREVIOUS))),
        web_facts(render_host_web_config("gpunode", web_password_hash(SECRET)), mode=644),
    ],
    ids=["missing", "other-password", "mode"],
)
def test_a_missing_stale_or_exposed_web_configuration_is_checked_then_replaced(
    facts: dict[type, Any],
) -> None:
    with fake_host(facts):
        upload, check = list(web_config._inner(user="gpunode", password=SECRET))
    assert isinstance(upload, FileUploadCommand) and upload.dest == WEB_CANDIDATE_PATH
    text = upload.src.getvalue()
    assert PASSWORD.decode() not in text
    (line,) = [line for line in text.splitlines() if line.startswith('  "gpunode": ')]
    assert web_password_hash(SECRET, line.split(": ", 1)[1].strip('"')) in line
    assert check == web_check_command()


def test_promtool_gates_the_web_configuration(tmp_path: Path) -> None:
    promtool.promtool()
    live = tmp_path / "web.yml"
    live.write_text("# the live one\n")
    candidate = tmp_path / "web.yml.gpunode-new"
    candidate.write_text("tls_server_config:\n  cert_file: /nonexistent.crt\n")
    command = web_check_command(str(candidate), str(live)).replace(
        "chown root:prometheus", "chown $(id -u):$(id -g)"
    )
    refused = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "is unchanged" in refused.stderr
    assert live.read_text() == "# the live one\n" and not candidate.exists()


def test_a_monitoring_host_without_a_web_password_is_refused_naming_host_and_key() -> None:
    """Prometheus without authentication would serve the fleet's metrics to whoever reaches
    its port: the inventory is refused before any host is touched."""
    open_door = {"tls": {"enabled": True}, "prometheus": {"enabled": True}}
    with pytest.raises(InvalidInventory) as refused:
        validate_hosts("inventories/prod.py", [("mon-1.example", open_door)])
    assert refused.value.lines == [
        "inventories/prod.py: host mon-1.example: prometheus.web_password_file = None: unset: "
        "Prometheus would serve the fleet's metrics and its HTTP API to every network that "
        "reaches port 9090, without authentication; accepted: the path of a file on the "
        "control machine (mode 0600) holding the password of prometheus.web_user"
    ]
    closed = {**open_door, "prometheus": {"enabled": True, "web_password_file": "/etc/pw"}}
    validate_hosts("inventories/prod.py", [("mon-1.example", closed)])


# --- a real Prometheus serving the role's web configuration ---------------------------------


@dataclass(frozen=True)
class ServedPrometheus:
    port: int
    ca: Path


@pytest.fixture(scope="module")
def served_prometheus(
    authority: pki.CertificateAuthority, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServedPrometheus]:
    """Debian's prometheus with the web configuration the role renders (the node certificate
    of 127.0.0.1 from a gpunode CA, the web user "grafana"), on the loopback."""
    directory = tmp_path_factory.mktemp("prometheus-web")
    write_node_files(directory, authority)
    web = directory / "web.yml"
    web.write_text(
        render_web_config(
            certificate=str(directory / "node.crt"),
            key=str(directory / "node.key"),
            user="grafana",
            password_hash=web_password_hash(SECRET),
        )
    )
    checked = promtool.run("check", "web-config", web)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (directory / "prometheus.yml").write_text("global: {}\nscrape_configs: []\n")
    port = free_port()
    process = subprocess.Popen(
        [
            prometheus_binary(),
            f"--config.file={directory / 'prometheus.yml'}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--web.config.file={web}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(300):
            with socket.socket() as attempt:
                if attempt.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            time.sleep(0.1)
        yield ServedPrometheus(port, directory / "ca.crt")
    finally:
        process.terminate()
        process.wait(timeout=30)


def get(
    served: ServedPrometheus,
    credentials: tuple[str, bytes] | None,
    scheme: str = "https",
    maximum: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED,
) -> tuple[int | None, str]:
    """(HTTP status or None, body or why) of the API's build information."""
    context = client_context(served.ca, None, maximum=maximum) if scheme == "https" else None
    return basic_auth_get(
        f"{scheme}://127.0.0.1:{served.port}/api/v1/status/buildinfo", context, credentials
    )


def test_prometheus_answers_its_web_user_over_tls(served_prometheus: ServedPrometheus) -> None:
    status, body = get(served_prometheus, ("grafana", PASSWORD))
    assert status == 200 and '"status":"success"' in body, (status, body)


@pytest.mark.parametrize(
    "credentials",
    [None, ("grafana", b"not the password at all"), ("admin", PASSWORD)],
    ids=["none", "wrong-password", "other-user"],
)
def test_prometheus_refuses_a_client_without_its_credentials(
    served_prometheus: ServedPrometheus, credentials: tuple[str, bytes] | None
) -> None:
    status, body = get(served_prometheus, credentials)
    assert status == 401 and "success" not in body, (status, body)


def test_prometheus_refuses_plain_http_and_tls_12(served_prometheus: ServedPrometheus) -> None:
    status, body = get(served_prometheus, ("grafana", PASSWORD), scheme="http")
    assert status != 200 and "success" not in body, (status, body)
    status, why = get(served_prometheus, ("grafana", PASSWORD), maximum=ssl.TLSVersion.TLSv1_2)
    assert status is None and "VERSION" in why.upper(), why

"""node_exporter role: its files and the key copy (facts in, commands out), and a real
node_exporter serving gpunode's web configuration: TLS 1.3 and gpunode client certificates
only. The same web configuration served by the lab's stand-in for DCGM's exporter
(lab/standin/daemon.py, ``--web-config-file``) passes the same tests: the stand-in honours it
for real."""

from __future__ import annotations

import os
import re
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from pyinfra.facts.files import File, Sha256File

from gpunode import pki
from gpunode.model import Tls
from roles.node_exporter import (
    GROUP,
    KEY_COPY_PATH,
    exporter_arguments,
    exporter_key,
    render_defaults,
    render_drop_in,
    render_web_config,
)
from tests.mtls import (
    ClientCertificate,
    client_context,
    foreign_client,
    issue_client,
    scrape,
    write_node_files,
)

from .fakehost import commands_of

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
ROOT = Path(__file__).resolve().parents[2]
KEY_SHA = "a" * 64


def key_facts(copy_sha: str | None, mode: int = 640, group: str = GROUP) -> dict[type, Any]:
    def sha(path: str) -> str | None:
        return KEY_SHA if path == "/etc/gpunode/tls/node.key" else copy_sha

    info = None if copy_sha is None else {"mode": mode, "user": "root", "group": group}
    return {Sha256File: sha, File: info}


def test_a_current_key_copy_is_left_alone() -> None:
    commands, noops = commands_of(exporter_key, key_facts(KEY_SHA))
    assert commands == []
    assert noops == [f"{KEY_COPY_PATH} is node.key's, 0640 root:{GROUP}"]


@pytest.mark.parametrize(
    "facts",
    [
        key_facts(None),  # no copy yet
        key_facts("b" * 64),  # node.key was replaced
        key_facts(KEY_SHA, mode=644),  # readable by everyone
        key_facts(KEY_SHA, group="prometheus"),
    ],
    ids=["missing", "stale", "mode", "group"],
)
def test_a_missing_stale_or_exposed_key_copy_is_replaced(facts: dict[type, Any]) -> None:
    commands, _ = commands_of(exporter_key, facts)
    new = f"{KEY_COPY_PATH}.new"
    assert commands == [
        f"umask 077 && rm -f {new} && cp /etc/gpunode/tls/node.key {new} && "
        f"chown root:{GROUP} {new} && chmod 0640 {new} && mv -f {new} {KEY_COPY_PATH}"
    ]


def test_a_key_made_in_this_run_is_copied_after_it() -> None:
    commands, _ = commands_of(exporter_key, key_facts(KEY_SHA), key_will_be_made=True)
    assert len(commands) == 1 and commands[0].startswith("umask 077 && ")


def test_the_files_say_tls13_client_certificates_and_the_textfile_directory() -> None:
    web = render_web_config()
    assert "  min_version: TLS13\n" in web and "  max_version: TLS13\n" in web
    assert "  client_auth_type: RequireAndVerifyClientCert\n" in web
    assert "  client_ca_file: /etc/gpunode/tls/ca.crt\n" in web
    assert "  cert_file: /etc/gpunode/tls/node.crt\n" in web
    assert f"  key_file: {KEY_COPY_PATH}\n" in web
    defaults = render_defaults(9100, "/var/lib/prometheus/node-exporter")
    assert defaults.splitlines()[-1] == (
        'ARGS="--web.listen-address=:9100 --web.config.file=/etc/gpunode/node-exporter/web.yml '
        '--collector.textfile.directory=/var/lib/prometheus/node-exporter"'
    )
    assert f"SupplementaryGroups={GROUP}" in render_drop_in()


def test_arguments_that_systemd_would_split_are_refused() -> None:
    with pytest.raises(ValueError, match="cannot be passed"):
        render_defaults(9100, "/var/lib/node exporter")


# --- a real node_exporter with gpunode's web configuration ------------------------------------


@dataclass
class Served:
    port: int
    ca: Path
    client: ClientCertificate
    directory: Path
    authority: pki.CertificateAuthority
    node_key: ec.EllipticCurvePrivateKey
    # What the exporter's /metrics shows when served (a regular expression, per line).
    shows: str


# The stand-in DCGM exporter, run here under its name with its pid file in the test's
# directory (argv: pid file, then the exporter's own arguments).
STANDIN_DCGM_EXPORTER = """
import dataclasses, sys
from lab.standin import daemon
entry = daemon.DAEMONS["dcgm-exporter"]
daemon.DAEMONS["dcgm-exporter"] = dataclasses.replace(entry, pid_file=sys.argv[1])
sys.exit(daemon.main(sys.argv[2:], name="dcgm-exporter"))
"""
# A GPU as nvidia-smi --query-gpu lists it for the stand-in (index, uuid, name, then its
# fields: temperature, power, utilisation, memory used).
FAKE_NVIDIA_SMI = "#!/bin/sh\necho '0, GPU-0000-unit, NVIDIA H100, 41, 350.5, 97, 1024'\n"


def exporter_command(kind: str, port: int, web: Path, directory: Path) -> list[str]:
    if kind == "node_exporter":
        assert Path(NODE_EXPORTER).exists(), (
            "prometheus-node-exporter is not installed (./dev installs it; CI has it)"
        )
        textfile = directory / "textfile"
        textfile.mkdir()
        (textfile / "gpunode_gpu.prom").write_text(
            "# HELP gpunode_gpus GPUs the driver reports\n# TYPE gpunode_gpus gauge\n"
            "gpunode_gpus 8\n"
        )
        arguments = exporter_arguments(port, str(textfile), str(web))
        # On the node it listens on every address; here on the loopback only.
        arguments[0] = f"--web.listen-address=127.0.0.1:{port}"
        return [NODE_EXPORTER, *arguments, "--collector.disable-defaults", "--collector.textfile"]
    return [
        sys.executable, "-c", STANDIN_DCGM_EXPORTER, str(directory / "dcgm-exporter.pid"),
        "--address", f"127.0.0.1:{port}", f"--web-config-file={web}",
    ]  # fmt: skip


SHOWS = {
    "node_exporter": r"^gpunode_gpus 8$",
    "dcgm_exporter_standin": r'^DCGM_FI_DEV_GPU_TEMP\{gpu="0",UUID="GPU-0000-unit",[^}]*\} 41$',
}


def install_node_certificate(served: Served) -> int:
    """Issue the node a new certificate for its key, installed as roles/tls.py does (a
    rename over node.crt); its serial number."""
    wanted = pki.wanted_certificate("127.0.0.1", Tls(enabled=True))
    certificate = pki.issue_certificate(served.authority, served.node_key.public_key(), wanted)
    new = served.directory / "node.crt.new"
    new.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    new.replace(served.directory / "node.crt")
    return certificate.serial_number


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(params=sorted(SHOWS))
def served(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Served]:
    """node_exporter (its textfile collector reading one gpunode metric), or the stand-in
    DCGM exporter (one GPU from a fake nvidia-smi), serving this repository's web
    configuration with a node certificate from a gpunode CA (for 127.0.0.1)."""
    kind = request.param
    authority = pki.open_ca(tmp_path / "ca", b"unit test passphrase")
    assert authority is not None
    node_key = write_node_files(tmp_path, authority)
    web = tmp_path / "web.yml"
    web.write_text(
        render_web_config(
            str(tmp_path / "node.crt"), str(tmp_path / "node.key"), str(tmp_path / "ca.crt")
        )
    )
    port = free_port()
    (tmp_path / "clients").mkdir()
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (tools / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    process = subprocess.Popen(
        exporter_command(kind, port, web, tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(100):
            with socket.socket() as attempt:
                if attempt.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            time.sleep(0.1)
        client = issue_client(authority, "scraper.example", tmp_path / "clients")
        yield Served(port, tmp_path / "ca.crt", client, tmp_path, authority, node_key, SHOWS[kind])
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_the_scrapers_client_certificate_gets_the_metrics(served: Served) -> None:
    answer = scrape("127.0.0.1", served.port, client_context(served.ca, served.client))
    assert answer.status == 200, answer.error
    assert re.search(served.shows, answer.body, re.MULTILINE), answer.body


def test_a_node_certificate_presented_as_a_client_is_refused(served: Served) -> None:
    """Another node's certificate, from the same CA, as gpunode issues it (for serving):
    a node cannot scrape another node's exporter."""
    node = issue_client(served.authority, "node-2", served.directory / "clients", usage="server")
    answer = scrape("127.0.0.1", served.port, client_context(served.ca, node))
    assert answer.status is None and answer.body == "", answer


def test_no_client_certificate_is_refused(served: Served) -> None:
    answer = scrape("127.0.0.1", served.port, client_context(served.ca, None))
    assert answer.status is None and answer.body == "", answer


def test_a_client_certificate_from_another_ca_is_refused(served: Served) -> None:
    answer = scrape(
        "127.0.0.1", served.port, client_context(served.ca, foreign_client(served.directory))
    )
    assert answer.status is None, answer


def test_tls_12_is_refused(served: Served) -> None:
    context = client_context(served.ca, served.client, maximum=ssl.TLSVersion.TLSv1_2)
    answer = scrape("127.0.0.1", served.port, context)
    assert answer.status is None, answer
    assert "VERSION" in answer.error.upper(), answer.error


def test_a_renewed_certificate_is_served_without_a_restart(served: Served) -> None:
    """roles/tls.py renews with the same key: the running exporter serves the new
    certificate from the next connection on, and no scrape fails (none restarts it)."""
    context = client_context(served.ca, served.client)
    before = scrape("127.0.0.1", served.port, context)
    assert before.status == 200, before.error
    serial = install_node_certificate(served)
    after = scrape("127.0.0.1", served.port, context)
    assert after.status == 200, after.error
    assert after.peer_serial is not None and int(after.peer_serial, 16) == serial
    assert before.peer_serial != after.peer_serial

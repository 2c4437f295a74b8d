"""prometheus role (the monitoring host): its configuration, the promtool gate before a new
configuration replaces the live one (run for real with promtool), the scraper key copy."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyinfra.api.command import FileUploadCommand
from pyinfra.facts.files import File, Sha256File

from gpunode.model import DesiredState, NodeExporter, Prometheus, Tls
from gpunode.monitoring import DCGM_EXPORTER_JOB, NODE_EXPORTER_JOB, shipped_rule_files
from roles.prometheus import (
    CANDIDATE_PATH,
    DCGM_TARGETS_PATH,
    RULES_DIR,
    SCRAPER_KEY_PATH,
    TARGETS_PATH,
    check_command,
    checked_config,
    render_config,
    render_defaults,
    scraper_key,
)

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
        assert job["tls_config"]["cert_file"] == "/etc/gpunode/tls/node.crt"
        assert job["tls_config"]["key_file"] == SCRAPER_KEY_PATH
        assert job["tls_config"]["min_version"] == "TLS13"
    assert node["file_sd_configs"][0]["files"] == [TARGETS_PATH]
    assert dcgm["file_sd_configs"][0]["files"] == [DCGM_TARGETS_PATH]
    assert render_defaults(9090, 15).splitlines()[-1] == (
        'ARGS="--config.file=/etc/prometheus/prometheus.yml --web.listen-address=:9090 '
        '--storage.tsdb.retention.time=15d"'
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

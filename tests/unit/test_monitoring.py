"""monitoring/: the alerting and recording rules and the Grafana dashboard gpunode ships.

promtool checks the rules and runs their unit tests (tests/unit/promtool/); two more rule
tests are generated here from what the probe and the drift check really render (the lab's
simulated GPUs, healthy and with faults injected), so a renamed metric or label cannot leave
an alert silently dead. The metric names the rules and the dashboard read are checked against
those renderings and against a real node_exporter serving them through its textfile collector.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpunode.drift.findings import RUN_DEPLOY, DriftResult, Finding, Severity
from gpunode.drift.output import render_prometheus as render_drift
from gpunode.probe.gpu_probe import Completed, collect
from gpunode.probe.textfile import Expected, render_prometheus

from . import prometheus_tools as promtool
from .test_probe import XID_LINE, FakeNode, hardware, share_dir  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "monitoring" / "rules"
DASHBOARDS = ROOT / "monitoring" / "dashboards"
RULE_TESTS = Path(__file__).resolve().parent / "promtool"
FIXTURES = ROOT / "tests" / "fixtures"
JOB = "gpunode-node-exporter"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
# Series Prometheus itself makes: `up` for every target, `ALERTS` for every alert (the fleet
# test below reads it too).
PROMETHEUS_OWN = {"up", "ALERTS"}
CERTIFICATE = "/etc/gpunode/tls/node.crt"
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")


def rule_files() -> list[Path]:
    return sorted(RULES.glob("*.yml"))


def rules(kind: str) -> list[dict[str, Any]]:
    """Every rule of ``kind`` (alert or record) in monitoring/rules."""
    found = []
    for path in rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            found += [rule for rule in group["rules"] if kind in rule]
    return found


def alert_names() -> set[str]:
    return {rule["alert"] for rule in rules("alert")}


# --- what the product renders ---------------------------------------------------------------


def healthy(profile: str) -> dict[str, Any]:
    state = hardware(profile)
    for gpu in state["gpus"]:
        gpu["persistence_mode"] = "Enabled"  # gpu_settings.persistence_mode's default
    return state


def probe_text(
    state: dict[str, Any], journal: str = "", not_after: int = 400 * 86400, **expected: Any
) -> str:
    node = FakeNode(state, commands={"journalctl": Completed(0, journal, "")})
    report = collect(node, None, "off", None)
    wanted = Expected(**{"persistence_mode": True, **expected})
    certificate = {"path": CERTIFICATE, "not_after_seconds": not_after}
    return render_prometheus(report, wanted, [certificate])


def faulty_h100() -> str:
    """One fault per alert the probe's metrics can raise, on an HGX H100."""
    state = healthy("hgx-h100")
    gpus = state["gpus"]
    gpus[7]["present"] = False  # fallen off the bus
    gpus[1]["persistence_mode"] = "Disabled"
    gpus[2]["nvlinks"][3]["active"] = False
    gpus[3]["remapped_rows"]["failure"] = "Yes"
    gpus[4]["remapped_rows"]["pending"] = "Yes"
    gpus[5]["ecc_errors"]["volatile"]["dram_uncorrectable"] = 1
    gpus[6]["clocks_event_reasons"]["hw_thermal_slowdown"] = True
    gpus[0]["pcie"]["width_current"] = 8
    gpus[2]["nvlinks"][7]["errors"]["replay"] = 5
    gpus[6]["nvlinks"][1]["errors"]["recovery"] = 1
    return probe_text(state, XID_LINE + "\n", not_after=3 * 86400, gpu_count=8, nvlinks_per_gpu=18)


def lost_gpu_h100() -> str:
    """An HGX H100 (driver 590) whose GPU 2 answers "GPU is lost" and whose GPU 5's driver
    asks for a reboot (the lab double's ``lost`` and ``recovery_action``)."""
    state = healthy("hgx-h100")
    state["gpus"][2]["lost"] = True
    state["gpus"][5]["recovery_action"] = "Reboot"
    return probe_text(state, gpu_count=8, nvlinks_per_gpu=18)


def broken_driver() -> str:
    state = healthy("a100")
    state["driver_loaded"] = False
    node = FakeNode(state, commands={"journalctl": Completed(0, "", "")})
    report = collect(node, None, "off", None)
    unreadable = {"path": CERTIFICATE, "not_after_seconds": None, "reason": "no such file"}
    return render_prometheus(report, Expected(gpu_count=8, persistence_mode=True), [unreadable])


def t4(retirement_pending: bool = False) -> str:
    """A real Tesla T4 report (telegraf's capture, tests/fixtures/PROVENANCE.md), with a page
    retirement pending if asked: GPUs before Ampere retire pages instead of remapping rows."""
    xml = (FIXTURES / "nvidia-smi-xml" / "tesla-t4.xml").read_text()
    if retirement_pending:
        xml = xml.replace(
            "<pending_retirement>No</pending_retirement>",
            "<pending_retirement>Yes</pending_retirement>",
        )
    answers = {"nvidia-smi": Completed(0, xml, ""), "journalctl": Completed(0, "", "")}
    report = collect(FakeNode(None, commands=answers), None, "off", None)
    assert report["gpus"][0]["retired_pages"]["pending"] is retirement_pending
    return render_prometheus(report, Expected(gpu_count=1))


def drift_text(drifted: bool = True) -> str:
    finding = Finding("gpu.count", "faulty-h100", Severity.CRITICAL, "8", "7", RUN_DEPLOY)
    return render_drift(
        DriftResult(
            findings=[finding] if drifted else [],
            checked_hosts=["faulty-h100", "healthy-h100"],
            unreachable={"gone": "ConnectError: timed out"} if drifted else {},
        )
    )


def renderings() -> dict[str, tuple[str, str]]:
    """Everything gpunode renders for Prometheus: per instance, before and after its faults
    (the same twice for a healthy node)."""
    h100 = probe_text(healthy("hgx-h100"), gpu_count=8, nvlinks_per_gpu=18)
    a100 = probe_text(healthy("a100"), gpu_count=8)
    a10g = probe_text(healthy("pcie-a10g"))
    return {
        "healthy-h100": (h100, h100),
        "healthy-a100": (a100, a100),
        "healthy-a10g": (a10g, a10g),
        "healthy-t4": (t4(), t4()),
        "faulty-h100": (h100, faulty_h100()),
        "lost-gpu-h100": (h100, lost_gpu_h100()),
        "broken-driver": (a100, broken_driver()),
        "t4-pending": (t4(), t4(retirement_pending=True)),
        "control": (drift_text(drifted=False), drift_text()),
    }


def samples(text: str) -> list[tuple[str, str, str]]:
    found = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            match = SAMPLE.match(line)
            assert match, line
            found.append((match.group(1), match.group(2) or "", match.group(3)))
    return found


def rendered_names() -> set[str]:
    return {
        name for texts in renderings().values() for text in texts for name, _, _ in samples(text)
    }


# --- PromQL names ---------------------------------------------------------------------------

KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
            "group_right", "bool", "offset", "inf", "nan"}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads (not functions, labels or keywords)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings, e.g. regexes with dots
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        if match.group(2) is None and match.group(1).lower() not in KEYWORDS:
            names.add(match.group(1))
    return names


def test_metric_names_reads_promql() -> None:
    expr = (
        'sum by (instance) (rate(a_total{x=~"b.c|d"}[5m])) / on(instance) group_left(z) b '
        "and c_d:e > 0.5 or vector(0) - 14 * 86400"
    )
    assert metric_names(expr) == {"a_total", "b", "c_d:e"}


# --- promtool on the shipped rules ----------------------------------------------------------


def test_the_rules_are_clean_for_promtool() -> None:
    assert rule_files(), "no rule files in monitoring/rules"
    checked = promtool.run("check", "rules", *rule_files())
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "WARNING" not in checked.stdout + checked.stderr


def test_the_rule_unit_tests_pass() -> None:
    tests = sorted(RULE_TESTS.glob("*.test.yml"))
    assert tests
    result = promtool.run("test", "rules", *[test.name for test in tests], cwd=RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_test_that_fires_and_one_that_stays_silent() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for path in RULE_TESTS.glob("*.test.yml"):
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else silent).add(case["alertname"])
    assert alert_names() - firing == set(), "alerts no test makes fire"
    assert alert_names() - silent == set(), "alerts no test shows silent"
    assert (firing | silent) - alert_names() == set(), "tests of alerts that do not exist"


def test_every_recording_rule_has_a_test() -> None:
    tested = set()
    for path in RULE_TESTS.glob("*.test.yml"):
        for test in yaml.safe_load(path.read_text())["tests"]:
            tested |= {case["expr"] for case in test.get("promql_expr_test", [])}
    assert {rule["record"] for rule in rules("record")} <= tested


def test_the_rules_read_only_series_gpunode_renders(node_exporter_metrics: str) -> None:
    known = known_names(node_exporter_metrics)
    for rule in rules("alert") + rules("record"):
        unknown = metric_names(rule["expr"]) - known
        assert not unknown, f"{rule.get('alert') or rule.get('record')} reads {unknown}"


# --- the rules on what the product renders --------------------------------------------------


def input_series(instance: str, before: str, after: str, half: int) -> list[dict[str, str]]:
    """Scrapes of ``instance`` every minute: ``before`` for ``half`` minutes, then ``after``
    for as long again (a series only one of them has is missing in the other half)."""
    values: dict[str, list[str]] = {}
    for position, text in enumerate((before, after)):
        for name, labels, value in samples(text):
            scraped = f'instance="{instance}",job="{JOB}"' + (f",{labels}" if labels else "")
            values.setdefault(f"{name}{{{scraped}}}", ["_", "_"])[position] = value
    return [
        {"series": series, "values": f"{first}x{half - 1} {second}x{half - 1}"}
        for series, (first, second) in values.items()
    ]


def fleet_test(tmp_path: Path, expected: dict[tuple[str, str], int], half: int = 45) -> None:
    """Runs every shipped rule over the fleet's renderings; the alerts firing at the end must
    be exactly ``expected`` ((alert, instance) -> how many)."""
    series = []
    for instance, (before, after) in renderings().items():
        target = f"{instance}:9100"
        series += input_series(target, before, after, half)
        # Prometheus' own `up`, and node_exporter's file time: the probe rewrites the file
        # every minute, the broken node's probe stops at half time.
        up = f'up{{instance="{target}",job="{JOB}"}}'
        series.append({"series": up, "values": f"1x{2 * half}"})
        mtime = (
            f'node_textfile_mtime_seconds{{instance="{target}",job="{JOB}",'
            f'file="{TEXTFILE_DIR}/gpunode_gpu.prom"}}'
        )
        stopped = (half - 1) * 60
        values = (
            f"0+60x{half - 1} {stopped}x{half}"
            if instance == "broken-driver"
            else (f"0+60x{2 * half}")
        )
        series.append({"series": mtime, "values": values})
    dcgm = 'up{instance="faulty-h100:9400",job="gpunode-dcgm-exporter"}'
    series.append({"series": dcgm, "values": f"1x{half - 1} 0x{half}"})
    firing = [
        {"labels": f'{{alertname="{name}",instance="{instance}"}}', "value": count}
        for (name, instance), count in sorted(expected.items())
    ]
    document = {
        "rule_files": [str(path) for path in rule_files()],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "the fleet as rendered",
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": 'count by (alertname, instance) (ALERTS{alertstate="firing"})',
                        "eval_time": f"{2 * half - 3}m",
                        "exp_samples": firing,
                    }
                ],
            }
        ],
    }
    path = tmp_path / "fleet.test.yml"
    path.write_text(yaml.safe_dump(document))
    result = promtool.run("test", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_faults_rendered_by_the_probe_raise_their_alerts_and_healthy_nodes_none(
    tmp_path: Path,
) -> None:
    faulty, broken, control = "faulty-h100:9100", "broken-driver:9100", "control:9100"
    expected = {
        ("GpuMissing", faulty): 1,
        ("GpuXidCritical", faulty): 1,
        ("GpuPersistenceModeOff", faulty): 1,
        ("GpuNvlinkDown", faulty): 1,
        ("GpuNvlinkErrors", faulty): 1,
        ("GpuNvlinkRecoveryErrors", faulty): 1,
        ("GpuRowRemapFailed", faulty): 1,
        ("GpuRowRemapPending", faulty): 1,
        ("GpuUncorrectableEccErrors", faulty): 1,
        ("GpuThermalOrPowerSlowdown", faulty): 1,
        ("GpuPcieLinkDegraded", faulty): 1,
        ("GpunodeCertificateExpiring", faulty): 1,
        ("GpunodeExporterDown", "faulty-h100:9400"): 1,
        ("GpuLost", "lost-gpu-h100:9100"): 1,
        ("GpuRecoveryActionRequired", "lost-gpu-h100:9100"): 1,
        ("GpuRowRemapPending", "t4-pending:9100"): 1,
        ("GpuMissing", broken): 1,
        ("GpuProbeFailing", broken): 1,
        ("GpuMetricsStale", broken): 1,
        ("GpunodeCertificateUnreadable", broken): 1,
        ("GpunodeNodeDrifted", control): 1,
        ("GpunodeDriftCheckUnreachable", control): 1,
    }
    # Every alert gpunode ships is raised by some fault the product renders.
    assert {name for name, _ in expected} == alert_names()
    fleet_test(tmp_path, expected)


# --- node_exporter serves what the probe writes ---------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def node_exporter_metrics(tmp_path: Path) -> Iterator[str]:
    """A real node_exporter's /metrics, with the renderings in its textfile directory."""
    assert Path(NODE_EXPORTER).exists(), (
        "prometheus-node-exporter is not installed (./dev installs it; CI has it)"
    )
    directory = tmp_path / "textfile"
    directory.mkdir()
    (directory / "gpunode_gpu.prom").write_text(faulty_h100())
    (directory / "gpunode_drift.prom").write_text(drift_text())
    port = free_port()
    process = subprocess.Popen(
        [
            NODE_EXPORTER,
            f"--web.listen-address=127.0.0.1:{port}",
            "--collector.disable-defaults",
            "--collector.textfile",
            f"--collector.textfile.directory={directory}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        text = None
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                    text = reply.read().decode()
                break
            except OSError:
                assert process.poll() is None, (
                    process.stderr.read().decode() if process.stderr else ""
                )
                time.sleep(0.1)
        assert text is not None, "node_exporter did not answer"
        yield text
    finally:
        process.terminate()
        process.wait(timeout=10)


def known_names(node_exporter_metrics: str) -> set[str]:
    """Series a rule or panel may read: what gpunode renders, its recording rules, what
    node_exporter serves of its own, and Prometheus' ``up``."""
    served = {name for name, _, _ in samples(node_exporter_metrics)}
    recorded = {rule["record"] for rule in rules("record")}
    return rendered_names() | recorded | served | PROMETHEUS_OWN


def test_node_exporter_reads_the_probe_and_drift_textfiles(node_exporter_metrics: str) -> None:
    text = node_exporter_metrics
    assert re.search(r"^node_textfile_scrape_error 0$", text, re.MULTILINE), text[-2000:]
    assert re.search(r'^node_textfile_mtime_seconds\{file="[^"]*gpunode_gpu\.prom"\}', text, re.M)
    assert re.search(r"^gpunode_gpus 7$", text, re.MULTILINE)
    assert 'gpunode_gpu_xid_events{gpu="1",pci="0000:2a:00",xid="79"} 1' in text
    assert "# TYPE gpunode_gpu_ecc_errors_total counter" in text
    assert re.search(
        r'^gpunode_drift_findings\{host="faulty-h100",severity="critical"\} 1$', text, re.M
    )


# --- the dashboard --------------------------------------------------------------------------


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    found = []
    panels = list(dashboard["panels"])
    while panels:
        panel = panels.pop()
        panels += panel.get("panels", [])
        for target in panel.get("targets", []):
            found.append((panel["title"], target["expr"]))
    return found


def test_the_dashboard_reads_only_series_gpunode_renders(node_exporter_metrics: str) -> None:
    paths = sorted(DASHBOARDS.glob("*.json"))
    assert paths, "no dashboard in monitoring/dashboards"
    known = known_names(node_exporter_metrics)
    for path in paths:
        dashboard = json.loads(path.read_text())
        assert dashboard["uid"] and dashboard["title"]
        ids = [panel["id"] for panel in dashboard["panels"]]
        assert len(ids) == len(set(ids)), "panel ids repeat"
        exprs = dashboard_exprs(dashboard)
        assert exprs, f"{path.name}: no panel queries anything"
        for title, expr in exprs:
            names = metric_names(expr)
            assert names, f"{title}: {expr!r} reads no series"
            assert not names - known, f"{path.name}: {title} reads {names - known}"
        for panel in dashboard["panels"]:
            grid = panel["gridPos"]
            assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        variables = {variable["name"] for variable in dashboard["templating"]["list"]}
        used = set(re.findall(r"\$\{?(\w+)", json.dumps(dashboard)))
        assert used - {"__all"} <= variables, used - variables

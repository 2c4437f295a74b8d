"""The drift check end to end on lab nodes: clean after converge, then exactly the drift we
inject, with the right severity, in every output format; a stopped host gives exit code 2."""

from __future__ import annotations

import base64
import datetime
import json
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from gpunode import pki
from gpunode.expected.packages import TOOLKIT_PACKAGES
from gpunode.model import Tls
from lab import Lab, LabNode

from .conftest import (
    ROOT,
    SSH_COMMAND_COUNTER,
    lab_desired_state,
    run_pyinfra,
    ssh,
    wait_for_ssh,
)

pytestmark = pytest.mark.lab

GPUNODE = str(Path(sys.executable).with_name("gpunode"))


def drift(*args: str) -> tuple[int, str, str]:
    result = subprocess.run(
        [GPUNODE, "drift", "inventories/lab.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return result.returncode, result.stdout, result.stderr


def sudo(lab: Lab, node: LabNode, command: str) -> str:
    result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def converged(lab_nodes: list[LabNode]) -> Iterator[list[LabNode]]:
    assert len(lab_nodes) >= 2
    run = run_pyinfra("deploys/gpu_node.py")
    assert run.returncode == 0, run.output
    yield lab_nodes[:2]
    # Leave the fleet converged for the modules that follow, hardware faults undone too.
    lab = Lab()
    sudo(lab, lab_nodes[0], "gpunode-lab-hw set gpus.7.present true")
    port_index, _ = first_infiniband_port(lab, lab_nodes[1])
    sudo(lab, lab_nodes[1], f"gpunode-lab-hw set ib_ports.{port_index}.state '\"Active\"'")
    restore = run_pyinfra("deploys/gpu_node.py")
    assert restore.returncode == 0, restore.output


def test_converged_fleet_has_no_drift(converged: list[LabNode]) -> None:
    code, out, err = drift("--json")
    report = json.loads(out)
    assert report["findings"] == [], report["findings"]
    assert sorted(report["checked_hosts"]) == sorted(node.name for node in converged)
    assert code == 0, err


def xid_pci(lab: Lab, node: LabNode, gpu: int) -> str:
    """The GPU's PCI address as NVRM's Xid lines name it: 00000000:18:00.0 -> 0000:18:00."""
    bus_id = json.loads(sudo(lab, node, f"gpunode-lab-hw show gpus.{gpu}.pci_bus_id"))
    return bus_id[4:].rsplit(".", 1)[0].lower()


def set_replay_errors(lab: Lab, node: LabNode, gpu: int, link: int, count: int) -> None:
    errors = {"replay": count, "recovery": 0, "crc": 0}
    value = shlex.quote(json.dumps({"active": True, "errors": errors}))
    sudo(lab, node, f"gpunode-lab-hw set gpus.{gpu}.nvlinks.{link} {value}")


def test_health_drill_xid_and_growing_nvlink_errors_reported_then_cleared(
    lab: Lab, converged: list[LabNode], tmp_path: Path
) -> None:
    """Faults a GPU node has, put into the lab's simulated hardware on a converged node: an
    XID in the kernel log (48, an uncorrectable ECC error: critical, reset the GPU) and NVLink
    replay errors that grow between two checks (a warning whose id stays while its count
    grows). The drift check names each with its failure class, severity and remedy in JSON
    and Prometheus; the remedy (a GPU reset, which clears the counters) and a log rotation
    clear them, and the fleet is clean again. No converge: the drill changes no setting."""
    node = converged[0]
    pci = xid_pci(lab, node, 0)
    xid_line = (
        f"NVRM: Xid (PCI:{pci}): 48, pid=4242, name=drill, An uncorrectable double bit error "
        "(DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0."
    )
    prometheus = tmp_path / "gpunode_drift.prom"
    baseline = tmp_path / "baseline.json"
    try:
        sudo(lab, node, f"logger -t kernel {shlex.quote(xid_line)}")
        set_replay_errors(lab, node, gpu=1, link=3, count=12)
        code, out, err = drift(
            "--json", "--prometheus", str(prometheus), "--write-baseline", str(baseline)
        )
        assert code == 1, err
        found = {f["id"]: f for f in json.loads(out)["findings"]}
        assert set(found) == {f"gpu.xid:48:{pci}", "gpu.nvlink_errors:1"}, found
        xid, links = found[f"gpu.xid:48:{pci}"], found["gpu.nvlink_errors:1"]
        assert (xid["host"], xid["severity"]) == (node.name, "critical")
        assert (xid["health"]["failure_class"], xid["health"]["remedy"]) == ("xid", "reset_gpu")
        assert links["severity"] == "warning"
        assert (links["health"]["failure_class"], links["health"]["remedy"]) == (
            "nvlink.errors", "reset_gpu",
        )  # fmt: skip
        assert links["found"] == "12 on 1 link: link 3: replay 12"
        metrics = prometheus.read_text()
        assert (
            f'gpunode_health_finding{{host="{node.name}",id="gpu.nvlink_errors:1",'
            'failure_class="nvlink.errors",severity="warning",remedy="reset_gpu",'
            'confidence="reported"} 1'
        ) in metrics
        assert (
            f'gpunode_drift_finding{{host="{node.name}",id="gpu.xid:48:{pci}",'
            'severity="critical",status="new"} 1'
        ) in metrics

        set_replay_errors(lab, node, gpu=1, link=3, count=40)
        _, out, _ = drift("--json", "--baseline", str(baseline))
        grown = {f["id"]: f for f in json.loads(out)["findings"]}["gpu.nvlink_errors:1"]
        assert (grown["status"], grown["found"]) == ("known", "40 on 1 link: link 3: replay 40")
    finally:
        sudo(lab, node, "nvidia-smi -r -i 1")
        # journald forgets an entry only with its file: rotate, then drop the archived files.
        sudo(lab, node, "journalctl --rotate --vacuum-files=1")
    code, out, err = drift("--json")
    assert json.loads(out)["findings"] == [], out
    assert code == 0, err


def expire_soon(lab: Lab, node: LabNode) -> None:
    """Install a certificate from the lab CA on ``node`` with 5 days left."""
    tls = lab_desired_state().tls
    authority = pki.certificate_authority(tls, create=False)
    assert authority is not None
    public_pem = sudo(lab, node, "openssl pkey -in /etc/gpunode/tls/node.key -pubout")
    public_key = serialization.load_pem_public_key(public_pem.encode())
    wanted = pki.wanted_certificate(node.name, Tls(enabled=True))
    issued_at = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=365 - 5)
    certificate = pki.issue_certificate(authority, public_key, wanted, now=issued_at)  # type: ignore[arg-type]
    pem = base64.b64encode(certificate.public_bytes(serialization.Encoding.PEM)).decode()
    sudo(lab, node, f"echo {pem} | base64 -d > /etc/gpunode/tls/node.crt")


def first_infiniband_port(lab: Lab, node: LabNode) -> tuple[int, str]:
    """(index in the simulator's state, drift subject) of the node's first InfiniBand port."""
    ports = json.loads(sudo(lab, node, "gpunode-lab-hw show ib_ports"))
    index = next(i for i, port in enumerate(ports) if port["link_layer"] == "InfiniBand")
    return index, f"{ports[index]['ca']}/{ports[index]['port']}"


def inject_drift(lab: Lab, first: LabNode, second: LabNode) -> dict[tuple[str, str], str]:
    """Break both nodes in known ways; returns {(host, finding id): severity}."""
    sudo(lab, first, "nvidia-smi -i 2 -pm 0")
    sudo(lab, first, "gpunode-lab-hw set gpus.7.present false")
    ssh_rule = sudo(lab, first, "nft -a list chain inet gpunode input | grep 'tcp dport 22'")
    handle = ssh_rule.split("# handle ")[-1].split()[0]
    sudo(lab, first, f"nft delete rule inet gpunode input handle {handle}")
    # An operator "fixes" something by hand: the Container Toolkit goes back a version.
    downgrade = " ".join(f"{name}=1.17.4-1" for name in TOOLKIT_PACKAGES)
    sudo(
        lab,
        first,
        "DEBIAN_FRONTEND=noninteractive apt-get install -qq -y --allow-downgrades "
        f"--allow-change-held-packages {downgrade} >/dev/null",
    )
    port_index, port = first_infiniband_port(lab, second)
    sudo(lab, second, f"gpunode-lab-hw set ib_ports.{port_index}.state '\"Down\"'")
    expire_soon(lab, second)
    # Last: the reload makes sshd refuse connections for a moment.
    sudo(
        lab,
        second,
        "sed -i 's/^MaxAuthTries 2$/MaxAuthTries 6/' /etc/ssh/sshd_config && systemctl reload ssh",
    )
    wait_for_ssh(lab, second)
    return {
        (first.name, "gpu.persistence:2"): "warning",
        (first.name, "gpu.count"): "critical",
        (first.name, "firewall.rules"): "warning",
        **{(first.name, f"packages.version:{name}"): "critical" for name in TOOLKIT_PACKAGES},
        (second.name, f"ib.port:{port}"): "critical",
        (second.name, "sshd.maxauthtries"): "warning",
        (second.name, "sshd.config"): "warning",
        (second.name, "tls.expiry"): "critical",
    }


@pytest.fixture(scope="module")
def drifted(lab: Lab, converged: list[LabNode]) -> dict[tuple[str, str], str]:
    """The drift of inject_drift, made once for the tests that read it (run alone with -k, each
    finds it there): {(host, finding id): severity}. converge_repairs_... repairs it."""
    return inject_drift(lab, converged[0], converged[1])


def test_injected_drift_is_reported_exactly_in_every_format(
    converged: list[LabNode], drifted: dict[tuple[str, str], str], tmp_path: Path
) -> None:
    expected = drifted
    junit, prometheus = tmp_path / "drift.xml", tmp_path / "textfile" / "gpunode_drift.prom"
    code, out, err = drift("--json", "--junit", str(junit), "--prometheus", str(prometheus))
    assert code == 1, err

    report = json.loads(out)
    found = {(f["host"], f["id"]): f["severity"] for f in report["findings"]}
    assert found == expected
    assert all(f["fix"] for f in report["findings"])

    cases = {
        (suite.get("name"), case.get("name")): case.find("failure").get("type")  # type: ignore[union-attr]
        for suite in ElementTree.parse(junit).getroot().iter("testsuite")
        for case in suite.iter("testcase")
        if case.find("failure") is not None
    }
    assert cases == expected

    metrics = prometheus.read_text()
    for (host, finding_id), severity in expected.items():
        assert (
            f'gpunode_drift_finding{{host="{host}",id="{finding_id}",'
            f'severity="{severity}",status="new"}} 1'
        ) in metrics

    code, table, _ = drift("--limit", converged[1].name)
    assert code == 1
    rows = [line.split()[:4] for line in table.splitlines()[1:-1]]
    assert sorted(row[3] for row in rows) == sorted(
        finding_id for (host, finding_id) in expected if host == converged[1].name
    )
    assert {row[0] for row in rows} == {converged[1].name}


def test_baseline_marks_yesterdays_findings_known(
    converged: list[LabNode], drifted: dict[tuple[str, str], str], tmp_path: Path
) -> None:
    baseline = tmp_path / "baseline.json"
    drift("--json", "--write-baseline", str(baseline))
    sudo_node = converged[0]
    lab = Lab()
    sudo(lab, sudo_node, "nvidia-smi -i 3 -pm 0")
    _, out, _ = drift("--json", "--baseline", str(baseline))
    status = {
        f["id"]: f["status"] for f in json.loads(out)["findings"] if f["host"] == sudo_node.name
    }
    assert status["gpu.persistence:3"] == "new"
    assert status["gpu.persistence:2"] == "known"


def test_unreachable_host_gives_exit_code_1_and_the_others_are_still_checked(
    lab: Lab, converged: list[LabNode], drifted: dict[tuple[str, str], str]
) -> None:
    stopped = converged[1]
    lab.client.containers.get(stopped.container).pause()
    try:
        code, out, _ = drift("--json")
    finally:
        lab.client.containers.get(stopped.container).unpause()
    report: dict[str, Any] = json.loads(out)
    assert code == 1
    assert list(report["unreachable"]) == [stopped.name]
    assert report["checked_hosts"] == [converged[0].name]
    assert any(f["host"] == converged[0].name for f in report["findings"])


def test_converge_repairs_what_it_can_and_the_rest_stays_reported(
    lab: Lab, converged: list[LabNode], drifted: dict[tuple[str, str], str]
) -> None:
    run = run_pyinfra("deploys/gpu_node.py")
    assert run.returncode == 0, run.output
    _, out, _ = drift("--json")
    left = {(f["host"], f["id"]) for f in json.loads(out)["findings"]}
    # Hardware faults are not something a deploy can fix.
    port_index, port = first_infiniband_port(lab, converged[1])
    assert left == {(converged[0].name, "gpu.count"), (converged[1].name, f"ib.port:{port}")}
    sudo(lab, converged[0], "gpunode-lab-hw set gpus.7.present true")
    sudo(lab, converged[1], f"gpunode-lab-hw set ib_ports.{port_index}.state '\"Active\"'")
    # With the GPU back, the CDI spec written without it is stale: a converge refreshes it.
    _, out, _ = drift("--json")
    left = {(f["host"], f["id"]) for f in json.loads(out)["findings"]}
    assert left == {(converged[0].name, "runtime.cdi")}
    assert run_pyinfra("deploys/gpu_node.py").returncode == 0
    code, out, _ = drift("--json")
    assert json.loads(out)["findings"] == []
    assert code == 0


COUNT_SSH_COMMANDS = f"""
from gevent import monkey

monkey.patch_all()  # first, as gpunode drift does: pyinfra's parallel SSH needs it
import json
import sys

from gpunode.cli import load_inventory
from gpunode.drift import run_drift
{SSH_COMMAND_COUNTER}
result = run_drift(load_inventory(sys.argv[1]), sys.argv[1])
print(json.dumps({{"checked": result.checked_hosts, "commands": commands}}))
"""


def test_whole_drift_fact_set_costs_one_ssh_command_per_host(converged: list[LabNode]) -> None:
    # A process of its own: gevent must patch before anything else is imported.
    done = subprocess.run(
        [sys.executable, "-c", COUNT_SSH_COMMANDS, "inventories/lab.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    counted = json.loads(done.stdout.splitlines()[-1])
    assert sorted(counted["checked"]) == sorted(node.name for node in converged)
    assert counted["commands"] == {node.name: 1 for node in converged}


def sudo_log_since(lab: Lab, node: LabNode, since: str) -> list[str]:
    """sudo's journal entries on ``node`` since ``since`` (the node's clock)."""
    shown = ssh(lab, node, f"sudo -n journalctl -q -o cat -t sudo --since {shlex.quote(since)}")
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.splitlines()


def test_the_check_leaves_one_short_line_in_sudos_log_not_its_whole_script(
    lab: Lab, converged: list[LabNode]
) -> None:
    """The ~100 kB fact script goes on stdin (gpunode.remote_script): sudo logs the runner
    and the script's digest, not two hundred pieces of the script."""
    starts = {}
    for node in converged:
        clock = ssh(lab, node, "date '+%Y-%m-%d %H:%M:%S'")
        assert clock.returncode == 0, clock.stderr
        starts[node.name] = clock.stdout.strip()
    code, out, err = drift()
    assert code in (0, 1), out + err  # every host checked (earlier tests may leave drift)
    for node in converged:
        logged = [line for line in sudo_log_since(lab, node, starts[node.name])
                  if "COMMAND=" in line or "command continued" in line]  # fmt: skip
        scripts = [line for line in logged if "gpunode script sha256:" in line]
        assert scripts, (node.name, logged)
        assert not any("command continued" in line for line in logged), (node.name, logged)
        assert all(len(line) < 400 for line in logged), (node.name, logged)


def _without_clock(value: Any) -> Any:
    """A fact value less what depends on when it was read (the XID window's start)."""
    if isinstance(value, dict):
        return {key: _without_clock(item) for key, item in value.items() if key != "since"}
    if isinstance(value, list):
        return [_without_clock(item) for item in value]
    return value


def test_python_parts_read_on_each_node_what_their_shell_commands_read(
    lab: Lab, converged: list[LabNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drift check's Python parts (gpunode.framing: sshd, accounts, TLS, dpkg's
    database, auditd's kernel check, the GPU probe...) run in one python3 process; a node
    without python3 runs their shell commands. On both releases the two give the same fact
    values, section by section."""
    from facts.node import NodeState
    from gpunode import framing

    build = framing.command
    for node in converged:
        values = {}
        for in_python in (True, False):
            monkeypatch.setattr(
                framing,
                "command",
                lambda parts, token=None, python=True, _in=in_python: build(parts, token, _in),
            )
            fact = NodeState()
            script = str(fact.command())
            assert ("python3 -I -S -" in script) is in_python
            ran = ssh(lab, node, "sudo -H -n sh -s", input=script)
            assert ran.returncode == 0, ran.stderr
            values[in_python] = fact.process(ran.stdout.splitlines())
        monkeypatch.setattr(framing, "command", build)
        assert values[True]["complete"] and values[False]["complete"], node.name
        for section in NodeState.FACTS:
            python_value = _without_clock(values[True][section])
            assert python_value == _without_clock(values[False][section]), (node.name, section)
            if isinstance(python_value, dict):
                assert python_value.get("state") != "unreadable", (node.name, section)

"""Hardware facts on lab nodes: the GPU probe, InfiniBand ports, NVMe drives, over real SSH.

Facts are read through pyinfra's API with the connector's ``run_shell_command`` counted, so
each test also proves that a fact costs exactly one SSH command. Drift is injected with
``gpunode-lab-hw``, ``nvidia-smi`` and ``logger`` and undone in ``finally`` blocks; the last
test checks that both nodes' simulated hardware is as it was found.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from pyinfra.api import Config, FactBase, Host, Inventory, State
from pyinfra.api.connect import connect_all, disconnect_all

from facts.hardware import GpuReport, InfinibandPorts, NvmeDevices
from gpunode.probe.gpu_probe import DPKG_PATTERNS
from gpunode.probe.parsers import combined_command, parse_combined
from lab import LOGIN_USER, Lab, LabNode

from .conftest import ssh

pytestmark = pytest.mark.lab

XID_MESSAGE = (
    "NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=probe-test, GPU has fallen off the bus."
)
STAND_IN = "/var/lib/gpunode-lab/installed-driver-version"


@dataclass
class CountedHost:
    """A connected pyinfra host whose SSH commands are counted."""

    node: LabNode
    host: Host
    commands: list[Any] = field(default_factory=list)

    def fact(self, fact: type[FactBase[Any]], **arguments: Any) -> Any:
        """The fact's value; asserts that reading it took exactly one SSH command."""
        self.commands.clear()
        value = self.host.get_fact(fact, **arguments)
        assert len(self.commands) == 1, f"{fact.__name__} took {len(self.commands)} commands"
        return value


@pytest.fixture(scope="module")
def nodes(
    lab: Lab, lab_nodes: list[LabNode], paramiko_kex: None
) -> Iterator[dict[str, CountedHost]]:
    """hgx-h100 and a100 lab nodes, connected once, by profile (through this process's
    paramiko, which must reach a hardened trixie node: ``paramiko_kex``)."""
    wanted = {node.profile: node for node in lab_nodes if node.profile in ("hgx-h100", "a100")}
    assert set(wanted) == {"hgx-h100", "a100"}, "the lab needs an hgx-h100 and an a100 node"
    connection = {
        "ssh_user": LOGIN_USER,
        "ssh_key": str(lab.key_path),
        "ssh_known_hosts_file": str(lab.known_hosts_path),
        "ssh_strict_host_key_checking": "yes",
        "_sudo": True,
    }
    inventory = Inventory(
        (
            [(node.name, {**connection, "ssh_hostname": node.address}) for node in wanted.values()],
            {},
        )
    )
    state = State(inventory, Config())
    connect_all(state)
    # A node that refused the connection fails here, named, not later as a fact of None.
    unreached = [
        node.name for node in wanted.values() if not inventory.get_host(node.name).connected
    ]
    assert unreached == [], f"pyinfra could not connect to {unreached}"
    counted = {}
    for profile, node in wanted.items():
        host = inventory.get_host(node.name)
        entry = CountedHost(node, host)
        run = host.connector.run_shell_command

        def counting(
            command: Any, *args: Any, _entry: CountedHost = entry, _run: Any = run, **kwargs: Any
        ) -> Any:
            _entry.commands.append(command)
            return _run(command, *args, **kwargs)

        host.connector.run_shell_command = counting  # type: ignore[method-assign]
        counted[profile] = entry
    yield counted
    disconnect_all(state)


@pytest.fixture(scope="module")
def h100(nodes: dict[str, CountedHost]) -> CountedHost:
    return nodes["hgx-h100"]


@pytest.fixture(scope="module")
def hardware_before(lab: Lab, nodes: dict[str, CountedHost]) -> dict[str, Any]:
    """Each node's simulated hardware and driver stand-in before these tests touch them."""
    return {profile: node_snapshot(lab, entry.node) for profile, entry in nodes.items()}


def node_snapshot(lab: Lab, node: LabNode) -> dict[str, Any]:
    stand_in = ssh(lab, node, f"cat {STAND_IN}")
    # The driver's packages as dpkg lists them (none on a fresh lab), which the probe reads.
    packages = ssh(
        lab,
        node,
        "dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n' "
        f"{' '.join(shlex.quote(pattern) for pattern in DPKG_PATTERNS)} 2>/dev/null "
        "| awk '$1 ~ /^.i/' | sort",
    )
    return {
        "hardware": hardware(lab, node),
        "stand_in": stand_in.stdout if stand_in.returncode == 0 else None,
        "driver_packages": packages.stdout,
    }


def hardware(lab: Lab, node: LabNode, path: str = "") -> Any:
    shown = ssh(lab, node, f"sudo gpunode-lab-hw show {path}".strip())
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def sudo(lab: Lab, node: LabNode, command: str) -> str:
    done = ssh(lab, node, f"sudo {command}")
    assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
    return done.stdout


# A package dpkg lists among the driver's (DPKG_PATTERNS), for a node with none.
PLACEHOLDER_PACKAGE = "libnvidia-ml1"


def install_placeholder_driver_package(lab: Lab, node: LabNode, version: str) -> None:
    """An empty ``libnvidia-ml1`` at ``version``, installed with dpkg: on a node without any
    driver package (a fresh lab), what the probe reads as the installed driver."""
    control = (
        f"Package: {PLACEHOLDER_PACKAGE}\nVersion: {version}-1\nArchitecture: all\n"
        "Maintainer: gpunode lab <lab@example.invalid>\n"
        "Description: placeholder of test_hardware_facts\n"
    )
    script = (
        "d=$(mktemp -d) && mkdir $d/pkg $d/pkg/DEBIAN && "
        f"printf {shlex.quote(control)} > $d/pkg/DEBIAN/control && "
        "dpkg-deb --build $d/pkg $d/placeholder.deb >/dev/null && "
        "dpkg -i $d/placeholder.deb >/dev/null; status=$?; rm -rf $d; exit $status"
    )
    sudo(lab, node, f"sh -c {shlex.quote(script)}")


def set_hardware(lab: Lab, node: LabNode, path: str, value: Any) -> None:
    sudo(lab, node, f"gpunode-lab-hw set {path} '{json.dumps(value)}'")


@pytest.mark.usefixtures("hardware_before")
def test_gpu_report_of_an_hgx_h100(lab: Lab, h100: CountedHost) -> None:
    report = h100.fact(GpuReport)
    simulated = hardware(lab, h100.node)
    assert (report["state"], report["source"], report["gpu_count"]) == ("ok", "nvidia-smi", 8)
    # The loaded driver is the simulator's: the factory one, or what a converge installed.
    assert report["driver_version"] == simulated["driver_version"]
    assert report["cuda_driver_version"] == simulated["cuda_version"]
    assert [gpu["uuid"] for gpu in report["gpus"]] == [gpu["uuid"] for gpu in simulated["gpus"]]
    assert {gpu["name"] for gpu in report["gpus"]} == {"NVIDIA H100 80GB HBM3"}
    for gpu in report["gpus"]:
        assert (gpu["nvlink"]["state"], gpu["nvlink"]["active"], gpu["nvlink"]["total"]) == (
            "ok",
            18,
            18,
        )
        assert gpu["pcie"] == {"gen_current": 5, "gen_max": 5, "width_current": 16, "width_max": 16}
        assert gpu["fabric"] == {"state": "Completed", "status": "Success"}
    # The lab's nodes have no libnvidia-ml.so.1 and no /proc/driver/nvidia: said, not guessed.
    # pynvml's own words where the fact shipped it; the probe's where the node's installed
    # copy (roles/gpu_metrics) finds the library missing before it imports pynvml.
    reason = report["nvml"]["reason"]
    assert reason == "NVML Shared Library Not Found" or reason.startswith(
        "libnvidia-ml.so.1 cannot be loaded ("
    ), reason
    assert report["kernel_module"]["state"] == "unknown"
    is_active = ssh(lab, h100.node, "systemctl is-active nvidia-fabricmanager").stdout.strip()
    assert report["fabric_manager"]["active_state"] == is_active


def test_gpu_report_of_an_a100_reads_the_driver_535_schema(
    lab: Lab, nodes: dict[str, CountedHost]
) -> None:
    report = nodes["a100"].fact(GpuReport)
    loaded = hardware(lab, nodes["a100"].node, "driver_version")
    assert (report["state"], report["gpu_count"], report["driver_version"]) == ("ok", 8, loaded)
    assert {gpu["name"] for gpu in report["gpus"]} == {"NVIDIA A100-SXM4-80GB"}
    assert {(gpu["nvlink"]["active"], gpu["nvlink"]["total"]) for gpu in report["gpus"]} == {
        (12, 12)
    }


def test_gpu_that_fell_off_the_bus_is_missing(lab: Lab, h100: CountedHost) -> None:
    lost = hardware(lab, h100.node, "gpus.3.uuid")
    set_hardware(lab, h100.node, "gpus.3.present", False)
    try:
        report = h100.fact(GpuReport)
        assert (report["gpu_count"], report["attached_gpus"]) == (7, 7)
        assert lost not in {gpu["uuid"] for gpu in report["gpus"]}
        assert [gpu["nvlink"]["active"] for gpu in report["gpus"]] == [18] * 7
    finally:
        set_hardware(lab, h100.node, "gpus.3.present", True)
    assert h100.fact(GpuReport)["gpu_count"] == 8


def test_persistence_mode_change_is_reported(lab: Lab, h100: CountedHost) -> None:
    before = [gpu["persistence_mode"] for gpu in h100.fact(GpuReport)["gpus"]]
    sudo(lab, h100.node, "nvidia-smi -pm 1")
    try:
        assert [gpu["persistence_mode"] for gpu in h100.fact(GpuReport)["gpus"]] == [True] * 8
    finally:
        disabled = [str(index) for index, enabled in enumerate(before) if not enabled]
        if disabled:
            sudo(lab, h100.node, f"nvidia-smi -i {','.join(disabled)} -pm 0")
    assert [gpu["persistence_mode"] for gpu in h100.fact(GpuReport)["gpus"]] == before


def test_injected_xid_is_reported_with_its_gpu(lab: Lab, h100: CountedHost) -> None:
    since = ssh(lab, h100.node, "date -u +%Y-%m-%dT%H:%M:%SZ").stdout.strip()
    sudo(lab, h100.node, f"logger -t kernel '{XID_MESSAGE}'")
    try:
        xids = h100.fact(GpuReport, xid_since=since)["xid_events"]
        assert xids["state"] == "ok"
        (event,) = xids["events"]
        assert (event["xid"], event["pci"], event["gpu_index"]) == (79, "0000:18:00", 0)
        assert (event["pid"], event["message"]) == ("4242", "GPU has fallen off the bus.")
    finally:
        # journald forgets an entry only with its file: rotate, then drop the archived files.
        sudo(lab, h100.node, "journalctl --rotate --vacuum-files=1")
    assert h100.fact(GpuReport, xid_since=since)["xid_events"]["events"] == []


def test_installed_driver_that_differs_from_the_running_one(lab: Lab, h100: CountedHost) -> None:
    loaded = hardware(lab, h100.node, "driver_version")
    # A converged node has the driver's packages at the loaded version; a fresh one has none.
    placeholder = h100.fact(GpuReport)["driver_versions"]["installed_packages"] == {}
    try:
        if placeholder:
            install_placeholder_driver_package(lab, h100.node, loaded)
        versions = h100.fact(GpuReport)["driver_versions"]
        installed = versions["installed_package"]
        assert (versions["userspace"], installed, versions["mismatch"]) == (loaded, loaded, False)
        # The module in memory is another version than the one installed.
        set_hardware(lab, h100.node, "driver_version", "580.95.05")
        versions = h100.fact(GpuReport)["driver_versions"]
        assert (versions["userspace"], versions["installed_package"]) == ("580.95.05", installed)
        assert versions["mismatch"] is True
    finally:
        set_hardware(lab, h100.node, "driver_version", loaded)
        if placeholder:
            sudo(lab, h100.node, f"dpkg --purge {PLACEHOLDER_PACKAGE}")


def test_driver_not_loaded(lab: Lab, h100: CountedHost) -> None:
    set_hardware(lab, h100.node, "driver_loaded", False)
    try:
        report = h100.fact(GpuReport)
        assert (report["state"], report["gpus"]) == ("driver_not_loaded", [])
        assert report["kernel_module"]["state"] == "not_loaded"
    finally:
        set_hardware(lab, h100.node, "driver_loaded", True)


def test_infiniband_ports_and_a_port_set_down(lab: Lab, h100: CountedHost) -> None:
    ports = h100.fact(InfinibandPorts)["ports"]
    assert len(ports) == 12
    infiniband = [port for port in ports if port["link_layer"] == "InfiniBand"]
    assert len(infiniband) == 8
    assert {(port["ca_type"], port["rate"], port["state"]) for port in infiniband} == {
        ("MT4129", 400, "Active")
    }
    first = hardware(lab, h100.node, "ib_ports.0")
    set_hardware(lab, h100.node, "ib_ports.0.state", "Down")
    try:
        ports = h100.fact(InfinibandPorts)["ports"]
        down = [(port["ca"], port["port"]) for port in ports if port["state"] == "Down"]
        assert down == [(first["ca"], first["port"])]
    finally:
        set_hardware(lab, h100.node, "ib_ports.0.state", first["state"])


def test_nvme_drives_and_one_gone(lab: Lab, h100: CountedHost) -> None:
    devices = h100.fact(NvmeDevices)["devices"]
    assert len(devices) == 8
    assert {device["model"] for device in devices} == {"SAMSUNG MZWLJ3T8HBLS-00007"}
    set_hardware(lab, h100.node, "nvme.2.present", False)
    try:
        assert "/dev/nvme2n1" not in {d["device_path"] for d in h100.fact(NvmeDevices)["devices"]}
    finally:
        set_hardware(lab, h100.node, "nvme.2.present", True)


def all_sections(entry: CountedHost) -> dict[str, Any]:
    entry.commands.clear()
    status, output = entry.host.run_shell_command(combined_command(), _sudo=True)
    assert status and len(entry.commands) == 1
    return parse_combined(output.stdout_lines)


def test_every_section_in_one_ssh_command(lab: Lab, h100: CountedHost) -> None:
    before = all_sections(h100)
    assert {name: result["state"] for name, result in before.items()} == {
        "gpu": "ok",
        "nvidia_smi_xml": "ok",
        "nvlink": "ok",
        # The lab's nvidia-smi does not simulate -d; the section says so instead of guessing.
        "page_retirement": "unreadable",
        "xid": "ok",
        "ib_flaps": "ok",
        "ibstat": "ok",
        # A lab container's /sys has no InfiniBand counters to read: none is an answer.
        "ib_counters": "ok",
        "nvme": "ok",
    }
    assert before["ib_counters"]["ports"] == []
    assert "exit code 2" in before["page_retirement"]["reason"]
    assert len(before["nvidia_smi_xml"]["gpus"]) == len(before["gpu"]["gpus"]) == 8
    assert [gpu["active"] for gpu in before["nvlink"]["gpus"]] == [18] * 8
    sudo(lab, h100.node, "logger -t systemd-networkd 'ib3: Lost carrier'")
    try:
        after = all_sections(h100)
        flaps_before = before["ib_flaps"]["flaps"].get("ib3", 0)
        assert after["ib_flaps"]["flaps"]["ib3"] == flaps_before + 1
    finally:
        sudo(lab, h100.node, "journalctl --rotate --vacuum-files=1")


def test_nodes_are_left_as_found(
    lab: Lab, nodes: dict[str, CountedHost], hardware_before: dict[str, Any]
) -> None:
    for profile, entry in nodes.items():
        assert node_snapshot(lab, entry.node) == hardware_before[profile]

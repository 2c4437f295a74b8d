"""Every drift/health rule: a healthy node passes, each fault gives exactly its finding."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest

from gpunode import framing
from gpunode.distributions import BY_CODENAME
from gpunode.drift.findings import Severity
from gpunode.drift.rules import evaluate
from gpunode.expected.auditd import WATCHES as AUDIT_WATCHES
from gpunode.expected.firewall import render_ruleset
from gpunode.expected.packages import driver_packages_for
from gpunode.expected.sshd import expected_effective, render_sshd_config
from gpunode.model import DesiredState, build_desired_state
from gpunode.probe.gpu_probe import SCHEMA
from gpunode.probe.parsers import parse_section


def framed_output(lines: list[str]) -> list[str]:
    """What a section command prints when its tool printed ``lines`` and exited 0."""
    return framing.output_of({"tool": framing.PartOutput("tool", list(lines), [], 0)})


DATA = {
    "expected_hardware": {
        "gpu_model": "NVIDIA H100 80GB HBM3",
        "gpu_count": 2,
        "nvswitch": True,
        "nvlink_links_per_gpu": 18,
        "ib_port_count": 2,
        "ib_rate_gbps": 400,
        "nvme_count": 2,
    },
    "gpu_settings": {"persistence_mode": True, "ecc": True},
    "nvidia_driver": {
        "source": "nvidia",
        "branch": "580",
        "version": "580.95.05-1",
        "stack": "full",
    },
    "firewall": {"enabled": True},
    "tls": {"enabled": True},
    "container_runtime": {"engines": ["docker"]},
    "nccl": {"env": {"NCCL_SOCKET_IFNAME": "^docker,lo", "NCCL_DEBUG": "WARN"}},
    "nvme_cache": {"enabled": True, "devices": ["/dev/nvme0n1", "/dev/nvme1n1"]},
}
NCCL_ENV = {"NCCL_SOCKET_IFNAME": "^docker,lo", "NCCL_DEBUG": "WARN"}


def desired(data: dict[str, Any] | None = None) -> DesiredState:
    state, problems = build_desired_state(DATA if data is None else data)
    assert problems == []
    return state


def healthy_gpu(index: int) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"GPU-{index}",
        "name": "NVIDIA H100 80GB HBM3",
        "persistence_mode": True,
        "ecc_mode": {"current": True, "pending": True},
        "ecc_errors": {"volatile": {"corrected": 3, "uncorrected": 0}},
        "remapped_rows": {"pending": False, "failure": False},
        "retired_pages": {"single_bit": None, "double_bit": None, "pending": None},
        "nvlink": {"state": "ok", "active": 18, "total": 18},
        "clock_event_reasons": ["gpu_idle"],
        "pcie": {"gen_current": 2, "gen_max": 5, "width_current": 16, "width_max": 16},
    }


BOOKWORM = BY_CODENAME["bookworm"]
# The NodeOs fact of a Debian 12 node (facts/node.py).
BOOKWORM_OS = {
    "os_release": {"ID": "debian", "VERSION_ID": "12", "VERSION_CODENAME": "bookworm"},
    "architecture": "amd64",
    "problems": [],
}


def healthy_facts() -> dict[str, Any]:
    wanted = desired()
    sshd_effective = {
        key: [value] for key, value in expected_effective(wanted.sshd, BOOKWORM).items()
    }
    return {
        "complete": True,
        "os": BOOKWORM_OS,
        "gpu": {
            "state": "ok",
            "driver_version": "580.95.05",
            "driver_versions": {"mismatch": False, "installed_package": "580.95.05"},
            "fabric_manager": {"state": "active"},
            "xid_events": {"state": "ok", "events": []},
            "gpus": [healthy_gpu(0), healthy_gpu(1)],
            "problems": {"nvlink": []},
        },
        "infiniband": {
            "state": "ok",
            "ports": [
                {
                    "ca": f"mlx5_{i}",
                    "port": 1,
                    "state": "Active",
                    "physical_state": "LinkUp",
                    "rate": 400,
                    "link_layer": "InfiniBand",
                }
                for i in range(2)
            ]
            + [
                {
                    "ca": "mlx5_9",
                    "port": 1,
                    "state": "Down",
                    "physical_state": "Disabled",
                    "rate": 10,
                    "link_layer": "Ethernet",
                }
            ],
            "problems": [],
        },
        "nvme": {"state": "ok", "devices": [{"serial": "a"}, {"serial": "b"}]},
        "sshd": {
            "effective": sshd_effective,
            "config_sha1": hashlib.sha1(
                render_sshd_config(wanted.sshd, BOOKWORM).encode()
            ).hexdigest(),
        },
        "firewall": {
            "live": "table inet gpunode {}",
            "file_loads": "table inet gpunode {}",
            "file_sha256": hashlib.sha256(
                render_ruleset(wanted.firewall, wanted.sshd.port, wanted.exporter_ports).encode()
            ).hexdigest(),
            "unit_enabled": True,
        },
        "tls": {"state": "present", "key": "matches", "days_to_expiry": 200},
        "container_runtime": {
            "docker": {"present": True, "error": None, "nvidia_runtime": True},
            "cdi_spec": {"present": True, "uuids": ["GPU-0", "GPU-1"]},
        },
        "packages": {
            "packages": {name: "580.95.05-1" for name in DRIVER_PACKAGES + FABRIC_MANAGER},
            "held": sorted(DRIVER_PACKAGES + FABRIC_MANAGER),
        },
        "nccl": {"conf": dict(NCCL_ENV), "profile": dict(NCCL_ENV)},
        "mounts": {
            "/": {"source": "/dev/sda2", "fstype": "ext4", "options": ["rw", "relatime"]},
            "/raid": {"source": "/dev/md127", "fstype": "xfs", "options": ["rw", "noatime"]},
        },
        # auditd is on by the model's default: running on a real kernel, every watch loaded.
        "auditd": {
            "state": "ok",
            "kernel_allows": True,
            "installed": True,
            "active": True,
            "rules_loaded": True,
            "watches": [{"path": path, "key": key} for path, key in AUDIT_WATCHES],
            "problems": [],
        },
    }


# An NVSwitch node on branch 580: Fabric Manager's unsuffixed packages at the driver's version
# (NVIDIA's CUDA repository, debian12 Packages index; see gpunode/nvidia_releases.py).
FABRIC_MANAGER = ("nvidia-fabricmanager", "libnvidia-nscq")
DRIVER_PACKAGES = driver_packages_for(
    desired().nvidia_driver, desired().nvidia_driver.version
).versioned


def findings(facts: dict[str, Any], state: DesiredState | None = None) -> dict[str, Severity]:
    return {f.id: f.severity for f in evaluate("node-1", state or desired(), facts)}


def test_healthy_node_has_no_findings() -> None:
    assert findings(healthy_facts()) == {}


Mutation = Callable[[dict[str, Any]], None]


def set_path(path: str, value: Any) -> Mutation:
    def mutate(facts: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = facts
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return mutate


FAULTS = [
    pytest.param(set_path("gpu.gpus", [healthy_gpu(0)]), {"gpu.count": Severity.CRITICAL},
                 id="gpu-fell-off-the-bus"),
    pytest.param(set_path("gpu.gpus.1.name", "NVIDIA A100-SXM4-80GB"),
                 {"gpu.model:1": Severity.CRITICAL}, id="wrong-gpu-model"),
    pytest.param(set_path("gpu", {"state": "driver_not_loaded", "reason": "exit 9"}),
                 {"gpu.driver_loaded": Severity.CRITICAL}, id="driver-not-loaded"),
    pytest.param(set_path("gpu.driver_version", "580.82.07"),
                 {"driver.version": Severity.CRITICAL, "node.reboot_required": Severity.WARNING},
                 id="driver-upgraded-by-hand-not-loaded"),
    pytest.param(set_path("gpu.driver_versions.mismatch", True),
                 {"driver.mismatch": Severity.CRITICAL}, id="userspace-kernel-mismatch"),
    pytest.param(set_path("gpu.fabric_manager.state", "failed"),
                 {"fabric_manager": Severity.CRITICAL}, id="fabric-manager-down"),
    pytest.param(set_path("gpu.xid_events.events", [{"xid": 79, "pci": "0000:18:00"}]),
                 {"gpu.xid:79:0000:18:00": Severity.CRITICAL}, id="critical-xid"),
    pytest.param(set_path("gpu.xid_events.events", [{"xid": 13, "pci": "0000:18:00"}]),
                 {"gpu.xid:13:0000:18:00": Severity.WARNING}, id="application-xid"),
    pytest.param(set_path("gpu.gpus.0.persistence_mode", False),
                 {"gpu.persistence:0": Severity.WARNING}, id="persistence-off"),
    pytest.param(set_path("gpu.gpus.0.ecc_mode", {"current": False, "pending": False}),
                 {"gpu.ecc:0": Severity.WARNING}, id="ecc-off"),
    pytest.param(set_path("gpu.gpus.0.ecc_mode", {"current": False, "pending": True}),
                 {"gpu.ecc:0": Severity.INFO}, id="ecc-pending-reset"),
    pytest.param(set_path("gpu.gpus.0.ecc_errors.volatile.uncorrected", 2),
                 {"gpu.ecc_uncorrectable:0": Severity.CRITICAL}, id="uncorrectable-ecc"),
    pytest.param(set_path("gpu.gpus.0.remapped_rows.pending", True),
                 {"gpu.row_remap_pending:0": Severity.WARNING}, id="row-remap-pending"),
    pytest.param(set_path("gpu.gpus.0.remapped_rows.failure", True),
                 {"gpu.row_remap_failure:0": Severity.CRITICAL}, id="row-remap-failed"),
    pytest.param(set_path("gpu.gpus.0.retired_pages", {"pending": True, "single_bit": 1}),
                 {"gpu.page_retirement_pending:0": Severity.WARNING,
                  "gpu.retired_pages:0": Severity.INFO}, id="retired-pages"),
    pytest.param(set_path("gpu.gpus.1.nvlink", {"state": "ok", "active": 17, "total": 18}),
                 {"gpu.nvlink:1": Severity.CRITICAL}, id="nvlink-down"),
    pytest.param(set_path("gpu.gpus.1.nvlink", {"state": "all_inactive", "active": 0}),
                 {"gpu.nvlink:1": Severity.CRITICAL}, id="nvlink-all-inactive"),
    pytest.param(set_path("gpu.gpus.1.nvlink", {"state": "mig_mode", "active": 0, "total": None}),
                 {"gpu.nvlink:1": Severity.WARNING}, id="nvlink-hidden-in-mig-mode"),
    pytest.param(set_path("gpu.gpus.0.clock_event_reasons", ["hw_thermal_slowdown"]),
                 {"gpu.throttle:0:hw_thermal_slowdown": Severity.WARNING}, id="thermal-throttle"),
    pytest.param(set_path("gpu.gpus.0.pcie.width_current", 8),
                 {"gpu.pcie_width:0": Severity.WARNING}, id="pcie-width-below-max"),
    pytest.param(set_path("infiniband.ports.1.state", "Down"),
                 {"ib.port:mlx5_1/1": Severity.CRITICAL}, id="ib-port-down"),
    pytest.param(set_path("infiniband.ports.0.rate", 200),
                 {"ib.rate:mlx5_0/1": Severity.WARNING}, id="ib-half-rate"),
    pytest.param(set_path("infiniband.problems", ["line 9 not understood: '\\tPort 1 :'"]),
                 {"ib.unread_line": Severity.WARNING}, id="ibstat-line-not-read"),
    pytest.param(set_path("infiniband.ports.1", {"ca": "mlx5_1", "port": 1, "rate": 400,
                                                 "link_layer": "InfiniBand"}),
                 {"ib.port:mlx5_1/1": Severity.WARNING}, id="ib-port-state-not-read"),
    pytest.param(set_path("gpu.problems.nvlink", ["line 1 comes before any GPU: 'x'"]),
                 {"nvlink.unread_line": Severity.WARNING}, id="nvlink-line-not-read"),
    pytest.param(set_path("nvme.devices", [{"serial": "a"}]),
                 {"nvme.count": Severity.CRITICAL}, id="nvme-missing"),
    pytest.param(set_path("sshd.effective.passwordauthentication", ["yes"]),
                 {"sshd.passwordauthentication": Severity.WARNING}, id="sshd-edited"),
    pytest.param(set_path("sshd.config_sha1", "0" * 40),
                 {"sshd.config": Severity.WARNING}, id="sshd-config-file-edited"),
    pytest.param(set_path("firewall.live", "table inet gpunode { chain input {} }"),
                 {"firewall.rules": Severity.WARNING}, id="firewall-rule-deleted"),
    pytest.param(set_path("firewall.live", None),
                 {"firewall.table": Severity.CRITICAL}, id="firewall-table-gone"),
    pytest.param(set_path("tls.days_to_expiry", 20),
                 {"tls.expiry": Severity.WARNING}, id="certificate-near-expiry"),
    pytest.param(set_path("tls.days_to_expiry", 3),
                 {"tls.expiry": Severity.CRITICAL}, id="certificate-about-to-expire"),
    pytest.param(set_path("packages.packages.nvidia-open", "580.82.07-1"),
                 {"packages.version:nvidia-open": Severity.CRITICAL}, id="package-changed-by-hand"),
    pytest.param(set_path("packages.held", ["nvidia-driver"]),
                 {f"packages.hold:{name}": Severity.WARNING
                  for name in ("nvidia-open", "nvidia-kernel-open-dkms", "nvidia-driver-cuda",
                               "nvidia-fabricmanager", "libnvidia-nscq")},
                 id="packages-unheld"),
    pytest.param(set_path("packages.packages.nvidia-fabricmanager", "580.82.07-1"),
                 {"packages.version:nvidia-fabricmanager": Severity.CRITICAL},
                 id="fabric-manager-changed-by-hand"),
    pytest.param(set_path("packages.held", sorted((*DRIVER_PACKAGES, "nvidia-fabricmanager"))),
                 {"packages.hold:libnvidia-nscq": Severity.WARNING}, id="nscq-unheld"),
    pytest.param(set_path("container_runtime.docker.nvidia_runtime", False),
                 {"runtime.docker": Severity.WARNING}, id="docker-lost-nvidia-runtime"),
    pytest.param(set_path("container_runtime.cdi_spec.uuids", ["GPU-0", "GPU-7"]),
                 {"runtime.cdi": Severity.WARNING}, id="cdi-spec-stale"),
    pytest.param(set_path("tls.key", "mismatch"),
                 {"tls.key": Severity.CRITICAL}, id="certificate-key-mismatch"),
    pytest.param(set_path("nccl.conf.NCCL_DEBUG", "INFO"),
                 {"nccl.conf:NCCL_DEBUG": Severity.WARNING}, id="nccl-conf-edited"),
    pytest.param(set_path("nccl.profile.NCCL_IB_HCA", "mlx5_0"),
                 {"nccl.profile:NCCL_IB_HCA": Severity.WARNING}, id="nccl-setting-added"),
    pytest.param(set_path("nccl.conf", None),
                 {"nccl.conf": Severity.WARNING}, id="nccl-conf-deleted"),
    pytest.param(set_path("nccl.profile", {"NCCL_DEBUG": "WARN"}),
                 {"nccl.profile:NCCL_SOCKET_IFNAME": Severity.WARNING},
                 id="nccl-setting-removed"),
    pytest.param(set_path("mounts", {"/": {"source": "/dev/sda2", "fstype": "ext4"}}),
                 {"nvme_cache.mount": Severity.CRITICAL}, id="cache-not-mounted"),
    pytest.param(set_path("mounts./raid.options", ["ro", "noatime"]),
                 {"nvme_cache.read_only": Severity.CRITICAL}, id="cache-read-only"),
    pytest.param(set_path("mounts./raid.options", ["rw", "relatime"]),
                 {"nvme_cache.options": Severity.WARNING}, id="cache-without-noatime"),
    pytest.param(set_path("mounts./raid.fstype", "ext4"),
                 {"nvme_cache.filesystem": Severity.WARNING}, id="cache-other-filesystem"),
]  # fmt: skip


@pytest.mark.parametrize(("mutate", "expected"), FAULTS)
def test_each_fault_gives_exactly_its_findings(
    mutate: Mutation, expected: dict[str, Severity]
) -> None:
    facts = copy.deepcopy(healthy_facts())
    mutate(facts)
    assert findings(facts) == expected


def test_unreadable_sections_are_findings_not_silence() -> None:
    facts = healthy_facts()
    facts["infiniband"] = {"state": "unreadable", "reason": "ibstat: truncated"}
    facts["gpu"] = {"state": "unreadable", "reason": "nvidia-smi -q -x: not XML"}
    facts["nccl"] = {"state": "unreadable", "reason": "nccl: no output"}
    facts["mounts"] = {"state": "unreadable", "reason": "mounts: no output"}
    assert findings(facts) == {
        "gpu.unreadable": Severity.WARNING,
        "ib.unreadable": Severity.WARNING,
        "nccl.unreadable": Severity.WARNING,
        "mounts.unreadable": Severity.WARNING,
    }


def test_nothing_expected_means_nothing_checked() -> None:
    facts = healthy_facts()
    facts["infiniband"] = {"state": "absent"}
    facts["nvme"] = {"state": "absent"}
    facts["gpu"] = {"state": "absent"}
    # Defaults: no firewall wanted, so a live table is only worth knowing about.
    assert findings(facts, desired({})) == {"firewall.table": Severity.INFO}


# --- lines a parser could not read -----------------------------------------------------------


def test_an_unread_ibstat_line_is_a_finding_naming_it_and_the_ports_are_still_checked() -> None:
    text = (
        "CA 'mlx5_0'\n\tCA type: MT4129\n\tNumber of ports: 1\n\tFirmware version: 28.39.1002\n"
        "\tPort 1:\n\t\tState: Active\n\t\tPhysical state: LinkUp\n\t\tRate: 400\n"
        "\t\tLink layer: InfiniBand\n\t\t\tFEC mode: RS-FEC (544,514)\n"
        "CA 'mlx5_1'\n\tCA type: MT4129\n\tNumber of ports: 1\n\tFirmware version: 28.39.1002\n"
        "\tPort 1:\n\t\tState: Down\n\t\tPhysical state: Polling\n\t\tRate: 10\n"
        "\t\tLink layer: InfiniBand\n"
    )
    facts = healthy_facts()
    facts["infiniband"] = parse_section("ibstat", framed_output(text.splitlines()))
    found = {f.id: f for f in evaluate("node-1", desired(), facts)}
    assert {key: f.severity for key, f in found.items()} == {
        "ib.unread_line": Severity.WARNING,
        "ib.port:mlx5_1/1": Severity.CRITICAL,  # the readable port is still judged
    }
    unread = found["ib.unread_line"]
    assert (
        unread.found == "1 not read: line 10 not understood: '\\t\\t\\tFEC mode: RS-FEC (544,514)'"
    )
    assert unread.expected == "every line of ibstat read"


def test_the_unread_lines_shown_are_capped_and_counted() -> None:
    from gpunode.drift.rules import MAX_UNREAD_LINES_SHOWN

    facts = healthy_facts()
    lines = [f"line {n} not understood: 'x{n}'" for n in range(1, 9)]
    facts["gpu"]["problems"] = {"nvlink": lines}
    (finding,) = evaluate("node-1", desired(), facts)
    assert finding.id == "nvlink.unread_line"
    shown = lines[:MAX_UNREAD_LINES_SHOWN]
    assert finding.found == f"8 not read: {'; '.join(shown)} (and 3 more)"
    assert "'x6'" not in finding.found


def test_unread_nvlink_lines_from_the_probe_reach_the_report() -> None:
    facts = healthy_facts()
    report = {"schema": SCHEMA, "kernel_module": {"state": "loaded"}, **facts["gpu"]}
    report["problems"] = {"nvlink": ["line 1 comes before any GPU: 'WARNING: infoROM'"]}
    facts["gpu"] = parse_section("gpu", framed_output([json.dumps(report)]))
    found = {f.id: f for f in evaluate("node-1", desired(), facts)}
    assert set(found) == {"nvlink.unread_line"}
    assert "line 1 comes before any GPU: 'WARNING: infoROM'" in found["nvlink.unread_line"].found


def test_a_toolkit_that_keeps_its_own_cdi_spec_is_checked_there() -> None:
    facts = copy.deepcopy(healthy_facts())
    runtime = facts["container_runtime"]
    runtime["nvidia_ctk_version"] = "1.18.2"
    # The spec gpunode wrote for 1.17 is still there, the toolkit's own is missing.
    assert findings(facts) == {
        "runtime.cdi": Severity.WARNING,
        "runtime.cdi.second_spec": Severity.WARNING,
    }
    found = {f.id: f for f in evaluate("node-1", desired(), facts)}
    assert "/var/run/cdi/nvidia.yaml" in found["runtime.cdi"].expected
    runtime["cdi_refresh_spec"] = {"present": True, "uuids": ["GPU-0", "GPU-1"]}
    runtime["cdi_spec"] = {"present": False, "uuids": []}
    assert findings(facts) == {}
    # A pin of 1.17 means gpunode's own spec, whatever nvidia-ctk says.
    pinned = dict(DATA, container_runtime={"engines": ["docker"], "toolkit_version": "1.17.8-1"})
    assert "runtime.cdi" in findings(facts, desired(pinned))


def test_a_pin_past_its_end_of_life_is_an_info_finding_and_no_drift() -> None:
    import datetime

    from gpunode.drift.findings import DriftResult

    eol = dict(DATA, nvidia_driver={**DATA["nvidia_driver"], "branch": "570",
                                    "version": "570.195.03-1"})  # fmt: skip
    found = evaluate("node-1", desired(eol), healthy_facts(), today=datetime.date(2026, 12, 1))
    advisories = [f for f in found if f.id.startswith("advisory:")]
    assert [(f.id, f.severity) for f in advisories] == [
        ("advisory:nvidia_driver.branch", Severity.INFO)
    ]
    assert "reached its end of life in February 2026" in advisories[0].found
    # The same pin before its end of life: nothing to say.
    before = evaluate("node-1", desired(eol), healthy_facts(), today=datetime.date(2026, 1, 1))
    assert not [f for f in before if f.id.startswith("advisory:")]
    # Info alone is no drift: the nightly check exits 0; with anything else it exits 1 (here
    # the facts' packages are 580's, not the pinned 570's).
    assert DriftResult(findings=advisories, checked_hosts=["node-1"]).exit_code == 0
    drift = [f for f in found if f.severity != Severity.INFO]
    assert drift and DriftResult(findings=advisories + drift).exit_code == 1


def test_a_spec_left_by_a_newer_toolkit_beside_117s_is_a_second_spec() -> None:
    facts = copy.deepcopy(healthy_facts())
    facts["container_runtime"]["nvidia_ctk_version"] = "1.17.8"
    facts["container_runtime"]["cdi_refresh_spec"] = {"present": True, "uuids": ["GPU-0"]}
    assert findings(facts) == {"runtime.cdi.second_spec": Severity.WARNING}


def _without(facts: dict[str, Any], name: str) -> dict[str, Any]:
    del facts["packages"]["packages"][name]
    return facts


def test_every_held_stack_package_is_checked_where_the_data_enables_it() -> None:
    """DCGM 4 with its exporter, the NVLink subnet manager (B200 NVSwitch) and IMEX (GB200
    NVL72): each pinned package missing, at another version or unheld is its own finding;
    unpinned ones only need to be there and held."""
    blackwell = copy.deepcopy(DATA) | {
        "expected_hardware": DATA["expected_hardware"] | {"gpu_model": "NVIDIA GB200"},
        "dcgm": {"enabled": True, "version": "1:4.6.0-1", "exporter": True},
        "fabric_manager": {"nvlsm_version": "2025.10.11-1"},
        "imex": {"nodes": ["10.0.0.1", "10.0.0.2"]},
    }
    blackwell["nvidia_driver"] = DATA["nvidia_driver"] | {"flavour": "open"}
    state = desired(blackwell)
    versions = {
        "datacenter-gpu-manager-4-core": "1:4.6.0-1",
        "datacenter-gpu-manager-4-cuda13": "1:4.6.0-1",
        "datacenter-gpu-manager-exporter": "4.8.3-1",
        "nvlsm": "2025.10.11-1",
        "nvidia-imex": "580.95.05-1",
    }
    facts = healthy_facts()
    facts["packages"]["packages"].update(versions)
    facts["packages"]["held"] = sorted(facts["packages"]["held"] + list(versions))
    healthy = findings(facts, state)
    assert not [key for key in healthy if key.startswith("packages.")], healthy

    changed = copy.deepcopy(facts)
    changed["packages"]["packages"]["nvlsm"] = "2025.06.1-1"
    assert findings(changed, state)["packages.version:nvlsm"] == Severity.CRITICAL
    missing = _without(copy.deepcopy(facts), "datacenter-gpu-manager-exporter")
    assert findings(missing, state)["packages.version:datacenter-gpu-manager-exporter"] == (
        Severity.CRITICAL
    )
    unheld = copy.deepcopy(facts)
    unheld["packages"]["held"].remove("nvidia-imex")
    unheld["packages"]["held"].remove("datacenter-gpu-manager-4-cuda13")
    assert {key: value for key, value in findings(unheld, state).items() if "hold" in key} == {
        "packages.hold:nvidia-imex": Severity.WARNING,
        "packages.hold:datacenter-gpu-manager-4-cuda13": Severity.WARNING,
    }
    # The exporter has no pin in this data: any installed version is fine, once held.
    other = copy.deepcopy(facts)
    other["packages"]["packages"]["datacenter-gpu-manager-exporter"] = "4.9.0-1"
    assert "packages.version:datacenter-gpu-manager-exporter" not in findings(other, state)


def test_a_ruleset_without_the_exporters_ports_is_drift_once_an_exporter_runs() -> None:
    """Enabling node_exporter changes the ruleset gpunode wants (its port opens to the
    monitoring networks): the persisted one of before is drift."""
    firewall = {"enabled": True, "monitoring_networks": ["10.10.50.0/24"]}
    before = desired({**DATA, "firewall": firewall})
    facts = healthy_facts()
    facts["firewall"]["file_sha256"] = hashlib.sha256(
        render_ruleset(before.firewall, before.sshd.port, before.exporter_ports).encode()
    ).hexdigest()
    assert findings(facts, before) == {}
    with_exporter = desired({**DATA, "firewall": firewall, "node_exporter": {"enabled": True}})
    assert with_exporter.exporter_ports == (9100,)
    assert findings(facts, with_exporter) == {"firewall.ruleset": Severity.WARNING}


def test_power_limit_and_application_clocks_the_driver_forgot_are_critical() -> None:
    data = {
        **DATA,
        "gpu_settings": {
            **DATA["gpu_settings"],
            "power_limit_w": 500,
            "application_clocks": {"memory_mhz": 2619, "graphics_mhz": 1980},
        },
    }
    facts = healthy_facts()
    for gpu in facts["gpu"]["gpus"]:
        gpu["power_w"] = {"limit": 500.0, "default_limit": 700.0}
        gpu["application_clocks_mhz"] = {"memory": 2619, "graphics": 1980}
    assert [f.id for f in evaluate("n1", desired(data), facts)] == []
    # After a reboot: the driver's defaults on GPU 1.
    facts["gpu"]["gpus"][1]["power_w"]["limit"] = 700.0
    facts["gpu"]["gpus"][1]["application_clocks_mhz"] = {"memory": 2619, "graphics": 1755}
    found = {f.id: f for f in evaluate("n1", desired(data), facts)}
    assert {name: f.severity for name, f in found.items()} == {
        "gpu.power_limit:1": Severity.CRITICAL,
        "gpu.application_clocks:1": Severity.CRITICAL,
    }
    assert (found["gpu.power_limit:1"].expected, found["gpu.power_limit:1"].found) == (
        "power limit 500 W", "700 W"
    )  # fmt: skip
    # A GPU whose driver reports no application clocks (590 on Hopper) is no finding.
    facts["gpu"]["gpus"][1]["application_clocks_mhz"] = None
    assert "gpu.application_clocks:1" not in {f.id for f in evaluate("n1", desired(data), facts)}


HALVES = ["3g.40gb", "3g.40gb"]
MIG_DATA = {**DATA, "gpu_settings": {**DATA["gpu_settings"], "mig": True, "mig_layout": HALVES}}


def mig_facts(*layouts: list[str] | None) -> dict[str, Any]:
    """Healthy facts whose GPUs are in MIG mode, GPU i holding the instances ``layouts[i]``
    (None: in MIG mode, but ``nvidia-smi mig -lgi`` could not be read)."""
    facts = healthy_facts()
    facts["gpu"]["mig_listing"] = {"state": "ok", "reason": ""}
    for gpu, layout in zip(facts["gpu"]["gpus"], layouts, strict=True):
        gpu["mig_mode"] = {"current": True, "pending": True}
        gpu["gpu_instances"] = (
            None
            if layout is None
            else [
                {"id": n + 1, "profile": name, "profile_id": 9, "start": 4 * n, "size": 4}
                for n, name in enumerate(layout)
            ]
        )
    return facts


def test_gpus_holding_the_declared_mig_layout_pass() -> None:
    assert findings(mig_facts(HALVES, list(reversed(HALVES))), desired(MIG_DATA)) == {}


def test_a_gpu_with_other_mig_instances_than_declared_is_critical() -> None:
    facts = mig_facts(HALVES, ["4g.40gb", "2g.20gb"])
    found = {f.id: f for f in evaluate("n1", desired(MIG_DATA), facts)}
    assert {name: f.severity for name, f in found.items()} == {
        "gpu.mig_layout:1": Severity.CRITICAL
    }
    assert (found["gpu.mig_layout:1"].expected, found["gpu.mig_layout:1"].found) == (
        "GPU instances ['3g.40gb', '3g.40gb']", "GPU instances ['2g.20gb', '4g.40gb']"
    )  # fmt: skip
    # One instance short is drift too: a multiset, not a set of profile names.
    short = {f.id for f in evaluate("n1", desired(MIG_DATA), mig_facts(HALVES, HALVES[:1]))}
    assert short == {"gpu.mig_layout:1"}


def test_a_gpu_back_from_a_reboot_without_instances_is_critical_and_names_the_boot_unit() -> None:
    found = {f.id: f for f in evaluate("n1", desired(MIG_DATA), mig_facts([], []))}
    assert {name: f.severity for name, f in found.items()} == {
        "gpu.mig_layout:0": Severity.CRITICAL,
        "gpu.mig_layout:1": Severity.CRITICAL,
    }
    finding = found["gpu.mig_layout:0"]
    assert finding.found == "no GPU instances (none laid out at boot)"
    assert "gpunode-gpu-settings.service" in finding.fix


def test_an_unreadable_mig_listing_is_a_finding_saying_why_not_a_pass_or_a_crash() -> None:
    facts = mig_facts(HALVES, None)
    reason = "unexpected line '| garbage |'"
    facts["gpu"]["mig_listing"] = {"state": "unreadable", "reason": reason}
    found = {f.id: f for f in evaluate("n1", desired(MIG_DATA), facts)}
    assert {name: f.severity for name, f in found.items()} == {
        "gpu.mig_layout:1": Severity.CRITICAL
    }
    assert found["gpu.mig_layout:1"].found == f"unreadable: {reason}"
    # A listing of the wrong shape (node text) is the GPU section's unreadable finding.
    facts["gpu"]["gpus"][1]["gpu_instances"] = "3g.40gb"
    assert findings(facts, desired(MIG_DATA)) == {"gpu.unreadable": Severity.WARNING}


def test_mig_mode_other_than_declared_is_critical_unless_a_reset_makes_it_so() -> None:
    facts = mig_facts(HALVES, HALVES)
    facts["gpu"]["gpus"][1]["mig_mode"] = {"current": False, "pending": False}
    facts["gpu"]["gpus"][1]["gpu_instances"] = []
    found = {f.id: f for f in evaluate("n1", desired(MIG_DATA), facts)}
    assert {name: f.severity for name, f in found.items()} == {"gpu.mig_mode:1": Severity.CRITICAL}
    assert (found["gpu.mig_mode:1"].expected, found["gpu.mig_mode:1"].found) == (
        "MIG on", "MIG off"
    )  # fmt: skip
    # Requested, waiting for a reset: worth knowing, and no layout is due yet.
    facts["gpu"]["gpus"][1]["mig_mode"] = {"current": False, "pending": True}
    assert findings(facts, desired(MIG_DATA)) == {"gpu.mig_mode:1": Severity.INFO}
    # Nothing declared about MIG: neither mode nor instances are checked.
    assert findings(mig_facts([], []), desired()) == {}

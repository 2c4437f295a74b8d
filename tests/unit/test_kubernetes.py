"""Kubernetes worker readiness: the model's section and its contradictions, the forward chain,
the sysctls, the role's decisions, the fact's parser and the drift rule.

kubelet and kubeadm are in no Debian release (the model's docstring): nothing here runs them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from facts.container_runtime import DpkgPackageState
from facts.kubernetes import KubernetesNode, parse_kubernetes
from gpunode import framing
from gpunode.drift.rules import evaluate
from gpunode.expected import kubernetes as expected
from gpunode.expected.firewall import render_ruleset, service_rules
from gpunode.model import DesiredState, build_desired_state
from gpunode.refusal import NodeRefused
from roles import kubernetes as role
from roles.kernel import sysctl_values

from .fakehost import commands_of, fake_host

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WORKER = {
    "nvidia_driver": {"source": "debian"},
    "container_runtime": {"engines": ["containerd"]},
    "firewall": {"enabled": True, "admin_networks": ["10.0.0.0/8"]},
    "kubernetes": {
        "enabled": True,
        "pod_networks": ["10.244.0.0/16", "fd00:10:244::/56"],
        "service_networks": ["10.96.0.0/12"],
    },
}


def state(data: dict[str, Any] | None = None, **kubernetes: Any) -> DesiredState:
    merged = {**WORKER, **(data or {})}
    merged["kubernetes"] = {**WORKER["kubernetes"], **kubernetes}
    desired, problems = build_desired_state(merged)
    assert problems == [], [p.render("inv", "h") for p in problems]
    return desired


def problems_of(data: dict[str, Any]) -> dict[str, str]:
    _, problems = build_desired_state({**WORKER, **data})
    return {problem.key: problem.reason for problem in problems}


# --- the model: one source of truth for forwarding ------------------------------------------


def test_a_worker_forwards_and_the_kernel_role_writes_the_bridge_sysctls() -> None:
    desired = state({"container_runtime": {"engines": ["containerd"]}})
    values = sysctl_values(desired)
    assert values["net.ipv4.ip_forward"] == "1"
    assert values["net.bridge.bridge-nf-call-iptables"] == "1"
    assert values["net.bridge.bridge-nf-call-ip6tables"] == "1"
    plain, _ = build_desired_state({})
    assert sysctl_values(plain)["net.ipv4.ip_forward"] == "0"
    assert "net.bridge.bridge-nf-call-iptables" not in sysctl_values(plain)


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"kernel": {"ip_forward": False}}, "kernel.ip_forward"),
        ({"kernel": {"sysctls": {"net.ipv4.ip_forward": "0"}}},
         "kernel.sysctls.net.ipv4.ip_forward"),
        ({"kernel": {"sysctls": {"net.bridge.bridge-nf-call-iptables": "0"}}},
         "kernel.sysctls.net.bridge.bridge-nf-call-iptables"),
        ({"firewall": {"enabled": False}}, "firewall.enabled"),
        ({"container_runtime": {"engines": ["docker"]}}, "container_runtime.engines"),
        ({"container_runtime": {"engines": ["containerd"], "cdi": False}},
         "container_runtime.engines"),
        ({"nvidia_driver": {"source": "none"}}, "nvidia_driver.source"),
        ({"kubernetes": {"enabled": True}}, "kubernetes.pod_networks"),
        ({"kubernetes": {**WORKER["kubernetes"], "pod_networks": ["10.244.0.1/16"]}},
         "kubernetes.pod_networks[0]"),
        ({"kubernetes": {**WORKER["kubernetes"], "packages": ["kubelet"]}},
         "kubernetes.repository_url"),
        ({"kubernetes": {**WORKER["kubernetes"], "packages": ["kubelet"],
                         "repository_url": "https://mirror.example/k8s/"}},
         "kubernetes.repository_keyring"),
        ({"kubernetes": {**WORKER["kubernetes"], "packages": ["kubelet", "kubelet"]}},
         "kubernetes.packages"),
        ({"kubernetes": {**WORKER["kubernetes"], "packages": ["kubernetes-cni"]}},
         "kubernetes.packages[0]"),
        ({"kubernetes": {**WORKER["kubernetes"], "version": "1.32; reboot"}},
         "kubernetes.version"),
    ],
)  # fmt: skip
def test_contradictions_and_bad_data_are_refused_by_key(data: dict[str, Any], key: str) -> None:
    assert key in problems_of(data)


def test_matching_kernel_data_is_no_contradiction() -> None:
    state({"kernel": {"ip_forward": True, "sysctls": {"net.ipv4.ip_forward": "1"}}})


# --- the firewall's forward chain -----------------------------------------------------------


def test_a_worker_gets_a_forward_chain_that_drops_what_it_does_not_accept() -> None:
    desired = state()
    text = render_ruleset(desired.firewall, 22, desired.exporter_ports, service_rules(desired),
                          desired.forward_networks)  # fmt: skip
    chain = text.split("chain forward {")[1].split("}")[0]
    assert "type filter hook forward priority filter; policy drop;" in chain
    assert "ip saddr @forward_ipv4 accept" in chain and "ip6 daddr @forward_ipv6 accept" in chain
    assert "elements = { 10.96.0.0/12, 10.244.0.0/16 }" in text
    assert "elements = { fd00:10:244::/56 }" in text
    # nft's own listing of this chain (a capture from nft 1.1.3) has the same rules.
    listed = (FIXTURES / "nftables/list-chain-forward-1.1.3-deb13.txt").read_text()
    rules = [line.strip() for line in chain.splitlines() if line.strip()]
    assert all(rule in listed for rule in rules)


def test_without_kubernetes_there_is_no_forward_chain() -> None:
    plain, _ = build_desired_state({"firewall": {"enabled": True}})
    assert plain.forward_networks == ()
    assert "hook forward" not in render_ruleset(plain.firewall, 22)


# --- the role -------------------------------------------------------------------------------


def node(**changes: Any) -> dict[str, Any]:
    base = {
        "state": "ok", "reason": "", "cgroup": "v2", "swap_active": [], "fstab_swap": [],
        "modules": ["br_netfilter", "overlay"],
        "sysctls": {"net.ipv4.ip_forward": "1", "net.bridge.bridge-nf-call-iptables": "1",
                    "net.bridge.bridge-nf-call-ip6tables": "1"},
        "forward_filtered": True, "packages": {}, "problems": [],
    }  # fmt: skip
    return base | changes


def test_cgroup_v1_and_swap_in_fstab_refuse_the_node_saying_why() -> None:
    assert role.refusal_reason(node()) is None
    assert "cgroup v1" in str(role.refusal_reason(node(cgroup="v1")))
    reason = str(role.refusal_reason(node(fstab_swap=["/swapfile"])))
    assert "/swapfile" in reason and "does not edit fstab" in reason
    with fake_host({KubernetesNode: node(cgroup="v1")}), pytest.raises(NodeRefused):
        role.kubernetes_host._inner(state())  # type: ignore[attr-defined]


def test_swap_that_fstab_does_not_declare_is_turned_off() -> None:
    commands, _ = commands_of(role.swap_off, {KubernetesNode: node(swap_active=["/dev/zram0"])})
    assert commands == ["swapoff -a"]
    commands, noops = commands_of(role.swap_off, {KubernetesNode: node()})
    assert commands == [] and noops == ["no swap active"]


def test_missing_modules_are_loaded() -> None:
    commands, _ = commands_of(role.modules_loaded, {KubernetesNode: node(modules=["overlay"])})
    assert commands == ["modprobe br_netfilter"]
    commands, _ = commands_of(role.modules_loaded, {KubernetesNode: node()})
    assert commands == []
    assert expected.render_modules_load().splitlines()[1:] == ["overlay", "br_netfilter"]


def dpkg(**installed: tuple[str | None, bool]) -> Any:
    def value(packages: list[str]) -> dict[str, dict[str, Any]]:
        return {
            name: dict(zip(("installed", "held"), installed.get(name, (None, False)), strict=True))
            for name in packages
        }

    return value


def test_packages_are_installed_at_their_pin_and_held() -> None:
    facts = {DpkgPackageState: dpkg(kubelet=("1.32.2-1.1", True))}
    commands, _ = commands_of(
        role.packages_installed, facts, packages=("kubelet", "kubeadm"), version="1.32.3-1.1"
    )
    assert commands[0].endswith("kubelet=1.32.3-1.1 kubeadm=1.32.3-1.1")
    assert commands[1] == "apt-mark hold kubelet kubeadm"
    done = {DpkgPackageState: dpkg(kubelet=("1.32.3-1.1", True))}
    commands, noops = commands_of(
        role.packages_installed, done, packages=("kubelet",), version="1.32.3-1.1"
    )
    assert commands == [] and noops == ["kubelet installed and held"]


# --- the fact -------------------------------------------------------------------------------


def frame(**parts: tuple[list[str], int]) -> list[str]:
    return framing.output_of(
        {
            name: framing.PartOutput(name, lines, [], status)
            for name, (lines, status) in parts.items()
        }
    )


HEALTHY_FRAME = {
    "cgroup": (["cgroup2"], 0),
    "swaps": (["Filename\tType\tSize\tUsed\tPriority"], 0),
    "fstab_swap": ([], 0),
    "modules": (["overlay", "br_netfilter"], 0),
    "sysctls": ([f"{key}=1" for key in ("net.ipv4.ip_forward", *expected.KUBERNETES_SYSCTLS)], 0),
    "forward": (
        (FIXTURES / "nftables/list-chain-forward-1.1.3-deb13.txt").read_text().splitlines(),
        0,
    ),
    "packages": ([], 0),
}


def test_the_fact_reads_a_healthy_worker() -> None:
    assert parse_kubernetes(frame(**HEALTHY_FRAME)) == node()


def test_the_fact_reads_swap_v1_and_a_missing_chain_and_names_strange_lines() -> None:
    value = parse_kubernetes(frame(**{
        **HEALTHY_FRAME,
        "cgroup": (["cgroup2", "tmpfs"], 0),  # the last mount at the path is seen
        "swaps": (["Filename Type", "/swapfile file 1024 0 -2"], 0),
        "fstab_swap": (["/swapfile", "UUID=1 2"], 0),
        "sysctls": (["net.ipv4.ip_forward=0", "garbage line"], 0),
        "forward": (["Error: No such file or directory"], 1),
        "packages": (["kubelet 1.32.3-1.1 hold", "kubeadm  unknown", "kubectl 1.32.3-1.1 install",
                      "kubelet; rm -rf / x"], 0),
    }))  # fmt: skip
    assert value["cgroup"] == "v1" and value["swap_active"] == ["/swapfile"]
    assert value["fstab_swap"] == ["/swapfile"] and value["forward_filtered"] is False
    assert value["sysctls"] == {"net.ipv4.ip_forward": "0"}
    assert value["packages"] == {
        "kubelet": {"version": "1.32.3-1.1", "held": True},
        "kubectl": {"version": "1.32.3-1.1", "held": False},
    }
    assert value["problems"] == [
        "fstab: 'UUID=1 2'", "sysctls: 'garbage line'", "packages: 'kubelet; rm -rf / x'",
    ]  # fmt: skip


def test_the_fact_command_runs_here_and_reads_this_host() -> None:
    """Against this control host's real /proc, /sys and /etc/fstab: every part answers."""
    command = KubernetesNode().command()
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
    value = parse_kubernetes(done.stdout.splitlines())
    assert value["cgroup"] in ("v1", "v2") and value["problems"] == []
    assert set(value["sysctls"]) <= {"net.ipv4.ip_forward", *expected.KUBERNETES_SYSCTLS}
    assert "net.ipv4.ip_forward" in value["sysctls"]


# --- drift ----------------------------------------------------------------------------------


def drift(section: dict[str, Any]) -> dict[str, Any]:
    return {f.id: f for f in evaluate("node-1", state(), {"kubernetes": section})
            if f.id.startswith("kubernetes")}  # fmt: skip


def test_a_ready_worker_has_no_finding_and_each_breakage_its_own() -> None:
    assert drift(node()) == {}
    assert list(drift(node(cgroup="v1"))) == ["kubernetes.cgroup"]
    assert list(drift(node(swap_active=["/dev/sda3"]))) == ["kubernetes.swap"]
    assert list(drift(node(modules=["overlay"]))) == ["kubernetes.module:br_netfilter"]
    off = node(sysctls={**node()["sysctls"], "net.bridge.bridge-nf-call-iptables": "0"})
    assert list(drift(off)) == ["kubernetes.sysctl:net.bridge.bridge-nf-call-iptables"]
    found = drift(node(forward_filtered=False))
    assert list(found) == ["kubernetes.forward"] and found["kubernetes.forward"].found == "missing"
    assert list(drift({"state": "unreadable", "reason": "x"})) == ["kubernetes.unreadable"]
    assert list(drift(node(modules="overlay"))) == ["kubernetes.unreadable"]


def test_declared_packages_not_at_their_pin_or_not_held_are_findings() -> None:
    pinned = {
        **WORKER,
        "kubernetes": {**WORKER["kubernetes"], "packages": ["kubelet", "kubeadm"],
                       "repository_url": "https://mirror.example/k8s/",
                       "repository_keyring": "keys/k8s.gpg", "version": "1.32.3-1.1"},
    }  # fmt: skip
    desired, problems = build_desired_state(pinned)
    assert problems == []
    good = {"version": "1.32.3-1.1", "held": True}
    facts = {"kubernetes": node(packages={"kubelet": good, "kubeadm": good})}
    assert [f for f in evaluate("n", desired, facts) if f.id.startswith("kubernetes")] == []
    facts = {"kubernetes": node(packages={"kubelet": {**good, "held": False}})}
    found = {f.id: f for f in evaluate("n", desired, facts) if f.id.startswith("kubernetes")}
    assert set(found) == {"kubernetes.package:kubelet", "kubernetes.package:kubeadm"}
    assert found["kubernetes.package:kubeadm"].found == "not installed"
    assert found["kubernetes.package:kubelet"].found == "kubelet 1.32.3-1.1"


def test_nothing_is_checked_on_a_node_that_is_no_worker() -> None:
    plain, _ = build_desired_state({})
    assert [f for f in evaluate("node-1", plain, {"kubernetes": node(cgroup="v1")})
            if f.id.startswith("kubernetes")] == []  # fmt: skip

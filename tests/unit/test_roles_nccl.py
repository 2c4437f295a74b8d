"""NCCL role: name lists in NCCL's syntax checked against the node's interfaces and HCAs."""

from __future__ import annotations

import subprocess

import pytest
from pyinfra.api import OperationError

from facts.fabric import NetworkInterfaces, RdmaDevices
from facts.hardware import InfinibandPorts
from gpunode.model import build_desired_state
from roles.nccl import (
    NameList,
    declared_interfaces,
    hca_problems,
    interface_problems,
    known_hcas,
    nccl_names_checked,
    render_nccl_conf,
    render_nccl_profile,
    selection_notes,
)

from .fakehost import commands_of

INTERFACES = ["lo", "eth0", "eth1", "docker0"]
HCAS = {"mlx5_0": [1], "mlx5_1": [1], "mlx5_10": [1, 2]}


def ibstat(*cas: tuple[str, list[int]]) -> dict:
    return {
        "state": "ok",
        "cas": [{"name": name, "ports": [{"port": port} for port in ports]} for name, ports in cas],
    }


def facts(interfaces: list[str], sysfs: list[str], ports: dict) -> dict:
    return {
        NetworkInterfaces: {name: {"mtu": 1500, "operstate": "UP", "addresses": []}
                            for name in interfaces},
        RdmaDevices: sysfs,
        InfinibandPorts: ports,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("value", "exclude", "exact", "names"),
    [
        ("eth", False, False, (("eth", None),)),
        ("=eth0", False, True, (("eth0", None),)),
        ("^docker,lo", True, False, (("docker", None), ("lo", None))),
        ("^=docker0", True, True, (("docker0", None),)),
        ("mlx5_0:1,mlx5_1", False, False, (("mlx5_0", 1), ("mlx5_1", None))),
        (" =mlx5_0:1, mlx5_10:2 ", False, True, (("mlx5_0", 1), ("mlx5_10", 2))),
    ],
)
def test_name_lists_follow_nccls_syntax(
    value: str, exclude: bool, exact: bool, names: tuple
) -> None:
    parsed = NameList.parse(value)
    assert (parsed.exclude, parsed.exact, parsed.names) == (exclude, exact, names)


@pytest.mark.parametrize("value", ["eth", "eth0", "=eth1", "e", "=lo,eth0", "^ib,bond", "^=ib9"])
def test_interface_lists_that_match_pass(value: str) -> None:
    assert interface_problems(value, INTERFACES, [], "node-1") == []


def test_exact_name_must_match_whole_interface_name() -> None:
    assert interface_problems("=eth", INTERFACES, [], "node-1") == [
        "node-1: nccl.env.NCCL_SOCKET_IFNAME = '=eth': 'eth' matches no network interface "
        "exactly; the node has: docker0, eth0, eth1, lo"
    ]


def test_each_unknown_interface_is_named_with_what_exists() -> None:
    problems = interface_problems("ib,eth0,bond", INTERFACES, [], "node-7")
    assert len(problems) == 2
    assert problems[0].startswith("node-7: nccl.env.NCCL_SOCKET_IFNAME = 'ib,eth0,bond': 'ib'")
    assert "'bond' matches no network interface as a prefix" in problems[1]
    assert problems[1].endswith("the node has: docker0, eth0, eth1, lo")


def test_ipoib_interfaces_this_run_configures_count_as_existing() -> None:
    assert interface_problems("ib", INTERFACES, ["ib0"], "n") == []
    assert interface_problems("=ib1", INTERFACES, ["ib0"], "n") == [
        "n: nccl.env.NCCL_SOCKET_IFNAME = '=ib1': 'ib1' matches no network interface exactly; "
        "the node has: docker0, eth0, eth1, lo (and this run configures: ib0)"
    ]


def test_declared_interfaces_only_when_infiniband_is_enabled() -> None:
    ipoib = [{"name": "ib0", "address": "10.9.0.1/24"}]
    on, problems = build_desired_state({"infiniband": {"enabled": True, "ipoib": ipoib}})
    off, _ = build_desired_state({"infiniband": {"enabled": False}})
    assert problems == []
    assert declared_interfaces(on) == ["ib0"]
    assert declared_interfaces(off) == []


@pytest.mark.parametrize("value", ["mlx5", "mlx5_0:1,mlx5_1", "=mlx5_10:2", "^mlx5_9", "^=x"])
def test_hca_lists_that_match_pass(value: str) -> None:
    assert hca_problems(value, HCAS, "node-1") == []


def test_unknown_hca_is_named_with_hcas_and_ports() -> None:
    assert hca_problems("mlx5_0,mlx4", HCAS, "node-1") == [
        "node-1: nccl.env.NCCL_IB_HCA = 'mlx5_0,mlx4': 'mlx4' matches no HCA as a prefix; the "
        "node has: mlx5_0 (ports 1), mlx5_1 (ports 1), mlx5_10 (ports 1, 2)"
    ]


def test_exact_hca_name_does_not_match_longer_names() -> None:
    # =mlx5_1 must not be satisfied by mlx5_10.
    assert hca_problems("=mlx5_1", {"mlx5_10": [1]}, "n") == [
        "n: nccl.env.NCCL_IB_HCA = '=mlx5_1': 'mlx5_1' matches no HCA exactly; the node has: "
        "mlx5_10 (ports 1)"
    ]


def test_a_port_the_hca_lacks_is_refused() -> None:
    assert hca_problems("=mlx5_0:2", HCAS, "n") == [
        "n: nccl.env.NCCL_IB_HCA = '=mlx5_0:2': mlx5_0:2: no such port; the node has: "
        "mlx5_0 (ports 1), mlx5_1 (ports 1), mlx5_10 (ports 1, 2)"
    ]
    # Where only sysfs named the HCA its ports are unknown, and the port is not judged.
    assert hca_problems("mlx5_0:2", {"mlx5_0": []}, "n") == []


def test_no_hca_at_all_says_so() -> None:
    assert hca_problems("mlx5", {}, "n") == [
        "n: nccl.env.NCCL_IB_HCA = 'mlx5': 'mlx5' matches no HCA as a prefix; the node has: "
        "no HCA (/sys/class/infiniband and ibstat list none)"
    ]


def test_hcas_come_from_sysfs_and_readable_ibstat() -> None:
    assert known_hcas(["mlx5_0", "mlx5_2"], ibstat(("mlx5_0", [1]), ("mlx5_1", [1, 2]))) == {
        "mlx5_0": [1],
        "mlx5_1": [1, 2],
        "mlx5_2": [],
    }
    assert known_hcas(["mlx5_0"], {"state": "absent", "reason": "no ibstat"}) == {"mlx5_0": []}


def test_check_operation_reports_selection_and_changes_nothing() -> None:
    env = {"NCCL_SOCKET_IFNAME": "^docker,lo", "NCCL_IB_HCA": "=mlx5_1", "NCCL_DEBUG": "WARN"}
    commands, noops = commands_of(
        nccl_names_checked,
        facts(INTERFACES, ["mlx5_0", "mlx5_1"], {"state": "absent"}),
        env=env,
        declared=["ib0"],
    )
    assert commands == []
    assert noops == [
        "NCCL_SOCKET_IFNAME=^docker,lo selects: eth0, eth1, ib0",
        "NCCL_IB_HCA==mlx5_1 selects: mlx5_1",
    ]


def test_check_operation_refuses_names_that_vanished() -> None:
    with pytest.raises(OperationError, match="'eth9' matches no network interface"):
        commands_of(
            nccl_names_checked,
            facts(INTERFACES, [], ibstat(("mlx5_0", [1]))),
            env={"NCCL_SOCKET_IFNAME": "eth9"},
            declared=[],
        )


def test_selection_notes_only_for_variables_that_are_set() -> None:
    assert selection_notes({"NCCL_DEBUG": "INFO"}, INTERFACES, list(HCAS)) == []


def test_unknown_nccl_variable_is_a_validation_error() -> None:
    _, problems = build_desired_state({"nccl": {"env": {"NCCL_SOCKET_IFACE": "eth0"}}})
    assert len(problems) == 1
    assert (
        problems[0]
        .render("inv.py", "n")
        .startswith("inv.py: host n: nccl.env.NCCL_SOCKET_IFACE = 'eth0': unknown NCCL variable")
    )


def test_conf_and_profile_hold_every_variable_sorted() -> None:
    env = {"NCCL_SOCKET_IFNAME": "=eth0", "NCCL_DEBUG": "WARN", "NCCL_TOPO_FILE": "/a b/t.xml"}
    assert render_nccl_conf(env).splitlines()[1:] == [
        "NCCL_DEBUG=WARN",
        "NCCL_SOCKET_IFNAME==eth0",
        "NCCL_TOPO_FILE=/a b/t.xml",
    ]
    profile = render_nccl_profile(env)
    assert profile.splitlines()[1:] == [
        "export NCCL_DEBUG=WARN",
        "export NCCL_SOCKET_IFNAME==eth0",
        "export NCCL_TOPO_FILE='/a b/t.xml'",
    ]
    # A login shell that sources it sees exactly the values of /etc/nccl.conf.
    shown = subprocess.run(
        ["sh", "-c", profile + 'printf "%s|%s" "$NCCL_SOCKET_IFNAME" "$NCCL_TOPO_FILE"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert shown == "=eth0|/a b/t.xml"


def test_nccl_conf_never_gets_a_second_line_from_a_value() -> None:
    # Issue 12: a newline in a value added a line to /etc/nccl.conf. Validation refuses it
    # (tests/unit/test_model.py); the renderer refuses to write it as well.
    with pytest.raises(ValueError, match="control character"):
        render_nccl_conf({"NCCL_DEBUG": "WARN\nNCCL_NET_PLUGIN=/tmp/evil"})

"""deploys/firewall.py on lab nodes: default-drop input from data, other tables untouched,
drift repaired, persistence by its own unit, a cut-off ruleset refused or rolled back."""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import Lab, LabNode

from .conftest import run_pyinfra, ssh
from .conftest import write_inventory as write_lab_inventory

pytestmark = pytest.mark.lab

DEPLOY = "deploys/firewall.py"
RULESET_OP = (
    "Firewall | Table inet gpunode: default-drop input, allow-rules from data (SSH-confirmed)"
)
ROLLBACK_AFTER_S = 10
# Stands in for Docker's, Kubernetes' and CNI's tables, which the firewall must never touch.
OTHER_TABLE = "table ip docker_sim"


def sudo(lab: Lab, node: LabNode, command: str) -> str:
    result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, f"{node.name}: {command}: {result.stderr}"
    return result.stdout


def live_table(lab: Lab, node: LabNode) -> str:
    return sudo(lab, node, "nft -s list table inet gpunode")


def tables(lab: Lab, node: LabNode) -> list[str]:
    return sudo(lab, node, "nft list tables").splitlines()


def persisted_sha256(lab: Lab, node: LabNode) -> str:
    return sudo(lab, node, "sha256sum < /etc/gpunode/firewall.nft").split()[0]


def changes(run: Any) -> set[tuple[str, str]]:
    return {(name, host) for name, hosts in run.changed_operations().items() for host in hosts}


def write_inventory(path: Path, lab: Lab, nodes: list[LabNode], firewall: dict[str, Any]) -> str:
    """An inventory of ``nodes`` with the lab's connection data and ``firewall`` data."""
    return write_lab_inventory(
        path, lab, nodes, {node.name: {"firewall": firewall} for node in nodes}
    )


@pytest.fixture(scope="module")
def nodes(lab_nodes: list[LabNode]) -> list[LabNode]:
    assert len(lab_nodes) >= 2, "the firewall tests need a second node as a client"
    return lab_nodes[:2]


@pytest.fixture(scope="module")
def control_address(lab: Lab, nodes: list[LabNode]) -> str:
    """The control machine's address as the nodes see it."""
    result = ssh(lab, nodes[0], "echo $SSH_CLIENT")
    assert result.returncode == 0, result.stderr
    return result.stdout.split()[0]


@pytest.fixture(scope="module")
def inventory(
    lab: Lab, nodes: list[LabNode], control_address: str, tmp_path_factory: pytest.TempPathFactory
) -> str:
    """SSH only from the control machine (and an IPv6 admin net); metrics ports from the lab
    subnet; port 8080 from the second node."""
    firewall = {
        "enabled": True,
        "admin_networks": [f"{control_address}/32", "fd00:213:4::/64"],
        "monitoring_networks": [lab.subnet],
        # Metrics ports beside the exporters gpunode runs (none in this inventory); 9109, not
        # node_exporter's 9100, on which an earlier converge may have left it listening.
        "metrics_ports": [9109, 9400],
        "extra_rules": [{"name": "web", "ports": [8080], "sources": [f"{nodes[1].address}/32"]}],
    }
    return write_inventory(tmp_path_factory.mktemp("fw") / "allowed.py", lab, nodes, firewall)


@pytest.fixture(scope="module")
def cutting_inventory(
    lab: Lab, nodes: list[LabNode], tmp_path_factory: pytest.TempPathFactory
) -> str:
    """SSH allowed from the second node only: the control machine would be shut out."""
    firewall = {"enabled": True, "admin_networks": [f"{nodes[1].address}/32"]}
    return write_inventory(tmp_path_factory.mktemp("fw") / "cut.py", lab, nodes[:1], firewall)


@pytest.fixture(scope="module")
def cutting_inventory_without_preflight(
    lab: Lab, nodes: list[LabNode], tmp_path_factory: pytest.TempPathFactory
) -> str:
    """The same cut with the preflight off (as behind NAT), so the rollback guard must act."""
    firewall = {
        "enabled": True,
        "admin_networks": [f"{nodes[1].address}/32"],
        "ssh_preflight": False,
        "rollback_after_s": ROLLBACK_AFTER_S,
    }
    return write_inventory(tmp_path_factory.mktemp("fw") / "cut-np.py", lab, nodes[:1], firewall)


@pytest.fixture(scope="module")
def converged(lab: Lab, nodes: list[LabNode], inventory: str) -> Iterator[list[LabNode]]:
    for node in nodes:
        # The other table must exist before the first converge, so nft is needed first.
        sudo(
            lab, node, "command -v nft >/dev/null || { apt-get update -qq && "
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null; }",
        )  # fmt: skip
        sudo(lab, node, "nft add table ip docker_sim && nft add chain ip docker_sim c")
    first = run_pyinfra(DEPLOY, inventory=inventory)
    assert first.returncode == 0, first.output
    yield nodes
    # Back to the lab inventory's own firewall for the modules that follow.
    run_pyinfra(DEPLOY)
    for node in nodes:
        ssh(lab, node, "sudo nft delete table ip docker_sim")


def test_converge_loads_default_drop_table_and_keeps_other_tables(
    lab: Lab, converged: list[LabNode]
) -> None:
    for node in converged:
        assert "table inet gpunode" in tables(lab, node)
        assert OTHER_TABLE in tables(lab, node)
        assert "chain c" in sudo(lab, node, "nft list table ip docker_sim")
        # Docker's own table in the lab container (its embedded DNS) is there too.
        assert "table ip nat" in tables(lab, node)
        table = live_table(lab, node)
        assert "type filter hook input priority filter; policy drop;" in table
        assert "ip saddr @admin_ipv4 tcp dport 22 accept" in table
        assert "elements = { fd00:213:4::/64 }" in table
        assert "hook forward" not in table
        # The file on disk is exactly what is live, and the boot unit loads it.
        loads = sudo(
            lab, node, "unshare --net sh -c 'nft -f /etc/gpunode/firewall.nft && "
            "nft -s list table inet gpunode'",
        )  # fmt: skip
        assert loads == table
        assert sudo(lab, node, "systemctl is-enabled gpunode-firewall.service").strip() == (
            "enabled"
        )
        # A brand-new SSH login still works.
        assert ssh(lab, node, "sudo -n true").returncode == 0


def test_node_drops_what_is_not_allowed(lab: Lab, converged: list[LabNode]) -> None:
    target, client = converged

    def connect(port: int) -> tuple[int, str]:
        probe = f"timeout 3 bash -c '</dev/tcp/{target.address}/{port}'"
        result = ssh(lab, client, probe)
        return result.returncode, result.stderr

    # SSH from the second node is not in admin_networks: dropped, so the connect hangs.
    assert connect(22)[0] == 124
    assert connect(5555)[0] == 124
    # Allowed ports reach the kernel, which refuses them: nothing listens there.
    for port in (9109, 8080):
        code, error = connect(port)
        assert code == 1, f"port {port}: {code} {error}"
        assert "Connection refused" in error
    assert ssh(lab, target, "true").returncode == 0, "SSH from the control machine must work"


def test_second_run_changes_nothing(inventory: str, converged: list[LabNode]) -> None:
    second = run_pyinfra(DEPLOY, inventory=inventory)
    assert second.returncode == 0, second.output
    assert second.changed_operations() == {}


def test_rule_deleted_by_hand_is_restored_by_exactly_one_change(
    lab: Lab, inventory: str, converged: list[LabNode]
) -> None:
    node = converged[0]
    before = live_table(lab, node)
    handle = sudo(
        lab, node, "nft -a list chain inet gpunode input | grep 'dport { 9109, 9400 }' | "
        "sed 's/.*# handle //'",
    ).strip()  # fmt: skip
    sudo(lab, node, f"nft delete rule inet gpunode input handle {handle}")
    assert live_table(lab, node) != before

    dry = run_pyinfra("--dry", DEPLOY, inventory=inventory)
    assert dry.returncode == 0, dry.output
    assert dry.results is not None
    predicted = {(op["name"], h) for op in dry.results["plan"] for h in op["hosts_with_change"]}
    assert predicted == {(RULESET_OP, node.name)}

    repair = run_pyinfra(DEPLOY, inventory=inventory)
    assert repair.returncode == 0, repair.output
    assert changes(repair) == predicted
    assert live_table(lab, node) == before


def test_boot_unit_loads_the_same_table_again(lab: Lab, converged: list[LabNode]) -> None:
    node = converged[0]
    before = live_table(lab, node)
    sudo(lab, node, "nft delete table inet gpunode")
    assert "table inet gpunode" not in tables(lab, node)
    sudo(lab, node, "systemctl restart gpunode-firewall.service")
    assert live_table(lab, node) == before
    assert OTHER_TABLE in tables(lab, node)


def test_ruleset_without_the_control_address_is_refused_before_any_change(
    lab: Lab, converged: list[LabNode], cutting_inventory: str, control_address: str
) -> None:
    node = converged[0]
    before, sha_before = live_table(lab, node), persisted_sha256(lab, node)
    refused = run_pyinfra(DEPLOY, inventory=cutting_inventory)
    assert refused.returncode != 0
    assert f"{node.name}: firewall refused: " in refused.output
    assert f"from {control_address} to TCP port 22" in refused.output
    assert "Nothing was changed." in refused.output
    assert live_table(lab, node) == before
    assert persisted_sha256(lab, node) == sha_before
    candidate = ssh(lab, node, "test -e /var/lib/gpunode/firewall.candidate.nft")
    assert candidate.returncode == 1, "no candidate ruleset was uploaded"


def test_ruleset_that_cuts_ssh_is_rolled_back_and_the_run_fails_loudly(
    lab: Lab,
    inventory: str,
    converged: list[LabNode],
    cutting_inventory_without_preflight: str,
) -> None:
    node = converged[0]
    before, sha_before = live_table(lab, node), persisted_sha256(lab, node)
    # The preflight would refuse this ruleset; it is off, so the rollback guard is tested.
    cut = run_pyinfra(DEPLOY, inventory=cutting_inventory_without_preflight)
    assert cut.returncode != 0
    assert f"{node.name}: the new firewall ruleset would have cut SSH off" in cut.output
    assert "the previous ruleset was restored by the armed rollback" in cut.output
    assert "a new SSH login works again" in cut.output

    # The previous table is live, the persistent file was never replaced, SSH works anew.
    assert ssh(lab, node, "true").returncode == 0
    assert live_table(lab, node) == before
    assert persisted_sha256(lab, node) == sha_before
    assert OTHER_TABLE in tables(lab, node)
    timer = ssh(lab, node, "systemctl is-active gpunode-firewall-rollback.timer")
    assert timer.stdout.strip() == "inactive"
    refused = sudo(lab, node, "cat /var/lib/gpunode/firewall.candidate.nft")
    assert f"elements = {{ {converged[1].address}/32 }}" in refused

    again = run_pyinfra(DEPLOY, inventory=inventory)
    assert again.returncode == 0, again.output
    assert again.changed_operations() == {}, "the rollback restored everything"


# What a NAT rule makes the control host's new SSH logins come from (TEST-NET-2).
NAT_SOURCE = "198.51.100.7"
NAT_TABLE = "ip gpunode_drill_nat"


@pytest.fixture
def nat_disguise(lab: Lab, converged: list[LabNode], control_address: str) -> Iterator[LabNode]:
    """On the first node, new SSH logins of the control host reach sshd from NAT_SOURCE:
    source NAT in the input hook, after the filter (priority 100 > 0), so the firewall sees
    the control host and sshd ($SSH_CLIENT, the preflight's source) sees NAT_SOURCE."""
    node = converged[0]
    sudo(
        lab,
        node,
        f"nft add table {NAT_TABLE} && "
        f"nft add chain {NAT_TABLE} input '{{ type nat hook input priority 100; }}' && "
        f"nft add rule {NAT_TABLE} input ip saddr {control_address} tcp dport 22 "
        f"snat to {NAT_SOURCE}",
    )
    try:
        assert ssh(lab, node, "echo $SSH_CLIENT").stdout.split()[0] == NAT_SOURCE
        yield node
    finally:
        # Deleting the NAT table drops the NAT of every connection it made, the deleting
        # session's included (its replies would go to NAT_SOURCE): done by the node itself
        # once this session has ended.
        sudo(
            lab,
            node,
            f"systemd-run --quiet --collect --on-active=2s /usr/sbin/nft delete table {NAT_TABLE}",
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            seen = ssh(lab, node, "echo $SSH_CLIENT")
            if seen.returncode == 0 and seen.stdout.split()[0] == control_address:
                break
            time.sleep(0.5)
        assert f"table {NAT_TABLE}" not in sudo(lab, node, "nft list tables")


def test_a_cut_the_preflight_cannot_see_is_rolled_back_by_the_armed_timer(
    lab: Lab, inventory: str, nat_disguise: LabNode, tmp_path: Path
) -> None:
    # The preflight is on and sees this run's SSH session come from NAT_SOURCE, which the new
    # ruleset admits; the firewall sees the control host, which it does not: new logins are
    # cut, and the armed rollback must act. (Moved here from the lab VM: nftables' NAT and
    # filter hooks work the same in a container's own network namespace.)
    node = nat_disguise
    before, sha_before = live_table(lab, node), persisted_sha256(lab, node)
    cutting = write_inventory(
        tmp_path / "cut.py",
        lab,
        [node],
        {
            "enabled": True,
            "admin_networks": [f"{NAT_SOURCE}/32"],
            "rollback_after_s": ROLLBACK_AFTER_S,
        },
    )
    cut = run_pyinfra(DEPLOY, inventory=cutting)
    assert cut.returncode != 0, cut.output
    # The preflight passed (it is on, and saw NAT_SOURCE); the rollback guard acted.
    assert "firewall refused" not in cut.output
    assert f"{node.name}: the new firewall ruleset would have cut SSH off" in cut.output
    assert "the previous ruleset was restored by the armed rollback" in cut.output
    assert "a new SSH login works again" in cut.output
    timer = ssh(lab, node, "systemctl is-active gpunode-firewall-rollback.timer")
    assert timer.stdout.strip() == "inactive"
    assert live_table(lab, node) == before
    assert persisted_sha256(lab, node) == sha_before
    # The refused ruleset is kept for the operator to read.
    refused = sudo(lab, node, "cat /var/lib/gpunode/firewall.candidate.nft")
    assert f"elements = {{ {NAT_SOURCE}/32 }}" in refused
    assert ssh(lab, node, "sudo -n true").returncode == 0


def test_nothing_is_left_changed_after_a_rollback(inventory: str, converged: list[LabNode]) -> None:
    again = run_pyinfra(DEPLOY, inventory=inventory)
    assert again.returncode == 0, again.output
    assert again.changed_operations() == {}


def test_disabled_firewall_removes_only_gpunode_table(
    lab: Lab, converged: list[LabNode], tmp_path: Path
) -> None:
    disabled = write_inventory(tmp_path / "off.py", lab, converged, {"enabled": False})
    off = run_pyinfra(DEPLOY, inventory=disabled)
    assert off.returncode == 0, off.output
    for node in converged:
        assert "table inet gpunode" not in tables(lab, node)
        assert OTHER_TABLE in tables(lab, node)
        paths = (
            "/etc/gpunode/firewall.nft /etc/systemd/system/gpunode-firewall.service "
            "/var/lib/gpunode/firewall.*"
        )
        leftovers = ssh(lab, node, f"ls -d {paths}")
        assert leftovers.returncode != 0
        assert leftovers.stdout == ""
    again = run_pyinfra(DEPLOY, inventory=disabled)
    assert again.returncode == 0, again.output
    assert again.changed_operations() == {}

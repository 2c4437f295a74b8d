"""Firewall checks: gpunode's own nftables table, default-drop input, persistent at boot."""

from __future__ import annotations

from typing import Any

import pytest

from gpunode.model import DesiredState

# gpunode's own table (the node's other tables are not its business), the file it is loaded
# from and the unit that loads it at boot.
TABLE = "inet gpunode"
RULESET_PATH = "/etc/gpunode/firewall.nft"
UNIT_NAME = "gpunode-firewall.service"


@pytest.fixture
def wanted(desired: DesiredState) -> DesiredState:
    if not desired.firewall.enabled:
        pytest.skip("firewall.enabled is false for this host in the inventory")
    return desired


def test_gpunode_table_is_live_with_default_drop_input(host: Any, wanted: DesiredState) -> None:
    table = host.check_output(f"nft list table {TABLE}")
    assert "hook input" in table
    assert "policy drop;" in table


def test_ssh_port_is_allowed_from_the_admin_networks(host: Any, wanted: DesiredState) -> None:
    table = host.check_output(f"nft list table {TABLE}")
    assert f"tcp dport {wanted.sshd.port} accept" in table


def test_ruleset_never_flushes_other_tables(host: Any, wanted: DesiredState) -> None:
    ruleset = host.file(RULESET_PATH)
    assert ruleset.user == "root" and not ruleset.mode & 0o022
    assert "flush ruleset" not in ruleset.content_string


def test_ruleset_is_loaded_at_boot(host: Any, wanted: DesiredState) -> None:
    assert host.service(UNIT_NAME).is_enabled


def test_no_rollback_is_pending(host: Any, wanted: DesiredState) -> None:
    state = host.run("systemctl is-active gpunode-firewall-rollback.timer").stdout.strip()
    assert state != "active"

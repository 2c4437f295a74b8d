"""Verify any node, lab or production, with testinfra.

    pytest tests/verify --hosts=ssh://admin@node1 --sudo          # desired state: defaults
    pytest tests/verify --inventory inventories/prod.py [--limit h100_nodes]

With --inventory, hosts, connection settings and each host's desired state come from the
inventory (the same one the deploy used); OpenSSH does the connecting, with the inventory's
key and known_hosts, and strict host key checking unless the inventory relaxes it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from gpunode.model import DesiredState

_fleet: dict[str, DesiredState] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--inventory", help="pyinfra inventory: hosts and their desired state")
    parser.addoption("--limit", help="only these hosts or groups (comma-separated)")


def pytest_configure(config: pytest.Config) -> None:
    inventory_path = config.getoption("--inventory")
    if not inventory_path:
        return
    from gpunode.cli import load_inventory
    from gpunode.inventory import fleet_of

    inventory = load_inventory(inventory_path)
    fleet = fleet_of(inventory, inventory_path)
    wanted = set(filter(None, (config.getoption("--limit") or "").split(",")))
    hosts = [
        host for host in inventory if not wanted or host.name in wanted or wanted & set(host.groups)
    ]
    if not hosts:
        raise pytest.UsageError(f"no hosts in {inventory_path} match --limit {wanted}")
    directory = Path(tempfile.mkdtemp(prefix="gpunode-verify-"))
    ssh_config = directory / "ssh_config"
    ssh_config.write_text(
        "".join(_ssh_config_block(host.name, host.data, directory) for host in hosts)
    )
    config.option.hosts = ",".join(f"ssh://{host.name}" for host in hosts)
    config.option.ssh_config = str(ssh_config)
    config.option.sudo = any(host.data.get("_sudo") for host in hosts)
    _fleet.update({host.name: fleet.for_host(host.name) for host in hosts})


# testinfra asks OpenSSH for a shared connection (ControlMaster auto, ControlPersist 60 s on
# its command line) but names no socket for it unless told, and OpenSSH shares nothing without
# one: every check's command was then a connection of its own, a key exchange and a login each
# (hundreds per host). With a socket, one connection per host serves every check.


def _ssh_config_block(name: str, data: Any, directory: Path) -> str:
    lines = [f"Host {name}", f"  HostName {data.get('ssh_hostname') or name}"]
    lines.append(f"  ControlPath {directory}/%C")
    if data.get("ssh_user"):
        lines.append(f"  User {data.get('ssh_user')}")
    if data.get("ssh_port"):
        lines.append(f"  Port {data.get('ssh_port')}")
    if data.get("ssh_key"):
        lines += [f"  IdentityFile {data.get('ssh_key')}", "  IdentitiesOnly yes"]
    if data.get("ssh_known_hosts_file"):
        lines.append(f"  UserKnownHostsFile {data.get('ssh_known_hosts_file')}")
    strict = data.get("ssh_strict_host_key_checking") or "yes"
    lines += [f"  StrictHostKeyChecking {strict}", "  BatchMode yes", ""]
    return "\n".join(lines) + "\n"


@pytest.fixture
def desired(host: Any) -> DesiredState:
    """The host's desired state from --inventory, else gpunode's defaults."""
    return _fleet.get(host.backend.host.name, DesiredState())

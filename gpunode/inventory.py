"""Desired state for a whole pyinfra inventory, validated once before any host is touched."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pyinfra.api.exceptions import PyinfraError

from gpunode.model import (
    DesiredState,
    build_desired_state,
    check_host_name,
    check_scrape_addresses,
)

logger = logging.getLogger("pyinfra")


class InvalidInventory(PyinfraError):
    """Inventory data that gpunode refuses to act on; carries one line per problem."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        count = len(lines)
        super().__init__(
            f"invalid inventory data, {count} problem{'s' if count != 1 else ''}; "
            "nothing was changed on any host:\n  " + "\n  ".join(lines)
        )


@dataclass(frozen=True)
class Fleet:
    """Validated desired state of every host in an inventory."""

    source: str
    hosts: dict[str, DesiredState]
    # Per host, what the operator should know about its valid state (Advisory.render lines).
    notes: dict[str, list[str]] = field(default_factory=dict)

    def for_host(self, name: str) -> DesiredState:
        return self.hosts[name]


def validate_hosts(
    source: str, hosts: Iterable[tuple[str, dict[str, Any]]], today: datetime.date | None = None
) -> Fleet:
    """Build every host's desired state; raise InvalidInventory listing all problems, the
    fleet's own included (two hosts scraped at one address).

    ``today`` dates the advisories (a branch's end of life); default: the real today."""
    states: dict[str, DesiredState] = {}
    addresses: list[tuple[str, DesiredState, str | None]] = []
    lines: list[str] = []
    notes: dict[str, list[str]] = {}
    for name, data in hosts:
        state, problems = build_desired_state(data)
        problems += check_host_name(name, state)
        states[name] = state
        address = data.get("ssh_hostname")
        addresses.append((name, state, str(address) if address else None))
        lines.extend(problem.render(source, name) for problem in problems)
        notes[name] = [advisory.render(source, name) for advisory in state.advisories(today)]
    lines.extend(
        problem.render(source, name) for name, problem in check_scrape_addresses(addresses)
    )
    if lines:
        raise InvalidInventory(lines)
    return Fleet(source, states, notes)


def fleet_of(inventory: Any, source: str) -> Fleet:
    """Validate every host of a pyinfra Inventory (all hosts, not only --limit'ed ones)."""
    return validate_hosts(source, ((host.name, host.data.dict()) for host in inventory))


_fleets: dict[int, Fleet] = {}


def desired_state() -> DesiredState:
    """The current host's desired state, inside a pyinfra deploy.

    The first call validates the whole inventory; pyinfra runs deploy files once per host,
    and a bad host anywhere must stop the run before any operation executes anywhere.
    """
    from pyinfra import host

    return current_fleet().for_host(host.name)


def current_fleet() -> Fleet:
    """The running pyinfra inventory's validated fleet, every host of it (validated once
    per inventory, its notes logged then): a role that looks at other hosts (the
    monitoring host's scrape targets) reads them here."""
    from pyinfra import state

    inventory = state.inventory
    fleet = _fleets.get(id(inventory))
    if fleet is None:
        fleet = fleet_of(inventory, _inventory_source())
        _fleets[id(inventory)] = fleet
        for name in fleet.hosts:
            for note in fleet.notes.get(name, []):
                logger.warning(note)
    return fleet


def _inventory_source() -> str:
    """The inventory argument of the running pyinfra command, for error messages.

    Deploy files run in greenlets where click's context is not visible, so the command line
    is parsed again with pyinfra's own parser (no side effects with resilient parsing).
    """
    import sys

    from pyinfra_cli.cli import cli

    try:
        context = cli.make_context("pyinfra", sys.argv[1:], resilient_parsing=True)
        return str(context.params.get("inventory") or "inventory")
    except Exception:  # an embedding program's argv need not be pyinfra's
        return "inventory"

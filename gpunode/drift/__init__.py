"""The nightly drift check: facts from every host against the inventory's desired state."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpunode.control.exits import ConfigurationError
from gpunode.drift.findings import DriftResult
from gpunode.inventory import fleet_of
from gpunode.sanitize import MAX_REPORT_TEXT_CHARS, clean_text

# How long a node's DCGM diagnostic may take: level 2 is about two minutes on an idle node
# (facts/dcgm.py), longer on one still finishing its work.
DCGM_DIAG_DEADLINE_S = 1200


def select_hosts(inventory: Any, limit: str | None) -> list[Any]:
    """Hosts named in ``limit`` (host or group names, comma-separated), else all."""
    wanted = set(filter(None, (limit or "").split(",")))
    hosts = [h for h in inventory if not wanted or h.name in wanted or wanted & set(h.groups)]
    if wanted and not hosts:  # a usage error (exit status 2), never "no drift found"
        raise ConfigurationError(f"--limit {limit} matches no host or group")
    return hosts


def run_drift(
    inventory: Any,
    source: str,
    limit: str | None = None,
    progress: Callable[[str], None] | None = None,
    dcgm_diag_level: int | None = None,
    host_timeout_s: float | None = None,
) -> DriftResult:
    """Gather NodeState from the selected hosts in parallel and evaluate every rule; with
    ``dcgm_diag_level``, DCGM's diagnostic too on the hosts that declare DCGM.
    ``host_timeout_s``: how long each host may take to answer (default HOST_LIMITS')."""
    from facts.node import NodeState
    from gpunode.drift.gather import HOST_LIMITS, gather_fact, make_state
    from gpunode.drift.rules import evaluate

    fleet = fleet_of(inventory, source)
    hosts = select_hosts(inventory, limit)
    state = make_state(inventory)
    limits = (
        HOST_LIMITS if host_timeout_s is None else replace(HOST_LIMITS, deadline_s=host_timeout_s)
    )
    values, unreachable = gather_fact(state, NodeState, hosts, progress=progress, limits=limits)
    if dcgm_diag_level is not None:
        add_dcgm_diag(state, fleet, hosts, values, dcgm_diag_level, host_timeout_s)
    # Why a host was not checked is often the node's own words (an SSH banner, an error):
    # cleaned here, as findings clean theirs, before any report shows them.
    result = DriftResult(
        unreachable={report_text(name): report_text(reason) for name, reason in unreachable.items()}
    )
    for name, facts in sorted(values.items()):
        if isinstance(facts, dict) and not facts.get("complete"):
            reason = "stopped answering during the check (output cut short)"
            result.unreachable[report_text(name)] = reason
            continue
        result.checked_hosts.append(report_text(name))
        result.findings.extend(evaluate(name, fleet.for_host(name), facts))
    return result


def dcgm_hosts(fleet: Any, names: list[str]) -> list[str]:
    """The hosts of ``names`` whose inventory declares DCGM (the others skip its diagnostic)."""
    return [name for name in names if fleet.for_host(name).dcgm.enabled]


def add_dcgm_diag(
    state: Any,
    fleet: Any,
    hosts: list[Any],
    values: dict[str, Any],
    level: int,
    host_timeout_s: float | None = None,
) -> None:
    """Each answering host that declares DCGM gets a ``dcgm_diag`` section: the diagnostic's
    result, or why it could not be had (a host that stops answering during it, or takes
    longer than ``host_timeout_s``, by default DCGM_DIAG_DEADLINE_S)."""
    from facts.dcgm import DcgmDiag
    from gpunode.drift.gather import HOST_LIMITS, gather_fact
    from gpunode.drift.shape import unreadable_section

    answering = [name for name, facts in values.items() if isinstance(facts, dict)]
    wanted = set(dcgm_hosts(fleet, answering))
    chosen = [host for host in hosts if host.name in wanted]
    if not chosen:
        return
    limits = replace(HOST_LIMITS, deadline_s=host_timeout_s or DCGM_DIAG_DEADLINE_S)
    diag, failed = gather_fact(state, DcgmDiag, chosen, limits=limits, level=level)
    for host in chosen:
        section = diag.get(host.name)
        if not isinstance(section, dict):
            section = unreadable_section(failed.get(host.name, "no answer"))
        values[host.name] = {**values[host.name], "dcgm_diag": section}


def report_text(text: str) -> str:
    return clean_text(str(text), MAX_REPORT_TEXT_CHARS)


def stderr_progress(total: int) -> Callable[[str], None]:
    done = 0

    def report(host: str) -> None:
        nonlocal done
        done += 1
        if sys.stderr.isatty():
            sys.stderr.write(f"\r{done}/{total} hosts checked ({report_text(host)})\033[K")
            if done == total:
                sys.stderr.write("\n")

    return report

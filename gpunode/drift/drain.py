"""Health-driven drain (``gpunode drift --drain critical``): a scheduler node with a critical
finding is drained, its reason ``gpunode: drift <finding ids>``; a node gpunode drained for
drift is resumed once its check is clean.

Only drains of gpunode's drift are ever resumed or re-worded: a node drained by a person,
another tool or a gpunode rollout (any other reason), or DOWN, FAIL or FAILING whatever its
reason (a drain would clear FAIL and replace the reason; a resume would put a node someone
declared broken back in service), is left as it is, critical findings or not. A node that
was not checked (unreachable) is left as it is: no finding is no proof of health.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from gpunode.drift.findings import DriftResult, Severity
from gpunode.sanitize import clean_text
from gpunode.scheduler import (
    GPUNODE_REASON_PREFIX,
    HELD_STATES,
    NodeStatus,
    Scheduler,
    bounded_reason,
)

DRIFT_REASON_PREFIX = f"{GPUNODE_REASON_PREFIX} drift"


@dataclass(frozen=True)
class DrainAction:
    node: str
    action: str  # drain, resume, keep (nothing to do), leave (someone else's drain)
    reason: str = ""
    note: str = ""


def drift_reason(ids: Collection[str]) -> str:
    return bounded_reason(DRIFT_REASON_PREFIX, sorted(ids))


def is_drift_drain(status: NodeStatus) -> bool:
    return status.drained and ((status.reason or "") + " ").startswith(DRIFT_REASON_PREFIX + " ")


def plan(
    result: DriftResult, scheduled: Collection[str], status: dict[str, NodeStatus]
) -> list[DrainAction]:
    """What to do with each checked scheduler node (``scheduled``: those the inventory makes
    scheduler nodes; ``status``: what the scheduler says of them)."""
    critical: dict[str, set[str]] = {}
    for finding in result.findings:
        if finding.severity is Severity.CRITICAL:
            critical.setdefault(finding.host, set()).add(finding.id)
    actions = []
    for node in sorted(set(result.checked_hosts) & set(scheduled)):
        found = status.get(node)
        ids = critical.get(node, set())
        if found is None:
            actions.append(DrainAction(node, "keep", note="the scheduler does not know it"))
        elif found.state in HELD_STATES or (found.drained and not is_drift_drain(found)):
            word = found.state if found.state in HELD_STATES else "drained"
            note = f"{word} by someone else ({found.reason or 'no reason'}): left alone"
            actions.append(DrainAction(node, "leave", note=clean_text(note, 400)))
        elif ids:
            wanted = drift_reason(ids)
            if found.drained and found.reason == wanted:
                actions.append(DrainAction(node, "keep", wanted, "drained for drift already"))
            else:
                actions.append(DrainAction(node, "drain", wanted, ", ".join(sorted(ids))))
        elif found.drained:  # a drift drain, and the node is clean now
            actions.append(DrainAction(node, "resume", note="clean again"))
    return actions


def apply(scheduler: Scheduler, actions: list[DrainAction]) -> list[str]:
    """Drain and resume as planned; one line per node that was or was not changed, safe to
    print on a terminal (node and scheduler text cleaned)."""
    lines = []
    for action in actions:
        if action.action == "drain":
            scheduler.drain(action.node, action.reason)
            lines.append(f"{action.node}: drained ({action.reason})")
        elif action.action == "resume":
            scheduler.resume(action.node)
            lines.append(f"{action.node}: resumed ({action.note})")
        elif action.action == "leave":
            lines.append(f"{action.node}: {action.note}")
    return [clean_text(line, 600) for line in lines]

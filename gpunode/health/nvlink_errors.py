"""NVLink error counters: replay, recovery and CRC errors on a GPU's links.

Reads the probe's ``nvlink_errors`` of each GPU (``nvidia-smi nvlink -e``, parsed by
``gpunode.probe.gpu_record.parse_nvlink_errors``): per link the errors counted since the GPU's
last reset or driver load. A count over ``NVLINK_ERROR_LIMITS`` (any count: a healthy link
counts none) is a marginal link (``nvlink.errors``, a warning); a recovery error is the link
going down and retraining (``nvlink.recovery_errors``, critical). One finding per GPU and
class, naming every link over its limit with its counts; the id holds no count, so a baseline
keeps it while the counts grow, and ``found`` shows them growing. The counters of a GPU whose
output had lines not read are judged all the same (the drift check names those lines).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpunode.health.catalogue import FAILURE_CLASSES, NVLINK_ERROR_LIMITS, Confidence
from gpunode.health.finding import HealthFinding, gpu_subject

ERRORS = FAILURE_CLASSES["nvlink.errors"]
RECOVERY = FAILURE_CLASSES["nvlink.recovery_errors"]
WORDS = {"replay": "replay", "recovery": "recovery", "crc": "CRC"}
LINKS_SHOWN = 6


def _over(link: dict[str, Any], counters: tuple[str, ...]) -> dict[str, int]:
    return {
        name: link[name]
        for name in counters
        if isinstance(link.get(name), int) and link[name] > NVLINK_ERROR_LIMITS[name]
    }


def _finding(
    gpu: dict[str, Any], kind: str, bad: list[tuple[Any, dict[str, int]]]
) -> HealthFinding:
    failure = RECOVERY if kind == "recovery" else ERRORS
    described = [
        f"link {number}: " + ", ".join(f"{WORDS[name]} {count}" for name, count in counts.items())
        for number, counts in bad
    ]
    shown = "; ".join(described[:LINKS_SHOWN])
    if len(described) > LINKS_SHOWN:
        shown += f" (and {len(described) - LINKS_SHOWN} more links)"
    total = sum(sum(counts.values()) for _, counts in bad)
    return HealthFinding(
        id=f"gpu.{failure.name.replace('.', '_')}:{gpu.get('index')}",
        severity=failure.severity,
        expected="no NVLink errors since the last GPU reset",
        found=f"{total} on {len(bad)} link{'s' if len(bad) > 1 else ''}: {shown}",
        failure_class=failure.name,
        evidence=f"{gpu_subject(gpu)}: {(gpu.get('nvlink_errors') or {}).get('source')}: {shown}",
        confidence=Confidence.REPORTED,
        remedy=failure.remedy,
        if_it_persists=failure.if_it_persists,
    )


def judge(report: dict[str, Any]) -> Iterator[HealthFinding]:
    for gpu in report.get("gpus") or []:
        if gpu.get("lost"):
            continue
        links = (gpu.get("nvlink_errors") or {}).get("links") or []
        recovering = [(link.get("link"), _over(link, ("recovery",))) for link in links]
        marginal = [(link.get("link"), _over(link, ("replay", "crc"))) for link in links]
        if bad := [(number, counts) for number, counts in recovering if counts]:
            yield _finding(gpu, "recovery", bad)
        if bad := [(number, counts) for number, counts in marginal if counts]:
            yield _finding(gpu, "errors", bad)

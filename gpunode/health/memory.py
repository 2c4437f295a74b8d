"""GPU memory health: uncorrectable ECC errors, row remapping, retired pages.

What the driver counts and flags (NVIDIA's memory error management guide, with the
dynamic page retirement guide for GPUs before Ampere): an uncorrectable error since the last
reset, SRAM errors past NVIDIA's threshold (SRAM is never remapped), a row remap waiting for
a reset or one that failed (NVIDIA's RMA condition), a page retirement waiting for a driver
reload. The finding ids are those the drift check has always used for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from itertools import chain
from typing import Any

from gpunode.health.catalogue import FAILURE_CLASSES, Confidence
from gpunode.health.finding import HealthFinding, gpu_bus_id, gpu_subject


def _found(failure_class: str, finding_id: str, expected: str, found: str,
           evidence: str) -> HealthFinding:  # fmt: skip
    failure = FAILURE_CLASSES[failure_class]
    return HealthFinding(
        id=finding_id, severity=failure.severity, expected=expected, found=found,
        failure_class=failure.name, evidence=evidence, confidence=Confidence.REPORTED,
        remedy=failure.remedy, if_it_persists=failure.if_it_persists,
    )  # fmt: skip


def _by_memory(gpu: dict[str, Any], scope: str) -> str:
    """'(SRAM 1, DRAM 2)' where the driver splits the count, else ''."""
    counts = ((gpu.get("ecc_memory") or {}).get(scope)) or {}
    named = [f"{memory.upper()} {counts[memory]}" for memory in ("sram", "dram")
             if counts.get(memory)]  # fmt: skip
    return f" ({', '.join(named)})" if named else ""


def _ecc(gpu: dict[str, Any], label: str, subject: str) -> Iterator[HealthFinding]:
    errors = gpu.get("ecc_errors") or {}
    volatile = (errors.get("volatile") or {}).get("uncorrected")
    aggregate = (errors.get("aggregate") or {}).get("uncorrected")
    if volatile:
        yield _found(
            "memory.uncorrectable_ecc", f"gpu.ecc_uncorrectable:{label}",
            "no uncorrectable ECC errors",
            f"{volatile} uncorrectable ECC errors since the last reset"
            f"{_by_memory(gpu, 'volatile')}",
            f"{subject}: volatile uncorrected ECC count {volatile}",
        )  # fmt: skip
    elif aggregate:
        yield _found(
            "memory.uncorrectable_ecc_history", f"gpu.ecc_uncorrectable_history:{label}",
            "no uncorrectable ECC errors in the GPU's life",
            f"{aggregate} uncorrectable ECC errors before the last reset"
            f"{_by_memory(gpu, 'aggregate')}",
            f"{subject}: aggregate uncorrected ECC count {aggregate}, volatile {volatile}",
        )  # fmt: skip
    if (gpu.get("ecc_memory") or {}).get("sram_threshold_exceeded"):
        yield _found(
            "memory.sram_threshold_exceeded", f"gpu.sram_threshold_exceeded:{label}",
            "SRAM errors below NVIDIA's threshold", "SRAM threshold exceeded",
            f"{subject}: sram_threshold_exceeded Yes{_by_memory(gpu, 'aggregate')}",
        )  # fmt: skip


def _rows(gpu: dict[str, Any], label: str, subject: str) -> Iterator[HealthFinding]:
    rows = gpu.get("remapped_rows") or {}
    counts = (
        f"remapped rows: {rows.get('correctable')} correctable, "
        f"{rows.get('uncorrectable')} uncorrectable"
    )
    if rows.get("failure"):
        yield _found("memory.row_remap_failure", f"gpu.row_remap_failure:{label}",
                     "row remapping works", "failed",
                     f"{subject}: remapping failure flag set; {counts}")  # fmt: skip
    elif rows.get("pending"):
        yield _found("memory.row_remap_pending", f"gpu.row_remap_pending:{label}",
                     "no pending row remap", "pending",
                     f"{subject}: remapping pending flag set; {counts}")  # fmt: skip


def _pages(gpu: dict[str, Any], label: str, subject: str) -> Iterator[HealthFinding]:
    pages = gpu.get("retired_pages") or {}
    single, double = pages.get("single_bit") or 0, pages.get("double_bit") or 0
    listed = f"retired pages: {single} single-bit, {double} double-bit"
    if pages.get("pending"):
        yield _found("memory.page_retirement_pending", f"gpu.page_retirement_pending:{label}",
                     "none pending", "pending",
                     f"{subject}: pending retirement; {listed}")  # fmt: skip
    if single + double:
        yield _found("memory.retired_pages", f"gpu.retired_pages:{label}", "no retired pages",
                     f"{single + double} retired", f"{subject}: {listed}")  # fmt: skip


def judge(report: dict[str, Any]) -> Iterator[HealthFinding]:
    for gpu in report.get("gpus") or []:
        label, subject = str(gpu.get("index")), gpu_subject(gpu)
        bus = gpu_bus_id(gpu.get("pci_bus_id"))
        for finding in chain(
            _ecc(gpu, label, subject), _rows(gpu, label, subject), _pages(gpu, label, subject)
        ):
            yield replace(finding, gpu=bus)

"""The probe's report as node_exporter textfile metrics (Prometheus text format 0.0.4).

``gpu_probe --prometheus FILE`` (run by ``roles.gpu_metrics``' timer) renders its report
with this module, which lies beside it on the node (``installed_probe_files``). The probe
the drift check ships over SSH does not carry it. Standard library only, like the probe.

Names follow Prometheus' conventions: base units in the name (bytes, watts, hertz, celsius,
seconds, a 0-1 ratio for utilisation), ``_total`` only for counters (values that only grow
until the GPU or driver resets them), ``_info`` for labels worth a join. Every GPU series
carries ``gpu`` (the enumeration index), ``uuid`` and ``pci_bus_id``; a value the record does
not have is left out, never written as 0. ``monitoring/`` alerts on these names.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, NamedTuple, Protocol

from gpunode.probe.gpu_record import CLOCK_EVENT_REASON_BITS, Result


class Runs(Protocol):
    """What ``certificate_expiry`` needs of the probe's ``System``."""

    def run(self, argv: list[str], timeout: float = ...) -> Any: ...


MIB_BYTES = 1024 * 1024
MHZ_HERTZ = 1_000_000
# NVML's clock event (throttle) reasons; each is written 0 or 1 where the GPU reports any.
KNOWN_CLOCK_EVENT_REASONS = tuple(sorted(CLOCK_EVENT_REASON_BITS.values()))


def _label_value(value: object) -> str:
    text = "" if value is None else str(value)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _metric_labels(**labels: object) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{_label_value(value)}"' for key, value in labels.items()) + "}"


def _number(value: object) -> str | None:
    """A sample value in Prometheus' text format; None for what is not a number."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value == value else "NaN"
    return None


def _get(record: dict[str, Any] | None, *path: str) -> Any:
    value: Any = record
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _scaled(value: Any, factor: float) -> Any:
    if isinstance(value, bool):  # a mode or flag: 0 or 1
        return int(value) if factor == 1 else None
    if not isinstance(value, (int, float)):
        return None
    scaled = value * factor
    return int(scaled) if isinstance(value, int) and float(factor).is_integer() else scaled


class MetricFamily(NamedTuple):
    name: str
    kind: str  # gauge or counter
    help: str
    # One GPU record -> (extra labels, value) samples; a None value is left out.
    samples: Any


def _one(*path: str, factor: float = 1) -> Any:
    def samples(gpu: dict[str, Any]) -> list[tuple[dict[str, object], Any]]:
        return [({}, _scaled(_get(gpu, *path), factor))]

    return samples


def _each(label: str, values: dict[str, tuple[str, ...]], factor: float = 1) -> Any:
    def samples(gpu: dict[str, Any]) -> list[tuple[dict[str, object], Any]]:
        return [({label: name}, _scaled(_get(gpu, *path), factor)) for name, path in values.items()]

    return samples


def _ecc_errors(gpu: dict[str, Any]) -> list[tuple[dict[str, object], Any]]:
    return [
        ({"scope": scope, "type": kind}, _get(gpu, "ecc_errors", scope, kind))
        for scope in ("volatile", "aggregate")
        for kind in ("corrected", "uncorrected")
    ]


def _clock_event_reasons(gpu: dict[str, Any]) -> list[tuple[dict[str, object], Any]]:
    active = gpu.get("clock_event_reasons")
    if not isinstance(active, list):
        return []
    names = sorted(set(KNOWN_CLOCK_EVENT_REASONS) | {str(name) for name in active})
    return [({"reason": name}, int(name in active)) for name in names]


def _nvlink_errors(gpu: dict[str, Any]) -> list[tuple[dict[str, object], Any]]:
    links = _get(gpu, "nvlink_errors", "links")
    if not isinstance(links, list):
        return []
    return [
        ({"link": link.get("link"), "counter": counter}, link.get(counter))
        for link in links
        if isinstance(link, dict)
        for counter in ("replay", "recovery", "crc")
    ]


def _gpu_info(gpu: dict[str, Any]) -> list[tuple[dict[str, object], Any]]:
    labels = {key: gpu.get(key) for key in ("name", "serial", "vbios_version")}
    return [(labels, 1)]


def _pstate(gpu: dict[str, Any]) -> list[tuple[dict[str, object], Any]]:
    match = re.fullmatch(r"P([0-9]{1,2})", str(gpu.get("performance_state") or ""))
    return [({}, int(match.group(1)) if match else None)]


CLOCKS = {"graphics": "graphics", "sm": "sm", "memory": "memory", "video": "video"}

GPU_METRICS = (
    MetricFamily("gpunode_gpu_info", "gauge", "GPU identity (value 1)", _gpu_info),
    MetricFamily("gpunode_gpu_utilization_ratio", "gauge",
                 "fraction of the last sample period a kernel ran on the GPU (0-1)",
                 _one("utilization_percent", "gpu", factor=0.01)),
    MetricFamily("gpunode_gpu_memory_utilization_ratio", "gauge",
                 "fraction of the last sample period device memory was read or written (0-1)",
                 _one("utilization_percent", "memory", factor=0.01)),
    MetricFamily("gpunode_gpu_memory_used_bytes", "gauge",
                 "framebuffer memory in use (without the driver's reserved part)",
                 _one("memory_mib", "used", factor=MIB_BYTES)),
    MetricFamily("gpunode_gpu_memory_total_bytes", "gauge", "framebuffer memory in all",
                 _one("memory_mib", "total", factor=MIB_BYTES)),
    MetricFamily("gpunode_gpu_temperature_celsius", "gauge", "GPU core temperature",
                 _one("temperature_c", "gpu")),
    MetricFamily("gpunode_gpu_memory_temperature_celsius", "gauge", "GPU memory (HBM) temperature",
                 _one("temperature_c", "memory")),
    MetricFamily("gpunode_gpu_power_draw_watts", "gauge", "power draw",
                 _one("power_w", "draw")),
    MetricFamily("gpunode_gpu_power_limit_watts", "gauge", "enforced power limit",
                 _one("power_w", "limit")),
    MetricFamily("gpunode_gpu_power_default_limit_watts", "gauge", "default power limit",
                 _one("power_w", "default_limit")),
    MetricFamily("gpunode_gpu_clock_hertz", "gauge", "current clock, per clock domain",
                 _each("clock", {name: ("clocks_mhz", "current", key)
                                 for name, key in CLOCKS.items()}, factor=MHZ_HERTZ)),
    MetricFamily("gpunode_gpu_clock_max_hertz", "gauge", "maximum clock, per clock domain",
                 _each("clock", {name: ("clocks_mhz", "max", key)
                                 for name, key in CLOCKS.items()}, factor=MHZ_HERTZ)),
    MetricFamily("gpunode_gpu_clock_event_reason", "gauge",
                 "1 while a clock event (throttle) reason is active, else 0",
                 _clock_event_reasons),
    MetricFamily("gpunode_gpu_performance_state", "gauge", "performance state (0 = P0, fastest)",
                 _pstate),
    MetricFamily("gpunode_gpu_ecc_mode", "gauge", "1 if ECC is on",
                 _one("ecc_mode", "current")),
    MetricFamily("gpunode_gpu_ecc_errors_total", "counter",
                 "ECC errors: volatile since the last driver load, aggregate over the GPU's life",
                 _ecc_errors),
    MetricFamily("gpunode_gpu_remapped_rows_total", "counter", "rows remapped, by error type",
                 _each("type", {"correctable": ("remapped_rows", "correctable"),
                                "uncorrectable": ("remapped_rows", "uncorrectable")})),
    MetricFamily("gpunode_gpu_remapped_rows_pending", "gauge",
                 "1 if a row remap waits for a GPU reset", _one("remapped_rows", "pending")),
    MetricFamily("gpunode_gpu_remapped_rows_failure", "gauge", "1 if row remapping failed",
                 _one("remapped_rows", "failure")),
    MetricFamily("gpunode_gpu_sram_threshold_exceeded", "gauge",
                 "1 if uncorrectable SRAM errors passed NVIDIA's threshold",
                 _one("ecc_memory", "sram_threshold_exceeded")),
    MetricFamily("gpunode_gpu_lost", "gauge",
                 "1 if the GPU answers no query (GPU is lost, fallen off the bus)", _one("lost")),
    MetricFamily("gpunode_gpu_recovery_action", "gauge",
                 "the driver's recovery action (NVML's value: 0 none, 1 GPU reset, 2 node reboot, "
                 "3 drain P2P, 4 drain and reset)", _one("recovery_action")),
    MetricFamily("gpunode_gpu_retired_pages_total", "counter", "pages retired, by cause",
                 _each("cause", {"single_bit": ("retired_pages", "single_bit"),
                                 "double_bit": ("retired_pages", "double_bit")})),
    MetricFamily("gpunode_gpu_retired_pages_pending", "gauge",
                 "1 if a page retirement waits for a GPU reset", _one("retired_pages", "pending")),
    MetricFamily("gpunode_gpu_nvlink_links_active", "gauge", "NVLinks up",
                 _one("nvlink", "active")),
    MetricFamily("gpunode_gpu_nvlink_links", "gauge", "NVLinks the driver lists",
                 _one("nvlink", "total")),
    MetricFamily("gpunode_gpu_nvlink_errors_total", "counter",
                 "NVLink errors per link since the GPU's last reset (nvidia-smi nvlink -e), by "
                 "counter: replay, recovery, crc", _nvlink_errors),
    MetricFamily("gpunode_gpu_pcie_link_generation", "gauge", "current PCIe link generation",
                 _one("pcie", "gen_current")),
    MetricFamily("gpunode_gpu_pcie_link_generation_max", "gauge", "maximum PCIe link generation",
                 _one("pcie", "gen_max")),
    MetricFamily("gpunode_gpu_pcie_link_width_lanes", "gauge", "current PCIe link width",
                 _one("pcie", "width_current")),
    MetricFamily("gpunode_gpu_pcie_link_width_max_lanes", "gauge", "maximum PCIe link width",
                 _one("pcie", "width_max")),
    MetricFamily("gpunode_gpu_persistence_mode", "gauge", "1 if persistence mode is on",
                 _one("persistence_mode")),
    MetricFamily("gpunode_gpu_mig_mode", "gauge", "1 if MIG mode is on",
                 _one("mig_mode", "current")),
    MetricFamily("gpunode_gpu_mig_mode_pending", "gauge", "1 if MIG mode is on after a reset",
                 _one("mig_mode", "pending")),
)  # fmt: skip


class Expected(NamedTuple):
    """What the inventory expects (``roles.gpu_metrics`` passes it), for alerts to compare."""

    gpu_count: int | None = None
    nvlinks_per_gpu: int | None = None
    persistence_mode: bool | None = None


NOTHING_EXPECTED = Expected()


def _family(name: str, kind: str, help_text: str, samples: list[tuple[str, str]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    return lines + [f"{name}{labels} {value}" for labels, value in samples]


def _certificate_samples(certificates: list[Result]) -> list[list[tuple[str, str]]]:
    expiry, readable = [], []
    for certificate in certificates:
        labels = _metric_labels(path=certificate.get("path"))
        not_after = certificate.get("not_after_seconds")
        readable.append((labels, str(int(not_after is not None))))
        if not_after is not None:
            expiry.append((labels, str(not_after)))
    return [expiry, readable]


def render_prometheus(
    report: dict[str, Any],
    expected: Expected = NOTHING_EXPECTED,
    certificates: Sequence[Result] = (),
) -> str:
    """node_exporter textfile metrics for a probe report (node-local health mode).

    ``expected``: the inventory's GPU and NVLink counts, written beside what is found so the
    alert rules compare the two; ``certificates``: ``certificate_expiry`` results.
    """
    gpus = [gpu for gpu in report.get("gpus") or [] if isinstance(gpu, dict)]
    lines = _family(
        "gpunode_gpu_probe_ok", "gauge", "1 if the GPU probe could read the GPUs",
        [(_metric_labels(state=report.get("state")), str(int(report.get("state") == "ok")))],
    )  # fmt: skip
    lines += _family("gpunode_gpus", "gauge", "GPUs the driver reports", [("", str(len(gpus)))])
    if expected.gpu_count is not None:
        lines += _family(
            "gpunode_gpus_expected", "gauge", "GPUs the inventory expects "
            "(expected_hardware.gpu_count)", [("", str(expected.gpu_count))],
        )  # fmt: skip
    versions = report.get("driver_versions") or {}
    module = report.get("kernel_module") or {}
    driver_labels = _metric_labels(
        driver_version=report.get("driver_version"),
        cuda_driver_version=report.get("cuda_driver_version"),
        kernel_module_version=module.get("version"),
        kernel_module_flavor=module.get("flavor"),
    )
    lines += _family(
        "gpunode_gpu_driver_info", "gauge", "NVIDIA driver and CUDA driver API versions (value 1)",
        [(driver_labels, "1")],
    )  # fmt: skip
    if versions.get("mismatch") is not None:
        lines += _family(
            "gpunode_gpu_driver_version_mismatch", "gauge",
            "1 if kernel module, userspace driver and packages disagree on the version",
            [("", str(int(bool(versions["mismatch"]))))],
        )  # fmt: skip
    for family in GPU_METRICS:
        samples = []
        for gpu in gpus:
            base = {
                "gpu": gpu.get("index"),
                "uuid": gpu.get("uuid"),
                "pci_bus_id": gpu.get("pci_bus_id"),
            }
            for extra, value in family.samples(gpu):
                text = _number(value)
                if text is not None:
                    samples.append((_metric_labels(**base, **extra), text))
        lines += _family(family.name, family.kind, family.help, samples)
    if expected.nvlinks_per_gpu is not None:
        lines += _family(
            "gpunode_gpu_nvlink_links_expected", "gauge",
            "NVLinks per GPU the inventory expects up (expected_hardware.nvlink_links_per_gpu)",
            [("", str(expected.nvlinks_per_gpu))],
        )  # fmt: skip
    if expected.persistence_mode is not None:
        lines += _family(
            "gpunode_gpu_persistence_mode_expected", "gauge",
            "1 if the inventory wants persistence mode on (gpu_settings.persistence_mode)",
            [("", str(int(expected.persistence_mode)))],
        )  # fmt: skip
    counts: dict[tuple[str, str, str], int] = {}
    for event in (report.get("xid_events") or {}).get("events") or []:
        key = (
            _label_value(event.get("xid")),
            _label_value(event.get("pci")),
            _label_value(event.get("gpu_index")),
        )
        counts[key] = counts.get(key, 0) + 1
    lines += _family(
        "gpunode_gpu_xid_events", "gauge",
        "XID events in the kernel log over the probe's window, per XID code and device",
        [(_metric_labels(xid=xid, pci=pci, gpu=gpu), str(count))
         for (xid, pci, gpu), count in sorted(counts.items())],
    )  # fmt: skip
    since = _event_seconds((report.get("xid_events") or {}).get("since"))
    if since is not None:
        lines += _family(
            "gpunode_gpu_xid_window_start_timestamp_seconds", "gauge",
            "start of the kernel log window the XID counts cover", [("", since)],
        )  # fmt: skip
    if certificates:
        expiry, readable = _certificate_samples(list(certificates))
        lines += _family(
            "gpunode_tls_certificate_not_after_timestamp_seconds", "gauge",
            "end of the certificate's validity (notAfter)", expiry,
        )  # fmt: skip
        lines += _family(
            "gpunode_tls_certificate_readable", "gauge", "1 if the certificate could be read",
            readable,
        )  # fmt: skip
    return "\n".join(lines) + "\n"


def _event_seconds(text: object) -> str | None:
    """The probe's ISO 8601 ``since`` as Unix seconds; None when it is not one."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)  # noqa: UP017 - nodes may run Python 3.10
    return str(int(moment.timestamp()))


OPENSSL_ENDDATE = ("openssl", "x509", "-noout", "-enddate", "-in")


def certificate_expiry(system: Runs, path: str) -> Result:
    """notAfter of the PEM certificate at ``path`` (read with openssl), as Unix seconds."""
    completed = system.run([*OPENSSL_ENDDATE, path], timeout=20.0)
    result: Result = {"path": path, "not_after_seconds": None}
    if completed.exit_code != 0:
        result["reason"] = (completed.stderr.strip() or "openssl failed")[:300]
        return result
    line = completed.stdout.strip()
    if not line.startswith("notAfter="):
        result["reason"] = f"unexpected openssl output {line[:120]!r}"
        return result
    try:
        # "notAfter=Dec  1 17:22:52 2027 GMT", the form ssl parses for its own certificates.
        result["not_after_seconds"] = int(ssl.cert_time_to_seconds(line[len("notAfter=") :]))
    except ValueError as error:
        result["reason"] = f"unreadable notAfter {line[:120]!r}: {error}"
    return result

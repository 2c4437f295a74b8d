"""The probe's node_exporter textfile: Prometheus names and units, and clean for promtool.

Rendered from the probe's reports of the lab's simulated GPUs (``lab.hwsim``, through
nvidia-smi and through NVML), with faults injected into the simulated state.
"""

from __future__ import annotations

import datetime
import os
import re
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpunode.probe import gpu_probe
from gpunode.probe.gpu_probe import Completed, collect, write_atomically
from gpunode.probe.textfile import Expected, certificate_expiry, render_prometheus

from .prometheus_tools import check_metrics
from .test_probe import XID_LINE, FakeNode, FakeNvml, hardware, share_dir  # noqa: F401

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")


def samples(text: str) -> dict[str, list[tuple[str, float]]]:
    """Metric name -> [(labels, value)] of an exposition."""
    found: dict[str, list[tuple[str, float]]] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        found.setdefault(match.group(1), []).append((match.group(2) or "", float(match.group(3))))
    return found


def value(text: str, name: str, **labels: str) -> float:
    wanted = [f'{key}="{label}"' for key, label in labels.items()]
    hits = [v for found, v in samples(text).get(name, []) if all(w in found for w in wanted)]
    assert len(hits) == 1, f"{name}{labels}: {hits}"
    return hits[0]


def report_of(state: dict[str, Any], nvml: bool = False, journal: str = "") -> dict[str, Any]:
    node = FakeNode(state, commands={"journalctl": Completed(0, journal, "")})
    return collect(node, FakeNvml(state) if nvml else None, "fake" if nvml else "off", None)


def assert_promtool_clean(text: str) -> None:
    checked = check_metrics(text)
    output = checked.stdout + checked.stderr
    assert checked.returncode == 0 and not output.strip(), output


@pytest.mark.parametrize("nvml", [False, True], ids=["nvidia-smi", "nvml"])
@pytest.mark.parametrize("profile", ["hgx-h100", "a100", "pcie-a10g"])
def test_every_rendered_output_is_clean_for_promtool(profile: str, nvml: bool) -> None:
    state = hardware(profile)
    state["gpus"][0]["clocks_event_reasons"].update(hw_thermal_slowdown=True)
    text = render_prometheus(
        report_of(state, nvml, XID_LINE + "\n"),
        Expected(gpu_count=len(state["gpus"]), nvlinks_per_gpu=2),
        [{"path": "/etc/gpunode/tls/node.crt", "not_after_seconds": 1830000000}],
    )
    assert_promtool_clean(text)
    found = samples(text)
    gpus = len(state["gpus"])
    for name in ("gpunode_gpu_temperature_celsius", "gpunode_gpu_memory_total_bytes",
                 "gpunode_gpu_power_limit_watts", "gpunode_gpu_persistence_mode"):  # fmt: skip
        assert len(found[name]) == gpus, name


def test_the_values_are_in_base_units() -> None:
    state = hardware("hgx-h100")
    gpu = state["gpus"][2]
    gpu["memory"]["used_mib"] = 1024
    gpu["power"]["draw"] = 312.5
    gpu["temperature"]["gpu"] = 71
    gpu["remapped_rows"].update(correctable=3, uncorrectable=1, pending="Yes")
    gpu["ecc_errors"]["volatile"].update(dram_uncorrectable=2)
    gpu["clocks_event_reasons"].update(gpu_idle=False, sw_power_cap=True)
    gpu["nvlinks"][5]["active"] = False
    text = render_prometheus(report_of(state), Expected(8, 18))
    uuid = gpu["uuid"]
    labels = {"gpu": "2", "uuid": uuid}
    assert value(text, "gpunode_gpu_memory_used_bytes", **labels) == 1024 * 1024 * 1024
    assert value(text, "gpunode_gpu_memory_total_bytes", **labels) == 81559 * 1024 * 1024
    assert value(text, "gpunode_gpu_power_draw_watts", **labels) == 312.5
    assert value(text, "gpunode_gpu_temperature_celsius", **labels) == 71
    assert value(text, "gpunode_gpu_utilization_ratio", **labels) == 0
    sm_hertz = value(text, "gpunode_gpu_clock_hertz", clock="sm", **labels)
    assert sm_hertz == gpu["clocks"]["sm"] * 1_000_000
    assert value(text, "gpunode_gpu_remapped_rows_total", type="correctable", **labels) == 3
    assert value(text, "gpunode_gpu_remapped_rows_total", type="uncorrectable", **labels) == 1
    assert value(text, "gpunode_gpu_remapped_rows_pending", **labels) == 1
    assert value(text, "gpunode_gpu_remapped_rows_pending", gpu="0") == 0
    errors = value(
        text, "gpunode_gpu_ecc_errors_total", scope="volatile", type="uncorrected", **labels
    )
    assert errors == 2
    assert value(text, "gpunode_gpu_clock_event_reason", reason="sw_power_cap", **labels) == 1
    assert value(text, "gpunode_gpu_clock_event_reason", reason="gpu_idle", **labels) == 0
    assert value(text, "gpunode_gpu_nvlink_links_active", **labels) == 17
    assert value(text, "gpunode_gpu_nvlink_links", **labels) == 18
    assert value(text, "gpunode_gpu_nvlink_links_expected") == 18
    assert value(text, "gpunode_gpus_expected") == 8
    assert value(text, "gpunode_gpus") == 8
    assert (
        value(text, "gpunode_gpu_pcie_link_width_lanes", **labels) == gpu["pcie"]["width_current"]
    )
    assert "# TYPE gpunode_gpu_ecc_errors_total counter" in text
    assert "# TYPE gpunode_gpu_remapped_rows_total counter" in text


def test_nvlink_error_counters_are_a_counter_per_link_and_kind() -> None:
    """What alerts take the increase of: each link's replay, recovery and CRC counts, as the
    probe read them with nvidia-smi nvlink -e; a GPU without NVLink has none."""
    state = hardware()
    state["gpus"][3]["nvlinks"][11]["errors"].update(replay=7, crc=2)
    text = render_prometheus(report_of(state))
    labels = {"gpu": "3", "uuid": state["gpus"][3]["uuid"], "link": "11"}
    assert value(text, "gpunode_gpu_nvlink_errors_total", counter="replay", **labels) == 7
    assert value(text, "gpunode_gpu_nvlink_errors_total", counter="crc", **labels) == 2
    assert value(text, "gpunode_gpu_nvlink_errors_total", counter="recovery", **labels) == 0
    assert len(samples(text)["gpunode_gpu_nvlink_errors_total"]) == 8 * 18 * 3
    assert "# TYPE gpunode_gpu_nvlink_errors_total counter" in text
    assert_promtool_clean(text)
    single = render_prometheus(report_of(hardware("pcie-a10g")))
    assert "gpunode_gpu_nvlink_errors_total{" not in single


def test_driver_versions_are_an_info_metric() -> None:
    text = render_prometheus(report_of(hardware("a100")))
    ((labels, one),) = samples(text)["gpunode_gpu_driver_info"]
    assert one == 1
    assert 'driver_version="535.54.03"' in labels and 'cuda_driver_version="12.2"' in labels


def test_xid_events_are_counted_per_code_and_device() -> None:
    second = XID_LINE.replace("11:59:00", "11:59:30").replace(": 79,", ": 48,")
    journal = "\n".join([XID_LINE, XID_LINE, second]) + "\n"
    text = render_prometheus(report_of(hardware(), journal=journal))
    assert_promtool_clean(text)
    assert value(text, "gpunode_gpu_xid_events", xid="79", pci="0000:2a:00") == 2
    assert value(text, "gpunode_gpu_xid_events", xid="48", pci="0000:2a:00") == 1
    window_start = value(text, "gpunode_gpu_xid_window_start_timestamp_seconds")
    assert window_start == gpu_probe.parse_since("2026-11-29T12:00:00Z").timestamp()


def test_mig_mode_leaves_utilization_out_and_says_mig() -> None:
    state = hardware("a100")
    state["gpus"][0]["mig_mode"]["current"] = "Enabled"
    for nvml in (False, True):
        text = render_prometheus(report_of(state, nvml))
        assert_promtool_clean(text)
        assert value(text, "gpunode_gpu_mig_mode", gpu="0") == 1
        assert value(text, "gpunode_gpu_mig_mode", gpu="1") == 0
        utilization = samples(text)["gpunode_gpu_utilization_ratio"]
        assert not [labels for labels, _ in utilization if 'gpu="0"' in labels]


def test_a_failed_probe_still_renders_clean_metrics() -> None:
    state = hardware()
    state["driver_loaded"] = False
    report = report_of(state)
    text = render_prometheus(report, Expected(gpu_count=8))
    assert_promtool_clean(text)
    assert value(text, "gpunode_gpu_probe_ok", state="driver_not_loaded") == 0
    assert value(text, "gpunode_gpus") == 0
    assert value(text, "gpunode_gpus_expected") == 8
    # The probe's last-resort report (a probe bug) has no section at all.
    assert_promtool_clean(render_prometheus({"state": "unreadable", "gpus": []}))


def test_hostile_label_values_are_escaped() -> None:
    state = hardware("pcie-a10g")
    state["gpus"][0]["name"] = 'evil"} 1\ngpunode_gpu_count 99 \\'
    text = render_prometheus(report_of(state))
    assert_promtool_clean(text)
    assert value(text, "gpunode_gpus") == 1


def self_signed(path: Path, not_after: datetime.datetime) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node-a")])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(not_after - datetime.timedelta(days=30))
        .not_valid_after(not_after)
        .sign(key, hashes.SHA256())
    )
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


def test_certificate_expiry_is_read_with_openssl(tmp_path: Path) -> None:
    """The node's real openssl reads a real certificate; what it cannot read is named."""
    not_after = datetime.datetime(2027, 12, 1, 17, 22, 52, tzinfo=datetime.UTC)
    self_signed(tmp_path / "node.crt", not_after)
    (tmp_path / "garbage.crt").write_text("not a certificate\n")
    system = gpu_probe.System()
    found = certificate_expiry(system, str(tmp_path / "node.crt"))
    assert found == {
        "path": str(tmp_path / "node.crt"),
        "not_after_seconds": int(not_after.timestamp()),
    }
    garbage = certificate_expiry(system, str(tmp_path / "garbage.crt"))
    assert garbage["not_after_seconds"] is None and garbage["reason"]
    missing = certificate_expiry(system, str(tmp_path / "absent.crt"))
    assert missing["not_after_seconds"] is None
    text = render_prometheus(report_of(hardware("pcie-a10g")), certificates=[found, garbage])
    assert_promtool_clean(text)
    expiry = samples(text)["gpunode_tls_certificate_not_after_timestamp_seconds"]
    assert expiry == [(f'{{path="{tmp_path / "node.crt"}"}}', not_after.timestamp())]
    readable = dict(samples(text)["gpunode_tls_certificate_readable"])
    assert readable == {
        f'{{path="{tmp_path / "node.crt"}"}}': 1,
        f'{{path="{tmp_path / "garbage.crt"}"}}': 0,
    }


def test_nvml_without_the_v2_memory_call_counts_reserved_memory_as_used() -> None:
    """Drivers before the v2 call: NVML's v1 ``used`` includes the driver's reserved part."""
    state = hardware("pcie-a10g")
    nvml = FakeNvml(state)
    del nvml.nvmlMemory_v2
    gpu = collect(FakeNode(state), nvml, "fake", None)["gpus"][0]
    memory = state["gpus"][0]["memory"]
    assert gpu["memory_mib"] == {
        "total": memory["total_mib"],
        "used": memory["reserved_mib"] + memory["used_mib"],
    }


# --- the textfile is written by root, through no link (issue 29, item 6) ------------------------


def test_the_textfile_is_written_whole_with_its_mode_and_nothing_left_beside_it(
    tmp_path: Path,
) -> None:
    target = tmp_path / "textfile" / "gpu_metrics.prom"
    write_atomically(str(target), "a 1\n")
    write_atomically(str(target), "a 2\n")
    assert target.read_text() == "a 2\n"
    assert (target.stat().st_mode & 0o777) == 0o644
    assert os.listdir(target.parent) == ["gpu_metrics.prom"]


def test_a_link_planted_at_a_temporary_name_is_never_written_through(tmp_path: Path) -> None:
    # The old temporary name was the PID's: anyone who may write in the textfile directory
    # could plant a link there to a file of root's.
    victim = tmp_path / "victim"
    victim.write_text("root's own file\n")
    directory = tmp_path / "textfile"
    directory.mkdir()
    for pid in range(os.getpid() - 2, os.getpid() + 3):
        (directory / f".gpu_metrics.prom.{pid}").symlink_to(victim)
    write_atomically(str(directory / "gpu_metrics.prom"), "a 1\n")
    assert victim.read_text() == "root's own file\n"
    assert (directory / "gpu_metrics.prom").read_text() == "a 1\n"


def test_a_linked_textfile_or_directory_is_refused_and_its_target_kept(tmp_path: Path) -> None:
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    (elsewhere / "gpu_metrics.prom").write_text("kept\n")
    linked_directory = tmp_path / "textfile"
    linked_directory.symlink_to(elsewhere)
    with pytest.raises(gpu_probe.UnsafeTextfile, match="symbolic link"):
        write_atomically(str(linked_directory / "gpu_metrics.prom"), "a 1\n")
    linked_file = tmp_path / "real" / "gpu_metrics.prom"
    linked_file.parent.mkdir()
    linked_file.symlink_to(elsewhere / "gpu_metrics.prom")
    with pytest.raises(gpu_probe.UnsafeTextfile, match="symbolic link"):
        write_atomically(str(linked_file), "a 1\n")
    assert (elsewhere / "gpu_metrics.prom").read_text() == "kept\n"
    assert os.listdir(elsewhere) == ["gpu_metrics.prom"]
    assert os.listdir(linked_file.parent) == ["gpu_metrics.prom"]  # no temporary left

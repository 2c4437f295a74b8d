"""``gpunode triage``: a support bundle's files judged offline, with the drift check's health
judges, on real captures (tests/fixtures, PROVENANCE.md).

No public nvidia-bug-report.log.gz with a stated source was found: the bug report here is put
together in the layout NVIDIA's nvidia-bug-report.sh writes (its section rule of 44
underscores, a blank line, the section's title; its prologue; ``append_command`` putting
``nvidia-smi --query --unit`` after ``--query`` in one section; the kernel messages found
again under "dmesg:"), each section's body a real capture.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpunode.cli import main
from gpunode.triage import Unreadable, triage
from gpunode.triage.inputs import BUG_REPORT, KERNEL, QUERY, SECTION_RULE, kind_of
from lab.hwsim import nvidia_smi

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H100_CAPTURE = FIXTURES / "nvidia-smi-capture/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
A100_XML = FIXTURES / "nvidia-smi-xml/a100-sxm4-v12.xml"
NVLINK_A100 = FIXTURES / "nvlink/nvidia-smi.nvlink.status.a100"
XID79 = FIXTURES / "kernel-log/xid79-fallen-off-the-bus.syslog"
SXIDS = FIXTURES / "kernel-log/nvswitch-sxid.menthos.log"


def fixture(relative: str) -> Path:
    return FIXTURES / relative


def ids(paths: list[Path]) -> dict[str, str]:
    """Each finding's id -> its severity."""
    return {f.id: f.severity.value for f in triage(paths).result.findings}


def run(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str, str]:
    code = main(["triage", *arguments])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- each kind, told by its content ------------------------------------------------------------


@pytest.mark.parametrize(
    ("relative", "kind"),
    [("nvidia-smi-xml/a100-sxm4-v12.xml", "nvidia-smi -q -x"),
     ("nvidia-smi-xml/quadro-p400.xml", "nvidia-smi -q -x"),
     ("page-retirement/orig_nvsmi8_output.txt", "nvidia-smi -q"),
     ("nvlink/nvidia-smi.nvlink.status.a100", "nvidia-smi nvlink -s"),
     ("nvlink/bad_nvlink_status.txt", "nvidia-smi nvlink -s"),
     ("nvlink/nvidia-smi.nvlink.errors.a100-sxm4-40gb.535.161.08", "nvidia-smi nvlink -e"),
     ("ibstat/ibstat.47.0.h100.all.active.0", "ibstat"),
     ("kernel-log/xid79-fallen-off-the-bus.syslog", "kernel log"),
     ("kernel-log/nvswitch-sxid.menthos.log", "kernel log"),
     ("syslog/1dev_6flap_syslog", "kernel log"),
     ("dcgm/dcgmi-diag-r1-j.3.1.0.8gpu.pass.txt", "dcgmi diag -j"),
     ("nvidia-smi-lost/device-handle-unknown-error.610.57.04.txt",
      "nvidia-smi (a GPU it cannot open)")],
)  # fmt: skip
def test_each_capture_is_told_by_its_content(relative: str, kind: str) -> None:
    assert kind_of(fixture(relative).read_text(encoding="utf-8")) == kind


# --- real captures -----------------------------------------------------------------------------


def test_a_healthy_8_gpu_hgx_a100_node_has_no_finding(capsys: pytest.CaptureFixture[str]) -> None:
    files = [NVLINK_A100, fixture("ibstat/ibstat.47.0.a100.all.active.0"),
             fixture("dcgm/dcgmi-diag-r1-j.3.1.0.8gpu.pass.txt"), A100_XML]  # fmt: skip
    code, out, err = run(capsys, *map(str, files))
    assert code == 0, out
    assert "0 findings" in out and err.count("gpunode triage:") == 4


def test_ib_ports_down_on_a_real_h100_node_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, str(fixture("ibstat/ibstat.47.0.h100.some.down.0")))
    assert code == 1
    for port in ("mlx5_2/1", "mlx5_7/1", "mlx5_8/1"):
        assert f"ib.port:{port}" in out
    assert "3 findings (3 critical)" in out


def test_a_gpu_nvidia_smi_cannot_open_is_lost_and_the_kernel_log_confirms_it() -> None:
    found = triage([fixture("nvidia-smi-lost/device-handle-unknown-error.610.57.04.txt")])
    lost = {f.id: f for f in found.result.findings}["gpu.lost:0000:34:00.0"]
    assert lost.severity.value == "critical" and lost.remedy == "reboot"


def test_the_xml_and_nvlink_status_of_one_node_are_judged_together(tmp_path: Path) -> None:
    lines = NVLINK_A100.read_text(encoding="utf-8").split("\n")
    lines[2] = lines[2].split(":")[0] + ": <inactive>"  # GPU 0's second link
    status = tmp_path / "nvlink-s.txt"
    status.write_text("\n".join(lines), encoding="utf-8")
    found = triage([status, A100_XML]).result.findings
    assert [(f.id, f.severity.value) for f in found] == [("gpu.nvlink_inactive:0", "critical")]
    assert "serial" in found[0].evidence  # the XML's GPU, named by its serial


def test_nvlink_error_counters_file_is_judged_on_the_gpus_it_lists(tmp_path: Path) -> None:
    """The real A100 counters are clean; one link's recovery errors are critical, named on the
    GPU the counters file lists."""
    capture = fixture("nvlink/nvidia-smi.nvlink.errors.a100-sxm4-40gb.535.161.08")
    assert ids([capture]) == {}
    text = capture.read_text(encoding="utf-8")
    line = "\t Link 4: Recovery Errors: 0\n"
    at = text.index(line, text.index("GPU 6: "))
    faulty = tmp_path / "nvlink-e.txt"
    faulty.write_text(text[:at] + line.replace(": 0", ": 2") + text[at + len(line) :])
    assert ids([faulty]) == {"gpu.nvlink_recovery_errors:6": "critical"}
    (finding,) = triage([faulty]).result.findings
    assert finding.found == "2 on 1 link: link 4: recovery 2"
    assert finding.remedy == "reset_gpu" and finding.failure_class == "nvlink.recovery_errors"


def test_sxids_and_xids_of_a_kernel_log_with_their_remedies(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "--json", str(SXIDS))
    assert code == 1
    document = json.loads(out)
    findings = {f["id"]: f for f in document["findings"]}
    fatal = findings["nvswitch.sxid:20034:0000:c2:00.0"]
    assert fatal["severity"] == "critical"
    assert fatal["health"]["failure_class"] == "nvswitch.sxid_fatal"
    assert fatal["health"]["remedy"] == "reboot" and "NVSwitch 0" in fatal["health"]["evidence"]
    assert findings["gpu.xid:64:0000:0f:00"]["health"]["failure_class"] == "xid"
    assert document["inputs"] == [{"file": str(SXIDS), "kind": "kernel log",
                                   "read": [f"kernel log ({SXIDS})"], "not_judged": 0}]  # fmt: skip


def test_retired_pages_from_nvidia_smi_q_text() -> None:
    found = ids([fixture("page-retirement/bad_nvsmi8_output.txt")])
    assert found["gpu.page_retirement_pending:1"] == "warning"
    assert ids([fixture("page-retirement/orig_nvsmi8_output.txt")]) == {}


# --- nvidia-bug-report.log.gz ----------------------------------------------------------------


def section(title: str, body: str) -> str:
    return f"{SECTION_RULE}\n\n{title}\n\n{body}\n"


def bug_report(tmp_path: Path, query: str, kernel: str) -> Path:
    """A bug report in nvidia-bug-report.sh's layout, its sections real captures."""
    text = "".join([
        section("Start of NVIDIA bug report log file.  Please include this file, along",
                "with a detailed description of your problem, when reporting a graphics\n"
                "nvidia-bug-report.sh Version: 31831145\n"),
        section("*** /etc/issue", "*** ls: -rw-r--r-- 1 root root 20 /etc/issue\nUbuntu 22.04\n"),
        section("Scanning kernel log files for NVIDIA kernel messages:",
                "\n  journalctl -b -0:\n" + kernel),
        section("/usr/bin/lspci -d \"10de:*\" -v -xxx", "00:09.0 3D controller: NVIDIA"),
        section("dmesg:", kernel),
        section("/usr/bin/nvidia-smi --query",
                query + "\n/usr/bin/nvidia-smi --query --unit\n\nNo unit found.\n"),
        section("End of NVIDIA bug report log file.", ""),
    ])  # fmt: skip
    path = tmp_path / "nvidia-bug-report.log.gz"
    path.write_bytes(gzip.compress(text.encode()))
    return path


def h100_query() -> str:
    capture = H100_CAPTURE.read_text(encoding="utf-8")
    return nvidia_smi.capture_sections(capture)["load :: query (-q)"]


def test_a_bug_report_is_split_into_the_sections_triage_judges(tmp_path: Path) -> None:
    kernel = XID79.read_text(encoding="utf-8") + SXIDS.read_text(encoding="utf-8")
    path = bug_report(tmp_path, h100_query(), kernel)
    done = triage([path])
    (source,) = done.sources
    assert source.kind == BUG_REPORT
    assert [piece.kind for piece in source.pieces] == [QUERY, KERNEL]
    assert "'Scanning kernel log files" in source.pieces[1].origin
    assert "dmesg:" in source.skipped and "*** /etc/issue" in source.skipped
    found = {f.id: f for f in done.result.findings}
    # The XID is in two sections, counted once; the H100 of nvidia-smi's query is read whole.
    assert "(2 times)" not in found["gpu.xid:79:0000:10:00"].found
    assert "nvswitch.sxid:20034:0000:c2:00.0" in found
    assert not any(key.startswith(("gpu.pcie", "gpu.throttle", "triage.")) for key in found)


def test_a_bug_report_of_a_healthy_h100_has_no_finding(tmp_path: Path) -> None:
    path = bug_report(tmp_path, h100_query(), "No NVIDIA kernel messages found.\n")
    assert triage([path]).result.findings == []


def test_a_lost_gpu_in_a_bug_reports_query_is_critical(tmp_path: Path) -> None:
    query = h100_query()
    head, gpu = query.split("GPU 00000000:00:09.0\n", 1)
    lost = "\n".join(
        line.split(" : ")[0] + " : GPU is lost" if " : " in line else line
        for line in gpu.split("\n")
    )
    path = bug_report(tmp_path, head + "GPU 00000000:00:09.0\n" + lost, "")
    finding = {f.id: f for f in triage([path]).result.findings}["gpu.lost:0"]
    assert finding.severity.value == "critical" and "GPU is lost" in finding.evidence


# --- what cannot be read -----------------------------------------------------------------------


def test_a_cut_xml_is_a_finding_that_says_why_not_a_crash(tmp_path: Path) -> None:
    cut = tmp_path / "cut.xml"
    cut.write_text(A100_XML.read_text(encoding="utf-8")[:5000], encoding="utf-8")
    (finding,) = triage([cut]).result.findings
    assert finding.id == "triage.unreadable:nvidia-smi -q -x"
    assert "not well-formed XML" in finding.found


@pytest.mark.parametrize(
    ("content", "words"),
    [(b"", "empty"), (b"hello world\n", "not an output triage reads"),
     (b"\x1f\x8b\x08\x00garbage", "a broken gzip file")],
)  # fmt: skip
def test_a_file_that_cannot_be_read_is_exit_2_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, words: str
) -> None:
    path = tmp_path / "attachment"
    path.write_bytes(content)
    code, out, err = run(capsys, str(path))
    assert code == 2 and out == ""
    (line,) = err.strip().split("\n")
    assert line.startswith(f"gpunode triage: {path}: ") and words in line


def test_a_missing_file_is_exit_2_with_a_json_error_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "--json", str(tmp_path / "nothing.xml"))
    assert code == 2 and "No such file" in err
    assert json.loads(out)["exit_code"] == 2


def test_two_gpu_listings_of_one_kind_are_refused(tmp_path: Path) -> None:
    with pytest.raises(Unreadable, match="a second GPU listing"):
        triage([A100_XML, fixture("nvidia-smi-xml/tesla-t4.xml")])


def test_node_text_reaches_the_report_cleaned(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(
        "Sep 10 01:02:03 node kernel: NVRM: Xid (PCI:0000:10:00): 79, pid=0, "
        "GPU has \x1b[31mfallen\x07 off the bus.\n",
        encoding="utf-8",
    )
    finding = {f.id: f for f in triage([log]).result.findings}["gpu.xid:79:0000:10:00"]
    assert "\x1b" not in finding.found and "\x07" not in finding.evidence


def test_every_kind_is_read_without_a_parser_error(tmp_path: Path) -> None:
    """Garbage of each kind's look is a finding or nothing, never an exception."""
    for text in (
        "<nvidia_smi_log><gpu>",
        "CA 'mlx5_0'\n\tnonsense",
        "GPU 0: x (UUID: GPU-1)\n  ?",
        '{"DCGM Diagnostic": 3}',
        "Attached GPUs : 2\nGPU 0000:01:00.0\n    x : y",
    ):
        path = tmp_path / "odd"
        path.write_text(text, encoding="utf-8")
        result: Any = triage([path]).result
        assert all(f.id.startswith(("triage.", "dcgm.")) for f in result.findings), text


# Text made of the pieces each kind is told by, so that fuzzing reaches the section readers.
PIECES = st.lists(
    st.sampled_from([SECTION_RULE, "\n", "\n\n", "dmesg:", "/usr/bin/nvidia-smi --query",
                     "Attached GPUs : 1", "GPU 00000000:01:00.0", "    Temperature",
                     "        GPU Current Temp : 99 C", "NVRM: Xid (PCI:0000:01:00): 79, x",
                     "nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 1, Fatal, x", "CA 'mlx5_0'",
                     "Start of NVIDIA bug report log file", "<nvidia_smi_log>", "{", "x : y"]),
    max_size=60,
).map("\n".join)  # fmt: skip


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(text=PIECES, compress=st.booleans())
def test_any_file_is_judged_or_refused_by_name_never_crashes(
    tmp_path: Path, text: str, compress: bool
) -> None:
    path = tmp_path / "attachment"
    data = text.encode()
    path.write_bytes(gzip.compress(data) if compress else data)
    try:
        done = triage([path])
    except Unreadable as error:
        assert str(error).startswith(str(path))
        return
    json.dumps(done.inputs())
    for finding in done.result.findings:
        assert finding.id and finding.severity


def test_a_lost_gpu_named_by_two_files_is_one_finding(tmp_path: Path) -> None:
    lost = fixture("nvidia-smi-lost/device-handle-unknown-error.610.57.04.txt")
    log = tmp_path / "kern.log"
    log.write_text(
        "Aug 25 10:00:00 node kernel: NVRM: Xid (PCI:0000:34:00): 79, pid=0, GPU has fallen "
        "off the bus.\n" + lost.read_text(encoding="utf-8"),
        encoding="utf-8",
    )
    again = tmp_path / "nvidia-smi.txt"
    again.write_text(lost.read_text(encoding="utf-8"), encoding="utf-8")
    found = [f for f in triage([lost, again, log]).result.findings if f.id.startswith("gpu.lost:")]
    assert [f.id for f in found] == ["gpu.lost:0000:34:00.0"]
    assert found[0].confidence == "reported"  # the kernel's XID 79 for the same bus


def test_a_gpu_the_xml_lists_is_not_lost_whatever_the_bus_ids_spelling(tmp_path: Path) -> None:
    words = fixture("nvidia-smi-lost/device-handle-unknown-error.610.57.04.txt").read_text()
    line = tmp_path / "nvidia-smi.txt"
    line.write_text(words.replace("0000:34:00.0", "0000:01:00.0"), encoding="utf-8")
    assert "0000:01:00.0" in line.read_text()
    assert triage([line, A100_XML]).result.findings == []  # its GPU is 00000000:01:00.0
    assert [f.id for f in triage([line]).result.findings] == ["gpu.lost:0000:01:00.0"]


def test_what_nvidia_smi_printed_instead_of_its_query_is_named(tmp_path: Path) -> None:
    failed = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running."
    )
    path = bug_report(tmp_path, failed, "")
    (finding,) = triage([path]).result.findings
    assert finding.id == "triage.unreadable:nvidia-smi -q"
    assert "couldn't communicate with the NVIDIA driver" in finding.found

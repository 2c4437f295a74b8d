"""lab/cpu.py: lab containers' and VMs' CPU read from the kernel's accounts and given to
whoever holds their lab (tests/tiers.py: the module a lab shard runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab import cpu

CID_A = "a" * 64
CID_B = "b" * 64


def test_the_longest_held_lab_a_lab_extends_is_its_owner() -> None:
    holders: dict[str, object] = {"gpunode-lab": "shard0", "gpunode-lab-shard1": "shard1"}
    assert cpu.owner_of("gpunode-lab", holders) == "shard0"
    # a module's lab of its own is named after its shard's lab
    assert cpu.owner_of("gpunode-lab-drill", holders) == "shard0"
    assert cpu.owner_of("gpunode-lab-shard1", holders) == "shard1"
    assert cpu.owner_of("gpunode-lab-shard1-ubuntu", holders) == "shard1"
    # a prefix that is not a whole lab name is not the lab's
    assert cpu.owner_of("gpunode-labx", holders) is None
    assert cpu.owner_of("other-lab", holders) is None
    assert cpu.lab_of("gpunode-lab-shard1-drill-1") == "gpunode-lab-shard1-drill"
    assert cpu.lab_of("gpunode-lab-vm-vm-1") == "gpunode-lab-vm-vm"


def test_cgroup_v1_and_v2_accounts_are_read_and_a_broken_one_is_none(tmp_path: Path) -> None:
    v1 = tmp_path / "cpuacct" / "docker" / CID_A
    v1.mkdir(parents=True)
    (v1 / "cpuacct.usage").write_text("2500000000\n")
    v2 = tmp_path / "system.slice" / f"docker-{CID_B}.scope"
    v2.mkdir(parents=True)
    (v2 / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n")
    (tmp_path / "system.slice" / "ssh.service").mkdir()
    found = cpu.container_cgroups((tmp_path / "cpuacct" / "docker", tmp_path / "system.slice"))
    assert found == {CID_A: v1, CID_B: v2}
    assert cpu.cgroup_cpu_s(v1) == 2.5
    assert cpu.cgroup_cpu_s(v2) == 1.5
    (v2 / "cpu.stat").write_text("usage_usec lots\n")
    assert cpu.cgroup_cpu_s(v2) is None
    assert cpu.cgroup_cpu_s(tmp_path / "gone") is None


def test_container_names_come_from_dockers_records_and_a_bad_record_is_skipped(
    tmp_path: Path,
) -> None:
    (tmp_path / CID_A).mkdir()
    (tmp_path / CID_A / "config.v2.json").write_text('{"Name": "/gpunode-lab-1"}')
    (tmp_path / CID_B).mkdir()
    (tmp_path / CID_B / "config.v2.json").write_text("{not json")
    assert cpu.container_names(tmp_path) == {CID_A: "gpunode-lab-1"}


def test_a_qemu_process_is_found_by_its_name_and_its_cpu_read(tmp_path: Path) -> None:
    ticks = os.sysconf("SC_CLK_TCK")

    def process(pid: int, argv: list[str], utime: int, stime: int, start: int) -> None:
        entry = tmp_path / str(pid)
        entry.mkdir()
        (entry / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        fields = ["S", "1", *["0"] * 9, str(utime), str(stime), *["0"] * 6, str(start), "0"]
        (entry / "stat").write_text(f"{pid} (qemu-system-x86) {' '.join(fields)}\n")

    process(40, ["qemu-system-x86_64", "-name", "gpunode-lab-vm-vm-1", "-m", "1024"], 3 * ticks,
            ticks, 777)  # fmt: skip
    process(41, ["/usr/bin/python3", "-name", "x"], 50 * ticks, 0, 1)
    process(42, ["qemu-system-x86_64", "-m", "64"], 9 * ticks, 0, 2)  # names no lab
    (tmp_path / "self").mkdir()
    assert cpu.qemu_usage(tmp_path) == {"40:777": ("gpunode-lab-vm-vm", 4.0)}


def test_the_meter_gives_each_samples_growth_to_the_holder_of_its_lab_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    usage: dict[str, tuple[str, float]] = {
        "old": ("gpunode-lab", 100.0),  # there before the meter: counts from its first sample
        "elsewhere": ("someone-else", 7.0),
    }
    monkeypatch.setattr(cpu, "container_cgroups", lambda: {})
    monkeypatch.setattr(cpu, "container_names", lambda: {})
    monkeypatch.setattr(cpu, "lab_usage", lambda names, cgroups: dict(usage))
    meter = cpu.LabCpuMeter(interval=3600)
    meter.sample()
    first, second = object(), object()
    meter.hold("gpunode-lab", first)
    meter.hold("gpunode-lab-shard1", second)
    usage["old"] = ("gpunode-lab", 110.0)
    usage["new"] = ("gpunode-lab-drill", 4.0)  # a module's own lab, made since: from zero
    usage["shard1"] = ("gpunode-lab-shard1", 2.5)
    usage["elsewhere"] = ("someone-else", 9.0)
    meter.sample()
    del usage["new"]  # removed: its account is gone, what it used stays counted
    usage["old"] = ("gpunode-lab", 111.0)
    assert meter.release("gpunode-lab") == 15.0
    usage["old"] = ("gpunode-lab", 150.0)  # nobody holds it now
    assert meter.release("gpunode-lab-shard1") == 2.5
    assert meter.unheld == 2.0 + 39.0
    assert meter.release("gpunode-lab") == 0.0  # released twice: nothing more


def test_the_meter_reads_a_real_processs_tree_as_a_lab(tmp_path: Path) -> None:
    """A real process named as qemu names a lab VM (``-name``): its CPU goes to the lab's
    holder (the meter's own thread sampling, as in a run)."""
    fake = tmp_path / "qemu-system-x86_64"
    fake.write_text(
        "import sys, time\n"
        "end = time.process_time() + 0.6\n"
        "while time.process_time() < end:\n"
        "    pass\n"
        "sys.stdout.write('done\\n'); sys.stdout.flush(); time.sleep(30)\n"
    )
    meter = cpu.LabCpuMeter(interval=0.1).start()
    holder = object()
    meter.hold("unit-test-lab-vm", holder)
    process = subprocess.Popen(
        [sys.executable, str(fake), "-name", "unit-test-lab-vm-vm-1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # argv[0] of the process is python, not qemu: the meter must not count it...
        assert process.stdout is not None and process.stdout.readline() == "done\n"
        assert meter.release("unit-test-lab-vm") == 0.0
    finally:
        process.kill()
        process.wait()
    meter.hold("unit-test-lab-vm", holder)
    # ...and one whose program is qemu's name is counted, with the CPU it used since it began.
    qemu = tmp_path / "bin" / "qemu-system-x86_64"
    qemu.parent.mkdir()
    qemu.symlink_to(sys.executable)
    process = subprocess.Popen(
        [str(qemu), str(fake), "-name", "unit-test-lab-vm-vm-1"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "done\n"
        meter.sample()
    finally:
        process.kill()
        process.wait()
    used = meter.release("unit-test-lab-vm")
    meter.stop()
    assert used >= 0.5, used

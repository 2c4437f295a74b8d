"""The lab's simulated UEFI firmware (lab.hwsim.firmware): the variables facts/secure_boot.py
reads, the console step that enrols a requested machine owner key, and the wrapper that lets
the real mokutil read them.

The enrolment is checked against the real mokutil's own variables (tests/fixtures/mokutil/lab,
PROVENANCE.md): the MokNew it wrote for ``--import`` of DKMS's key, and the MokListRT it then
read as "already enrolled".
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from facts.secure_boot import efi_variable_value
from lab.hwsim import firmware, node_files, simulator_paths
from lab.hwsim.hwstate import STATE_ENV

from .test_hwsim import LabNode

LAB_CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "mokutil" / "lab"


@pytest.fixture
def node(tmp_path: Path) -> LabNode:
    """An a100 lab node's files under a temporary root (test_hwsim.LabNode)."""
    return LabNode(tmp_path / "root", "a100", "lab-node-1")


def variable(node: LabNode, name: str) -> bytes:
    return (node.state_file.parent / firmware.NVRAM_NAME / name).read_bytes()


def as_the_fact_reads_it(node: LabNode, name: str) -> int | None:
    """The variable's value as facts/secure_boot.py reads it: ``od -An -tu1 -v``, then
    its value after the 4 attribute bytes."""
    path = node.state_file.parent / firmware.NVRAM_NAME / name
    od = subprocess.run(["od", "-An", "-tu1", "-v", str(path)], capture_output=True, text=True)
    assert od.returncode == 0, od.stderr
    return efi_variable_value([int(word) for word in od.stdout.split()])


def test_a_lab_node_boots_without_uefi_until_a_test_sets_it(node: LabNode) -> None:
    assert node.state()["firmware"] == firmware.factory()
    assert firmware.factory()["uefi"] is False  # what every lab node was before: a BIOS boot
    files = node_files("a100", "lab-node-1")
    assert files[f"/etc/systemd/system/{firmware.UNIT}"][0] == firmware.UNIT_TEXT
    assert firmware.DPKG_HOOK in files and firmware.MOKUTIL_WRAPPER_SOURCE in files
    # A VM's firmware is qemu's: nothing of it is simulated.
    vm_files = node_files("a100", "lab-vm-1", vm=True)
    assert not {firmware.DPKG_HOOK, f"/etc/systemd/system/{firmware.UNIT}"} & set(vm_files)
    # What the lab puts in system directories is left out of the file integrity check.
    assert {firmware.MOKUTIL_WRAPPER, firmware.DPKG_HOOK} <= set(simulator_paths())


def test_secure_boot_and_setup_mode_are_the_variables_the_fact_reads(node: LabNode) -> None:
    node.set("firmware.secure_boot", True)
    assert variable(node, firmware.SECURE_BOOT) == bytes([6, 0, 0, 0, 1])
    assert as_the_fact_reads_it(node, firmware.SECURE_BOOT) == 1
    assert as_the_fact_reads_it(node, firmware.SETUP_MODE) == 0
    node.set("firmware.setup_mode", True)
    assert as_the_fact_reads_it(node, firmware.SETUP_MODE) == 1
    node.set("firmware.secure_boot", False)
    assert as_the_fact_reads_it(node, firmware.SECURE_BOOT) == 0
    # shim's "validation disabled" is the presence of MokSBStateRT (mokutil's test).
    nvram = node.state_file.parent / firmware.NVRAM_NAME
    assert not (nvram / firmware.MOK_SB_STATE_RT).exists()
    node.set("firmware.shim_validation", False)
    assert (nvram / firmware.MOK_SB_STATE_RT).read_bytes() == bytes([6, 0, 0, 0, 1])
    node.set("firmware.shim_validation", True)
    assert not (nvram / firmware.MOK_SB_STATE_RT).exists()
    assert node.state()["firmware"] == {
        "uefi": False, "secure_boot": False, "setup_mode": True, "shim_validation": True,
    }  # fmt: skip


def test_a_state_from_before_the_firmware_gets_the_factory_one(node: LabNode) -> None:
    state = node.state()
    del state["firmware"]
    node.state_file.write_text(json.dumps(state))
    node.set("firmware.secure_boot", True)
    assert node.state()["firmware"] == {**firmware.factory(), "secure_boot": True}
    # A misspelt key is refused as every other state path is, and changes nothing.
    before = node.state_file.read_bytes()
    assert node.run("gpunode-lab-hw", "set", "firmware.secureboot", "true").returncode == 1
    assert node.state_file.read_bytes() == before


def test_the_console_step_enrols_what_mokutil_requested(node: LabNode) -> None:
    node.ok("gpunode-lab-hw", "firmware")
    nvram = node.state_file.parent / firmware.NVRAM_NAME
    # Nothing requested: MokManager has nothing to ask the console.
    refused = node.run("gpunode-lab-hw", "mok-manager")
    assert refused.returncode == 1
    assert "no enrolment request (mokutil --import) is pending" in refused.stderr
    (nvram / firmware.MOK_NEW).write_bytes((LAB_CAPTURES / "MokNew.efivar").read_bytes())
    (nvram / firmware.MOK_AUTH).write_bytes(bytes([7, 0, 0, 0]) + b"\0" * 32)
    node.ok("gpunode-lab-hw", "mok-manager")
    # The list the real mokutil then read as "already enrolled", byte for byte.
    enrolled = (nvram / firmware.MOK_LIST_RT).read_bytes()
    assert enrolled == (LAB_CAPTURES / "MokListRT.efivar").read_bytes()
    key = (LAB_CAPTURES / "dkms-mok.pub").read_bytes()
    assert key in enrolled
    # ... and listed as the one enrolled key, DKMS's (its certificate's SHA-1 fingerprint).
    listing = (LAB_CAPTURES / "list-enrolled.txt").read_text().splitlines()
    fingerprint = ":".join(f"{byte:02x}" for byte in hashlib.sha1(key).digest())
    assert listing[:2] == ["[key 1]", f"SHA1 Fingerprint: {fingerprint}"]
    assert "        Issuer: CN=DKMS module signing key" in listing
    assert not [line for line in listing if line.startswith("[key 2]")]
    assert not (nvram / firmware.MOK_NEW).exists() and not (nvram / firmware.MOK_AUTH).exists()
    # A second key joins the first.
    (nvram / firmware.MOK_NEW).write_bytes((LAB_CAPTURES / "MokNew.efivar").read_bytes())
    node.ok("gpunode-lab-hw", "mok-manager")
    assert (nvram / firmware.MOK_LIST_RT).read_bytes() == enrolled + enrolled[4:]


def test_the_mokutil_wrapper_is_there_while_mokutil_is(tmp_path: Path) -> None:
    real = tmp_path / firmware.REAL_MOKUTIL.lstrip("/")
    wrapper = tmp_path / firmware.MOKUTIL_WRAPPER.lstrip("/")
    wrapper.parent.mkdir(parents=True)
    assert firmware.sync_mokutil_wrapper(str(tmp_path)) is False and not wrapper.exists()
    # A stand-in for the real mokutil that says what it was given.
    real.parent.mkdir(parents=True)
    real.write_text('#!/bin/sh\necho "EFIVARFS_PATH=$EFIVARFS_PATH $*"\n')
    real.chmod(0o755)
    assert firmware.sync_mokutil_wrapper(str(tmp_path)) is True
    assert os.stat(wrapper).st_mode & 0o777 == 0o755
    text = wrapper.read_text().replace(firmware.REAL_MOKUTIL, str(real))
    wrapper.write_text(text)
    ran = subprocess.run([str(wrapper), "--sb-state"], capture_output=True, text=True)
    assert ran.stdout == "EFIVARFS_PATH=/sys/firmware/efi/efivars/ --sb-state\n"
    real.unlink()
    assert firmware.sync_mokutil_wrapper(str(tmp_path)) is False and not wrapper.exists()


def test_the_dpkg_hook_follows_mokutil_in_and_out(tmp_path: Path) -> None:
    (line,) = [x for x in firmware.DPKG_HOOK_TEXT.splitlines() if x.startswith("post-invoke=")]
    command = line.removeprefix("post-invoke=")
    for path in (firmware.REAL_MOKUTIL, firmware.MOKUTIL_WRAPPER, firmware.MOKUTIL_WRAPPER_SOURCE):
        (tmp_path / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        command = command.replace(path, str(tmp_path / path.lstrip("/")))
    source = tmp_path / firmware.MOKUTIL_WRAPPER_SOURCE.lstrip("/")
    source.write_text(firmware.MOKUTIL_WRAPPER_TEXT)
    wrapper = tmp_path / firmware.MOKUTIL_WRAPPER.lstrip("/")
    real = tmp_path / firmware.REAL_MOKUTIL.lstrip("/")
    subprocess.run(["sh", "-c", command], check=True)
    assert not wrapper.exists()
    real.write_text("#!/bin/sh\n")
    real.chmod(0o755)
    subprocess.run(["sh", "-c", command], check=True)
    assert wrapper.read_text() == firmware.MOKUTIL_WRAPPER_TEXT
    assert os.stat(wrapper).st_mode & 0o777 == 0o755
    real.unlink()
    subprocess.run(["sh", "-c", command], check=True)
    assert not wrapper.exists()


def test_only_the_node_s_own_state_mounts_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    # A state elsewhere (a test's, as every test here runs the doubles with) changes its
    # NVRAM files only: /sys/firmware and the mokutil wrapper are the node's.
    monkeypatch.setenv(STATE_ENV, "/tmp/elsewhere/hardware.json")
    assert not firmware.on_node()
    monkeypatch.delenv(STATE_ENV)
    assert firmware.on_node()

"""The VM part of the suite: the NVMe cache on a real kernel with real (emulated) NVMe drives.

One lab VM (conftest ``lab_vms``: Debian's own kernel under qemu, 1 GiB, four emulated NVMe
drives that the guest's real nvme-cli lists). It shows what a container cannot: a RAID0
array over several drives, assembled by mdadm with the kernel's md driver, its filesystem
mounted by UUID after the array at boot, back after a real reboot of the VM; and the
refusals on real devices (a filesystem, a partition table, a RAID signature) changing
nothing. deploys/fabric.py runs with a throw-away inventory that declares only the cache.

The module starts from blank drives, and leaves them blank.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from gpunode.probe.parsers import SECTION_COMMANDS, parse_section
from lab import Lab
from lab.vm import LabVm, reboot
from roles.nvme_cache import ARRAY_NAME, FILESYSTEM_LABEL

from .conftest import PyinfraRun, run_pyinfra, ssh, write_inventory

pytestmark = [pytest.mark.lab, pytest.mark.vm]

DEPLOY = "deploys/fabric.py"
CACHE_OPERATION = "NVMe cache | Cache filesystem on the chosen drives"
MOUNT_POINT = "/cache"


def sudo(lab: Lab, vm: LabVm, command: str) -> str:
    result = ssh(lab, vm, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def vm(lab_vms: list[LabVm]) -> LabVm:
    return lab_vms[0]


@pytest.fixture(scope="module")
def drives(lab: Lab, vm: LabVm) -> list[tuple[str, str]]:
    """(device path, serial) of the VM's drives in the order qemu was given them, read the
    way gpunode reads them (its `nvme list -o json` parser)."""
    listed = parse_section("nvme", sudo(lab, vm, SECTION_COMMANDS["nvme"]).splitlines())
    assert listed["state"] == "ok", listed
    by_serial = {drive["serial"]: drive["device_path"] for drive in listed["devices"]}
    assert sorted(by_serial) == sorted(vm.nvme_serials)
    return [(by_serial[serial], serial) for serial in vm.nvme_serials]


def reset(lab: Lab, vm: LabVm, drives: list[tuple[str, str]]) -> None:
    """No cache mounted, no array, no fstab or mdadm.conf entry, blank drives."""
    paths = " ".join(path for path, _ in drives)
    sudo(
        lab,
        vm,
        f"umount {MOUNT_POINT} 2>/dev/null; "
        f"for md in /dev/md/* /dev/md[0-9]*; do [ -e $md ] && mdadm --stop $md; done 2>/dev/null; "
        f"sed -i '\\#[[:space:]]{MOUNT_POINT}[[:space:]]#d' /etc/fstab; "
        "sed -i '/^ARRAY /d' /etc/mdadm/mdadm.conf; systemctl daemon-reload; "
        f"wipefs --all --quiet {paths}; udevadm settle; true",
    )
    assert sudo(lab, vm, f"wipefs --no-act --noheadings {paths}") == ""


@pytest.fixture(scope="module")
def blank(lab: Lab, vm: LabVm, drives: list[tuple[str, str]]) -> Any:
    reset(lab, vm, drives)
    yield
    reset(lab, vm, drives)


# How long boot waits for the cache's device. An emulated (TCG) guest on a shared CI machine
# runs udev's coldplug some fifty times slower than a server: the default 30 s can pass before
# udev has announced the array, and then boot goes on without the cache (nofail), as designed.
DEVICE_TIMEOUT_S = 300


def inventory(tmp_path: Path, lab: Lab, vm: LabVm, **cache: Any) -> str:
    data = {
        "nvme_cache": {
            "enabled": True,
            "mount_point": MOUNT_POINT,
            "device_timeout_s": DEVICE_TIMEOUT_S,
            **cache,
        }
    }
    return write_inventory(tmp_path / "vm_storage.py", lab, [vm], {vm.name: data})


def fingerprint(lab: Lab, vm: LabVm, drives: list[tuple[str, str]]) -> str:
    """What a cache run could change: signatures of every drive, arrays, mounts, config."""
    return sudo(
        lab,
        vm,
        "cat /proc/mdstat /etc/fstab /etc/mdadm/mdadm.conf; findmnt -rn -o TARGET,SOURCE; "
        + "; ".join(f"wipefs --no-act {path}" for path, _ in drives),
    )


def refused(lab: Lab, vm: LabVm, drives: list[tuple[str, str]], path: str) -> str:
    before = fingerprint(lab, vm, drives)
    run = run_pyinfra(DEPLOY, inventory=path)
    assert run.returncode == 1, run.output
    assert "Nothing was changed." in run.output
    assert f"{vm.name} (refused before any change)" in run.output
    assert fingerprint(lab, vm, drives) == before
    return run.output


def test_the_vm_runs_its_own_kernel_and_the_real_nvme_cli(
    lab: Lab, vm: LabVm, drives: list[tuple[str, str]]
) -> None:
    assert sudo(lab, vm, "uname -r").strip() == vm.kernel
    # nvme is Debian's nvme-cli, not the containers' double; md is the kernel's.
    assert sudo(lab, vm, "dpkg -S /usr/sbin/nvme").startswith("nvme-cli: /usr/sbin/nvme")
    modules = sudo(lab, vm, "modinfo -F filename md_mod raid0").split()
    assert [Path(module).name.split(".")[0] for module in modules] == ["md-mod", "raid0"]
    assert all(module.startswith(f"/lib/modules/{vm.kernel}/") for module in modules)
    # The GPUs are still the doubles of its profile.
    assert ssh(lab, vm, "nvidia-smi -L").stdout.startswith("GPU 0: NVIDIA A10G")


@pytest.fixture(scope="module")
def raid_inventory(tmp_path_factory: pytest.TempPathFactory, lab: Lab, vm: LabVm, drives) -> str:
    return inventory(
        tmp_path_factory.mktemp("vm-raid"), lab, vm, devices=[path for path, _ in drives[:3]]
    )


@pytest.fixture(scope="module")
def raid_run(blank: None, raid_inventory: str) -> PyinfraRun:
    run = run_pyinfra("-v", DEPLOY, inventory=raid_inventory)
    assert run.returncode == 0, run.output
    return run


def array_state(lab: Lab, vm: LabVm) -> dict[str, str]:
    """``mdadm --detail --export`` of the gpunode array."""
    output = sudo(lab, vm, f"mdadm --detail --export /dev/md/{ARRAY_NAME}")
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


def assert_cache_in_place(lab: Lab, vm: LabVm, drives: list[tuple[str, str]]) -> str:
    """The RAID0 over the first three drives, its xfs mounted at the mount point: its UUID."""
    members = sorted(Path(path).name for path, _ in drives[:3])
    mdstat = sudo(lab, vm, "cat /proc/mdstat")
    line = next(line for line in mdstat.splitlines() if line.startswith("md"))
    assert re.fullmatch(r"md\d+ : active raid0 .*", line), mdstat
    assert sorted(re.sub(r"\[\d+\]$", "", part) for part in line.split()[4:]) == members
    detail = array_state(lab, vm)
    assert detail["MD_LEVEL"] == "raid0"
    assert detail["MD_DEVICES"] == "3"
    assert detail["MD_NAME"].rsplit(":", 1)[-1] == ARRAY_NAME
    md = "/dev/" + line.split()[0]
    uuid = sudo(lab, vm, f"blkid -p -s UUID -o value {md}").strip()
    assert sudo(lab, vm, f"blkid -p -s LABEL -o value {md}").strip() == FILESYSTEM_LABEL
    source, fstype, options = sudo(
        lab, vm, f"findmnt -n -o SOURCE,FSTYPE,OPTIONS {MOUNT_POINT}"
    ).split()
    assert (Path(source).name, fstype) == (Path(md).name, "xfs")
    assert "noatime" in options.split(",")
    return uuid


def test_raid0_over_three_drives_is_assembled_formatted_and_mounted_by_uuid(
    lab: Lab, vm: LabVm, drives: list[tuple[str, str]], raid_run: PyinfraRun
) -> None:
    assert vm.name in raid_run.changed_operations()[CACHE_OPERATION]
    uuid = assert_cache_in_place(lab, vm, drives)
    fstab = [line.split() for line in sudo(lab, vm, "cat /etc/fstab").splitlines()]
    (entry,) = [fields for fields in fstab if len(fields) > 1 and fields[1] == MOUNT_POINT]
    assert entry[0] == f"UUID={uuid}"
    assert entry[2] == "xfs"
    assert {"nofail", "noatime"} <= set(entry[3].split(","))
    assert any(option.startswith("x-systemd.device-timeout=") for option in entry[3].split(","))
    md_uuid = array_state(lab, vm)["MD_UUID"]
    assert sudo(lab, vm, "grep ^ARRAY /etc/mdadm/mdadm.conf").split() == [
        "ARRAY",
        f"/dev/md/{ARRAY_NAME}",
        "metadata=1.2",
        f"UUID={md_uuid}",
    ]
    # The fourth drive was not chosen, and is still blank.
    assert sudo(lab, vm, f"wipefs --no-act --noheadings {drives[3][0]}") == ""


def systemctl_show(lab: Lab, vm: LabVm, unit: str, *properties: str) -> dict[str, list[str]]:
    """Properties of a systemd unit, each a list of words (systemctl quotes names that hold
    escapes, such as device units of /dev/disk/by-uuid)."""
    output = sudo(
        lab, vm, f"systemctl show {shlex.quote(unit)} " + " ".join(f"-p {p}" for p in properties)
    )
    return {
        key: shlex.split(value)
        for key, value in (line.split("=", 1) for line in output.splitlines() if "=" in line)
    }


def test_boot_mounts_the_cache_after_its_array_without_depending_on_it(
    lab: Lab, vm: LabVm, drives: list[tuple[str, str]], raid_run: PyinfraRun
) -> None:
    uuid = assert_cache_in_place(lab, vm, drives)
    unit = sudo(lab, vm, f"systemd-escape --path --suffix=mount {MOUNT_POINT}").strip()
    device = sudo(
        lab, vm, f"systemd-escape --path --suffix=device /dev/disk/by-uuid/{uuid}"
    ).strip()
    # The unit systemd's fstab generator makes of the entry: the filesystem by its UUID, after
    # that device's block-device target (once mounted, systemd shows the md device instead).
    generated = sudo(lab, vm, f"cat /run/systemd/generator/{unit}").splitlines()
    assert f"What=/dev/disk/by-uuid/{uuid}" in generated
    assert f"Where={MOUNT_POINT}" in generated
    assert f"After=blockdev@{device.removesuffix('.device')}.target" in generated
    # ... and so after the array that carries it.
    md = sudo(lab, vm, f"findmnt -n -o SOURCE {MOUNT_POINT}").strip()
    assert re.fullmatch(r"/dev/md\d+", md), md
    md_device = sudo(lab, vm, f"systemd-escape --path --suffix=device {md}").strip()
    assert md_device in systemctl_show(lab, vm, unit, "After")["After"]
    # nofail: boot wants the cache but goes on without it (a dead drive never stops boot).
    local_fs = systemctl_show(lab, vm, "local-fs.target", "Wants", "Requires")
    assert unit in local_fs["Wants"]
    assert unit not in local_fs["Requires"]
    # And each boot gives the drives that long to appear (x-systemd.device-timeout).
    timeout = systemctl_show(lab, vm, device, "JobRunningTimeoutUSec")["JobRunningTimeoutUSec"]
    assert timeout == [f"{DEVICE_TIMEOUT_S // 60}min"]


def test_rerun_changes_nothing(
    lab: Lab, vm: LabVm, drives: list[tuple[str, str]], raid_run: PyinfraRun, raid_inventory: str
) -> None:
    before = fingerprint(lab, vm, drives)
    run = run_pyinfra("-v", DEPLOY, inventory=raid_inventory)
    assert run.returncode == 0, run.output
    assert run.changed_operations() == {}
    assert f"[{vm.name}] noop: xfs filesystem (UUID" in run.output
    assert fingerprint(lab, vm, drives) == before


def test_the_cache_is_back_after_a_real_reboot(
    lab: Lab, vm: LabVm, drives: list[tuple[str, str]], raid_run: PyinfraRun, raid_inventory: str
) -> None:
    uuid = assert_cache_in_place(lab, vm, drives)
    md_uuid = array_state(lab, vm)["MD_UUID"]
    boot_id = sudo(lab, vm, "cat /proc/sys/kernel/random/boot_id").strip()
    sudo(lab, vm, f"echo kept > {MOUNT_POINT}/proof && sync")
    reboot(lab, vm)
    assert sudo(lab, vm, "cat /proc/sys/kernel/random/boot_id").strip() != boot_id
    assert sudo(lab, vm, "systemctl is-system-running --wait || true").strip() in (
        "running",
        "degraded",
    )
    assert assert_cache_in_place(lab, vm, drives) == uuid
    assert array_state(lab, vm)["MD_UUID"] == md_uuid
    assert sudo(lab, vm, f"cat {MOUNT_POINT}/proof").strip() == "kept"
    run = run_pyinfra(DEPLOY, inventory=raid_inventory)
    assert run.returncode == 0, run.output
    assert run.changed_operations() == {}


# --- refusals on real devices (the fourth drive, beside the built cache) ---------------------


@pytest.fixture
def cache2(tmp_path: Path, lab: Lab, vm: LabVm, drives, raid_run: PyinfraRun) -> Any:
    """A second declared cache on the fourth drive alone; the drive is blank again after."""
    path, _ = drives[3]

    def declare(**extra: Any) -> str:
        return inventory(tmp_path, lab, vm, devices=[path], mount_point="/cache2", **extra)

    yield declare
    sudo(
        lab,
        vm,
        "umount /cache2 2>/dev/null; sed -i '\\#[[:space:]]/cache2[[:space:]]#d' /etc/fstab; "
        f"rmdir /cache2 2>/dev/null; wipefs --all --quiet {path}; udevadm settle; true",
    )


def test_a_drive_with_a_filesystem_is_refused_unless_its_serial_may_be_wiped(
    lab: Lab, vm: LabVm, drives: list[tuple[str, str]], cache2: Any
) -> None:
    path, serial = drives[3]
    sudo(lab, vm, f"mkfs.ext4 -q -L precious {path}")
    uuid = sudo(lab, vm, f"blkid -p -s UUID -o value {path}").strip()
    output = refused(lab, vm, drives, cache2())
    assert (
        f"{vm.name}: nvme_cache: {path} (serial {serial}) carries ext4 filesystem (UUID {uuid}); "
        f"refusing to destroy data: list serial {serial} in nvme_cache.wipe_allowed_serials"
    ) in output
    # Another drive's serial allows nothing here.
    refused(lab, vm, drives, cache2(wipe_allowed_serials=[drives[0][1]]))

    allowed = cache2(wipe_allowed_serials=[serial])
    run = run_pyinfra(DEPLOY, inventory=allowed)
    assert run.returncode == 0, run.output
    assert sudo(lab, vm, f"blkid -p -s TYPE -o value {path}").strip() == "xfs"
    assert sudo(lab, vm, "findmnt -n -o SOURCE /cache2").strip() == path
    assert run_pyinfra(DEPLOY, inventory=allowed).changed_operations() == {}


def test_a_drive_with_a_partition_table_is_refused(
    lab: Lab, vm: LabVm, drives: list[tuple[str, str]], cache2: Any
) -> None:
    path, serial = drives[3]
    # A DOS partition table with one Linux partition, as fdisk lays it out; the kernel reads it.
    write_mbr = (
        "import struct; mbr = bytearray(512); "
        "mbr[446:462] = bytes([0, 0, 0, 0, 0x83, 0, 0, 0]) + struct.pack('<II', 2048, 8192); "
        f"mbr[510:512] = b'\\x55\\xaa'; open({path!r}, 'r+b').write(mbr)"
    )
    sudo(lab, vm, f"python3 -c {shlex.quote(write_mbr)} && blockdev --rereadpt {path}")
    assert Path(path).name + "p1" in sudo(lab, vm, f"lsblk -rn -o NAME {path}")
    output = refused(lab, vm, drives, cache2())
    assert f"{path} (serial {serial}) carries dos partition table; refusing" in output


def test_a_drive_with_a_raid_signature_is_refused(
    lab: Lab, vm: LabVm, drives: list[tuple[str, str]], cache2: Any
) -> None:
    path, serial = drives[3]
    # A member of another (stopped) array: its superblock is someone's data.
    sudo(
        lab,
        vm,
        f"mdadm --create /dev/md/other --level=1 --raid-devices=2 --metadata=1.2 --run "
        f"{path} missing && udevadm settle && mdadm --stop /dev/md/other && udevadm settle",
    )
    assert sudo(lab, vm, f"ls /sys/class/block/{Path(path).name}/holders") == ""
    md_uuid = sudo(lab, vm, f"blkid -p -s UUID -o value {path}").strip()
    output = refused(lab, vm, drives, cache2())
    assert (
        f"{path} (serial {serial}) carries RAID signature linux_raid_member (UUID {md_uuid}); "
        "refusing to destroy data"
    ) in output


def test_a_raid0_over_a_drive_in_use_is_refused(
    lab: Lab, vm: LabVm, drives: list[tuple[str, str]], raid_run: PyinfraRun, tmp_path: Path
) -> None:
    # The fourth drive with a member of the built array: that one is held by the array.
    held, held_serial = drives[0]
    declared = [held, drives[3][0]]
    output = refused(lab, vm, drives, inventory(tmp_path, lab, vm, devices=declared))
    assert f"{held} (serial {held_serial}): it is in use by md" in output
    assert sudo(lab, vm, f"wipefs --no-act --noheadings {drives[3][0]}") == ""

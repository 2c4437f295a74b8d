"""The VM part of the suite: what a container cannot show, on a real kernel with real
(emulated) NVMe drives.

One lab VM (conftest ``lab_vms``: Debian's own kernel under qemu, 1 GiB, six emulated NVMe
drives that the guest's real nvme-cli lists), booted in the background while the rest of
the suite runs. Its tests share one converge and one real reboot, so that the VM tier adds
little to the suite's time:

1. One pyinfra run of deploys/fabric.py and deploys/os_hardening.py (a throw-away inventory
   that declares the NVMe cache over three drives and the kernel section's defaults): a
   RAID0 array assembled by mdadm with the kernel's md driver, its filesystem mounted by UUID
   after the array at boot; every sysctl gpunode sets in the running kernel, none skipped,
   every blacklisted module impossible to load. The first drive carried a filesystem, and
   its serial may be wiped: the run wiped it.
2. One refused run of deploys/fabric.py (a second cache over a drive of the array, a drive
   with a filesystem, one with a partition table, one with a RAID signature): every drive's
   reason named, nothing changed.
3. One real reboot of the VM, after which the cache (with its data) and the hardening are
   back, and a second run of step 1 changes nothing.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpunode.model import DesiredState
from gpunode.probe.parsers import SECTION_COMMANDS, parse_section
from lab import Lab
from lab.vm import LabVm, reboot
from roles.kernel import BLACKLIST_PATH, SYSCTL_PATH, blacklisted_modules, sysctl_values
from roles.nvme_cache import ARRAY_NAME, FILESYSTEM_LABEL

from .conftest import VM_NVME_DRIVES, PyinfraRun, lab_desired_state, run_pyinfra, ssh
from .conftest import write_inventory as write_lab_inventory

pytestmark = [pytest.mark.lab, pytest.mark.vm]

# The storage roles and the kernel hardening, as an operator runs them, in one run.
CONVERGE = ("deploys/fabric.py", "deploys/os_hardening.py")
REFUSED_DEPLOY = "deploys/fabric.py"
CACHE_OPERATION = "NVMe cache | Cache filesystem on the chosen drives"
LIVE_OPERATION = "Kernel and login hardening | Sysctls in the running kernel"
MOUNT_POINT = "/cache"
# Drives: the array's three (the first with a filesystem the run may wipe), then one with a
# filesystem, one with a partition table and one with a RAID signature for the refusals.
ARRAY, FILESYSTEM, PARTITIONED, RAID_MEMBER = slice(0, 3), 3, 4, 5
assert VM_NVME_DRIVES == 6

# How long boot waits for the cache's device. An emulated (TCG) guest on a shared CI machine
# runs udev's coldplug some fifty times slower than a server: the default 30 s can pass before
# udev has announced the array, and then boot goes on without the cache (nofail), as designed.
DEVICE_TIMEOUT_S = 300


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


def inventory(path: Path, lab: Lab, vm: LabVm, **cache: Any) -> str:
    """An inventory of the VM alone declaring this cache (and the defaults for the rest)."""
    data = {
        "nvme_cache": {
            "enabled": True,
            "mount_point": MOUNT_POINT,
            "device_timeout_s": DEVICE_TIMEOUT_S,
            **cache,
        }
    }
    return write_lab_inventory(path, lab, [vm], {vm.name: data})


def fingerprint(lab: Lab, vm: LabVm, drives: list[tuple[str, str]]) -> str:
    """What a cache run could change: signatures of every drive, arrays, mounts, config."""
    return sudo(
        lab,
        vm,
        "cat /proc/mdstat /etc/fstab /etc/mdadm/mdadm.conf; findmnt -rn -o TARGET,SOURCE; "
        + "; ".join(f"wipefs --no-act {path}" for path, _ in drives),
    )


@pytest.fixture(scope="module")
def converge_inventory(
    tmp_path_factory: pytest.TempPathFactory, lab: Lab, vm: LabVm, drives: list[tuple[str, str]]
) -> str:
    return inventory(
        tmp_path_factory.mktemp("vm") / "vm_converge.py",
        lab,
        vm,
        devices=[path for path, _ in drives[ARRAY]],
        # The first drive carries a filesystem (converged below); its serial may be wiped.
        wipe_allowed_serials=[drives[0][1]],
    )


@pytest.fixture(scope="module")
def desired(converge_inventory: str) -> DesiredState:
    return lab_desired_state(converge_inventory)


@pytest.fixture(scope="module")
def converged(
    lab: Lab, vm: LabVm, drives: list[tuple[str, str]], converge_inventory: str
) -> PyinfraRun:
    """The first converge, from blank drives but the first (a filesystem of someone's)."""
    reset(lab, vm, drives)
    first = drives[0][0]
    sudo(lab, vm, f"mkfs.ext4 -q -L wipe-me {first}")
    assert sudo(lab, vm, f"blkid -p -s TYPE -o value {first}").strip() == "ext4"
    run = run_pyinfra("-v", *CONVERGE, inventory=converge_inventory)
    assert run.returncode == 0, run.output
    # Nothing to clean up after: the VM is removed at the end of the session (lab_vms).
    return run


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


# --- the NVMe cache's RAID0 ------------------------------------------------------------------


def array_state(lab: Lab, vm: LabVm) -> dict[str, str]:
    """``mdadm --detail --export`` of the gpunode array."""
    output = sudo(lab, vm, f"mdadm --detail --export /dev/md/{ARRAY_NAME}")
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


def assert_cache_in_place(lab: Lab, vm: LabVm, drives: list[tuple[str, str]]) -> str:
    """The RAID0 over the first three drives, its xfs mounted at the mount point: its UUID."""
    members = sorted(Path(path).name for path, _ in drives[ARRAY])
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
    lab: Lab, vm: LabVm, drives: list[tuple[str, str]], converged: PyinfraRun
) -> None:
    assert vm.name in converged.changed_operations()[CACHE_OPERATION]
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
    # The first drive's filesystem was wiped, as its listed serial allows: it is a member now.
    assert sudo(lab, vm, f"blkid -p -s TYPE -o value {drives[0][0]}").strip() == (
        "linux_raid_member"
    )
    # The other drives were not chosen, and are still blank.
    spare = " ".join(path for path, _ in drives[FILESYSTEM:])
    assert sudo(lab, vm, f"wipefs --no-act --noheadings {spare}") == ""


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
    lab: Lab, vm: LabVm, drives: list[tuple[str, str]], converged: PyinfraRun
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


# --- kernel hardening in the running kernel ------------------------------------------------


def live_values(lab: Lab, vm: LabVm, keys: list[str]) -> dict[str, str | None]:
    """Each key's value in the running kernel (None: absent), read from /proc/sys as root."""
    script = "; ".join(
        f'printf "%s=%s\\n" {key} "$(cat /proc/sys/{key.replace(".", "/")} 2>/dev/null '
        '|| echo ABSENT)"'
        for key in keys
    )
    values: dict[str, str | None] = {}
    for line in sudo(lab, vm, script).splitlines():
        key, value = line.split("=", 1)
        values[key] = None if value == "ABSENT" else " ".join(value.split())
    return values


# Per blacklisted module, in one SSH command (a TCG guest starts each sudo slowly): whether
# modprobe loads it, what modprobe would run instead, and its file in this kernel, if any.
MODULE_PROBE = """\
for module in "$@"; do
  out=$(modprobe "$module" 2>&1); rc=$?
  dry=$(modprobe -n -v "$module" 2>&1)
  file=$(/usr/sbin/modinfo -F filename "$module" 2>/dev/null)
  said=$(printf '%s / %s' "$out" "$dry" | tr '\\n\\t' '  ')
  printf '%s\\t%s\\t%s\\t%s\\n' "$module" "$rc" "$(printf %s "$file" | tr '\\n\\t' '  ')" "$said"
done
"""


def assert_hardened(lab: Lab, vm: LabVm, desired: DesiredState) -> None:
    wanted = sysctl_values(desired)
    assert live_values(lab, vm, list(wanted)) == wanted
    modules, _ = blacklisted_modules(desired.kernel.blacklist_modules)
    assert modules, "the defaults blacklist modules"
    script = f"sh -c {shlex.quote(MODULE_PROBE)} modules " + " ".join(map(shlex.quote, modules))
    probed = {}
    for line in sudo(lab, vm, script).splitlines():
        module, status, filename, said = line.split("\t", 3)
        probed[module] = (status, filename, said)
    assert sorted(probed) == sorted(modules)
    present = []
    for module, (status, filename, said) in probed.items():
        assert status != "0", f"{module} loaded: {said}"
        # What modprobe does instead of loading it: gpunode's install rule.
        assert "install /bin/false" in said, f"{module}: {said}"
        if filename:
            present.append(module)
    # Most of them are modules of this kernel, which would load but for the blacklist.
    assert len(present) >= len(modules) // 2, present
    loaded = {line.split()[0] for line in sudo(lab, vm, "cat /proc/modules").splitlines()}
    assert not loaded & {module.replace("-", "_") for module in modules}


def test_every_sysctl_is_live_and_none_is_skipped(
    lab: Lab, vm: LabVm, desired: DesiredState, converged: PyinfraRun
) -> None:
    assert vm.name in converged.changed_operations()[LIVE_OPERATION]
    skipped = re.findall(
        rf"\[{re.escape(vm.name)}\] noop: sysctl (\S+) skipped: (.*)", converged.output
    )
    assert skipped == []
    wanted = sysctl_values(desired)
    assert live_values(lab, vm, list(wanted)) == wanted
    assert sudo(lab, vm, f"test -f {SYSCTL_PATH} && echo present").strip() == "present"


def test_blacklisted_modules_cannot_be_loaded(
    lab: Lab, vm: LabVm, desired: DesiredState, converged: PyinfraRun
) -> None:
    assert "install cramfs /bin/false" in sudo(lab, vm, f"cat {BLACKLIST_PATH}")
    assert_hardened(lab, vm, desired)


# --- refusals on real devices, beside the built cache ----------------------------------------


@pytest.fixture
def dirty_drives(lab: Lab, vm: LabVm, drives: list[tuple[str, str]]) -> Iterator[None]:
    """Someone's data on the three spare drives: a filesystem, a partition table, a member
    of another (stopped) array. Blank again after."""
    filesystem, partitioned, member = (
        drives[index][0] for index in (FILESYSTEM, PARTITIONED, RAID_MEMBER)
    )
    sudo(lab, vm, f"mkfs.ext4 -q -L precious {filesystem}")
    # A DOS partition table with one Linux partition, as fdisk lays it out; the kernel reads it.
    write_mbr = (
        "import struct; mbr = bytearray(512); "
        "mbr[446:462] = bytes([0, 0, 0, 0, 0x83, 0, 0, 0]) + struct.pack('<II', 2048, 8192); "
        f"mbr[510:512] = b'\\x55\\xaa'; open({partitioned!r}, 'r+b').write(mbr)"
    )
    sudo(lab, vm, f"python3 -c {shlex.quote(write_mbr)} && blockdev --rereadpt {partitioned}")
    assert Path(partitioned).name + "p1" in sudo(lab, vm, f"lsblk -rn -o NAME {partitioned}")
    # A member of another (stopped) array: its superblock is someone's data.
    sudo(
        lab,
        vm,
        f"mdadm --create /dev/md/other --level=1 --raid-devices=2 --metadata=1.2 --run "
        f"{member} missing && udevadm settle && mdadm --stop /dev/md/other && udevadm settle",
    )
    assert sudo(lab, vm, f"ls /sys/class/block/{Path(member).name}/holders") == ""
    yield
    paths = f"{filesystem} {partitioned} {member}"
    sudo(
        lab, vm, f"wipefs --all --quiet {paths}; blockdev --rereadpt {partitioned}; udevadm settle"
    )
    assert sudo(lab, vm, f"wipefs --no-act --noheadings {paths}") == ""


def test_drives_that_carry_data_or_are_in_use_are_refused_and_nothing_changes(
    tmp_path: Path,
    lab: Lab,
    vm: LabVm,
    drives: list[tuple[str, str]],
    converged: PyinfraRun,
    dirty_drives: None,
) -> None:
    # A second cache over a drive held by the built array and the three with data; the
    # held drive's serial may be wiped, which allows nothing for the other drives (nor for
    # a drive in use).
    (held, held_serial), (filesystem, fs_serial), (partitioned, pt_serial), (member, md_serial) = (
        drives[index] for index in (0, FILESYSTEM, PARTITIONED, RAID_MEMBER)
    )
    fs_uuid = sudo(lab, vm, f"blkid -p -s UUID -o value {filesystem}").strip()
    md_uuid = sudo(lab, vm, f"blkid -p -s UUID -o value {member}").strip()
    path = inventory(
        tmp_path / "vm_refused.py",
        lab,
        vm,
        devices=[held, filesystem, partitioned, member],
        mount_point="/cache2",
        wipe_allowed_serials=[held_serial],
    )
    before = fingerprint(lab, vm, drives)
    run = run_pyinfra(REFUSED_DEPLOY, inventory=path)
    assert run.returncode == 1, run.output
    assert "Nothing was changed." in run.output
    assert f"{vm.name} (refused before any change)" in run.output
    assert fingerprint(lab, vm, drives) == before
    output = run.output
    assert f"{held} (serial {held_serial}): it is in use by md" in output
    assert (
        f"{vm.name}: nvme_cache: {filesystem} (serial {fs_serial}) carries ext4 filesystem "
        f"(UUID {fs_uuid}); refusing to destroy data: list serial {fs_serial} in "
        "nvme_cache.wipe_allowed_serials"
    ) in output
    assert f"{partitioned} (serial {pt_serial}) carries dos partition table; refusing" in output
    assert (
        f"{member} (serial {md_serial}) carries RAID signature linux_raid_member "
        f"(UUID {md_uuid}); refusing to destroy data"
    ) in output


# --- one real reboot, then a second run --------------------------------------------------------


def test_the_cache_and_the_hardening_are_back_after_a_real_reboot_and_a_rerun_changes_nothing(
    lab: Lab,
    vm: LabVm,
    drives: list[tuple[str, str]],
    desired: DesiredState,
    converged: PyinfraRun,
    converge_inventory: str,
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
    # The array assembled and the cache mounted at boot, with its data.
    assert assert_cache_in_place(lab, vm, drives) == uuid
    assert array_state(lab, vm)["MD_UUID"] == md_uuid
    assert sudo(lab, vm, f"cat {MOUNT_POINT}/proof").strip() == "kept"
    # systemd-sysctl applied the file at boot, before anyone could change a value.
    assert_hardened(lab, vm, desired)
    assert Path(SYSCTL_PATH).name in sudo(lab, vm, "ls /etc/sysctl.d")

    before = fingerprint(lab, vm, drives)
    run = run_pyinfra("-v", *CONVERGE, inventory=converge_inventory)
    assert run.returncode == 0, run.output
    assert run.changed_operations() == {}
    assert f"[{vm.name}] noop: xfs filesystem (UUID" in run.output
    assert f"[{vm.name}] noop: {len(sysctl_values(desired))} sysctls already have" in run.output
    assert fingerprint(lab, vm, drives) == before

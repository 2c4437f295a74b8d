"""NVMe cache role: facts in, commands (or refusals) out; data is never destroyed."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyinfra.api import OperationError
from pyinfra.facts.files import File

from facts.fabric import (
    BlockDevices,
    FstabEntries,
    KernelModuleStatus,
    MdadmConfArrays,
    MdArrays,
    MountPoint,
    UnitState,
    parse_block_devices,
    parse_findmnt,
    parse_fstab,
    parse_md_arrays,
)
from facts.hardware import NvmeDevices
from facts.paths import SymlinkOnPath
from gpunode.model import NvmeCache, build_desired_state
from gpunode.refusal import NodeRefused
from roles.nvme_cache import (
    CacheFacts,
    CacheRefused,
    cache_array_config,
    cache_fstab,
    cache_mounted,
    cache_volume,
    cachefilesd_running,
    fstab_command,
    fstab_line,
    gather_cache_facts,
    mdadm_conf_command,
    plan_cache,
    refuse_symlinked_mount_point,
    refused_at_prepare,
)

from .fakehost import commands_of, fake_host

MODEL = "SAMSUNG MZWLJ3T8HBLS-00007"
SIZE = 3840755982336
UUID = "26e5ff09-b703-4fa6-95a5-ef38156ccf8a"
ARRAY_UUID = "0f5e1c2a:7b1d9e44:a1b2c3d4:e5f60718"
XFS_OPTIONS = "defaults,noatime,nofail,x-systemd.device-timeout=30s"
GUARD = (
    'if [ -n "$(wipefs --no-act --noheadings --output TYPE {0})" ]; then '
    "echo '{0} carries a signature now; not making a filesystem on it' >&2; exit 1; fi; "
)


def drive(index: int, **changes: Any) -> dict[str, Any]:
    probe = {
        "path": f"/dev/nvme{index}n1",
        "kind": "block",
        "devno": f"259:{index}",
        "name": f"nvme{index}n1",
        "size": SIZE,
        "model": MODEL,
        "serial": None,
        "type": "disk",
        "partitions": [],
        "holders": [],
        "mounts": [],
        "signatures": [],
        "unreadable": None,
    }
    return probe | changes


def xfs(uuid: str = UUID, label: str | None = None) -> dict[str, Any]:
    return {"type": "xfs", "uuid": uuid, "label": label, "offset": "0x0"}


def listed(index: int, model: str = MODEL, size: int = SIZE) -> dict[str, Any]:
    return {"device_path": f"/dev/nvme{index}n1", "model": model, "serial": f"S4YP{index:04d}",
            "physical_size": size}  # fmt: skip


def array(members: list[str], name: str = "md127", **changes: Any) -> dict[str, Any]:
    return {
        "name": name, "devno": f"9:{name[2:]}", "level": "raid0", "state": "clean",
        "members": members, "uuid": ARRAY_UUID, "md_name": "node-1:gpunode-cache",
        "devname": "gpunode-cache",
    } | changes  # fmt: skip


def node_facts(
    probes: list[dict[str, Any]],
    nvme: list[dict[str, Any]] | None = None,
    arrays: list[dict[str, Any]] | None = None,
    md_supported: bool = True,
    container: str = "none",
    mount: dict[str, Any] | None = None,
    fstab: list[dict[str, str]] | None = None,
    mdadm_conf: list[str] | None = None,
) -> dict[type, Any]:
    by_path = {probe["path"]: probe for probe in probes}

    def block_devices(paths: list[str]) -> dict[str, Any]:
        return {
            "present": sorted(p for p, probe in by_path.items() if probe["kind"] == "block"),
            "devices": {path: by_path.get(path, drive(0, path=path, kind="missing"))
                        for path in paths},
        }  # fmt: skip

    def modules(modules: list[str]) -> dict[str, Any]:
        available = container == "none"
        return {
            "container": container,
            "modules": {m: {"loaded": False, "available": available} for m in modules},
        }

    return {
        NvmeDevices: {"state": "ok", "devices": nvme if nvme is not None else []},
        MdArrays: {"supported": md_supported, "arrays": arrays or []},
        BlockDevices: block_devices,
        MountPoint: mount,
        FstabEntries: fstab or [],
        KernelModuleStatus: modules,
        MdadmConfArrays: mdadm_conf,
    }


def cache(**settings: Any) -> NvmeCache:
    wanted: dict[str, Any] = {"enabled": True, "devices": ("/dev/nvme0n1",), **settings}
    return NvmeCache(**wanted)


def mounted(devno: str, options: str = "rw,noatime", source: str = "/dev/nvme0n1") -> dict:
    return {"target": "/raid", "source": source, "fstype": "xfs",
            "options": options.split(","), "devno": devno}  # fmt: skip


def refusal(settings: NvmeCache, facts: dict[type, Any]) -> str:
    with pytest.raises(OperationError) as error:
        commands_of(cache_volume, facts, cache=settings)
    return str(error.value)


# --- building ------------------------------------------------------------------------------


def test_blank_drive_gets_the_filesystem() -> None:
    commands, noops = commands_of(cache_volume, node_facts([drive(0)]), cache=cache())
    assert commands == [GUARD.format("/dev/nvme0n1") + "mkfs.xfs -q -L gpunodecache /dev/nvme0n1"]
    assert noops == []


def test_ext4_reserves_no_blocks() -> None:
    commands, _ = commands_of(cache_volume, node_facts([drive(0)]), cache=cache(filesystem="ext4"))
    assert commands[-1].endswith("mkfs.ext4 -q -m 0 -L gpunodecache /dev/nvme0n1")


def test_several_drives_become_one_raid0_array() -> None:
    facts = node_facts([drive(0), drive(1), drive(2)])
    settings = cache(devices=("/dev/nvme0n1", "/dev/nvme1n1", "/dev/nvme2n1"))
    commands, _ = commands_of(cache_volume, facts, cache=settings)
    assert commands == [
        "mdadm --create /dev/md/gpunode-cache --name=gpunode-cache --level=0 --raid-devices=3 "
        "--metadata=1.2 --run /dev/nvme0n1 /dev/nvme1n1 /dev/nvme2n1 && if command -v udevadm "
        ">/dev/null 2>&1; then udevadm settle; fi",
        GUARD.format("/dev/md/gpunode-cache") + "mkfs.xfs -q -L gpunodecache /dev/md/gpunode-cache",
    ]


def test_drives_chosen_by_model_and_size() -> None:
    nvme = [listed(0), listed(1, model="INTEL SSDPE2KX010T8", size=10**12), listed(2, size=10**11)]
    facts = node_facts([drive(0), drive(1), drive(2)], nvme=nvme)
    commands, _ = commands_of(
        cache_volume, facts, cache=cache(devices=(), match_model="samsung", min_size_gb=1000)
    )
    assert commands[-1].endswith("mkfs.xfs -q -L gpunodecache /dev/nvme0n1")  # one drive: no md


# --- never over data -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signatures", "partitions", "described"),
    [
        ([{"type": "ext4", "uuid": "a1", "label": None}], [], "ext4 filesystem (UUID a1)"),
        ([{"type": "gpt", "uuid": None, "label": None}, {"type": "PMBR", "uuid": None,
          "label": None}], ["nvme0n1p1"], "gpt partition table, PMBR partition table"),
        ([{"type": "linux_raid_member", "uuid": "9:8", "label": "h:x"}], [],
         "RAID signature linux_raid_member (UUID 9:8)"),
        ([{"type": "LVM2_member", "uuid": "pv", "label": None}], [],
         "LVM physical volume (UUID pv)"),
        ([], ["nvme0n1p1"], "partitions nvme0n1p1"),
        ([xfs()], [], f"xfs filesystem (UUID {UUID})"),  # the wanted type, but not gpunode's
    ],
)  # fmt: skip
def test_drive_with_data_is_refused_naming_node_drive_serial_and_data(
    signatures: list, partitions: list, described: str
) -> None:
    facts = node_facts([drive(0, signatures=signatures, partitions=partitions)], nvme=[listed(0)])
    assert refusal(cache(), facts) == (
        f"node-1: nvme_cache: /dev/nvme0n1 (serial S4YP0000) carries {described}; refusing to "
        "destroy data: list serial S4YP0000 in nvme_cache.wipe_allowed_serials to allow "
        "wiping it"
    )


def test_refusal_at_prepare_says_nothing_changed() -> None:
    facts = node_facts([drive(0, signatures=[{"type": "ext4", "uuid": "a1", "label": None}])])
    with pytest.raises(CacheRefused) as error:
        plan_cache(cache(), _facts_for_plan(facts, cache()), "node-1")
    message = str(refused_at_prepare(error.value))
    assert message.endswith("\nNothing was changed.")
    assert "its serial is unknown, so it can only be cleared by hand (wipefs)" in message


def test_allowed_serial_is_wiped_then_formatted() -> None:
    facts = node_facts(
        [drive(0, signatures=[{"type": "ext4", "uuid": "a1", "label": None}])], nvme=[listed(0)]
    )
    commands, _ = commands_of(cache_volume, facts, cache=cache(wipe_allowed_serials=("S4YP0000",)))
    assert commands[0] == "wipefs --all /dev/nvme0n1"
    assert commands[1].endswith("mkfs.xfs -q -L gpunodecache /dev/nvme0n1")


def test_only_the_allowed_drive_is_wiped_and_the_other_still_refused() -> None:
    data = [{"type": "ext4", "uuid": "a1", "label": None}]
    facts = node_facts(
        [drive(0, signatures=data), drive(1, signatures=data)], nvme=[listed(0), listed(1)]
    )
    settings = cache(devices=("/dev/nvme0n1", "/dev/nvme1n1"), wipe_allowed_serials=("S4YP0000",))
    message = refusal(settings, facts)
    assert message.startswith("node-1: nvme_cache: /dev/nvme1n1 (serial S4YP0001) carries ext4")
    assert "nvme0n1" not in message


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"mounts": ["/srv/data"]}, "it is mounted at /srv/data"),
        ({"holders": ["md0"]}, "it is in use by md0 (an md array or device mapper)"),
        ({"unreadable": "wipefs could not read it: boom"}, "its signatures cannot be read "
         "(wipefs could not read it: boom), so it counts as data"),
    ],
)  # fmt: skip
def test_drive_in_use_is_refused_even_when_wiping_is_allowed(changes: dict, reason: str) -> None:
    facts = node_facts([drive(0, **changes)], nvme=[listed(0)])
    assert refusal(cache(wipe_allowed_serials=("S4YP0000",)), facts) == (
        f"node-1: nvme_cache: /dev/nvme0n1 (serial S4YP0000): {reason}; refusing it"
    )


def test_missing_and_non_block_devices_are_named_with_what_exists() -> None:
    facts = node_facts([drive(0), drive(0, path="/etc/hostname", kind="not-block")])
    message = refusal(cache(devices=("/dev/nvme0n1", "/dev/nvme5n1", "/etc/hostname")), facts)
    assert message == (
        "node-1: nvme_cache: no such device: /dev/nvme5n1; block devices on the node: "
        "/dev/nvme0n1\n"
        "node-1: nvme_cache: not a block device: /etc/hostname; block devices on the node: "
        "/dev/nvme0n1"
    )


def test_drives_nvme_list_reports_but_the_node_lacks_are_refused() -> None:
    facts = node_facts([drive(0)], nvme=[listed(0), listed(1)])
    message = refusal(cache(devices=(), match_model="SAMSUNG"), facts)
    assert message == (
        "node-1: nvme_cache: no such device: /dev/nvme1n1 (listed by `nvme list`); block devices "
        "on the node: /dev/nvme0n1"
    )


def test_no_matching_model_lists_the_drives() -> None:
    facts = node_facts([drive(0)], nvme=[listed(0)])
    message = refusal(cache(devices=(), match_model="Micron", min_size_gb=100), facts)
    assert message == (
        "node-1: nvme_cache: no NVMe drive has a model containing 'Micron' of at least 100 GB; "
        f"the node has: /dev/nvme0n1: {MODEL}, 3841 GB"
    )


def test_model_selection_needs_a_readable_nvme_list() -> None:
    facts = node_facts([drive(0)])
    facts[NvmeDevices] = {"state": "absent", "reason": "nvme-cli is not installed"}
    message = refusal(cache(devices=(), match_model="SAMSUNG"), facts)
    assert "cannot be read here (nvme-cli is not installed)" in message


def test_named_drive_must_fit_the_model_filter_too() -> None:
    facts = node_facts([drive(0)], nvme=[listed(0)])
    message = refusal(cache(match_model="INTEL"), facts)
    assert message.startswith(f"node-1: nvme_cache: /dev/nvme0n1 (serial S4YP0000) is a {MODEL}")


def test_same_device_twice_is_refused() -> None:
    facts = node_facts([drive(0), drive(0, path="/dev/disk/by-id/nvme-x")])
    message = refusal(cache(devices=("/dev/nvme0n1", "/dev/disk/by-id/nvme-x")), facts)
    assert message.endswith("are the same device (259:0)")


def test_raid_without_md_driver_is_refused_with_the_reason() -> None:
    facts = node_facts([drive(0), drive(1)], md_supported=False, container="docker")
    message = refusal(cache(devices=("/dev/nvme0n1", "/dev/nvme1n1")), facts)
    assert message == (
        "node-1: nvme_cache: 2 drives need a RAID0 array, but the kernel has no md driver here "
        "(/proc/mdstat is absent; this docker container cannot load md_mod and raid0)"
    )
    # On a host mdadm loads the modules itself.
    facts = node_facts([drive(0), drive(1)], md_supported=False)
    assert commands_of(cache_volume, facts, cache=cache(devices=("/dev/nvme0n1", "/dev/nvme1n1")))


def test_something_else_at_the_mount_point_is_refused() -> None:
    facts = node_facts([drive(0)], mount=mounted("8:1", source="/dev/sda1"))
    assert refusal(cache(), facts) == (
        "node-1: nvme_cache: /raid already has /dev/sda1 (xfs) mounted; gpunode does not mount "
        "over it"
    )


# --- converged ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("probe", "mount", "fstab"),
    [
        (drive(0, signatures=[xfs()], mounts=["/raid"]), mounted("259:0"), []),
        (drive(0, signatures=[xfs()]), None, [f"UUID={UUID} /raid xfs defaults 0 0"]),
        (drive(0, signatures=[xfs(label="gpunodecache")]), None, []),
    ],
    ids=["mounted-here", "named-in-fstab", "labelled-by-gpunode"],
)
def test_the_cache_gpunode_built_is_not_data(
    probe: dict, mount: dict | None, fstab: list[str]
) -> None:
    facts = node_facts([probe], mount=mount, fstab=parse_fstab(fstab))
    commands, noops = commands_of(cache_volume, facts, cache=cache())
    assert commands == []
    assert noops == [f"xfs filesystem (UUID {UUID}) already on the gpunode drive /dev/nvme0n1"]


def test_existing_gpunode_array_is_kept() -> None:
    md = drive(0, path="/dev/md127", devno="9:127", signatures=[xfs()], mounts=["/raid"])
    probes = [drive(0, holders=["md127"]), drive(1, holders=["md127"]), md]
    facts = node_facts(probes, arrays=[array(["259:0", "259:1"])], mount=mounted("9:127"))
    settings = cache(devices=("/dev/nvme0n1", "/dev/nvme1n1"))
    commands, noops = commands_of(cache_volume, facts, cache=settings)
    assert commands == []
    assert noops == [
        f"xfs filesystem (UUID {UUID}) already on the gpunode RAID0 array /dev/md127 of "
        "/dev/nvme0n1, /dev/nvme1n1"
    ]


def test_gpunode_array_without_filesystem_gets_one() -> None:
    probes = [drive(0, holders=["md127"]), drive(1, holders=["md127"]),
              drive(0, path="/dev/md127", devno="9:127")]  # fmt: skip
    facts = node_facts(probes, arrays=[array(["259:0", "259:1"])])
    commands, _ = commands_of(
        cache_volume, facts, cache=cache(devices=("/dev/nvme0n1", "/dev/nvme1n1"))
    )
    assert commands == [GUARD.format("/dev/md127") + "mkfs.xfs -q -L gpunodecache /dev/md127"]


def test_gpunode_array_with_another_filesystem_is_refused() -> None:
    ext4 = {"type": "ext4", "uuid": "e1", "label": None}
    probes = [drive(0, holders=["md127"]), drive(1, holders=["md127"]),
              drive(0, path="/dev/md127", devno="9:127", signatures=[ext4])]  # fmt: skip
    facts = node_facts(probes, arrays=[array(["259:0", "259:1"])])
    message = refusal(cache(devices=("/dev/nvme0n1", "/dev/nvme1n1")), facts)
    assert message.startswith(
        "node-1: nvme_cache: the gpunode array /dev/md127 carries ext4 filesystem (UUID e1), "
        "but nvme_cache.filesystem is xfs"
    )


@pytest.mark.parametrize(
    "other",
    [
        array(["259:0", "259:1", "259:2"]),  # the gpunode array, but over other drives
        array(["259:0", "259:1"], md_name="node-1:scratch", devname="scratch"),  # not gpunode's
    ],
)
def test_drives_in_another_array_are_refused(other: dict) -> None:
    probes = [drive(0, holders=["md127"]), drive(1, holders=["md127"])]
    facts = node_facts(probes, arrays=[other])
    message = refusal(cache(devices=("/dev/nvme0n1", "/dev/nvme1n1")), facts)
    assert "/dev/nvme0n1 (serial unknown): it is in use by md127" in message


# --- fstab, mount, mdadm.conf --------------------------------------------------------------


def test_fstab_entry_by_uuid_with_boot_options() -> None:
    facts = node_facts([drive(0, signatures=[xfs()])], fstab=parse_fstab(["/dev/sdb1 /raid ext4"]))
    commands, _ = commands_of(cache_fstab, facts, cache=cache(), paths=["/dev/nvme0n1"])
    line = f"UUID={UUID} /raid xfs {XFS_OPTIONS} 0 0"
    assert commands == [fstab_command(cache(), line)]


def test_fstab_entry_in_place_is_a_noop() -> None:
    line = f"UUID={UUID}  /raid xfs {XFS_OPTIONS} 0 0"
    facts = node_facts([drive(0, signatures=[xfs()])], fstab=parse_fstab([line]))
    assert commands_of(cache_fstab, facts, cache=cache(), paths=["/dev/nvme0n1"]) == (
        [],
        [f"/etc/fstab mounts UUID={UUID} at /raid"],
    )


def test_ext4_is_checked_at_boot_and_timeout_comes_from_data() -> None:
    ext4 = {"type": "ext4", "uuid": "e1", "label": "gpunodecache"}
    facts = node_facts([drive(0, signatures=[ext4])])
    settings = cache(filesystem="ext4", device_timeout_s=90)
    commands, _ = commands_of(cache_fstab, facts, cache=settings, paths=["/dev/nvme0n1"])
    line = "UUID=e1 /raid ext4 defaults,noatime,nofail,x-systemd.device-timeout=90s 0 2"
    assert commands == [fstab_command(settings, line)]


def test_fstab_for_a_filesystem_made_later_in_the_run_reads_its_uuid_then() -> None:
    commands, _ = commands_of(
        cache_fstab, node_facts([drive(0)]), cache=cache(), paths=["/dev/nvme0n1"]
    )
    assert commands[0].startswith(
        'uuid=$(blkid -p -s UUID -o value /dev/nvme0n1) && [ -n "$uuid" ] && '
    )


def test_fstab_command_replaces_only_the_mount_points_entries(tmp_path: Path) -> None:
    fstab = tmp_path / "fstab"
    fstab.write_text(
        "# /raid was here before\nUUID=root / ext4 defaults 0 1\n/dev/sdb1 /raid ext4 defaults"
        " 0 2\n/dev/sdc1 /raid2 xfs defaults 0 0\n"
    )
    line = f"UUID={UUID} /raid xfs {XFS_OPTIONS} 0 0"
    command = fstab_command(cache(), line).replace("/etc/fstab", str(fstab))
    command = command.split(" && if [ -d /run/systemd/system ]")[0]  # no daemon-reload here
    subprocess.run(["sh", "-c", command], check=True)
    assert fstab.read_text().splitlines() == [
        "# /raid was here before",
        "UUID=root / ext4 defaults 0 1",
        "/dev/sdc1 /raid2 xfs defaults 0 0",
        line,
    ]


def test_fstab_command_writes_a_hostile_mount_point_literally(tmp_path: Path) -> None:
    # Issue 12: the fstab line went into the command inside double quotes, so a mount point
    # with a command substitution ran it. Validation refuses such a path now; the command
    # must not depend on that.
    fstab = tmp_path / "fstab"
    fstab.write_text("UUID=root / ext4 defaults 0 1\n")
    pwned = tmp_path / "PWNED"
    hostile = cache(mount_point="/raid$(touch${IFS}" + str(pwned) + ")`id`'\"")
    line = fstab_line(hostile, UUID)
    command = fstab_command(hostile, line).replace("/etc/fstab", str(fstab))
    command = command.split(" && if [ -d /run/systemd/system ]")[0]
    subprocess.run(["sh", "-c", command], check=True)
    assert not pwned.exists()
    assert fstab.read_text().splitlines() == ["UUID=root / ext4 defaults 0 1", line]


def test_fstab_command_for_a_predicted_filesystem_expands_only_the_uuid(tmp_path: Path) -> None:
    fstab = tmp_path / "fstab"
    fstab.write_text("")
    pwned = tmp_path / "PWNED"
    hostile = cache(mount_point="/raid$(touch${IFS}" + str(pwned) + ")")
    command = fstab_command(hostile, fstab_line(hostile, "$uuid")).replace("/etc/fstab", str(fstab))
    command = "uuid=e1f2 && " + command.split(" && if [ -d /run/systemd/system ]")[0]
    subprocess.run(["sh", "-c", command], check=True)
    assert not pwned.exists()
    assert fstab.read_text().splitlines() == [fstab_line(hostile, "e1f2")]


def test_mounted_only_when_not_yet() -> None:
    facts = node_facts([drive(0, signatures=[xfs()])])
    assert commands_of(cache_mounted, facts, cache=cache(), paths=["/dev/nvme0n1"])[0] == [
        "mount /raid"
    ]
    facts = node_facts([drive(0, signatures=[xfs()])], mount=mounted("259:0", "rw,relatime"))
    assert commands_of(cache_mounted, facts, cache=cache(), paths=["/dev/nvme0n1"])[0] == [
        "mount -o remount,noatime /raid"
    ]
    facts = node_facts([drive(0, signatures=[xfs()])], mount=mounted("259:0"))
    assert commands_of(cache_mounted, facts, cache=cache(), paths=["/dev/nvme0n1"]) == (
        [],
        ["/raid is mounted from /dev/nvme0n1 with noatime"],
    )


def test_mount_point_taken_by_another_device_fails() -> None:
    facts = node_facts([drive(0, signatures=[xfs()])], mount=mounted("8:1", source="/dev/sda1"))
    with pytest.raises(OperationError, match="/raid has /dev/sda1 mounted, not the cache"):
        commands_of(cache_mounted, facts, cache=cache(), paths=["/dev/nvme0n1"])


def _array_facts(mdadm_conf: list[str] | None) -> dict[type, Any]:
    probes = [drive(0, holders=["md127"]), drive(1, holders=["md127"]),
              drive(0, path="/dev/md127", devno="9:127", signatures=[xfs()])]  # fmt: skip
    return node_facts(probes, arrays=[array(["259:0", "259:1"])], mdadm_conf=mdadm_conf)


def test_array_recorded_in_mdadm_conf_and_initramfs() -> None:
    line = f"ARRAY /dev/md/gpunode-cache metadata=1.2 UUID={ARRAY_UUID}"
    paths = ["/dev/nvme0n1", "/dev/nvme1n1"]
    commands, _ = commands_of(cache_array_config, _array_facts([]), cache=cache(), paths=paths)
    assert commands == [mdadm_conf_command(line, ARRAY_UUID)]
    assert commands[0].endswith(
        "if command -v update-initramfs >/dev/null 2>&1; then update-initramfs -u; fi"
    )
    assert commands_of(cache_array_config, _array_facts([line]), cache=cache(), paths=paths) == (
        [],
        [f"/etc/mdadm/mdadm.conf names the gpunode array (UUID {ARRAY_UUID})"],
    )


def test_mdadm_conf_command_replaces_only_this_arrays_lines(tmp_path: Path) -> None:
    conf = tmp_path / "mdadm.conf"
    conf.write_text(
        "HOMEHOST <system>\n"
        f"ARRAY /dev/md/gpunode-cache metadata=1.2 UUID=old:old:old:old\n"
        f"ARRAY /dev/md/other metadata=1.2 UUID={ARRAY_UUID}\n"
        "ARRAY /dev/md/keep metadata=1.2 UUID=1:2:3:4\n"
    )
    line = f"ARRAY /dev/md/gpunode-cache metadata=1.2 UUID={ARRAY_UUID}"
    command = mdadm_conf_command(line, ARRAY_UUID).replace("/etc/mdadm", str(tmp_path))
    command = command.split(" && if command -v update-initramfs")[0]
    subprocess.run(["sh", "-c", command], check=True)
    assert conf.read_text().splitlines() == [
        "HOMEHOST <system>",
        "ARRAY /dev/md/keep metadata=1.2 UUID=1:2:3:4",
        line,
    ]


# --- cachefilesd -----------------------------------------------------------------------------


def _cachefilesd_facts(container: str, device: bool, active: bool) -> dict[type, Any]:
    return {
        UnitState: {"installed": True, "active": active, "enabled": True},
        KernelModuleStatus: {
            "container": container,
            "modules": {"cachefiles": {"loaded": False, "available": container == "none"}},
        },
        File: {"mode": 600} if device else None,
    }


def test_cachefilesd_started_where_the_kernel_offers_cachefiles() -> None:
    assert commands_of(cachefilesd_running, _cachefilesd_facts("none", False, False)) == (
        ["systemctl start cachefilesd.service"],
        [],
    )
    assert commands_of(cachefilesd_running, _cachefilesd_facts("none", True, True)) == (
        [],
        ["cachefilesd is running"],
    )


def test_cachefilesd_in_a_container_is_reported() -> None:
    assert commands_of(cachefilesd_running, _cachefilesd_facts("docker", False, False)) == (
        [],
        [
            "cachefilesd configured (RUN=yes) but not started: /dev/cachefiles is absent and "
            "this docker container cannot load the cachefiles module"
        ],
    )


# --- facts -----------------------------------------------------------------------------------

# Captured from a lab node: a scratch disk (host loop device) handed to it as /dev/nvme1n1.
BLOCK_OUTPUT = """\
gpunode:present=/dev/nvme1n1
gpunode:device=/dev/nvme1n1
kind=block
devno=7:1
name=loop1
size=1073741824
partitions=
holders=
mount=/raid\\040cache
lsblk={   "blockdevices": [      {         "model": null,         "serial": null,         \
"type": "loop"      }   ]}
wipefs={   "signatures": [      {         "device": "nvme1n1",         "offset": "0x438",   \
      "type": "ext4",         "uuid": "af74d069-022c-4723-b10b-54df6bddeadb",         "label": \
null      }   ]}
blkid-status=0
blkid:UUID=af74d069-022c-4723-b10b-54df6bddeadb
blkid:BLOCK_SIZE=4096
blkid:TYPE=ext4
blkid:USAGE=filesystem
gpunode:device=/dev/nvme9n1
kind=missing
"""


def test_block_device_fact_reads_signatures_mounts_and_kind() -> None:
    parsed = parse_block_devices(BLOCK_OUTPUT.splitlines())
    assert parsed["present"] == ["/dev/nvme1n1"]
    device = parsed["devices"]["/dev/nvme1n1"]
    assert device["devno"] == "7:1"
    assert device["size"] == 2**30
    assert device["mounts"] == ["/raid cache"]
    assert device["type"] == "loop"
    assert device["signatures"] == [
        {"type": "ext4", "uuid": "af74d069-022c-4723-b10b-54df6bddeadb", "label": None,
         "offset": "0x438"}
    ]  # fmt: skip
    assert device["unreadable"] is None
    assert parsed["devices"]["/dev/nvme9n1"]["kind"] == "missing"


def test_a_signature_only_blkid_sees_still_counts_and_errors_are_unreadable() -> None:
    lines = [
        "gpunode:device=/dev/sdx", "kind=block", "devno=8:16", "wipefs={\"signatures\": []}",
        "blkid-status=0", "blkid:PTTYPE=gpt",
        "gpunode:device=/dev/sdy", "kind=block", "devno=8:32",
        "wipefs-error=wipefs: error: /dev/sdy: probing initialization failed",
        "blkid-status=2", "blkid:",
        "gpunode:device=/dev/sdz", "kind=block", "devno=8:48", "wipefs={\"signatures\": []}",
        "blkid-status=8", "blkid:",
    ]  # fmt: skip
    devices = parse_block_devices(lines)["devices"]
    assert [s["type"] for s in devices["/dev/sdx"]["signatures"]] == ["gpt"]
    assert devices["/dev/sdy"]["unreadable"].startswith("wipefs could not read it: wipefs: error")
    assert devices["/dev/sdz"]["unreadable"] == "blkid -p exited 8"


def test_md_fact_reads_members_and_mdadm_names() -> None:
    lines = [
        "supported=yes", "gpunode:array=md127", "devno=9:127", "level=raid0", "state=clean",
        "member=259:0", "member=259:1", f"detail:MD_UUID={ARRAY_UUID}",
        "detail:MD_NAME=node-1:gpunode-cache", "detail:MD_DEVNAME=gpunode-cache",
    ]  # fmt: skip
    assert parse_md_arrays(lines) == {"supported": True, "arrays": [array(["259:0", "259:1"])]}
    assert parse_md_arrays(["supported=no"]) == {"supported": False, "arrays": []}


def test_findmnt_and_fstab_facts() -> None:
    text = (
        '{"filesystems": [{"target": "/raid", "source": "/dev/md127", "fstype": "xfs", '
        '"options": "rw,noatime,inode64", "maj:min": "9:127"}]}'
    )
    assert parse_findmnt(text) == {
        "target": "/raid",
        "source": "/dev/md127",
        "fstype": "xfs",
        "options": ["rw", "noatime", "inode64"],
        "devno": "9:127",
    }
    assert parse_fstab(["# c", "", "UUID=x /a\\040b xfs noatime 0 0", "/dev/sda1 /boot"]) == [
        {"spec": "UUID=x", "file": "/a b", "vfstype": "xfs", "options": "noatime", "freq": "0",
         "passno": "0", "line": "UUID=x /a\\040b xfs noatime 0 0"},
        {"spec": "/dev/sda1", "file": "/boot", "vfstype": "auto", "options": "defaults",
         "freq": "0", "passno": "0", "line": "/dev/sda1 /boot"},
    ]  # fmt: skip


# --- data ------------------------------------------------------------------------------------


def test_a_device_listed_twice_and_a_zero_timeout_are_validation_errors() -> None:
    twice = {"enabled": True, "devices": ["/dev/nvme0n1", "/dev/nvme0n1"]}
    _, problems = build_desired_state({"nvme_cache": twice})
    assert [p.render("inv.py", "n") for p in problems] == [
        "inv.py: host n: nvme_cache.devices = ['/dev/nvme0n1', '/dev/nvme0n1']: a device is "
        "listed twice; accepted: unique paths"
    ]
    _, problems = build_desired_state({"nvme_cache": {"device_timeout_s": 0}})
    assert "nvme_cache.device_timeout_s = 0: out of range" in problems[0].render("i", "n")


def _facts_for_plan(facts: dict[type, Any], settings: NvmeCache) -> CacheFacts:
    with fake_host(facts):
        return gather_cache_facts(settings)


# --- a mount point that passes through a symbolic link ------------------------------------

# Components of a path below the fuzz's root: each a directory, a link (to elsewhere in the
# tree, to a system directory, dangling, or to itself), a file, or missing.
COMPONENT = st.sampled_from(["dir", "link-up", "link-out", "link-dangling", "link-loop", "file"])


def symlink_walk(root: Path, relative: list[str]) -> dict[str, str] | None:
    """What the node-side walk must report: the first existing link on the way."""
    walked = root
    for part in relative:
        walked = walked / part
        if walked.is_symlink():
            return {"path": str(walked), "target": os.readlink(walked)}
        if not walked.exists():
            return None
    return None


@settings(max_examples=60, deadline=None, database=None, derandomize=True)
@given(kinds=st.lists(COMPONENT, min_size=1, max_size=5), extra=st.integers(0, 2))
def test_the_walk_names_the_first_symbolic_link_on_a_mount_point(
    kinds: list[str], extra: int
) -> None:
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary).resolve()
        (root / "elsewhere").mkdir()
        parts = [f"c{index}-{kind}" for index, kind in enumerate(kinds)] + ["new"] * extra
        walked = root
        for index, kind in enumerate(kinds):
            walked = walked / parts[index]
            if kind == "dir":
                walked.mkdir()
            elif kind == "file":
                walked.write_text("")
            elif kind == "link-up":
                walked.symlink_to(root / "elsewhere")
            elif kind == "link-out":
                walked.symlink_to("/etc")
            elif kind == "link-dangling":
                walked.symlink_to(root / "nowhere")
            else:
                walked.symlink_to(walked)
            if kind != "dir":
                break
        path = str(root.joinpath(*parts))
        output = subprocess.run(
            ["sh", "-c", SymlinkOnPath().command(path)], capture_output=True, text=True, check=True
        ).stdout
        found = SymlinkOnPath().process(output.splitlines())
        assert found == symlink_walk(root, parts)


def test_node_text_in_a_link_target_is_cleaned() -> None:
    found = SymlinkOnPath().process(["link\t/raid\t/etc\x1b[2J\u2028x"])
    assert found == {"path": "/raid", "target": "/etc\\x1b[2J\\u2028x"}
    assert SymlinkOnPath().process(["garbage", "link\trelative\t/x"]) is None


def test_a_mount_point_through_a_symbolic_link_is_refused_before_anything_changes() -> None:
    cache = build_desired_state({"nvme_cache": {"enabled": True, "mount_point": "/raid/cache"}})[0]
    link = {SymlinkOnPath: {"path": "/raid", "target": "/etc"}}
    with fake_host(link), pytest.raises(NodeRefused) as refused:
        refuse_symlinked_mount_point(cache.nvme_cache)
    assert refused.value.reason == (
        "node-1: nvme_cache: mount point /raid/cache passes through the symbolic link /raid "
        "(-> /etc), which mount and mkdir follow; set nvme_cache.mount_point to the real "
        "directory"
    )
    with fake_host({SymlinkOnPath: None}):
        refuse_symlinked_mount_point(cache.nvme_cache)

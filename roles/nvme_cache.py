"""The local NVMe cache: chosen drives, one filesystem, mounted at boot, never over data.

Drives are named (``nvme_cache.devices``) or chosen from ``nvme list`` by model and size
(``match_model``, ``min_size_gb``). One drive carries the filesystem itself; several become a
RAID0 array (mdadm, metadata 1.2, named ``gpunode-cache``) recorded in
/etc/mdadm/mdadm.conf (and the initramfs, where update-initramfs exists) so it assembles at
boot. The filesystem (xfs or ext4, label ``gpunodecache``) is mounted with ``noatime`` at
``mount_point`` through /etc/fstab by UUID, with ``nofail`` and
``x-systemd.device-timeout``: a dead drive delays boot by at most that long and never stops it.

Data is never destroyed. Before anything changes (at prepare time, and again right before
the commands run) every chosen drive is read: a drive that is mounted, held by another array
or device mapper, or whose signatures cannot be read is refused; a drive that carries a
filesystem, partition table or RAID signature is refused unless its serial is listed in
``wipe_allowed_serials``. What gpunode built itself is not "data": the drive (or the gpunode
array) that carries the wanted filesystem and is mounted at the mount point, named in fstab,
or labelled ``gpunodecache``. Changing the layout of a built cache (other drives, another
filesystem) is refused too; an operator who means it unmounts and wipes by hand.

With ``cachefilesd``, NFS FS-Cache keeps its cache in ``<mount_point>/fscache``; it is
started where the kernel offers cachefiles, and where it does not (a container) the run says so.
With ``enabled: false`` nothing is touched: a cache built before, and its data, stay.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from io import StringIO
from typing import Any

from pyinfra import host
from pyinfra.api import OperationError, deploy, operation
from pyinfra.facts.files import File
from pyinfra.operations import files, systemd

from facts.fabric import (
    BlockDevices,
    FstabEntries,
    KernelModuleStatus,
    MdadmConfArrays,
    MdArrays,
    MountPoint,
    UnitState,
)
from facts.hardware import NvmeDevices
from facts.paths import SymlinkOnPath
from gpunode.model import DesiredState, NvmeCache
from gpunode.refusal import NodeRefused
from roles.packages import install_packages

ARRAY_NAME = "gpunode-cache"
ARRAY_PATH = f"/dev/md/{ARRAY_NAME}"
# At most 12 characters: the XFS limit.
FILESYSTEM_LABEL = "gpunodecache"
FSTAB_PATH = "/etc/fstab"
MDADM_CONF_PATH = "/etc/mdadm/mdadm.conf"
MD_MODULES = ("md_mod", "raid0")
CACHEFILESD_CONF_PATH = "/etc/cachefilesd.conf"
CACHEFILESD_DEFAULT_PATH = "/etc/default/cachefilesd"
CACHEFILESD_UNIT = "cachefilesd.service"
CACHEFILES_DEVICE = "/dev/cachefiles"
FSCACHE_DIR = "fscache"

PARTITION_TABLES = {"gpt", "PMBR", "dos", "atari", "bsd", "mac", "sgi", "sun", "solaris"}
RAID_SIGNATURES = {
    "linux_raid_member", "isw_raid_member", "ddf_raid_member", "adaptec_raid_member",
    "lsi_mega_raid_member", "nvidia_raid_member", "promise_fasttrack_raid_member",
    "silicon_medley_raid_member", "via_raid_member", "hpt37x_raid_member",
    "hpt45x_raid_member", "jmicron_raid_member",
}  # fmt: skip


class CacheRefused(Exception):
    """The cache cannot be built here without destroying data or guessing; says why."""


# --- facts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheFacts:
    nvme: dict[str, Any]
    arrays: dict[str, Any]
    devices: dict[str, Any]
    mount: dict[str, Any] | None
    fstab: list[dict[str, str]]
    md_modules: dict[str, Any] | None


def model_matches(cache: NvmeCache, model: str | None, size: int | None) -> bool:
    if cache.match_model is not None and cache.match_model.lower() not in (model or "").lower():
        return False
    return cache.min_size_gb is None or (size or 0) >= cache.min_size_gb * 10**9


def candidate_paths(cache: NvmeCache, nvme: dict[str, Any]) -> list[str]:
    """The named drives, or the ``nvme list`` drives the model and size select."""
    if cache.devices:
        return list(cache.devices)
    if nvme.get("state") != "ok":
        return []
    return [
        drive["device_path"]
        for drive in nvme["devices"]
        if model_matches(cache, drive.get("model"), drive.get("physical_size"))
    ]


def gather_cache_facts(cache: NvmeCache) -> CacheFacts:
    """Everything the cache plan reads from the node (six or seven fact commands)."""
    nvme = host.get_fact(NvmeDevices)
    arrays = host.get_fact(MdArrays)
    paths = candidate_paths(cache, nvme)
    probe = paths + [f"/dev/{array['name']}" for array in arrays["arrays"]]
    return CacheFacts(
        nvme=nvme,
        arrays=arrays,
        devices=host.get_fact(BlockDevices, paths=probe),
        mount=host.get_fact(MountPoint, path=cache.mount_point),
        fstab=host.get_fact(FstabEntries),
        md_modules=(
            host.get_fact(KernelModuleStatus, modules=list(MD_MODULES)) if len(paths) > 1 else None
        ),
    )


# --- the plan ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Drive:
    path: str
    devno: str
    serial: str | None
    model: str | None
    size: int | None
    probe: dict[str, Any]

    def describe(self) -> str:
        return f"{self.path} (serial {self.serial or 'unknown'})"


@dataclass(frozen=True)
class CachePlan:
    drives: tuple[Drive, ...]
    wipe: tuple[Drive, ...] = ()
    create_array: bool = False
    make_filesystem: bool = False
    # The device that carries the filesystem; None: the array this run creates (ARRAY_PATH).
    target: str | None = None
    uuid: str | None = None

    @property
    def raid(self) -> bool:
        return len(self.drives) > 1

    @property
    def target_path(self) -> str:
        return self.target or ARRAY_PATH


def describe_signature(signature: dict[str, Any]) -> str:
    kind = signature.get("type") or "unknown"
    uuid = f" (UUID {signature['uuid']})" if signature.get("uuid") else ""
    if kind in PARTITION_TABLES:
        return f"{kind} partition table"
    if kind in RAID_SIGNATURES:
        return f"RAID signature {kind}{uuid}"
    if kind == "LVM2_member":
        return f"LVM physical volume{uuid}"
    if kind == "crypto_LUKS":
        return f"LUKS header{uuid}"
    return f"{kind} filesystem{uuid}"


def blocking_use(probe: dict[str, Any]) -> str | None:
    """Why the device must not be touched even when wiping is allowed, or None."""
    if probe["unreadable"]:
        return f"its signatures cannot be read ({probe['unreadable']}), so it counts as data"
    if probe["mounts"]:
        return f"it is mounted at {', '.join(probe['mounts'])}"
    if probe["holders"]:
        return f"it is in use by {', '.join(probe['holders'])} (an md array or device mapper)"
    return None


def data_on(probe: dict[str, Any]) -> str | None:
    """What data the device carries (signatures, partitions), or None if it is blank."""
    found = [describe_signature(signature) for signature in probe["signatures"]]
    if probe["partitions"] and not any(
        s.get("type") in PARTITION_TABLES for s in probe["signatures"]
    ):
        found.append(f"partitions {', '.join(probe['partitions'])}")
    return ", ".join(found) or None


def resolve_drives(paths: list[str], facts: CacheFacts, node: str) -> list[Drive]:
    nvme_by_path = {
        drive["device_path"]: drive
        for drive in (facts.nvme.get("devices") or [])
        if facts.nvme.get("state") == "ok"
    }
    drives: list[Drive] = []
    absent: dict[str, list[str]] = {"no such device": [], "not a block device": []}
    for path in paths:
        probe = facts.devices["devices"].get(path)
        if probe is None or probe["kind"] != "block":
            kind = probe["kind"] if probe else "missing"
            absent["not a block device" if kind == "not-block" else "no such device"].append(path)
            continue
        listed = nvme_by_path.get(path, {})
        drives.append(
            Drive(
                path=path,
                devno=probe["devno"],
                serial=listed.get("serial") or probe["serial"],
                model=listed.get("model") or probe["model"],
                size=listed.get("physical_size") or probe["size"],
                probe=probe,
            )
        )
    present = ", ".join(facts.devices["present"]) or "none"
    problems = [
        f"{node}: nvme_cache: {what}: {', '.join(missing)}"
        + (" (listed by `nvme list`)" if set(missing) <= set(nvme_by_path) else "")
        + f"; block devices on the node: {present}"
        for what, missing in absent.items()
        if missing
    ]
    if problems:
        raise CacheRefused("\n".join(problems))
    seen: dict[str, str] = {}
    for drive in drives:
        if drive.devno in seen:
            raise CacheRefused(
                f"{node}: nvme_cache: {drive.path} and {seen[drive.devno]} are the same device "
                f"({drive.devno})"
            )
        seen[drive.devno] = drive.path
    return drives


def selected_paths(cache: NvmeCache, facts: CacheFacts, node: str) -> list[str]:
    paths = candidate_paths(cache, facts.nvme)
    if paths:
        return paths
    nvme = facts.nvme
    if nvme.get("state") != "ok":
        raise CacheRefused(
            f"{node}: nvme_cache: match_model needs the drive list of `nvme list -o json`, "
            f"which cannot be read here ({nvme.get('reason') or nvme.get('state')}); install "
            "nvme-cli or name the drives in nvme_cache.devices"
        )
    listed = "; ".join(
        f"{drive['device_path']}: {drive.get('model')}, "
        f"{(drive.get('physical_size') or 0) / 10**9:.0f} GB"
        for drive in nvme["devices"]
    )
    wanted = f"model containing {cache.match_model!r}"
    if cache.min_size_gb is not None:
        wanted += f" of at least {cache.min_size_gb} GB"
    raise CacheRefused(
        f"{node}: nvme_cache: no NVMe drive has a {wanted}; the node has: {listed or 'none'}"
    )


def check_filters(cache: NvmeCache, drives: list[Drive], node: str) -> None:
    """Named drives must also fit match_model and min_size_gb where those are given."""
    if not cache.devices:
        return
    for drive in drives:
        if not model_matches(cache, drive.model, drive.size):
            raise CacheRefused(
                f"{node}: nvme_cache: {drive.describe()} is a {drive.model or 'unknown model'} "
                f"of {(drive.size or 0) / 10**9:.0f} GB, which does not match "
                f"match_model {cache.match_model!r} / min_size_gb {cache.min_size_gb}"
            )


def check_md_support(facts: CacheFacts, count: int, node: str) -> None:
    if facts.arrays["supported"]:
        return
    status = facts.md_modules or {"container": "none", "modules": {}}
    container = status["container"]
    if container == "none" and all(
        status["modules"].get(module, {}).get("available") for module in MD_MODULES
    ):
        return  # mdadm loads md_mod and raid0 when it creates the array
    why = (
        f"this {container} container cannot load md_mod and raid0"
        if container != "none"
        else "modinfo finds no md_mod/raid0 for the running kernel"
    )
    raise CacheRefused(
        f"{node}: nvme_cache: {count} drives need a RAID0 array, but the kernel has no md "
        f"driver here (/proc/mdstat is absent; {why})"
    )


def our_array(arrays: dict[str, Any], devnos: set[str]) -> dict[str, Any] | None:
    """The gpunode array (by its name) made of exactly these drives, if there is one."""
    for array in arrays["arrays"]:
        names = {array.get("devname"), (array.get("md_name") or "").rsplit(":", 1)[-1]}
        if set(array["members"]) == devnos and ARRAY_NAME in names:
            return array
    return None


def fstab_names(fstab: list[dict[str, str]], mount_point: str, uuid: str | None) -> bool:
    return uuid is not None and any(
        entry["file"] == mount_point and entry["spec"] == f"UUID={uuid}" for entry in fstab
    )


def built_filesystem(
    probe: dict[str, Any], cache: NvmeCache, facts: CacheFacts
) -> dict[str, Any] | None:
    """The wanted filesystem that gpunode built on this device, or None."""
    signatures = probe["signatures"]
    if len(signatures) != 1 or probe["partitions"] or probe["holders"] or probe["unreadable"]:
        return None
    signature = signatures[0]
    if signature["type"] != cache.filesystem:
        return None
    if set(probe["mounts"]) - {cache.mount_point}:
        return None
    mounted_here = facts.mount is not None and facts.mount.get("devno") == probe["devno"]
    if (
        mounted_here
        or fstab_names(facts.fstab, cache.mount_point, signature.get("uuid"))
        or signature.get("label") == FILESYSTEM_LABEL
    ):
        return signature
    return None


def check_mount_point(cache: NvmeCache, facts: CacheFacts, devno: str | None, node: str) -> None:
    mount = facts.mount
    if mount is None or (devno is not None and mount.get("devno") == devno):
        return
    raise CacheRefused(
        f"{node}: nvme_cache: {cache.mount_point} already has {mount.get('source')} "
        f"({mount.get('fstype')}) mounted; gpunode does not mount over it"
    )


def plan_cache(cache: NvmeCache, facts: CacheFacts, node: str) -> CachePlan:
    """What to do to the drives, or CacheRefused naming node, drive, serial and what it holds."""
    drives = resolve_drives(selected_paths(cache, facts, node), facts, node)
    check_filters(cache, drives, node)
    if len(drives) > 1:
        check_md_support(facts, len(drives), node)
        array = our_array(facts.arrays, {drive.devno for drive in drives})
        if array is not None:
            return _existing_array_plan(cache, facts, tuple(drives), array, node)
    else:
        signature = built_filesystem(drives[0].probe, cache, facts)
        if signature is not None:
            check_mount_point(cache, facts, drives[0].devno, node)
            return CachePlan(tuple(drives), target=drives[0].path, uuid=signature.get("uuid"))

    wipe: list[Drive] = []
    problems: list[str] = []
    allowed = set(cache.wipe_allowed_serials)
    for drive in drives:
        blocked = blocking_use(drive.probe)
        data = data_on(drive.probe)
        if blocked:
            problems.append(f"{node}: nvme_cache: {drive.describe()}: {blocked}; refusing it")
        elif data and drive.serial and drive.serial in allowed:
            wipe.append(drive)
        elif data:
            allow = (
                f"list serial {drive.serial} in nvme_cache.wipe_allowed_serials to allow wiping it"
                if drive.serial
                else "its serial is unknown, so it can only be cleared by hand (wipefs)"
            )
            problems.append(
                f"{node}: nvme_cache: {drive.describe()} carries {data}; refusing to destroy "
                f"data: {allow}"
            )
    if problems:
        raise CacheRefused("\n".join(problems))
    check_mount_point(cache, facts, None, node)
    raid = len(drives) > 1
    return CachePlan(
        tuple(drives),
        wipe=tuple(wipe),
        create_array=raid,
        make_filesystem=True,
        target=None if raid else drives[0].path,
    )


def _existing_array_plan(
    cache: NvmeCache,
    facts: CacheFacts,
    drives: tuple[Drive, ...],
    array: dict[str, Any],
    node: str,
) -> CachePlan:
    path = f"/dev/{array['name']}"
    probe = facts.devices["devices"].get(path)
    if probe is None or probe["kind"] != "block":
        raise CacheRefused(
            f"{node}: nvme_cache: the gpunode array {array['name']} exists but {path} is not a "
            "block device here"
        )
    check_mount_point(cache, facts, probe["devno"], node)
    blocked = blocking_use({**probe, "mounts": set(probe["mounts"]) - {cache.mount_point}})
    if blocked:
        raise CacheRefused(f"{node}: nvme_cache: the gpunode array {path}: {blocked}")
    signatures = probe["signatures"]
    if not signatures:
        return CachePlan(drives, make_filesystem=True, target=path)
    if len(signatures) == 1 and signatures[0]["type"] == cache.filesystem:
        return CachePlan(drives, target=path, uuid=signatures[0].get("uuid"))
    raise CacheRefused(
        f"{node}: nvme_cache: the gpunode array {path} carries {data_on(probe)}, but "
        f"nvme_cache.filesystem is {cache.filesystem}; gpunode never reformats a cache that "
        "holds a filesystem (unmount it and wipe it by hand to rebuild it)"
    )


def refuse_symlinked_mount_point(cache: NvmeCache) -> None:
    """A mount point that passes through a symbolic link is refused before anything changes:
    ``mkdir -p`` and ``mount`` follow it, so the cache would land wherever it points (over
    ``/etc``, say), past the model's system-directory check."""
    link = host.get_fact(SymlinkOnPath, path=cache.mount_point)
    if link is not None:
        raise NodeRefused(
            f"{host.name}: nvme_cache: mount point {cache.mount_point} passes through the "
            f"symbolic link {link['path']} (-> {link['target']}), which mount and mkdir follow; "
            "set nvme_cache.mount_point to the real directory"
        )


def refused_at_prepare(error: CacheRefused) -> NodeRefused:
    return NodeRefused(str(error))


# --- commands ----------------------------------------------------------------------------


UUID_VARIABLE = "$uuid"


def quoted_with_uuid(text: str) -> str:
    """``text`` as one shell word, literal but for "$uuid", which the shell expands.

    The fstab and mdadm.conf lines carry data (the mount point) and node output (a UUID); no
    character of them may be read by the shell, except the variable a predicted run fills.
    """
    return '"$uuid"'.join(shlex.quote(part) for part in text.split(UUID_VARIABLE))


def mkfs_command(filesystem: str, device: str) -> str:
    quoted = shlex.quote(device)
    make = {
        "xfs": f"mkfs.xfs -q -L {FILESYSTEM_LABEL} {quoted}",
        # No blocks reserved for root: a cache is not a system filesystem.
        "ext4": f"mkfs.ext4 -q -m 0 -L {FILESYSTEM_LABEL} {quoted}",
    }[filesystem]
    # The drive was read before this run; refuse if anything was written to it since.
    return (
        f'if [ -n "$(wipefs --no-act --noheadings --output TYPE {quoted})" ]; then '
        f"echo {shlex.quote(device + ' carries a signature now; not making a filesystem on it')}"
        " >&2; exit 1; "
        f"fi; {make}"
    )


def volume_commands(cache: NvmeCache, plan: CachePlan) -> list[str]:
    commands = [f"wipefs --all {shlex.quote(drive.path)}" for drive in plan.wipe]
    if plan.create_array:
        members = " ".join(shlex.quote(drive.path) for drive in plan.drives)
        commands.append(
            f"mdadm --create {ARRAY_PATH} --name={ARRAY_NAME} --level=0 "
            f"--raid-devices={len(plan.drives)} --metadata=1.2 --run {members}"
            # Where udev runs, /dev/md/gpunode-cache is its link: wait for it.
            " && if command -v udevadm >/dev/null 2>&1; then udevadm settle; fi"
        )
    if plan.make_filesystem:
        commands.append(mkfs_command(cache.filesystem, plan.target_path))
    return commands


@operation()
def cache_volume(cache: NvmeCache):
    """The chosen drives carry the wanted filesystem (on a RAID0 array if several).

    Drives are read again right before anything is written; a drive that holds data and is
    not allowed to be wiped stops the run.

    + cache: the declared cache (``DesiredState.nvme_cache``): which drives, filesystem, and
      whether drives that hold data may be wiped
    """
    try:
        plan = plan_cache(cache, gather_cache_facts(cache), host.name)
    except CacheRefused as error:
        raise OperationError(str(error)) from error
    commands = volume_commands(cache, plan)
    if not commands:
        layout = f"RAID0 array {plan.target_path} of" if plan.raid else "drive"
        host.noop(
            f"{cache.filesystem} filesystem (UUID {plan.uuid}) already on the gpunode {layout} "
            f"{', '.join(drive.path for drive in plan.drives)}"
        )
    yield from commands


def fstab_line(cache: NvmeCache, uuid: str) -> str:
    options = f"defaults,noatime,nofail,x-systemd.device-timeout={cache.device_timeout_s}s"
    passno = "2" if cache.filesystem == "ext4" else "0"  # fsck.xfs does nothing
    return f"UUID={uuid} {cache.mount_point} {cache.filesystem} {options} 0 {passno}"


def fstab_command(cache: NvmeCache, line: str) -> str:
    """Replace every fstab entry for the mount point with ``line`` (may hold "$uuid")."""
    mount_point = shlex.quote(cache.mount_point)
    return (
        f"tmp=$(mktemp {FSTAB_PATH}.gpunode.XXXXXX) && "
        f"awk -v mp={mount_point} '$1 ~ /^#/ || $2 != mp' {FSTAB_PATH} > \"$tmp\" && "
        f'printf "%s\\n" {quoted_with_uuid(line)} >> "$tmp" && chmod 644 "$tmp" && '
        f'mv "$tmp" {FSTAB_PATH} && '
        # systemd turns fstab into mount units: it must see the new entry.
        "if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi"
    )


def current_target(paths: list[str]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(probe of the device that carries the filesystem, the gpunode array), as they are now.

    Either is None where it does not exist yet (predicting a run that creates it).
    """
    if len(paths) == 1:
        return host.get_fact(BlockDevices, paths=paths)["devices"].get(paths[0]), None
    arrays = host.get_fact(MdArrays)
    devices = host.get_fact(
        BlockDevices, paths=paths + [f"/dev/{array['name']}" for array in arrays["arrays"]]
    )["devices"]
    devnos = {
        probe["devno"]
        for path, probe in devices.items()
        if path in paths and probe["kind"] == "block"
    }
    array = our_array(arrays, devnos)
    return (devices.get(f"/dev/{array['name']}") if array else None), array


def filesystem_uuid(cache: NvmeCache, probe: dict[str, Any] | None) -> str | None:
    if probe is None or probe["kind"] != "block":
        return None
    wanted = [s for s in probe["signatures"] if s["type"] == cache.filesystem and s.get("uuid")]
    return wanted[0]["uuid"] if len(wanted) == 1 else None


@operation()
def cache_fstab(cache: NvmeCache, paths: list[str]):
    """/etc/fstab mounts the cache's filesystem by UUID at the mount point, and nothing else
    there: noatime, nofail and a device timeout, so boot never hangs on a dead drive.

    + cache: the declared cache: mount point, filesystem and device timeout
    + paths: the chosen drives' device paths (from the plan made at prepare time); with
      several, the filesystem is on the gpunode RAID0 array built from them
    """
    probe, _ = current_target(paths)
    uuid = filesystem_uuid(cache, probe)
    if uuid is None:
        # Only when predicting a run that makes the filesystem: read its UUID then.
        device = shlex.quote(paths[0] if len(paths) == 1 else ARRAY_PATH)
        yield (
            f'uuid=$(blkid -p -s UUID -o value {device}) && [ -n "$uuid" ] && '
            + fstab_command(cache, fstab_line(cache, "$uuid"))
        )
        return
    line = fstab_line(cache, uuid)
    fstab = host.get_fact(FstabEntries)
    entries = [entry for entry in fstab if entry["file"] == cache.mount_point]
    if [" ".join(entry["line"].split()) for entry in entries] == [line]:
        host.noop(f"{FSTAB_PATH} mounts UUID={uuid} at {cache.mount_point}")
        return
    yield fstab_command(cache, line)


@operation()
def cache_mounted(cache: NvmeCache, paths: list[str]):
    """The cache's filesystem is mounted (noatime) at the mount point, from its fstab entry.

    Something else mounted there is an error.

    + cache: the declared cache (its mount point)
    + paths: the chosen drives' device paths (from the plan made at prepare time); with
      several, the filesystem is on the gpunode RAID0 array built from them
    """
    probe, _ = current_target(paths)
    mount = host.get_fact(MountPoint, path=cache.mount_point)
    mount_point = shlex.quote(cache.mount_point)
    if mount is None:
        yield f"mount {mount_point}"
        return
    if probe is None or mount.get("devno") != probe.get("devno"):
        raise OperationError(
            f"{host.name}: nvme_cache: {cache.mount_point} has {mount.get('source')} mounted, "
            "not the cache"
        )
    if "noatime" not in mount["options"]:
        yield f"mount -o remount,noatime {mount_point}"
        return
    host.noop(f"{cache.mount_point} is mounted from {mount.get('source')} with noatime")


def mdadm_conf_line(uuid: str) -> str:
    return f"ARRAY {ARRAY_PATH} metadata=1.2 UUID={uuid}"


def mdadm_conf_command(line: str, uuid: str) -> str:
    """Put ``line`` in mdadm.conf in place of any line for the array, then the initramfs."""
    pattern = f"^[[:space:]]*ARRAY[[:space:]]+({ARRAY_PATH}[[:space:]]|.*UUID={uuid})"
    return (
        f"mkdir -p /etc/mdadm && touch {MDADM_CONF_PATH} && "
        f"tmp=$(mktemp {MDADM_CONF_PATH}.gpunode.XXXXXX) && "
        f'{{ grep -v -E {quoted_with_uuid(pattern)} {MDADM_CONF_PATH} || true; }} > "$tmp" && '
        f'printf "%s\\n" {quoted_with_uuid(line)} >> "$tmp" && chmod 644 "$tmp" && '
        f'mv "$tmp" {MDADM_CONF_PATH} && '
        # The initramfs keeps its own copy of mdadm.conf; Debian's mdadm warns when they differ.
        "if command -v update-initramfs >/dev/null 2>&1; then update-initramfs -u; fi"
    )


@operation()
def cache_array_config(cache: NvmeCache, paths: list[str]):
    """/etc/mdadm/mdadm.conf names the gpunode array (and the initramfs has that copy).

    + cache: the declared cache
    + paths: the device paths of the drives the array is built from (at least two)
    """
    _, array = current_target(paths)
    uuid = array.get("uuid") if array else None
    if uuid is None:
        # Only when predicting a run that creates the array: read its UUID then.
        yield (
            f"uuid=$(mdadm --detail --export {ARRAY_PATH} | sed -n 's/^MD_UUID=//p') && "
            '[ -n "$uuid" ] && ' + mdadm_conf_command(mdadm_conf_line("$uuid"), "$uuid")
        )
        return
    line = mdadm_conf_line(uuid)
    present = host.get_fact(MdadmConfArrays) or []
    ours = [entry for entry in present if ARRAY_PATH in entry.split() or f"UUID={uuid}" in entry]
    if ours == [line]:
        host.noop(f"{MDADM_CONF_PATH} names the gpunode array (UUID {uuid})")
        return
    yield mdadm_conf_command(line, uuid)


# --- cachefilesd -------------------------------------------------------------------------


def render_cachefilesd_conf(cache: NvmeCache) -> str:
    return (
        "# Managed by gpunode (nvme_cache.cachefilesd); local edits are replaced.\n"
        f"dir {cache.mount_point.rstrip('/')}/{FSCACHE_DIR}\n"
        "tag gpunode\n"
        # cachefilesd's own defaults: culling starts at 7% free, stops caching at 3%.
        "brun 10%\nbcull 7%\nbstop 3%\nfrun 10%\nfcull 7%\nfstop 3%\n"
    )


def cachefiles_unavailable(status: dict[str, Any], device_present: bool) -> str | None:
    """Why cachefilesd cannot run here, or None."""
    if device_present:
        return None
    module = status["modules"].get("cachefiles", {"loaded": False, "available": False})
    if module["loaded"]:
        return None
    if status["container"] != "none":
        return (
            f"{CACHEFILES_DEVICE} is absent and this {status['container']} container cannot load "
            "the cachefiles module"
        )
    if not module["available"]:
        return "the running kernel has no cachefiles module (modinfo finds none)"
    return None  # its unit loads the module when it starts


@operation()
def cachefilesd_running():
    """cachefilesd runs where the kernel offers FS-Cache (cachefiles); otherwise says why not."""
    unit = host.get_fact(UnitState, unit=CACHEFILESD_UNIT)
    status = host.get_fact(KernelModuleStatus, modules=["cachefiles"])
    reason = cachefiles_unavailable(status, bool(host.get_fact(File, path=CACHEFILES_DEVICE)))
    if reason:
        host.noop(f"cachefilesd configured (RUN=yes) but not started: {reason}")
        return
    if unit["active"]:
        host.noop("cachefilesd is running")
        return
    yield f"systemctl start {CACHEFILESD_UNIT}"


# --- the role ----------------------------------------------------------------------------


@deploy("NVMe cache")
def nvme_cache(desired: DesiredState) -> None:
    cache = desired.nvme_cache
    if not cache.enabled:
        return
    refuse_symlinked_mount_point(cache)
    try:
        plan = plan_cache(cache, gather_cache_facts(cache), host.name)
    except CacheRefused as error:
        raise refused_at_prepare(error) from error
    paths = [drive.path for drive in plan.drives]

    packages = ["xfsprogs"] if cache.filesystem == "xfs" else ["e2fsprogs"]
    if plan.raid:
        packages.append("mdadm")
    install_packages("Cache filesystem tools", packages)
    cache_volume(name="Cache filesystem on the chosen drives", cache=cache)
    if plan.raid:
        cache_array_config(name="Cache array in mdadm.conf", cache=cache, paths=paths)
    cache_fstab(name="Cache in /etc/fstab", cache=cache, paths=paths)
    files.directory(name="Cache mount point", path=cache.mount_point)
    cache_mounted(name="Cache mounted", cache=cache, paths=paths)
    if cache.cachefilesd:
        _cachefilesd(cache)


def _cachefilesd(cache: NvmeCache) -> None:
    install_packages("NFS FS-Cache daemon (cachefilesd)", ["cachefilesd"])
    files.directory(
        name="FS-Cache directory on the cache",
        path=f"{cache.mount_point.rstrip('/')}/{FSCACHE_DIR}",
        mode="700",
        user="root",
        group="root",
    )
    config = files.put(
        name="cachefilesd keeps its cache on the NVMe cache",
        src=StringIO(render_cachefilesd_conf(cache)),
        dest=CACHEFILESD_CONF_PATH,
        mode="644",
        user="root",
        group="root",
    )
    enabled = files.line(
        name="cachefilesd enabled (RUN=yes)",
        path=CACHEFILESD_DEFAULT_PATH,
        line=r"^#?\s*RUN=.*$",
        replace="RUN=yes",
        extended_regex=True,
    )
    status = host.get_fact(KernelModuleStatus, modules=["cachefiles"])
    if not cachefiles_unavailable(status, bool(host.get_fact(File, path=CACHEFILES_DEVICE))):
        systemd.service(
            name="cachefilesd restarted for its new configuration",
            service=CACHEFILESD_UNIT,
            restarted=True,
            _if=lambda: config.did_change() or enabled.did_change(),
        )
    cachefilesd_running(name="cachefilesd running")

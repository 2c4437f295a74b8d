"""Shared training data: NFS and Lustre client mounts as systemd automounts (``shared_data``).

What results for each of ``shared_data.mounts``:

* ``<path>.mount`` and ``<path>.automount`` in /etc/systemd/system
  (``gpunode.expected.shared_data``); the automount enabled (``remote-fs.target``) and
  started: the file system is mounted on first access, so a node whose server is down boots
  and the drift check reports the mount.
* The client: ``nfs-common`` for NFS; for Lustre, ``shared_data.lustre_packages`` from
  ``shared_data.lustre_repository_url`` (validation refuses a Lustre mount without them, so
  nothing is half-installed).
* With ``fsc``, the mount unit wants and follows ``cachefilesd.service``, which the NVMe cache
  role runs on the cache (validation requires ``nvme_cache.cachefilesd``).

Before anything changes, every mount point is read: one that passes through a symbolic link,
is something other than a directory, is a directory that holds data, or has another file
system mounted on it is refused, naming it. A changed unit is not remounted under running
jobs: the run says so, and the new options apply at the next mount (drain the node and
restart the mount unit to apply them now).

Units gpunode wrote for mounts no longer declared are stopped, disabled and removed.
"""

from __future__ import annotations

import shlex
from io import StringIO
from typing import Any

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus
from pyinfra.operations import apt, files

from facts.fabric import Mounts
from facts.paths import SymlinkOnPath
from facts.shared_data import ManagedMountUnits, MountPointState
from gpunode.expected import shared_data as expected
from gpunode.model import DesiredState, SharedMount
from gpunode.refusal import NodeRefused
from roles.nvidia_repos import NvidiaRepository, _local_keyring
from roles.packages import install_packages


def mount_point_refusal(
    mount: SharedMount,
    mounted: dict[str, Any] | None,
    state: dict[str, Any] | None,
    link: dict[str, str] | None,
) -> str | None:
    """Why ``mount`` cannot be set up on this node as it is, or None.

    + mounted: what /proc/self/mounts lists at the mount point (None: nothing)
    + state: ``MountPointState`` of the mount point (read only when nothing is mounted)
    + link: ``SymlinkOnPath`` of the mount point
    """
    point = mount.mount_point
    where = f"shared_data: mount point {point}"
    if link is not None:
        return (
            f"{where} passes through the symbolic link {link['path']} (-> {link['target']}), "
            "which systemd and mount follow; declare the real directory"
        )
    if mounted is not None:
        fstype = mounted.get("fstype")
        ours = fstype == expected.AUTOFS or (
            fstype in expected.MOUNTED_TYPES[mount.kind]
            and mounted.get("source") == expected.source(mount)
        )
        if not ours:
            return (
                f"{where} already has {mounted.get('source')} ({fstype}) mounted on it; "
                "unmount it (and remove what mounts it) or declare another mount point"
            )
        return None
    if state is None or state["kind"] == "other":
        return f"{where} exists and is not a directory; remove it or declare another path"
    if state["kind"] == "directory" and not state["empty"]:
        return (
            f"{where} is a directory that holds files, which the mount would hide; move them "
            "away or declare another mount point"
        )
    return None


def refuse_unsafe_mount_points(mounts: tuple[SharedMount, ...]) -> None:
    """Every declared mount point read before anything changes; the first unsafe one named."""
    table = host.get_fact(Mounts)
    unmounted = [mount.mount_point for mount in mounts if mount.mount_point not in table]
    states = host.get_fact(MountPointState, paths=unmounted) if unmounted else {}
    for mount in mounts:
        link = host.get_fact(SymlinkOnPath, path=mount.mount_point)
        reason = mount_point_refusal(
            mount, table.get(mount.mount_point), states.get(mount.mount_point), link
        )
        if reason:
            raise NodeRefused(f"{host.name}: {reason}")


@operation()
def automount_active(mount: SharedMount, reload: bool = False, changed: bool = False):
    """The mount's automount unit is enabled and active; a changed mount unit is named, not
    remounted under running jobs.

    + mount: the declared mount
    + reload: a unit file changed in this run (systemd reads them again)
    + changed: the mount unit changed (its options apply at the next mount)
    """
    unit = expected.automount_unit(mount)
    if reload:
        yield "systemctl daemon-reload"
    enabled = host.get_fact(SystemdEnabled, services=[unit]).get(unit)
    running = host.get_fact(SystemdStatus, services=[unit]).get(unit)
    if not enabled or not running:
        yield f"systemctl enable --now {shlex.quote(unit)}"
    if changed and host.get_fact(Mounts).get(mount.mount_point, {}).get("fstype") not in (
        None,
        expected.AUTOFS,
    ):
        host.noop(
            f"{expected.mount_unit(mount)} changed while mounted: the new unit applies at the "
            f"next mount (drain, then systemctl restart {expected.mount_unit(mount)})"
        )
    elif enabled and running and not reload:
        host.noop(f"{unit} enabled and active")


@operation()
def undeclared_units_removed(declared: list[str]):
    """Units gpunode wrote for mounts no longer declared are stopped, disabled, removed.

    + declared: the unit file names of the mounts declared now
    """
    stale = [name for name in host.get_fact(ManagedMountUnits) if name not in declared]
    if not stale:
        host.noop("no shared-data unit left from an earlier declaration")
        return
    # Automounts first: stopping one leaves its mount unit to be stopped (unmounted) next.
    for name in sorted(stale, key=lambda unit: not unit.endswith(".automount")):
        yield f"systemctl disable --now {shlex.quote(name)}"
    yield "rm -f " + " ".join(shlex.quote(f"{expected.UNIT_DIRECTORY}/{name}") for name in stale)
    yield "systemctl daemon-reload"


def lustre_repository(desired: DesiredState) -> NvidiaRepository:
    """The declared Lustre client repository, as apt's other flat repositories are written."""
    wanted = desired.shared_data
    return NvidiaRepository(
        expected.LUSTRE_REPOSITORY_NAME, wanted.lustre_repository_url or "",
        wanted.lustre_repository_keyring, "shared_data.lustre_repository_keyring",
        "shared_data.lustre_repository_url", "lustre" in wanted.kinds,
    )  # fmt: skip


def _lustre_client(desired: DesiredState) -> None:
    source = lustre_repository(desired)
    keyring = files.put(
        name=f"{source.name} signing keyring", src=str(_local_keyring(source)),
        dest=source.keyring_path, mode="644",
    )  # fmt: skip
    sources = files.put(
        name=f"{source.name} source (shared_data.lustre_repository_url)",
        src=StringIO(source.render_sources()), dest=source.sources_path, mode="644",
    )  # fmt: skip
    apt.update(
        name="Refresh package lists after the Lustre source changed",
        _if=lambda: keyring.did_change() or sources.did_change(),
    )
    install_packages(
        "Lustre client (shared_data.lustre_packages)", list(desired.shared_data.lustre_packages)
    )


@deploy("Shared data")
def shared_data(desired: DesiredState) -> None:
    """After the NVMe cache (cachefilesd) and before the workload scheduler."""
    mounts = desired.shared_data.mounts
    declared = [
        name for m in mounts for name in (expected.mount_unit(m), expected.automount_unit(m))
    ]
    undeclared_units_removed(name="Shared-data units no longer declared removed", declared=declared)
    if "lustre" not in desired.shared_data.kinds:
        files.file(
            name="No Lustre client source (none declared)",
            path=lustre_repository(desired).sources_path, present=False,
        )  # fmt: skip
    if not mounts:
        return
    refuse_unsafe_mount_points(mounts)
    if "nfs" in desired.shared_data.kinds:
        install_packages("NFS client (nfs-common)", [expected.NFS_CLIENT_PACKAGE])
    if "lustre" in desired.shared_data.kinds:
        _lustre_client(desired)
    for mount in mounts:
        mount_file = files.put(
            name=f"{expected.mount_unit(mount)}: {mount.kind} {expected.source(mount)}",
            src=StringIO(expected.render_mount_unit(mount)),
            dest=f"{expected.UNIT_DIRECTORY}/{expected.mount_unit(mount)}",
            mode="644", user="root", group="root",
        )  # fmt: skip
        automount_file = files.put(
            name=f"{expected.automount_unit(mount)}: mounted on first access",
            src=StringIO(expected.render_automount_unit(mount)),
            dest=f"{expected.UNIT_DIRECTORY}/{expected.automount_unit(mount)}",
            mode="644", user="root", group="root",
        )  # fmt: skip
        automount_active(
            name=f"{expected.automount_unit(mount)} enabled and active",
            mount=mount,
            reload=mount_file.will_change or automount_file.will_change,
            changed=mount_file.will_change,
        )

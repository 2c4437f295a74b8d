"""What ``shared_data`` means on a node: a systemd mount unit and automount unit per shared
file system, their names, and what the kernel then lists in /proc/self/mounts.

Units, not /etc/fstab lines: systemd.mount(5) ("Mount units must be named after the mount
point directories they control"; a mount unit "may be accompanied by an automount unit") and
systemd.automount(5); ``_netdev`` in Options= marks a network file system, ordered after the
network (systemd.mount(5), "Mount Units Versus /etc/fstab"; https://man.archlinux.org/man/
systemd.mount.5, read 2026-12-07). The automount unit is what is enabled (wanted by
``remote-fs.target``): boot sets up an autofs trigger and never waits for the server; the
mount itself happens on first access, each attempt bounded by ``mount_timeout_s``.

Used by ``roles.shared_data`` (which writes the units) and the drift rules (which compare the
kernel's mount table with them).
"""

from __future__ import annotations

from gpunode.model import SharedMount

UNIT_DIRECTORY = "/etc/systemd/system"
# The first line of every unit this role writes: how a later run finds the units it wrote
# for mounts no longer declared (mount unit names are fixed by their paths, so no prefix).
MARKER = "# Managed by gpunode (roles/shared_data.py)"
# Debian's NFS client: mount.nfs and nfs(5) come in nfs-common (the nfs(5) man page's
# "Provided by: nfs-common", https://manpages.ubuntu.com/manpages/bionic/man5/nfs.5.html,
# read 2026-12-07).
NFS_CLIENT_PACKAGE = "nfs-common"
LUSTRE_REPOSITORY_NAME = "lustre-client"
CACHEFILESD_UNIT = "cachefilesd.service"
# What the kernel lists for each kind once mounted; autofs while the automount waits.
MOUNTED_TYPES = {"nfs": ("nfs4",), "lustre": ("lustre",)}
AUTOFS = "autofs"


def one_line(text: str) -> str:
    """``text`` as one value of a unit file: validation allows no control character, space
    or '%' (a systemd specifier) in it, and the renderer refuses one rather than write it."""
    if not text.isprintable() or " " in text or "%" in text:
        raise ValueError(f"refusing to render {text!r}: a control character, space or '%'")
    return text


_UNESCAPED = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:_.")


def unit_stem(path: str) -> str:
    """The unit name systemd gives ``path`` (``systemd-escape --path``, systemd.unit(5),
    "String Escaping for Inclusion in Unit Names"): the outer '/' dropped, each inner '/'
    a '-', every other byte outside [A-Za-z0-9:_.] and a leading '.' written as \\xNN."""
    trimmed = path.strip("/")
    if not trimmed:
        return "-"
    out = []
    for index, char in enumerate(trimmed):
        if char == "/":
            out.append("-")
        elif char in _UNESCAPED and not (index == 0 and char == "."):
            out.append(char)
        else:
            out.extend(f"\\x{byte:02x}" for byte in char.encode())
    return "".join(out)


def mount_unit(mount: SharedMount) -> str:
    return f"{unit_stem(mount.mount_point)}.mount"


def automount_unit(mount: SharedMount) -> str:
    return f"{unit_stem(mount.mount_point)}.automount"


def source(mount: SharedMount) -> str:
    """What= of the mount unit, and the source /proc/self/mounts then lists:
    ``server:/export`` (an IPv6 server in brackets), or ``nids:/fsname`` for Lustre."""
    if mount.kind == "lustre":
        return f"{mount.server}:/{mount.export}"
    server = f"[{mount.server}]" if ":" in mount.server else mount.server
    return f"{server}:{mount.export}"


def options(mount: SharedMount) -> list[str]:
    """The mount options, in a fixed order: gpunode's own, then the declared ones."""
    own = ["_netdev", "ro" if mount.read_only else "rw"]
    if mount.kind == "nfs":
        own.append(f"vers={mount.nfs_version}")
        if mount.nconnect is not None:
            own.append(f"nconnect={int(mount.nconnect)}")
        if mount.fsc:
            own.append("fsc")
    return own + list(mount.options)


def expected_kernel_options(mount: SharedMount) -> list[str]:
    """Options the kernel lists in /proc/self/mounts when the mount is as declared (a subset
    of what it lists): ro or rw, and for NFS vers= and nconnect= (shown when above 1)."""
    wanted = ["ro" if mount.read_only else "rw"]
    if mount.kind == "nfs":
        wanted.append(f"vers={mount.nfs_version}")
        if mount.nconnect is not None and mount.nconnect > 1:
            wanted.append(f"nconnect={int(mount.nconnect)}")
        if mount.fsc:
            wanted.append("fsc")
    return wanted


def _after(mount: SharedMount) -> str:
    units = ["network-online.target"]
    if mount.fsc:
        units.append(CACHEFILESD_UNIT)
    return " ".join(units)


def render_mount_unit(mount: SharedMount) -> str:
    """The mount unit: the file system, its options and a bound on each mount attempt.

    Every value is validated to a strict character set without '%', quotes or spaces, so
    systemd reads it as written; ``one_line`` refuses a control character all the same."""
    kind = "nfs" if mount.kind == "nfs" else "lustre"
    return (
        f"{MARKER}: shared data, mounted on first access\n"
        "[Unit]\n"
        f"Description=Shared data at {one_line(mount.mount_point)} ({kind}, declared by "
        "gpunode)\n"
        f"Wants={_after(mount)}\n"
        f"After={_after(mount)}\n"
        "\n"
        "[Mount]\n"
        f"What={one_line(source(mount))}\n"
        f"Where={one_line(mount.mount_point)}\n"
        f"Type={kind}\n"
        f"Options={one_line(','.join(options(mount)))}\n"
        f"TimeoutSec={int(mount.mount_timeout_s)}\n"
    )


def render_automount_unit(mount: SharedMount) -> str:
    """The automount unit: the autofs trigger set up at boot (remote-fs.target)."""
    return (
        f"{MARKER}: the trigger that mounts {one_line(mount.mount_point)} on first access\n"
        "[Unit]\n"
        f"Description=Shared data at {one_line(mount.mount_point)} (automount, declared by "
        "gpunode)\n"
        "\n"
        "[Automount]\n"
        f"Where={one_line(mount.mount_point)}\n"
        "\n"
        "[Install]\n"
        "WantedBy=remote-fs.target\n"
    )

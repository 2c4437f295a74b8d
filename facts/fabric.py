"""Fabric and storage facts: interfaces, RDMA devices, kernel modules, memlock, block devices,
md arrays, fstab, mounts, mdadm.conf and systemd units.

Each fact is one shell command (one SSH round trip). The block device fact reads what the
kernel and the on-disk signatures say, not what udev's database remembers: inside a container
there is no udev, and a stale database must never make a drive that holds data look empty.
Signatures are read twice, by ``wipefs --no-act`` (every signature, partition tables included)
and by ``blkid -p`` (low-level probe, no cache); a device either of them cannot read is
reported as unreadable, which callers treat as data.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from pyinfra.api import FactBase

from gpunode import framing
from gpunode.sanitize import parse_json

MARKER = "gpunode:"

# systemd-detect-virt answers "none" outside a container; Docker's and Podman's marker files
# answer where systemd's tools are missing.
CONTAINER_SNIPPET = (
    "virt=$(systemd-detect-virt --container 2>/dev/null); "
    'if [ -z "$virt" ] || [ "$virt" = none ]; then '
    "  if [ -e /.dockerenv ]; then virt=docker; "
    "  elif [ -e /run/.containerenv ]; then virt=podman; else virt=none; fi; "
    "fi; "
    'echo "container=$virt"; '
)


def _key_values(line: str) -> dict[str, str]:
    """'a=1 b=two' -> {'a': '1', 'b': 'two'} (values hold no spaces)."""
    pairs = (part.split("=", 1) for part in line.split() if "=" in part)
    return {key: value for key, value in pairs}


def unescape_octal(text: str) -> str:
    """fstab and mountinfo write blanks and backslashes as octal escapes (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), text)


# --- network -------------------------------------------------------------------------------


def parse_ip_addresses(text: str) -> dict[str, dict[str, Any]]:
    """``ip -json address show`` (or bare names from /sys/class/net) -> per-interface state."""
    stripped = text.strip()
    if not stripped.startswith("["):
        return {
            name: {"mtu": None, "operstate": None, "addresses": []} for name in stripped.split()
        }
    interfaces: dict[str, dict[str, Any]] = {}
    for entry in parse_json(stripped):
        addresses = [
            f"{info['local']}/{info['prefixlen']}"
            for info in entry.get("addr_info", [])
            if "local" in info and "prefixlen" in info
        ]
        interfaces[entry["ifname"]] = {
            "mtu": entry.get("mtu"),
            "operstate": entry.get("operstate"),
            "addresses": addresses,
        }
    return interfaces


class NetworkInterfaces(FactBase[dict[str, dict[str, Any]]]):
    """
    Interfaces of the node's network namespace with their MTU, state and addresses.

    .. code:: python

        {"eth0": {"mtu": 1500, "operstate": "UP", "addresses": ["10.0.0.5/24"]}}
    """

    def command(self) -> str:
        return (
            "if command -v ip >/dev/null 2>&1; then ip -json address show; "
            "else ls -1 /sys/class/net; fi"
        )

    def process(self, output: list[str]) -> dict[str, dict[str, Any]]:  # type: ignore[override]
        return parse_ip_addresses("\n".join(output))

    @staticmethod
    def default() -> dict[str, dict[str, Any]]:
        return {}


class RdmaDevices(FactBase[list[str]]):
    """
    RDMA devices (HCAs) the kernel registered, by name, from /sys/class/infiniband.

    .. code:: python

        ["mlx5_0", "mlx5_1"]
    """

    def command(self) -> str:
        return "ls -1 /sys/class/infiniband 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str]:  # type: ignore[override]
        return sorted(line.strip() for line in output if line.strip())

    @staticmethod
    def default() -> list[str]:
        return []


# --- kernel modules ------------------------------------------------------------------------


def module_name(name: str) -> str:
    """The kernel's spelling of a module name: modprobe treats '-' and '_' alike."""
    return name.replace("-", "_")


def parse_module_status(lines: list[str]) -> dict[str, Any]:
    container = "none"
    modules: dict[str, dict[str, bool]] = {}
    for line in lines:
        if line.startswith("container="):
            container = line.split("=", 1)[1].strip() or "none"
            continue
        values = _key_values(line)
        if "module" in values:
            modules[values["module"]] = {
                "loaded": values.get("loaded") == "yes",
                "available": values.get("available") == "yes",
            }
    return {"container": container, "modules": modules}


class KernelModuleStatus(FactBase[dict[str, Any]]):
    """
    Whether each of ``modules`` is loaded (or built in), whether the running kernel has it
    (``modinfo``), and the container type (``none`` on a host or VM).

    .. code:: python

        {
            "container": "docker",
            "modules": {"ib_umad": {"loaded": False, "available": False}},
        }
    """

    def command(self, modules: list[str]) -> str:
        names = " ".join(shlex.quote(module_name(module)) for module in modules)
        return (
            CONTAINER_SNIPPET + f"for m in {names}; do "
            '  l=no; [ -d "/sys/module/$m" ] && l=yes; '
            '  a=no; modinfo -n "$m" >/dev/null 2>&1 && a=yes; '
            '  echo "module=$m loaded=$l available=$a"; '
            "done"
        )

    def process(self, output: list[str]) -> dict[str, Any]:  # type: ignore[override]
        return parse_module_status(list(output))

    @staticmethod
    def default() -> dict[str, Any]:
        return {"container": "none", "modules": {}}


def parse_memlock(lines: list[str]) -> dict[str, Any]:
    values: dict[str, str] = {}
    for line in lines:
        values.update(_key_values(line))
    hard = values.get("hard", "")
    bounding = int(values.get("capbnd", "0") or "0", 16)
    return {
        "container": values.get("container", "none"),
        "hard_kib": None if hard in ("", "unlimited") else int(hard),
        # CAP_SYS_RESOURCE (bit 24) lets pam_limits raise a hard limit at login.
        "can_raise": bool(bounding & (1 << 24)),
    }


class MemlockLimit(FactBase[dict[str, Any]]):
    """
    The hard locked-memory limit logins start from and whether root may raise it.

    .. code:: python

        {"container": "docker", "hard_kib": 8192, "can_raise": False}  # None: unlimited
    """

    def command(self) -> str:
        return (
            CONTAINER_SNIPPET + 'echo "hard=$(ulimit -H -l)"; '
            "echo \"capbnd=$(awk '/^CapBnd:/ {print $2}' /proc/self/status)\""
        )

    def process(self, output: list[str]) -> dict[str, Any]:  # type: ignore[override]
        return parse_memlock(list(output))

    @staticmethod
    def default() -> dict[str, Any]:
        return {"container": "none", "hard_kib": None, "can_raise": True}


# --- block devices -------------------------------------------------------------------------

_PROBE_DEVICE = r"""
echo "gpunode:device=$p"
if [ ! -e "$p" ]; then echo kind=missing; continue; fi
if [ ! -b "$p" ]; then echo kind=not-block; continue; fi
devno=$(printf '%d:%d' "0x$(stat -L -c %t "$p")" "0x$(stat -L -c %T "$p")")
sys=/sys/dev/block/$devno
echo kind=block
echo "devno=$devno"
echo "name=$(basename "$(readlink -f "$sys")")"
echo "size=$(( $(cat "$sys/size") * 512 ))"
parts=$(for d in "$sys"/*/partition; do [ -e "$d" ] && basename "$(dirname "$d")"; done)
echo "partitions=$(echo $parts)"
echo "holders=$(ls "$sys/holders" 2>/dev/null | tr '\n' ' ')"
for d in $devno $(for q in $parts; do cat "$sys/$q/dev"; done); do
  awk -v d="$d" '$3 == d {print "mount=" $5}' /proc/self/mountinfo
done
echo "lsblk=$(lsblk -J -b -d -o MODEL,SERIAL,TYPE "$p" 2>/dev/null | tr -d '\n')"
if out=$(wipefs --no-act --json "$p" 2>&1); then
  echo "wipefs=$(echo "$out" | tr -d '\n')"
else
  echo "wipefs-error=$(echo "$out" | tr '\n' ' ')"
fi
out=$(blkid -p -o export "$p" 2>&1); status=$?
echo "blkid-status=$status"
echo "$out" | sed 's/^/blkid:/'
"""


def _probe(lines: list[str], path: str) -> dict[str, Any]:
    device: dict[str, Any] = {
        "path": path,
        "kind": "missing",
        "devno": None,
        "name": None,
        "size": None,
        "model": None,
        "serial": None,
        "type": None,
        "partitions": [],
        "holders": [],
        "mounts": [],
        "signatures": [],
        "unreadable": None,
    }
    blkid: dict[str, str] = {}
    blkid_status = None
    for line in lines:
        key, _, value = line.partition("=")
        if line.startswith("blkid:"):
            name, _, probed = line[len("blkid:") :].partition("=")
            if name:
                blkid[name] = probed
        elif key == "kind":
            device["kind"] = value
        elif key == "devno":
            device["devno"] = value
        elif key == "name":
            device["name"] = value
        elif key == "size":
            device["size"] = int(value) if value.isdigit() else None
        elif key in ("partitions", "holders"):
            device[key] = value.split()
        elif key == "mount":
            # mountinfo escapes blanks as octal (\040).
            device["mounts"].append(unescape_octal(value))
        elif key == "lsblk" and value:
            entries = parse_json(value).get("blockdevices") or [{}]
            device["model"] = (entries[0].get("model") or "").strip() or None
            device["serial"] = (entries[0].get("serial") or "").strip() or None
            device["type"] = entries[0].get("type")
        elif key == "wipefs":
            signatures = parse_json(value).get("signatures", []) if value else []
            device["signatures"] = [
                {
                    "type": signature.get("type"),
                    "uuid": signature.get("uuid"),
                    "label": signature.get("label"),
                    "offset": signature.get("offset"),
                }
                for signature in signatures
            ]
        elif key == "wipefs-error":
            device["unreadable"] = f"wipefs could not read it: {value.strip()}"
        elif key == "blkid-status":
            blkid_status = int(value) if value.isdigit() else None
    if device["kind"] != "block":
        return device
    # blkid -p: 0 found something, 2 nothing; anything else (8: ambivalent) is not "empty".
    if blkid_status not in (0, 2) and device["unreadable"] is None:
        device["unreadable"] = f"blkid -p exited {blkid_status}"
    found = blkid.get("TYPE") or blkid.get("PTTYPE")
    if found is not None and not any(s["type"] == found for s in device["signatures"]):
        device["signatures"].append(
            {"type": found, "uuid": blkid.get("UUID"), "label": blkid.get("LABEL"), "offset": None}
        )
    return device


def parse_block_devices(lines: list[str]) -> dict[str, Any]:
    present: list[str] = []
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        if line.startswith(f"{MARKER}present="):
            present.append(line.split("=", 1)[1])
        elif line.startswith(f"{MARKER}device="):
            path = line.split("=", 1)[1]
            current = sections.setdefault(path, [])
        elif current is not None:
            current.append(line)
    return {
        "present": sorted(present),
        "devices": {path: _probe(body, path) for path, body in sections.items()},
    }


class BlockDevices(FactBase[dict[str, Any]]):
    """
    Each block device in ``paths`` as the kernel and its on-disk signatures describe it, and
    the block device nodes present in /dev (for error messages).

    .. code:: python

        {
            "present": ["/dev/nvme0n1", "/dev/sda"],
            "devices": {
                "/dev/nvme0n1": {
                    "path": "/dev/nvme0n1", "kind": "block",  # or missing / not-block
                    "devno": "259:0", "name": "nvme0n1", "size": 3840755982336,
                    "model": "SAMSUNG MZWLJ3T8HBLS-00007", "serial": "S4YPNE0R...",
                    "type": "disk", "partitions": [], "holders": [], "mounts": [],
                    "signatures": [{"type": "xfs", "uuid": "...", "label": None,
                                    "offset": "0x0"}],
                    "unreadable": None,  # or why the signatures could not be read
                },
            },
        }
    """

    def command(self, paths: list[str]) -> str:
        quoted = " ".join(shlex.quote(path) for path in paths)
        return (
            "for b in $(find /dev -maxdepth 1 -type b 2>/dev/null); do "
            f'echo "{MARKER}present=$b"; done; '
            f"for p in {quoted}; do {_PROBE_DEVICE} done"
        )

    def process(self, output: list[str]) -> dict[str, Any]:  # type: ignore[override]
        return parse_block_devices(list(output))

    @staticmethod
    def default() -> dict[str, Any]:
        return {"present": [], "devices": {}}


# --- md arrays -----------------------------------------------------------------------------


def parse_md_arrays(lines: list[str]) -> dict[str, Any]:
    supported = False
    arrays: list[dict[str, Any]] = []
    for line in lines:
        if line.startswith("supported="):
            supported = line.endswith("=yes")
        elif line.startswith(f"{MARKER}array="):
            arrays.append(
                {
                    "name": line.split("=", 1)[1],
                    "devno": None,
                    "level": None,
                    "state": None,
                    "members": [],
                    "uuid": None,
                    "md_name": None,
                    "devname": None,
                }
            )
        elif arrays and line.startswith("detail:"):
            key, _, value = line[len("detail:") :].partition("=")
            field = {"MD_UUID": "uuid", "MD_NAME": "md_name", "MD_DEVNAME": "devname"}.get(key)
            if field:
                arrays[-1][field] = value
        elif arrays and "=" in line:
            key, _, value = line.partition("=")
            if key == "member":
                arrays[-1]["members"].append(value)
            elif key in ("devno", "level", "state"):
                arrays[-1][key] = value or None
    return {"supported": supported, "arrays": arrays}


class MdArrays(FactBase[dict[str, Any]]):
    """
    Linux software RAID arrays from sysfs (and ``mdadm --detail`` where mdadm is installed);
    ``supported`` is whether the running kernel has the md driver (/proc/mdstat).

    .. code:: python

        {
            "supported": True,
            "arrays": [{"name": "md127", "devno": "9:127", "level": "raid0",
                        "state": "clean", "members": ["259:0", "259:1"],
                        "uuid": "1a2b...:...", "md_name": "node1:gpunode-cache",
                        "devname": "gpunode-cache"}],
        }
    """

    def command(self) -> str:
        return (
            "if [ -e /proc/mdstat ]; then echo supported=yes; else echo supported=no; fi; "
            "for md in /sys/block/md*; do "
            '  [ -d "$md/md" ] || continue; name=$(basename "$md"); '
            f'  echo "{MARKER}array=$name"; '
            '  echo "devno=$(cat "$md/dev")"; '
            '  echo "level=$(cat "$md/md/level" 2>/dev/null)"; '
            '  echo "state=$(cat "$md/md/array_state" 2>/dev/null)"; '
            '  for s in "$md"/slaves/*; do [ -e "$s/dev" ] && echo "member=$(cat "$s/dev")"; done; '
            "  if command -v mdadm >/dev/null 2>&1; then "
            "    mdadm --detail --export \"/dev/$name\" 2>/dev/null | sed 's/^/detail:/'; "
            "  fi; "
            "done"
        )

    def process(self, output: list[str]) -> dict[str, Any]:  # type: ignore[override]
        return parse_md_arrays(list(output))

    @staticmethod
    def default() -> dict[str, Any]:
        return {"supported": False, "arrays": []}


# --- fstab, mounts, mdadm.conf -------------------------------------------------------------


def parse_fstab(lines: list[str]) -> list[dict[str, str]]:
    entries = []
    for line in lines:
        fields = line.split()
        if len(fields) < 2 or fields[0].startswith("#"):
            continue
        spec, file, vfstype, options, freq, passno = (
            fields + ["auto", "defaults", "0", "0"][len(fields) - 2 :]
        )[:6]
        entries.append(
            {
                "spec": spec,
                "file": unescape_octal(file),
                "vfstype": vfstype,
                "options": options,
                "freq": freq,
                "passno": passno,
                "line": line.strip(),
            }
        )
    return entries


class FstabEntries(FactBase[list[dict[str, str]]]):
    """
    The entries of /etc/fstab in order (comments and blank lines left out).

    .. code:: python

        [{"spec": "UUID=...", "file": "/raid", "vfstype": "xfs",
          "options": "defaults,noatime", "freq": "0", "passno": "0", "line": "UUID=... "}]
    """

    def command(self) -> str:
        return "cat /etc/fstab 2>/dev/null || true"

    def process(self, output: list[str]) -> list[dict[str, str]]:  # type: ignore[override]
        return parse_fstab(list(output))

    @staticmethod
    def default() -> list[dict[str, str]]:
        return []


def parse_findmnt(text: str) -> dict[str, Any] | None:
    filesystems = parse_json(text).get("filesystems") or []
    if not filesystems:
        return None
    top = filesystems[-1]  # the last of stacked mounts is the one visible
    return {
        "target": top.get("target"),
        "source": top.get("source"),
        "fstype": top.get("fstype"),
        "options": (top.get("options") or "").split(","),
        "devno": top.get("maj:min"),
    }


class MountPoint(FactBase[dict[str, Any] | None]):
    """
    What is mounted at ``path`` (None: nothing).

    .. code:: python

        {"target": "/raid", "source": "/dev/md127", "fstype": "xfs",
         "options": ["rw", "noatime", ...], "devno": "9:127"}
    """

    def command(self, path: str) -> str:
        return (
            "findmnt -J -o TARGET,SOURCE,FSTYPE,OPTIONS,MAJ:MIN --mountpoint "
            f"{shlex.quote(path)} || true"
        )

    def process(self, output: list[str]) -> dict[str, Any] | None:  # type: ignore[override]
        return parse_findmnt("\n".join(output))

    @staticmethod
    def default() -> dict[str, Any] | None:
        return None


class MdadmConfArrays(FactBase[list[str] | None]):
    """
    The ARRAY lines of /etc/mdadm/mdadm.conf (None: no such file).

    .. code:: python

        ["ARRAY /dev/md/gpunode-cache metadata=1.2 UUID=..."]
    """

    def command(self) -> str:
        return (
            "if [ -e /etc/mdadm/mdadm.conf ]; then echo present; "
            "grep -E '^[[:space:]]*ARRAY[[:space:]]' /etc/mdadm/mdadm.conf || true; fi"
        )

    def process(self, output: list[str]) -> list[str] | None:  # type: ignore[override]
        lines = list(output)
        if not lines or lines[0] != "present":
            return None
        return [" ".join(line.split()) for line in lines[1:]]

    @staticmethod
    def default() -> list[str] | None:
        return None


def parse_unit_state(lines: list[str]) -> dict[str, Any]:
    values = dict(line.split("=", 1) for line in lines if "=" in line)
    return {
        "installed": values.get("LoadState") == "loaded",
        "active": values.get("ActiveState") == "active",
        "enabled": values.get("UnitFileState") in ("enabled", "enabled-runtime", "static"),
        "unit_file_state": values.get("UnitFileState") or None,
    }


class UnitState(FactBase[dict[str, Any]]):
    """
    One systemd unit: installed (loaded), active, enabled.

    .. code:: python

        {"installed": True, "active": False, "enabled": True, "unit_file_state": "enabled"}
    """

    def command(self, unit: str) -> str:
        return (
            "systemctl show --property LoadState --property ActiveState "
            f"--property UnitFileState {shlex.quote(unit)} 2>/dev/null || true"
        )

    def process(self, output: list[str]) -> dict[str, Any]:  # type: ignore[override]
        return parse_unit_state(list(output))

    @staticmethod
    def default() -> dict[str, Any]:
        return {"installed": False, "active": False, "enabled": False, "unit_file_state": None}


# --- what the drift check reads of the fabric and the cache ---------------------------------


def parse_mounts(lines: list[str]) -> dict[str, dict[str, Any]]:
    """/proc/self/mounts -> {target: {source, fstype, options}}; the last of stacked mounts
    on a target is the one visible, so it wins."""
    mounts: dict[str, dict[str, Any]] = {}
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        source, target, fstype, options = (unescape_octal(field) for field in fields[:4])
        mounts[target] = {"source": source, "fstype": fstype, "options": options.split(",")}
    return mounts


class Mounts(FactBase[dict[str, dict[str, Any]]]):
    """
    Every mounted filesystem, by mount point, as the kernel lists it.

    .. code:: python

        {"/raid": {"source": "/dev/md127", "fstype": "xfs", "options": ["rw", "noatime"]}}
    """

    def command(self) -> str:
        return "cat /proc/self/mounts"

    def process(self, output: list[str]) -> dict[str, dict[str, Any]]:  # type: ignore[override]
        return parse_mounts(list(output))

    @staticmethod
    def default() -> dict[str, dict[str, Any]]:
        return {}


NCCL_FILES = {"conf": "/etc/nccl.conf", "profile": "/etc/profile.d/gpunode-nccl.sh"}


def parse_nccl_settings(lines: list[str]) -> dict[str, dict[str, str] | None]:
    """The NCCL_* settings of /etc/nccl.conf (``NAME=value``) and of the login environment
    (``export NAME=value``, shell-quoted); None for a file that does not exist."""
    files: dict[str, dict[str, str] | None] = dict.fromkeys(NCCL_FILES)
    frame = framing.parse(lines, NCCL_FILES)
    for kind in NCCL_FILES:
        part = frame.part(kind)
        # Exit status 0: the file is there and was read; otherwise (none, cut short) None.
        if part.exit_status == 0 and part.problem is None:
            files[kind] = _nccl_settings(kind, part.lines)
    return files


def _nccl_settings(kind: str, lines: list[str]) -> dict[str, str]:
    settings: dict[str, str] = {}
    for line in lines:
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if kind == "profile":
            text = text.removeprefix("export ").strip()
        name, equals, value = text.partition("=")
        if equals and name.strip().startswith("NCCL_"):
            settings[name.strip()] = _shell_word(value) if kind == "profile" else value.strip()
    return settings


def _shell_word(text: str) -> str:
    try:
        return " ".join(shlex.split(text))
    except ValueError:  # unbalanced quotes: report the text as it is
        return text


class NcclSettings(FactBase[dict[str, dict[str, str] | None]]):
    """
    The NCCL settings the node's processes get: /etc/nccl.conf and the login environment.

    .. code:: python

        {"conf": {"NCCL_DEBUG": "WARN"}, "profile": None}  # None: no such file
    """

    def command(self) -> str:
        # A file that does not exist ends its part with a non-zero exit status.
        return framing.command(
            framing.Part(kind, f"[ -f {shlex.quote(path)} ] && cat {shlex.quote(path)}")
            for kind, path in NCCL_FILES.items()
        )

    def process(self, output: list[str]) -> dict[str, dict[str, str] | None]:  # type: ignore[override]
        return parse_nccl_settings(list(output))

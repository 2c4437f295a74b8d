"""The lab: a local fleet of real Debian 12 and Debian 13 nodes booted by systemd, reached
over SSH, and Ubuntu 24.04 stand-in nodes (see ``UBUNTU_LAB_BASES``).

Each node is a Docker container running /sbin/init from an image built here from Debian
packages (mmdebstrap; no registry is reachable). Each container has its own network
namespace on a dedicated bridge, sshd with key authentication and a cloud-image style
``debian`` user with passwordless sudo: pyinfra and testinfra reach it exactly as they reach a
production node. Hardware that does not exist here (GPUs, HCAs, NVMe) is simulated by the
doubles in ``lab.hwsim``; they are only ever placed on lab nodes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpunode import distributions
from lab import hwsim
from lab.hwsim import kernel

if TYPE_CHECKING:
    from gpunode.model import Slurm

REPO_ROOT = Path(__file__).resolve().parents[1]
LABEL = "lab"
DEFAULT_NAME = "gpunode-lab"
FIRST_NODE_OCTET = 11
# One image per release: gpunode-lab/debian12, gpunode-lab/debian13 (``image_repository``).
IMAGE_REPOSITORY_PREFIX = "gpunode-lab/"
IMAGE_REPOSITORY = "gpunode-lab/debian12"  # bookworm's, the default release's
DEFAULT_RELEASE = "bookworm"
# What --release accepts besides a codename or a comma-separated list of them.
# mixed: every release gpunode converges in the lab, given to nodes in turn (two nodes are
# bookworm and trixie, as the test suite's labs are; a third is the Ubuntu 24.04 lab node).
RELEASE_ALIASES = {"mixed": ("bookworm", "trixie", "noble")}
# An Ubuntu lab node, and what it is not. Ubuntu's archive cannot be reached from here, so an
# Ubuntu lab node is a Debian system dressed as the Ubuntu release: Debian's packages of the
# suite named here, arranged as the Ubuntu release has them. Real: its /etc/os-release,
# /usr/lib/os-release and /etc/lsb-release (Ubuntu's own words, tests/fixtures/os-release), so
# gpunode takes it for that release and renders that release's rows (Ubuntu's archive in
# deb822 ubuntu.sources, Ubuntu's unattended-upgrades origins, its sshd policy); sshd started
# by ssh.socket, ssh.service not enabled (as a 24.04 install has it); ufw installed and
# inactive, needrestart, unattended-upgrades (enabled), AppArmor and netplan.io installed.
# Not real: every package is Debian's build (Debian's OpenSSH, systemd, kernel-less userland),
# no snapd, no cloud-init, no Ubuntu kernel (a container has its host's: its processes see an
# Ubuntu kernel's release instead, lab.hwsim.kernel), and its "Ubuntu archive" is the lab's
# stand-in (lab.aptrepo.ubuntu_redirect): Debian's signed archive served under Ubuntu's suite
# names, verified by Debian's keys installed under Ubuntu's keyring name, but for
# noble-updates, the lab's own stand-in of Ubuntu's NVIDIA driver packages (lab.standin.ubuntu),
# signed with a key of the lab's that the node's keyring holds too (Lab._trust_ubuntu_standin).
# noble -> bookworm: bookworm's OpenSSH 9.2p1 is an OpenSSH 9 without PerSourcePenalties, as
# noble's 9.6p1 is (trixie's 10.0 has them), so the sshd configuration gpunode renders for
# noble is exercised by an sshd of the same generation; systemd 252 against noble's 255
# (trixie's 257 is as near), and both Debian suites ship ssh.socket with Accept=no and the
# socket-activation patch, as noble does (checked in both lab images, 2026-12-07).
UBUNTU_LAB_BASES = {"noble": "bookworm"}
# The packages an Ubuntu 24.04 server install has that a Debian minbase lacks, and that
# gpunode meets in a converge (ubuntu-server's seeds; their Debian builds).
UBUNTU_NODE_PACKAGES = (
    "ufw", "needrestart", "unattended-upgrades", "apparmor", "netplan.io", "lsb-release",
)  # fmt: skip
# Ubuntu's archive as a fresh 24.04 install writes it (ubuntu.sources, deb822): the converge
# replaces it with apt.ubuntu_mirror's. Source: noble's /etc/apt/sources.list.d/ubuntu.sources
# (gpunode.distributions, noble's sources), read 2026-12-07.
UBUNTU_INSTALLER_SOURCES = """\
Types: deb
URIs: http://archive.ubuntu.com/ubuntu/
Suites: noble noble-updates noble-backports
Components: main restricted universe multiverse
Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg

Types: deb
URIs: http://security.ubuntu.com/ubuntu/
Suites: noble-security
Components: main restricted universe multiverse
Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg
"""
# VMs and the Slurm controller are Debian's only (the controller installs from the node's own
# archive, which an Ubuntu lab node names only after a converge).
DEBIAN_LAB_RELEASES = tuple(
    codename for codename, row in distributions.BY_CODENAME.items() if row.os_id == "debian"
)
OS_RELEASE_FIXTURES = REPO_ROOT / "tests" / "fixtures" / "os-release"
# The releases a lab node can be: Debian's rows of the distribution table, and the Ubuntu
# releases a Debian suite stands in for (UBUNTU_LAB_BASES).
LAB_RELEASES = {
    codename: row
    for codename, row in distributions.BY_CODENAME.items()
    if row.os_id == "debian" or codename in UBUNTU_LAB_BASES
}
LOGIN_USER = "debian"
# How a lab node "reboots" for a driver change (nvidia_driver.reboot_command): the GPU
# simulator loads the installed stand-in driver; the container itself stays up.
REBOOT_COMMAND = ("gpunode-lab-hw", "reboot")
DEFAULT_PROFILES = ("hgx-h100", "a100", "pcie-a10g")
BOOT_TIMEOUT_S = 120
# Scratch disks (opt-in): sparse files on the lab host, attached to host loop devices and
# handed to a node as /dev/nvme<N>n1, so storage roles get real block devices to work on.
SCRATCH_DISK_MIB = 1024
# The lab's package cache (apt-cacher-ng, as real clusters run it): one per lab, on the
# bridge gateway. Not 3142, which a system-wide apt-cacher-ng service may hold.
PACKAGE_CACHE_PORT = 3143
APT_CACHER_NG = "/usr/sbin/apt-cacher-ng"
# The lab's Slurm controller (`gpunode lab up --slurm`): its own container on the bridge,
# beside the GPU nodes, running Debian's slurmctld and munge.
SLURM_CONTROLLER = "slurmctl"
SLURM_CONTROLLER_OCTET = 10
SLURM_CLUSTER = "lab"
SLURM_CONTROLLER_PACKAGES = ("slurmctld", "slurm-client", "munge")
SLURM_CONTROLLER_TIMEOUT_S = 600
SLURMCTLD_STATE = "/var/lib/slurm/slurmctld"  # StateSaveLocation (gpunode.expected.slurm)

# Packages of a minimal Debian cloud-like node; python3 serves testinfra-free probes later.
NODE_PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "openssh-server", "sudo", "iproute2", "iputils-ping",
    "python3", "ca-certificates", "procps", "kmod", "less", "apt-utils",
)  # fmt: skip


# Debian's archives, as every lab image (container and VM) is built from them and its apt
# sources name them.
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
DEBIAN_COMPONENTS = "main contrib non-free non-free-firmware"


# Which Debian archive a lab's nodes use: Debian's own (the default) or the lab's subset.
DEBIAN_MODE_VARIABLE = "GPUNODE_LAB_DEBIAN"


def debian_sources(
    release: str,
    mirror: str = DEBIAN_MIRROR,
    security_mirror: str = DEBIAN_SECURITY_MIRROR,
    keyring: str = "/usr/share/keyrings/debian-archive-keyring.gpg",
) -> str:
    """The image's apt sources for ``release`` (a codename of gpunode's distribution table);
    a subset lab's new node's name the lab's mirror and its key."""
    row = distributions.BY_CODENAME[release]
    return f"""\
Types: deb
URIs: {mirror}
Suites: {" ".join(row.suites)}
Components: {DEBIAN_COMPONENTS}
Signed-By: {keyring}

Types: deb
URIs: {security_mirror}
Suites: {" ".join(row.security_suites)}
Components: {DEBIAN_COMPONENTS}
Signed-By: {keyring}
"""


def releases_of(spec: str) -> tuple[str, ...]:
    """``--release`` -> the releases nodes get in turn: 'trixie', 'bookworm,trixie', 'mixed'."""
    names = RELEASE_ALIASES.get(spec) or tuple(part.strip() for part in spec.split(","))
    unknown = [name for name in names if name not in LAB_RELEASES]
    if unknown or not names:
        known = ", ".join([*LAB_RELEASES, *RELEASE_ALIASES])
        raise LabError(f"--release {spec!r}: unknown release {unknown}; known: {known}")
    return names


def image_repository(release: str) -> str:
    return IMAGE_REPOSITORY_PREFIX + distributions.BY_CODENAME[release].cuda_repo_distro


def base_suite(release: str) -> str:
    """The Debian suite a lab node of ``release`` is built from: itself, or for an Ubuntu
    release the suite that stands in for it."""
    return UBUNTU_LAB_BASES.get(release, release)


def node_packages(release: str) -> tuple[str, ...]:
    if release in UBUNTU_LAB_BASES:
        return (*NODE_PACKAGES, *UBUNTU_NODE_PACKAGES)
    return NODE_PACKAGES


def lsb_release(row: distributions.Distribution, pretty_name: str) -> str:
    """/etc/lsb-release as Ubuntu's base-files writes it (DISTRIB_ID, _RELEASE, _CODENAME,
    _DESCRIPTION: the os-release's PRETTY_NAME). Source: a 24.04.3 node's /etc/lsb-release
    beside its os-release (the capture in tests/fixtures/os-release) in public notes, and
    24.04.1, 24.04.2 and 24.04.4 nodes' of the same four lines, read 2026-12-07."""
    return (
        f"DISTRIB_ID=Ubuntu\nDISTRIB_RELEASE={row.version_id}\n"
        f'DISTRIB_CODENAME={row.codename}\nDISTRIB_DESCRIPTION="{pretty_name}"\n'
    )


def _ubuntu_script(release: str) -> str:
    """The customize-hook part that makes a Debian rootfs an Ubuntu lab node (UBUNTU_LAB_BASES
    says what that is and is not)."""
    row = distributions.BY_CODENAME[release]
    fixture = OS_RELEASE_FIXTURES / f"ubuntu-{row.version_id}-{row.codename}"
    os_release = fixture.read_text()
    pretty = next(
        line.split("=", 1)[1].strip('"')
        for line in os_release.splitlines()
        if line.startswith("PRETTY_NAME=")
    )
    return f"""\
rm -f "$1/etc/apt/sources.list.d/debian.sources"
cat > "$1/etc/apt/sources.list.d/ubuntu.sources" <<'SOURCES'
{UBUNTU_INSTALLER_SOURCES}SOURCES
cp "$1/usr/share/keyrings/debian-archive-keyring.gpg" \
  "$1/usr/share/keyrings/ubuntu-archive-keyring.gpg"
chroot "$1" dpkg-divert --local --rename --divert /usr/lib/os-release.debian \
  --add /usr/lib/os-release
cat > "$1/usr/lib/os-release" <<'OSRELEASE'
{os_release}OSRELEASE
ln -sf ../usr/lib/os-release "$1/etc/os-release"
cat > "$1/etc/lsb-release" <<'LSB'
{lsb_release(row, pretty)}LSB
chroot "$1" systemctl disable ssh.service
chroot "$1" systemctl enable ssh.socket
chroot "$1" systemctl enable unattended-upgrades.service
"""


# Per-node SSH host keys: the image ships none, so nodes never share a host key.
HOSTKEYS_UNIT = """\
[Unit]
Description=Generate this lab node's own SSH host keys
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=multi-user.target
"""


# apt's daily timers, masked in every lab image: they run apt-get update and unattended-upgrade
# at random times of a node's day (apt's units: 6:00 and 18:00 with up to twelve hours' random
# delay), which in a lab node's half hour takes dpkg's lock in the middle of a test's converge
# and spends CPU on nothing a test asks for. gpunode does not manage the timers; what it writes
# for unattended-upgrades (roles/unattended_upgrades.py) is checked by running it.
APT_TIMERS = ("apt-daily.timer", "apt-daily-upgrade.timer")


def _customize_script(
    release: str = DEFAULT_RELEASE, diverted: Iterable[str] = hwsim.DIVERTED_PATHS
) -> str:
    diversions = "\n".join(
        f'chroot "$1" dpkg-divert --local --rename --divert {path}.distrib --add {path}'
        for path in diverted
    )
    ubuntu = _ubuntu_script(release) if release in UBUNTU_LAB_BASES else ""
    return f"""\
set -e
rm -f "$1/etc/apt/sources.list"
cat > "$1/etc/apt/sources.list.d/debian.sources" <<'SOURCES'
{debian_sources(base_suite(release))}SOURCES
{ubuntu}cat > "$1/etc/systemd/system/gpunode-lab-hostkeys.service" <<'UNIT'
{HOSTKEYS_UNIT}UNIT
chroot "$1" systemctl enable gpunode-lab-hostkeys.service
chroot "$1" systemctl mask {" ".join(APT_TIMERS)}
rm -f "$1"/etc/ssh/ssh_host_*
chroot "$1" useradd --create-home --shell /bin/bash --groups sudo {LOGIN_USER}
echo '{LOGIN_USER} ALL=(ALL) NOPASSWD:ALL' > "$1/etc/sudoers.d/90-lab-bootstrap"
chmod 0440 "$1/etc/sudoers.d/90-lab-bootstrap"
: > "$1/etc/machine-id"
echo lab > "$1/etc/hostname"
{diversions}
"""


# Each node's systemd (and journald, logind...) holds inotify instances of the host's user;
# Debian's default of 128 boots about thirty nodes, after which systemd cannot start.
INOTIFY_INSTANCES_PER_NODE = 8
INOTIFY_INSTANCES_PATH = Path("/proc/sys/fs/inotify/max_user_instances")


def _ensure_inotify_instances(count: int) -> None:
    wanted = 128 + INOTIFY_INSTANCES_PER_NODE * count
    current = int(INOTIFY_INSTANCES_PATH.read_text())
    if current >= wanted:
        return
    try:
        INOTIFY_INSTANCES_PATH.write_text(f"{wanted}\n")
    except OSError as error:
        raise LabError(
            f"{count} nodes need fs.inotify.max_user_instances >= {wanted} on the lab host "
            f"(it is {current}, and could not be raised: {error})"
        ) from error


def _check_scratch_disks(count: int, size_mib: int) -> None:
    if not 1 <= count <= 16 or size_mib < 300:
        raise LabError(
            f"scratch disks: {count} of {size_mib} MiB asked; 1 to 16 per node, each at least "
            "300 MiB (the smallest XFS)"
        )


@dataclass
class LabNode:
    name: str
    container: str
    address: str
    profile: str
    host_key: str = ""
    release: str = DEFAULT_RELEASE
    boot_s: float = 0.0
    memory_mib: float = 0.0


# Locks this process holds: path -> (open file, depth). flock is per open file, so a second
# flock of the same file in one process would wait for itself.
_HELD_LOCKS: dict[str, tuple[Any, int]] = {}


@contextlib.contextmanager
def state_lock(state_dir: Path) -> Iterator[None]:
    """The lab's state (nodes, VMs, known_hosts, its servers) changed by one process at a
    time: the test suite boots its VM in a process of its own while the container nodes come
    up (tests/integration/conftest.py). Re-entrant within a process."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = str(state_dir / ".lock")
    if path in _HELD_LOCKS:
        handle, depth = _HELD_LOCKS[path]
        _HELD_LOCKS[path] = (handle, depth + 1)
    else:
        handle = open(path, "a")  # noqa: SIM115 (held until the outermost exit)
        fcntl.flock(handle, fcntl.LOCK_EX)
        _HELD_LOCKS[path] = (handle, 1)
    try:
        yield
    finally:
        handle, depth = _HELD_LOCKS[path]
        if depth > 1:
            _HELD_LOCKS[path] = (handle, depth - 1)
        else:
            del _HELD_LOCKS[path]
            handle.close()


def machine_cache_root() -> Path:
    """What the labs of this machine share: node and VM images' locks, the package cache."""
    return Path(os.environ.get("GPUNODE_LAB_CACHE", "/var/cache/gpunode-lab"))


def build_once(lock_path: Path, built: Callable[[], bool], build: Callable[[], None]) -> bool:
    """``build()`` unless ``built()`` says its result exists, by one process of the machine
    at a time: labs side by side (the suite's shards, a module's lab of its own) that all
    lack an image would otherwise each build it, minutes of CPU apiece on a cold machine.
    The one that waited finds the image built and uses it. True when this call built."""
    if built():
        return False
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed
        if built():
            return False
        build()
        return True


def _tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    """Absolute node path -> (content, mode), as a tar stream for put_archive."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, (content, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(content), mode, int(time.time())
            if path.startswith(f"/home/{LOGIN_USER}/"):
                info.uid = info.gid = 1000  # the login user of the image
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


class LabError(RuntimeError):
    """The lab could not be brought up or down; the message says what to do."""


class Lab:
    """Brings lab nodes up and down; state lives in ``state_dir`` (default: <repo>/.lab)."""

    def __init__(
        self,
        state_dir: Path | None = None,
        name: str | None = None,
        subnet_index: int | None = None,
        log: Callable[[str], None] = print,
    ):
        """``name`` prefixes the network and containers; ``subnet_index`` picks 10.213.N.0/24.

        Two labs with different names and subnets live side by side. The environment
        variables GPUNODE_LAB_DIR, GPUNODE_LAB_NAME and GPUNODE_LAB_SUBNET choose them for
        every command (inventories/lab.py included), e.g. for a second developer's lab.
        """
        env = os.environ
        self.state_dir = state_dir or Path(env.get("GPUNODE_LAB_DIR", REPO_ROOT / ".lab"))
        self.name = name or env.get("GPUNODE_LAB_NAME", DEFAULT_NAME)
        if subnet_index is None:
            subnet_index = int(env.get("GPUNODE_LAB_SUBNET", "0"))
        self.network_prefix = f"10.213.{subnet_index}"
        self.subnet = f"{self.network_prefix}.0/24"
        self.gateway = f"{self.network_prefix}.1"
        self.log = log
        self._client: Any = None
        self._debian_subset_published = False
        # GPUNODE_LAB_DEBIAN=subset: the nodes' Debian archive is the lab's signed subset of
        # Debian's (lab.debian_subset; the test suite's labs), not Debian's whole archive.
        mode = env.get(DEBIAN_MODE_VARIABLE, "debian") or "debian"
        if mode not in ("debian", "subset"):
            raise LabError(f"{DEBIAN_MODE_VARIABLE}={mode!r}: 'debian' (the default) or 'subset'")
        self.debian_subset = mode == "subset"

    # --- paths -------------------------------------------------------------------------------
    @property
    def key_path(self) -> Path:
        return self.state_dir / "id_ed25519"

    @property
    def known_hosts_path(self) -> Path:
        return self.state_dir / "known_hosts"

    @property
    def ca_dir(self) -> Path:
        """The lab's internal CA (``tls.ca_directory`` in the lab's group data)."""
        return self.state_dir / "ca"

    def ca_passphrase_file(self) -> Path:
        """The lab CA's passphrase file (``tls.ca_passphrase_file``), made once, mode 0600.

        A generated passphrase: nobody types it, and it never leaves the lab's directory.
        """
        path = self.state_dir / "passphrase"
        if not path.exists():
            self.state_dir.mkdir(parents=True, exist_ok=True)
            # O_EXCL: a concurrent run may have made it first; then theirs is used.
            with contextlib.suppress(FileExistsError):
                descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(descriptor, "w") as handle:
                    handle.write(secrets.token_urlsafe(32) + "\n")
        return path

    @property
    def nodes_path(self) -> Path:
        return self.state_dir / "nodes.json"

    @property
    def repo_dir(self) -> Path:
        return self.state_dir / "aptrepo"

    @property
    def repo_pid_path(self) -> Path:
        return self.state_dir / "aptrepo.pid"

    @property
    def repo_base_url(self) -> str:
        from lab.aptrepo import DEFAULT_PORT

        return f"http://{self.gateway}:{DEFAULT_PORT}"

    @property
    def clamav_mirror_url(self) -> str:
        """The lab's ClamAV signature mirror (lab.signatures), served with the repositories."""
        from lab.signatures import DIRECTORY

        return f"{self.repo_base_url}/{DIRECTORY}"

    @property
    def image_tag(self) -> str:
        return self.image_tag_for(DEFAULT_RELEASE)

    @staticmethod
    def image_tag_for(release: str) -> str:
        """The node image of ``release``; its tag is a digest of how it is built."""
        recipe = json.dumps([node_packages(release), _customize_script(release)]).encode()
        return f"{image_repository(release)}:{hashlib.sha256(recipe).hexdigest()[:12]}"

    # --- docker --------------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        if self._client is None:
            import docker
            import docker.errors

            try:
                self._client = docker.from_env(timeout=300)
                self._client.ping()
            except docker.errors.DockerException as error:
                raise LabError(
                    f"cannot reach the Docker engine ({error}); start it with `dockerd &` "
                    "(Debian package docker.io)"
                ) from error
        return self._client

    def nodes(self) -> list[LabNode]:
        if not self.nodes_path.exists():
            return []
        return [LabNode(**raw) for raw in json.loads(self.nodes_path.read_text())]

    # --- up ------------------------------------------------------------------------------------
    def up(
        self,
        count: int,
        profiles: Iterable[str] = DEFAULT_PROFILES,
        scratch_disks: int = 0,
        scratch_disk_mib: int = SCRATCH_DISK_MIB,
        releases: Iterable[str] = (DEFAULT_RELEASE,),
    ) -> list[LabNode]:
        """Bring the lab to ``count`` running nodes; existing healthy nodes are kept.

        ``releases`` are given to nodes in turn, as ``profiles`` are (lab-1 the first); a
        running node of another release than its turn gives is replaced.

        ``scratch_disks`` > 0 also gives every node that many scratch disks
        (:meth:`attach_scratch_disks`); without it nodes get none, as before.
        """
        profile_cycle = list(profiles)
        unknown = [p for p in profile_cycle if p not in hwsim.PROFILES]
        if unknown or not profile_cycle:
            raise LabError(
                f"unknown hardware profile(s) {unknown}; known: {', '.join(hwsim.PROFILES)}"
            )
        release_cycle = list(releases)
        for release in release_cycle:
            releases_of(release)
        if not release_cycle:
            raise LabError("no release given")
        if not 1 <= count <= 200:
            raise LabError(f"--nodes {count}: choose between 1 and 200")
        if scratch_disks:
            _check_scratch_disks(scratch_disks, scratch_disk_mib)
        # Refused before anything is made: the lock's file is in the state directory.
        with state_lock(self.state_dir):
            return self._up(count, profile_cycle, scratch_disks, scratch_disk_mib, release_cycle)

    def _up(
        self,
        count: int,
        profile_cycle: list[str],
        scratch_disks: int,
        scratch_disk_mib: int,
        release_cycle: list[str],
    ) -> list[LabNode]:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # Every lab's nodes on the machine count, not this lab's alone: labs side by side (the
        # test suite's shards and their modules' own labs) share the host user's instances.
        others = [
            container
            for container in self.client.containers.list(filters={"label": LABEL})
            if container.labels.get(LABEL) != self.name
        ]
        _ensure_inotify_instances(count + len(others))
        self._ensure_key()
        network = self._ensure_network()
        wanted = [
            LabNode(
                name=f"lab-{index}",
                container=f"{self.name}-{index}",
                address=f"{self.network_prefix}.{FIRST_NODE_OCTET + index - 1}",
                profile=profile_cycle[(index - 1) % len(profile_cycle)],
                release=release_cycle[(index - 1) % len(release_cycle)],
            )
            for index in range(1, count + 1)
        ]
        # The subset a new node's apt sources name (its key with them), before any node starts.
        self.publish_debian_subset()
        # Only the images of the releases the nodes get (fewer nodes than releases: not all).
        images = {
            release: self._ensure_image(release)
            for release in dict.fromkeys(node.release for node in wanted)
        }
        releases_wanted = {node.name: node.release for node in wanted}
        existing = {
            node.name: node
            for node in self.nodes()
            if self._running(node.container) and releases_wanted.get(node.name) == node.release
        }
        to_start = [node for node in wanted if node.name not in existing]
        for node in wanted:
            if node.name in existing:
                kept = existing[node.name]
                node.profile, node.host_key, node.boot_s = kept.profile, kept.host_key, kept.boot_s
                # A kept node gets this checkout's simulator programs (never its state), and
                # the key its lab's Debian subset is signed with now (its sources are its own).
                self._refresh_simulator(node)
                self._refresh_debian_subset_key(node)
        for extra in set(existing) - {node.name for node in wanted}:
            self._remove_container(existing[extra].container)
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(to_start)))) as pool:
            list(pool.map(lambda node: self._start(node, images[node.release], network), to_start))
        for node in wanted:
            node.memory_mib = self._memory_mib(node.container)
        self._write_state(wanted)
        self.serve_repository()
        for node in wanted:
            if node.release in UBUNTU_LAB_BASES:
                self._trust_ubuntu_standin(node)
        self.serve_package_cache()
        for node in wanted if scratch_disks else []:
            self.attach_scratch_disks(node, scratch_disks, scratch_disk_mib)
        return wanted

    def serve_repository(self) -> None:
        """Serve the lab's NVIDIA stand-in repositories on the bridge gateway (detached).

        Nodes reach it as an air-gapped site reaches its mirror; NVIDIA's own hosts are
        never needed.
        """
        from lab import aptrepo, signatures

        # Served beside the repositories (whether or not the server is already running).
        signatures.write_database(self.repo_dir)
        self.publish_debian_subset()
        if self._repo_server_running():
            return
        self._refuse_if_served(aptrepo.DEFAULT_PORT)
        aptrepo.build_repository(self.repo_dir)
        log = (self.state_dir / "aptrepo-server.log").open("ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "lab.aptrepo", str(self.repo_dir), self.gateway],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=REPO_ROOT,
        )
        self.repo_pid_path.write_text(f"{process.pid}\n")

        def exited() -> str | None:
            return f"exited; see {log.name}" if process.poll() is not None else None

        self._wait_listening(aptrepo.DEFAULT_PORT, "the lab apt repository server", exited)

    def publish_debian_subset(self) -> None:
        """The lab's signed subset of Debian's archive, up to date (lab.debian_subset), where
        the lab serves one; once per Lab object."""
        if not self.debian_subset or self._debian_subset_published:
            return
        from lab import debian_subset

        try:
            debian_subset.publish(self.repo_dir)
        except debian_subset.SubsetError as error:
            raise LabError(f"the lab's Debian subset: {error}") from error
        self._debian_subset_published = True

    def debian_subset_files(self, release: str, sources: bool) -> dict[str, tuple[bytes, int]]:
        """A Debian node's (or VM's) apt sources naming the lab's subset (``sources``: a new
        node's, as its installer would have written them for a site mirror) and the subset's
        key, where the lab serves one; gpunode's converge rewrites the sources as data says."""
        if not self.debian_subset or release in UBUNTU_LAB_BASES:
            return {}
        from lab import debian_subset

        self.publish_debian_subset()

        key = (self.repo_dir / debian_subset.SUBSET_DIR / debian_subset.KEYRING).read_bytes()
        files = {distributions.SITE_DEBIAN_KEYRING: (key, 0o644)}
        if sources:
            data = self.debian_apt_data()
            text = debian_sources(
                release, data["debian_mirror"], data["debian_security_mirror"],
                distributions.SITE_DEBIAN_KEYRING,
            )  # fmt: skip
            files["/etc/apt/sources.list.d/debian.sources"] = (text.encode(), 0o644)
        return files

    def _refresh_debian_subset_key(self, node: LabNode) -> None:
        files = self.debian_subset_files(node.release, sources=False)
        if files:
            self.client.containers.get(node.container).put_archive("/", _tar(files))

    def debian_apt_data(self) -> dict[str, str]:
        """The apt settings that point a node at the lab's Debian subset (none where the lab
        serves Debian's whole archive)."""
        if not self.debian_subset:
            return {}
        from lab import debian_subset

        base = f"{self.repo_base_url}/{debian_subset.SUBSET_DIR}"
        return {
            "debian_mirror": f"{base}/debian",
            "debian_security_mirror": f"{base}/debian-security",
            "debian_keyring": str(self.repo_dir / debian_subset.SUBSET_DIR / debian_subset.KEYRING),
        }

    def _repo_server_running(self) -> bool:
        return self._process_running(self.repo_pid_path, "lab.aptrepo")

    def _refuse_if_served(self, port: int) -> None:
        """A lab service's port on the gateway must be free before the lab starts its own."""
        with (
            contextlib.suppress(OSError),
            socket.create_connection((self.gateway, port), timeout=1),
        ):
            raise LabError(
                f"{self.gateway}:{port} is already served by another process "
                "(a lab of another checkout with the same name?); run `gpunode lab down` there "
                "or choose GPUNODE_LAB_NAME / GPUNODE_LAB_SUBNET"
            )

    def _wait_listening(
        self, port: int, what: str, failed: Callable[[], str | None] = lambda: None
    ) -> None:
        """Return once ``what`` listens on the gateway's ``port`` (30 s at most)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            reason = failed()
            if reason:
                raise LabError(f"{what} {reason}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.gateway, port), timeout=1),
            ):
                return
            time.sleep(0.2)
        raise LabError(f"{what} did not listen on {self.gateway}:{port} in 30 s")

    # --- package cache -----------------------------------------------------------------------
    @property
    def package_cache_url(self) -> str:
        return f"http://{self.gateway}:{PACKAGE_CACHE_PORT}"

    @property
    def package_cache_dir(self) -> Path:
        """Outside the state directory, so that ``down(keep_image=True)`` keeps it."""
        root = machine_cache_root()
        return root / self.name

    @property
    def _package_cache_pid_path(self) -> Path:
        return self.state_dir / "apt-cache.pid"

    def serve_package_cache(self) -> None:
        """Run the lab's apt-cacher-ng on the bridge gateway (detached): many nodes fetch a
        package from Debian's mirror once. It caches by URL and remaps nothing."""
        if self._process_running(self._package_cache_pid_path, "apt-cacher-ng"):
            return
        if not Path(APT_CACHER_NG).exists():
            raise LabError(
                f"{APT_CACHER_NG} is missing: install the Debian package apt-cacher-ng "
                "(./dev setup does)"
            )
        self._refuse_if_served(PACKAGE_CACHE_PORT)
        config_dir = self.state_dir / "apt-cache"
        (self.package_cache_dir / "cache").mkdir(parents=True, exist_ok=True)
        config_dir.mkdir(parents=True, exist_ok=True)
        (config_dir / "acng.conf").write_text(
            f"CacheDir: {self.package_cache_dir / 'cache'}\n"
            f"LogDir: {config_dir}\n"
            "SupportDir: /usr/lib/apt-cacher-ng\n"
            f"Port: {PACKAGE_CACHE_PORT}\n"
            f"BindAddress: {self.gateway}\n"
            f"PidFile: {self._package_cache_pid_path}\n"
            f"SocketPath: {config_dir / 'socket'}\n"
            "ExThreshold: 4\n"
        )
        subprocess.run(
            [APT_CACHER_NG, "-c", str(config_dir), "ForeGround=0"],
            check=True, stdin=subprocess.DEVNULL, capture_output=True,
        )  # fmt: skip
        self._wait_listening(PACKAGE_CACHE_PORT, "apt-cacher-ng")

    @staticmethod
    def _process_running(pid_path: Path, name: str) -> bool:
        try:
            pid = int(pid_path.read_text())
            os.kill(pid, 0)
            return name in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
        except (OSError, ValueError):
            return False

    def _stop_package_cache(self) -> None:
        if self._process_running(self._package_cache_pid_path, "apt-cacher-ng"):
            os.kill(int(self._package_cache_pid_path.read_text()), signal.SIGTERM)

    def _stop_repository(self) -> None:
        if self._repo_server_running():
            os.kill(int(self.repo_pid_path.read_text()), signal.SIGTERM)

    def _ensure_key(self) -> None:
        if self.key_path.exists():
            return
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpunode-lab",
             "-f", str(self.key_path)],
            check=True,
        )  # fmt: skip

    def _ensure_image(self, release: str = DEFAULT_RELEASE) -> str:
        import docker.errors

        tag = self.image_tag_for(release)

        def built() -> bool:
            try:
                self.client.images.get(tag)
            except docker.errors.ImageNotFound:
                return False
            return True

        lock = machine_cache_root() / "locks" / f"image-{release}.lock"
        build_once(lock, built, lambda: self._build_image(release, tag))
        return tag

    def _build_image(self, release: str, tag: str) -> None:
        if shutil.which("mmdebstrap") is None:
            raise LabError("mmdebstrap is missing: apt-get install mmdebstrap")
        row = distributions.BY_CODENAME[release]
        self.log(f"building lab node image {tag} with mmdebstrap ({row.pretty_name})...")
        started = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            rootfs = Path(tmp) / "rootfs.tar"
            hook = Path(tmp) / "customize.sh"
            hook.write_text(_customize_script(release))
            result = subprocess.run(
                [
                    "mmdebstrap", "--variant=minbase", "--quiet",
                    f"--components={DEBIAN_COMPONENTS}",
                    "--include=" + ",".join(node_packages(release)),
                    f"--customize-hook=sh {hook} \"$1\"",
                    base_suite(release), str(rootfs), DEBIAN_MIRROR,
                ],
                capture_output=True,
                text=True,
            )  # fmt: skip
            if result.returncode != 0:
                raise LabError(f"mmdebstrap failed:\n{result.stderr[-3000:]}")
            with rootfs.open("rb") as data:
                self.client.api.import_image_from_data(
                    data,
                    repository=tag.split(":")[0],
                    tag=tag.split(":")[1],
                    changes=['CMD ["/sbin/init"]', "ENV container=docker"],
                )
        self.log(f"image built in {time.monotonic() - started:.1f} s")

    def _ensure_network(self) -> str:
        import docker.types

        # Docker's name filter matches any part of a name: gpunode-lab finds the network of
        # gpunode-lab-shard1 beside it. Only the network of exactly this name is this lab's.
        if not [
            net for net in self.client.networks.list(names=[self.name]) if net.name == self.name
        ]:
            pool = docker.types.IPAMPool(subnet=self.subnet, gateway=self.gateway)
            self.client.networks.create(
                self.name,
                driver="bridge",
                ipam=docker.types.IPAMConfig(pool_configs=[pool]),
                labels={LABEL: self.name},
            )
        return self.name

    def _running(self, container: str) -> bool:
        import docker.errors

        try:
            return bool(self.client.containers.get(container).status == "running")
        except docker.errors.NotFound:
            return False

    def _remove_container(self, name: str) -> None:
        import docker.errors

        with contextlib.suppress(docker.errors.NotFound):
            self.client.containers.get(name).remove(force=True)

    def _start(
        self,
        node: LabNode,
        image: str,
        network: str,
        archive: bytes | None = None,
        mounts: dict[str, str] | None = None,
    ) -> None:
        """Create and boot ``node``'s container; ``archive`` (a tar stream) replaces the GPU
        node's files (simulated hardware and login key); ``mounts``: host directory ->
        container path, besides the cgroup tree."""
        self._remove_container(node.container)
        started = time.monotonic()
        container = self.client.containers.create(
            image,
            name=node.container,
            hostname=node.name,
            detach=True,
            labels={
                LABEL: self.name,
                f"{LABEL}.profile": node.profile,
                f"{LABEL}.release": node.release,
            },
            # systemd as PID 1 without --privileged: the capabilities it needs, the host's
            # cgroup tree, and tmpfs where it expects them. DAC_READ_SEARCH, which Docker
            # drops and root on a real node has: a unit bounded to it alone (the malware
            # scan) reads every file with it, as on a real node.
            cap_add=["SYS_ADMIN", "NET_ADMIN", "DAC_READ_SEARCH"],
            security_opt=["seccomp=unconfined", "apparmor=unconfined"],
            cgroupns="host",
            volumes={
                "/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"},
                **{host: {"bind": path, "mode": "rw"} for host, path in (mounts or {}).items()},
            },
            tmpfs={"/run": "", "/run/lock": "", "/tmp": ""},
            stop_signal="SIGRTMIN+3",
            network=network,
        )
        self.client.networks.get(network).disconnect(container)
        self.client.networks.get(network).connect(container, ipv4_address=node.address)
        container.put_archive("/", archive if archive is not None else self._node_archive(node))
        container.start()
        self._wait_booted(container, node)
        if archive is None:
            self._enable_gpu_devices(container, node)
        node.boot_s = round(time.monotonic() - started, 2)
        host_key = container.exec_run(["cat", "/etc/ssh/ssh_host_ed25519_key.pub"])
        if host_key.exit_code != 0:
            raise LabError(f"{node.name}: no SSH host key after boot")
        node.host_key = " ".join(host_key.output.decode().split()[:2])

    def power_cycle(self, node: LabNode) -> None:
        """Restart ``node`` at once, as a power cut and power-on would: its processes are
        killed, nothing is shut down cleanly; returns once it has booted again."""
        container = self.client.containers.get(node.container)
        container.restart(timeout=0)
        self._wait_booted(container, node)

    def _refresh_simulator(self, node: LabNode) -> None:
        from lab.hwsim import hwstate

        programs = {
            path: entry
            for path, entry in hwsim.node_files(node.profile, node.name).items()
            if path != hwstate.DEFAULT_STATE_PATH
        }
        container = self.client.containers.get(node.container)
        if node.release in UBUNTU_LAB_BASES:
            # The simulated kernel's library too (a node made by an older checkout has none);
            # the release it runs is the node's state, kept where it has one.
            programs.update(self._kernel_files(node))
            if container.exec_run(["test", "-s", kernel.KERNEL_RELEASE_PATH]).exit_code == 0:
                del programs[kernel.KERNEL_RELEASE_PATH]
        container.put_archive("/", _tar(programs))
        self._enable_gpu_devices(container, node)

    def _enable_gpu_devices(self, container: Any, node: LabNode) -> None:
        """/dev/nvidiaN now and at every boot of ``node`` (hwsim.DEVICES_UNIT), and its
        simulated UEFI firmware (hwsim.firmware.UNIT)."""
        units = f"{hwsim.DEVICES_UNIT} {hwsim.firmware.UNIT}"
        result = container.exec_run(
            ["sh", "-c", f"systemctl daemon-reload && systemctl enable --now {units}"]
        )
        if result.exit_code != 0:
            raise LabError(f"{node.name}: GPU device files: {result.output.decode().strip()}")

    def _node_archive(self, node: LabNode) -> bytes:
        """Simulated hardware plus the lab login key, as one tar stream; an Ubuntu lab node's
        simulated running kernel too (lab.hwsim.kernel)."""
        files = dict(hwsim.node_files(node.profile, node.name))
        public_key = self.key_path.with_suffix(".pub").read_bytes()
        files[f"/home/{LOGIN_USER}/.ssh/authorized_keys"] = (public_key, 0o600)
        if node.release in UBUNTU_LAB_BASES:
            files.update(self._kernel_files(node))
        files.update(self.debian_subset_files(node.release, sources=True))
        return _tar(files)

    def _kernel_files(self, node: LabNode) -> dict[str, tuple[bytes, int]]:
        """An Ubuntu lab node's simulated running kernel (lab.hwsim.kernel)."""
        try:
            return kernel.node_files(self.state_dir)
        except kernel.KernelLibraryError as error:
            raise LabError(f"{node.name}: {error}") from error

    def _trust_ubuntu_standin(self, node: LabNode) -> None:
        """An Ubuntu lab node's archive keyring (Debian's keys under Ubuntu's name, made at
        image build) gets the key of the stand-in's own suite too (lab.aptrepo.UBUNTU_SUITE:
        Ubuntu's NVIDIA driver packages), as Ubuntu's keyring holds the key of every suite.
        The key is made with each build of the repository, so it is set at each ``up``."""
        from lab import aptrepo

        key = (self.repo_dir / aptrepo.KEYRINGS_DIR / aptrepo.UBUNTU_KEYRING).read_bytes()
        container = self.client.containers.get(node.container)
        standin = f"/usr/share/keyrings/{aptrepo.UBUNTU_KEYRING}"
        container.put_archive("/", _tar({standin: (key, 0o644)}))
        keyrings = "/usr/share/keyrings"
        result = container.exec_run(
            [
                "sh", "-c",
                f"cat {keyrings}/debian-archive-keyring.gpg {standin} "
                f"> {keyrings}/ubuntu-archive-keyring.gpg.new && "
                f"mv {keyrings}/ubuntu-archive-keyring.gpg.new "
                f"{keyrings}/ubuntu-archive-keyring.gpg",
            ]
        )  # fmt: skip
        if result.exit_code != 0:
            raise LabError(f"{node.name}: archive keyring: {result.output.decode().strip()}")

    def _wait_booted(self, container: Any, node: LabNode) -> None:
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        while time.monotonic() < deadline:
            container.reload()
            if container.status != "running":
                logs = container.logs(tail=5).decode(errors="replace").strip()
                raise LabError(
                    f"{node.name}: its systemd exited ({container.status}) while booting"
                    + (f": {logs}" if logs else "")
                )
            result = container.exec_run(["systemctl", "is-system-running", "--wait"])
            state = result.output.decode().strip()
            if state in ("running", "degraded"):
                # sshd answers: running, or listened for by ssh.socket (an Ubuntu node's boot).
                ssh = container.exec_run(
                    [
                        "sh",
                        "-c",
                        "systemctl is-active ssh.service || systemctl is-active ssh.socket",
                    ]
                )
                if ssh.exit_code == 0:
                    if state == "degraded":
                        failed = container.exec_run(["systemctl", "--failed", "--plain"])
                        self.log(f"{node.name}: degraded boot:\n{failed.output.decode()}")
                    return
            time.sleep(0.5)
        raise LabError(f"{node.name} did not finish booting in {BOOT_TIMEOUT_S} s")

    # --- Slurm controller ----------------------------------------------------------------------
    @property
    def slurm_path(self) -> Path:
        return self.state_dir / "slurm.json"

    @property
    def slurmctld_state_dir(self) -> Path:
        """slurmctld's StateSaveLocation, on the lab host: per controller release."""
        controller = self.slurm_controller()
        release = controller.release if controller else DEFAULT_RELEASE
        return self.state_dir / f"slurmctld-{release}"

    @property
    def munge_key_path(self) -> Path:
        """The cluster's MUNGE key on the control side (``slurm.munge_key_file``), 0600."""
        return self.state_dir / "munge.key"

    def slurm_settings(self) -> Slurm | None:
        """The ``slurm`` settings of the lab's nodes while its controller is up, else None."""
        from gpunode.model import Slurm

        if not self.slurm_path.exists():
            return None
        controller = json.loads(self.slurm_path.read_text())
        # Lab-only: the nodes are containers sharing the host's cgroup tree (cgroupns=host).
        # slurmd's cgroup plugins would make its job cgroups at the root of the host's
        # hierarchies (/sys/fs/cgroup/<controller>/slurm_<node>), shared by every lab whose
        # nodes have the same names and left behind by `lab down`; so the lab's jobs are
        # tracked by process (checked by hand: with cgroups on, a lab job got its device
        # cgroup and ran).
        return Slurm(
            enabled=True,
            controller=controller["name"],
            controller_address=controller["address"],
            cluster_name=SLURM_CLUSTER,
            munge_key_file=str(self.munge_key_path),
            cgroup_enforcement=False,
        )

    def slurm_controller(self) -> LabNode | None:
        if not self.slurm_path.exists():
            return None
        controller = json.loads(self.slurm_path.read_text())
        return LabNode(
            name=controller["name"],
            container=controller["container"],
            address=controller["address"],
            profile="",
            release=controller.get("release", DEFAULT_RELEASE),
        )

    def slurm_members(self) -> list[LabNode]:
        """The lab nodes that join the controller: those of its Debian release.

        A Slurm cluster is one Slurm release here: Debian 12 has Slurm 22.05, Debian 13 has
        24.11, and slurmctld talks to slurmd of its own and the two releases before it only
        (Slurm's upgrade guide: 24.11 takes 24.05 and 23.11), so a node of the other Debian
        release could not join; in a mixed lab it is no Slurm node.
        """
        controller = self.slurm_controller()
        if controller is None:
            return []
        return [node for node in self.nodes() if node.release == controller.release]

    def slurm_up(self, release: str | None = None) -> LabNode:
        """Bring up the lab's Slurm controller (slurmctld and munge, Debian's packages from
        the lab's package cache) and the cluster's MUNGE key; kept when already running.

        ``release``: the controller's Debian release (default: the first node's). The nodes
        of that release (:meth:`slurm_members`) join it when converged with the lab inventory
        (their ``slurm`` data, from :meth:`slurm_settings`): gpunode's slurm role, not the
        lab, makes them Slurm nodes.
        """
        from gpunode.expected.slurm import render_slurm_conf

        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._ensure_key()
        network = self._ensure_network()
        self.serve_package_cache()
        if release is None:
            nodes = self.nodes()
            release = nodes[0].release if nodes else DEFAULT_RELEASE
        if release not in DEBIAN_LAB_RELEASES:
            raise LabError(
                f"Slurm controller: release {release!r}; known: {', '.join(DEBIAN_LAB_RELEASES)}"
            )
        node = LabNode(
            name=SLURM_CONTROLLER,
            container=f"{self.name}-{SLURM_CONTROLLER}",
            address=f"{self.network_prefix}.{SLURM_CONTROLLER_OCTET}",
            profile="",
            release=release,
        )
        kept = self.slurm_controller()
        if kept is not None and kept.release != release:
            self._remove_container(kept.container)
        self._ensure_munge_key()
        self.slurm_path.write_text(
            json.dumps(
                {
                    "name": node.name,
                    "container": node.container,
                    "address": node.address,
                    "release": node.release,
                }
            )
            + "\n"
        )
        settings = self.slurm_settings()
        assert settings is not None
        if not self._running(node.container):
            public_key = self.key_path.with_suffix(".pub").read_bytes()
            archive = _tar({f"/home/{LOGIN_USER}/.ssh/authorized_keys": (public_key, 0o600)})
            # slurmctld's state outlives its container (slurm_down, then slurm_up): the dynamic
            # nodes it knew are pinged again, as a controller rebuilt on the same state does.
            # A controller without it never learns of a slurmd already running.
            state = self.slurmctld_state_dir
            state.mkdir(parents=True, exist_ok=True)
            mounts = {str(state): SLURMCTLD_STATE}
            self._start(node, self._ensure_image(release), network, archive, mounts)
        container = self.client.containers.get(node.container)
        packages = " ".join(SLURM_CONTROLLER_PACKAGES)
        install = (
            f"echo 'Acquire::http::Proxy \"{self.package_cache_url}\";' "
            "> /etc/apt/apt.conf.d/90gpunode-lab-proxy && "
            # Installed already (a controller kept from an earlier `up --slurm`): no apt.
            f"installed=$(dpkg-query -W -f='${{Status}}\\n' {packages} 2>/dev/null "
            "| grep -c 'install ok installed'); "
            f'[ "$installed" = {len(SLURM_CONTROLLER_PACKAGES)} ] && exit 0; '
            "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
            f"--no-install-recommends {packages}"
        )
        self._controller_exec(container, install, "installing slurmctld")
        container.put_archive(
            "/",
            _tar(
                {
                    "/etc/munge/munge.key.lab": (self.munge_key_path.read_bytes(), 0o400),
                    "/etc/slurm/slurm.conf": (render_slurm_conf(settings).encode(), 0o644),
                }
            ),
        )
        self._controller_exec(
            container,
            f"chown slurm:slurm {SLURMCTLD_STATE} && "
            "chown munge:munge /etc/munge/munge.key.lab && "
            "mv -f /etc/munge/munge.key.lab /etc/munge/munge.key && "
            "systemctl restart munge && systemctl enable slurmctld && "
            "systemctl restart slurmctld",
            "starting slurmctld",
        )
        deadline = time.monotonic() + SLURM_CONTROLLER_TIMEOUT_S
        while time.monotonic() < deadline:
            if container.exec_run(["scontrol", "ping"]).output.decode().count("is UP"):
                return node
            time.sleep(1)
        raise LabError(f"slurmctld on {node.container} did not answer scontrol ping")

    def slurm_down(self) -> None:
        """Remove the lab's Slurm controller (the nodes' slurmd are left as they are)."""
        controller = self.slurm_controller()
        if controller is not None:
            self._remove_container(controller.container)
        self.slurm_path.unlink(missing_ok=True)

    def _ensure_munge_key(self) -> None:
        """A 128-character hex key (munged takes any key of 32 bytes or more), made once."""
        if self.munge_key_path.exists():
            return
        with contextlib.suppress(FileExistsError):
            descriptor = os.open(self.munge_key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as handle:
                handle.write(secrets.token_hex(64) + "\n")

    @staticmethod
    def _controller_exec(container: Any, script: str, what: str) -> None:
        result = container.exec_run(["sh", "-c", script])
        if result.exit_code != 0:
            output = result.output.decode(errors="replace").strip()[-2000:]
            raise LabError(f"Slurm controller: {what} failed: {output}")

    # --- scratch disks -----------------------------------------------------------------------
    @property
    def scratch_dir(self) -> Path:
        return self.state_dir / "scratch"

    def attach_scratch_disks(
        self, node: LabNode, count: int, size_mib: int = SCRATCH_DISK_MIB
    ) -> list[str]:
        """Give a running node ``count`` real block devices: /dev/nvme0n1, /dev/nvme1n1, ...

        Each is a sparse file under ``scratch_dir`` on a host loop device. Docker only lets a
        container open the devices it was created with, so the device is hot-plugged: allowed
        in the node's devices cgroup (cgroup v1) and its node made with mknod in the
        container's /dev. The simulated ``nvme list`` drive at the same path (if the profile
        has one) reports the disk's real size. Idempotent; a disk keeps its data until
        ``down``. Needs root on the lab host (losetup) and the cgroup v1 devices controller;
        a container restart drops the devices (``up`` with ``scratch_disks`` adds them back).
        """
        if os.geteuid() != 0:
            raise LabError("scratch disks need root on the lab host (losetup, device cgroup)")
        _check_scratch_disks(count, size_mib)
        container = self.client.containers.get(node.container)
        cgroups = self._device_cgroups(container)
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        paths = []
        for index in range(count):
            image = self.scratch_dir / f"{node.name}-{index}.img"
            if not image.exists():
                with image.open("wb") as sparse:
                    sparse.truncate(size_mib * 2**20)
            loop = self._loop_device(image)
            device = os.stat(loop).st_rdev
            major, minor = os.major(device), os.minor(device)
            for cgroup in cgroups:
                # A transient unit's cgroup may be gone by now; it needs nothing then.
                with contextlib.suppress(FileNotFoundError):
                    (cgroup / "devices.allow").write_text(f"b {major}:{minor} rwm\n")
            path = f"/dev/nvme{index}n1"
            script = (
                f'if [ "$(stat -c %t:%T {path} 2>/dev/null)" != "{major:x}:{minor:x}" ]; then '
                f"rm -f {path} && mknod -m 660 {path} b {major} {minor} && chgrp disk {path}; fi"
                f"; gpunode-lab-hw show nvme.{index} >/dev/null 2>&1 || exit 0"
                f"; gpunode-lab-hw set nvme.{index}.physical_size {image.stat().st_size}"
                f" && gpunode-lab-hw set nvme.{index}.used_bytes 0"
            )
            result = container.exec_run(["sh", "-c", script])
            if result.exit_code != 0:
                raise LabError(f"{node.name}: {path}: {result.output.decode().strip()}")
            paths.append(path)
        return paths

    def _loop_device(self, image: Path) -> str:
        """The host loop device backed by ``image``, attaching one if there is none."""
        attached = self._attached_loops(image)
        if attached:
            return attached[0]
        result = subprocess.run(
            ["losetup", "--find", "--show", str(image)], capture_output=True, text=True
        )
        if result.returncode != 0:
            raise LabError(f"losetup {image}: {result.stderr.strip()}")
        return result.stdout.strip()

    @staticmethod
    def _device_cgroups(container: Any) -> list[Path]:
        """The node's devices cgroup and every cgroup below it, parents first.

        systemd in the node made child cgroups (init.scope, system.slice/...); each copied
        its parent's device list when it was made, so an allowance goes to all of them.
        """
        pid = container.attrs["State"]["Pid"]
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            parts = path.strip("/").split("/")
            if "devices" in controllers.split(",") and container.id in parts:
                root = Path("/sys/fs/cgroup/devices", *parts[: parts.index(container.id) + 1])
                if (root / "devices.allow").exists():
                    return [Path(top) for top, _, _ in os.walk(root)]
        raise LabError(
            "scratch disks need the cgroup v1 devices controller on the lab host (with cgroup "
            "v2, Docker fixes a container's device list when it creates the container)"
        )

    def _detach_scratch_disks(self) -> None:
        if not self.scratch_dir.exists():
            return
        for image in sorted(self.scratch_dir.glob("*.img")):
            for loop in self._attached_loops(image):
                subprocess.run(["losetup", "--detach", loop], check=False)

    @staticmethod
    def _attached_loops(image: Path) -> list[str]:
        return subprocess.run(
            ["losetup", "--noheadings", "--output", "NAME", "--associated", str(image)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()

    def _memory_mib(self, container: str) -> float:
        """Resident memory of the node's processes (page cache is the host's to reclaim).

        Read from the container's memory cgroup (v1, where systemd-in-docker runs here):
        Docker's own stats come back empty for some of these containers.
        """
        found = self.client.containers.get(container)
        stat_path = Path(f"/sys/fs/cgroup/memory/docker/{found.id}/memory.stat")
        if stat_path.exists():
            fields = dict(line.split() for line in stat_path.read_text().splitlines())
            return round(int(fields.get("total_rss", 0)) / 2**20, 1)
        memory = found.stats(stream=False).get("memory_stats", {})
        stats = memory.get("stats", {})
        used = stats.get("anon", memory.get("usage", 0) - stats.get("inactive_file", 0))
        return round(used / 2**20, 1)

    def _write_state(self, nodes: list[LabNode]) -> None:
        self.nodes_path.write_text(json.dumps([asdict(node) for node in nodes], indent=2) + "\n")
        self.write_known_hosts()

    def write_known_hosts(self) -> None:
        """known_hosts of every node and VM the state names."""
        everyone = [*self.nodes(), *self.vms()]
        # Whole or not at all: ssh may read it at any moment (another process's run).
        partial = self.known_hosts_path.with_suffix(".partial")
        partial.write_text("".join(f"{node.address} {node.host_key}\n" for node in everyone))
        partial.replace(self.known_hosts_path)

    def vms(self) -> list[Any]:
        """The lab's VMs (``lab.vm.LabVm``), apart from its container nodes."""
        from lab import vm

        return list(vm.load_vms(self))

    # --- down ----------------------------------------------------------------------------------
    def down(self, keep_image: bool = False) -> None:
        """Remove every container, network and state file the lab made (and its image and
        package cache, unless ``keep_image``)."""
        if not self.state_dir.exists():
            self._down(keep_image)
            return
        with state_lock(self.state_dir):
            self._down(keep_image)

    def _down(self, keep_image: bool) -> None:
        from lab import vm

        self._stop_repository()
        self._stop_package_cache()
        # Before the network: their taps are on its bridge.
        vm.down_vms(self)
        mine = {"label": f"{LABEL}={self.name}"}
        for container in self.client.containers.list(all=True, filters=mine):
            container.remove(force=True)
        for network in self.client.networks.list(filters=mine):
            network.remove()
        if not keep_image:
            # The node images are every lab's on this machine: one another lab's containers
            # still run from is kept (Docker would refuse it anyway, half-way through).
            in_use = {c.attrs.get("Image") for c in self.client.containers.list(all=True)}
            for release in LAB_RELEASES:
                for image in self.client.images.list(name=image_repository(release)):
                    if image.id in in_use:
                        self.log(f"kept image {', '.join(image.tags)}: another lab uses it")
                        continue
                    self.client.images.remove(image.id, force=True)
            shutil.rmtree(self.package_cache_dir, ignore_errors=True)
            vm.remove_images()
        # After the containers: their mounts of the scratch disks are gone with them.
        self._detach_scratch_disks()
        if self.state_dir.exists():
            shutil.rmtree(self.state_dir)

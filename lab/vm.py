"""The lab's VM tier: Debian guests with a real kernel of their own, run by qemu.

A container shares this machine's kernel, which has no md driver and refuses most sysctls;
a VM has Debian's kernel, so storage, sysctls, module blacklists and reboots are real there.
Each VM is reached over SSH on the lab's bridge exactly as a container node is.

- Image: per release, built once with mmdebstrap from the release, its updates and its
  security archive into a directory (the container image's packages and customization,
  plus Debian's kernel, udev, mdadm and nvme-cli, what the test suite's converge installs,
  a small initramfs and no units a lab VM does not need), then
  ``mkfs.ext4 -d`` makes a raw root filesystem of it (no loop mount). Its kernel and
  initramfs are copied out and booted with ``-kernel/-initrd``. Cached under
  ``$GPUNODE_LAB_CACHE/vm-images`` (named by a digest of the recipe), kept by
  ``lab down --keep-image``.
- Each VM boots its own sparse copy of that root filesystem (the base stays clean), with
  ``nvme_drives`` emulated NVMe drives (sparse raw files, serials ``LABVM<index>N<drive>``) the real
  nvme-cli of the guest lists.
- Network: a tap device enslaved to the lab's Docker bridge; the guest's address comes from
  the kernel command line (``ip=``, read by systemd-network-generator for systemd-networkd).
- Per-VM files (the lab's login key, the VM's own SSH host key, made here so known_hosts
  never trusts a first connection, the hardware doubles of its profile, a resolver) travel
  as one tar through qemu's fw_cfg; a unit of the image unpacks it at the first boot.
- Acceleration: KVM where it boots, else TCG. On some machines /dev/kvm opens but a KVM guest
  hangs at boot, so the first KVM boot is watched on the serial console; a guest that does
  not reach systemd in ``KVM_PROBE_S`` is restarted under TCG and the verdict is kept
  beside the images (``GPUNODE_LAB_VM_ACCEL=kvm|tcg`` decides instead).

Boot loader: a small supervisor (``python -m lab.vm supervise DIR``, the VM's recorded pid)
reads the kernel and initramfs out of the VM's own root filesystem (debugfs, no mount) before
each boot and runs qemu with ``-no-reboot``; when the guest reboots, qemu exits and the
supervisor boots it again from its /boot, as a boot loader would. So an ``update-initramfs``
in the guest is what its next boot uses. (The kernel release stays the image's.)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpunode import distributions
from gpunode.expected.packages import PASSWORD_QUALITY_PACKAGE
from lab import (
    DEBIAN_COMPONENTS,
    DEBIAN_LAB_RELEASES,
    DEBIAN_MIRROR,
    DEBIAN_SECURITY_MIRROR,
    DEFAULT_RELEASE,
    LOGIN_USER,
    NODE_PACKAGES,
    REPO_ROOT,
    LabError,
    LabNode,
    _customize_script,
    _tar,
    hwsim,
    state_lock,
)

if TYPE_CHECKING:
    from lab import Lab

# VMs take the top of the lab's /24: containers count up from .11 (at most 200 of them).
FIRST_VM_OCTET = 231
MAX_VMS = 20
DEFAULT_VM_PROFILE = "pcie-a10g"
DEFAULT_MEMORY_MIB = 1024
DEFAULT_NVME_DRIVES = 4
DEFAULT_NVME_MIB = 1024
ROOT_DISK_SIZE = "4G"
# A TCG guest on two busy cores: boot to sshd takes about a minute, several in parallel more.
BOOT_TIMEOUT_S = 600
KVM_PROBE_S = 30
KVM_DEVICE = Path("/dev/kvm")
TCG_CACHE_MIB = 128
# What the serial console shows once the kernel has handed over to systemd.
BOOTED_MARKERS = (b"Welcome to Debian", b"systemd[1]:")
SEED_NAME = "opt/gpunode-lab/seed"
SEEDED_MARK = "/var/lib/gpunode-lab/vm-seeded"

VM_PACKAGES = (
    *NODE_PACKAGES,
    "linux-image-amd64", "udev", "zstd", "mdadm", "nvme-cli", "e2fsprogs", "libnss-myhostname",
    # What the test suite's converges (tests/integration/test_vm*.py) install from Debian, here
    # already, so that a TCG guest runs no apt at all: the NVMe cache's filesystem tools, the
    # kernel role's password quality checks and the firewall's nftables. The roles still
    # ensure them (a no-op here).
    "xfsprogs", PASSWORD_QUALITY_PACKAGE, "nftables",
)  # fmt: skip

SEED_SCRIPT = f"""\
#!/bin/sh
# Unpack this VM's own files (lab.vm: keys, hardware doubles), handed over by qemu's fw_cfg.
set -e
modprobe qemu_fw_cfg 2>/dev/null || true
seed=/sys/firmware/qemu_fw_cfg/by_name/{SEED_NAME}/raw
for _ in $(seq 100); do [ -r "$seed" ] && break; sleep 0.1; done
tar -x --no-overwrite-dir -C / -f "$seed"
chown -R {LOGIN_USER}:{LOGIN_USER} /home/{LOGIN_USER}/.ssh
# The simulated GPUs have a loaded driver from the first boot, as in the containers, whose
# modules.dep lists nvidia.ko (Container Toolkit's nvidia-cdi-refresh reads it). Here the
# kernel's own modules.dep is depmod's: the line is added to it, nothing replaced.
dep="/lib/modules/$(uname -r)/modules.dep"
grep -q '/nvidia.ko:' "$dep" || echo 'updates/dkms/nvidia.ko:' >> "$dep"
mkdir -p "$(dirname {SEEDED_MARK})"
touch {SEEDED_MARK}
"""

SEED_UNIT = f"""\
[Unit]
Description=This lab VM's own keys and hardware doubles (from qemu fw_cfg)
Before=ssh.service gpunode-lab-hostkeys.service
ConditionPathExists=!{SEEDED_MARK}

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/gpunode-lab-vm-seed

[Install]
WantedBy=multi-user.target
"""


# The initramfs: what a VM needs to mount its root (virtio disk, ext4) and no more. Debian's
# default (MODULES=most) puts every storage driver in, 30 MB that a TCG guest unpacks at every
# boot; MODULES=dep cannot be used in the image's chroot (it reads the running machine's
# devices). The image's initramfs is made again with this list, and a VM's own
# update-initramfs (the NVMe cache role runs one for mdadm.conf) uses it too; the hooks'
# modules (mdadm's md and raid) are added by the hooks. zstd: unpacked faster than gzip.
# RESUME=none: no swap to resume from, and no probing for one. (initramfs.conf(5),
# initramfs-tools(7), Debian 12 and 13.)
INITRAMFS_CONF = "MODULES=list\nCOMPRESS=zstd\nCOMPRESSLEVEL=1\nRESUME=none\n"
INITRAMFS_MODULES = ("virtio_pci", "virtio_blk", "ext4")
# Hooks of the image's packages that put in what a lab VM's boot never uses, set aside with
# dpkg-divert: dmsetup's (device-mapper tools, for a root on LVM or LUKS; a lab VM's root is a
# plain virtio disk), six seconds of every update-initramfs on the emulated CPU.
INITRAMFS_HOOKS_OFF = ("dmsetup",)

# apt in the VM: no translated package descriptions (nothing reads them), and the gzip
# indexes of a suite before its xz ones (Debian publishes both; apt takes the first its
# Release lists, apt.conf(5) Acquire::CompressionTypes::Order): an emulated CPU unpacks gzip
# several times faster, and a driver change's apt update unpacked xz lists for a minute and
# more. The apt sources and everything gpunode writes are as on any node.
APT_CONF = 'Acquire::Languages "none";\nAcquire::CompressionTypes::Order { "gz"; };\n'

# Units of Debian's packages a lab VM does not want, masked in the image: each costs seconds
# of an emulated CPU at boot or runs in the middle of a test. e2scrub (e2fsprogs) checks ext4
# on LVM, of which a VM has none; nvmf/nvmefc (nvme-cli) connect NVMe over Fabrics targets,
# and a VM's drives are local; dpkg's database backup and fstrim are daily upkeep of machines
# that live longer than a test session. (apt's daily timers, which would take dpkg's lock
# during a converge, are masked in every lab image: lab.APT_TIMERS.)
MASKED_UNITS = (
    "e2scrub_reap.service", "e2scrub_all.timer", "nvmf-autoconnect.service",
    "nvmefc-boot-connections.service", "dpkg-db-backup.timer", "fstrim.timer",
)  # fmt: skip

# The kernel command line's cuts for an emulated CPU (TCG only). mitigations=off: the
# speculative execution mitigations (retpolines, RSB filling on every context switch) protect
# nothing in a guest whose CPU is qemu's translator, and cost about a third of each process
# start there, which a converge does by the thousand (update-initramfs above all). The guest's
# hardening that the tests check (sysctls, module blacklists) is not on the command line.
TCG_CMDLINE_CUTS = ("mitigations=off",)
# The emulated CPU under TCG: qemu64, the plain x86-64 baseline that Debian 12 and 13 are
# built for. -cpu max offers AVX2/AVX-512 (each instruction a helper call in the translator,
# and glibc's string functions pick them), la57 (five-level page tables: a longer walk on
# every TLB miss of the software MMU) and svm (the guest's kvm_amd loads at boot). Measured on
# this CI machine, with mitigations=off, once each under another lab's load: a process start
# 40 ms -> 29 ms, boot to SSH 45 s -> 32 s, mkinitramfs 113 s -> 84 s.
TCG_CPU = "qemu64"


def _vm_customize_script(release: str) -> str:
    return (
        _customize_script(release, diverted=hwsim.VM_DIVERTED_PATHS)
        + f"""\
cat > "$1/usr/local/sbin/gpunode-lab-vm-seed" <<'SCRIPT'
{SEED_SCRIPT}SCRIPT
chmod 755 "$1/usr/local/sbin/gpunode-lab-vm-seed"
cat > "$1/etc/systemd/system/gpunode-lab-vm-seed.service" <<'UNIT'
{SEED_UNIT}UNIT
chroot "$1" systemctl enable gpunode-lab-vm-seed.service
chroot "$1" systemctl enable systemd-networkd.service systemd-network-generator.service
echo '/dev/vda / ext4 errors=remount-ro 0 1' > "$1/etc/fstab"
mkdir -p "$1/etc/initramfs-tools/conf.d"
cat > "$1/etc/initramfs-tools/conf.d/gpunode-lab-vm.conf" <<'CONF'
{INITRAMFS_CONF}CONF
printf '%s\\n' {" ".join(INITRAMFS_MODULES)} >> "$1/etc/initramfs-tools/modules"
for hook in {" ".join(INITRAMFS_HOOKS_OFF)}; do
  chroot "$1" dpkg-divert --quiet --local --rename \\
    --divert "/usr/share/initramfs-tools/hooks/$hook.gpunode-lab-off" \\
    --add "/usr/share/initramfs-tools/hooks/$hook"
done
chroot "$1" update-initramfs -u -k all
chroot "$1" systemctl mask {" ".join(MASKED_UNITS)}
cat > "$1/etc/apt/apt.conf.d/90gpunode-lab-vm" <<'CONF'
{APT_CONF}CONF
"""
    )


@dataclass
class LabVm(LabNode):
    """A lab VM; ``container`` is its qemu process's name (``-name``)."""

    accel: str = ""
    pid: int = 0
    tap: str = ""
    memory_limit_mib: int = DEFAULT_MEMORY_MIB
    nvme_serials: list[str] = field(default_factory=list)
    kernel: str = ""
    # Its files (disk, drives, console log); the supervisor's command line names it.
    directory: str = ""
    # In inventories/lab.py (group vms); the test suite's VM is not (up_vms).
    listed: bool = True


@dataclass(frozen=True)
class VmImage:
    directory: Path
    release: str

    @property
    def root(self) -> Path:
        return self.directory / "root.raw"

    @property
    def kernel(self) -> Path:
        return self.directory / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.directory / "initrd.img"

    @property
    def kernel_release(self) -> str:
        return (self.directory / "kernel-release").read_text().strip()


def cache_root() -> Path:
    return Path(os.environ.get("GPUNODE_LAB_CACHE", "/var/cache/gpunode-lab")) / "vm-images"


def image_sources(release: str) -> tuple[str, ...]:
    """mmdebstrap's MIRROR arguments for ``release``: one sources.list line per suite.

    The image is built from the release, its updates and its security archive, the suites its
    apt sources name (lab.debian_sources). Built from the release alone, a fresh VM starts with
    every security fix since the point release pending: lynis counts them (PKGS-7392) and a
    node in a data centre is installed from the current archive."""
    row = distributions.BY_CODENAME[release]
    return tuple(
        [f"deb {DEBIAN_MIRROR} {suite} {DEBIAN_COMPONENTS}" for suite in row.suites]
        + [f"deb {DEBIAN_SECURITY_MIRROR} {suite} {DEBIAN_COMPONENTS}"
           for suite in row.security_suites]
    )  # fmt: skip


def image_name(release: str) -> str:
    """The VM image of ``release``; named by a digest of how it is built (its packages, its
    archives and suites, its customization and size): a changed recipe is a new image."""
    recipe = json.dumps(
        [VM_PACKAGES, image_sources(release), _vm_customize_script(release), ROOT_DISK_SIZE]
    ).encode()
    codename = distributions.BY_CODENAME[release].cuda_repo_distro
    return f"{codename}-{hashlib.sha256(recipe).hexdigest()[:12]}"


def ensure_image(lab: Lab, release: str = DEFAULT_RELEASE) -> VmImage:
    """The VM image of ``release``, built once (about as long as the container image)."""
    for tool in ("mmdebstrap", "mkfs.ext4", "debugfs"):
        if shutil.which(tool) is None:
            raise LabError(f"{tool} is missing: ./dev setup installs what the VM tier needs")
    image = VmImage(cache_root() / image_name(release), release)
    if (image.directory / "complete").exists():
        return image
    row = distributions.BY_CODENAME[release]
    lab.log(f"building lab VM image {image.directory.name} with mmdebstrap ({row.pretty_name})...")
    started = time.monotonic()
    cache_root().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_root(), prefix=".build-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        hook = Path(tmp) / "customize.sh"
        hook.write_text(_vm_customize_script(release))
        result = subprocess.run(
            [
                "mmdebstrap", "--variant=minbase", "--quiet",
                "--include=" + ",".join(VM_PACKAGES),
                f"--customize-hook=sh {hook} \"$1\"",
                release, str(rootfs), *image_sources(release),
            ],
            capture_output=True,
            text=True,
        )  # fmt: skip
        if result.returncode != 0:
            raise LabError(f"mmdebstrap failed:\n{result.stderr[-3000:]}")
        built = Path(tmp) / "image"
        built.mkdir()
        kernels = sorted((rootfs / "boot").glob("vmlinuz-*"))
        if len(kernels) != 1:
            raise LabError(f"the VM image has {len(kernels)} kernels in /boot, not one")
        release_name = kernels[0].name.removeprefix("vmlinuz-")
        shutil.copy(kernels[0], built / "vmlinuz")
        shutil.copy(rootfs / "boot" / f"initrd.img-{release_name}", built / "initrd.img")
        (built / "kernel-release").write_text(release_name + "\n")
        made = subprocess.run(
            ["mkfs.ext4", "-q", "-L", "gpunode-root", "-d", str(rootfs),
             str(built / "root.raw"), ROOT_DISK_SIZE],
            capture_output=True,
            text=True,
        )  # fmt: skip
        if made.returncode != 0:
            raise LabError(f"mkfs.ext4 -d failed: {made.stderr.strip()}")
        (built / "complete").write_text(f"{release}\n")
        shutil.rmtree(image.directory, ignore_errors=True)
        built.rename(image.directory)
    # An image of an older recipe is never booted again.
    codename = image.directory.name.split("-")[0]
    for older in cache_root().glob(f"{codename}-*"):
        if older != image.directory:
            shutil.rmtree(older, ignore_errors=True)
    lab.log(f"VM image built in {time.monotonic() - started:.1f} s")
    return image


def remove_images() -> None:
    shutil.rmtree(cache_root(), ignore_errors=True)


# --- acceleration ------------------------------------------------------------------------


def _accel_verdict_path() -> Path:
    return cache_root() / "accel.json"


def _accel_key() -> str:
    qemu = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True)
    return f"{os.uname().release} {qemu.stdout.splitlines()[0] if qemu.stdout else ''}"


def _known_accel() -> str | None:
    """kvm or tcg when it is decided (by the environment or an earlier probe), else None."""
    forced = os.environ.get("GPUNODE_LAB_VM_ACCEL", "auto")
    if forced in ("kvm", "tcg"):
        return forced
    if forced != "auto":
        raise LabError(f"GPUNODE_LAB_VM_ACCEL={forced!r}: kvm, tcg or auto")
    try:
        with KVM_DEVICE.open("rb"):
            pass
    except OSError:
        # No KVM here (most CI machines): TCG straight away, nothing to probe.
        return "tcg"
    with contextlib.suppress(OSError, ValueError, KeyError):
        verdict = json.loads(_accel_verdict_path().read_text())
        if verdict["key"] == _accel_key():
            return str(verdict["accel"])
    return None


def _record_accel(accel: str) -> None:
    cache_root().mkdir(parents=True, exist_ok=True)
    _accel_verdict_path().write_text(json.dumps({"key": _accel_key(), "accel": accel}) + "\n")


# --- the VMs -----------------------------------------------------------------------------


def vms_path(lab: Lab) -> Path:
    return lab.state_dir / "vms.json"


def vm_dir(lab: Lab, vm: LabVm) -> Path:
    return lab.state_dir / "vms" / vm.name


def load_vms(lab: Lab) -> list[LabVm]:
    if not vms_path(lab).exists():
        return []
    return [LabVm(**raw) for raw in json.loads(vms_path(lab).read_text())]


def _tap_prefix(lab: Lab) -> str:
    # Interface names have 15 characters at most; the lab's name makes them its own.
    return "gnv" + hashlib.sha256(lab.name.encode()).hexdigest()[:6] + "-"


def _wanted(
    lab: Lab,
    count: int,
    profiles: list[str],
    releases: list[str],
    memory_mib: int,
    drives: int,
    listed: bool = True,
) -> list[LabVm]:
    octet = int(lab.network_prefix.rsplit(".", 1)[1])
    return [
        LabVm(
            name=f"lab-vm-{index}",
            container=f"{lab.name}-vm-{index}",
            address=f"{lab.network_prefix}.{FIRST_VM_OCTET + index - 1}",
            profile=profiles[(index - 1) % len(profiles)],
            release=releases[(index - 1) % len(releases)],
            tap=f"{_tap_prefix(lab)}{index}",
            memory_limit_mib=memory_mib,
            nvme_serials=[f"LABVM{octet}X{index}N{drive}" for drive in range(drives)],
            listed=listed,
        )
        for index in range(1, count + 1)
    ]


def qemu_running(vm: LabVm) -> bool:
    """Whether ``vm``'s supervisor (and so its qemu) runs: its pid, with its command line."""
    try:
        argv = Path(f"/proc/{vm.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return vm.pid > 0 and bool(vm.directory) and _is_supervisor(argv, vm.directory)


def _is_supervisor(argv: list[bytes], directory: str) -> bool:
    words = [word for word in argv if word]
    return len(words) >= 2 and words[-2:] == [b"supervise", directory.encode()]


def up_vms(
    lab: Lab,
    count: int,
    profiles: Iterable[str] = (DEFAULT_VM_PROFILE,),
    releases: Iterable[str] = (DEFAULT_RELEASE,),
    memory_mib: int = DEFAULT_MEMORY_MIB,
    nvme_drives: int = DEFAULT_NVME_DRIVES,
    nvme_mib: int = DEFAULT_NVME_MIB,
    listed: bool = True,
) -> list[LabVm]:
    """Bring the lab to ``count`` running VMs; running ones of the same release are kept.

    Booted in parallel; each returns once it accepts the lab's SSH login. ``listed``: whether
    inventories/lab.py lists them (group vms); the test suite's VM is not, so that no
    container test's deploy of that inventory reaches it.
    """
    profile_cycle, release_cycle = list(profiles), list(releases)
    unknown = [p for p in profile_cycle if p not in hwsim.PROFILES]
    if unknown or not profile_cycle:
        raise LabError(f"unknown hardware profile(s) {unknown}; known: {', '.join(hwsim.PROFILES)}")
    if not release_cycle or any(r not in DEBIAN_LAB_RELEASES for r in release_cycle):
        known = ", ".join(DEBIAN_LAB_RELEASES)
        raise LabError(f"VM releases {release_cycle}: known: {known}")
    if not 0 <= count <= MAX_VMS:
        raise LabError(f"--vms {count}: choose between 0 and {MAX_VMS}")
    if not 0 <= nvme_drives <= 8 or nvme_mib < 300 or not 512 <= memory_mib <= 16384:
        raise LabError(
            f"VMs: {nvme_drives} NVMe drives of {nvme_mib} MiB and {memory_mib} MiB of memory "
            "asked; 0 to 8 drives of at least 300 MiB, 512 to 16384 MiB of memory"
        )
    if os.geteuid() != 0:
        raise LabError("lab VMs need root on the lab host (tap devices on the lab bridge)")
    if shutil.which("qemu-system-x86_64") is None:
        raise LabError("qemu-system-x86_64 is missing: apt-get install qemu-system-x86")
    # The image first, outside the lab's lock: the longest part when it is built, and only
    # this module's cache is touched (the container nodes may come up meanwhile).
    images = {release: ensure_image(lab, release) for release in dict.fromkeys(release_cycle)}
    wanted = _wanted(lab, count, profile_cycle, release_cycle, memory_mib, nvme_drives, listed)
    with state_lock(lab.state_dir):
        lab._ensure_key()
        bridge = _bridge(lab)
        by_name = {vm.name: vm for vm in wanted}
        existing = {}
        for vm in load_vms(lab):
            keep = by_name.get(vm.name)
            if (
                keep is not None
                and qemu_running(vm)
                and (vm.release, vm.nvme_serials, vm.memory_limit_mib)
                == (keep.release, keep.nvme_serials, keep.memory_limit_mib)
            ):
                vm.listed = keep.listed
                existing[vm.name] = vm
            else:
                _stop(lab, vm)
        for pid in _orphans(lab, kept={vm.pid for vm in existing.values()}):
            _kill(pid)
        lab.serve_repository()
        lab.serve_package_cache()
        to_start = [vm for vm in wanted if vm.name not in existing]
        for vm in to_start:
            _prepare(lab, vm, nvme_mib)
        final = [existing.get(vm.name, vm) for vm in wanted]
        # known_hosts first: the host keys are made here, so the first login already checks
        # them.
        _write_state(lab, final)
    # Booting takes minutes under TCG; the lab's state may change meanwhile (not this VM's).
    accel = _known_accel()
    if accel is None and to_start:
        # The first VM finds out whether KVM boots here; the others follow its verdict.
        first, *rest = to_start
        accel = _boot(lab, first, images[first.release], bridge, "kvm", probe=True)
        _record_accel(accel)
        to_start = rest
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(to_start)))) as pool:
        list(
            pool.map(
                lambda vm: _boot(lab, vm, images[vm.release], bridge, accel or "tcg"), to_start
            )
        )
    for vm in final:
        vm.memory_mib = _rss_mib(_qemu_pid(lab, vm))
    with state_lock(lab.state_dir):
        _write_state(lab, final)
    return final


def _bridge(lab: Lab) -> str:
    network = lab.client.networks.get(lab._ensure_network())
    options = network.attrs.get("Options") or {}
    return str(options.get("com.docker.network.bridge.name") or f"br-{network.id[:12]}")


def _prepare(lab: Lab, vm: LabVm, nvme_mib: int) -> None:
    """The VM's drives, host key and seed (fresh: a VM started again starts clean)."""
    directory = vm_dir(lab, vm)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for index, _serial in enumerate(vm.nvme_serials):
        with (directory / f"nvme{index}.img").open("wb") as sparse:
            sparse.truncate(nvme_mib * 2**20)
    host_key = directory / "ssh_host_ed25519_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{vm.name}",
         "-f", str(host_key)],
        check=True,
    )  # fmt: skip
    vm.host_key = " ".join(host_key.with_suffix(".pub").read_text().split()[:2])
    files = dict(hwsim.node_files(vm.profile, vm.name, vm=True))
    files[f"/home/{LOGIN_USER}/.ssh/authorized_keys"] = (
        lab.key_path.with_suffix(".pub").read_bytes(),
        0o600,
    )
    files["/etc/ssh/ssh_host_ed25519_key"] = (host_key.read_bytes(), 0o600)
    files["/etc/ssh/ssh_host_ed25519_key.pub"] = (host_key.with_suffix(".pub").read_bytes(), 0o644)
    files["/etc/resolv.conf"] = (_resolv_conf(lab).encode(), 0o644)
    # A subset lab's VM starts with apt sources naming the lab's subset of Debian, as its
    # containers do: apt on the emulated CPU reads a tenth of the index.
    files.update(lab.debian_subset_files(vm.release, sources=True))
    (directory / "seed.tar").write_bytes(_tar(files))


def _resolv_conf(lab: Lab) -> str:
    """The host's resolvers the guest can reach (a loopback one is the host's alone)."""
    servers = []
    with contextlib.suppress(OSError):
        for line in Path("/etc/resolv.conf").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver" and not parts[1].startswith("127."):
                servers.append(parts[1])
    return "".join(f"nameserver {server}\n" for server in servers or [lab.gateway])


def qemu_command(lab: Lab, vm: LabVm, image: VmImage, accel: str) -> list[str]:
    directory = vm_dir(lab, vm)
    append = " ".join(
        [
            "root=/dev/vda", "rw", "console=ttyS0", "net.ifnames=0", "panic=-1",
            f"ip={vm.address}::{lab.gateway}:255.255.255.0:{vm.name}:eth0:off",
            f"systemd.hostname={vm.name}", *(TCG_CMDLINE_CUTS if accel != "kvm" else ()),
        ]
    )  # fmt: skip
    octet = int(vm.address.rsplit(".", 1)[1])
    subnet = int(lab.network_prefix.rsplit(".", 1)[1])
    command = [
        "qemu-system-x86_64", "-name", vm.container, "-nodefaults", "-no-user-config",
        "-display", "none", "-machine", "q35", "-m", str(vm.memory_limit_mib),
        # TCG's translation cache is 1 GiB by default: as much again as the guest's memory.
        "-accel", "kvm" if accel == "kvm" else f"tcg,tb-size={TCG_CACHE_MIB}",
        "-smp", "1", "-cpu", "host" if accel == "kvm" else TCG_CPU,
        # Read out of the VM's own /boot before each boot (supervise).
        "-kernel", str(directory / "vmlinuz"), "-initrd", str(directory / "initrd.img"),
        "-append", append, "-no-reboot",
        # The disk is thrown away with the VM: no host-crash safety is worth the flushes.
        "-drive", f"file={directory / 'root.raw'},if=virtio,format=raw,cache=unsafe",
        "-netdev", f"tap,id=net0,ifname={vm.tap},script=no,downscript=no",
        "-device", f"virtio-net-pci,netdev=net0,mac=52:54:00:d5:{subnet:02x}:{octet:02x}",
        "-object", "rng-random,filename=/dev/urandom,id=rng0",
        "-device", "virtio-rng-pci,rng=rng0",
        "-fw_cfg", f"name={SEED_NAME},file={directory / 'seed.tar'}",
        "-serial", f"file:{directory / 'console.log'}",
        "-pidfile", str(directory / "qemu.pid"),
    ]  # fmt: skip
    for index, serial in enumerate(vm.nvme_serials):
        command += [
            "-drive", f"file={directory / f'nvme{index}.img'},if=none,id=nvme{index},format=raw",
            "-device", f"nvme,serial={serial},drive=nvme{index}",
        ]  # fmt: skip
    return command


def _boot(lab: Lab, vm: LabVm, image: VmImage, bridge: str, accel: str, probe: bool = False) -> str:
    """Start ``vm`` under ``accel`` and wait for its SSH login; returns the accel it runs.

    ``probe``: a KVM guest that shows no sign of systemd in KVM_PROBE_S is restarted under TCG.
    """
    directory = vm_dir(lab, vm)
    root = directory / "root.raw"
    root.unlink(missing_ok=True)
    subprocess.run(["cp", "--sparse=always", str(image.root), str(root)], check=True)
    (directory / "boot.json").write_text(
        json.dumps({"argv": qemu_command(lab, vm, image, accel), "kernel": image.kernel_release})
    )
    _ensure_tap(vm.tap, bridge)
    started = time.monotonic()
    console = directory / "console.log"
    console.unlink(missing_ok=True)
    log = (directory / "qemu.log").open("ab")
    vm.directory = str(directory)
    process = subprocess.Popen(
        [sys.executable, "-m", "lab.vm", "supervise", str(directory)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
        cwd=REPO_ROOT,
    )
    vm.pid, vm.accel, vm.kernel = process.pid, accel, image.kernel_release
    if probe and accel == "kvm":
        deadline = time.monotonic() + KVM_PROBE_S
        while time.monotonic() < deadline and process.poll() is None:
            shown = console.read_bytes() if console.exists() else b""
            if any(marker in shown for marker in BOOTED_MARKERS):
                break
            time.sleep(0.5)
        else:
            lab.log(f"{vm.name}: no boot under KVM in {KVM_PROBE_S} s; using TCG")
            _kill(process.pid)
            process.wait()
            time.sleep(1)
            return _boot(lab, vm, image, bridge, "tcg")
    _wait_for_ssh(lab, vm, process, deadline=started + BOOT_TIMEOUT_S)
    vm.boot_s = round(time.monotonic() - started, 2)
    return accel


def _ensure_tap(tap: str, bridge: str) -> None:
    subprocess.run(["ip", "link", "del", tap], capture_output=True, check=False)
    for command in (
        ["ip", "tuntap", "add", "dev", tap, "mode", "tap"],
        ["ip", "link", "set", tap, "master", bridge],
        ["ip", "link", "set", tap, "up"],
    ):
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise LabError(f"{shlex.join(command)}: {result.stderr.strip()}")


def ssh_command(lab: Lab, vm: LabNode, command: str, timeout_s: int = 10) -> list[str]:
    return [
        "ssh", "-i", str(lab.key_path), "-o", f"UserKnownHostsFile={lab.known_hosts_path}",
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
        "-o", f"ConnectTimeout={timeout_s}", f"{LOGIN_USER}@{vm.address}", command,
    ]  # fmt: skip


def _wait_for_ssh(lab: Lab, vm: LabVm, process: subprocess.Popen, deadline: float) -> None:
    console = vm_dir(lab, vm) / "console.log"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LabError(f"{vm.name}: qemu exited ({process.returncode}); see {console.parent}")
        result = subprocess.run(ssh_command(lab, vm, "true", 5), capture_output=True, timeout=60)
        if result.returncode == 0:
            return
        time.sleep(2)
    tail = console.read_bytes()[-1500:].decode(errors="replace") if console.exists() else ""
    raise LabError(f"{vm.name}: no SSH login in {BOOT_TIMEOUT_S} s; its console ends:\n{tail}")


def reboot(lab: Lab, vm: LabVm, timeout_s: float = BOOT_TIMEOUT_S) -> float:
    """Reboot ``vm`` for real (``systemctl reboot`` in the guest; qemu stays, the guest's
    kernel restarts) and return once it accepts SSH logins again: the seconds it took.

    A new boot is told by the kernel's boot_id, never by SSH answering (the old boot answers
    for a while); a qemu that exits meanwhile is an error.
    """
    read_boot_id = ssh_command(lab, vm, "cat /proc/sys/kernel/random/boot_id", 5)
    before = subprocess.run(read_boot_id, capture_output=True, text=True, timeout=60)
    if before.returncode != 0 or not before.stdout.strip():
        raise LabError(f"{vm.name}: cannot read its boot_id: {before.stderr.strip()}")
    started = time.monotonic()
    # The session ends with the guest's sshd: its exit status is not the reboot's.
    subprocess.run(
        ssh_command(lab, vm, "sudo systemctl reboot", 5), capture_output=True, timeout=60
    )
    while time.monotonic() < started + timeout_s:
        if not qemu_running(vm):
            raise LabError(f"{vm.name}: its qemu is gone")
        now = subprocess.run(read_boot_id, capture_output=True, text=True, timeout=60)
        if now.returncode == 0 and now.stdout.strip() not in ("", before.stdout.strip()):
            return round(time.monotonic() - started, 2)
        time.sleep(2)
    raise LabError(f"{vm.name}: did not come back from its reboot in {timeout_s:.0f} s")


def _rss_mib(pid: int) -> float:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _kill(pid: int) -> None:
    """Kill a supervisor and its qemu (the supervisor leads their process group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _qemu_pid(lab: Lab, vm: LabVm) -> int:
    with contextlib.suppress(OSError, ValueError):
        return int((vm_dir(lab, vm) / "qemu.pid").read_text())
    return 0


def _stop(lab: Lab, vm: LabVm) -> None:
    if qemu_running(vm):
        _kill(vm.pid)
        for _ in range(100):
            if not qemu_running(vm):
                break
            time.sleep(0.05)
    subprocess.run(["ip", "link", "del", vm.tap], capture_output=True, check=False)
    shutil.rmtree(vm_dir(lab, vm), ignore_errors=True)


def _write_state(lab: Lab, vms: list[LabVm]) -> None:
    # Whole or not at all: inventories/lab.py may read it at any moment (another process).
    partial = vms_path(lab).with_suffix(".partial")
    partial.write_text(json.dumps([asdict(vm) for vm in vms], indent=2) + "\n")
    partial.replace(vms_path(lab))
    lab.write_known_hosts()


def _orphans(lab: Lab, kept: set[int] | None = None) -> list[int]:
    """Supervisors and qemu processes of this lab's VMs that its state may not name (a run
    killed half-way records no pid): told by their VM directory or qemu ``-name``. Those of
    the ``kept`` supervisors (their process groups) are not orphans."""
    kept = kept or set()
    found = []
    vms_root = str(lab.state_dir / "vms") + "/"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = [word for word in (entry / "cmdline").read_bytes().split(b"\0") if word]
        except OSError:
            continue
        with contextlib.suppress(OSError):
            if os.getpgid(int(entry.name)) in kept:
                continue
        if (
            len(argv) >= 2
            and argv[-2] == b"supervise"
            and argv[-1].decode(errors="replace").startswith(vms_root)
        ):
            found.append(int(entry.name))
        elif argv and argv[0].endswith(b"qemu-system-x86_64") and b"-name" in argv:
            index = argv.index(b"-name") + 1
            name = argv[index] if index < len(argv) else b""
            if re.fullmatch(rb"%s-vm-\d+" % re.escape(lab.name.encode()), name):
                found.append(int(entry.name))
    return found


def down_vms(lab: Lab) -> None:
    """Kill every VM of the lab, remove its tap, disk, drives and state."""
    if not lab.state_dir.exists():
        _down_vms(lab)
        return
    with state_lock(lab.state_dir):
        _down_vms(lab)


def _down_vms(lab: Lab) -> None:
    for vm in load_vms(lab):
        _stop(lab, vm)
    for pid in _orphans(lab):
        _kill(pid)
    # Taps of VMs the state no longer names (a run killed half-way).
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(_tap_prefix(lab)):
            subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)
    vms_path(lab).unlink(missing_ok=True)
    if vms_path(lab).parent.exists():
        shutil.rmtree(lab.state_dir / "vms", ignore_errors=True)
        lab.write_known_hosts()


# --- the boot loader ---------------------------------------------------------------------

REBOOT_MARK = b"reboot: Restarting system"


def extract_boot_files(directory: Path, kernel_release: str) -> None:
    """The kernel and initramfs of the VM's own /boot, read from its disk with debugfs."""
    for name, source in (
        ("vmlinuz", f"/boot/vmlinuz-{kernel_release}"),
        ("initrd.img", f"/boot/initrd.img-{kernel_release}"),
    ):
        target = directory / name
        partial = directory / f".{name}.partial"
        partial.unlink(missing_ok=True)
        result = subprocess.run(
            ["debugfs", "-R", f"dump {source} {partial}", str(directory / "root.raw")],
            capture_output=True,
            text=True,
        )
        # debugfs reports a missing file on stderr and still exits 0.
        if result.returncode != 0 or not partial.exists() or partial.stat().st_size == 0:
            raise LabError(f"{directory}: cannot read {source} from the VM's disk: {result.stderr}")
        partial.rename(target)


def supervise(directory: Path) -> int:
    """Boot the VM in ``directory`` from its own /boot until it stops otherwise than by a
    reboot (powered off, crashed, killed); returns qemu's last exit status."""
    boot = json.loads((directory / "boot.json").read_text())
    console = directory / "console.log"
    while True:
        extract_boot_files(directory, boot["kernel"])
        offset = console.stat().st_size if console.exists() else 0
        # -serial file: truncates; the log of every boot is kept by appending it here.
        status = subprocess.run(boot["argv"], stdin=subprocess.DEVNULL).returncode
        shown = console.read_bytes() if console.exists() else b""
        with (directory / "consoles.log").open("ab") as kept:
            kept.write(shown)
        if status != 0 or REBOOT_MARK not in shown[offset if offset <= len(shown) else 0 :]:
            return status
        print(f"lab VM {directory.name}: rebooting from its own /boot", flush=True)


if __name__ == "__main__":
    import sys as _sys

    if len(_sys.argv) == 3 and _sys.argv[1] == "supervise":
        raise SystemExit(supervise(Path(_sys.argv[2])))
    raise SystemExit("usage: python -m lab.vm supervise VM_DIRECTORY")

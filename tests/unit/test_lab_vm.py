"""The lab's VM tier (lab.vm) as far as it is decided here: names, addresses, the qemu command,
the image recipe, the per-VM files, the state; and `gpunode lab up --vms` refusing bad sizes
before anything is made. Booting is the integration tests' (test_vm.py)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from gpunode.cli import build_parser, main
from gpunode.expected.packages import PASSWORD_QUALITY_PACKAGE
from lab import Lab, _customize_script, debian_sources, hwsim
from lab import vm as lab_vm


def vms(lab: Lab, count: int = 2, drives: int = 4) -> list[lab_vm.LabVm]:
    return lab_vm._wanted(lab, count, ["pcie-a10g", "a100"], ["bookworm"], 1024, drives)


def test_vms_take_the_top_of_the_lab_network_with_their_own_taps_and_serials(
    tmp_path: Path,
) -> None:
    lab = Lab(state_dir=tmp_path, name="gpunode-x", subnet_index=7)
    other = Lab(state_dir=tmp_path, name="gpunode-y", subnet_index=8)
    first, second = vms(lab)
    assert (first.name, first.address, first.profile) == ("lab-vm-1", "10.213.7.231", "pcie-a10g")
    assert (second.address, second.profile) == ("10.213.7.232", "a100")
    assert first.container == "gpunode-x-vm-1"
    # Interface names are at most 15 characters, and each lab's are its own.
    assert all(len(vm.tap) <= 15 for vm in [*vms(lab, lab_vm.MAX_VMS), *vms(other)])
    assert first.tap != vms(other)[0].tap
    serials = [serial for vm in [first, second, *vms(other)] for serial in vm.nvme_serials]
    assert len(serials) == len(set(serials)) == 16
    # The NVMe limit on a serial is 20 characters.
    assert all(len(serial) <= 20 for serial in serials)


def test_the_qemu_command_boots_the_image_kernel_with_the_vm_s_address_and_drives(
    tmp_path: Path,
) -> None:
    lab = Lab(state_dir=tmp_path, name="gpunode-x", subnet_index=7)
    vm = vms(lab, 1, drives=3)[0]
    image = lab_vm.VmImage(tmp_path / "image", "bookworm")
    command = lab_vm.qemu_command(lab, vm, image, "tcg")
    options = dict(zip(command[1::2], command[2::2], strict=False))
    assert command[0] == "qemu-system-x86_64"
    # The VM's own kernel and initramfs, read from its disk before each boot (supervise).
    assert options["-kernel"] == str(lab_vm.vm_dir(lab, vm) / "vmlinuz")
    assert options["-initrd"] == str(lab_vm.vm_dir(lab, vm) / "initrd.img")
    assert "-no-reboot" in command
    assert options["-accel"].startswith("tcg,")
    assert options["-m"] == "1024"
    append = options["-append"].split()
    assert "root=/dev/vda" in append
    assert "ip=10.213.7.231::10.213.7.1:255.255.255.0:lab-vm-1:eth0:off" in append
    assert "systemd.hostname=lab-vm-1" in append
    assert "net.ifnames=0" in append  # eth0, as on the containers
    # An emulated CPU without the features that cost most under TCG, and no speculative
    # execution mitigations in a guest whose CPU is qemu's translator.
    assert options["-cpu"] == "qemu64"
    assert "mitigations=off" in append
    nvme = [word for word in command if word.startswith("nvme,serial=")]
    assert nvme == [
        f"nvme,serial={serial},drive=nvme{i}" for i, serial in enumerate(vm.nvme_serials)
    ]
    assert f"tap,id=net0,ifname={vm.tap},script=no,downscript=no" in command
    assert f"name={lab_vm.SEED_NAME},file={lab_vm.vm_dir(lab, vm) / 'seed.tar'}" in command
    # The base image is never written: each VM boots its own copy.
    (root,) = [word for word in command if word.startswith("file=") and "if=virtio" in word]
    assert root.startswith(f"file={lab_vm.vm_dir(lab, vm) / 'root.raw'},")
    assert str(image.root) not in " ".join(command)
    kvm = lab_vm.qemu_command(lab, vm, image, "kvm")
    assert dict(zip(kvm[1::2], kvm[2::2], strict=False))["-accel"] == "kvm"
    assert dict(zip(kvm[1::2], kvm[2::2], strict=False))["-cpu"] == "host"
    assert "mitigations=off" not in dict(zip(kvm[1::2], kvm[2::2], strict=False))["-append"]


def test_the_vm_image_keeps_the_real_nvme_cli_and_the_container_image_is_unchanged() -> None:
    script = lab_vm._vm_customize_script("bookworm")
    assert "--add /usr/bin/nvidia-smi" in script
    assert "--add /usr/sbin/ibstat" in script
    assert "/usr/sbin/nvme" not in script.split("gpunode-lab-vm-seed")[0]
    # The container image's recipe (and so its tag) is what it was.
    assert _customize_script("bookworm") == _customize_script("bookworm", hwsim.DIVERTED_PATHS)
    assert "--add /usr/sbin/nvme" in _customize_script("bookworm")
    assert {"linux-image-amd64", "mdadm", "nvme-cli", "openssh-server", "systemd"} <= set(
        lab_vm.VM_PACKAGES
    )
    assert lab_vm.image_name("bookworm").startswith("debian12-")
    # What the test suite's converges install from Debian is in the image already.
    assert {"xfsprogs", PASSWORD_QUALITY_PACKAGE, "nftables"} <= set(lab_vm.VM_PACKAGES)
    assert lab_vm.image_name("trixie").startswith("debian13-")


@pytest.mark.parametrize("release", ["bookworm", "trixie"])
def test_the_vm_image_is_built_from_the_release_its_updates_and_its_security_archive(
    release: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = lab_vm.image_sources(release)
    # One sources.list line per suite its apt sources name (lab.debian_sources): what a
    # fresh VM's apt would upgrade is in the image already (lynis PKGS-7392).
    assert [line.split()[1:3] for line in sources] == [
        ["http://deb.debian.org/debian", release],
        ["http://deb.debian.org/debian", f"{release}-updates"],
        ["http://deb.debian.org/debian-security", f"{release}-security"],
    ]
    for line in sources:
        assert line.startswith("deb ")
        assert line.split()[3:] == ["main", "contrib", "non-free", "non-free-firmware"]
    apt_suites = [
        suite
        for line in debian_sources(release).splitlines()
        if line.startswith("Suites:")
        for suite in line.split()[1:]
    ]
    assert [line.split()[2] for line in sources] == apt_suites
    # The archives are part of the recipe: an image built from other suites is another image
    # (so a cached image of the release alone is built again, once).
    name = lab_vm.image_name(release)
    monkeypatch.setattr(lab_vm, "image_sources", lambda _release: sources[:1])
    assert lab_vm.image_name(release) != name


def test_the_vm_image_has_a_small_initramfs_and_masks_units_a_lab_vm_does_not_want() -> None:
    script = lab_vm._vm_customize_script("bookworm")
    conf = script.split("gpunode-lab-vm.conf\" <<'CONF'\n", 1)[1].split("CONF\n", 1)[0]
    assert conf.splitlines() == ["MODULES=list", "COMPRESS=zstd", "COMPRESSLEVEL=1", "RESUME=none"]
    # The root disk's driver and filesystem; the rest the hooks add (mdadm's md and raid).
    assert "printf '%s\\n' virtio_pci virtio_blk ext4 >> \"$1/etc/initramfs-tools/modules\"" in (
        script
    )
    # Made again after the list: the image's own initramfs is the small one.
    assert script.index("update-initramfs -u -k all") > script.index("initramfs-tools/modules")
    # Masked: apt's daily timers as in every lab image (lab.APT_TIMERS), then the VM's own.
    masks = [line.split()[4:] for line in script.splitlines() if "systemctl mask" in line]
    assert masks[0] == ["apt-daily.timer", "apt-daily-upgrade.timer"]
    assert _customize_script("bookworm").count("systemctl mask") == 1
    assert f'chroot "$1" systemctl mask {" ".join(masks[0])}' in _customize_script("trixie")
    assert {unit for mask in masks for unit in mask} == {
        "e2scrub_reap.service", "e2scrub_all.timer", "nvmf-autoconnect.service",
        "nvmefc-boot-connections.service", "apt-daily.timer", "apt-daily-upgrade.timer",
        "dpkg-db-backup.timer", "fstrim.timer",
    }  # fmt: skip
    # The units the VM needs are still enabled.
    assert "systemctl enable gpunode-lab-vm-seed.service" in script
    assert "systemctl enable systemd-networkd.service" in script


def test_a_vm_gets_the_doubles_of_its_profile_but_its_own_nvme_and_kernel_modules() -> None:
    container = hwsim.node_files("a100", "lab-1")
    vm = hwsim.node_files("a100", "lab-vm-1", vm=True)
    assert "/usr/sbin/nvme" in container
    assert "/usr/sbin/nvme" not in vm
    assert not [path for path in vm if path.startswith("/lib/modules/")]
    vm_boot = {f"/etc/systemd/system/{hwsim.VM_BOOT_UNIT}", hwsim.VM_BOOT_DROP_IN}
    # A VM's firmware is qemu's: the simulated UEFI firmware is a container's alone.
    firmware = {
        f"/etc/systemd/system/{hwsim.firmware.UNIT}",
        hwsim.firmware.DPKG_HOOK,
        hwsim.firmware.MOKUTIL_WRAPPER_SOURCE,
    }
    assert firmware <= set(container) and not firmware & set(vm)
    assert (
        set(vm) - vm_boot
        == {path for path in container if path != "/usr/sbin/nvme"}
        - {path for path in container if path.startswith("/lib/modules/")}
        - firmware
    )
    assert vm["/usr/bin/nvidia-smi"] == container["/usr/bin/nvidia-smi"]
    # A VM reboots for real: each boot does what the lab's reboot command does to the GPUs
    # (the installed stand-in driver is loaded), before the units that set the GPUs up.
    assert not vm_boot & set(container)
    unit = vm[f"/etc/systemd/system/{hwsim.VM_BOOT_UNIT}"][0].decode()
    assert "ExecStart=/usr/local/sbin/gpunode-lab-hw reboot\n" in unit
    assert "Before=sysinit.target gpunode-gpu-settings.service slurmd.service" in unit
    drop_in = vm[hwsim.VM_BOOT_DROP_IN][0].decode()
    assert hwsim.VM_BOOT_DROP_IN.startswith("/etc/systemd/system/sysinit.target.d/")
    assert drop_in == f"[Unit]\nWants={hwsim.VM_BOOT_UNIT}\n"


def test_the_seed_script_adds_the_nvidia_line_to_modules_dep_and_replaces_nothing() -> None:
    script = lab_vm.SEED_SCRIPT
    assert "grep -q '/nvidia.ko:' \"$dep\" || echo 'updates/dkms/nvidia.ko:' >> \"$dep\"" in script
    assert '> "$dep"' not in script.replace('>> "$dep"', "")
    assert f"ConditionPathExists=!{lab_vm.SEEDED_MARK}" in lab_vm.SEED_UNIT
    assert f"touch {lab_vm.SEEDED_MARK}" in script


def test_known_hosts_names_containers_and_vms_and_the_state_reads_back(tmp_path: Path) -> None:
    lab = Lab(state_dir=tmp_path, name="gpunode-x", subnet_index=7)
    vm = vms(lab, 1)[0]
    vm.host_key = "ssh-ed25519 AAAAvm"
    lab_vm.vms_path(lab).write_text(json.dumps([asdict(vm)]))
    lab.nodes_path.write_text(
        json.dumps([{"name": "lab-1", "container": "c", "address": "10.213.7.11",
                     "profile": "a100", "host_key": "ssh-ed25519 AAAAnode"}])
    )  # fmt: skip
    lab.write_known_hosts()
    assert lab.known_hosts_path.read_text().splitlines() == [
        "10.213.7.11 ssh-ed25519 AAAAnode",
        "10.213.7.231 ssh-ed25519 AAAAvm",
    ]
    (loaded,) = lab.vms()
    assert loaded == vm
    assert [node.name for node in lab.nodes()] == ["lab-1"]
    # A qemu that is not running (no such process) is not taken for the VM.
    assert not lab_vm.qemu_running(loaded)


def test_the_lab_inventory_lists_vms_in_their_own_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpunode.cli import load_inventory

    monkeypatch.setenv("GPUNODE_LAB_DIR", str(tmp_path))
    monkeypatch.setenv("GPUNODE_LAB_NAME", "gpunode-x")
    monkeypatch.setenv("GPUNODE_LAB_SUBNET", "7")
    lab = Lab()
    vm, tests_own = vms(lab, 2)
    # The test suite's VM (lab up --vms-unlisted) is reached by its tests' inventories alone.
    tests_own.listed = False
    lab_vm.vms_path(lab).write_text(json.dumps([asdict(vm), asdict(tests_own)]))
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    inventory = load_inventory("inventories/lab.py")
    (host,) = list(inventory)
    assert host.name == "lab-vm-1"
    assert "vms" in host.groups
    assert not {"h100_nodes", "a100_nodes", "pcie_nodes", "bookworm", "trixie"} & set(host.groups)
    assert host.data.ssh_hostname == "10.213.7.231"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--vms", "21"], "--vms 21: choose between 0 and 20"),
        (["--vms", "1", "--vm-nvme-drives", "9"], "9 NVMe drives of 1024 MiB"),
        (["--vms", "1", "--vm-nvme-mib", "100"], "4 NVMe drives of 100 MiB"),
        (["--vms", "1", "--vm-memory-mib", "256"], "and 256 MiB of memory asked"),
        (["--vms", "1", "--vm-profiles", "dgx-x"], "unknown hardware profile(s) ['dgx-x']"),
        (["--vms", "1", "--release", "sid"], "--release 'sid': unknown release ['sid']"),
    ],
)
def test_bad_vm_sizes_are_refused_before_anything_is_made(
    args: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state_dir = tmp_path / "lab"
    monkeypatch.setenv("GPUNODE_LAB_DIR", str(state_dir))
    monkeypatch.setenv("GPUNODE_LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # any use would fail
    assert main(["lab", "up", "--nodes", "0", *args]) == 2
    assert message in capsys.readouterr().err
    assert not state_dir.exists()
    assert not (tmp_path / "cache").exists()


def test_vms_are_opt_in_and_nodes_zero_means_vms_only() -> None:
    args = build_parser().parse_args(["lab", "up"])
    assert (args.nodes, args.vms) == (2, None)
    args = build_parser().parse_args(["lab", "up", "--nodes", "0", "--vms", "1"])
    assert (args.nodes, args.vms, args.vm_nvme_drives, args.vm_memory_mib) == (0, 1, 4, 1024)
    assert not args.vms_unlisted
    args = build_parser().parse_args(["lab", "up", "--nodes", "0", "--vms", "1", "--vms-unlisted"])
    assert args.vms_unlisted


def test_the_lab_inventory_with_only_unlisted_vms_has_no_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpunode.cli import load_inventory
    from gpunode.control.exits import ConfigurationError

    monkeypatch.setenv("GPUNODE_LAB_DIR", str(tmp_path))
    lab = Lab()
    (vm,) = vms(lab, 1)
    vm.listed = False
    lab_vm.vms_path(lab).write_text(json.dumps([asdict(vm)]))
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    with pytest.raises(ConfigurationError, match="no lab nodes"):
        load_inventory("inventories/lab.py")


def test_without_dev_kvm_the_vms_run_under_tcg_without_a_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUNODE_LAB_VM_ACCEL", raising=False)
    monkeypatch.setenv("GPUNODE_LAB_CACHE", str(tmp_path))
    monkeypatch.setattr(lab_vm, "KVM_DEVICE", tmp_path / "no-kvm")
    # No probe: nothing asks qemu (the probe's verdict is keyed by its version).
    monkeypatch.setattr(lab_vm.subprocess, "run", None)
    assert lab_vm._known_accel() == "tcg"
    # Where the device opens, the verdict is the probe's (none yet here).
    (tmp_path / "kvm").write_bytes(b"")
    monkeypatch.setattr(lab_vm, "KVM_DEVICE", tmp_path / "kvm")
    monkeypatch.setattr(lab_vm, "_accel_key", lambda: "this kernel, this qemu")
    assert lab_vm._known_accel() is None
    lab_vm._record_accel("tcg")
    assert lab_vm._known_accel() == "tcg"


def test_the_lab_state_is_changed_by_one_process_at_a_time(tmp_path: Path) -> None:
    from lab import state_lock

    try_lock = (
        "import fcntl, sys; f = open(sys.argv[1], 'a')\n"
        "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "except BlockingIOError:\n    sys.exit(3)\n"
    )

    def another_process_locks() -> bool:
        command = [sys.executable, "-c", try_lock, str(tmp_path / ".lock")]
        return subprocess.run(command, check=False).returncode == 0

    with state_lock(tmp_path):
        # Re-entrant here: Lab.down takes it, and so does lab.vm.down_vms within it.
        with state_lock(tmp_path):
            assert not another_process_locks()
        assert not another_process_locks()
    assert another_process_locks()


def test_accel_can_be_forced_and_a_bad_choice_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUNODE_LAB_VM_ACCEL", "tcg")
    assert lab_vm._known_accel() == "tcg"
    monkeypatch.setenv("GPUNODE_LAB_VM_ACCEL", "xen")
    with pytest.raises(lab_vm.LabError, match=shlex.quote("xen")):
        lab_vm._known_accel()


def test_the_boot_files_are_read_from_the_vm_s_own_disk(tmp_path: Path) -> None:
    # A real ext4 image, made as the VM image is (mkfs.ext4 -d), with a /boot of its own.
    tree = tmp_path / "tree"
    (tree / "boot").mkdir(parents=True)
    (tree / "boot" / "vmlinuz-6.1.0-9-amd64").write_bytes(b"kernel")
    (tree / "boot" / "initrd.img-6.1.0-9-amd64").write_bytes(b"updated initramfs")
    directory = tmp_path / "vm"
    directory.mkdir()
    subprocess.run(
        ["mkfs.ext4", "-q", "-d", str(tree), str(directory / "root.raw"), "8M"], check=True
    )
    lab_vm.extract_boot_files(directory, "6.1.0-9-amd64")
    assert (directory / "vmlinuz").read_bytes() == b"kernel"
    assert (directory / "initrd.img").read_bytes() == b"updated initramfs"
    # A kernel release the disk lacks is an error, not an empty kernel.
    with pytest.raises(
        lab_vm.LabError, match=re.escape("cannot read /boot/vmlinuz-6.1.0-10-amd64")
    ):
        lab_vm.extract_boot_files(directory, "6.1.0-10-amd64")
    assert (directory / "vmlinuz").read_bytes() == b"kernel"


def test_a_supervisor_is_told_by_its_command_line(tmp_path: Path) -> None:
    directory = str(tmp_path / "vms" / "lab-vm-1")
    argv = [b"/usr/bin/python3", b"-m", b"lab.vm", b"supervise", directory.encode(), b""]
    assert lab_vm._is_supervisor(argv, directory)
    assert not lab_vm._is_supervisor(argv, directory + "0")
    assert not lab_vm._is_supervisor([b"sleep", b"60", b""], directory)


def test_orphans_are_this_lab_s_supervisors_but_not_the_kept_ones(tmp_path: Path) -> None:
    lab = Lab(state_dir=tmp_path, name="gpunode-x", subnet_index=7)
    directory = str(lab_vm.vms_path(lab).parent / "vms" / "lab-vm-1")
    # A process with a supervisor's command line (sh names its arguments $0 and $1).
    process = subprocess.Popen(
        ["sh", "-c", "sleep 30", "supervise", directory], start_new_session=True
    )
    try:
        for _ in range(50):
            if process.pid in lab_vm._orphans(lab):
                break
            time.sleep(0.1)
        assert process.pid in lab_vm._orphans(lab)
        assert process.pid not in lab_vm._orphans(lab, kept={process.pid})
        other = Lab(state_dir=tmp_path / "other", name="gpunode-y", subnet_index=8)
        assert process.pid not in lab_vm._orphans(other)
    finally:
        process.kill()
        process.wait()

"""deploys/fabric.py on lab nodes: NCCL settings, InfiniBand/RDMA, the NVMe cache.

Each node gets three scratch disks (``Lab.attach_scratch_disks``: host loop devices handed to
the node as /dev/nvme0n1..2, the paths its simulated ``nvme list`` reports). The module starts
from blank disks and no gpunode fabric files, converges, reruns with zero changes, then proves
the same run converges the other node while each refusal fails its node alone with nothing
changed on it: an interface or HCA the node lacks, a disk that holds data (a
filesystem, a partition table), a missing disk, several disks where the kernel has no md
driver (the lab's kernel has none, so RAID0 itself is covered by the unit tests only). It ends
with the nodes converged to the base data again.

What a container cannot do is reported, never silently skipped: loading kernel modules,
raising the memlock hard limit (no CAP_SYS_RESOURCE), starting opensm (no HCA) and
cachefilesd (no cachefiles module).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpunode.probe.parsers import SECTION_COMMANDS, parse_section
from lab import Lab, LabNode
from roles.nvme_cache import FILESYSTEM_LABEL

from .conftest import ROOT, PyinfraRun, run_pyinfra, ssh, write_inventory

pytestmark = pytest.mark.lab

DEPLOY = "deploys/fabric.py"
SCRATCH_DISKS = 3
MANAGED_FILES = (
    "/etc/nccl.conf",
    "/etc/profile.d/gpunode-nccl.sh",
    "/etc/modules-load.d/gpunode-rdma.conf",
    "/etc/security/limits.d/gpunode-rdma.conf",
    "/etc/network/interfaces.d/gpunode-ipoib-ib0",
    "/etc/cachefilesd.conf",
)
CACHE_OPERATION = "NVMe cache | Cache filesystem on the chosen drives"
# lab-2 (a100 profile) simulates four drives; the scratch disks back three of them.
HIDDEN_DRIVES = (1, 2, 3)


def sudo(lab: Lab, node: LabNode, command: str) -> str:
    result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def base_data(node: LabNode) -> dict[str, Any]:
    """lab-1: named drive, xfs, cachefilesd, IPoIB, subnet manager, a GPU node.
    lab-2: drive chosen by model, ext4 elsewhere, no subnet manager, no GPU declared."""
    if node.name == "lab-1":
        return {
            "nccl": {
                "env": {
                    "NCCL_SOCKET_IFNAME": "^docker,lo",
                    "NCCL_IB_HCA": "mlx5_0:1,mlx5_1",
                    "NCCL_IB_GID_INDEX": "3",
                    "NCCL_IB_DISABLE": "0",
                    "NCCL_DEBUG": "WARN",
                }
            },
            "infiniband": {
                "enabled": True,
                "subnet_manager": True,
                "ipoib": [{"name": "ib0", "address": "10.77.0.11/24", "mtu": 2044}],
            },
            "expected_hardware": {"gpu_count": 8, "ib_port_count": 8},
            "nvme_cache": {"enabled": True, "devices": ["/dev/nvme0n1"], "cachefilesd": True},
        }
    return {
        "nccl": {"env": {"NCCL_SOCKET_IFNAME": "=eth0", "NCCL_IB_HCA": "=mlx5_3"}},
        "infiniband": {"enabled": True},
        "nvme_cache": {
            "enabled": True,
            "match_model": "MZWLJ",
            "min_size_gb": 1,
            "filesystem": "ext4",
            "mount_point": "/scratch",
        },
    }


def inventory(
    tmp_path: Path, lab: Lab, nodes: list[LabNode], **changes: dict[str, dict[str, Any]]
) -> str:
    """The base data with per-node section changes: ``lab_1={"nvme_cache": {...}}``."""
    data = {}
    for node in nodes:
        node_data = base_data(node)
        for section, values in changes.get(node.name.replace("-", "_"), {}).items():
            node_data[section] = {**node_data.get(section, {}), **values}
        data[node.name] = node_data
    return write_inventory(tmp_path / "fabric.py", lab, nodes, data)


def fingerprint(lab: Lab, node: LabNode) -> str:
    """Everything a fabric run could change, as text: files, fstab, mounts, disk signatures."""
    return sudo(
        lab,
        node,
        f"cat {' '.join(MANAGED_FILES)} /etc/fstab 2>&1; findmnt -rn -o TARGET,SOURCE; "
        + "; ".join(f"wipefs -n /dev/nvme{i}n1" for i in range(SCRATCH_DISKS)),
    )


def noops(run: PyinfraRun, node: LabNode) -> list[str]:
    return re.findall(rf"\[{re.escape(node.name)}\] noop: (.*)", run.output)


def reset_node(lab: Lab, node: LabNode) -> None:
    """Blank scratch disks, no cache mounts or fstab entries, no gpunode fabric files."""
    cleanup = [
        "for m in /raid /scratch /cache2; do umount $m 2>/dev/null || true; done",
        "sed -i -E '\\#[[:space:]]/(raid|scratch|cache2)[[:space:]]#d' /etc/fstab",
        "ip link del ib0 2>/dev/null || true",
        f"rm -f {' '.join(MANAGED_FILES)}",
        *(f"wipefs --all --quiet /dev/nvme{i}n1" for i in range(SCRATCH_DISKS)),
    ]
    sudo(lab, node, "; ".join(cleanup))


@pytest.fixture(scope="module")
def fabric_nodes(lab: Lab, lab_nodes: list[LabNode]) -> Any:
    nodes = lab_nodes[:2]
    assert [node.name for node in nodes] == ["lab-1", "lab-2"]
    for node in nodes:
        paths = lab.attach_scratch_disks(node, SCRATCH_DISKS)
        assert paths == [f"/dev/nvme{i}n1" for i in range(SCRATCH_DISKS)]
        reset_node(lab, node)
    lab_2 = nodes[1]
    for index in HIDDEN_DRIVES:  # so that match_model selects exactly one drive on lab-2
        sudo(lab, lab_2, f"gpunode-lab-hw set nvme.{index}.present false")
    # lab-1 gets an interface named ib0 (one end of a veth pair; the lab's kernel has no dummy
    # driver) so that its IPoIB configuration is applied to a live interface.
    sudo(lab, nodes[0], "ip link add ib0 type veth peer name veth-ib0 && ip link set veth-ib0 up")
    yield nodes
    for index in HIDDEN_DRIVES:
        sudo(lab, lab_2, f"gpunode-lab-hw set nvme.{index}.present true")


@pytest.fixture(scope="module")
def base_inventory(
    lab: Lab, fabric_nodes: list[LabNode], tmp_path_factory: pytest.TempPathFactory
) -> str:
    return inventory(tmp_path_factory.mktemp("fabric-base"), lab, fabric_nodes)


def predicted(dry: PyinfraRun) -> set[tuple[str, str]]:
    """(operation, host) pairs a --dry run says will change."""
    assert dry.returncode == 0, dry.output
    assert dry.results is not None, dry.output
    return {
        (op["name"], host)
        for op in dry.results["plan"]
        for host in op["hosts_with_change"] + op["hosts_with_conditional_change"]
    }


def changed(run: PyinfraRun) -> set[tuple[str, str]]:
    return {(name, host) for name, hosts in run.changed_operations().items() for host in hosts}


@pytest.fixture(scope="module")
def dry_first(base_inventory: str) -> PyinfraRun:
    return run_pyinfra(DEPLOY, "--dry", inventory=base_inventory)


@pytest.fixture(scope="module")
def first_run(dry_first: PyinfraRun, base_inventory: str) -> PyinfraRun:
    run = run_pyinfra("-v", DEPLOY, inventory=base_inventory)
    assert run.returncode == 0, run.output
    return run


@pytest.fixture(scope="module")
def second_run(first_run: PyinfraRun, base_inventory: str) -> PyinfraRun:
    run = run_pyinfra("-v", DEPLOY, inventory=base_inventory)
    assert run.returncode == 0, run.output
    return run


# --- converge ------------------------------------------------------------------------------


def test_first_run_builds_the_cache_on_both_nodes(first_run: PyinfraRun) -> None:
    changed = first_run.changed_operations()
    assert sorted(changed[CACHE_OPERATION]) == ["lab-1", "lab-2"]
    assert sorted(changed["NCCL | NCCL settings in /etc/nccl.conf"]) == ["lab-1", "lab-2"]


def test_rerun_changes_nothing(second_run: PyinfraRun) -> None:
    assert second_run.changed_operations() == {}


def test_dry_run_on_blank_nodes_predicted_the_first_run(
    dry_first: PyinfraRun, first_run: PyinfraRun
) -> None:
    assert predicted(dry_first) == changed(first_run)


def test_dry_run_of_the_converged_nodes_predicts_no_change(
    second_run: PyinfraRun, base_inventory: str
) -> None:
    assert predicted(run_pyinfra(DEPLOY, "--dry", inventory=base_inventory)) == set()


FABRIC_FINDINGS = ("nccl.", "nvme_cache.", "mounts.", "shared_data.")


def fabric_drift(inventory_path: str) -> tuple[int, dict[tuple[str, str], str]]:
    """`gpunode drift --json` exit code and its NCCL and cache findings: (host, id) -> severity."""
    result = subprocess.run(
        [str(Path(sys.executable).with_name("gpunode")), "drift", inventory_path, "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    report = json.loads(result.stdout)
    assert report["unreachable"] == {}, report["unreachable"]
    found = {
        (finding["host"], finding["id"]): finding["severity"]
        for finding in report["findings"]
        if finding["id"].startswith(FABRIC_FINDINGS)
    }
    return result.returncode, found


def test_drift_check_sees_nccl_settings_and_the_cache_mount(
    lab: Lab, fabric_nodes: list[LabNode], second_run: PyinfraRun, base_inventory: str
) -> None:
    assert fabric_drift(base_inventory)[1] == {}
    lab_1, lab_2 = fabric_nodes
    sudo(lab, lab_1, "sed -i s/^NCCL_DEBUG=WARN/NCCL_DEBUG=INFO/ /etc/nccl.conf")
    sudo(lab, lab_1, "echo 'export NCCL_P2P_DISABLE=1' >> /etc/profile.d/gpunode-nccl.sh")
    sudo(lab, lab_2, "umount /scratch")
    code, found = fabric_drift(base_inventory)
    assert found == {
        ("lab-1", "nccl.conf:NCCL_DEBUG"): "warning",
        ("lab-1", "nccl.profile:NCCL_P2P_DISABLE"): "warning",
        ("lab-2", "nvme_cache.mount"): "critical",
    }
    assert code == 1
    repair = run_pyinfra(DEPLOY, inventory=base_inventory)
    assert repair.returncode == 0, repair.output
    assert fabric_drift(base_inventory)[1] == {}
    assert sudo(lab, lab_2, "findmnt -n -o FSTYPE /scratch").strip() == "ext4"


def test_nccl_settings_in_file_and_login_environment(
    lab: Lab, fabric_nodes: list[LabNode], first_run: PyinfraRun
) -> None:
    for node in fabric_nodes:
        env = base_data(node)["nccl"]["env"]
        conf = sudo(lab, node, "cat /etc/nccl.conf").splitlines()
        assert conf[1:] == [f"{name}={env[name]}" for name in sorted(env)]
        # A fresh login shell exports the same values.
        names = " ".join(f"{name}=${name}" for name in sorted(env))
        shown = ssh(lab, node, f"bash -lc {shlex.quote(f'echo {names}')}").stdout.split()
        assert shown == [f"{name}={env[name]}" for name in sorted(env)]
    assert "NCCL_SOCKET_IFNAME=^docker,lo selects: eth0, ib0, veth-ib0" in noops(
        first_run, fabric_nodes[0]
    )
    assert "NCCL_IB_HCA==mlx5_3 selects: mlx5_3" in noops(first_run, fabric_nodes[1])


def test_rdma_user_space_installed_and_ibstat_still_feeds_the_drift_check(
    lab: Lab, fabric_nodes: list[LabNode], first_run: PyinfraRun
) -> None:
    for node in fabric_nodes:
        installed = sudo(
            lab, node, "dpkg-query -W -f='${Status}\\n' rdma-core infiniband-diags ibverbs-utils"
        )
        assert installed.splitlines() == ["install ok installed"] * 3
        # The drift check's InfinibandPorts fact reads the same ports as before the install.
        output = sudo(lab, node, SECTION_COMMANDS["ibstat"]).splitlines()
        ports = parse_section("ibstat", output)
        state = json.loads(sudo(lab, node, "gpunode-lab-hw show ib_ports"))
        assert ports["state"] == "ok", ports
        assert [(p["ca"], p["port"]) for p in ports["ports"]] == sorted(
            (p["ca"], p["port"]) for p in state
        )


def test_modules_configured_for_boot_and_each_unloadable_one_reported(
    lab: Lab, fabric_nodes: list[LabNode], first_run: PyinfraRun
) -> None:
    expected = {
        "lab-1": ["ib_umad", "ib_ipoib", "nvidia_peermem"],
        "lab-2": ["ib_umad", "ib_ipoib"],
    }
    for node in fabric_nodes:
        listed = sudo(lab, node, "cat /etc/modules-load.d/gpunode-rdma.conf").splitlines()[1:]
        assert listed == expected[node.name]
        reported = [n for n in noops(first_run, node) if n.startswith("kernel module ")]
        assert reported == [
            f"kernel module {module} not loaded: this is a docker container, which cannot load "
            "kernel modules (the host's kernel must have it loaded); "
            "/etc/modules-load.d/gpunode-rdma.conf loads it at boot on a real node"
            for module in expected[node.name]
        ]


def test_memlock_limit_written_and_what_logins_get_reported_truthfully(
    lab: Lab, fabric_nodes: list[LabNode], first_run: PyinfraRun
) -> None:
    for node in fabric_nodes:
        limits = sudo(lab, node, "cat /etc/security/limits.d/gpunode-rdma.conf").splitlines()
        assert limits[1:] == ["* soft memlock unlimited", "* hard memlock unlimited"]
        # A brand-new login: pam_limits read the file; what it could grant is what was said.
        granted = ssh(lab, node, "ulimit -H -l").stdout.strip()
        note = next(n for n in noops(first_run, node) if n.startswith("memlock"))
        if granted == "unlimited":
            assert note.startswith("memlock unlimited from the next login"), note
        else:
            assert note.startswith(f"memlock stays at {granted} KiB for logins: root lacks"), note


def test_ipoib_configured_with_ifupdown_and_applied_where_the_interface_exists(
    lab: Lab, fabric_nodes: list[LabNode], second_run: PyinfraRun
) -> None:
    lab_1, lab_2 = fabric_nodes
    stanza = sudo(lab, lab_1, "cat /etc/network/interfaces.d/gpunode-ipoib-ib0").splitlines()
    assert stanza[1:] == ["auto ib0", "iface ib0 inet static", "    address 10.77.0.11/24",
                          "    mtu 2044"]  # fmt: skip
    assert "source /etc/network/interfaces.d/*" in sudo(lab, lab_1, "cat /etc/network/interfaces")
    live = json.loads(sudo(lab, lab_1, "ip -json address show dev ib0"))[0]
    assert live["mtu"] == 2044
    assert "10.77.0.11" in [info["local"] for info in live["addr_info"]]
    assert "ib0 is up with 10.77.0.11/24, MTU 2044" in noops(second_run, lab_1)
    assert sudo(lab, lab_2, "ls /etc/network/interfaces.d 2>/dev/null || true").strip() == ""


def test_subnet_manager_only_where_asked_and_why_it_is_not_running(
    lab: Lab, fabric_nodes: list[LabNode], first_run: PyinfraRun
) -> None:
    lab_1, lab_2 = fabric_nodes
    assert sudo(lab, lab_1, "systemctl is-enabled opensm").strip() == "enabled"
    assert any(
        n.startswith("opensm is enabled but not started: /sys/class/infiniband_mad/abi_version")
        for n in noops(first_run, lab_1)
    )
    assert ssh(lab, lab_2, "dpkg-query -W opensm").returncode != 0
    assert "opensm is not installed" in noops(first_run, lab_2)


def test_cache_mounted_by_uuid_from_fstab_with_boot_options(
    lab: Lab, fabric_nodes: list[LabNode], first_run: PyinfraRun
) -> None:
    expected = {"lab-1": ("/raid", "xfs", "0"), "lab-2": ("/scratch", "ext4", "2")}
    for node in fabric_nodes:
        mount_point, filesystem, passno = expected[node.name]
        uuid = sudo(lab, node, "blkid -p -s UUID -o value /dev/nvme0n1").strip()
        label = sudo(lab, node, "blkid -p -s LABEL -o value /dev/nvme0n1").strip()
        assert label == FILESYSTEM_LABEL
        entries = [
            line.split()
            for line in sudo(lab, node, "cat /etc/fstab").splitlines()
            if len(line.split()) > 1 and line.split()[1] == mount_point
        ]
        assert entries == [
            [f"UUID={uuid}", mount_point, filesystem,
             "defaults,noatime,nofail,x-systemd.device-timeout=30s", "0", passno]
        ]  # fmt: skip
        found = json.loads(sudo(lab, node, f"findmnt -J -o SOURCE,FSTYPE,OPTIONS {mount_point}"))
        mounted = found["filesystems"][0]
        assert (mounted["source"], mounted["fstype"]) == ("/dev/nvme0n1", filesystem)
        assert "noatime" in mounted["options"].split(",")
        # The entry alone brings it back: unmounted, `mount -a` finds the device by UUID.
        sudo(lab, node, f"umount {mount_point} && mount -a && findmnt {mount_point}")
        # The other scratch disks were not touched.
        assert sudo(lab, node, "wipefs -n /dev/nvme1n1 /dev/nvme2n1").strip() == ""


def test_cachefilesd_keeps_its_cache_on_the_nvme_cache(
    lab: Lab, fabric_nodes: list[LabNode], first_run: PyinfraRun
) -> None:
    lab_1 = fabric_nodes[0]
    conf = sudo(lab, lab_1, "cat /etc/cachefilesd.conf").splitlines()
    assert conf[1:3] == ["dir /raid/fscache", "tag gpunode"]
    assert "RUN=yes" in sudo(lab, lab_1, "cat /etc/default/cachefilesd").splitlines()
    on_cache = sudo(lab, lab_1, "stat -c %d:%U:%a /raid/fscache; stat -c %d /raid").split()
    assert on_cache[0].split(":")[1:] == ["root", "700"]
    assert on_cache[0].split(":")[0] == on_cache[1]  # the directory is on the cache filesystem
    assert (
        "cachefilesd configured (RUN=yes) but not started: /dev/cachefiles is absent and this "
        "docker container cannot load the cachefiles module"
    ) in noops(first_run, lab_1)


# --- refusals ------------------------------------------------------------------------------


def refused(
    lab: Lab, nodes: list[LabNode], tmp_path: Path, **changes: dict[str, dict[str, Any]]
) -> str:
    """Run with changed data for some nodes: those fail with nothing changed on them, and the
    same run converges the others, drifted first (their /etc/nccl.conf removed)."""
    refused_names = sorted(name.replace("_", "-") for name in changes)
    others = [node for node in nodes if node.name not in refused_names]
    before = {node.name: fingerprint(lab, node) for node in nodes}
    for node in others:
        sudo(lab, node, "rm /etc/nccl.conf")
        assert fingerprint(lab, node) != before[node.name]
    run = run_pyinfra(DEPLOY, inventory=inventory(tmp_path, lab, nodes, **changes))
    assert run.returncode == 1, run.output
    assert {node.name: fingerprint(lab, node) for node in nodes} == before
    assert "Nothing was changed." in run.output
    assert (
        f"gpunode: {len(refused_names)} of {len(nodes)} host{'s' if len(nodes) != 1 else ''} "
        "failed: "
        + "; ".join(f"{name} (refused before any change)" for name in refused_names)
        + f". Re-run them with --limit {','.join(refused_names)}"
    ) in run.output
    return run.output


def test_unknown_interface_is_refused_before_any_change(
    lab: Lab, fabric_nodes: list[LabNode], second_run: PyinfraRun, tmp_path: Path
) -> None:
    output = refused(
        lab, fabric_nodes, tmp_path, lab_2={"nccl": {"env": {"NCCL_SOCKET_IFNAME": "=eth0,ib7"}}}
    )
    assert (
        "lab-2: nccl.env.NCCL_SOCKET_IFNAME = '=eth0,ib7': 'ib7' matches no network interface "
        "exactly; the node has: eth0, lo"
    ) in output


def test_unknown_hca_is_refused_before_any_change(
    lab: Lab, fabric_nodes: list[LabNode], second_run: PyinfraRun, tmp_path: Path
) -> None:
    output = refused(
        lab, fabric_nodes, tmp_path, lab_1={"nccl": {"env": {"NCCL_IB_HCA": "mlx5_0,mlx4_0"}}}
    )
    assert "lab-1: nccl.env.NCCL_IB_HCA = 'mlx5_0,mlx4_0': 'mlx4_0' matches no HCA as a prefix" in (
        output
    )
    assert "the node has: mlx5_0 (ports 1), mlx5_1 (ports 1)" in output


def serial(lab: Lab, node: LabNode, index: int) -> str:
    return str(json.loads(sudo(lab, node, f"gpunode-lab-hw show nvme.{index}.serial")))


def test_disk_with_a_filesystem_is_refused_unless_its_serial_allows_wiping(
    lab: Lab, fabric_nodes: list[LabNode], second_run: PyinfraRun, tmp_path: Path
) -> None:
    lab_1 = fabric_nodes[0]
    sudo(lab, lab_1, "mkfs.ext4 -q -L precious /dev/nvme1n1")
    uuid = sudo(lab, lab_1, "blkid -p -s UUID -o value /dev/nvme1n1").strip()
    disk = serial(lab, lab_1, 1)
    cache2 = {"devices": ["/dev/nvme1n1"], "mount_point": "/cache2", "cachefilesd": False}
    try:
        output = refused(lab, fabric_nodes, tmp_path, lab_1={"nvme_cache": cache2})
        assert (
            f"lab-1: nvme_cache: /dev/nvme1n1 (serial {disk}) carries ext4 filesystem (UUID "
            f"{uuid}); refusing to destroy data: list serial {disk} in "
            "nvme_cache.wipe_allowed_serials to allow wiping it"
        ) in output

        # Allowing another serial changes nothing either.
        other = serial(lab, lab_1, 2)
        refused(
            lab, fabric_nodes, tmp_path,
            lab_1={"nvme_cache": {**cache2, "wipe_allowed_serials": [other]}},
        )  # fmt: skip

        allowed = {**cache2, "wipe_allowed_serials": [disk]}
        path = inventory(tmp_path, lab, fabric_nodes, lab_1={"nvme_cache": allowed})
        run = run_pyinfra(DEPLOY, inventory=path)
        assert run.returncode == 0, run.output
        assert sudo(lab, lab_1, "blkid -p -s TYPE -o value /dev/nvme1n1").strip() == "xfs"
        assert sudo(lab, lab_1, "findmnt -n -o SOURCE /cache2").strip() == "/dev/nvme1n1"
        # Now it is gpunode's cache, not data: the same data converges with no change.
        assert run_pyinfra(DEPLOY, inventory=path).changed_operations() == {}
    finally:
        sudo(
            lab, lab_1,
            "umount /cache2 2>/dev/null; sed -i '\\#[[:space:]]/cache2[[:space:]]#d' /etc/fstab; "
            "rmdir /cache2 2>/dev/null; wipefs --all --quiet /dev/nvme1n1",
        )  # fmt: skip


def test_disk_with_a_partition_table_is_refused(
    lab: Lab, fabric_nodes: list[LabNode], second_run: PyinfraRun, tmp_path: Path
) -> None:
    lab_1 = fabric_nodes[0]
    # A DOS partition table with one Linux partition, written the way fdisk lays it out.
    write_mbr = (
        "import struct; mbr = bytearray(512); "
        "mbr[446:462] = bytes([0, 0, 0, 0, 0x83, 0, 0, 0]) + struct.pack('<II', 2048, 8192); "
        "mbr[510:512] = b'\\x55\\xaa'; open('/dev/nvme2n1', 'r+b').write(mbr)"
    )
    sudo(lab, lab_1, f"python3 -c {shlex.quote(write_mbr)}")
    try:
        output = refused(
            lab, fabric_nodes, tmp_path,
            lab_1={"nvme_cache": {"devices": ["/dev/nvme2n1"], "mount_point": "/cache2"}},
        )  # fmt: skip
        disk = serial(lab, lab_1, 2)
        assert f"/dev/nvme2n1 (serial {disk}) carries dos partition table; refusing" in output
    finally:
        sudo(lab, lab_1, "wipefs --all --quiet /dev/nvme2n1")


def test_missing_disk_is_refused(
    lab: Lab, fabric_nodes: list[LabNode], second_run: PyinfraRun, tmp_path: Path
) -> None:
    output = refused(
        lab, fabric_nodes, tmp_path, lab_1={"nvme_cache": {"devices": ["/dev/nvme7n1"]}}
    )
    assert (
        "lab-1: nvme_cache: no such device: /dev/nvme7n1 (listed by `nvme list`); block devices "
        "on the node: /dev/nvme0n1, /dev/nvme1n1, /dev/nvme2n1"
    ) in output


def test_a_mount_point_through_a_symbolic_link_is_refused(
    lab: Lab, fabric_nodes: list[LabNode], second_run: PyinfraRun, tmp_path: Path
) -> None:
    """mount and mkdir follow a link: /cachelink -> /var/tmp/elsewhere would put the cache
    there (or over /etc, for a link to it), past the model's system-directory check."""
    lab_1 = fabric_nodes[0]
    sudo(lab, lab_1, "mkdir -p /var/tmp/elsewhere && ln -sfn /var/tmp/elsewhere /cachelink")
    try:
        link = {"devices": ["/dev/nvme2n1"], "mount_point": "/cachelink/cache"}
        output = refused(lab, fabric_nodes, tmp_path, lab_1={"nvme_cache": link})
        assert (
            "lab-1: nvme_cache: mount point /cachelink/cache passes through the symbolic link "
            "/cachelink (-> /var/tmp/elsewhere), which mount and mkdir follow; set "
            "nvme_cache.mount_point to the real directory"
        ) in output
        assert sudo(lab, lab_1, "ls -A /var/tmp/elsewhere") == ""
    finally:
        sudo(lab, lab_1, "rm -f /cachelink; rmdir /var/tmp/elsewhere 2>/dev/null || true")


def test_a_shared_data_mount_point_that_holds_data_is_refused_and_drift_reports_the_share(
    lab: Lab, fabric_nodes: list[LabNode], second_run: PyinfraRun, tmp_path: Path
) -> None:
    """A directory with files at a declared NFS mount point is refused while pyinfra prepares:
    no unit, no nfs-common, nothing changed. The lab's kernel has neither NFS nor autofs
    (no mount, no automount can run in its containers), so the drift check's finding for a
    declared share with nothing at its mount point is checked here against a real node, and
    the units' text and names by systemd-analyze in the unit tests."""
    lab_1 = fabric_nodes[0]
    sudo(lab, lab_1, "mkdir -p /datasets && echo keep > /datasets/imagenet.idx")
    share = {"mounts": [{"mount_point": "/datasets", "server": "10.213.50.12",
                         "export": "/export/datasets", "nconnect": 4}]}  # fmt: skip
    try:
        output = refused(lab, fabric_nodes, tmp_path, lab_1={"shared_data": share})
        assert (
            "lab-1: shared_data: mount point /datasets is a directory that holds files, which "
            "the mount would hide; move them away or declare another mount point"
        ) in output
        assert sudo(lab, lab_1, "cat /datasets/imagenet.idx") == "keep\n"
        assert ssh(lab, lab_1, "test -e /etc/systemd/system/datasets.mount").returncode != 0
        code, found = fabric_drift(
            inventory(tmp_path, lab, fabric_nodes, lab_1={"shared_data": share})
        )
        assert found == {("lab-1", "shared_data.mount:/datasets"): "critical"}
        assert code == 1
    finally:
        sudo(lab, lab_1, "rm -rf /datasets")


def test_several_disks_without_md_driver_are_refused_with_the_reason(
    lab: Lab, fabric_nodes: list[LabNode], second_run: PyinfraRun, tmp_path: Path
) -> None:
    two = {"devices": ["/dev/nvme1n1", "/dev/nvme2n1"], "mount_point": "/cache2"}
    output = refused(lab, fabric_nodes, tmp_path, lab_1={"nvme_cache": two})
    assert (
        "lab-1: nvme_cache: 2 drives need a RAID0 array, but the kernel has no md driver here "
        "(/proc/mdstat is absent; this docker container cannot load md_mod and raid0)"
    ) in output


def test_sections_turned_off_remove_gpunode_files_only(
    lab: Lab, fabric_nodes: list[LabNode], second_run: PyinfraRun, tmp_path: Path
) -> None:
    lab_1 = fabric_nodes[0]
    path = write_inventory(tmp_path / "off.py", lab, fabric_nodes, {})
    run = run_pyinfra(DEPLOY, inventory=path)
    assert run.returncode == 0, run.output
    for node in fabric_nodes:
        left = sudo(lab, node, f"ls {' '.join(MANAGED_FILES[:5])} 2>/dev/null || true")
        assert left.strip() == ""
    # ib0 was taken down with its file; the cache (nvme_cache is not a removable section: its
    # data stays), the packages and the subnet manager set up before are left alone.
    assert "10.77.0.11" not in sudo(lab, lab_1, "ip -brief address show dev ib0")
    assert sudo(lab, lab_1, "findmnt -n -o SOURCE /raid").strip() == "/dev/nvme0n1"
    assert sudo(lab, lab_1, "systemctl is-enabled opensm").strip() == "enabled"
    assert run_pyinfra(DEPLOY, inventory=path).changed_operations() == {}


def test_nodes_are_left_converged(
    lab: Lab, fabric_nodes: list[LabNode], second_run: PyinfraRun, base_inventory: str
) -> None:
    # The base data again (after the test above turned the sections off), then a rerun.
    restore = run_pyinfra(DEPLOY, inventory=base_inventory)
    assert restore.returncode == 0, restore.output
    assert CACHE_OPERATION not in restore.changed_operations()  # the cache was kept
    run = run_pyinfra(DEPLOY, inventory=base_inventory)
    assert run.returncode == 0, run.output
    assert run.changed_operations() == {}


def test_scratch_disks_are_detached_by_lab_down(tmp_path: Path, lab: Lab) -> None:
    # A separate one-node lab (own name, state dir, and a subnet 100 above this lab's) so the
    # shared fleet keeps its disks.
    scratch = Lab(
        state_dir=tmp_path / "lab",
        name=f"{lab.name}-scratchtest",
        subnet_index=int(lab.network_prefix.rsplit(".", 1)[1]) + 100,
    )
    (node,) = scratch.up(1, profiles=["pcie-a10g"], scratch_disks=2)
    images = sorted((tmp_path / "lab" / "scratch").glob("*.img"))
    assert [image.name for image in images] == ["lab-1-0.img", "lab-1-1.img"]
    listing = json.loads(
        ssh(scratch, node, "lsblk -J -b -d -o SIZE /dev/nvme0n1 /dev/nvme1n1").stdout
    )
    assert [device["size"] for device in listing["blockdevices"]] == [2**30, 2**30]
    # The simulated nvme list now tells the disk's real size.
    drives = json.loads(ssh(scratch, node, "sudo nvme list -o json").stdout)["Devices"]
    assert [drive["PhysicalSize"] for drive in drives] == [2**30]
    loops = {
        str(image): subprocess.run(
            ["losetup", "--noheadings", "--output", "NAME", "--associated", str(image)],
            capture_output=True, text=True, check=True,
        ).stdout.split()
        for image in images
    }  # fmt: skip
    assert all(len(found) == 1 for found in loops.values()), loops
    scratch.down(keep_image=True)
    attached = subprocess.run(
        ["losetup", "--list", "--noheadings", "--output", "BACK-FILE"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert not any(image in attached for image in loops)
    assert not (tmp_path / "lab").exists()

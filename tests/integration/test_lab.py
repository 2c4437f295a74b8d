"""The lab fleet: real Debian 12 and 13 nodes run by systemd, reached over SSH like production."""

from __future__ import annotations

import json

import pytest

import lab as lab_module
from lab import Lab, LabNode

from .conftest import ssh

pytestmark = pytest.mark.lab


def test_every_node_boots_systemd_and_answers_ssh_with_key(
    lab: Lab, lab_nodes: list[LabNode]
) -> None:
    for node in lab_nodes:
        result = ssh(lab, node, "cat /proc/1/comm; . /etc/os-release; echo $VERSION_CODENAME")
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["systemd", node.release]


def test_password_login_is_not_what_gets_us_in(lab: Lab, lab_nodes: list[LabNode]) -> None:
    # Without the lab key and in batch mode, a node must refuse us: key auth is the only way.
    node = lab_nodes[0]
    import subprocess

    result = subprocess.run(
        ["ssh", "-o", f"UserKnownHostsFile={lab.known_hosts_path}", "-o", "BatchMode=yes",
         "-o", "IdentitiesOnly=yes", "-o", "IdentityFile=/dev/null", f"debian@{node.address}",
         "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 255
    assert "Permission denied" in result.stderr


def test_each_node_has_its_own_network_namespace_and_host_key(
    lab: Lab, lab_nodes: list[LabNode]
) -> None:
    seen_addresses, seen_keys, seen_netns = set(), set(), set()
    for node in lab_nodes:
        result = ssh(lab, node, "ip -4 -o addr show scope global; sudo readlink /proc/1/ns/net")
        assert result.returncode == 0, result.stderr
        assert f"inet {node.address}/" in result.stdout
        seen_addresses.add(node.address)
        seen_netns.add(result.stdout.split()[-1])
        seen_keys.add(node.host_key)
    assert len(seen_addresses) == len(seen_keys) == len(seen_netns) == len(lab_nodes)


def test_apt_sources_include_non_free(lab: Lab, lab_nodes: list[LabNode]) -> None:
    for node in lab_nodes:
        result = ssh(lab, node, "cat /etc/apt/sources.list.d/debian.sources")
        assert "Components: main contrib non-free non-free-firmware" in result.stdout
        assert f"Suites: {node.release}-security" in result.stdout


def test_simulated_gpus_follow_each_nodes_profile(lab: Lab, lab_nodes: list[LabNode]) -> None:
    expected_names = {
        "hgx-h100": "NVIDIA H100 80GB HBM3",
        "a100": "NVIDIA A100-SXM4-80GB",
        "pcie-a10g": "NVIDIA A10G",
    }
    for node in lab_nodes:
        result = ssh(lab, node, "nvidia-smi --query-gpu=name --format=csv,noheader")
        assert result.returncode == 0, result.stderr
        names = result.stdout.strip().splitlines()
        assert set(names) == {expected_names[node.profile]}
        state = json.loads(ssh(lab, node, "sudo gpunode-lab-hw show").stdout)
        assert len(names) == len(state["gpus"])


def test_a_real_package_cannot_overwrite_the_simulator(lab: Lab, lab_nodes: list[LabNode]) -> None:
    result = ssh(lab, lab_nodes[0], "dpkg-divert --list /usr/bin/nvidia-smi")
    assert "diversion of /usr/bin/nvidia-smi to /usr/bin/nvidia-smi.distrib" in result.stdout


def test_lab_reports_boot_time_and_memory(lab_nodes: list[LabNode]) -> None:
    for node in lab_nodes:
        assert 0 < node.boot_s < 120
        assert 0 < node.memory_mib < 1024


def test_a_second_lab_comes_up_and_goes_down_completely(
    tmp_path, lab, lab_nodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A separate lab (own name, state dir, and a subnet 102 above this lab's) so the shared
    # fleet is left alone, and so is any other session's lab on this machine: a fixed name or
    # subnet would be the same in every session. Its machine-wide cache (package cache, VM
    # images) is a scratch one, so that its whole `down` (images included) can be tried.
    monkeypatch.setenv("GPUNODE_LAB_CACHE", str(tmp_path / "cache"))
    # Only the images the shared fleet runs from are offered for removal: an image no
    # container uses now (another release's) would really go, and be rebuilt by the next lab.
    running = {node.release for node in lab_nodes}
    monkeypatch.setattr(
        lab_module, "LAB_RELEASES",
        {release: row for release, row in lab_module.LAB_RELEASES.items() if release in running},
    )  # fmt: skip
    said: list[str] = []
    scratch = Lab(
        state_dir=tmp_path / "lab",
        name=f"{lab.name}-labtest",
        subnet_index=int(lab.network_prefix.rsplit(".", 1)[1]) + 102,
        log=said.append,
    )
    # Another lab whose name starts with this one's (as a second test lab's does) has its
    # network up first: Docker's name filter matches it, yet it is not this lab's network.
    client = scratch.client
    longer = client.networks.create(f"{scratch.name}-shard1", driver="bridge")
    try:
        (node,) = scratch.up(1, profiles=["pcie-a10g"])
        assert ssh(scratch, node, "nvidia-smi -L").stdout.startswith("GPU 0: NVIDIA A10G")
        # Without --keep-image: the node image the shared fleet's containers run from is
        # every lab's, and is kept (it was removed, or the lab left half down).
        scratch.down()
        assert [net.name for net in client.networks.list()].count(longer.name) == 1
    finally:
        longer.remove()
    assert client.containers.list(all=True, filters={"label": f"lab={scratch.name}"}) == []
    assert scratch.name not in [net.name for net in client.networks.list()]
    assert not (tmp_path / "lab").exists()
    # The shared fleet is untouched, its image included.
    assert client.containers.get(lab_nodes[0].container).status == "running"
    shared_image = client.containers.get(lab_nodes[0].container).attrs["Image"]
    assert client.images.get(shared_image).id == shared_image
    assert any(line.startswith("kept image gpunode-lab/") for line in said), said

"""Shared training data, registry logins and mirrors, and a GPU container, checked on any node.

What each check expects is written out here from the tools' own documentation, not from the
roles: systemd.automount(5) (an automount unit enabled and active; the file system mounted on
first access), nfs(5) (``vers=`` shown in the mount's options), ``docker login``'s
``/root/.docker/config.json`` (one ``auths`` entry per registry), containerd's hosts.md
(``/etc/containerd/certs.d/<registry>/hosts.toml``) and NVIDIA's Container Toolkit "Running a
Sample Workload" (``docker run --rm --runtime=nvidia --gpus all ubuntu nvidia-smi``,
https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/sample-workload.html,
read 2026-12-07). Every check skips, saying why, where the inventory does not declare that
part, and the GPU container where no GPU answers on the node.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from gpunode.model import DesiredState, SharedMount

# How long the first access may take: the automount mounts the share then.
FIRST_ACCESS_TIMEOUT_S = 60
DOCKER_CLIENT_CONFIG = "/root/.docker/config.json"
# NVIDIA's sample workload, as the guide gives it.
SAMPLE_WORKLOAD = "docker run --rm --runtime=nvidia --gpus all ubuntu nvidia-smi"


def systemd_escape_path(path: str) -> str:
    """systemd-escape --path, as systemd.unit(5) describes it (written out again here)."""
    out = []
    for index, char in enumerate(path.strip("/")):
        if char == "/":
            out.append("-")
        elif (char.isascii() and char.isalnum()) or char in ":_" or (char == "." and index):
            out.append(char)
        else:
            out.append("".join(f"\\x{byte:02x}" for byte in char.encode()))
    return "".join(out)


@pytest.fixture
def shares(desired: DesiredState) -> tuple[SharedMount, ...]:
    if not desired.shared_data.mounts:
        pytest.skip("shared_data.mounts is empty for this host in the inventory")
    return desired.shared_data.mounts


def test_each_share_has_its_automount_enabled_and_active(
    host: Any, shares: tuple[SharedMount, ...]
) -> None:
    for share in shares:
        unit = f"{systemd_escape_path(share.mount_point)}.automount"
        assert host.run(f"systemctl is-enabled {unit}").stdout.strip() == "enabled", unit
        assert host.run(f"systemctl is-active {unit}").stdout.strip() == "active", unit


def test_each_share_mounts_on_first_access_from_its_source(
    host: Any, shares: tuple[SharedMount, ...]
) -> None:
    for share in shares:
        point = share.mount_point
        touched = host.run(f"timeout {FIRST_ACCESS_TIMEOUT_S} stat -f {point}")
        assert touched.rc == 0, (point, touched.stderr)
        line = host.check_output(f"findmnt -n -o FSTYPE,SOURCE,OPTIONS --mountpoint {point}")
        # The share is stacked on its autofs trigger: the last line is what jobs see.
        fstype, source, options = line.splitlines()[-1].split()
        if share.kind == "nfs":
            server = f"[{share.server}]" if ":" in share.server else share.server
            assert (fstype, source) == ("nfs4", f"{server}:{share.export}")
            assert f"vers={share.nfs_version}" in options.split(",")
        else:
            assert (fstype, source) == ("lustre", f"{share.server}:/{share.export}")
        assert ("ro" if share.read_only else "rw") in options.split(",")


@pytest.fixture
def logins(desired: DesiredState) -> DesiredState:
    if not desired.container_runtime.registry_logins:
        pytest.skip("container_runtime.registry_logins is empty for this host in the inventory")
    return desired


def test_registry_logins_are_root_only_and_complete(host: Any, logins: DesiredState) -> None:
    config = host.file(DOCKER_CLIENT_CONFIG)
    assert config.exists and config.user == "root" and config.mode == 0o600
    # Only the lines that open a registry's entry are read: never an auth value.
    opened = host.check_output(f'grep -E \'^[[:space:]]*"[^"]+": [{{]$\' {DOCKER_CLIENT_CONFIG}')
    registries = set(re.findall(r'"([^"]+)": \{', opened))
    wanted = {login.registry for login in logins.container_runtime.registry_logins}
    assert wanted <= registries


@pytest.fixture
def mirrors(desired: DesiredState) -> DesiredState:
    if not desired.container_runtime.registry_mirrors:
        pytest.skip("container_runtime.registry_mirrors is empty for this host in the inventory")
    return desired


def test_each_mirrored_registry_has_its_hosts_toml(host: Any, mirrors: DesiredState) -> None:
    for mirror in mirrors.container_runtime.registry_mirrors:
        hosts = host.file(f"/etc/containerd/certs.d/{mirror.registry}/hosts.toml")
        assert hosts.exists, mirror.registry
        text = hosts.content_string
        for url in mirror.mirrors:
            assert f'"{url}"' in text, (mirror.registry, url)


def test_the_sample_gpu_workload_runs_in_docker(host: Any, desired: DesiredState) -> None:
    if "docker" not in desired.container_runtime.engines:
        pytest.skip("docker is not in container_runtime.engines for this host")
    if host.run("command -v docker").rc != 0:
        # gpunode configures the engines it is given and installs none of them.
        pytest.skip(
            "docker is not installed on this host (gpunode configures it, never installs it)"
        )
    if host.run("nvidia-smi -L").rc != 0:
        pytest.skip("no GPU answers nvidia-smi on this host")
    run = host.run(SAMPLE_WORKLOAD)
    assert run.rc == 0, run.stderr
    assert "NVIDIA-SMI" in run.stdout

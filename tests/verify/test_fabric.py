"""Fabric and storage checks: NCCL settings, RDMA stack and limits, the NVMe cache mount.

Expected values come from the inventory's declared data and the paths below, restated here
(not imported from the roles) so a role that writes the wrong thing fails these checks.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpunode.model import DesiredState

# NCCL reads NAME=value lines from this file in every process that loads it.
NCCL_CONF_PATH = "/etc/nccl.conf"
# systemd-modules-load reads modules to load at boot from modules-load.d.
MODULES_LOAD_PATH = "/etc/modules-load.d/gpunode-rdma.conf"
RDMA_LIMITS_PATH = "/etc/security/limits.d/gpunode-rdma.conf"


def settings_in(text: str) -> list[tuple[str, str]]:
    """(NAME, value) of every setting line of an nccl.conf, comments and blanks aside (a
    list: a name set twice shows twice)."""
    settings = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            settings.append((name.strip(), value.strip()))
    return sorted(settings)


def test_nccl_conf_holds_exactly_the_declared_settings(host: Any, desired: DesiredState) -> None:
    if not desired.nccl.env:
        pytest.skip("nccl.env is empty for this host in the inventory")
    assert settings_in(host.file(NCCL_CONF_PATH).content_string) == sorted(desired.nccl.env.items())


def test_login_shells_see_the_nccl_settings(host: Any, desired: DesiredState) -> None:
    if not desired.nccl.env:
        pytest.skip("nccl.env is empty for this host in the inventory")
    environment = host.check_output("bash -lc env")
    for name, value in desired.nccl.env.items():
        assert f"{name}={value}" in environment.splitlines()


@pytest.fixture
def rdma(desired: DesiredState) -> DesiredState:
    if not desired.infiniband.enabled:
        pytest.skip("infiniband.enabled is false for this host in the inventory")
    return desired


@pytest.mark.parametrize("package", ["rdma-core", "infiniband-diags", "ibverbs-utils"])
def test_rdma_packages_installed(host: Any, rdma: DesiredState, package: str) -> None:
    assert host.package(package).is_installed


def test_rdma_modules_load_at_boot(host: Any, rdma: DesiredState) -> None:
    modules = host.file(MODULES_LOAD_PATH).content_string.split()
    assert {"ib_umad", "ib_ipoib"} <= set(modules)


def test_memlock_unlimited_for_rdma(host: Any, rdma: DesiredState) -> None:
    if not rdma.infiniband.memlock_unlimited:
        pytest.skip("infiniband.memlock_unlimited is false for this host")
    limits = " ".join(host.file(RDMA_LIMITS_PATH).content_string.split())
    assert "hard memlock unlimited" in limits


def test_nvme_cache_is_mounted_noatime_from_fstab_by_uuid(host: Any, desired: DesiredState) -> None:
    cache = desired.nvme_cache
    if not cache.enabled:
        pytest.skip("nvme_cache.enabled is false for this host in the inventory")
    mount = host.mount_point(cache.mount_point)
    assert mount.exists
    assert mount.filesystem == cache.filesystem
    assert "noatime" in mount.options
    fstab = [line.split() for line in host.file("/etc/fstab").content_string.splitlines()]
    entries = [f for f in fstab if len(f) > 1 and f[1] == cache.mount_point]
    assert len(entries) == 1 and entries[0][0].startswith("UUID=")

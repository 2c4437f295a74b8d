"""Fabric and storage checks: NCCL settings, RDMA stack and limits, the NVMe cache mount."""

from __future__ import annotations

from typing import Any

import pytest

from gpunode.model import DesiredState
from roles.infiniband import LIMITS_PATH, MODULES_LOAD_PATH
from roles.nccl import NCCL_CONF_PATH, render_nccl_conf


def test_nccl_conf_holds_exactly_the_declared_settings(host: Any, desired: DesiredState) -> None:
    if not desired.nccl.env:
        pytest.skip("nccl.env is empty for this host in the inventory")
    assert host.file(NCCL_CONF_PATH).content_string == render_nccl_conf(desired.nccl.env)


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
    limits = " ".join(host.file(LIMITS_PATH).content_string.split())
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

"""Kubernetes worker readiness and MPS, checked on any node.

What each check expects is written out here from Kubernetes' "Container Runtimes"
prerequisites (overlay and br_netfilter, net.ipv4.ip_forward and
net.bridge.bridge-nf-call-iptables at 1, swap off for kubelet, cgroup v2 for the systemd
cgroup driver) and NVIDIA's MPS guide (the control daemon running, its GPUs in
EXCLUSIVE_PROCESS compute mode); nothing comes from the roles. Every check skips, saying why,
where the inventory does not declare that part, and the MPS client run where the node has no
GPU.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpunode.model import DesiredState

MODULES = ("overlay", "br_netfilter")
SYSCTLS = {
    "net.ipv4.ip_forward": "1",
    "net.bridge.bridge-nf-call-iptables": "1",
    "net.bridge.bridge-nf-call-ip6tables": "1",
}
MODULES_LOAD_DIR = "/etc/modules-load.d"
MPS_UNIT = "gpunode-mps.service"
MPS_CONTROL = "/usr/bin/nvidia-cuda-mps-control"


@pytest.fixture
def worker(desired: DesiredState) -> DesiredState:
    if not desired.kubernetes.enabled:
        pytest.skip("kubernetes.enabled is false for this host in the inventory")
    return desired


@pytest.fixture
def mps(desired: DesiredState) -> DesiredState:
    if not desired.mps.enabled:
        pytest.skip("mps.enabled is false for this host in the inventory")
    return desired


def test_cgroup_v2_is_the_hierarchy(host: Any, worker: DesiredState) -> None:
    fstype = host.check_output("stat -fc %T /sys/fs/cgroup")
    assert fstype == "cgroup2fs"


def test_no_swap_is_active_or_declared(host: Any, worker: DesiredState) -> None:
    active = host.file("/proc/swaps").content_string.splitlines()[1:]
    assert [line for line in active if line.strip()] == []
    fstab = host.file("/etc/fstab").content_string.splitlines()
    declared = [
        line for line in fstab
        if line.split() and not line.startswith("#") and len(line.split()) > 2
        and line.split()[2] == "swap"
    ]  # fmt: skip
    assert declared == []


@pytest.mark.parametrize("module", MODULES)
def test_module_loaded_and_loaded_at_boot(host: Any, worker: DesiredState, module: str) -> None:
    assert host.file(f"/sys/module/{module}").is_directory
    at_boot = host.check_output(
        f"cat {MODULES_LOAD_DIR}/*.conf /usr/lib/modules-load.d/*.conf 2>/dev/null; true"
    )
    assert module in {line.strip() for line in at_boot.splitlines()}


@pytest.mark.parametrize(("key", "value"), SYSCTLS.items())
def test_forwarding_sysctls_are_live(host: Any, worker: DesiredState, key: str, value: str) -> None:
    assert host.file("/proc/sys/" + key.replace(".", "/")).content_string.strip() == value


def test_the_forward_path_is_filtered_to_the_clusters_networks(
    host: Any, worker: DesiredState
) -> None:
    chain = host.check_output("nft list chain inet gpunode forward")
    assert "hook forward" in chain and "policy drop;" in chain
    for network in (*worker.kubernetes.pod_networks, *worker.kubernetes.service_networks):
        assert network in chain or network.split("/")[0] in chain, network


def test_containerd_runs(host: Any, worker: DesiredState) -> None:
    assert host.service("containerd").is_running


def test_declared_kubernetes_packages_are_installed_at_the_pin_and_held(
    host: Any, worker: DesiredState
) -> None:
    wanted = worker.kubernetes
    if not wanted.packages:
        pytest.skip("kubernetes.packages is empty for this host in the inventory")
    held = set(host.check_output("apt-mark showhold").split())
    for name in wanted.packages:
        package = host.package(name)
        assert package.is_installed, name
        if wanted.version:
            assert package.version == wanted.version, name
        if wanted.hold:
            assert name in held, name


def test_the_mps_control_daemon_runs(host: Any, mps: DesiredState) -> None:
    assert host.file(MPS_CONTROL).exists
    assert host.service(MPS_UNIT).is_running
    assert host.service(MPS_UNIT).is_enabled


def test_the_mps_gpus_are_in_exclusive_process_mode(host: Any, mps: DesiredState) -> None:
    if not mps.mps.exclusive_process:
        pytest.skip("mps.exclusive_process is false: the compute mode is left as found")
    lines = host.check_output(
        "nvidia-smi --query-gpu=index,compute_mode --format=csv,noheader"
    ).splitlines()
    modes = dict(line.split(", ", 1) for line in lines if ", " in line)
    wanted = [str(index) for index in mps.mps.gpus] or list(modes)
    assert {index: modes.get(index) for index in wanted} == dict.fromkeys(
        wanted, "Exclusive_Process"
    )


def test_an_mps_client_runs_through_the_daemon(host: Any, mps: DesiredState) -> None:
    """A CUDA client started with the daemon's pipe directory creates a context, and the
    daemon's logs grow by it: the control daemon starts an MPS server for the client and logs
    it (NVIDIA's MPS guide, "Appendix: Logging": control.log holds the servers' status,
    server.log its clients')."""
    if host.run("nvidia-smi -L").rc != 0:
        pytest.skip("no GPU answers on this node (nvidia-smi -L fails): no MPS client can run")
    pipe, logs = mps.mps.pipe_directory, mps.mps.log_directory
    size = f"cat {logs}/control.log {logs}/server.log 2>/dev/null | wc -c"
    before = int(host.check_output(size))
    client = host.run(
        f"CUDA_MPS_PIPE_DIRECTORY={pipe} python3 -c "
        "\"import ctypes; c = ctypes.CDLL('libcuda.so.1'); assert c.cuInit(0) == 0; "
        "d = ctypes.c_int(); assert c.cuDeviceGet(ctypes.byref(d), 0) == 0; "
        'ctx = ctypes.c_void_p(); assert c.cuCtxCreate_v2(ctypes.byref(ctx), 0, d) == 0"'
    )
    assert client.rc == 0, client.stderr
    assert int(host.check_output(size)) > before

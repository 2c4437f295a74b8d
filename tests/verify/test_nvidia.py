"""NVIDIA stack checks: the driver loaded at its pin and held, CUDA toolkits and the default,
the container runtime wired into the declared engines, Fabric Manager and DCGM running where
declared, and the GPU settings applied.

What each check expects is written out here from NVIDIA's documented package and service names
(the Debian install guides for the driver, CUDA, the Container Toolkit, Fabric Manager and
DCGM) and from the host's declared data; nothing comes from the roles that install them.
Every check skips, saying why, where the inventory does not declare that part.
"""

from __future__ import annotations

import json
import shlex
import time
import tomllib
from typing import Any

import pytest
from tls_handshake import client_certificate_refused, server_certificate_verified

from gpunode.model import DesiredState, version_tuple

# NVIDIA's Debian guide: the compute-only (headless) install is nvidia-driver-cuda with the
# kernel module; the full stack adds nvidia-open (open modules) or cuda-drivers (proprietary)
# and nvidia-driver. From branch 590 NVIDIA locks a branch with nvidia-driver-pinning-<branch>.
# Debian non-free's headless compute set is the kernel module, nvidia-smi and libcuda1 (never
# its X11 metapackage).
NVIDIA_MODULE = {"open": "nvidia-kernel-open-dkms", "proprietary": "nvidia-kernel-dkms"}
NVIDIA_FULL_STACK = {"open": ("nvidia-open",), "proprietary": ("cuda-drivers",)}
PINNING_FROM_BRANCH = 590
DEBIAN_SOURCE_PACKAGES = {
    "open": ("nvidia-open-kernel-dkms", "nvidia-smi", "libcuda1"),
    "proprietary": ("nvidia-kernel-dkms", "nvidia-smi", "libcuda1"),
}
# The kernel's own word on the loaded module.
KERNEL_DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
PERSISTENCED_SERVICE = "nvidia-persistenced"
# The NVIDIA Container Toolkit install guide pins these four together.
TOOLKIT_PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
NVIDIA_RUNTIME_EXECUTABLE = "nvidia-container-runtime"
DOCKER_CONFIG = "/etc/docker/daemon.json"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CDI_SPEC = "/etc/cdi/nvidia.yaml"
# From Container Toolkit 1.18 its nvidia-cdi-refresh units keep the spec here (NVIDIA's CDI
# support page), and no second spec for the same devices may stay in /etc/cdi.
TOOLKIT_CDI_SPEC = "/var/run/cdi/nvidia.yaml"
TOOLKIT_KEEPS_CDI_FROM = (1, 18)
FABRIC_MANAGER_SERVICE = "nvidia-fabricmanager"
# Fabric Manager from NVIDIA's repository: nvidia-fabricmanager-<branch> up to 575,
# nvidia-fabricmanager with libnvidia-nscq from 580 (Ubuntu's archive keeps the suffix).
UNSUFFIXED_FABRIC_MANAGER_FROM_BRANCH = 580
DCGM3_PACKAGE = "datacenter-gpu-manager"
DCGM_SERVICE = "nvidia-dcgm"  # runs nv-hostengine
# DCGM 4's exporter package and the unit it ships (NVIDIA/dcgm-exporter packaging).
DCGM_EXPORTER_PACKAGE = "datacenter-gpu-manager-exporter"
DCGM_EXPORTER_SERVICE = "nvidia-dcgm-exporter"


def held(host: Any) -> set[str]:
    return set(host.check_output("apt-mark showhold").split())


def installed_version(host: Any, package: str) -> str | None:
    """The installed version of ``package``, None when it is not installed."""
    result = host.run(f"dpkg-query -W -f '${{Status}}|${{Version}}' {shlex.quote(package)}")
    status, _, version = result.stdout.partition("|")
    if result.rc != 0 or not status.endswith(" installed"):
        return None
    return version


def query_gpus(host: Any, *fields: str) -> list[dict[str, str]]:
    """One row per GPU of ``nvidia-smi --query-gpu``: field -> value (without units)."""
    output = host.check_output(
        f"nvidia-smi --query-gpu={','.join(fields)} --format=csv,noheader,nounits"
    )
    rows = [[value.strip() for value in line.split(",")] for line in output.splitlines()]
    return [dict(zip(fields, row, strict=True)) for row in rows if row != [""]]


def is_gpu_node(desired: DesiredState) -> bool:
    hardware = desired.expected_hardware
    return hardware.gpu_count != 0 and bool(
        hardware.gpu_count or hardware.gpu_model or desired.nvidia_driver.source != "none"
    )


# --- the driver ----------------------------------------------------------------------------


@pytest.fixture
def driver(desired: DesiredState) -> DesiredState:
    if desired.nvidia_driver.source == "none":
        pytest.skip("nvidia_driver.source is none for this host: the driver is not gpunode's")
    return desired


def driver_packages(desired: DesiredState) -> tuple[str, ...]:
    """The driver's packages at the driver's version."""
    wanted = desired.nvidia_driver
    if wanted.source == "nvidia":
        compute = ("nvidia-driver-cuda", NVIDIA_MODULE[wanted.flavour])
        if wanted.stack == "full":
            return (*NVIDIA_FULL_STACK[wanted.flavour], "nvidia-driver", *compute)
        return compute
    return DEBIAN_SOURCE_PACKAGES[wanted.flavour]


def pinning_package(desired: DesiredState) -> str | None:
    branch = desired.nvidia_driver.branch
    if desired.nvidia_driver.source != "nvidia" or not branch:
        return None
    return f"nvidia-driver-pinning-{branch}" if int(branch) >= PINNING_FROM_BRANCH else None


def test_driver_loaded_is_the_pinned_release(host: Any, driver: DesiredState) -> None:
    wanted = driver.nvidia_driver
    loaded = {row["driver_version"] for row in query_gpus(host, "driver_version")}
    assert len(loaded) == 1, loaded
    if wanted.version:
        # An apt version 580.105.08-1 is driver release 580.105.08.
        assert loaded == {wanted.version.rsplit("-", 1)[0].split(":")[-1]}
    else:
        assert next(iter(loaded)).startswith(f"{wanted.branch}."), loaded
    kernel = host.file(KERNEL_DRIVER_VERSION_FILE)
    if kernel.exists:  # a real node: the kernel module says so too
        assert f" {next(iter(loaded))} " in kernel.content_string


# The ubuntu source's names, as Ubuntu's archive has them (noble's restricted Packages index,
# packages.ubuntu.com, read 2026-12-07), restated here rather than taken from the product:
# every name ends in <branch>[-server], the kernel module's also in [-open]; Canonical's
# prebuilt module is named for exactly the kernel it was built for (`uname -r`).
UBUNTU_COMPUTE = (
    "libnvidia-compute",
    "nvidia-utils",
    "nvidia-compute-utils",
    "nvidia-kernel-common",
)


def ubuntu_suffix(wanted: Any, with_flavour: bool) -> str:
    suffix = f"{wanted.branch}" + ("-server" if wanted.ubuntu_series == "server" else "")
    return suffix + ("-open" if with_flavour and wanted.flavour == "open" else "")


def ubuntu_module_package(host: Any, wanted: Any) -> str:
    """The ubuntu source's kernel module package on this node: Canonical's prebuilt one for
    the running kernel where it is installed, else the DKMS one (what the role chose)."""
    suffix = ubuntu_suffix(wanted, with_flavour=True)
    prebuilt = f"linux-modules-nvidia-{suffix}-{host.check_output('uname -r').strip()}"
    return prebuilt if installed_version(host, prebuilt) else f"nvidia-dkms-{suffix}"


def test_driver_packages_installed_at_the_pin_and_held(host: Any, driver: DesiredState) -> None:
    wanted = driver.nvidia_driver
    if wanted.source == "ubuntu":
        # Ubuntu's compute set at the driver's version, and the kernel module: a prebuilt one
        # is versioned as its kernel is, DKMS's as the driver; every one of them held.
        compute = [f"{name}-{ubuntu_suffix(wanted, with_flavour=False)}" for name in UBUNTU_COMPUTE]
        module = ubuntu_module_package(host, wanted)
        versions = {package: installed_version(host, package) for package in (*compute, module)}
        assert None not in versions.values(), versions
        at_driver_version = [*compute, *([module] if "-dkms-" in module else [])]
        if wanted.version:
            assert {versions[package] for package in at_driver_version} == {wanted.version}
        assert {*compute, module} <= held(host), versions
        return
    packages = driver_packages(driver)
    versions = {package: installed_version(host, package) for package in packages}
    assert None not in versions.values(), versions
    if wanted.version:
        assert set(versions.values()) == {wanted.version}, versions
    assert set(packages) <= held(host)
    pinning = pinning_package(driver)
    if pinning:
        assert installed_version(host, pinning), pinning
        assert pinning in held(host)


def test_persistence_daemon_as_declared(host: Any, driver: DesiredState) -> None:
    service = host.service(PERSISTENCED_SERVICE)
    if driver.nvidia_driver.persistence_daemon:
        assert service.is_enabled and service.is_running
    else:
        assert not service.is_running


# --- CUDA ------------------------------------------------------------------------------------


@pytest.fixture
def cuda(desired: DesiredState) -> DesiredState:
    if not desired.cuda.versions:
        pytest.skip("cuda.versions is empty for this host in the inventory")
    return desired


def test_each_declared_cuda_toolkit_is_installed_held_and_runs(
    host: Any, cuda: DesiredState
) -> None:
    holds = held(host)
    for release in cuda.cuda.versions:
        package = f"cuda-toolkit-{release.replace('.', '-')}"
        assert installed_version(host, package), package
        assert package in holds, package
        nvcc = host.run(f"/usr/local/cuda-{release}/bin/nvcc --version")
        assert nvcc.rc == 0, (release, nvcc.stderr)
        assert f"release {release}," in nvcc.stdout, (release, nvcc.stdout)


def test_the_default_cuda_is_behind_usr_local_cuda_and_on_path(
    host: Any, cuda: DesiredState
) -> None:
    default = cuda.cuda.default or max(cuda.cuda.versions, key=version_tuple)
    assert host.check_output("readlink -f /usr/local/cuda") == f"/usr/local/cuda-{default}"
    assert f"release {default}," in host.check_output("bash -lc 'nvcc --version'")


# --- the container runtime -------------------------------------------------------------------


@pytest.fixture
def runtime(desired: DesiredState) -> DesiredState:
    if not desired.container_runtime.engines:
        pytest.skip("container_runtime.engines is empty for this host in the inventory")
    return desired


def test_container_toolkit_installed_at_the_pin_and_held(host: Any, runtime: DesiredState) -> None:
    versions = {package: installed_version(host, package) for package in TOOLKIT_PACKAGES}
    assert None not in versions.values(), versions
    if runtime.container_runtime.toolkit_version:
        assert set(versions.values()) == {runtime.container_runtime.toolkit_version}, versions
    assert set(TOOLKIT_PACKAGES) <= held(host)


def test_docker_has_the_nvidia_runtime_as_declared(host: Any, runtime: DesiredState) -> None:
    wanted = runtime.container_runtime
    if "docker" not in wanted.engines:
        pytest.skip("docker is not in container_runtime.engines for this host")
    config = json.loads(host.file(DOCKER_CONFIG).content_string)
    path = config.get("runtimes", {}).get("nvidia", {}).get("path", "")
    assert path.rsplit("/", 1)[-1] == NVIDIA_RUNTIME_EXECUTABLE, config
    assert (config.get("default-runtime") == "nvidia") == wanted.set_as_default, config
    if wanted.cdi:
        assert config.get("features", {}).get("cdi") is True, config


def test_containerd_has_the_nvidia_runtime_as_declared(host: Any, runtime: DesiredState) -> None:
    wanted = runtime.container_runtime
    if "containerd" not in wanted.engines:
        pytest.skip("containerd is not in container_runtime.engines for this host")
    config = tomllib.loads(host.file(CONTAINERD_CONFIG).content_string)
    # The CRI plugin's table is named after the config's version; look in each plugin.
    plugins = [p for p in config.get("plugins", {}).values() if "containerd" in p]
    assert plugins, config
    cri = plugins[0]
    runtimes = cri["containerd"].get("runtimes", {})
    binary = runtimes.get("nvidia", {}).get("options", {}).get("BinaryName", "")
    assert binary.rsplit("/", 1)[-1] == NVIDIA_RUNTIME_EXECUTABLE, cri
    default = cri["containerd"].get("default_runtime_name")
    assert (default == "nvidia") == wanted.set_as_default, cri
    if wanted.cdi:
        assert cri.get("enable_cdi") is True, cri


def test_cdi_spec_names_every_gpu(host: Any, runtime: DesiredState) -> None:
    if not runtime.container_runtime.cdi:
        pytest.skip("container_runtime.cdi is false for this host in the inventory")
    pinned = runtime.container_runtime.toolkit_version
    version = pinned or installed_version(host, "nvidia-container-toolkit-base") or ""
    toolkit_keeps_it = version_tuple(version)[:2] >= TOOLKIT_KEEPS_CDI_FROM
    if toolkit_keeps_it:
        assert not host.file(CDI_SPEC).exists, f"{CDI_SPEC} beside the toolkit's own spec"
    spec = host.file(TOOLKIT_CDI_SPEC if toolkit_keeps_it else CDI_SPEC).content_string
    for gpu in query_gpus(host, "uuid"):
        assert gpu["uuid"] in spec


# --- Fabric Manager and DCGM -----------------------------------------------------------------


def test_fabric_manager_runs_where_nvswitches_are_expected(
    host: Any, desired: DesiredState
) -> None:
    if not desired.needs_fabric_manager:
        pytest.skip(
            "no Fabric Manager declared for this host (fabric_manager.mode "
            f"{desired.fabric_manager.mode}, expected_hardware.nvswitch "
            f"{desired.expected_hardware.nvswitch})"
        )
    driver = desired.nvidia_driver
    if driver.source == "ubuntu":
        # Ubuntu's archive (multiverse) keeps the branch in both names, for every branch.
        packages: tuple[str, ...] = (
            f"nvidia-fabricmanager-{driver.branch}",
            f"libnvidia-nscq-{driver.branch}",
        )
    elif int(str(driver.branch)) >= UNSUFFIXED_FABRIC_MANAGER_FROM_BRANCH:
        packages = ("nvidia-fabricmanager", "libnvidia-nscq")
    else:
        packages = (f"nvidia-fabricmanager-{driver.branch}",)
    versions = {package: installed_version(host, package) for package in packages}
    assert None not in versions.values(), versions
    # Fabric Manager refuses to run with any other driver than its own version.
    pinned = desired.fabric_manager.version or driver.version
    if pinned:
        assert set(versions.values()) == {pinned}, versions
    assert set(packages) <= held(host)
    service = host.service(FABRIC_MANAGER_SERVICE)
    assert service.is_enabled and service.is_running


def test_no_fabric_manager_where_no_nvswitch_is(host: Any, desired: DesiredState) -> None:
    mode, nvswitch = desired.fabric_manager.mode, desired.expected_hardware.nvswitch
    if not (mode == "never" or (mode == "auto" and nvswitch is False)):
        pytest.skip("the inventory does not say this host has no NVSwitch")
    assert not host.service(FABRIC_MANAGER_SERVICE).is_running


def test_dcgm_host_engine_runs_where_declared(host: Any, desired: DesiredState) -> None:
    if not desired.dcgm.enabled:
        pytest.skip("dcgm.enabled is false for this host in the inventory")
    if desired.dcgm.release_major == 3:
        package = DCGM3_PACKAGE
    else:
        # DCGM 4: its core, and the part built for the node's CUDA major (both one version).
        package = "datacenter-gpu-manager-4-core"
        cuda = f"datacenter-gpu-manager-4-cuda{desired.dcgm_cuda_major}"
        assert installed_version(host, cuda) == installed_version(host, package), cuda
        assert cuda in held(host)
    version = installed_version(host, package)
    assert version, package
    if desired.dcgm.version:
        assert version == desired.dcgm.version
    assert package in held(host)
    service = host.service(DCGM_SERVICE)
    assert service.is_enabled and service.is_running
    assert host.process.filter(comm="nv-hostengine"), "no nv-hostengine process"


def test_dcgm_exporter_runs_where_declared(host: Any, desired: DesiredState) -> None:
    if not (desired.dcgm.enabled and desired.dcgm.exporter):
        pytest.skip("dcgm.exporter is not declared for this host in the inventory")
    version = installed_version(host, DCGM_EXPORTER_PACKAGE)
    assert version, DCGM_EXPORTER_PACKAGE
    if desired.dcgm.exporter_version:
        assert version == desired.dcgm.exporter_version
    assert DCGM_EXPORTER_PACKAGE in held(host)
    service = host.service(DCGM_EXPORTER_SERVICE)
    assert service.is_enabled and service.is_running
    # NVIDIA's exporter serves on port 9400 once it has started (the unit is active as soon
    # as the process runs; the port follows its start-up), over mutual TLS 1.3 only
    # (roles/dcgm.py) with the node's certificate, to the monitoring host's scraper alone: a
    # node's own certificate is no client and gets no metrics.
    fetch = (
        "printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' | timeout 20 openssl s_client -quiet -tls1_3 "
        "-connect 127.0.0.1:9400 -CAfile /etc/gpunode/tls/ca.crt "
        "-cert /etc/gpunode/tls/node.crt -key /etc/gpunode/tls/node.key"
    )
    answer = host.run(fetch)
    for _ in range(30):
        if server_certificate_verified(answer.stderr):
            break
        time.sleep(1)
        answer = host.run(fetch)
    assert server_certificate_verified(answer.stderr), (
        "no TLS on port 9400 with a certificate from gpunode's CA: " + answer.stderr[-300:]
    )
    assert "HTTP/1.0 200" not in answer.stdout, "a node's own certificate got DCGM's metrics"
    assert client_certificate_refused(answer.stderr), answer.stderr[-300:]


# --- GPU settings ------------------------------------------------------------------------------


@pytest.fixture
def gpus(desired: DesiredState) -> DesiredState:
    if not is_gpu_node(desired):
        pytest.skip("no GPUs declared for this host (expected_hardware, nvidia_driver)")
    return desired


def test_the_declared_gpus_are_seen(host: Any, gpus: DesiredState) -> None:
    hardware = gpus.expected_hardware
    if hardware.gpu_count is None and hardware.gpu_model is None:
        pytest.skip("expected_hardware declares neither gpu_count nor gpu_model")
    seen = query_gpus(host, "name")
    if hardware.gpu_count is not None:
        assert len(seen) == hardware.gpu_count
    if hardware.gpu_model is not None:
        assert {gpu["name"] for gpu in seen} == {hardware.gpu_model}


def test_gpu_persistence_mode_as_declared(host: Any, gpus: DesiredState) -> None:
    wanted = gpus.gpu_settings.persistence_mode
    if wanted is None:
        pytest.skip("gpu_settings.persistence_mode is null: left as found")
    modes = {
        row["index"]: row["persistence_mode"]
        for row in query_gpus(host, "index", "persistence_mode")
    }
    assert modes and set(modes.values()) == {"Enabled" if wanted else "Disabled"}, modes


def test_gpu_power_limit_as_declared(host: Any, gpus: DesiredState) -> None:
    watts = gpus.gpu_settings.power_limit_w
    if watts is None:
        pytest.skip("gpu_settings.power_limit_w is not declared for this host")
    limits = {
        row["index"]: float(row["power.limit"]) for row in query_gpus(host, "index", "power.limit")
    }
    assert limits and set(limits.values()) == {float(watts)}, limits


def test_gpu_application_clocks_as_declared(host: Any, gpus: DesiredState) -> None:
    clocks = gpus.gpu_settings.application_clocks
    if clocks is None:
        pytest.skip("gpu_settings.application_clocks is not declared for this host")
    rows = query_gpus(host, "index", "clocks.applications.memory", "clocks.applications.graphics")
    seen = {
        row["index"]: (row["clocks.applications.memory"], row["clocks.applications.graphics"])
        for row in rows
    }
    assert seen and set(seen.values()) == {(str(clocks.memory_mhz), str(clocks.graphics_mhz))}, seen

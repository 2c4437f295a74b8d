"""NVIDIA Container Toolkit: pinned and held, wired into docker and/or containerd, with a CDI spec.

The four packages move together at ``container_runtime.toolkit_version`` (NVIDIA's install guide
pins all four: ``nvidia-container-toolkit`` needs ``-base`` at exactly its version but takes any
newer ``libnvidia-container-tools``); a pin change upgrades (or downgrades) them and holds them
again. Without a pin they are held at the version first installed.

Engines are configured with ``nvidia-ctk runtime configure --runtime=<engine>`` only when the
parsed configuration (``ContainerRuntimeConfig``) lacks the nvidia runtime, the default runtime
asked for (``set_as_default``) or CDI (``cdi``). nvidia-ctk merges into the existing file, so
other settings stay. A file that does not parse is an error, never rewritten. When nvidia is the
default but data no longer asks for it, the default is reverted (docker: ``default-runtime``
removed; containerd: ``default_runtime_name`` back to ``runc``), the one edit nvidia-ctk cannot
make.

An engine declared but not installed still gets its configuration file (created by nvidia-ctk):
installing docker or containerd is not gpunode's job, and whoever installs it later finds the
NVIDIA runtime ready. The engine is restarted only when its configuration changed and its unit
exists; otherwise the run says why it did not restart it.

The CDI spec: from Container Toolkit 1.18 on the toolkit keeps it itself (its
``nvidia-cdi-refresh`` path and service units write ``/var/run/cdi/nvidia.yaml`` whenever the
driver or the toolkit changes), so gpunode keeps those units enabled, has the service run again
when the spec does not list this host's GPUs for the loaded driver, and removes the
``/etc/cdi/nvidia.yaml`` it wrote for an older toolkit: a second spec for the same devices can
disagree with the toolkit's. Up to 1.17 (a fleet pinned to it, or back to it) gpunode removes a
``/var/run/cdi/nvidia.yaml`` a newer toolkit left and writes ``/etc/cdi/nvidia.yaml`` (device names
by index and by UUID) when it is missing, names other GPUs than the GPU fact, was made for
another driver, or the toolkit version changes in this run. Which release decides: the pinned
version, else the installed one, else (a first install without a pin) the newest the
repository offers. Generating needs a loaded driver; without readable GPUs the run reports why
it skipped.

``gpu_container_check`` runs a CUDA container with all GPUs requested through the docker Python
SDK and compares the GPUs it sees with the host's. It is a separate deploy, not part of the
converge (a check is no state, and would count as a change on every run): see deploys/cuda.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pyinfra import host
from pyinfra.api import OperationError, deploy, operation
from pyinfra.facts.systemd import SystemdEnabled
from pyinfra.operations import python

from facts.container_runtime import (
    CDI_REFRESH_SPEC,
    CDI_SPEC,
    CONTAINERD_CONFIG,
    DOCKER_CONFIG,
    NVIDIA_RUNTIME,
    AptPackagePolicy,
    ContainerRuntimeConfig,
)
from facts.freshness import UnitOlderThanFile
from facts.gpu import GpuDevices
from gpunode.expected.packages import TOOLKIT_PACKAGES, toolkit_keeps_cdi_spec
from gpunode.model import DesiredState
from gpunode.nvidia_releases import CDI_REFRESH_UNITS
from roles.cuda import held_packages, require_offered

ENGINE_CONFIGS = {"docker": DOCKER_CONFIG, "containerd": CONTAINERD_CONFIG}
# Each revert is a one-line edit of a file nvidia-ctk has just written: it writes daemon.json
# with sorted keys and four-space indent, so "default-runtime" is never the last key.
REVERT_DEFAULT = {
    "docker": f'sed -i \'/^    "default-runtime": "{NVIDIA_RUNTIME}",$/d\' {DOCKER_CONFIG}',
    "containerd": (
        "sed -i -E 's/^([[:space:]]*default_runtime_name[[:space:]]*=[[:space:]]*)"
        f'"{NVIDIA_RUNTIME}"/\\1"runc"/\' {CONTAINERD_CONFIG}'
    ),
}
CDI_GENERATE = (
    f"nvidia-ctk cdi generate --output={CDI_SPEC} "
    "--device-name-strategy=index --device-name-strategy=uuid"
)
DEFAULT_CHECK_IMAGE = "nvidia/cuda:12.8.1-base-ubuntu24.04"


@operation()
def engine_runtime(engine: str, set_as_default: bool = False, cdi: bool = True):
    """``engine``'s configuration has the nvidia runtime, is nvidia-by-default exactly when
    ``set_as_default``, and has CDI enabled when ``cdi``; nothing else in it changes.

    + engine: the container engine, ``docker`` or ``containerd`` (a key of ``ENGINE_CONFIGS``)
    + set_as_default: whether nvidia is the engine's default runtime; when False, a default
      of nvidia is reverted
    + cdi: whether the engine's configuration must have CDI enabled
    """
    path = ENGINE_CONFIGS[engine]
    state = host.get_fact(ContainerRuntimeConfig)[engine]
    if state["error"]:
        raise OperationError(
            f"{path}: {state['error']}; gpunode does not rewrite a configuration it cannot read, "
            "fix it by hand"
        )
    lacking = []
    if not state["nvidia_runtime"]:
        lacking.append("the nvidia runtime")
    if set_as_default and state["default_runtime"] != NVIDIA_RUNTIME:
        lacking.append("nvidia as default runtime")
    if cdi and not state["cdi_enabled"]:
        lacking.append("CDI enabled")
    revert_default = not set_as_default and state["default_runtime"] == NVIDIA_RUNTIME
    if not lacking and not revert_default:
        host.noop(f"{path} has the nvidia runtime as declared")
        return
    # Run even when only the revert is due: it rewrites the file in the layout the edit expects.
    flags = (" --set-as-default" if set_as_default else "") + (" --cdi.enabled" if cdi else "")
    yield f"nvidia-ctk runtime configure --runtime={engine}{flags}"
    if revert_default:
        yield REVERT_DEFAULT[engine]


@operation()
def engine_restarted(engine: str):
    """``engine`` runs with its current configuration (used with ``_if``: after a change).

    + engine: the container engine, ``docker`` or ``containerd``; when its service is not
      installed there is nothing to restart
    """
    if not host.get_fact(ContainerRuntimeConfig)["services"][engine]:
        host.noop(
            f"{engine}.service is not installed: {ENGINE_CONFIGS[engine]} is ready for when it is"
        )
        return
    yield f"systemctl restart {engine}.service"


def restart_needed(configured: Any, outdated: bool) -> Callable[[], bool]:
    """At execution: the configuration was changed now, or earlier without the restart."""
    return lambda: bool(configured.did_change()) or outdated


def cdi_spec_stale_reason(
    spec: dict[str, Any], gpus: dict[str, Any], toolkit_changing: bool
) -> str | None:
    """Why the CDI spec must be (re)generated, or None when it matches the GPUs and driver."""
    if not spec["present"]:
        return f"{CDI_SPEC} is missing"
    uuids = sorted(gpu["uuid"] for gpu in gpus["gpus"] if gpu.get("uuid"))
    if spec["uuids"] != uuids:
        return f"its GPUs {spec['uuids']} are not the host's {uuids}"
    driver = gpus.get("driver_version")
    if driver and spec["driver_version"] != driver:
        return f"it was made for driver {spec['driver_version']}, the loaded one is {driver}"
    if toolkit_changing:
        return "the Container Toolkit version changes"
    return None


@operation()
def cdi_spec(toolkit_changing: bool = False):
    """The CDI spec lists this host's GPUs (by index and UUID) for the loaded driver.

    + toolkit_changing: whether this run changes the Container Toolkit's version (the
      toolkit operation's ``will_change``): the spec is then generated again
    """
    config = host.get_fact(ContainerRuntimeConfig)
    if config["cdi_refresh_spec"]["present"]:
        # Left by a 1.18+ toolkit this node had: nothing refreshes it any more, and a second
        # spec for the same devices can disagree with this one.
        yield f"rm -f {CDI_REFRESH_SPEC}"
    gpus = host.get_fact(GpuDevices)
    if gpus["state"] != "ok":
        host.noop(f"CDI spec not generated: {gpus['reason']}")
        return
    spec = config["cdi_spec"]
    reason = cdi_spec_stale_reason(spec, gpus, toolkit_changing)
    if reason is None:
        host.noop(
            f"{CDI_SPEC} lists the {len(gpus['gpus'])} GPUs of driver {spec['driver_version']}"
        )
        return
    yield CDI_GENERATE


CDI_REFRESH_SERVICE = "nvidia-cdi-refresh.service"


@operation()
def cdi_refresh(toolkit_changing: bool = False):
    """The toolkit's own CDI spec (Container Toolkit 1.18 and later) is kept by its enabled
    refresh units, lists this host's GPUs for the loaded driver, and is the only spec.

    + toolkit_changing: whether this run changes the Container Toolkit's version: the refresh
      service then runs again
    """
    config = host.get_fact(ContainerRuntimeConfig)
    if config["cdi_spec"]["present"]:
        # gpunode wrote it for a toolkit before 1.18; the toolkit's own one replaces it.
        yield f"rm -f {CDI_SPEC}"
    enabled = host.get_fact(SystemdEnabled, services=list(CDI_REFRESH_UNITS))
    disabled = [unit for unit in CDI_REFRESH_UNITS if not enabled.get(unit)]
    if disabled:
        yield f"systemctl enable {' '.join(disabled)}"
    gpus = host.get_fact(GpuDevices)
    if gpus["state"] != "ok":
        host.noop(f"CDI spec not checked: {gpus['reason']}")
        return
    reason = cdi_spec_stale_reason(config["cdi_refresh_spec"], gpus, toolkit_changing)
    if reason is not None:
        yield f"systemctl restart {CDI_REFRESH_SERVICE}"
    elif not disabled and not config["cdi_spec"]["present"]:
        host.noop(
            f"{CDI_REFRESH_SPEC} (nvidia-cdi-refresh) lists the {len(gpus['gpus'])} GPUs of "
            f"driver {config['cdi_refresh_spec']['driver_version']}"
        )


def toolkit_keeps_cdi(version: str | None) -> bool:
    """Whether the toolkit this run leaves installed keeps the CDI spec itself. apt is asked
    only for a first install without a pin: what it installs is then its newest."""
    installed = host.get_fact(ContainerRuntimeConfig)["nvidia_ctk_version"]
    if version or installed:
        return toolkit_keeps_cdi_spec(version, installed)
    policy = host.get_fact(AptPackagePolicy, packages=[TOOLKIT_PACKAGES[0]])
    newest = (policy["packages"].get(TOOLKIT_PACKAGES[0]) or {}).get("candidate")
    return toolkit_keeps_cdi_spec(newest, None)


@deploy("NVIDIA Container Toolkit")
def container_toolkit(desired: DesiredState) -> None:
    runtime = desired.container_runtime
    if not runtime.engines and runtime.toolkit_version is None:
        host.noop(
            "no container engine and no toolkit version declared: Container Toolkit not managed"
        )
        return
    url = desired.apt.container_toolkit_repo_url
    require_offered(list(TOOLKIT_PACKAGES), url, version=runtime.toolkit_version)
    toolkit = held_packages(
        name=f"NVIDIA Container Toolkit {runtime.toolkit_version or '(unpinned)'}, held",
        packages=list(TOOLKIT_PACKAGES),
        repository_url=url,
        version=runtime.toolkit_version,
    )
    for engine in runtime.engines:
        configured = engine_runtime(
            name=f"{engine}: nvidia runtime in {ENGINE_CONFIGS[engine]}",
            engine=engine,
            set_as_default=runtime.set_as_default,
            cdi=runtime.cdi,
        )
        # Or still running an older configuration: a run cut off before the restart.
        outdated = host.get_fact(
            UnitOlderThanFile, unit=f"{engine}.service", path=ENGINE_CONFIGS[engine]
        )
        engine_restarted(
            name=f"{engine}: restarted after a configuration change",
            engine=engine,
            _if=restart_needed(configured, outdated),
        )
    if not runtime.cdi:
        return
    if toolkit_keeps_cdi(runtime.toolkit_version):
        cdi_refresh(
            name=f"CDI spec {CDI_REFRESH_SPEC} kept by nvidia-cdi-refresh",
            toolkit_changing=toolkit.will_change,
        )
    else:
        cdi_spec(name=f"CDI spec {CDI_SPEC}", toolkit_changing=toolkit.will_change)


# --- GPU container check (real hosts) ---------------------------------------------------------


def gpu_container_check_skip_reason(
    desired: DesiredState, runtime: dict[str, Any], gpus: dict[str, Any]
) -> str | None:
    """Why the GPU container check cannot run on this host, or None when it can."""
    if "docker" not in desired.container_runtime.engines:
        return "container_runtime.engines does not include docker"
    if not runtime["services"]["docker"]:
        return "docker.service is not installed on this host"
    if gpus["state"] != "ok":
        return f"no readable GPU: {gpus['reason']}"
    if not gpus["gpus"]:
        return "nvidia-smi reports no GPU"
    if not runtime["kernel_driver_loaded"]:
        return (
            "no NVIDIA kernel driver is loaded (/proc/driver/nvidia/version is absent): a "
            "container could not use the GPUs nvidia-smi reports"
        )
    return None


GPU_LINE = re.compile(r"^GPU \d+: .* \(UUID: (GPU-[0-9a-fA-F-]+)\)$")


def check_gpu_container(client: Any, image: str, expected_uuids: list[str]) -> list[str]:
    """Run ``nvidia-smi -L`` in ``image`` with every GPU requested; return the UUIDs it saw.

    ``client`` is a ``docker.DockerClient``. Raises RuntimeError when the container fails or
    sees other GPUs than ``expected_uuids``.
    """
    import docker

    request = docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])
    try:
        output = client.containers.run(
            image, ["nvidia-smi", "-L"], device_requests=[request], remove=True
        )
    except docker.errors.DockerException as error:
        raise RuntimeError(f"GPU container {image} failed: {error}") from error
    text = output.decode(errors="replace") if isinstance(output, bytes) else str(output)
    seen = sorted(
        match.group(1) for match in map(GPU_LINE.match, text.splitlines()) if match is not None
    )
    if seen != sorted(expected_uuids):
        raise RuntimeError(
            f"GPU container {image} sees GPUs {seen}, the host has {sorted(expected_uuids)}"
        )
    return seen


def docker_client_for(target: Any) -> Any:
    """A docker SDK client for ``target``'s engine over SSH (``docker system dial-stdio``).

    It uses the operator's ssh client and configuration (keys, known hosts) for the host; the
    login user needs access to the docker socket.
    """
    import docker

    user = target.data.get("ssh_user")
    port = target.data.get("ssh_port") or 22
    address = target.data.get("ssh_hostname") or target.name
    login = f"{user}@{address}" if user else address
    return docker.DockerClient(base_url=f"ssh://{login}:{port}", use_ssh_client=True)


def _run_check(image: str, expected_uuids: list[str]) -> None:
    check_gpu_container(docker_client_for(host), image, expected_uuids)


@deploy("GPU container check")
def gpu_container_check(desired: DesiredState, image: str = DEFAULT_CHECK_IMAGE) -> None:
    """A CUDA container started through docker with GPUs requested sees every GPU of the host;
    skipped, with the reason, where there is no docker engine or no real GPU."""
    runtime = host.get_fact(ContainerRuntimeConfig)
    gpus = host.get_fact(GpuDevices)
    reason = gpu_container_check_skip_reason(desired, runtime, gpus)
    if reason is not None:
        host.noop(f"GPU container check skipped: {reason}")
        return
    python.call(
        name=f"GPU container check ({image})",
        function=_run_check,
        image=image,
        expected_uuids=[gpu["uuid"] for gpu in gpus["gpus"]],
    )

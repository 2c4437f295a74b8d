"""Container Toolkit role: runtime configuration facts in, nvidia-ctk commands (or no-ops) out."""

from __future__ import annotations

import base64
import json
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import OperationError
from pyinfra.facts.systemd import SystemdEnabled

from facts.container_runtime import (
    ContainerRuntimeConfig,
    parse_cdi_spec,
    parse_containerd_config,
    parse_docker_config,
)
from facts.gpu import GpuDevices
from gpunode import framing
from gpunode.expected.packages import toolkit_keeps_cdi_spec
from gpunode.model import build_desired_state
from lab.standin import nvidia_ctk
from roles.container_toolkit import (
    CDI_GENERATE,
    REVERT_DEFAULT,
    cdi_refresh,
    cdi_spec,
    check_gpu_container,
    engine_restarted,
    engine_runtime,
    gpu_container_check_skip_reason,
)

from .fakehost import commands_of

UUIDS = ["GPU-11111111-2222-3333-4444-555555555555", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"]
DRIVER = "550.127.08"
OTHER_SETTINGS = {
    "log-driver": "json-file",
    "data-root": "/raid/docker",
    "default-address-pools": [{"base": "172.30.0.0/16", "size": 24}],
}
RUNTIME = "nvidia-container-runtime"


def docker_json(config: dict[str, Any], set_default: bool = False, cdi: bool = False) -> str:
    """daemon.json as nvidia-ctk writes it (the lab stand-in reproduces its format)."""
    return nvidia_ctk._merge_docker(json.dumps(config), "nvidia", RUNTIME, set_default, cdi)


def containerd_toml(text: str, set_default: bool = False, cdi: bool = False) -> str:
    path = "/usr/bin/nvidia-container-runtime"
    return nvidia_ctk._merge_containerd(text, "nvidia", path, set_default, cdi)


def spec_yaml(uuids: list[str], driver: str = DRIVER) -> str:
    return nvidia_ctk.to_yaml(nvidia_ctk.cdi_spec(list(enumerate(uuids)), driver))


# --- facts -----------------------------------------------------------------------------------


def test_docker_config_parsing() -> None:
    assert parse_docker_config(None)["present"] is False
    assert parse_docker_config("")["present"] is True
    plain = parse_docker_config(json.dumps(OTHER_SETTINGS))
    assert (plain["nvidia_runtime"], plain["default_runtime"], plain["cdi_enabled"]) == (
        False,
        None,
        False,
    )
    configured = parse_docker_config(docker_json(OTHER_SETTINGS, set_default=True, cdi=True))
    assert configured == {
        "present": True,
        "error": None,
        "nvidia_runtime": True,
        "default_runtime": "nvidia",
        "cdi_enabled": True,
    }
    absolute = {"runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime"}}}
    assert parse_docker_config(json.dumps(absolute))["nvidia_runtime"] is True
    other = {"runtimes": {"nvidia": {"path": "/usr/bin/runc"}}}
    assert parse_docker_config(json.dumps(other))["nvidia_runtime"] is False


@pytest.mark.parametrize(("text", "error"), [("{", "not valid JSON"), ("[]", "not a JSON object")])
def test_unreadable_docker_config_is_an_error(text: str, error: str) -> None:
    assert error in parse_docker_config(text)["error"]


CONTAINERD_V2 = """\
version = 2
# site settings
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true
"""


def test_containerd_config_parsing() -> None:
    assert parse_containerd_config(CONTAINERD_V2)["nvidia_runtime"] is False
    configured = parse_containerd_config(containerd_toml(CONTAINERD_V2, True, True))
    assert configured["nvidia_runtime"] is True
    assert configured["default_runtime"] == "nvidia"
    assert configured["cdi_enabled"] is True
    v3 = parse_containerd_config(containerd_toml("version = 3\n"))
    assert (v3["nvidia_runtime"], v3["cdi_enabled"]) == (True, False)
    v1 = (
        "[plugins.cri.containerd.runtimes.nvidia.options]\n"
        'BinaryName = "/usr/bin/nvidia-container-runtime"\n'
    )
    assert parse_containerd_config(v1)["nvidia_runtime"] is True
    assert "not valid TOML" in parse_containerd_config("version = = 2")["error"]
    assert "version 9" in parse_containerd_config("version = 9\n")["error"]


def test_cdi_spec_parsing() -> None:
    assert parse_cdi_spec(None) == {"present": False, "uuids": [], "driver_version": None}
    parsed = parse_cdi_spec(spec_yaml(list(reversed(UUIDS))))
    assert parsed == {"present": True, "uuids": UUIDS, "driver_version": DRIVER}


def test_runtime_fact_decodes_every_file() -> None:
    def line(path: str, text: str) -> str:
        return f"file {path} {base64.b64encode(text.encode()).decode()}"

    output = [
        line("/etc/docker/daemon.json", docker_json(OTHER_SETTINGS)),
        "file /etc/containerd/config.toml -",
        line("/etc/cdi/nvidia.yaml", spec_yaml(UUIDS)),
        line("/var/run/cdi/nvidia.yaml", spec_yaml(UUIDS[:1])),
        "service docker yes",
        "service containerd no",
        "nvidia-ctk NVIDIA Container Toolkit CLI version 1.17.4",
        "kernel-driver no",
    ]
    fact = ContainerRuntimeConfig().process(framing.output_of({"runtime": output}))
    assert fact["docker"]["nvidia_runtime"] is True
    assert fact["containerd"]["present"] is False
    assert fact["cdi_spec"]["uuids"] == UUIDS
    assert fact["cdi_refresh_spec"]["uuids"] == UUIDS[:1]
    assert fact["services"] == {"docker": True, "containerd": False}
    assert fact["nvidia_ctk_version"] == "1.17.4"
    assert fact["kernel_driver_loaded"] is False


# --- engine configuration --------------------------------------------------------------------


def runtime_fact(
    docker: str | None = None,
    containerd: str | None = None,
    spec: str | None = None,
    services: tuple[str, ...] = (),
    kernel_driver: bool = False,
    refresh_spec: str | None = None,
    ctk_version: str | None = "1.17.4",
) -> dict[type, Any]:
    return {
        ContainerRuntimeConfig: {
            "docker": parse_docker_config(docker),
            "containerd": parse_containerd_config(containerd),
            "cdi_spec": parse_cdi_spec(spec),
            "cdi_refresh_spec": parse_cdi_spec(refresh_spec),
            "services": {"docker": "docker" in services, "containerd": "containerd" in services},
            "nvidia_ctk_version": ctk_version,
            "kernel_driver_loaded": kernel_driver,
        }
    }


def test_missing_runtime_is_configured_by_nvidia_ctk() -> None:
    commands, _ = commands_of(
        engine_runtime, runtime_fact(docker=json.dumps(OTHER_SETTINGS)), engine="docker"
    )
    assert commands == ["nvidia-ctk runtime configure --runtime=docker --cdi.enabled"]


def test_absent_config_file_is_configured_too() -> None:
    commands, _ = commands_of(
        engine_runtime, runtime_fact(), engine="containerd", set_as_default=True, cdi=False
    )
    assert commands == ["nvidia-ctk runtime configure --runtime=containerd --set-as-default"]


def test_configured_runtime_is_a_noop() -> None:
    facts = runtime_fact(docker=docker_json(OTHER_SETTINGS, cdi=True))
    commands, noops = commands_of(engine_runtime, facts, engine="docker")
    assert commands == []
    assert noops == ["/etc/docker/daemon.json has the nvidia runtime as declared"]


def test_default_runtime_asked_for_later_is_added() -> None:
    facts = runtime_fact(containerd=containerd_toml(CONTAINERD_V2, cdi=True))
    commands, _ = commands_of(engine_runtime, facts, engine="containerd", set_as_default=True)
    assert commands == [
        "nvidia-ctk runtime configure --runtime=containerd --set-as-default --cdi.enabled"
    ]


def test_default_runtime_no_longer_asked_for_is_reverted() -> None:
    facts = runtime_fact(docker=docker_json(OTHER_SETTINGS, set_default=True, cdi=True))
    commands, _ = commands_of(engine_runtime, facts, engine="docker", set_as_default=False)
    assert commands == [
        "nvidia-ctk runtime configure --runtime=docker --cdi.enabled",
        REVERT_DEFAULT["docker"],
    ]


def test_unparsable_config_is_never_rewritten() -> None:
    with pytest.raises(OperationError, match=r"/etc/docker/daemon\.json: not valid JSON"):
        commands_of(engine_runtime, runtime_fact(docker="{"), engine="docker")


def run_sed(command: str, path: Path, text: str) -> str:
    """A revert command with its config path pointed at ``path``."""
    path.write_text(text)
    local = command.replace("/etc/docker/daemon.json", str(path)).replace(
        "/etc/containerd/config.toml", str(path)
    )
    subprocess.run(["sh", "-c", local], check=True)
    return path.read_text()


def test_docker_revert_drops_only_the_default_runtime(tmp_path: Path) -> None:
    written = docker_json(OTHER_SETTINGS, set_default=True, cdi=True)
    reverted = json.loads(run_sed(REVERT_DEFAULT["docker"], tmp_path / "daemon.json", written))
    expected = json.loads(written)
    del expected["default-runtime"]
    assert reverted == expected
    assert reverted["data-root"] == "/raid/docker"


def test_containerd_revert_makes_runc_the_default_again(tmp_path: Path) -> None:
    written = containerd_toml(CONTAINERD_V2, set_default=True)
    text = run_sed(REVERT_DEFAULT["containerd"], tmp_path / "config.toml", written)
    cri = tomllib.loads(text)["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["containerd"]["default_runtime_name"] == "runc"
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    assert "# site settings" in text


def test_engine_restart_only_where_its_unit_exists() -> None:
    commands, _ = commands_of(engine_restarted, runtime_fact(services=("docker",)), engine="docker")
    assert commands == ["systemctl restart docker.service"]
    commands, noops = commands_of(engine_restarted, runtime_fact(), engine="containerd")
    assert commands == []
    assert noops == [
        "containerd.service is not installed: /etc/containerd/config.toml is ready for when it is"
    ]


# --- CDI spec --------------------------------------------------------------------------------


def gpus_fact(uuids: list[str], driver: str = DRIVER) -> dict[type, Any]:
    gpus = [{"index": index, "uuid": uuid} for index, uuid in enumerate(uuids)]
    return {GpuDevices: {"state": "ok", "reason": "", "driver_version": driver, "gpus": gpus}}


def cdi_commands(
    spec: str | None, gpus: dict[type, Any], toolkit_changing: bool = False
) -> tuple[list[str], list[str]]:
    facts = {**runtime_fact(spec=spec), **gpus}
    return commands_of(cdi_spec, facts, toolkit_changing=toolkit_changing)


def test_missing_spec_is_generated_with_index_and_uuid_names() -> None:
    commands, _ = cdi_commands(None, gpus_fact(UUIDS))
    assert commands == [CDI_GENERATE]
    assert "--device-name-strategy=uuid" in CDI_GENERATE


def test_current_spec_is_a_noop() -> None:
    commands, noops = cdi_commands(spec_yaml(UUIDS), gpus_fact(UUIDS))
    assert commands == []
    assert noops == [f"/etc/cdi/nvidia.yaml lists the 2 GPUs of driver {DRIVER}"]


@pytest.mark.parametrize(
    ("gpus", "toolkit_changing"),
    [
        (gpus_fact(UUIDS[:1]), False),  # a GPU left
        (gpus_fact([*UUIDS, "GPU-99999999-2222-3333-4444-555555555555"]), False),  # one came
        (gpus_fact(UUIDS, driver="570.124.06"), False),  # another driver loaded
        (gpus_fact(UUIDS), True),  # the toolkit changes in this run
    ],
)
def test_stale_spec_is_regenerated(gpus: dict[type, Any], toolkit_changing: bool) -> None:
    commands, _ = cdi_commands(spec_yaml(UUIDS), gpus, toolkit_changing)
    assert commands == [CDI_GENERATE]


def test_a_spec_a_newer_toolkit_left_goes_when_the_fleet_is_on_117() -> None:
    facts = {**runtime_fact(spec=spec_yaml(UUIDS), refresh_spec=spec_yaml(UUIDS)),
             **gpus_fact(UUIDS)}  # fmt: skip
    commands, _ = commands_of(cdi_spec, facts)
    assert commands == ["rm -f /var/run/cdi/nvidia.yaml"]


def test_no_readable_gpu_skips_the_spec_with_the_reason() -> None:
    unreadable = {GpuDevices: {"state": "unreadable", "reason": "driver not loaded", "gpus": []}}
    commands, noops = cdi_commands(None, unreadable)
    assert commands == []
    assert noops == ["CDI spec not generated: driver not loaded"]


# --- CDI spec kept by the toolkit (1.18 and later) -----------------------------------------

REFRESH_UNITS = ("nvidia-cdi-refresh.path", "nvidia-cdi-refresh.service")


def refresh_commands(
    gpus: dict[type, Any],
    refresh_spec: str | None = None,
    old_spec: str | None = None,
    enabled: tuple[str, ...] = REFRESH_UNITS,
    toolkit_changing: bool = False,
) -> tuple[list[str], list[str]]:
    facts = {
        **runtime_fact(spec=old_spec, refresh_spec=refresh_spec, ctk_version="1.18.2"),
        **gpus,
        SystemdEnabled: {unit: unit in enabled for unit in REFRESH_UNITS},
    }
    return commands_of(cdi_refresh, facts, toolkit_changing=toolkit_changing)


def test_a_current_toolkit_spec_with_its_units_enabled_is_a_noop() -> None:
    commands, noops = refresh_commands(gpus_fact(UUIDS), refresh_spec=spec_yaml(UUIDS))
    assert commands == []
    assert noops == [
        f"/var/run/cdi/nvidia.yaml (nvidia-cdi-refresh) lists the 2 GPUs of driver {DRIVER}"
    ]


def test_the_spec_gpunode_wrote_for_an_older_toolkit_is_removed() -> None:
    commands, _ = refresh_commands(
        gpus_fact(UUIDS), refresh_spec=spec_yaml(UUIDS), old_spec=spec_yaml(UUIDS)
    )
    assert commands == ["rm -f /etc/cdi/nvidia.yaml"]


@pytest.mark.parametrize(
    ("refresh_spec", "gpus", "toolkit_changing"),
    [
        (None, gpus_fact(UUIDS), False),  # not written (yet)
        (spec_yaml(UUIDS[:1]), gpus_fact(UUIDS), False),  # a GPU came
        (spec_yaml(UUIDS), gpus_fact(UUIDS, driver="580.95.05"), False),  # new driver loaded
        (spec_yaml(UUIDS), gpus_fact(UUIDS), True),  # the toolkit changes in this run
    ],
)
def test_a_stale_toolkit_spec_is_refreshed_by_its_own_service(
    refresh_spec: str | None, gpus: dict[type, Any], toolkit_changing: bool
) -> None:
    commands, _ = refresh_commands(gpus, refresh_spec, toolkit_changing=toolkit_changing)
    assert commands == ["systemctl restart nvidia-cdi-refresh.service"]
    assert not any("nvidia-ctk cdi generate" in command for command in commands)


def test_disabled_refresh_units_are_enabled_again() -> None:
    commands, _ = refresh_commands(
        gpus_fact(UUIDS), refresh_spec=spec_yaml(UUIDS), enabled=("nvidia-cdi-refresh.service",)
    )
    assert commands == ["systemctl enable nvidia-cdi-refresh.path"]


def test_which_toolkit_keeps_its_own_spec() -> None:
    assert toolkit_keeps_cdi_spec("1.18.0-1", None)
    assert toolkit_keeps_cdi_spec("1.20.1-1", "1.17.4")  # the pin decides
    assert not toolkit_keeps_cdi_spec("1.17.8-1", "1.18.2")
    assert toolkit_keeps_cdi_spec(None, "1.19.1")
    assert not toolkit_keeps_cdi_spec(None, "1.17.4")


# --- GPU container check ---------------------------------------------------------------------


def desired(engines: list[str]) -> Any:
    state, problems = build_desired_state({"container_runtime": {"engines": engines}})
    assert problems == []
    return state


def check_reason(engines: list[str], **runtime: Any) -> str | None:
    facts = runtime_fact(**runtime)[ContainerRuntimeConfig]
    return gpu_container_check_skip_reason(desired(engines), facts, gpus_fact(UUIDS)[GpuDevices])


def test_gpu_container_check_skip_reasons() -> None:
    assert check_reason(["containerd"]) == "container_runtime.engines does not include docker"
    assert check_reason(["docker"]) == "docker.service is not installed on this host"
    simulated = check_reason(["docker"], services=("docker",))
    assert simulated is not None and "no NVIDIA kernel driver is loaded" in simulated
    assert check_reason(["docker"], services=("docker",), kernel_driver=True) is None
    facts = runtime_fact(services=("docker",), kernel_driver=True)[ContainerRuntimeConfig]
    no_gpu = {"state": "absent", "reason": "nvidia-smi is not installed", "gpus": []}
    assert gpu_container_check_skip_reason(desired(["docker"]), facts, no_gpu) == (
        "no readable GPU: nvidia-smi is not installed"
    )


class FakeContainers:
    def __init__(self, output: bytes | Exception) -> None:
        self.output = output
        self.calls: list[tuple[Any, ...]] = []

    def run(self, image: str, command: list[str], **options: Any) -> bytes:
        self.calls.append((image, command, options))
        if isinstance(self.output, Exception):
            raise self.output
        return self.output


class FakeClient:
    def __init__(self, output: bytes | Exception) -> None:
        self.containers = FakeContainers(output)


def listing(uuids: list[str]) -> bytes:
    lines = [f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: {uuid})" for i, uuid in enumerate(uuids)]
    return ("\n".join(lines) + "\n").encode()


def test_gpu_container_check_requests_every_gpu_and_compares_uuids() -> None:
    client = FakeClient(listing(UUIDS))
    assert check_gpu_container(client, "cuda:12.8", list(reversed(UUIDS))) == UUIDS
    image, command, options = client.containers.calls[0]
    assert (image, command) == ("cuda:12.8", ["nvidia-smi", "-L"])
    (request,) = options["device_requests"]
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]
    assert options["remove"] is True


def test_gpu_container_check_fails_on_missing_gpus_or_a_failed_container() -> None:
    import docker

    with pytest.raises(RuntimeError, match="sees GPUs"):
        check_gpu_container(FakeClient(listing(UUIDS[:1])), "cuda:12.8", UUIDS)
    failure = docker.errors.ContainerError(None, 1, "nvidia-smi -L", "cuda:12.8", b"no GPU")
    with pytest.raises(RuntimeError, match="failed"):
        check_gpu_container(FakeClient(failure), "cuda:12.8", UUIDS)

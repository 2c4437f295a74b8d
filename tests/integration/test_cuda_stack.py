"""deploys/cuda.py on lab nodes: CUDA toolkits, Container Toolkit and DCGM from the lab's mirror.

The module starts from nodes without any of the stack (its packages purged, engine configs
replaced by ones holding other settings), converges them, changes the data (pin, default runtime,
releases, exporter) and ends with the nodes converged to the base data again.

It makes that start itself, whatever ran before: an earlier converge of deploys/gpu_node.py
leaves the NVIDIA driver (purged here too: this deploy must be seen to install none of it, and
the module leaves the nodes without one, as test_nvidia_driver does) and gpunode's files for
DCGM's exporter (removed with its packages). The exporter serves with the node certificate,
which deploys/tls.py issues, not this deploy: the module converges it first, with the lab's
TLS settings, as deploys/harden.py would have.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tomllib
from typing import Any

import pytest

from lab import Lab, LabNode
from lab.standin import catalogue
from roles.dcgm import EXPORTER_CONFIG_DIR, EXPORTER_DROP_IN_DIR, EXPORTER_WEB_CONFIG_PATH
from roles.nvidia_driver import PREFERENCES_PATH

from .conftest import (
    PYINFRA,
    ROOT,
    PyinfraRun,
    cuda_path,
    lab_group_data,
    run_pyinfra,
    ssh,
    write_inventory,
)

pytestmark = pytest.mark.lab

DEPLOY = "deploys/cuda.py"
TOOLKIT_PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
# Everything the stack's roles install, by name prefix (the driver's packages are not among them).
STACK_PREFIXES = (
    "cuda-",
    "libnvidia-container",
    "nvidia-container-toolkit",
    "datacenter-gpu-manager",
    "dcgm-exporter",
    "libnccl",
)
# Every package of the lab's NVIDIA repositories, the driver's among them: none may be on a
# node when the module starts.
STANDIN_PACKAGES = tuple(sorted({package.name for package in catalogue()}))
DRIVER_PACKAGES = (
    "cuda",
    "cuda-drivers",
    "cuda-12-4",
    "cuda-12-8",
    "cuda-runtime-12-4",
    "cuda-runtime-12-8",
    "nvidia-driver",
    "nvidia-driver-cuda",
    "libcuda1",
    "nvidia-kernel-dkms",
    "nvidia-kernel-open-dkms",
    "nvidia-open",
)
DOCKER_SETTINGS = {
    "log-driver": "json-file",
    "log-opts": {"max-size": "10m"},
    "data-root": "/srv/docker",
    "default-address-pools": [{"base": "172.30.0.0/16", "size": 24}],
}
CONTAINERD_CONFIG = """\
version = 2
# Site setting that must survive: runc with the systemd cgroup driver.
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true
"""


def sudo(lab: Lab, node: LabNode, command: str) -> str:
    result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def stack_data(lab: Lab, **changes: Any) -> dict[str, Any]:
    """The lab's apt data (as inventories/group_data/lab.py) and the stack under test."""
    repo = lab.repo_base_url
    keyrings = lab.repo_dir / "keyrings"
    data: dict[str, Any] = {
        "apt": {
            "cuda_repo_url": f"{repo}/cuda/{{distro}}/{{arch}}",
            "container_toolkit_repo_url": f"{repo}/libnvidia-container/stable/deb/amd64",
            "cuda_keyring": str(keyrings / "cuda-archive-keyring.gpg"),
            "container_toolkit_keyring": str(keyrings / "nvidia-container-toolkit-keyring.gpg"),
        },
        "cuda": {"versions": ["12.4", "12.8"], "default": "12.8"},
        "container_runtime": {
            "engines": ["docker", "containerd"],
            "toolkit_version": "1.17.4-1",
            "cdi": True,
        },
        # DCGM 4 for the toolkits' CUDA 12, with its exporter (both unpinned: the newest pair),
        # which serves over TLS only: the lab's TLS settings, as its inventory has them.
        "dcgm": {"enabled": True, "exporter": True},
        "tls": lab_group_data("tls"),
        "nccl": {"install_libnccl": True},
    }
    for section, values in changes.items():
        data[section] = {**data[section], **values}
    return data


@pytest.fixture(scope="module")
def inventories(
    lab: Lab, lab_nodes: list[LabNode], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("cuda-stack")
    variants = {
        "base": stack_data(lab),
        "changed": stack_data(
            lab, container_runtime={"toolkit_version": "1.17.8-1", "set_as_default": True}
        ),
        "one_release": stack_data(lab, cuda={"versions": ["12.4"], "default": None}),
        # An exporter release the mirror does not carry.
        "exporter": stack_data(lab, dcgm={"exporter_version": "4.8.1-1"}),
        # Container Toolkit 1.18: the toolkit keeps the CDI spec itself.
        "cdi_refresh": stack_data(lab, container_runtime={"toolkit_version": "1.18.2-1"}),
    }
    return {
        name: write_inventory(
            directory / f"{name}.py",
            lab,
            lab_nodes,
            # Each node's certificate names its address, as inventories/lab.py has it.
            {
                node.name: {**data, "tls": {**data["tls"], "ip_addresses": [node.address]}}
                for node in lab_nodes
            },
        )
        for name, data in variants.items()
    }


def reset_node(lab: Lab, node: LabNode) -> None:
    """The node as before gpunode: no stack or driver packages (nor the driver's apt pin), no
    gpunode files for DCGM's exporter, no mirror lists, engine configs that hold other settings
    only."""
    standins = " ".join(STANDIN_PACKAGES)
    purge = (
        "pkgs=$({ dpkg-query -W -f='${db:Status-Abbrev}|${Package}\\n' | awk -F'|' '$1 !~ /^.n/ "
        f"{{print $2}}' | grep -E '^({'|'.join(STACK_PREFIXES)})'; "
        f"dpkg-query -W -f='${{db:Status-Abbrev}}|${{Package}}\\n' {standins} 2>/dev/null "
        "| awk -F'|' '$1 !~ /^.n/ {print $2}'; } | sort -u); "
        'if [ -n "$pkgs" ]; then apt-mark unhold $pkgs >/dev/null; '
        "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q $pkgs >/dev/null; fi; "
        "apt-get clean; "
        "rm -rf /etc/docker /etc/containerd /etc/cdi /var/lib/gpunode/cuda-toolkits "
        "/etc/profile.d/gpunode-cuda.sh /etc/ld.so.conf.d/gpunode-cuda.conf "
        f"{EXPORTER_DROP_IN_DIR} {EXPORTER_CONFIG_DIR} {PREFERENCES_PATH} "
        "/etc/apt/sources.list.d/gpunode-nvidia-*.sources "
        "/usr/share/keyrings/gpunode-nvidia-*.gpg; "
        "systemctl daemon-reload; "
        f"find /var/lib/apt/lists -name '{lab.gateway}*' -delete"
    )
    sudo(lab, node, purge)
    daemon_json = shlex.quote(json.dumps(DOCKER_SETTINGS, indent=2))
    sudo(
        lab,
        node,
        f"mkdir -p /etc/docker /etc/containerd && printf '%s\\n' {daemon_json} > "
        f"/etc/docker/daemon.json && printf %s {shlex.quote(CONTAINERD_CONFIG)} > "
        "/etc/containerd/config.toml",
    )


def changes(run: PyinfraRun) -> set[tuple[str, str]]:
    return {(name, host) for name, hosts in run.changed_operations().items() for host in hosts}


def predicted(dry: PyinfraRun, conditional: bool = False) -> set[tuple[str, str]]:
    assert dry.returncode == 0, dry.output
    assert dry.results is not None
    keys = ["hosts_with_change", *(["hosts_with_conditional_change"] if conditional else [])]
    return {(op["name"], host) for op in dry.results["plan"] for key in keys for host in op[key]}


def converge(inventory: str) -> PyinfraRun:
    run = run_pyinfra(DEPLOY, inventory=inventory)
    assert run.returncode == 0, run.output
    return run


def assert_no_changes(inventory: str) -> None:
    assert changes(converge(inventory)) == set()


@pytest.fixture(scope="module")
def first_run(lab: Lab, lab_nodes: list[LabNode], inventories: dict[str, str]) -> dict[str, Any]:
    for node in lab_nodes:
        reset_node(lab, node)
        state = dpkg_state(lab, node)
        left = [name for name in (*STANDIN_PACKAGES, *DRIVER_PACKAGES) if installed(state, name)]
        assert left == [], f"{node.name} still has {left}"
    # The node certificate DCGM's exporter serves with (deploys/harden.py's TLS, not this
    # deploy's): the lab's own, unchanged where an earlier module's run issued it already.
    tls = run_pyinfra("deploys/tls.py", inventory=inventories["base"])
    assert tls.returncode == 0, tls.output
    log_offset = lab.repo_dir.with_name("aptrepo-requests.log").stat().st_size
    dry = run_pyinfra("--dry", DEPLOY, inventory=inventories["base"])
    real = converge(inventories["base"])
    return {"dry": dry, "real": real, "log_offset": log_offset}


def test_dry_run_on_fresh_nodes_predicts_the_first_converge(first_run: dict[str, Any]) -> None:
    # Conditional operations here (apt update, ldconfig) fire because what they follow changed.
    real = changes(first_run["real"])
    assert real == predicted(first_run["dry"], conditional=True)
    assert predicted(first_run["dry"]) <= real


def dpkg_state(lab: Lab, node: LabNode) -> dict[str, tuple[str, str]]:
    """package -> (dpkg status abbreviation, version) for every package dpkg knows."""
    output = sudo(lab, node, "dpkg-query -W -f='${db:Status-Abbrev}|${Package}|${Version}\\n'")
    state = {}
    for line in output.splitlines():
        status, name, version = line.split("|")
        state[name] = (status.strip(), version)
    return state


def installed(state: dict[str, tuple[str, str]], name: str) -> str | None:
    status, version = state.get(name, ("un", ""))
    return version if status[1:2] == "i" else None


def test_cuda_releases_side_by_side_with_the_default_on_login_path(
    lab: Lab, lab_nodes: list[LabNode], first_run: dict[str, Any]
) -> None:
    for node in lab_nodes:
        state = dpkg_state(lab, node)
        for package in ("cuda-toolkit-12-4", "cuda-toolkit-12-8"):
            assert installed(state, package), package
            assert state[package][0] == "hi", f"{package} is not held"
        login = ssh(lab, node, "bash -lc 'command -v nvcc; nvcc --version'")
        assert login.returncode == 0, login.stderr
        assert login.stdout.splitlines()[0] == "/usr/local/cuda/bin/nvcc"
        assert "Cuda compilation tools, release 12.8" in login.stdout
        query = sudo(lab, node, "update-alternatives --query cuda")
        assert "Status: manual" in query and "Value: /usr/local/cuda-12.8" in query
        assert sudo(lab, node, "readlink -f /usr/local/cuda").strip() == "/usr/local/cuda-12.8"
        ld_conf = sudo(lab, node, "cat /etc/ld.so.conf.d/gpunode-cuda.conf")
        assert "/usr/local/cuda/targets/x86_64-linux/lib" in ld_conf.splitlines()


def test_no_driver_package_was_installed(
    lab: Lab, lab_nodes: list[LabNode], first_run: dict[str, Any]
) -> None:
    for node in lab_nodes:
        state = dpkg_state(lab, node)
        assert [name for name in DRIVER_PACKAGES if installed(state, name)] == []


def test_container_toolkit_pinned_and_held(
    lab: Lab, lab_nodes: list[LabNode], first_run: dict[str, Any]
) -> None:
    for node in lab_nodes:
        state = dpkg_state(lab, node)
        assert {name: state[name] for name in TOOLKIT_PACKAGES} == dict.fromkeys(
            TOOLKIT_PACKAGES, ("hi", "1.17.4-1")
        )


def docker_config(lab: Lab, node: LabNode) -> dict[str, Any]:
    return json.loads(sudo(lab, node, "cat /etc/docker/daemon.json"))


def containerd_config(lab: Lab, node: LabNode) -> tuple[str, dict[str, Any]]:
    text = sudo(lab, node, "cat /etc/containerd/config.toml")
    return text, tomllib.loads(text)


def test_engine_configs_gain_the_nvidia_runtime_and_keep_every_other_setting(
    lab: Lab, lab_nodes: list[LabNode], first_run: dict[str, Any]
) -> None:
    for node in lab_nodes:
        docker = docker_config(lab, node)
        assert {key: docker[key] for key in DOCKER_SETTINGS} == DOCKER_SETTINGS
        assert docker["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
        assert docker["features"] == {"cdi": True}
        assert "default-runtime" not in docker
        text, containerd = containerd_config(lab, node)
        cri = containerd["plugins"]["io.containerd.grpc.v1.cri"]
        runtimes = cri["containerd"]["runtimes"]
        assert runtimes["runc"]["options"] == {"SystemdCgroup": True}
        assert runtimes["nvidia"]["options"] == {
            "SystemdCgroup": True,
            "BinaryName": "/usr/bin/nvidia-container-runtime",
        }
        assert cri["enable_cdi"] is True
        assert "default_runtime_name" not in cri["containerd"]
        assert "# Site setting that must survive" in text


def simulator_uuids(lab: Lab, node: LabNode) -> list[str]:
    listing = ssh(lab, node, "nvidia-smi -L").stdout
    return sorted(line.split("UUID: ")[1].rstrip(")") for line in listing.splitlines())


def spec_uuids(lab: Lab, node: LabNode) -> list[str]:
    listed = sudo(lab, node, "nvidia-ctk cdi list 2>/dev/null").split()
    return sorted(name.split("=", 1)[1] for name in listed if "=GPU-" in name)


def test_cdi_spec_lists_the_simulators_gpus(
    lab: Lab, lab_nodes: list[LabNode], first_run: dict[str, Any]
) -> None:
    for node in lab_nodes:
        uuids = simulator_uuids(lab, node)
        assert len(uuids) >= 1
        assert spec_uuids(lab, node) == uuids


def test_dcgm_installed_and_running(
    lab: Lab, lab_nodes: list[LabNode], first_run: dict[str, Any]
) -> None:
    for node in lab_nodes:
        state = dpkg_state(lab, node)
        for name in ("datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda12"):
            assert state[name] == ("hi", "1:4.6.0-1")
        assert (
            "datacenter-gpu-manager" not in state
            or installed(state, "datacenter-gpu-manager") is None
        )
        # The exporter release NVIDIA pairs with DCGM 4.6.0.
        assert state["datacenter-gpu-manager-exporter"] == ("hi", "4.8.3-1")
        for unit in ("nvidia-dcgm", "nvidia-dcgm-exporter"):
            assert sudo(lab, node, f"systemctl is-active {unit}").strip() == "active"
            assert sudo(lab, node, f"systemctl is-enabled {unit}").strip() == "enabled"
        discovery = sudo(lab, node, "dcgmi discovery -l")
        assert f"{len(simulator_uuids(lab, node))} GPUs found." in discovery
        # It serves only over mutual TLS (its metrics, scraped with a client certificate from
        # gpunode's CA, are test_monitoring's): listening on 9400, run with gpunode's web
        # configuration, and nothing served in the clear.
        command = sudo(lab, node, "systemctl show -p ExecStart nvidia-dcgm-exporter")
        assert f"--web-config-file={EXPORTER_WEB_CONFIG_PATH}" in command, command
        assert ":9400 " in sudo(lab, node, "ss -Hltn 'sport = :9400'")
        clear = ssh(
            lab,
            node,
            'python3 -c "import urllib.request; '
            "urllib.request.urlopen('http://127.0.0.1:9400/metrics', timeout=10)\"",
        )
        assert clear.returncode != 0 and "DCGM_FI_DEV_" not in clear.stdout, clear.stdout


def test_libnccl2_is_the_newest_build_for_the_default_release(
    lab: Lab, lab_nodes: list[LabNode], first_run: dict[str, Any]
) -> None:
    for node in lab_nodes:
        assert dpkg_state(lab, node)["libnccl2"] == ("hi", "2.26.2-1+cuda12.8")


def installed_origins(policy: str) -> set[str]:
    """The sources of each package's installed version (``***``) in ``apt-cache policy``
    output. Debian may offer another version of a name too (trixie's contrib has libnccl2
    2.22.3): what is offered is not what was installed."""
    origins, current = set(), False
    for line in policy.splitlines():
        if line.startswith(" " * 8):
            if current:
                origins.add(line.split()[1])
        elif line.startswith("     ") or line.startswith(" *** "):
            current = line.startswith(" *** ")
    return origins


def test_everything_came_from_the_mirror(
    lab: Lab, lab_nodes: list[LabNode], first_run: dict[str, Any]
) -> None:
    with lab.repo_dir.with_name("aptrepo-requests.log").open(encoding="utf-8") as log:
        log.seek(first_run["log_offset"])
        requests = [line.split() for line in log]
    fetched = {(fields[1], fields[3].rsplit("/", 1)[-1].split("_")[0]) for fields in requests}
    mirror = lab.repo_base_url
    for node in lab_nodes:
        state = dpkg_state(lab, node)
        ours = [
            name for name in state if installed(state, name) and name.startswith(STACK_PREFIXES)
        ]
        assert len(ours) >= 15
        assert [name for name in ours if (node.address, name) not in fetched] == []
        policy = sudo(lab, node, "LC_ALL=C apt-cache policy " + " ".join(ours))
        origins = installed_origins(policy)
        assert {origin for origin in origins if "://" in origin} == {
            f"{mirror}/{cuda_path(node)}",
            f"{mirror}/libnvidia-container/stable/deb/amd64",
        }
        nvidia_hosts = ssh(lab, node, "grep -rli 'nvidia.com' /etc/apt")
        assert nvidia_hosts.returncode == 1, nvidia_hosts.stdout


def test_second_run_changes_nothing(inventories: dict[str, str], first_run: dict[str, Any]) -> None:
    assert_no_changes(inventories["base"])


def test_pin_change_upgrades_and_holds_again_and_dry_run_predicts_it(
    lab: Lab, lab_nodes: list[LabNode], inventories: dict[str, str], first_run: dict[str, Any]
) -> None:
    dry = run_pyinfra("--dry", DEPLOY, inventory=inventories["changed"])
    expected = predicted(dry)  # conditional ones (apt update, ldconfig) have nothing to follow
    toolkit = "NVIDIA Container Toolkit | "
    assert {name for name, _ in expected} == {
        toolkit + "NVIDIA Container Toolkit 1.17.8-1, held",
        toolkit + "docker: nvidia runtime in /etc/docker/daemon.json",
        toolkit + "containerd: nvidia runtime in /etc/containerd/config.toml",
        toolkit + "CDI spec /etc/cdi/nvidia.yaml",  # the toolkit version changes
    }
    assert changes(converge(inventories["changed"])) == expected
    for node in lab_nodes:
        state = dpkg_state(lab, node)
        assert {name: state[name] for name in TOOLKIT_PACKAGES} == dict.fromkeys(
            TOOLKIT_PACKAGES, ("hi", "1.17.8-1")
        )
        docker = docker_config(lab, node)
        assert docker["default-runtime"] == "nvidia"
        assert {key: docker[key] for key in DOCKER_SETTINGS} == DOCKER_SETTINGS
        _, containerd = containerd_config(lab, node)
        cri = containerd["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
        assert cri["default_runtime_name"] == "nvidia"
    assert_no_changes(inventories["changed"])

    # Back to the base data: the pin goes down again, nvidia stops being the default.
    converge(inventories["base"])
    for node in lab_nodes:
        state = dpkg_state(lab, node)
        assert {name: state[name] for name in TOOLKIT_PACKAGES} == dict.fromkeys(
            TOOLKIT_PACKAGES, ("hi", "1.17.4-1")
        )
        docker = docker_config(lab, node)
        assert "default-runtime" not in docker
        assert {key: docker[key] for key in DOCKER_SETTINGS} == DOCKER_SETTINGS
        _, containerd = containerd_config(lab, node)
        cri = containerd["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
        assert cri["default_runtime_name"] == "runc"
    assert_no_changes(inventories["base"])


def test_release_dropped_from_data_is_removed_and_the_default_follows(
    lab: Lab, lab_nodes: list[LabNode], inventories: dict[str, str], first_run: dict[str, Any]
) -> None:
    converge(inventories["one_release"])
    for node in lab_nodes:
        state = dpkg_state(lab, node)
        assert installed(state, "cuda-toolkit-12-4")
        leftovers = [name for name in state if installed(state, name) and "12-8" in name]
        assert leftovers == []
        login = ssh(lab, node, "bash -lc 'nvcc --version'")
        assert "release 12.4" in login.stdout, login.stdout + login.stderr
        assert state["libnccl2"] == ("hi", "2.21.5-1+cuda12.4")
    assert_no_changes(inventories["one_release"])
    converge(inventories["base"])
    for node in lab_nodes:
        login = ssh(lab, node, "bash -lc 'nvcc --version'")
        assert "release 12.8" in login.stdout
    assert_no_changes(inventories["base"])


def test_cdi_spec_follows_the_gpu_set(
    lab: Lab, lab_nodes: list[LabNode], inventories: dict[str, str], first_run: dict[str, Any]
) -> None:
    node = lab_nodes[0]
    before = simulator_uuids(lab, node)
    sudo(lab, node, "gpunode-lab-hw set gpus.1.present false")
    try:
        after = simulator_uuids(lab, node)
        assert len(after) == len(before) - 1
        run = converge(inventories["base"])
        assert changes(run) == {
            ("NVIDIA Container Toolkit | CDI spec /etc/cdi/nvidia.yaml", node.name)
        }
        assert spec_uuids(lab, node) == after
    finally:
        sudo(lab, node, "gpunode-lab-hw set gpus.1.present true")
    converge(inventories["base"])
    assert spec_uuids(lab, node) == before
    assert_no_changes(inventories["base"])


def test_missing_exporter_is_refused_before_any_change(
    lab: Lab, lab_nodes: list[LabNode], inventories: dict[str, str], first_run: dict[str, Any]
) -> None:
    refused = run_pyinfra(DEPLOY, inventory=inventories["exporter"])
    assert refused.returncode != 0
    for node in lab_nodes:
        url = f"{lab.repo_base_url}/{cuda_path(node)}"
        assert f"datacenter-gpu-manager-exporter 4.8.1-1 is not offered by {url}" in refused.output
    assert "Nothing was changed" in refused.output
    assert_no_changes(inventories["base"])


def test_toolkit_118_keeps_the_cdi_spec_itself_and_gpunodes_own_goes(
    lab: Lab, lab_nodes: list[LabNode], inventories: dict[str, str], first_run: dict[str, Any]
) -> None:
    try:
        converge(inventories["cdi_refresh"])
        for node in lab_nodes:
            assert dpkg_state(lab, node)["nvidia-container-toolkit-base"] == ("hi", "1.18.2-1")
            assert sudo(lab, node, "test -e /etc/cdi/nvidia.yaml || echo gone").strip() == "gone"
            spec = sudo(lab, node, "cat /var/run/cdi/nvidia.yaml")
            assert all(uuid in spec for uuid in simulator_uuids(lab, node))
            for unit in ("nvidia-cdi-refresh.path", "nvidia-cdi-refresh.service"):
                assert sudo(lab, node, f"systemctl is-enabled {unit}").strip() == "enabled"
        assert_no_changes(inventories["cdi_refresh"])
    finally:
        # Back to the module's 1.17 stack: gpunode writes its own spec again.
        converge(inventories["base"])
    for node in lab_nodes:
        assert spec_uuids(lab, node) == simulator_uuids(lab, node)


def test_gpu_container_check_is_skipped_with_its_reason_on_lab_nodes(
    lab_nodes: list[LabNode], inventories: dict[str, str], first_run: dict[str, Any]
) -> None:
    result = subprocess.run(
        [PYINFRA, "-y", "-v", inventories["base"], DEPLOY],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "GPUNODE_GPU_CONTAINER_CHECK": "1"},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for node in lab_nodes:
        assert (
            f"[{node.name}] noop: GPU container check skipped: docker.service is not installed "
            "on this host" in output
        ), output
    assert_no_changes(inventories["base"])

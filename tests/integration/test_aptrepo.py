"""The lab's signed apt repositories, served from the lab host and used by apt on a lab node.

A node gets both sources with ``signed-by=`` keyrings, as production nodes get NVIDIA's; apt
verifies the signatures, resolves the real dependency structure and installs stand-ins whose
scripts behave (nvidia-ctk edits daemon.json, the driver records what a reboot would load, the
GPU simulator keeps /usr/bin/nvidia-smi). The module leaves the node exactly as it found it,
which its teardown checks.
"""

from __future__ import annotations

import base64
import difflib
import json
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from lab import DEFAULT_PROFILES, Lab, LabNode, aptrepo
from lab.standin import CONTAINER_TOOLKIT_VERSIONS, DRIVER_VERSIONS, catalogue
from tests.integration.conftest import LAB_RELEASES, ssh

# A lab of its own, none of the shared lab's nodes (tests/tiers.py: own_lab).
pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

KEYRING_DIR = "/usr/share/keyrings"
SOURCES_DIR = "/etc/apt/sources.list.d"
PREFERENCES = "/etc/apt/preferences.d/gpunode-lab-test-driver"
SIMULATOR_LOCK = "/var/lib/gpunode-lab/hardware.json.lock"
APT = "DEBIAN_FRONTEND=noninteractive apt-get -y -q -o Dpkg::Use-Pty=0"
TOOLKIT_PACKAGES = (
    "nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
    "libnvidia-container1",
)  # fmt: skip
DAEMON_JSON = {
    "data-root": "/srv/docker",
    "log-driver": "journald",
    "log-opts": {"max-size": "10m"},
    "runtimes": {"crun": {"path": "/usr/bin/crun"}},
}
# What the module must leave as it found it, printed in one go (the simulator's bytecode
# caches, written when it first runs as root, are not this module's doing).
SNAPSHOT = r"""
dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\n' | awk '$1 !~ /^.n/' | sort
dpkg-divert --list | sort
sha256sum /usr/bin/nvidia-smi /var/lib/gpunode-lab/hardware.json
find /etc /usr/share/keyrings /usr/local /usr/src /usr/bin /lib/systemd/system /lib/firmware \
     /var/lib/gpunode-lab /var/lib/apt/lists /var/cache/apt/archives \
     /var/lib/systemd/deb-systemd-helper-enabled -xdev 2>/dev/null \
  | grep -v -e /__pycache__ -e /var/lib/gpunode-lab/answers | sort
"""
# /var/lib/gpunode-lab/answers: the hardware doubles' replayed answers, a cache of the lab's
# own (lab/hwsim), not node state a test leaves behind.


def run(lab: Lab, node: LabNode, command: str) -> str:
    """A root shell command on the node; fails the test with its output if it fails."""
    result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def attempt(lab: Lab, node: LabNode, command: str) -> tuple[int, str]:
    result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
    return result.returncode, result.stdout + result.stderr


def update(lab: Lab, node: LabNode, sources_file: str) -> tuple[int, str]:
    """``apt-get update`` of one sources file only: the Debian mirror is not needed here."""
    return attempt(
        lab,
        node,
        f"apt-get update -o Dir::Etc::SourceList={sources_file} -o Dir::Etc::SourceParts=- "
        "-o APT::Get::List-Cleanup=0",
    )


def installed_version(lab: Lab, node: LabNode, package: str) -> str:
    _, output = attempt(
        lab, node, f"dpkg-query -W -f='${{db:Status-Abbrev}}${{Version}}' {package}"
    )
    return output[3:] if output.startswith("ii ") else ""


def pin_driver(lab: Lab, node: LabNode, version: str) -> None:
    """Pin every driver package to one release, as a role must (metapackages need only >=)."""
    preferences = (
        "Package: nvidia-* libnvidia-* libcuda1 firmware-nvidia-gsp cuda-drivers*\n"
        f"Pin: version {version}-1\nPin-Priority: 1001\n"
    )
    run(lab, node, f"printf %s {shlex.quote(preferences)} > {PREFERENCES}")


def install_toolkit(lab: Lab, node: LabNode, version: str) -> None:
    """The four toolkit packages at one release, named with versions as NVIDIA's guide does."""
    if installed_version(lab, node, "nvidia-container-toolkit-base") != version:
        pins = " ".join(f"{package}={version}" for package in TOOLKIT_PACKAGES)
        run(lab, node, f"{APT} install {pins}")


@pytest.fixture(scope="module")
def lab(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A lab of this module's own (its name, and a subnet 104 above the session lab's): the
    module installs and purges stand-ins with apt by hand, as on a fresh node, and a session
    node that gpunode converged before it (held packages, its pins and sources) is not one."""
    own = Lab(
        state_dir=tmp_path_factory.mktemp("aptrepo-lab"),
        name=f"{lab.name}-aptrepo",
        subnet_index=int(lab.network_prefix.rsplit(".", 1)[1]) + 104,
    )
    try:
        yield own
    finally:
        own.down(keep_image=True)


@pytest.fixture(scope="module")
def lab_nodes(lab: Lab) -> list[LabNode]:
    """One node, as the session lab's first (an HGX H100 profile, the first release)."""
    return lab.up(1, profiles=[DEFAULT_PROFILES[0]], releases=[LAB_RELEASES[0]])


@pytest.fixture(scope="module")
def repo(lab: Lab) -> aptrepo.RepoInfo:
    return aptrepo.build_repository(lab.state_dir / "aptrepo")


@pytest.fixture(scope="module")
def server(
    lab: Lab,
    lab_nodes: list[LabNode],  # the bridge, and so the gateway address, exists from here on
    repo: aptrepo.RepoInfo,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[aptrepo.RepoServer]:
    log = tmp_path_factory.mktemp("aptrepo-server") / "requests.log"
    with aptrepo.serve(repo.directory, lab.gateway, 0, log_path=log) as running:
        yield running


@pytest.fixture(scope="module")
def preinstalled(lab: Lab, lab_nodes: list[LabNode]) -> frozenset[str]:
    """Stand-in packages the node had before this module (the lab image's, if any): the
    module never purges them. Its tests expect none of them held, as on a fresh node."""
    return installed_standins(lab, lab_nodes[0])


@pytest.fixture(scope="module")
def node(
    lab: Lab,
    lab_nodes: list[LabNode],
    repo: aptrepo.RepoInfo,
    server: aptrepo.RepoServer,
    preinstalled: frozenset[str],
) -> Iterator[LabNode]:
    """A lab node with both lab repositories configured; put back as found afterwards."""
    node = lab_nodes[0]
    before = run(lab, node, SNAPSHOT)
    for keyring in (repo.cuda_keyring, repo.container_keyring):
        encoded = base64.b64encode(keyring.read_bytes()).decode()
        run(lab, node, f"echo {encoded} | base64 -d > {KEYRING_DIR}/{keyring.name}")
    for name, line in repo.sources(server.base_url, KEYRING_DIR).items():
        run(lab, node, f"printf %s {shlex.quote(line)} > {SOURCES_DIR}/{name}")
        returncode, output = update(lab, node, f"{SOURCES_DIR}/{name}")
        assert returncode == 0, output
    yield node
    _put_back(lab, node, repo, before, preinstalled)
    after = run(lab, node, SNAPSHOT)
    difference = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="")
    assert after == before, "the node was not left as found:\n" + "\n".join(difference)


def installed_standins(lab: Lab, node: LabNode) -> frozenset[str]:
    """The stand-in packages the node has in any state but not-installed."""
    names = " ".join(sorted({package.name for package in catalogue()}))
    listed = run(
        lab,
        node,
        f"dpkg-query -W -f='${{db:Status-Abbrev}} ${{Package}}\\n' {names} 2>/dev/null"
        " | awk '$1 != \"un\" {print $2}'; true",
    )
    return frozenset(listed.split())


def purge_standins(lab: Lab, node: LabNode, keep: frozenset[str]) -> None:
    """Purge every stand-in package the node has, except those it had before this module."""
    installed = sorted(installed_standins(lab, node) - keep)
    if installed:
        run(lab, node, f"{APT} purge {' '.join(installed)}")


def _put_back(
    lab: Lab, node: LabNode, repo: aptrepo.RepoInfo, before: str, keep: frozenset[str]
) -> None:
    purge_standins(lab, node, keep)
    sources = " ".join(f"{SOURCES_DIR}/{name}" for name in repo.sources("http://x"))
    keyrings = f"{KEYRING_DIR}/{repo.cuda_keyring.name} {KEYRING_DIR}/{repo.container_keyring.name}"
    host = f"{lab.gateway}:*"
    run(
        lab,
        node,
        f"rm -f {sources} {keyrings} {PREFERENCES} /var/lib/apt/lists/{host}_* "
        "/etc/docker/daemon.json /etc/cdi/nvidia.yaml; rmdir /etc/docker /etc/cdi 2>/dev/null; "
        "true",
    )
    # What apt itself added (downloaded .debs, its lock, auxfiles) and the simulator's lock file
    # from gpunode-lab-hw set; deepest paths first.
    apt_dirs = ("/var/cache/apt/archives", "/var/lib/apt/lists")
    now = run(lab, node, f"find {' '.join(apt_dirs)} {SIMULATOR_LOCK} -xdev 2>/dev/null | sort -r")
    added = [path for path in now.splitlines() if path not in before.splitlines()]
    for path in added:
        run(lab, node, f"rm -f {shlex.quote(path)} 2>/dev/null || rmdir {shlex.quote(path)}")


# --- sources and signatures ----------------------------------------------------------------


def test_apt_update_verifies_each_repository_signature(
    lab: Lab, node: LabNode, repo: aptrepo.RepoInfo, server: aptrepo.RepoServer
):
    # A source whose signed-by= names the other repository's key must be refused.
    wrong = f"{SOURCES_DIR}/gpunode-lab-wrong-key.list"
    line = (
        f"deb [signed-by={KEYRING_DIR}/{repo.container_keyring.name}] "
        f"{server.base_url}/{aptrepo.CUDA_PATH}/ /\n"
    )
    # apt would fall back on the index it already has; set it aside so the refusal shows.
    lists = f"/var/lib/apt/lists/{lab.gateway}:{server.port}_cuda_*"
    run(lab, node, f"printf %s {shlex.quote(line)} > {wrong}; mkdir /root/lists-aside; "
                   f"mv {lists} /root/lists-aside/")  # fmt: skip
    try:
        returncode, output = update(lab, node, wrong)
    finally:
        run(lab, node, f"rm -f {wrong} {lists}; mv /root/lists-aside/* /var/lib/apt/lists/; "
                       "rmdir /root/lists-aside")  # fmt: skip
    assert returncode != 0
    assert "NO_PUBKEY" in output and "is not signed" in output, output

    for sources_file in repo.sources(server.base_url):
        returncode, output = update(lab, node, f"{SOURCES_DIR}/{sources_file}")
        assert returncode == 0, output
        assert "W:" not in output and "E:" not in output, output


def test_policy_lists_both_container_toolkit_releases_from_the_lab_repository(
    lab: Lab, node: LabNode, server: aptrepo.RepoServer
):
    policy = run(lab, node, "apt-cache policy nvidia-container-toolkit cuda-drivers-550")
    for version in ("1.17.8-1", "1.17.4-1", "550.144.03-1", "550.127.08-1"):
        assert f" {version} 500\n" in policy, policy
    assert f"500 {server.container_url}  Packages" in policy
    assert f"500 {server.cuda_url}  Packages" in policy


def test_a_lone_version_pin_fails_as_on_nvidias_repository(lab: Lab, node: LabNode):
    # nvidia-container-toolkit needs nvidia-container-toolkit-base (= its version): apt does not
    # pick the older base by itself, so NVIDIA's guide names all four packages with versions.
    returncode, output = attempt(lab, node, f"{APT} install -s nvidia-container-toolkit=1.17.4-1")
    assert returncode != 0
    newest = CONTAINER_TOOLKIT_VERSIONS[-1]
    assert f"nvidia-container-toolkit-base (= 1.17.4-1) but {newest} is to be installed" in output


# --- NVIDIA Container Toolkit --------------------------------------------------------------


def test_pinned_container_toolkit_installs_and_nvidia_ctk_merges_daemon_json(
    lab: Lab, node: LabNode
):
    run(lab, node, f"mkdir -p /etc/docker && echo {shlex.quote(json.dumps(DAEMON_JSON))} "
                   "> /etc/docker/daemon.json")  # fmt: skip
    install_toolkit(lab, node, "1.17.4-1")
    for package in TOOLKIT_PACKAGES:
        assert installed_version(lab, node, package) == "1.17.4-1", package
    assert run(lab, node, "nvidia-ctk --version").startswith(
        "NVIDIA Container Toolkit CLI version 1.17.4\n"
    )
    # The package's postinst wrote the toolkit's own config, as the real one does.
    assert "[nvidia-container-cli]" in run(
        lab, node, "cat /etc/nvidia-container-runtime/config.toml"
    )

    run(lab, node, "nvidia-ctk runtime configure --runtime=docker")
    merged = json.loads(run(lab, node, "cat /etc/docker/daemon.json"))
    assert merged == {**DAEMON_JSON, "runtimes": {
        "crun": {"path": "/usr/bin/crun"},
        "nvidia": {"args": [], "path": "nvidia-container-runtime"},
    }}  # fmt: skip
    run(lab, node, "nvidia-ctk runtime configure --runtime=docker --set-as-default")
    assert json.loads(run(lab, node, "cat /etc/docker/daemon.json"))["default-runtime"] == "nvidia"


def test_cdi_generate_lists_the_simulated_gpus(lab: Lab, node: LabNode):
    install_toolkit(lab, node, "1.17.4-1")
    run(lab, node, "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")
    spec = yaml.safe_load(run(lab, node, "cat /etc/cdi/nvidia.yaml"))
    uuids = [
        line.rsplit("(UUID: ", 1)[1].rstrip(")")
        for line in run(lab, node, "nvidia-smi -L").splitlines()
        if line.startswith("GPU ")
    ]
    assert uuids
    assert spec["kind"] == "nvidia.com/gpu"
    names = {device["name"] for device in spec["devices"]}
    assert names == {*uuids, *map(str, range(len(uuids))), "all"}


def test_upgrading_the_toolkit_keeps_its_configuration(lab: Lab, node: LabNode):
    install_toolkit(lab, node, "1.17.4-1")
    run(lab, node, "nvidia-ctk config --in-place --set nvidia-container-cli.no-cgroups=true")
    install_toolkit(lab, node, "1.17.8-1")
    assert installed_version(lab, node, "nvidia-container-toolkit") == "1.17.8-1"
    assert run(lab, node, "nvidia-ctk --version").startswith(
        "NVIDIA Container Toolkit CLI version 1.17.8\n"
    )
    config = run(lab, node, "cat /etc/nvidia-container-runtime/config.toml")
    assert "\nno-cgroups = true\n" in config


# --- CUDA ----------------------------------------------------------------------------------


def test_the_toolkit_brings_nvcc_and_only_the_cuda_metapackage_brings_a_driver(
    lab: Lab, node: LabNode
):
    toolkit_plan = run(lab, node, f"{APT} install -s cuda-toolkit-12-4")
    assert "Inst cuda-nvcc-12-4 (12.4.131-1 " in toolkit_plan
    assert "Inst cuda-drivers" not in toolkit_plan and "nvidia-driver" not in toolkit_plan
    cuda_plan = run(lab, node, f"{APT} install -s cuda")
    # The newest cuda (13.1) needs a 590+ driver: the newest cuda-drivers (595's).
    assert f"Inst cuda-drivers ({DRIVER_VERSIONS[-1]}-1 " in cuda_plan, cuda_plan

    run(lab, node, f"{APT} install cuda-toolkit-12-4=12.4.1-1")
    version = run(lab, node, "/usr/local/cuda-12.4/bin/nvcc --version")
    assert "Cuda compilation tools, release 12.4, V12.4.131\n" in version
    assert run(lab, node, "readlink -f /usr/local/cuda").strip() == "/usr/local/cuda-12.4"


# --- driver --------------------------------------------------------------------------------


def test_the_driver_records_what_a_reboot_would_load_and_keeps_the_simulator(
    lab: Lab, node: LabNode
):
    simulator = run(lab, node, "sha256sum /usr/bin/nvidia-smi").split()[0]
    pin_driver(lab, node, "550.127.08")
    run(lab, node, f"{APT} install nvidia-open")
    assert installed_version(lab, node, "nvidia-kernel-open-dkms") == "550.127.08-1"
    assert run(lab, node, "cat /var/lib/gpunode-lab/installed-driver-version") == "550.127.08\n"
    assert run(lab, node, "cat /var/lib/gpunode-lab/installed-kernel-module-flavour") == "open\n"
    # The package's nvidia-smi went to the diversion; the simulator still answers.
    assert run(lab, node, "sha256sum /usr/bin/nvidia-smi").split()[0] == simulator
    assert "local diversion" in run(lab, node, "dpkg -S /usr/bin/nvidia-smi")
    returncode, output = attempt(lab, node, "/usr/bin/nvidia-smi.distrib")
    assert returncode == 9 and "couldn't communicate with the NVIDIA driver" in output
    assert run(lab, node, "nvidia-smi -L").startswith("GPU 0: ")
    assert run(lab, node, "systemctl is-active nvidia-persistenced").strip() == "active"
    assert run(lab, node, "systemctl is-enabled nvidia-persistenced").strip() == "enabled"

    # An upgrade records the new release; the loaded driver (the simulator's) is unchanged.
    pin_driver(lab, node, "550.144.03")
    run(lab, node, f"{APT} install nvidia-open")
    assert run(lab, node, "cat /var/lib/gpunode-lab/installed-driver-version") == "550.144.03\n"

    # cuda-drivers is the proprietary flavour: its kernel module replaces the open one.
    run(lab, node, f"{APT} install cuda-drivers")
    assert installed_version(lab, node, "nvidia-kernel-dkms") == "550.144.03-1"
    assert installed_version(lab, node, "nvidia-kernel-open-dkms") == ""
    assert run(lab, node, "cat /var/lib/gpunode-lab/installed-kernel-module-flavour") == (
        "proprietary\n"
    )


def test_fabric_manager_starts_only_against_a_driver_of_its_own_version(lab: Lab, node: LabNode):
    pin_driver(lab, node, "550.144.03")
    run(lab, node, f"{APT} install nvidia-fabricmanager-550")
    assert run(lab, node, "systemctl is-enabled nvidia-fabricmanager || true").strip() == "disabled"
    loaded = json.loads(run(lab, node, "gpunode-lab-hw show driver_version"))
    assert loaded != "550.144.03"
    returncode, _ = attempt(lab, node, "systemctl start nvidia-fabricmanager")
    assert returncode != 0, "Fabric Manager started against a driver of another version"
    try:
        run(lab, node, "gpunode-lab-hw set driver_version 550.144.03")
        run(lab, node, "systemctl start nvidia-fabricmanager")
        assert run(lab, node, "systemctl is-active nvidia-fabricmanager").strip() == "active"
    finally:
        restore = f"gpunode-lab-hw set driver_version {shlex.quote(json.dumps(loaded))}"
        run(lab, node, f"systemctl stop nvidia-fabricmanager; systemctl reset-failed; {restore}")


def test_dcgm_hostengine_runs_and_discovers_the_gpus(lab: Lab, node: LabNode):
    run(lab, node, f"{APT} install datacenter-gpu-manager=1:3.3.8")
    assert run(lab, node, "dcgmi --version") == "dcgmi  version: 3.3.8\n"
    try:
        run(lab, node, "systemctl start nvidia-dcgm")
        assert run(lab, node, "systemctl is-active nvidia-dcgm").strip() == "active"
        gpus = run(lab, node, "nvidia-smi -L").count("\nGPU ") + 1
        assert run(lab, node, "dcgmi discovery -l").startswith(f"{gpus} GPUs found.\n")
    finally:
        run(lab, node, "systemctl stop nvidia-dcgm")


# --- the 590+ era: pinning, compute-only, Fabric Manager, DCGM 4, CDI refresh ---------------


def test_a_pinning_package_holds_the_driver_on_its_branch_and_a_new_one_moves_it(
    lab: Lab, node: LabNode, preinstalled: frozenset[str]
):
    purge_standins(lab, node, preinstalled)
    run(lab, node, f"rm -f {PREFERENCES}")  # the test's own 1001 pin would outrank the package
    try:
        run(lab, node, f"{APT} install nvidia-driver-pinning-580")
        plan = run(lab, node, f"{APT} install -s nvidia-open")
        assert "Inst nvidia-open (580.105.08-1 " in plan, plan
        assert "Inst nvidia-kernel-open-dkms (580.105.08-1 " in plan, plan
        # One pinning package at a time: the 595 one replaces the 580 one (Conflicts).
        run(lab, node, f"{APT} install nvidia-driver-pinning-595")
        assert installed_version(lab, node, "nvidia-driver-pinning-580") == ""
        plan = run(lab, node, f"{APT} install -s nvidia-open")
        assert "Inst nvidia-open (595.91.07-1 " in plan, plan
        # From 590 on there is no cuda-drivers-<branch>: cuda-drivers pulls the driver itself.
        plan = run(lab, node, f"{APT} install -s cuda-drivers")
        assert "Inst cuda-drivers (595.91.07-1 " in plan, plan
        assert "Inst nvidia-kernel-dkms (595.91.07-1 " in plan, plan
        assert "Inst cuda-drivers-5" not in plan, plan
    finally:
        purge_standins(lab, node, preinstalled)


def test_the_compute_only_set_installs_without_the_desktop_driver(
    lab: Lab, node: LabNode, preinstalled: frozenset[str]
):
    purge_standins(lab, node, preinstalled)
    run(lab, node, f"rm -f {PREFERENCES}")
    try:
        run(lab, node, f"{APT} install nvidia-driver-pinning-595")
        run(lab, node, f"{APT} install nvidia-driver-cuda nvidia-kernel-open-dkms")
        assert installed_version(lab, node, "nvidia-driver-cuda") == "595.91.07-1"
        assert installed_version(lab, node, "nvidia-kernel-open-dkms") == "595.91.07-1"
        assert installed_version(lab, node, "nvidia-driver") == ""
        assert run(lab, node, "cat /var/lib/gpunode-lab/installed-driver-version") == (
            "595.91.07\n"
        )
        # Fabric Manager of this era: unsuffixed, at the driver's version, with NSCQ and IMEX.
        run(lab, node, f"{APT} install nvidia-fabricmanager libnvidia-nscq nvidia-imex")
        for package in ("nvidia-fabricmanager", "libnvidia-nscq", "nvidia-imex"):
            assert installed_version(lab, node, package) == "595.91.07-1", package
        for unit in ("nvidia-fabricmanager", "nvidia-imex"):
            enabled = run(lab, node, f"systemctl is-enabled {unit} || true").strip()
            assert enabled == "disabled", unit
    finally:
        purge_standins(lab, node, preinstalled)


def test_a_1_18_toolkit_enables_the_cdi_refresh_units_and_a_1_17_one_has_none(
    lab: Lab, node: LabNode, preinstalled: frozenset[str]
):
    purge_standins(lab, node, preinstalled)
    try:
        install_toolkit(lab, node, "1.18.2-1")
        for unit in ("nvidia-cdi-refresh.path", "nvidia-cdi-refresh.service"):
            assert run(lab, node, f"systemctl is-enabled {unit}").strip() == "enabled", unit
        out = "/run/gpunode-lab-test-cdi.yaml"
        run(lab, node, f"NVIDIA_CTK_CDI_OUTPUT_FILE_PATH={out} nvidia-ctk cdi generate; "
                       f"grep -q '^kind: nvidia.com/gpu$' {out}; rm -f {out}")  # fmt: skip
        purge_standins(lab, node, preinstalled)
        returncode, _ = attempt(lab, node, "systemctl is-enabled nvidia-cdi-refresh.path")
        assert returncode != 0, "the removed package left its unit enabled"
        install_toolkit(lab, node, "1.17.8-1")
        listed = run(lab, node, "systemctl list-unit-files 'nvidia-cdi-refresh*' || true")
        assert "nvidia-cdi-refresh" not in listed
    finally:
        purge_standins(lab, node, preinstalled)


def test_dcgm4_replaces_dcgm3_and_its_exporter_serves_the_simulated_gpus(
    lab: Lab, node: LabNode, preinstalled: frozenset[str]
):
    purge_standins(lab, node, preinstalled)
    metrics = (
        "python3 -c 'import time, urllib.request\n"
        "for _ in range(100):\n"
        "    try:\n"
        '        print(urllib.request.urlopen("http://127.0.0.1:9400/metrics").read().decode())\n'
        "        break\n"
        "    except OSError:\n"
        "        time.sleep(0.1)\n'"
    )
    try:
        run(lab, node, f"{APT} install datacenter-gpu-manager=1:3.3.9")
        run(lab, node, f"{APT} install datacenter-gpu-manager-4-core=1:4.5.3-1 "
                       "datacenter-gpu-manager-exporter=4.8.2-1")  # fmt: skip
        assert installed_version(lab, node, "datacenter-gpu-manager") == ""
        assert run(lab, node, "dcgmi --version") == "dcgmi  version: 4.5.3\n"
        enabled = run(lab, node, "systemctl is-enabled nvidia-dcgm-exporter || true").strip()
        assert enabled == "disabled"
        run(lab, node, "systemctl start nvidia-dcgm nvidia-dcgm-exporter")
        text = run(lab, node, metrics)
        uuid = run(lab, node, "nvidia-smi -L").split("(UUID: ", 1)[1].split(")", 1)[0]
        assert f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="{uuid}",' in text, text
    finally:
        run(lab, node, "systemctl stop nvidia-dcgm-exporter nvidia-dcgm 2>/dev/null; "
                       "rm -f /var/dcgm-exporter.log; true")  # fmt: skip
        purge_standins(lab, node, preinstalled)


def test_the_debian13_repository_verifies_with_the_same_keyring(
    lab: Lab, node: LabNode, repo: aptrepo.RepoInfo, server: aptrepo.RepoServer
):
    sources = repo.sources(server.base_url, KEYRING_DIR, distribution="debian13")
    (name,) = [name for name in sources if "debian13" in name]
    path = f"{SOURCES_DIR}/{name}"
    lists = f"/var/lib/apt/lists/{lab.gateway}:{server.port}_cuda_debian13_*"
    run(lab, node, f"printf %s {shlex.quote(sources[name])} > {path}")
    try:
        returncode, output = update(lab, node, path)
        assert returncode == 0, output
        assert "W:" not in output and "E:" not in output, output
        policy = run(lab, node, "apt-cache policy nvidia-driver-pinning-595")
        assert f"500 {server.cuda_url_for('debian13')}  Packages" in policy, policy
    finally:
        run(lab, node, f"rm -f {path} {lists}")


# --- what apt fetched ----------------------------------------------------------------------


def test_apt_fetched_only_repository_paths_from_the_lab_server(
    node: LabNode, server: aptrepo.RepoServer
):
    requests = server.requests()
    debian13 = aptrepo.CUDA_REPOSITORIES["debian13"].path
    prefixes = (f"/{aptrepo.CUDA_PATH}/", f"/{aptrepo.CONTAINER_PATH}/", f"/{debian13}/")
    assert requests
    assert {request.client for request in requests} == {node.address}
    assert [r.path for r in requests if not r.path.startswith(prefixes)] == []
    paths = {request.path.replace("/./", "/") for request in requests if request.status == 200}
    assert f"/{aptrepo.CUDA_PATH}/InRelease" in paths
    assert f"/{aptrepo.CONTAINER_PATH}/InRelease" in paths
    assert f"/{aptrepo.CONTAINER_PATH}/nvidia-container-toolkit_1.17.4-1_amd64.deb" in paths
    assert f"/{aptrepo.CUDA_PATH}/nvidia-kernel-open-dkms_550.127.08-1_amd64.deb" in paths
    logged = Path(server.log_path).read_text().splitlines()
    assert len(logged) == len(requests)

"""roles/gpu_settings on lab nodes: application clocks and the MIG layout.

lab-1 is an HGX H100 on driver 590 (application clocks deprecated), lab-2 an HGX A100 on
driver 535. A throw-away deploy runs the GPU settings role alone, from throw-away inventories
that leave persistence mode, ECC and power limit as found (null), so each run changes only
what the test is about. ``gpunode-lab-hw reboot`` is the simulated reboot: pending MIG modes
take effect, and MIG instances, application clocks, persistence mode and power limits are
lost, as on real hardware. The module saves both nodes' simulated hardware first, ends with MIG
disabled again, and puts the saved hardware back whatever happens.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import Lab, LabNode
from lab.hwsim.hwstate import DEFAULT_STATE_PATH
from roles.gpu_settings import BOOT_SCRIPT, BOOT_SETTINGS, BOOT_UNIT, BOOT_UNIT_PATH

from .conftest import ROOT, PyinfraRun, run_pyinfra, ssh, write_inventory

pytestmark = pytest.mark.lab

DEPLOY = f"""\
import sys

sys.path.insert(0, {str(ROOT)!r})

from gpunode.inventory import desired_state
from roles.gpu_settings import gpu_settings

gpu_settings(desired=desired_state())
"""
A100_MODEL = "NVIDIA A100-SXM4-80GB"
HALVES = ["3g.40gb", "3g.40gb"]
# Where the driver puts them (as in published A100 outputs: GPU instance 1 at 4:4, 2 at 0:4).
HALVES_PLACED = [("3g.40gb", "4:4"), ("3g.40gb", "0:4")]
MIG_MODE = "GPU settings | GPU MIG mode"
MIG_LAYOUT = "GPU settings | GPU MIG layout"
CLOCKS = "GPU settings | GPU application clocks"
ALL_GPUS = "0,1,2,3,4,5,6,7"
LEFT_AS_FOUND = {"persistence_mode": None}
DEPRECATED = "[Requested functionality has been deprecated]"

Deploy = Callable[..., PyinfraRun]  # (nodes, {node name: host data}, *pyinfra args)


def sudo(lab: Lab, node: LabNode, command: str) -> str:
    result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def query(lab: Lab, node: LabNode, fields: str) -> list[str]:
    """One CSV line per GPU of ``nvidia-smi --query-gpu``."""
    return sudo(lab, node, f"nvidia-smi --query-gpu={fields} --format=csv,noheader").splitlines()


def listing(lab: Lab, node: LabNode, option: str) -> str:
    """``nvidia-smi mig <option>``, which exits 6 when it has nothing to list."""
    return ssh(lab, node, f"nvidia-smi mig {option}").stdout


def instances(lab: Lab, node: LabNode) -> dict[int, list[tuple[str, str]]]:
    """GPU index -> (profile, placement) of each GPU instance that has a compute instance."""
    with_compute = {
        (int(row[0]), int(row[1]))
        for row in re.findall(r"^\|\s+(\d+)\s+(\d+)\s+MIG ", listing(lab, node, "-lci"), re.M)
    }
    found: dict[int, list[tuple[str, str]]] = {}
    for gpu, profile, gi, placement in re.findall(
        r"^\|\s+(\d+)\s+MIG (\S+)\s+\d+\s+(\d+)\s+(\d+:\d+)", listing(lab, node, "-lgi"), re.M
    ):
        if (int(gpu), int(gi)) in with_compute:
            found.setdefault(int(gpu), []).append((profile, placement))
    return found


def on_every_gpu(layout: list[tuple[str, str]]) -> dict[int, list[tuple[str, str]]]:
    return {index: list(layout) for index in range(8)}


def noops(run: PyinfraRun, node: LabNode) -> list[str]:
    return re.findall(rf"\[{re.escape(node.name)}\] noop: (.*)", run.output)


def is_boot_unit(operation: str) -> bool:
    """The boot unit's files (roles/gpu_settings.py, BOOT_*): they change with the data, the
    GPUs' settings with nvidia-smi; ``boot_changes`` tells those apart."""
    return any(path in operation for path in (BOOT_SETTINGS, BOOT_SCRIPT, BOOT_UNIT))


def changed(run: PyinfraRun) -> set[tuple[str, str]]:
    """The nvidia-smi settings the run changed (what this module is about)."""
    assert run.returncode == 0, run.output
    return {
        (name, host)
        for name, hosts in run.changed_operations().items()
        for host in hosts
        if not is_boot_unit(name)
    }


def boot_changes(run: PyinfraRun) -> set[tuple[str, str]]:
    assert run.returncode == 0, run.output
    return {
        (name, host)
        for name, hosts in run.changed_operations().items()
        for host in hosts
        if is_boot_unit(name)
    }


def predicted(dry: PyinfraRun) -> set[tuple[str, str]]:
    assert dry.returncode == 0, dry.output
    assert dry.results is not None, dry.output
    return {
        (op["name"], host)
        for op in dry.results["plan"]
        for host in op["hosts_with_change"]
        if not is_boot_unit(op["name"])
    }


@pytest.fixture(scope="module")
def nodes(
    lab: Lab, lab_nodes: list[LabNode], deploy_file: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, LabNode]]:
    """The H100 and A100 nodes with the boot unit installed, their simulated hardware put back
    as found at the end."""
    by_profile = {node.profile: node for node in lab_nodes}
    assert {"hgx-h100", "a100"} <= set(by_profile), [n.profile for n in lab_nodes]
    chosen = {"h100": by_profile["hgx-h100"], "a100": by_profile["a100"]}
    saved = {name: sudo(lab, node, f"cat {DEFAULT_STATE_PATH}") for name, node in chosen.items()}
    # The boot unit (its directory, script, unit file, settings), as any converge of
    # deploys/gpu_node.py leaves it: on a fresh lab the module's first run would install it,
    # with a systemd reload, changes beside the GPU settings that the tests count exactly. A
    # run that leaves every setting as found, where it is missing.
    missing = [
        node for node in chosen.values() if ssh(lab, node, f"test -e {BOOT_UNIT_PATH}").returncode
    ]
    if missing:
        data = {
            node.name: a100_data() if node is chosen["a100"] else {"gpu_settings": LEFT_AS_FOUND}
            for node in missing
        }
        path = tmp_path_factory.mktemp("gpu_settings_boot_unit") / "inventory.py"
        installed = run_pyinfra(deploy_file, inventory=write_inventory(path, lab, missing, data))
        assert installed.returncode == 0, installed.output
        assert all(ssh(lab, node, f"test -e {BOOT_UNIT_PATH}").returncode == 0 for node in missing)
    yield chosen
    for name, node in chosen.items():
        encoded = base64.b64encode(saved[name].encode()).decode()
        restore = f"{DEFAULT_STATE_PATH}.restore"
        sudo(
            lab,
            node,
            f"echo {encoded} | base64 -d > {restore} && chmod 644 {restore} && "
            f"mv {restore} {DEFAULT_STATE_PATH}",
        )
        assert sudo(lab, node, f"cat {DEFAULT_STATE_PATH}") == saved[name]


@pytest.fixture(scope="module")
def deploy_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("gpu_settings") / "gpu_settings_only.py"
    path.write_text(DEPLOY)
    return str(path)


@pytest.fixture
def deploy(lab: Lab, deploy_file: str, tmp_path: Path) -> Deploy:
    """Runs the GPU settings role alone on ``nodes`` with a throw-away inventory."""

    def run(nodes: list[LabNode], data: dict[str, dict[str, Any]], *args: str) -> PyinfraRun:
        inventory = write_inventory(tmp_path / "gpu_settings_inventory.py", lab, nodes, data)
        return run_pyinfra("-v", *args, deploy_file, inventory=inventory)

    return run


def a100_data(**gpu_settings: Any) -> dict[str, Any]:
    return {
        "gpu_settings": LEFT_AS_FOUND | gpu_settings,
        "expected_hardware": {"gpu_model": A100_MODEL},
    }


def mig_data(layout: list[str], mig: bool = True) -> dict[str, Any]:
    return a100_data(mig=mig, mig_layout=layout) if mig else a100_data(mig=False)


def test_application_clocks_set_once_and_deprecated_ones_reported(
    lab: Lab, nodes: dict[str, LabNode], deploy: Deploy
) -> None:
    h100, a100 = nodes["h100"], nodes["a100"]
    both = [h100, a100]
    data = {
        h100.name: {
            "gpu_settings": LEFT_AS_FOUND
            | {"application_clocks": {"memory_mhz": 2619, "graphics_mhz": 1980}}
        },
        a100.name: a100_data(application_clocks={"memory_mhz": 1593, "graphics_mhz": 1215}),
    }
    clocks = "clocks.applications.memory,clocks.applications.graphics"
    assert query(lab, h100, clocks) == [f"{DEPRECATED}, {DEPRECATED}"] * 8
    a100_before = query(lab, a100, clocks)
    assert "1593 MHz, 1215 MHz" not in a100_before

    dry = deploy(both, data, "--dry")
    assert predicted(dry) == {(CLOCKS, a100.name)}
    assert query(lab, a100, clocks) == a100_before, "--dry changed the node"

    first = deploy(both, data)
    assert changed(first) == predicted(dry)
    # The clocks are in the boot unit's settings now, applied again at every boot.
    settings_file = f"GPU settings | {BOOT_SETTINGS} (applied again at boot)"
    assert {(settings_file, h100.name), (settings_file, a100.name)} <= boot_changes(first)
    assert "APPLICATION_CLOCKS=1593,1215" in ssh(lab, a100, f"cat {BOOT_SETTINGS}").stdout
    assert query(lab, a100, clocks) == ["1593 MHz, 1215 MHz"] * 8
    assert query(lab, h100, clocks) == [f"{DEPRECATED}, {DEPRECATED}"] * 8
    assert (
        f"application clocks left alone on GPUs {ALL_GPUS} (NVIDIA H100 80GB HBM3): "
        "Requested functionality has been deprecated"
    ) in noops(first, h100)

    second = deploy(both, data)
    assert changed(second) == set() and boot_changes(second) == set()
    assert "application clocks 1593,1215 MHz on all 8 GPUs that have them" in noops(second, a100)

    # A pair the A100 does not support: an error naming GPU and what it supports, no change.
    bad = {a100.name: a100_data(application_clocks={"memory_mhz": 1593, "graphics_mhz": 1500})}
    refused = deploy([a100], bad)
    assert refused.returncode != 0
    assert (
        "GPU 0 (NVIDIA A100-SXM4-80GB) supports memory 1593 MHz with graphics 210 to 1410 MHz "
        "(81 clocks)"
    ) in refused.output
    assert query(lab, a100, clocks) == ["1593 MHz, 1215 MHz"] * 8


def test_mig_layout_waits_while_mig_mode_is_pending(
    lab: Lab, nodes: dict[str, LabNode], deploy: Deploy
) -> None:
    a100 = nodes["a100"]
    data = {a100.name: mig_data(HALVES)}
    assert query(lab, a100, "mig.mode.current,mig.mode.pending") == ["Disabled, Disabled"] * 8

    dry = deploy([a100], data, "--dry")
    assert predicted(dry) == {(MIG_MODE, a100.name)}
    first = deploy([a100], data)
    assert changed(first) == predicted(dry)
    assert query(lab, a100, "mig.mode.current,mig.mode.pending") == ["Disabled, Enabled"] * 8
    assert listing(lab, a100, "-lgi") == "No MIG-enabled devices found.\n"

    # Pending until a reboot: reported each run, never requested again, nothing created.
    second = deploy([a100], data)
    assert changed(second) == set()
    pending = (
        f"MIG layout {HALVES} waits for a GPU reset or reboot (MIG mode pending) on GPUs {ALL_GPUS}"
    )
    assert pending in noops(second, a100)
    assert f"MIG Enabled pending a GPU reset or reboot on GPUs {ALL_GPUS}" in noops(second, a100)


# The MIG tests below go on from one another's state; each also runs without those before it
# (-k, or after one failed): these fixtures bring the A100 to the state the test starts from,
# by the deploy and the simulated reboot, and do nothing where it is there already.


def mig_modes(lab: Lab, node: LabNode) -> set[str]:
    return set(query(lab, node, "mig.mode.current,mig.mode.pending"))


@pytest.fixture
def mig_pending(lab: Lab, nodes: dict[str, LabNode], deploy: Deploy) -> LabNode:
    """The A100 with MIG mode requested for the halves' layout (pending until a reboot, or
    current already)."""
    a100 = nodes["a100"]
    if mig_modes(lab, a100) not in ({"Disabled, Enabled"}, {"Enabled, Enabled"}):
        requested = deploy([a100], {a100.name: mig_data(HALVES)})
        assert requested.returncode == 0, requested.output
    assert mig_modes(lab, a100) in ({"Disabled, Enabled"}, {"Enabled, Enabled"})
    return a100


@pytest.fixture
def mig_enabled(lab: Lab, mig_pending: LabNode) -> LabNode:
    """The A100 in MIG mode (after the simulated reboot that a pending mode waits for)."""
    if mig_modes(lab, mig_pending) != {"Enabled, Enabled"}:
        sudo(lab, mig_pending, "gpunode-lab-hw reboot")
    assert mig_modes(lab, mig_pending) == {"Enabled, Enabled"}
    return mig_pending


@pytest.fixture
def halves_laid_out(lab: Lab, mig_enabled: LabNode, deploy: Deploy) -> LabNode:
    """The A100 in MIG mode with the halves' layout on every GPU."""
    if instances(lab, mig_enabled) != on_every_gpu(HALVES_PLACED):
        laid_out = deploy([mig_enabled], {mig_enabled.name: mig_data(HALVES)})
        assert laid_out.returncode == 0, laid_out.output
    assert instances(lab, mig_enabled) == on_every_gpu(HALVES_PLACED)
    return mig_enabled


def test_after_the_reboot_the_layout_is_created_once(
    lab: Lab, mig_pending: LabNode, deploy: Deploy
) -> None:
    a100 = mig_pending
    data = {a100.name: mig_data(HALVES)}
    sudo(lab, a100, "gpunode-lab-hw reboot")
    assert query(lab, a100, "mig.mode.current") == ["Enabled"] * 8
    assert listing(lab, a100, "-lgi") == "No GPU instances found.\n"

    dry = deploy([a100], data, "--dry")
    assert predicted(dry) == {(MIG_LAYOUT, a100.name)}
    assert listing(lab, a100, "-lgi") == "No GPU instances found.\n", "--dry changed the node"

    first = deploy([a100], data)
    assert changed(first) == predicted(dry)
    assert instances(lab, a100) == on_every_gpu(HALVES_PLACED)

    second = deploy([a100], data)
    assert changed(second) == set()
    assert f"MIG layout {HALVES} on GPUs {ALL_GPUS}" in noops(second, a100)


def test_a_reboot_clears_the_layout_and_the_next_run_lays_it_out_again(
    lab: Lab, mig_enabled: LabNode, deploy: Deploy
) -> None:
    a100 = mig_enabled
    data = {a100.name: mig_data(HALVES)}
    sudo(lab, a100, "gpunode-lab-hw reboot")
    assert query(lab, a100, "mig.mode.current") == ["Enabled"] * 8
    assert instances(lab, a100) == {}

    assert predicted(deploy([a100], data, "--dry")) == {(MIG_LAYOUT, a100.name)}
    assert changed(deploy([a100], data)) == {(MIG_LAYOUT, a100.name)}
    assert instances(lab, a100) == on_every_gpu(HALVES_PLACED)
    assert changed(deploy([a100], data)) == set()


def test_a_new_layout_replaces_instances_only_when_no_process_runs(
    lab: Lab, halves_laid_out: LabNode, deploy: Deploy
) -> None:
    a100 = halves_laid_out
    mixed = ["4g.40gb", "2g.20gb", "1g.10gb"]
    data = {a100.name: mig_data(mixed)}
    before = instances(lab, a100)
    process = '[{"pid": 4242, "name": "/usr/bin/python3 train.py", "used_memory_mib": 30000}]'
    sudo(lab, a100, f"gpunode-lab-hw set gpus.3.compute_processes {shlex.quote(process)}")

    refused = deploy([a100], data)
    assert refused.returncode != 0
    assert (
        f"GPU 3 ({A100_MODEL}) has MIG instances ['3g.40gb', '3g.40gb'], not {mixed}; "
        "replacing them would kill the compute processes running on it (PIDs 4242): "
        "stop them first"
    ) in refused.output
    assert instances(lab, a100) == before, "a refused run changed instances"

    sudo(lab, a100, "gpunode-lab-hw set gpus.3.compute_processes '[]'")
    dry = deploy([a100], data, "--dry")
    assert predicted(dry) == {(MIG_LAYOUT, a100.name)}
    assert changed(deploy([a100], data)) == predicted(dry)
    laid_out = [("4g.40gb", "0:4"), ("2g.20gb", "4:2"), ("1g.10gb", "6:1")]
    assert instances(lab, a100) == on_every_gpu(laid_out)
    assert changed(deploy([a100], data)) == set()

    # A layout no A100 can hold is refused before anything changes, naming what fits.
    too_big = deploy([a100], {a100.name: mig_data(["4g.40gb", "4g.40gb"])})
    assert too_big.returncode != 0
    assert (
        f"gpu_settings.mig_layout ['4g.40gb', '4g.40gb'] does not fit GPU 0 ({A100_MODEL}): "
        "2 x 4g.40gb, but at most 1 fit; it offers 1g.10gb (up to 7)"
    ) in too_big.output
    assert instances(lab, a100) == on_every_gpu(laid_out)


def test_mig_disabled_again_after_a_reboot(lab: Lab, mig_enabled: LabNode, deploy: Deploy) -> None:
    a100 = mig_enabled
    data = {a100.name: mig_data([], mig=False)}
    assert changed(deploy([a100], data)) == {(MIG_MODE, a100.name)}
    assert query(lab, a100, "mig.mode.current,mig.mode.pending") == ["Enabled, Disabled"] * 8
    sudo(lab, a100, "gpunode-lab-hw reboot")
    assert query(lab, a100, "mig.mode.current,mig.mode.pending") == ["Disabled, Disabled"] * 8
    assert listing(lab, a100, "-lgi") == "No MIG-enabled devices found.\n"
    assert changed(deploy([a100], data)) == set()

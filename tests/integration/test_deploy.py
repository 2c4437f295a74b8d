"""deploys/gpu_node.py end to end on lab nodes: converge, idempotence, --dry, bad data."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyinfra.facts.files import Directory, File, Sha1File
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from facts.auditd import AuditdState
from facts.container_runtime import ContainerRuntimeConfig, DpkgPackageState
from facts.firewall import FirewallState
from facts.mps import MpsState
from facts.nvidia_packages import NvidiaPackages
from facts.sshd import SshdState
from facts.tls import NodeCertificate
from gpunode import distributions, factcache
from lab import Lab, LabNode

from .conftest import PYINFRA, ROOT, SSH_COMMAND_COUNTER, run_pyinfra, ssh, write_inventory

pytestmark = pytest.mark.lab

DEPLOY = "deploys/gpu_node.py"


def persistence_modes(lab: Lab, node: LabNode) -> set[str]:
    result = ssh(lab, node, "nvidia-smi --query-gpu=persistence_mode --format=csv,noheader")
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


@pytest.fixture(scope="module")
def converged(lab_nodes: list[LabNode]) -> list[LabNode]:
    first = run_pyinfra(DEPLOY)
    assert first.returncode == 0, first.output
    return lab_nodes


def test_first_run_converges_gpu_settings_and_admins(lab: Lab, converged: list[LabNode]) -> None:
    for node in converged:
        assert persistence_modes(lab, node) == {"Enabled"}
        # The admin from inventory data logs in with their key and has passwordless sudo.
        result = ssh(lab, node, "sudo -n id -u", user="gpuadmin")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "0"


def test_second_run_changes_nothing(converged: list[LabNode]) -> None:
    second = run_pyinfra(DEPLOY)
    assert second.returncode == 0, second.output
    assert second.changed_operations() == {}
    assert second.results is not None
    assert second.results["results"]["totals"]["error"] == 0


# pyinfra's own CLI, counting the shell commands (SSH round trips) it runs on each host.
COUNT_SSH_COMMANDS = f"""
import atexit, json, sys
from pyinfra_cli.main import main
{SSH_COMMAND_COUNTER}
atexit.register(lambda: print("COUNTED " + json.dumps(commands), file=sys.stderr))
sys.argv = ["pyinfra", *sys.argv[1:]]
main()
"""


def test_a_no_op_reads_each_host_in_a_few_ssh_commands(converged: list[LabNode]) -> None:
    """The fact plan the last run left (gpunode.factcache) is read in one batch per
    connector setting: a no-op costs the run lock and those batches, not one SSH command per
    fact (some 190 per host when no plan could be written)."""
    # A converge that changed something plans only what it asked; a no-op plans it all.
    settled = run_pyinfra(DEPLOY)
    assert settled.returncode == 0 and settled.changed_operations() == {}, settled.output
    done = subprocess.run(
        [sys.executable, "-c", COUNT_SSH_COMMANDS, "-y", "inventories/lab.py", DEPLOY],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (counted,) = [line for line in done.stderr.splitlines() if line.startswith("COUNTED ")]
    commands = json.loads(counted.removeprefix("COUNTED "))
    assert sorted(commands) == sorted(node.name for node in converged)
    # One batch with sudo and one without, the run lock, and the digests of the two private
    # keys (pyinfra's Sha256File, not among the facts a plan may name): five, one to spare.
    assert all(count <= 6 for count in commands.values()), commands


def test_dry_run_predicts_exactly_what_the_real_run_changes(
    lab: Lab, converged: list[LabNode]
) -> None:
    drifted = converged[-1]
    assert ssh(lab, drifted, "sudo nvidia-smi -i 0 -pm 0").returncode == 0
    dry = run_pyinfra("--dry", DEPLOY)
    assert dry.returncode == 0, dry.output
    assert dry.results is not None
    predicted = {
        (op["name"], host) for op in dry.results["plan"] for host in op["hosts_with_change"]
    }
    assert predicted == {("GPU settings | GPU persistence mode", drifted.name)}
    assert persistence_modes(lab, drifted) == {"Enabled", "Disabled"}, "--dry changed the node"

    real = run_pyinfra(DEPLOY)
    assert real.returncode == 0, real.output
    changed = {(name, host) for name, hosts in real.changed_operations().items() for host in hosts}
    assert changed == predicted
    assert persistence_modes(lab, drifted) == {"Enabled"}


def test_the_fact_cache_batch_reads_on_a_node_what_each_fact_reads_alone(
    lab: Lab, converged: list[LabNode]
) -> None:
    """The grouped reads (one systemctl, one stat, one sha1sum, one dpkg-query) against a
    real systemd, dpkg and files: each fact's value is what its own command gives alone."""
    units = ["ssh.service", "sshd.service", "nosuch.service", "gpunode-firewall.service"]
    systemd = {"user_mode": False, "machine": None, "user_name": None}
    paths = ["/etc/ssh/sshd_config", "/etc/ssh", "/etc/no-such-file"]
    instances: list[tuple[Any, dict[str, Any]]] = [
        *((SystemdStatus(), {**systemd, "services": units[i:]}) for i in range(3)),
        *((SystemdEnabled(), {**systemd, "services": units[:i]}) for i in range(1, 4)),
        *((cls(), {"path": path}) for path in paths for cls in (File, Directory, Sha1File)),
        (DpkgPackageState(), {"packages": ["openssh-server", "no-such-package-gpunode"]}),
        (DpkgPackageState(), {"packages": ["nftables"]}),
        # Facts made of framing parts: theirs become the batch's, their Python parts run in
        # the batch's one python3 (gpunode.framing).
        *((cls(), {}) for cls in (SshdState, NodeCertificate, NvidiaPackages, FirewallState)),
        *((cls(), {}) for cls in (ContainerRuntimeConfig, AuditdState, MpsState)),
    ]
    assert set(factcache.batch_groups(instances)) == {
        "systemd", "stat", "sha1", "class-DpkgPackageState"
    }  # fmt: skip
    script = factcache.batch_script(instances)
    assert script.count("python3 -I -S -") == 1
    for node in converged:
        batch = ssh(lab, node, f"sudo -n sh -c {shlex.quote(script)}")
        assert batch.returncode == 0, batch.stderr
        parts = factcache.parse_batch(batch.stdout.splitlines(), instances)
        assert sorted(parts) == list(range(len(instances)))
        for index, (fact, kwargs) in enumerate(instances):
            command = str(type(fact)().command(**kwargs))
            alone = ssh(lab, node, f"sudo -n sh -c {shlex.quote(command)} 2>/dev/null")
            lines = alone.stdout.splitlines()
            expected = fact.process(lines) if lines else fact.default()
            read, value = factcache.batched_value(fact, parts[index])
            assert read and value == expected, (node.name, type(fact).__name__, kwargs)


def test_removed_key_is_removed_from_the_node(lab: Lab, converged: list[LabNode]) -> None:
    node = converged[0]
    stray = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPQUZFlnFqnyKh8mjHvR7CC/2uUH0GpU0OUx4lvzQEVU x@y"
    append = f"echo '{stray}' | sudo tee -a /home/gpuadmin/.ssh/authorized_keys >/dev/null"
    assert ssh(lab, node, append).returncode == 0
    run = run_pyinfra(DEPLOY)
    assert run.returncode == 0, run.output
    keys = ssh(lab, node, "sudo cat /home/gpuadmin/.ssh/authorized_keys").stdout
    assert stray not in keys
    assert lab.key_path.with_suffix(".pub").read_text().split()[1] in keys


def test_bad_data_on_one_host_stops_every_host_before_any_change(
    lab: Lab, converged: list[LabNode], tmp_path: Path
) -> None:
    for node in converged:
        assert ssh(lab, node, "sudo nvidia-smi -pm 0").returncode == 0
    inventory = write_inventory(
        tmp_path / "broken.py",
        lab,
        converged,
        {converged[0].name: {"sshd": {"port": 0}, "cuda": {"versions": "12"}}},
    )
    run = run_pyinfra(DEPLOY, inventory=inventory)
    assert run.returncode != 0
    first = converged[0].name
    assert f"{inventory}: host {first}: sshd.port = 0: out of range" in run.output
    assert f"{inventory}: host {first}: cuda.versions = '12': wrong type" in run.output
    assert "2 problems; nothing was changed on any host" in run.output
    for node in converged:
        assert persistence_modes(lab, node) == {"Disabled"}, f"{node.name} was changed"
    # Restore the converged state for the tests that follow.
    assert run_pyinfra(DEPLOY).returncode == 0
    assert all(persistence_modes(lab, node) == {"Enabled"} for node in converged)


def test_a_node_on_an_unsupported_os_is_refused_alone_before_any_change(
    lab: Lab, converged: list[LabNode]
) -> None:
    # The node claims to be Ubuntu 20.04 (its os-release replaced), a release no row of
    # gpunode/distributions.py supports (focal's standard support ended in 2025):
    # gpunode must not touch it.
    node, other = converged[0], converged[-1]
    for each in converged:
        assert ssh(lab, each, "sudo nvidia-smi -pm 0").returncode == 0
    fake = (
        'ID=ubuntu\nVERSION_ID="20.04"\nVERSION_CODENAME=focal\nPRETTY_NAME="Ubuntu 20.04.6 LTS"\n'
    )
    plant = f"sudo rm /etc/os-release && printf '{fake}' | sudo tee /etc/os-release >/dev/null"
    assert ssh(lab, node, plant).returncode == 0
    try:
        run = run_pyinfra(DEPLOY)
        assert run.returncode != 0
        assert (
            f"{node.name}: not converged: the node runs 'Ubuntu 20.04.6 LTS'; gpunode supports "
            f"{distributions.supported()}" in run.output
        )
        assert "Nothing was changed." in run.output
        assert persistence_modes(lab, node) == {"Disabled"}, "the refused node was changed"
        if other is not node:
            assert persistence_modes(lab, other) == {"Enabled"}, "the other node was skipped"
    finally:
        restore = "sudo rm -f /etc/os-release && sudo ln -s ../usr/lib/os-release /etc/os-release"
        assert ssh(lab, node, restore).returncode == 0
    assert run_pyinfra(DEPLOY).returncode == 0
    assert persistence_modes(lab, node) == {"Enabled"}


def test_pyinfra_from_another_directory_reaches_a_hardened_node_and_says_what_is_missing(
    converged: list[LabNode], tmp_path: Path
) -> None:
    """Started outside the checkout, pyinfra reads no config.py but still connects first:
    the hardened Debian 13 node (post-quantum key exchange only) must be reached, thanks to
    the inventory's group data, so that the deploy's one line saying how to give config.py is
    what the operator sees, and not paramiko's key-exchange traceback."""
    assert any(node.release == "trixie" for node in converged), "the lab has no Debian 13 node"
    done = subprocess.run(
        [PYINFRA, "--dry", str(ROOT / "inventories" / "lab.py"), str(ROOT / DEPLOY)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert f"pyinfra did not read {ROOT / 'config.py'}" in output
    assert "Traceback" not in output, output
    assert "Incompatible ssh" not in output and "Could not connect" not in output, output

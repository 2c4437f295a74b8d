"""deploys/os_hardening.py on lab nodes: sysctls, skipped-key reports, login, unattended-upgrades.

The lab's Docker containers mount all of /proc/sys read-only. The first node is given what
LXC, systemd-nspawn or ``docker run --sysctl`` give a container: its own network namespace's
sysctls writable (a fresh proc mount's sys/net bound over /proc/sys/net; the host's values
are untouched). So one node proves that settable keys go live, the other that a stock
container gets every key skipped with its reason, and both that nothing else is attempted.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpunode.model import UnattendedUpgrades
from lab import LOGIN_USER, Lab, LabNode
from roles.kernel import SYSCTL_PATH, is_namespaced, parse_sysctl_conf, sysctl_values
from roles.unattended_upgrades import CONFIG_PATH, blacklist_pattern

from .conftest import ROOT, PyinfraRun, lab_desired_state, run_pyinfra, ssh

pytestmark = pytest.mark.lab

DEPLOY = "deploys/os_hardening.py"
LIVE_OPERATION = "Kernel and login hardening | Sysctls in the running kernel"
NETNS_PROC = "/run/gpunode-test-netns-proc"


# The lab inventory declares nothing in the kernel section: the defaults apply.
@functools.cache
def wanted_sysctls() -> dict[str, str]:
    """What the lab inventory asks of every node (its container engines turn forwarding on).

    Read when first needed: the lab inventory lists nodes only once the lab is up.
    """
    return sysctl_values(lab_desired_state())


# The admin inventories/group_data/lab.py declares, with the lab key.
KEY_ONLY_ADMIN = "gpuadmin"
PACKAGE = "unattended-upgrades"


def run_ok(lab: Lab, node: LabNode, command: str, user: str = LOGIN_USER) -> str:
    result = ssh(lab, node, command, user=user)
    assert result.returncode == 0, f"{command}: {result.stderr}"
    return result.stdout


def live_values(lab: Lab, node: LabNode, keys: list[str]) -> dict[str, str | None]:
    """Current value of each key (None: absent), read straight from /proc/sys as root."""
    script = "; ".join(
        f'printf "%s=%s\\n" {key} "$(cat /proc/sys/{key.replace(".", "/")} 2>/dev/null '
        '|| echo ABSENT)"'
        for key in keys
    )
    values: dict[str, str | None] = {}
    for line in run_ok(lab, node, f"sudo sh -c {shlex.quote(script)}").splitlines():
        key, value = line.split("=", 1)
        values[key] = None if value == "ABSENT" else " ".join(value.split())
    return values


def skip_notes(output: str, node: LabNode) -> dict[str, str]:
    """sysctl key -> reason, from the no-op lines pyinfra -v printed for ``node``."""
    pattern = rf"\[{re.escape(node.name)}\] noop: sysctl (\S+) skipped: (.*)"
    return dict(re.findall(pattern, output))


@pytest.fixture(scope="module")
def writable_node(lab: Lab, lab_nodes: list[LabNode]) -> Iterator[LabNode]:
    node = lab_nodes[0]
    run_ok(
        lab,
        node,
        f"sudo mkdir -p {NETNS_PROC} && sudo mount -t proc proc {NETNS_PROC} && "
        f"sudo mount --bind {NETNS_PROC}/sys/net /proc/sys/net",
    )
    yield node
    run_ok(lab, node, f"sudo umount /proc/sys/net && sudo umount {NETNS_PROC}")


@pytest.fixture(scope="module")
def first_run(writable_node: LabNode, lab_nodes: list[LabNode]) -> PyinfraRun:
    run = run_pyinfra("-v", DEPLOY)
    assert run.returncode == 0, run.output
    return run


def test_persistent_file_holds_every_value(
    lab: Lab, lab_nodes: list[LabNode], first_run: PyinfraRun
) -> None:
    for node in lab_nodes:
        written = parse_sysctl_conf(run_ok(lab, node, f"cat {SYSCTL_PATH}"))
        assert written == wanted_sysctls()


def test_settable_keys_are_live_and_the_rest_reported_with_reasons(
    lab: Lab, writable_node: LabNode, lab_nodes: list[LabNode], first_run: PyinfraRun
) -> None:
    # The network namespace's own keys (the BPF JIT's, under net.core, are the host's).
    net_keys = [key for key in wanted_sysctls() if key.startswith("net.") and is_namespaced(key)]
    live = live_values(lab, writable_node, list(wanted_sysctls()))
    assert {key: live[key] for key in net_keys} == {key: wanted_sysctls()[key] for key in net_keys}

    for node in lab_nodes:
        live = live_values(lab, node, list(wanted_sysctls()))
        notes = skip_notes(first_run.output, node)
        off_target = {key for key in wanted_sysctls() if live[key] != wanted_sysctls()[key]}
        # Exactly the keys that are not (and could not be made) right are reported.
        assert set(notes) == off_target, notes
        for key in off_target:
            if live[key] is None:
                assert notes[key].startswith("not present in this docker container"), notes[key]
            elif key.startswith("net."):
                assert node != writable_node
                assert notes[key].startswith("read-only in this docker container (the runtime"), (
                    notes[key]
                )
            else:
                assert notes[key] == (
                    "read-only in this docker container (not namespaced; set it on the host) "
                    f"(is {live[key]}, wanted {wanted_sysctls()[key]})"
                )
    # The stock node cannot set even its own network keys; Docker's defaults differ from
    # ours, so some of them are always reported.
    stock_notes = skip_notes(first_run.output, lab_nodes[1])
    assert stock_notes["net.ipv4.conf.all.log_martians"].startswith("read-only in this docker")


def test_login_hardening_files(lab: Lab, lab_nodes: list[LabNode], first_run: PyinfraRun) -> None:
    node = lab_nodes[1]
    defs = run_ok(lab, node, "grep -E '^(UMASK|PASS_MAX_DAYS|PASS_MIN_DAYS)' /etc/login.defs")
    # Each once, where Debian's file has it (trixie's has UMASK after the PASS_* lines).
    assert sorted(defs.splitlines()) == ["PASS_MAX_DAYS 60", "PASS_MIN_DAYS 7", "UMASK 027"]
    # The file was edited, not replaced: Debian's comments are still there.
    assert "Configuration control definitions" in run_ok(lab, node, "cat /etc/login.defs")
    assert "* hard core 0" in run_ok(lab, node, "cat /etc/security/limits.d/gpunode.conf")
    # pam_limits applies it to every new login.
    assert run_ok(lab, node, "ulimit -H -c").strip() == "0"
    assert run_ok(lab, node, "stat -c %a:%U:%G /etc/shadow").strip() == "640:root:shadow"
    blacklist = run_ok(lab, node, "cat /etc/modprobe.d/gpunode-blacklist.conf")
    assert "install cramfs /bin/false\nblacklist cramfs\n" in blacklist
    assert "nvidia" not in blacklist and "squashfs" not in blacklist


def test_second_run_changes_nothing(first_run: PyinfraRun) -> None:
    second = run_pyinfra(DEPLOY)
    assert second.returncode == 0, second.output
    assert second.changed_operations() == {}
    assert second.results is not None
    assert second.results["results"]["totals"]["error"] == 0


def test_dry_run_predicts_exactly_the_real_run_after_drift(
    lab: Lab, writable_node: LabNode, first_run: PyinfraRun
) -> None:
    key = "net.ipv4.conf.all.log_martians"
    run_ok(lab, writable_node, f"sudo sysctl -q -w {key}=0")
    dry = run_pyinfra("--dry", DEPLOY)
    assert dry.returncode == 0, dry.output
    assert dry.results is not None
    predicted = {
        (op["name"], host) for op in dry.results["plan"] for host in op["hosts_with_change"]
    }
    assert predicted == {(LIVE_OPERATION, writable_node.name)}
    assert live_values(lab, writable_node, [key])[key] == "0", "--dry changed the node"

    real = run_pyinfra(DEPLOY)
    assert real.returncode == 0, real.output
    changed = {(name, host) for name, hosts in real.changed_operations().items() for host in hosts}
    assert changed == predicted
    assert live_values(lab, writable_node, [key])[key] == "1"


def test_ssh_sudo_su_and_apt_still_work(
    lab: Lab, lab_nodes: list[LabNode], first_run: PyinfraRun
) -> None:
    for node in lab_nodes:
        # Each ssh() call is a brand-new login through PAM (limits, umask, account checks).
        assert run_ok(lab, node, "sudo -n id -u").strip() == "0"
        run_ok(lab, node, "sudo -n apt-get update -qq")
        # su stays usable for root and members of the sudo group.
        assert run_ok(lab, node, "sudo -n su -s /bin/sh -c 'id -un' nobody").strip() == "nobody"


# The admin users role alone, with the lab inventory's data.
ADMIN_USERS_DEPLOY = f"""\
import sys

sys.path.insert(0, {str(ROOT)!r})

from gpunode.inventory import desired_state
from roles.admin_users import admin_users

admin_users(desired=desired_state())
"""


@pytest.fixture
def declared_admin(lab: Lab, lab_nodes: list[LabNode], tmp_path: Path) -> LabNode:
    """lab-2 with the lab inventory's admin account, as any converge of deploys/harden.py or
    gpu_node.py leaves it. This module's deploy makes no account: where it is missing (a fresh
    lab, no such converge before), the admin users role alone makes it."""
    node = lab_nodes[1]
    if ssh(lab, node, f"getent passwd {KEY_ONLY_ADMIN}").returncode != 0:
        deploy = tmp_path / "admin_users_only.py"
        deploy.write_text(ADMIN_USERS_DEPLOY)
        made = run_pyinfra(str(deploy))
        assert made.returncode == 0, made.output
    assert run_ok(lab, node, "id -un", user=KEY_ONLY_ADMIN).strip() == KEY_ONLY_ADMIN
    return node


def test_key_only_admin_is_never_locked_out_by_password_expiry(
    lab: Lab, declared_admin: LabNode, first_run: PyinfraRun
) -> None:
    node = declared_admin
    # Only gpunode-login may log in (an undeclared account is refused by sshd before PAM's
    # account checks), so the key-only account is the lab's declared admin. Its password
    # "changed" long ago under a maximum age, as PASS_MAX_DAYS gives an account useradd
    # creates after hardening, 60 days on.
    changed = run_ok(lab, node, f"sudo getent shadow {KEY_ONLY_ADMIN} | cut -d: -f3").strip()
    run_ok(lab, node, f"sudo chage -M 60 -d 2000-01-01 {KEY_ONLY_ADMIN}")
    try:
        locked_out = ssh(lab, node, "true", user=KEY_ONLY_ADMIN)
        assert locked_out.returncode != 0
        assert "Password change required" in locked_out.stderr

        run = run_pyinfra(DEPLOY)
        assert run.returncode == 0, run.output
        assert run_ok(lab, node, "id -un", user=KEY_ONLY_ADMIN).strip() == KEY_ONLY_ADMIN
    finally:
        run_ok(lab, node, f"sudo chage -M -1 -d {shlex.quote(changed or '-1')} {KEY_ONLY_ADMIN}")


def write_inventory(path: Path, lab: Lab, node: LabNode, extra: str) -> None:
    path.write_text(
        f'nodes = [("{node.name}", {{"ssh_hostname": "{node.address}", '
        f'"ssh_user": "{LOGIN_USER}", "ssh_key": "{lab.key_path}", '
        f'"ssh_known_hosts_file": "{lab.known_hosts_path}", "_sudo": True, {extra}}})]\n'
    )


# Runs ``unattended-upgrade --dry-run -d`` until it has printed the configuration it loaded,
# then stops it: the rest (about a minute here) only simulates the upgrades.
DRY_RUN_HEAD = """\
log=$(mktemp)
PYTHONUNBUFFERED=1 unattended-upgrade --dry-run -d >"$log" 2>&1 &
pid=$!
tries=0
until grep -q '^Initial whitelist' "$log" || ! kill -0 $pid 2>/dev/null || [ $tries = 1200 ]; do
  sleep 0.1; tries=$((tries + 1))
done
kill $pid 2>/dev/null; wait $pid; cat "$log"; rm -f "$log"
"""


def dry_run_log(lab: Lab, node: LabNode) -> str:
    return run_ok(lab, node, f"sudo sh -c {shlex.quote(DRY_RUN_HEAD)}")


def test_unattended_upgrades_load_the_blacklist_enabled_or_not(
    lab: Lab, writable_node: LabNode, first_run: PyinfraRun, tmp_path: Path
) -> None:
    node = writable_node
    inventory = tmp_path / "enabled.py"
    write_inventory(
        inventory,
        lab,
        node,
        '"unattended_upgrades": {"enabled": True}, '
        '"kernel": {"blacklist_modules": ["cramfs", "nvidia"], '
        '"sysctls": {"net.ipv4.conf.all.rp_filter": "2"}}',
    )
    try:
        enabled = run_pyinfra("-v", DEPLOY, inventory=str(inventory))
        assert enabled.returncode == 0, enabled.output
        assert "kernel module nvidia is never blacklisted" in enabled.output
        assert "nvidia" not in run_ok(lab, node, "cat /etc/modprobe.d/gpunode-blacklist.conf")
        live = live_values(lab, node, ["net.ipv4.conf.all.rp_filter"])
        assert live["net.ipv4.conf.all.rp_filter"] == "2"

        log = dry_run_log(lab, node)
        blacklist = re.search(r"Initial blacklist: (.*)", log)
        assert blacklist is not None, log
        assert blacklist.group(1).split()[:5] == [
            "^nvidia-", "^libnvidia-", "^cuda-", "^libcuda", "^datacenter-gpu-manager",
        ]  # fmt: skip
        assert blacklist.group(1).split() == [
            blacklist_pattern(prefix) for prefix in UnattendedUpgrades().blacklist
        ]
        assert "^linux-image-" in blacklist.group(1).split()
        origins = re.search(r"Allowed origins are: (.*)", log)
        assert origins is not None, log
        assert origins.group(1).split(", ") == [
            f"origin=Debian,codename={node.release}-security,label=Debian-Security",
            f"origin=Debian,codename={node.release},label=Debian-Security",
        ]

        # Disabled again (the lab inventory), the package stays and so does its blacklist.
        disabled = run_pyinfra(DEPLOY)
        assert disabled.returncode == 0, disabled.output
        status = run_ok(lab, node, f"dpkg-query -W -f '${{Status}}' {PACKAGE}")
        assert status == "install ok installed"
        log = dry_run_log(lab, node)
        assert "Initial blacklist: ^nvidia- ^libnvidia- ^cuda-" in log
        assert "Unattended-Upgrade::Origins-Pattern" not in run_ok(lab, node, f"cat {CONFIG_PATH}")
    finally:
        # Leave the node as the lab inventory converges it: without the package.
        run_ok(lab, node, f"sudo DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq {PACKAGE}")
        assert run_pyinfra(DEPLOY).returncode == 0

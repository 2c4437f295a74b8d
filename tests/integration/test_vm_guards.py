"""The guards against lock-out and the reboot drill, on the lab VM's real kernel.

On the session's lab VM (conftest ``lab_vms``; test_vm.py runs first on it and leaves its
NVMe cache and kernel hardening, which nothing here touches), each through its own throw-away
inventory of the VM alone:

1. The firewall's rollback guard, with nftables in a real kernel: a confirmed ruleset
   disarms its rollback and becomes the ruleset the VM boots with (seen after the real
   reboots of step 2). (A cut the preflight cannot see, rolled back by the armed timer, and
   an sshd that cannot start, rolled back by the sshd role, need no real kernel: they are
   tested on lab containers, test_firewall.py and test_sshd.py.)
2. A reboot in the middle of a driver change, for real (deploys/nvidia.py, a first install at
   the pinned version): the VM's kernel is restarted at once (``systemctl reboot -ff``: no
   unit stopped, nothing unmounted) the moment dpkg works on an NVIDIA package; the next
   run finishes dpkg's work and the change and reboots the VM (``reboot: if-needed``, the
   system's own reboot), after which the simulated GPUs run the pinned driver (the lab VM's
   boot loads the installed stand-in driver); a further run changes nothing.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from facts.firewall import ROLLBACK_UNIT, RULESET_PATH, UNIT_NAME
from lab import Lab
from lab.vm import BOOT_TIMEOUT_S, LabVm, ssh_command
from roles.firewall import CANDIDATE_PATH

from .conftest import (
    PyinfraRun,
    journal_cursor,
    journal_since,
    lab_group_data,
    run_pyinfra,
    ssh,
    vm_failure,
)
from .conftest import write_inventory as write_lab_inventory

pytestmark = [pytest.mark.lab, pytest.mark.vm]

FIREWALL_DEPLOY = "deploys/firewall.py"
RULESET_OP = (
    "Firewall | Table inet gpunode: default-drop input, allow-rules from data (SSH-confirmed)"
)
# The driver the drill changes to: the fleet's branch, an older release of it
# (tests/integration/test_fault_drills_fresh.py changes to the same one).
PINNED_DRIVER = "580.95.05-1"
DRIVER_PACKAGE = "nvidia-driver-cuda"
# Kept by the in-guest watcher that reboots the VM: the dpkg step it cut short (dpkg.log's line)
# and the command line of the dpkg that was working on it.
DRILL_DIR = "/var/lib/gpunode-drill"
INTERRUPTED_MARK = f"{DRILL_DIR}/interrupted"
WATCHER_UNIT = "gpunode-drill-reboot"
# The NVIDIA stack as operators change it: repositories, driver, Fabric Manager.
DRIVER_DEPLOY = "deploys/nvidia.py"


def sudo(lab: Lab, vm: LabVm, command: str) -> str:
    result = ssh(lab, vm, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def inventory(path: Path, lab: Lab, vm: LabVm, **data: Any) -> str:
    return write_lab_inventory(path, lab, [vm], {vm.name: data})


def boot_id(lab: Lab, vm: LabVm) -> str:
    return sudo(lab, vm, "cat /proc/sys/kernel/random/boot_id").strip()


def wait_for_new_boot(lab: Lab, vm: LabVm, old_boot_id: str) -> str:
    """Until the VM accepts SSH logins in a boot other than ``old_boot_id``: its boot_id."""
    read = ssh_command(lab, vm, "cat /proc/sys/kernel/random/boot_id", 5)
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        now = subprocess.run(read, capture_output=True, text=True, timeout=60)
        if now.returncode == 0 and now.stdout.strip() not in ("", old_boot_id):
            return now.stdout.strip()
        time.sleep(2)
    # What the VM's consoles showed (its boots, the supervisor's log), to tell a boot that
    # hung from one that came up without SSH.
    raise AssertionError(vm_failure(lab, f"{vm.name} did not come back from its reboot"))


@pytest.fixture(scope="module")
def vm(lab_vms: list[LabVm]) -> LabVm:
    return lab_vms[0]


@pytest.fixture(scope="module")
def control_address(lab: Lab, vm: LabVm) -> str:
    """The control host's address as the VM sees it."""
    result = ssh(lab, vm, "echo $SSH_CLIENT")
    assert result.returncode == 0, result.stderr
    return result.stdout.split()[0]


# --- 1. the firewall's rollback guard --------------------------------------------------------


def live_table(lab: Lab, vm: LabVm) -> str:
    return sudo(lab, vm, "nft -s list table inet gpunode")


def persisted(lab: Lab, vm: LabVm) -> str:
    """The persisted ruleset file's digest and what it loads (in a scratch namespace)."""
    return sudo(
        lab,
        vm,
        f"sha256sum < {RULESET_PATH}; unshare --net sh -c "
        f"'nft -f {RULESET_PATH} && nft -s list table inet gpunode'",
    )


def timer_state(lab: Lab, vm: LabVm) -> str:
    return ssh(lab, vm, f"systemctl is-active {ROLLBACK_UNIT}.timer").stdout.strip()


@dataclass
class Confirmed:
    run: PyinfraRun
    inventory: str
    table: str
    rollback_log: str
    boot_id: str


@pytest.fixture(scope="module")
def firewall_confirmed(
    lab: Lab, vm: LabVm, control_address: str, tmp_path_factory: pytest.TempPathFactory
) -> Confirmed:
    """A first ruleset: SSH from the control host only, confirmed by a new login."""
    path = inventory(
        tmp_path_factory.mktemp("vm-fw") / "allowed.py",
        lab,
        vm,
        firewall={"enabled": True, "admin_networks": [f"{control_address}/32"]},
    )
    cursor = journal_cursor(lab, vm)
    run = run_pyinfra(FIREWALL_DEPLOY, inventory=path)
    assert run.returncode == 0, run.output
    rollback_log = journal_since(lab, vm, cursor, f"{ROLLBACK_UNIT}.service")
    return Confirmed(run, path, live_table(lab, vm), rollback_log, boot_id(lab, vm))


def test_a_confirmed_ruleset_disarms_its_rollback_and_is_the_one_loaded_at_boot(
    lab: Lab, vm: LabVm, control_address: str, firewall_confirmed: Confirmed
) -> None:
    assert vm.name in firewall_confirmed.run.changed_operations()[RULESET_OP]
    table = firewall_confirmed.table
    assert "type filter hook input priority filter; policy drop;" in table
    assert f"elements = {{ {control_address} }}" in table
    # Disarmed: the timer was stopped before it fired, so the rollback never ran.
    assert timer_state(lab, vm) == "inactive"
    assert firewall_confirmed.rollback_log == ""
    # The confirmed ruleset is the persisted one, which the enabled boot unit loads.
    assert persisted(lab, vm).split("\n", 1)[1] == table
    assert sudo(lab, vm, f"systemctl is-enabled {UNIT_NAME}").strip() == "enabled"
    assert ssh(lab, vm, f"test -e {CANDIDATE_PATH}").returncode == 1
    assert ssh(lab, vm, "sudo -n true").returncode == 0


# --- 2. a real reboot in the middle of a driver change ------------------------------------------

# Run by the VM itself: the moment dpkg works on an NVIDIA package (or configures what was
# unpacked), what it was doing is kept and the kernel restarts at once (systemctl reboot -ff:
# no unit is stopped, no process asked to end, nothing unmounted; the disks are synced), as a
# watchdog or a crash would restart it. dpkg logs each step in /var/log/dpkg.log as it starts
# it (line-buffered), and tail -F follows the log through inotify: the watcher waits in the
# kernel and runs nothing until dpkg writes. (A loop that looked for dpkg with pgrep ten times
# a second started twenty processes a second; on the emulated CPU that took half of it from the
# driver change it watched, minutes of the drill.) A file of its own, not a command line for
# systemd-run, which would expand the script's $variables itself.
REBOOT_MID_DPKG = f"""\
tail -n 0 -F /var/log/dpkg.log 2>/dev/null | while IFS= read -r line; do
  case "$line" in
    *nvidia*|*" configure "*)
      {{
        printf '%s\\n' "$line"
        for pid in $(pgrep -x dpkg); do tr '\\0' ' ' < /proc/$pid/cmdline; echo; done
      }} > {INTERRUPTED_MARK}
      systemctl reboot --force --force ;;
  esac
done
"""


@dataclass
class Drill:
    interrupted: PyinfraRun
    interrupted_command: str
    audit: str
    finish: PyinfraRun
    rebooted_by_finish: bool
    again: PyinfraRun


@pytest.fixture(scope="module")
def driver_drill(lab: Lab, vm: LabVm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Drill]:
    """A first driver install (the VM had none) at the pinned version, rebooted in its
    middle, then run again twice."""
    driver = {
        "source": "nvidia", "branch": "580", "version": PINNED_DRIVER, "flavour": "open",
        "stack": "compute", "reboot": "if-needed",
    }  # fmt: skip
    # reboot: the system's own (the VM reboots for real), not the lab's simulator command.
    path = inventory(
        tmp_path_factory.mktemp("vm-drill") / "driver.py",
        lab,
        vm,
        nvidia_driver=driver,
        fabric_manager={"version": PINNED_DRIVER},
        apt=lab_group_data("apt"),
        reboot={},
    )
    installed = sudo(lab, vm, "dpkg-query -W -f '${Package} ${Status}\\n' 'nvidia*' || true")
    assert f"{DRIVER_PACKAGE} install ok installed" not in installed
    first_boot = boot_id(lab, vm)
    sudo(lab, vm, f"mkdir -p {DRILL_DIR} && rm -f {INTERRUPTED_MARK}")
    result = ssh(lab, vm, f"sudo tee {DRILL_DIR}/reboot-mid-dpkg >/dev/null", input=REBOOT_MID_DPKG)
    assert result.returncode == 0, result.stderr
    sudo(
        lab,
        vm,
        f"systemd-run --quiet --collect --unit={WATCHER_UNIT} sh {DRILL_DIR}/reboot-mid-dpkg",
    )
    interrupted = run_pyinfra(DRIVER_DEPLOY, inventory=path)
    # Where the watcher never fired, the VM is still in its first boot, the watcher running.
    still = ssh(lab, vm, f"cat /proc/sys/kernel/random/boot_id; systemctl is-active {WATCHER_UNIT}")
    if still.stdout.split()[:1] == [first_boot]:
        ssh(lab, vm, f"sudo systemctl stop {WATCHER_UNIT}")
        pytest.fail(f"the VM was not rebooted during the driver change\n{interrupted.output}")
    second_boot = wait_for_new_boot(lab, vm, first_boot)
    interrupted_command = sudo(lab, vm, f"cat {INTERRUPTED_MARK}").strip()
    audit = sudo(lab, vm, "ls /var/lib/dpkg/updates; dpkg --audit").strip()
    finish = run_pyinfra(DRIVER_DEPLOY, inventory=path)
    rebooted_by_finish = boot_id(lab, vm) != second_boot
    again = run_pyinfra(DRIVER_DEPLOY, inventory=path)
    yield Drill(interrupted, interrupted_command, audit, finish, rebooted_by_finish, again)


def test_a_real_reboot_in_the_middle_of_a_driver_change_is_finished_by_the_next_run(
    lab: Lab, vm: LabVm, driver_drill: Drill
) -> None:
    drill = driver_drill
    # The reboot came while dpkg worked on the driver, and cut that run short.
    assert drill.interrupted_command, (
        f"dpkg never worked on an NVIDIA package\n{drill.interrupted.output}"
    )
    assert drill.interrupted.returncode != 0, drill.interrupted.output
    context = f"interrupted: {drill.interrupted_command}\ndpkg --audit: {drill.audit}"
    # The next run finished the change (dpkg's unfinished work first, where there was some)
    # and rebooted the VM, with the system's own reboot, into the new driver.
    assert drill.finish.returncode == 0, f"{context}\n{drill.finish.output}"
    changed = drill.finish.changed_operations()
    recovered = [name for name in changed if "interrupted package" in name]
    assert bool(recovered) == bool(drill.audit), (context, changed)
    assert drill.rebooted_by_finish, drill.finish.output
    assert any("Loaded kernel module is the installed one" in name for name in changed), changed
    installed = sudo(lab, vm, f"dpkg-query -W -f='${{Version}} ${{Status}}' {DRIVER_PACKAGE}")
    assert installed == f"{PINNED_DRIVER} hold ok installed"
    smi = "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
    assert sudo(lab, vm, smi).split() == [PINNED_DRIVER.rsplit("-", 1)[0]]
    assert sudo(lab, vm, "dpkg --audit").strip() == ""
    # A further run changes nothing.
    assert drill.again.returncode == 0, drill.again.output
    assert drill.again.changed_operations() == {}, context


def test_the_confirmed_ruleset_is_what_the_vm_booted_with(
    lab: Lab, vm: LabVm, firewall_confirmed: Confirmed, driver_drill: Drill
) -> None:
    # Two real reboots since the ruleset was confirmed (the power cut, the driver's reboot).
    assert driver_drill.rebooted_by_finish
    assert boot_id(lab, vm) != firewall_confirmed.boot_id
    assert sudo(lab, vm, f"systemctl is-active {UNIT_NAME}").strip() == "active"
    assert live_table(lab, vm) == firewall_confirmed.table
    assert timer_state(lab, vm) == "inactive"

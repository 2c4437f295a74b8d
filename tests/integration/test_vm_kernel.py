"""The VM part of the suite: kernel hardening live in a real kernel (the lab VM's own).

In a container most of gpunode's sysctls are the host kernel's and are skipped with a reason
(test_os_hardening.py). In the lab VM (conftest ``lab_vms``) none may be: deploys/os_hardening.py
with the kernel section's defaults must put every sysctl it sets into the running kernel,
report none skipped, make every blacklisted module impossible to load, and all of it must
hold after a real reboot, with a rerun changing nothing.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from gpunode.model import DesiredState
from lab import Lab
from lab.vm import LabVm, reboot
from roles.kernel import BLACKLIST_PATH, SYSCTL_PATH, blacklisted_modules, sysctl_values

from .conftest import PyinfraRun, lab_desired_state, run_pyinfra, ssh, write_inventory

pytestmark = [pytest.mark.lab, pytest.mark.vm]

DEPLOY = "deploys/os_hardening.py"
LIVE_OPERATION = "Kernel and login hardening | Sysctls in the running kernel"


def sudo(lab: Lab, vm: LabVm, command: str) -> str:
    result = ssh(lab, vm, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def vm(lab_vms: list[LabVm]) -> LabVm:
    return lab_vms[0]


@pytest.fixture(scope="module")
def hardening_inventory(tmp_path_factory: pytest.TempPathFactory, lab: Lab, vm: LabVm) -> str:
    # The kernel section's defaults; nothing else is declared.
    return write_inventory(tmp_path_factory.mktemp("vm-kernel") / "vm_kernel.py", lab, [vm], {})


@pytest.fixture(scope="module")
def desired(hardening_inventory: str) -> DesiredState:
    return lab_desired_state(hardening_inventory)


@pytest.fixture(scope="module")
def first_run(hardening_inventory: str) -> PyinfraRun:
    run = run_pyinfra("-v", DEPLOY, inventory=hardening_inventory)
    assert run.returncode == 0, run.output
    return run


def live_values(lab: Lab, vm: LabVm, keys: list[str]) -> dict[str, str | None]:
    """Each key's value in the running kernel (None: absent), read from /proc/sys as root."""
    script = "; ".join(
        f'printf "%s=%s\\n" {key} "$(cat /proc/sys/{key.replace(".", "/")} 2>/dev/null '
        '|| echo ABSENT)"'
        for key in keys
    )
    values: dict[str, str | None] = {}
    for line in sudo(lab, vm, script).splitlines():
        key, value = line.split("=", 1)
        values[key] = None if value == "ABSENT" else " ".join(value.split())
    return values


def assert_hardened(lab: Lab, vm: LabVm, desired: DesiredState) -> None:
    wanted = sysctl_values(desired)
    assert live_values(lab, vm, list(wanted)) == wanted
    modules, _ = blacklisted_modules(desired.kernel.blacklist_modules)
    assert modules, "the defaults blacklist modules"
    present = []
    for module in modules:
        quoted = shlex.quote(module)
        result = ssh(lab, vm, f"sudo modprobe {quoted}")
        assert result.returncode != 0, f"{module} loaded: {result.stdout}{result.stderr}"
        # What modprobe does instead of loading it: gpunode's install rule.
        assert "install /bin/false" in sudo(lab, vm, f"modprobe -n -v {quoted} 2>&1 || true")
        if sudo(lab, vm, f"/usr/sbin/modinfo -F filename {quoted} 2>/dev/null || true").strip():
            present.append(module)
    # Most of them are modules of this kernel, which would load but for the blacklist.
    assert len(present) >= len(modules) // 2, present
    loaded = {line.split()[0] for line in sudo(lab, vm, "cat /proc/modules").splitlines()}
    assert not loaded & {module.replace("-", "_") for module in modules}


def test_every_sysctl_is_live_and_none_is_skipped(
    lab: Lab, vm: LabVm, desired: DesiredState, first_run: PyinfraRun
) -> None:
    assert vm.name in first_run.changed_operations()[LIVE_OPERATION]
    skipped = re.findall(
        rf"\[{re.escape(vm.name)}\] noop: sysctl (\S+) skipped: (.*)", first_run.output
    )
    assert skipped == []
    wanted = sysctl_values(desired)
    assert live_values(lab, vm, list(wanted)) == wanted
    assert sudo(lab, vm, f"test -f {SYSCTL_PATH} && echo present").strip() == "present"


def test_blacklisted_modules_cannot_be_loaded(
    lab: Lab, vm: LabVm, desired: DesiredState, first_run: PyinfraRun
) -> None:
    assert "install cramfs /bin/false" in sudo(lab, vm, f"cat {BLACKLIST_PATH}")
    assert_hardened(lab, vm, desired)


def test_hardening_survives_a_real_reboot_and_a_rerun_changes_nothing(
    lab: Lab, vm: LabVm, desired: DesiredState, first_run: PyinfraRun, hardening_inventory: str
) -> None:
    boot_id = sudo(lab, vm, "cat /proc/sys/kernel/random/boot_id").strip()
    reboot(lab, vm)
    assert sudo(lab, vm, "cat /proc/sys/kernel/random/boot_id").strip() != boot_id
    # systemd-sysctl applied the file at boot, before anyone could change a value.
    assert_hardened(lab, vm, desired)
    run = run_pyinfra("-v", DEPLOY, inventory=hardening_inventory)
    assert run.returncode == 0, run.output
    assert run.changed_operations() == {}
    assert f"[{vm.name}] noop: {len(sysctl_values(desired))} sysctls already have" in run.output
    assert Path(SYSCTL_PATH).name in sudo(lab, vm, "ls /etc/sysctl.d")

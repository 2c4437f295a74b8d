"""Kernel and OS checks: hardened sysctls persistent (and live wherever they can be set),
modules blacklisted, core dumps off, unattended upgrades kept away from the NVIDIA stack."""

from __future__ import annotations

from typing import Any

import pytest

from gpunode.model import DesiredState
from roles.kernel import BLACKLIST_PATH, LIMITS_PATH, SYSCTL_PATH, parse_sysctl_conf, sysctl_values
from roles.unattended_upgrades import CONFIG_PATH, blacklist_pattern


def test_hardened_sysctls_are_persistent(host: Any, desired: DesiredState) -> None:
    persisted = parse_sysctl_conf(host.file(SYSCTL_PATH).content_string)
    assert persisted == sysctl_values(desired)


def test_settable_sysctls_are_live(host: Any, desired: DesiredState) -> None:
    # A key whose /proc/sys file is read-only here (a container) cannot be live; the role
    # reports those. Everything the node can set must hold the hardened value.
    wanted = sysctl_values(desired)
    paths = " ".join("/proc/sys/" + key.replace(".", "/") for key in wanted)
    output = host.check_output(
        f"for p in {paths}; do [ -w $p ] && printf '%s=%s\\n' $p \"$(cat $p)\"; done; true"
    )
    live = {}
    for line in output.splitlines():
        path, _, value = line.partition("=")
        live[path.removeprefix("/proc/sys/").replace("/", ".")] = " ".join(value.split())
    wrong = {k: (v, wanted[k]) for k, v in live.items() if v != " ".join(wanted[k].split())}
    assert wrong == {}


@pytest.mark.parametrize("module", ["cramfs", "udf", "dccp", "sctp"])
def test_unused_modules_cannot_load(host: Any, desired: DesiredState, module: str) -> None:
    if module not in desired.kernel.blacklist_modules:
        pytest.skip(f"{module} is not in kernel.blacklist_modules for this host")
    assert f"install {module} /bin/false" in host.file(BLACKLIST_PATH).content_string


def test_core_dumps_are_off(host: Any) -> None:
    assert "hard core 0" in " ".join(host.file(LIMITS_PATH).content_string.split())


def test_unattended_upgrades_never_touch_the_nvidia_stack(host: Any, desired: DesiredState) -> None:
    config = host.file(CONFIG_PATH).content_string
    for prefix in desired.unattended_upgrades.blacklist:
        assert f'"{blacklist_pattern(prefix)}";' in config

"""Kernel and OS checks: hardened sysctls persistent (and live wherever they can be set),
modules blacklisted, core dumps off, unattended upgrades kept away from the NVIDIA stack."""

from __future__ import annotations

from typing import Any

import pytest

from gpunode.model import DesiredState

# After every packaged sysctl.d file (roles/kernel.py: SYSCTL_PATH).
SYSCTL_PATH = "/etc/sysctl.d/zz-gpunode-hardening.conf"
BLACKLIST_PATH = "/etc/modprobe.d/gpunode-blacklist.conf"
LIMITS_PATH = "/etc/security/limits.d/gpunode.conf"
UNATTENDED_UPGRADES_PATH = "/etc/apt/apt.conf.d/51gpunode-unattended-upgrades"

# The policy, written out: dev-sec os_hardening's sysctl_config with gpunode's documented
# departures for GPU and container hosts (docs: roles/kernel.py's module docstring):
# forwarding follows the data (Docker and Kubernetes need it), ptrace_scope comes from data,
# tcp_timestamps stays on, disable_ipv6 is not set, fs.protected_fifos/regular are 2 (KSPP).
DEV_SEC_SYSCTLS: dict[str, str] = {
    # Network: each container and host has its own copy of these (network namespace).
    "net.ipv4.conf.all.rp_filter": "1",
    "net.ipv4.conf.default.rp_filter": "1",
    "net.ipv4.icmp_echo_ignore_broadcasts": "1",
    "net.ipv4.icmp_ignore_bogus_error_responses": "1",
    "net.ipv4.icmp_ratelimit": "100",
    "net.ipv4.icmp_ratemask": "88089",
    "net.ipv4.tcp_syncookies": "1",
    "net.ipv4.tcp_rfc1337": "1",
    # Multi-rail RoCE hosts want exactly these ARP rules too (answer on the owning port).
    "net.ipv4.conf.all.arp_ignore": "1",
    "net.ipv4.conf.all.arp_announce": "2",
    "net.ipv4.conf.all.shared_media": "1",
    "net.ipv4.conf.default.shared_media": "1",
    "net.ipv4.conf.all.accept_source_route": "0",
    "net.ipv4.conf.default.accept_source_route": "0",
    "net.ipv6.conf.all.accept_source_route": "0",
    "net.ipv6.conf.default.accept_source_route": "0",
    "net.ipv4.conf.all.send_redirects": "0",
    "net.ipv4.conf.default.send_redirects": "0",
    "net.ipv4.conf.all.accept_redirects": "0",
    "net.ipv4.conf.default.accept_redirects": "0",
    "net.ipv4.conf.all.secure_redirects": "0",
    "net.ipv4.conf.default.secure_redirects": "0",
    "net.ipv6.conf.all.accept_redirects": "0",
    "net.ipv6.conf.default.accept_redirects": "0",
    "net.ipv4.conf.all.log_martians": "1",
    "net.ipv4.conf.default.log_martians": "1",
    "net.ipv6.conf.all.accept_ra": "0",
    "net.ipv6.conf.default.accept_ra": "0",
    "net.ipv6.conf.default.router_solicitations": "0",
    "net.ipv6.conf.default.accept_ra_rtr_pref": "0",
    "net.ipv6.conf.default.accept_ra_pinfo": "0",
    "net.ipv6.conf.default.accept_ra_defrtr": "0",
    "net.ipv6.conf.default.autoconf": "0",
    "net.ipv6.conf.default.dad_transmits": "0",
    "net.ipv6.conf.default.max_addresses": "1",
    # Kernel and file system: one copy per kernel, so a container cannot set them.
    "kernel.kptr_restrict": "2",
    "kernel.dmesg_restrict": "1",
    "kernel.kexec_load_disabled": "1",
    # Debian's 2 already refuses unprivileged BPF; 1 also keeps root from turning it back on.
    "kernel.unprivileged_bpf_disabled": "1",
    "kernel.sysrq": "0",
    "kernel.randomize_va_space": "2",
    "kernel.core_uses_pid": "1",
    "kernel.ctrl-alt-del": "0",
    # Not dev-sec's: KSPP's constant blinding for every BPF program (lynis KRNL-6000 wants 2).
    # One copy per kernel (the initial network namespace's), so a container has no file.
    "net.core.bpf_jit_harden": "2",
    "dev.tty.ldisc_autoload": "0",
    "fs.protected_hardlinks": "1",
    "fs.protected_symlinks": "1",
    # 2 (KSPP, lynis) rather than dev-sec's 1: also covers group-writable sticky directories.
    "fs.protected_fifos": "2",
    "fs.protected_regular": "2",
    "fs.suid_dumpable": "0",
    "vm.mmap_min_addr": "65536",
    "vm.mmap_rnd_bits": "32",
    "vm.mmap_rnd_compat_bits": "16",
}


def sysctl_policy(desired: DesiredState) -> dict[str, str]:
    """Every sysctl the policy sets on this host: the data's choices, the hardened values,
    and the inventory's own kernel.sysctls over them."""
    forward = "1" if desired.ip_forward else "0"
    values = {
        "net.ipv4.ip_forward": forward,
        "net.ipv6.conf.all.forwarding": forward,
        **DEV_SEC_SYSCTLS,
        "kernel.yama.ptrace_scope": str(desired.kernel.ptrace_scope),
    }
    if desired.kubernetes.enabled:
        # What kubelet and CNIs need: bridged traffic through iptables (test_kubernetes.py).
        values["net.bridge.bridge-nf-call-iptables"] = "1"
        values["net.bridge.bridge-nf-call-ip6tables"] = "1"
    values.update(desired.kernel.sysctls)
    return values


def sysctl_d_settings(text: str) -> dict[str, str]:
    """key -> value of a sysctl.d file, as systemd-sysctl reads it: '#' and ';' start
    comments, a leading '-' only says a missing key is not an error."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, value = line.split("=", 1)
        values[key.strip().lstrip("-")] = value.strip()
    return values


def unattended_upgrades_pattern(prefix: str) -> str:
    """A package name prefix as the regex unattended-upgrades matches from the start of a
    name ('.' and '+', which Debian names may hold, escaped)."""
    return "^" + prefix.replace(".", r"\.").replace("+", r"\+")


def test_hardened_sysctls_are_persistent(host: Any, desired: DesiredState) -> None:
    persisted = sysctl_d_settings(host.file(SYSCTL_PATH).content_string)
    assert persisted == sysctl_policy(desired)


def test_settable_sysctls_are_live(host: Any, desired: DesiredState) -> None:
    # A key whose /proc/sys file is read-only here (a container) cannot be live; the role
    # reports those. Everything the node can set must hold the hardened value.
    wanted = sysctl_policy(desired)
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
    config = host.file(UNATTENDED_UPGRADES_PATH).content_string
    for prefix in desired.unattended_upgrades.blacklist:
        assert f'"{unattended_upgrades_pattern(prefix)}";' in config

"""Kernel and login hardening: sysctl file from data, per-key decisions, modules, login files."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from facts.kernel import (
    LoginDefs,
    PasswordStates,
    SysctlState,
    parse_file_modes,
    parse_login_defs,
    parse_password_states,
    parse_sysctl_report,
)
from gpunode.model import DesiredState, build_desired_state
from roles.kernel import (
    HARDENED_SYSCTLS,
    accounts_needing_no_expiry,
    blacklisted_modules,
    decide_sysctl,
    live_sysctls,
    login_defs,
    login_defs_commands,
    no_password_expiry_for_key_only_accounts,
    parse_sysctl_conf,
    permission_commands,
    plan_sysctls,
    render_module_blacklist,
    render_sysctl_conf,
    sysctl_values,
)

from .fakehost import commands_of


def desired(**data: Any) -> DesiredState:
    state, problems = build_desired_state(data)
    assert problems == []
    return state


def entry(name: str, value: str | None, writable: bool = True) -> dict[str, Any]:
    return {"name": name, "value": value, "writable": writable}


def report(
    *entries: dict[str, Any], container: str = "none", missing: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A SysctlState fact value: each entry under its own name, ``missing`` keys empty."""
    keys: dict[str, list[dict[str, Any]]] = {name: [] for name in missing}
    for found in entries:
        keys.setdefault(found["name"], []).append(found)
    return {"container": container, "keys": keys}


# --- the persistent file -------------------------------------------------------------------


def test_file_holds_every_hardened_value_and_forwarding_off_without_container_engines() -> None:
    values = parse_sysctl_conf(render_sysctl_conf(sysctl_values(desired())))
    assert values["net.ipv4.ip_forward"] == "0"
    assert values["net.ipv6.conf.all.forwarding"] == "0"
    assert values["kernel.yama.ptrace_scope"] == "1"
    for key, value in HARDENED_SYSCTLS.items():
        assert values[key] == value


def test_forwarding_on_when_container_engines_are_declared() -> None:
    values = sysctl_values(desired(container_runtime={"engines": ["docker"]}))
    assert values["net.ipv4.ip_forward"] == "1"
    assert values["net.ipv6.conf.all.forwarding"] == "1"


def test_explicit_ip_forward_wins_over_engines() -> None:
    values = sysctl_values(
        desired(container_runtime={"engines": ["docker"]}, kernel={"ip_forward": False})
    )
    assert values["net.ipv4.ip_forward"] == "0"
    assert sysctl_values(desired(kernel={"ip_forward": True}))["net.ipv4.ip_forward"] == "1"


def test_ptrace_scope_from_data() -> None:
    assert sysctl_values(desired(kernel={"ptrace_scope": 2}))["kernel.yama.ptrace_scope"] == "2"


def test_overrides_replace_hardened_values_and_add_new_keys() -> None:
    text = render_sysctl_conf(
        sysctl_values(
            desired(
                kernel={
                    "sysctls": {"net.ipv4.conf.all.rp_filter": "2", "vm.max_map_count": "262144"}
                }
            )
        )
    )
    values = parse_sysctl_conf(text)
    assert values["net.ipv4.conf.all.rp_filter"] == "2"
    assert values["vm.max_map_count"] == "262144"
    assert text.count("net.ipv4.conf.all.rp_filter") == 1


def test_file_lines_ignore_keys_missing_at_boot_and_say_who_manages_it() -> None:
    text = render_sysctl_conf({"net.ipv4.ip_forward": "0", "kernel.sysrq": "0"})
    assert text.splitlines() == [
        "# Managed by gpunode (kernel section of the inventory); local edits are replaced.",
        "-net.ipv4.ip_forward = 0",
        "-kernel.sysrq = 0",
    ]


# --- per-key decisions ---------------------------------------------------------------------


def test_value_already_right_needs_no_command() -> None:
    assert decide_sysctl("1", entry("net.ipv4.tcp_syncookies", "1"), "none") == ("ok", "")


def test_multi_field_values_compare_ignoring_whitespace() -> None:
    decision = decide_sysctl(
        "32768  60999", entry("net.ipv4.ip_local_port_range", "32768 60999"), "none"
    )
    assert decision == ("ok", "")


def test_settable_wrong_value_is_written() -> None:
    decision = decide_sysctl("1", entry("kernel.kptr_restrict", "0"), "none")
    assert decision == ("set", "sysctl -w kernel.kptr_restrict=1")


def test_values_with_spaces_are_quoted() -> None:
    decision = decide_sysctl(
        "1024 65000", entry("net.ipv4.ip_local_port_range", "32768 60999"), "none"
    )
    assert decision == ("set", "sysctl -w 'net.ipv4.ip_local_port_range=1024 65000'")


def test_read_only_key_in_container_is_skipped_with_reason() -> None:
    action, note = decide_sysctl(
        "1", entry("fs.protected_hardlinks", "0", writable=False), "docker"
    )
    assert action == "skip"
    assert note == (
        "sysctl fs.protected_hardlinks skipped: read-only in this docker container "
        "(not namespaced; set it on the host) (is 0, wanted 1)"
    )


def test_writable_host_key_in_container_is_never_written() -> None:
    action, note = decide_sysctl("2", entry("kernel.kptr_restrict", "0"), "lxc")
    assert action == "skip"
    assert "would change the host's kernel" in note


def test_the_bpf_jit_keys_are_the_host_s_though_they_are_under_net() -> None:
    # Registered for the initial network namespace only: a writable one seen from a
    # container (one sharing the host's network) is the host kernel's, never written.
    action, note = decide_sysctl("2", entry("net.core.bpf_jit_harden", "0"), "docker")
    assert action == "skip"
    assert "would change the host's kernel" in note
    assert decide_sysctl("2", entry("net.core.bpf_jit_harden", "0"), "none") == (
        "set",
        "sysctl -w net.core.bpf_jit_harden=2",
    )


def test_namespaced_key_in_container_is_written_when_writable() -> None:
    decision = decide_sysctl("1", entry("net.ipv4.conf.all.log_martians", "0"), "docker")
    assert decision == ("set", "sysctl -w net.ipv4.conf.all.log_martians=1")


def test_namespaced_key_on_read_only_proc_sys_is_skipped_with_reason() -> None:
    action, note = decide_sysctl("1", entry("net.ipv4.conf.all.rp_filter", "0", False), "docker")
    assert action == "skip"
    assert "read-only in this docker container (the runtime mounts /proc/sys read-only" in note


def test_locked_key_is_reported_not_retried() -> None:
    action, note = decide_sysctl("0", entry("kernel.kexec_load_disabled", "1"), "none")
    assert action == "skip"
    assert "locked at 1 until reboot" in note


def test_unreadable_key_is_left_alone() -> None:
    action, _ = decide_sysctl("1", entry("net.ipv4.route.flush", None), "none")
    assert action == "skip"


def test_plan_writes_only_settable_wrong_keys_and_reports_the_rest() -> None:
    values = {
        "net.ipv4.tcp_syncookies": "1",
        "net.ipv4.conf.all.log_martians": "1",
        "fs.protected_hardlinks": "1",
        "kernel.yama.ptrace_scope": "1",
    }
    observed = report(
        entry("net.ipv4.tcp_syncookies", "1"),
        entry("net.ipv4.conf.all.log_martians", "0"),
        entry("fs.protected_hardlinks", "0", writable=False),
        container="docker",
        missing=("kernel.yama.ptrace_scope",),
    )
    commands, notes = plan_sysctls(values, observed)
    assert commands == ["sysctl -w net.ipv4.conf.all.log_martians=1"]
    assert notes[0] == "1 sysctls already have the wanted value"
    assert notes[1] == (
        "sysctl fs.protected_hardlinks skipped: read-only in this docker container "
        "(not namespaced; set it on the host) (is 0, wanted 1)"
    )
    assert notes[2].startswith("sysctl kernel.yama.ptrace_scope skipped: not present in this")
    assert len(notes) == 3


def test_missing_key_on_a_host_says_the_kernel_lacks_it() -> None:
    _, notes = plan_sysctls({"kernel.sysrq": "0"}, report(missing=("kernel.sysrq",)))
    assert notes == ["sysctl kernel.sysrq skipped: it does not exist on this kernel"]


def test_changing_ip_forward_rewrites_accept_redirects_after_it() -> None:
    # The kernel flips all.accept_redirects whenever forwarding is written.
    values = {"net.ipv4.ip_forward": "0", "net.ipv4.conf.all.accept_redirects": "0"}
    observed = report(
        entry("net.ipv4.ip_forward", "1"), entry("net.ipv4.conf.all.accept_redirects", "0")
    )
    commands, _ = plan_sysctls(values, observed)
    assert commands == [
        "sysctl -w net.ipv4.ip_forward=0",
        "sysctl -w net.ipv4.conf.all.accept_redirects=0",
    ]
    observed["keys"]["net.ipv4.ip_forward"] = [entry("net.ipv4.ip_forward", "0")]
    assert plan_sysctls(values, observed)[0] == []


def test_glob_key_is_decided_per_match() -> None:
    values = {"net.ipv4.conf.*.rp_filter": "2"}
    observed = {
        "container": "none",
        "keys": {
            "net.ipv4.conf.*.rp_filter": [
                entry("net.ipv4.conf.all.rp_filter", "2"),
                entry("net.ipv4.conf.eth0.rp_filter", "1"),
            ]
        },
    }
    assert plan_sysctls(values, observed)[0] == ["sysctl -w net.ipv4.conf.eth0.rp_filter=2"]


def test_live_sysctls_operation_yields_commands_and_noops() -> None:
    observed = report(
        entry("net.ipv4.conf.all.rp_filter", "0"),
        entry("kernel.sysrq", "1", writable=False),
        container="docker",
    )
    commands, noops = commands_of(
        live_sysctls,
        {SysctlState: observed},
        values={"net.ipv4.conf.all.rp_filter": "1", "kernel.sysrq": "0"},
    )
    assert commands == ["sysctl -w net.ipv4.conf.all.rp_filter=1"]
    assert noops == [
        "sysctl kernel.sysrq skipped: read-only in this docker container "
        "(not namespaced; set it on the host) (is 1, wanted 0)"
    ]


def test_live_sysctls_sets_every_key_in_one_command_in_order() -> None:
    observed = report(
        entry("net.ipv4.conf.all.rp_filter", "0"),
        entry("kernel.sysrq", "1"),
        entry("net.ipv4.ip_local_port_range", "32768 60999"),
    )
    commands, _ = commands_of(
        live_sysctls,
        {SysctlState: observed},
        values={
            "net.ipv4.conf.all.rp_filter": "1",
            "kernel.sysrq": "0",
            "net.ipv4.ip_local_port_range": "1024 65000",
        },
    )
    assert commands == [
        "sysctl -w net.ipv4.conf.all.rp_filter=1 && sysctl -w kernel.sysrq=0 && "
        "sysctl -w 'net.ipv4.ip_local_port_range=1024 65000'"
    ]
    # Nothing to set: no command at all.
    settled = report(entry("kernel.sysrq", "0"))
    assert commands_of(live_sysctls, {SysctlState: settled}, values={"kernel.sysrq": "0"})[0] == []


# --- the fact ------------------------------------------------------------------------------


def test_fact_output_is_parsed_per_key() -> None:
    parsed = parse_sysctl_report(
        [
            "container=docker",
            "net.ipv4.ip_forward|net.ipv4.ip_forward|ro|1 ",
            "net.ipv4.ip_local_port_range|net.ipv4.ip_local_port_range|rw|32768 60999 ",
            "kernel.sysrq|missing",
            "net.ipv4.route.flush|net.ipv4.route.flush|unreadable|",
        ]
    )
    assert parsed == {
        "container": "docker",
        "keys": {
            "net.ipv4.ip_forward": [entry("net.ipv4.ip_forward", "1", writable=False)],
            "net.ipv4.ip_local_port_range": [entry("net.ipv4.ip_local_port_range", "32768 60999")],
            "kernel.sysrq": [],
            "net.ipv4.route.flush": [entry("net.ipv4.route.flush", None, writable=False)],
        },
    }


def test_fact_command_reads_this_machine_proc_sys() -> None:
    # The real shell script against the test machine's own /proc/sys.
    fact = SysctlState()
    command = fact.command(
        keys=["kernel.ostype", "gpunode.no_such_key", "net.ipv4.conf.*.forwarding"]
    )
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    parsed = fact.process(output.stdout.splitlines())
    # kernel.ostype is mode 0444: read-only even for root.
    assert parsed["keys"]["kernel.ostype"] == [entry("kernel.ostype", "Linux", writable=False)]
    assert parsed["keys"]["gpunode.no_such_key"] == []
    names = {found["name"] for found in parsed["keys"]["net.ipv4.conf.*.forwarding"]}
    assert {"net.ipv4.conf.all.forwarding", "net.ipv4.conf.default.forwarding"} <= names
    assert parsed["container"]


def test_fact_command_reads_every_value_again_when_awk_gives_up(tmp_path: Path) -> None:
    # mawk stops at the first file that opens but cannot be read (EIO from an unset
    # stable_secret); the command then reads each value on its own, as it did before awk.
    # An awk that always fails stands in for that here: the report must be the same.
    failing = tmp_path / "awk"
    failing.write_text("#!/bin/sh\nexit 2\n")
    failing.chmod(0o755)
    fact = SysctlState()
    command = fact.command(
        keys=["kernel.ostype", "gpunode.no_such_key", "net.ipv4.conf.*.forwarding"]
    )
    fast = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    slow = subprocess.run(
        ["sh", "-c", f'PATH="{tmp_path}:$PATH"; {command}'],
        capture_output=True,
        text=True,
        check=True,
    )
    parsed = fact.process(slow.stdout.splitlines())
    assert parsed == fact.process(fast.stdout.splitlines())
    assert parsed["keys"]["kernel.ostype"] == [entry("kernel.ostype", "Linux", writable=False)]
    assert parsed["keys"]["gpunode.no_such_key"] == []


# --- modules -------------------------------------------------------------------------------


def test_blacklist_file_from_data() -> None:
    modules, refused = blacklisted_modules(("cramfs", "dccp", "cramfs"))
    assert refused == []
    assert render_module_blacklist(modules).splitlines()[1:] == [
        "install cramfs /bin/false",
        "blacklist cramfs",
        "install dccp /bin/false",
        "blacklist dccp",
    ]


def test_gpu_and_boot_modules_are_never_blacklisted() -> None:
    modules, refused = blacklisted_modules(
        ("nvidia", "nvidia-drm", "nvidia_uvm", "nouveau", "squashfs", "vfat", "fat", "udf")
    )
    assert modules == ["udf"]
    assert len(refused) == 7
    assert (
        refused[0] == "kernel module nvidia is never blacklisted: GPU nodes need the NVIDIA driver"
    )
    assert "kernel module vfat is never blacklisted: the EFI system partition is vfat" in refused


def test_default_blacklist_is_kept_whole() -> None:
    modules, refused = blacklisted_modules(DesiredState().kernel.blacklist_modules)
    assert refused == []
    assert modules == list(DesiredState().kernel.blacklist_modules)


# --- login ---------------------------------------------------------------------------------

DEBIAN_LOGIN_DEFS = """\
# Comments stay
#UMASK 077
UMASK\t\t022
PASS_MAX_DAYS\t99999
PASS_WARN_AGE\t7
ENCRYPT_METHOD SHA512
"""


def test_login_defs_parsing_ignores_comments() -> None:
    assert parse_login_defs(DEBIAN_LOGIN_DEFS.splitlines()) == {
        "UMASK": "022",
        "PASS_MAX_DAYS": "99999",
        "PASS_WARN_AGE": "7",
        "ENCRYPT_METHOD": "SHA512",
    }


def test_login_defs_lines_are_edited_in_place_and_missing_ones_appended(tmp_path: Path) -> None:
    path = tmp_path / "login.defs"
    path.write_text(DEBIAN_LOGIN_DEFS)
    wanted = {"UMASK": "027", "PASS_MAX_DAYS": "60", "PASS_WARN_AGE": "7", "PASS_MIN_DAYS": "7"}
    commands = login_defs_commands(
        parse_login_defs(DEBIAN_LOGIN_DEFS.splitlines()), wanted, str(path)
    )
    assert len(commands) == 3  # PASS_WARN_AGE is already right
    for command in commands:
        subprocess.run(["sh", "-c", command], check=True)
    assert path.read_text().splitlines() == [
        "# Comments stay",
        "#UMASK 077",
        "UMASK 027",
        "PASS_MAX_DAYS 60",
        "PASS_WARN_AGE\t7",
        "ENCRYPT_METHOD SHA512",
        "PASS_MIN_DAYS 7",
    ]
    assert login_defs_commands(parse_login_defs(path.read_text().splitlines()), wanted) == []


def test_login_defs_operation_is_a_noop_when_right() -> None:
    commands, noops = commands_of(
        login_defs, {LoginDefs: {"UMASK": "027"}}, settings={"UMASK": "027"}
    )
    assert commands == []
    assert noops == ["/etc/login.defs already has all 1 settings"]


def test_key_only_accounts_lose_their_password_expiry() -> None:
    accounts = parse_password_states(
        [
            "root|locked|99999",
            "gpuadmin|locked|60",
            "alice|password|60",
            "_apt|locked|",
            "svc|locked|-1",
        ]
    )
    assert accounts_needing_no_expiry(accounts) == ["gpuadmin"]
    commands, _ = commands_of(no_password_expiry_for_key_only_accounts, {PasswordStates: accounts})
    assert commands == ["chage -M -1 gpuadmin"]


def test_permissions_only_ever_tighten() -> None:
    current = parse_file_modes(
        [
            "/etc/shadow|644|root|root",
            "/etc/crontab|600|root|root",
            "/etc/cron.d|755|root|root",
            "/etc/gshadow|600|root|shadow",
        ]
    )
    ceilings = {
        "/etc/shadow": (0o640, "root", "shadow"),
        "/etc/gshadow": (0o640, "root", "shadow"),
        "/etc/crontab": (0o600, "root", None),
        "/etc/cron.d": (0o700, "root", None),
        "/etc/cron.weekly": (0o700, "root", None),
    }
    assert permission_commands(current, ceilings) == [
        "chmod 640 /etc/shadow",
        "chown root:shadow /etc/shadow",
        "chmod 700 /etc/cron.d",
    ]


def test_sysctl_file_never_gets_a_second_line_from_a_value() -> None:
    # Issue 12: a newline in a value added a sysctl. Validation refuses it
    # (tests/unit/test_model.py); the renderer refuses to write it as well.
    with pytest.raises(ValueError, match="control character"):
        render_sysctl_conf({"vm.max_map_count": "262144\nkernel.modprobe = /tmp/x"})


def test_the_sysctl_file_is_applied_after_every_packaged_one() -> None:
    # systemd-sysctl applies sysctl.d files by name, the last value winning: Debian's
    # procps protect-links.conf (fs.protected_fifos = 1) must come before gpunode's file.
    from pathlib import PurePosixPath

    from roles.kernel import OLD_SYSCTL_PATHS, SYSCTL_PATH

    packaged = ["50-default.conf", "50-pid-max.conf", "99-sysctl.conf", "protect-links.conf"]
    names = sorted([*packaged, PurePosixPath(SYSCTL_PATH).name])
    assert names[-1] == PurePosixPath(SYSCTL_PATH).name
    assert SYSCTL_PATH not in OLD_SYSCTL_PATHS
    # The old name sorted before protect-links.conf: a reboot undid fs.protected_fifos = 2.
    assert sorted([*packaged, PurePosixPath(OLD_SYSCTL_PATHS[0]).name])[-1] == "protect-links.conf"

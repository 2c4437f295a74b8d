"""Kernel, module and login hardening in the spirit of dev-sec os_hardening, GPU-host safe.

Where dev-sec's choice breaks GPU or container hosts, gpunode differs on purpose:

* ``net.ipv4.ip_forward`` (and IPv6 forwarding) follow ``desired.ip_forward``: Docker and
  Kubernetes networking need them on.
* ``kernel.yama.ptrace_scope`` comes from data (default 1, so cuda-gdb and py-spy attach to
  their own children); dev-sec's 2 needs root for every debugger.
* ``net.ipv4.tcp_timestamps`` stays on (dev-sec turns it off): high-throughput TCP, as used by
  NCCL's socket transport and storage traffic, relies on it for RTT estimates and PAWS.
* ``net.ipv6.conf.all.disable_ipv6`` is not set: IPv6-only fabrics exist.
* squashfs, vfat (and fat) and the NVIDIA modules are never blacklisted; nouveau is the NVIDIA
  driver role's business.

The sysctls are written to one file under /etc/sysctl.d and applied to the running kernel
key by key. Inside a container only keys that belong to the container's own namespaces and
are writable are applied; every other key is reported with the reason it was skipped.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from io import StringIO
from typing import Any, Literal

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.operations import files

from facts.kernel import FileModes, LoginDefs, PasswordStates, SysctlState
from gpunode.expected.packages import PASSWORD_QUALITY_PACKAGE
from gpunode.model import KUBERNETES_SYSCTLS, DesiredState
from gpunode.schema import one_line
from roles.packages import install_packages

# systemd-sysctl applies the sysctl.d files of /etc, /run and /usr/lib in the order of their
# names, the last value of a key winning; Debian's procps ships protect-links.conf (with
# fs.protected_fifos = 1), which sorts after any name that starts with a digit: under the
# old name 90-gpunode-hardening.conf, a reboot of a Debian 12 host put
# fs.protected_fifos back to 1. "zz-" sorts after every packaged file.
SYSCTL_PATH = "/etc/sysctl.d/zz-gpunode-hardening.conf"
# Where earlier gpunode versions wrote it: removed, so that one file holds the values.
OLD_SYSCTL_PATHS = ("/etc/sysctl.d/90-gpunode-hardening.conf",)
BLACKLIST_PATH = "/etc/modprobe.d/gpunode-blacklist.conf"
LIMITS_PATH = "/etc/security/limits.d/gpunode.conf"
COREDUMP_PATH = "/etc/systemd/coredump.conf.d/gpunode.conf"
PROFILE_PATH = "/etc/profile.d/gpunode-core-dumps.sh"
LOGIN_DEFS_PATH = "/etc/login.defs"
PAM_SU_PATH = "/etc/pam.d/su"

# dev-sec os_hardening's sysctl_config, minus what breaks GPU/container hosts (module doc).
HARDENED_SYSCTLS: dict[str, str] = {
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
    # Constant blinding in the BPF JIT for every program, root's too (KSPP's recommended
    # settings; lynis KRNL-6000's profile wants 2, lynis 3.0.8 and 3.1.4, default.prf). It costs
    # eBPF-heavy networking (Cilium) a little CPU and hides JITed programs from kallsyms, and
    # touches no GPU or RDMA path. One copy per kernel (init_net only): a container has none.
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

# Keys with one copy per container (network, IPC, UTS and user namespaces); all others are
# the host kernel's, and writing them from a container (where that is possible at all, e.g.
# a privileged one) would change the host.
NAMESPACED_PREFIXES = (
    "net.", "kernel.shm", "kernel.msg", "kernel.sem", "kernel.hostname", "kernel.domainname",
    "fs.mqueue.", "user.",
)  # fmt: skip
# ... except these under net.: the BPF JIT's keys are registered for the initial network
# namespace only (net/core/sysctl_net_core.c, net_core_table), so they are the host's.
HOST_ONLY_PREFIXES = ("net.core.bpf_jit_",)

# Once a key holds this value, the kernel refuses every other value until reboot.
LOCKED_VALUES = {
    "kernel.kexec_load_disabled": "1",
    "kernel.modules_disabled": "1",
    "kernel.unprivileged_bpf_disabled": "1",
    "kernel.yama.ptrace_scope": "3",
}

# Writing the key makes the kernel rewrite the others (inet_forward_change() sets
# all.accept_redirects to the opposite of forwarding), so they are written again after it.
REWRITTEN_BY = {
    "net.ipv4.ip_forward": ("net.ipv4.conf.all.accept_redirects",),
    "net.ipv4.conf.all.forwarding": ("net.ipv4.conf.all.accept_redirects",),
}

# Modules gpunode never blacklists, whatever the data says, and why.
PROTECTED_MODULES = {
    "nouveau": "nouveau is handled by the NVIDIA driver role",
    "squashfs": "snaps and many images mount squashfs",
    "vfat": "the EFI system partition is vfat",
    "fat": "vfat needs it, and the EFI system partition is vfat",
}

# dev-sec's login.defs values (password ageing, umask, hashing). Lines are edited in place.
LOGIN_DEFS: dict[str, str] = {
    "UMASK": "027",
    "PASS_MAX_DAYS": "60",
    "PASS_MIN_DAYS": "7",
    "PASS_WARN_AGE": "7",
    "LOGIN_RETRIES": "5",
    "LOGIN_TIMEOUT": "60",
    "ENCRYPT_METHOD": "SHA512",
    "SHA_CRYPT_MIN_ROUNDS": "65536",
    "SHA_CRYPT_MAX_ROUNDS": "65536",
}

# Upper bounds for modes (bits are only ever removed, never added) and owners.
# dev-sec: shadow files root:shadow 0640 at most; cron tables and directories root-only.
PERMISSION_CEILINGS: dict[str, tuple[int, str | None, str | None]] = {
    "/etc/passwd": (0o644, "root", "root"),
    "/etc/group": (0o644, "root", "root"),
    "/etc/shadow": (0o640, "root", "shadow"),
    "/etc/gshadow": (0o640, "root", "shadow"),
    "/etc/shadow-": (0o640, "root", "shadow"),
    "/etc/gshadow-": (0o640, "root", "shadow"),
    "/etc/crontab": (0o600, "root", None),
    "/etc/cron.d": (0o700, "root", None),
    "/etc/cron.hourly": (0o700, "root", None),
    "/etc/cron.daily": (0o700, "root", None),
    "/etc/cron.weekly": (0o700, "root", None),
    "/etc/cron.monthly": (0o700, "root", None),
}

# Five or more of the words lynis (BANN-7126/7130) looks for in a legal notice.
LOGIN_BANNER = (
    "Authorized access only. This system is private property; all activity is monitored\n"
    "and logged, and may be reported to law enforcement. Unauthorized use is prohibited.\n"
)

LIMITS = (
    "# Managed by gpunode: no core dumps (they can hold secrets and fill disks).\n"
    "* soft core 0\n"
    "* hard core 0\n"
)
COREDUMP_DROPIN = "# Managed by gpunode\n[Coredump]\nStorage=none\nProcessSizeMax=0\n"
PROFILE = "# Managed by gpunode: no core dumps from login shells.\nulimit -c 0\n"
# su only for the sudo group; root keeps su through pam_rootok, which comes first.
PAM_WHEEL_LINE = "auth       required   pam_wheel.so use_uid group=sudo"
PAM_WHEEL_PATTERN = r"^#?\s*auth\s+required\s+pam_wheel\.so(\s+use_uid)?(\s+group=\S+)?\s*$"


# --- sysctls -----------------------------------------------------------------------------


def sysctl_values(desired: DesiredState) -> dict[str, str]:
    """Every sysctl gpunode sets on this host: hardened values, data choices, overrides."""
    forward = "1" if desired.ip_forward else "0"
    values = {
        "net.ipv4.ip_forward": forward,
        "net.ipv6.conf.all.forwarding": forward,
        **HARDENED_SYSCTLS,
        "kernel.yama.ptrace_scope": str(desired.kernel.ptrace_scope),
    }
    if desired.kubernetes.enabled:
        # Present once br_netfilter is loaded (roles.kubernetes loads it before this role).
        values.update(KUBERNETES_SYSCTLS)
    values.update(desired.kernel.sysctls)
    return values


def render_sysctl_conf(values: dict[str, str]) -> str:
    """The sysctl.d file. The leading '-' lets boot go on past a key this kernel lacks; the
    role reports such keys on every run instead."""
    lines = [
        "# Managed by gpunode (kernel section of the inventory); local edits are replaced.",
        *(one_line(f"-{key} = {value}") for key, value in values.items()),
    ]
    return "\n".join(lines) + "\n"


def parse_sysctl_conf(text: str) -> dict[str, str]:
    """key -> value from a sysctl.d file (the inverse of :func:`render_sysctl_conf`)."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, value = line.split("=", 1)
        values[key.strip().lstrip("-")] = value.strip()
    return values


def is_namespaced(key: str) -> bool:
    return key.startswith(NAMESPACED_PREFIXES) and not key.startswith(HOST_ONLY_PREFIXES)


Decision = tuple[Literal["set", "ok", "skip"], str]


def unsettable_reason(entry: dict[str, Any], container: str) -> str | None:
    """Why this /proc/sys entry cannot (or must not) be written from here, or None."""
    name = entry["name"]
    in_container = container != "none"
    if in_container and not is_namespaced(name):
        if entry["writable"]:
            return (
                f"not namespaced, so writing it from this {container} container would change "
                "the host's kernel"
            )
        return f"read-only in this {container} container (not namespaced; set it on the host)"
    if not entry["writable"]:
        if in_container:
            return (
                f"read-only in this {container} container (the runtime mounts /proc/sys "
                "read-only; set it through the runtime)"
            )
        return "/proc/sys is not writable here"
    return None


def set_command(name: str, value: str) -> str:
    return f"sysctl -w {shlex.quote(f'{name}={value}')}"


def decide_sysctl(wanted: str, entry: dict[str, Any], container: str) -> Decision:
    """What to do about one /proc/sys entry: ("set", command), ("ok", "") or ("skip", why)."""
    name, value = entry["name"], entry["value"]
    wanted = " ".join(wanted.split())
    if value is None:
        return "skip", f"sysctl {name} skipped: its value cannot be read back, so it is left"
    if value == wanted:
        return "ok", ""
    state = f"(is {value}, wanted {wanted})"
    if LOCKED_VALUES.get(name) == value:
        return "skip", (
            f"sysctl {name} skipped: locked at {value} until reboot {state}; "
            f"{SYSCTL_PATH} applies at boot"
        )
    reason = unsettable_reason(entry, container)
    if reason:
        return "skip", f"sysctl {name} skipped: {reason} {state}"
    return "set", set_command(name, wanted)


def missing_reason(key: str, container: str) -> str:
    if container != "none":
        return (
            f"sysctl {key} skipped: not present in this {container} container (the kernel "
            "lacks it, or it is not visible from the container's namespaces)"
        )
    return f"sysctl {key} skipped: it does not exist on this kernel"


def plan_sysctls(values: dict[str, str], report: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(commands, no-op notes) that bring the running kernel to ``values``, in their order."""
    container = report["container"]
    decisions: list[tuple[str, dict[str, Any], Decision]] = []
    notes: list[str] = []
    for key, wanted in values.items():
        entries = report["keys"].get(key, [])
        if not entries:
            decisions.append((wanted, {"name": key}, ("skip", missing_reason(key, container))))
        decisions += [(wanted, entry, decide_sysctl(wanted, entry, container)) for entry in entries]
    rewritten = {
        other
        for _, entry, (action, _) in decisions
        if action == "set"
        for other in REWRITTEN_BY.get(entry["name"], ())
    }
    commands: list[str] = []
    already = 0
    for wanted, entry, (action, detail) in decisions:
        if action == "set":
            commands.append(detail)
        elif action == "skip":
            notes.append(detail)
        elif entry["name"] in rewritten and not unsettable_reason(entry, container):
            commands.append(set_command(entry["name"], " ".join(wanted.split())))
        else:
            already += 1
    if already:
        notes.insert(0, f"{already} sysctls already have the wanted value")
    return commands, notes


@operation()
def live_sysctls(values: dict[str, str]):
    """The running kernel holds ``values`` wherever it can be set from here.

    Each key that cannot (absent, read-only, another kernel's, locked) is reported with why.

    + values: sysctl key -> wanted value (``sysctl_values``: hardened values, data choices,
      ``kernel.sysctls`` overrides), set in this order
    """
    report = host.get_fact(SysctlState, keys=list(values))
    commands, notes = plan_sysctls(values, report)
    for note in notes:
        host.noop(note)
    if commands:
        # One command, in their order, stopping at the first that fails: a fresh node changes
        # some thirty keys, each otherwise a round trip and a sudo of its own.
        yield " && ".join(commands)


# --- modules -----------------------------------------------------------------------------


def protected_reason(module: str) -> str | None:
    """Why ``module`` must never be blacklisted, or None. modprobe treats - and _ alike."""
    normalized = module.replace("-", "_")
    if normalized.startswith("nvidia"):
        return "GPU nodes need the NVIDIA driver"
    return PROTECTED_MODULES.get(normalized)


def blacklisted_modules(modules: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(modules to blacklist, notes on the ones refused)."""
    allowed: list[str] = []
    notes: list[str] = []
    for module in modules:
        reason = protected_reason(module)
        if reason:
            notes.append(f"kernel module {module} is never blacklisted: {reason}")
        elif module not in allowed:
            allowed.append(module)
    return allowed, notes


def render_module_blacklist(modules: list[str]) -> str:
    """``install <mod> /bin/false`` also stops loading by dependency or alias."""
    lines = ["# Managed by gpunode (kernel.blacklist_modules); local edits are replaced."]
    for module in modules:
        lines += [f"install {module} /bin/false", f"blacklist {module}"]
    return "\n".join(lines) + "\n"


@operation()
def refused_modules(notes: list[str]):
    """Report blacklist entries that gpunode refuses; changes nothing.

    + notes: one line per refused ``kernel.blacklist_modules`` entry, naming the module and why
    """
    for note in notes:
        host.noop(note)
    yield from ()


# --- login -------------------------------------------------------------------------------


def login_defs_commands(
    current: dict[str, str], wanted: dict[str, str], path: str = LOGIN_DEFS_PATH
) -> list[str]:
    """sed/append commands that set each ``wanted`` login.defs line, leaving the rest."""
    commands = []
    for name, value in wanted.items():
        if current.get(name) == value:
            continue
        line = f"{name} {value}"
        if name in current:
            commands.append(
                f"sed -i -E {shlex.quote(f's/^[[:space:]]*{name}([[:space:]].*)?$/{line}/')} {path}"
            )
        else:
            commands.append(f"printf '%s\\n' {shlex.quote(line)} >> {path}")
    return commands


@operation()
def login_defs(settings: dict[str, str]):
    """/etc/login.defs holds each of ``settings``; other lines and comments stay as they are.

    + settings: login.defs name -> value (``LOGIN_DEFS``); a line setting the name is
      replaced, else one is appended
    """
    current = host.get_fact(LoginDefs)
    commands = login_defs_commands(current, settings)
    if not commands:
        host.noop(f"{LOGIN_DEFS_PATH} already has all {len(settings)} settings")
    yield from commands


def accounts_needing_no_expiry(accounts: dict[str, dict[str, Any]]) -> list[str]:
    """Key-only accounts (locked password) that have a maximum password age.

    Once such a password "expires", PAM makes sshd demand a password change at login, which a
    key-only user cannot make: a non-interactive login (pyinfra) is refused outright.
    PASS_MAX_DAYS applies to every account useradd creates, so it must not reach these.
    """
    return sorted(
        name
        for name, account in accounts.items()
        if account["password_locked"] and account["max_days"] not in (None, -1, 99999)
    )


@operation()
def no_password_expiry_for_key_only_accounts():
    """Accounts without a usable password have no password ageing, so they never lock out."""
    names = accounts_needing_no_expiry(host.get_fact(PasswordStates))
    if not names:
        host.noop("no key-only account has a password expiry")
    for name in names:
        yield f"chage -M -1 {shlex.quote(name)}"


def permission_commands(
    current: dict[str, dict[str, Any]],
    ceilings: Mapping[str, tuple[int, str | None, str | None]],
) -> list[str]:
    """chmod/chown commands that bring existing paths within ``ceilings``; absent paths stay
    absent and stricter modes stay stricter."""
    commands = []
    for path, (ceiling, user, group) in ceilings.items():
        stat = current.get(path)
        if stat is None:
            continue
        if stat["mode"] & ~ceiling:
            commands.append(f"chmod {stat['mode'] & ceiling:o} {shlex.quote(path)}")
        wanted_user = user or stat["user"]
        wanted_group = group or stat["group"]
        if (stat["user"], stat["group"]) != (wanted_user, wanted_group):
            commands.append(f"chown {wanted_user}:{wanted_group} {shlex.quote(path)}")
    return commands


@operation()
def permission_ceilings(ceilings: dict[str, tuple[int, str | None, str | None]]):
    """Each existing path in ``ceilings`` has at most its mode bits and the given owners.

    + ceilings: path -> (highest mode, owner, group) (``PERMISSION_CEILINGS``); mode bits are
      only removed, and an owner or group of None is left as it is
    """
    current = host.get_fact(FileModes, paths=list(ceilings))
    commands = permission_commands(current, ceilings)
    if not commands:
        host.noop(f"{len(current)} account and cron files already within their modes")
    yield from commands


# --- the role ----------------------------------------------------------------------------


def _managed_file(name: str, path: str, content: str, mode: str = "644") -> None:
    files.put(name=name, src=StringIO(content), dest=path, mode=mode, user="root", group="root")


@deploy("Kernel and login hardening")
def kernel_hardening(desired: DesiredState) -> None:
    values = sysctl_values(desired)
    _managed_file("Persistent sysctls", SYSCTL_PATH, render_sysctl_conf(values))
    for old_path in OLD_SYSCTL_PATHS:
        files.file(name="No sysctl file of an earlier gpunode", path=old_path, present=False)
    live_sysctls(name="Sysctls in the running kernel", values=values)

    modules, refused = blacklisted_modules(desired.kernel.blacklist_modules)
    if refused:
        refused_modules(name="Module blacklist entries refused", notes=refused)
    if modules:
        _managed_file("Kernel module blacklist", BLACKLIST_PATH, render_module_blacklist(modules))
    else:
        files.file(name="No kernel module blacklist", path=BLACKLIST_PATH, present=False)

    files.directory(name="systemd-coredump drop-in directory", path=COREDUMP_PATH.rsplit("/", 1)[0])
    _managed_file("No core dumps: limits", LIMITS_PATH, LIMITS)
    _managed_file("No core dumps: systemd-coredump", COREDUMP_PATH, COREDUMP_DROPIN)
    _managed_file("No core dumps: login shells", PROFILE_PATH, PROFILE)

    login_defs(name="Password ageing, umask and hashing in login.defs", settings=LOGIN_DEFS)
    no_password_expiry_for_key_only_accounts(name="No password expiry on key-only accounts")
    # dev-sec's password quality checks (only for password changes; keys are unaffected).
    install_packages("Password quality checks (passwdqc)", [PASSWORD_QUALITY_PACKAGE])
    files.line(
        name="su only for the sudo group",
        path=PAM_SU_PATH,
        line=PAM_WHEEL_PATTERN,
        replace=PAM_WHEEL_LINE,
        extended_regex=True,
    )
    permission_ceilings(name="Account and cron file permissions", ceilings=PERMISSION_CEILINGS)
    _managed_file("Login banner (console)", "/etc/issue", LOGIN_BANNER)
    _managed_file("Login banner (network)", "/etc/issue.net", LOGIN_BANNER)

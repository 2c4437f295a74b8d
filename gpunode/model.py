"""The desired-state model: everything an inventory may declare for a host, typed and checked.

This module is the one place where defaults live. Each setting's default is the safe choice:
nothing is installed that is not declared, no reboot happens unless asked for, and the
firewall never shuts out SSH by default. ``gpunode defaults`` prints this table.

Inventory data reaches pyinfra as flat host data (group_data files, host tuples); the keys
below are its top-level keys. Keys that belong to pyinfra itself (connector settings such as
``ssh_user``, global arguments such as ``_sudo``) pass through; keys prefixed ``x_`` are free
for an operator's own deploys; any other unknown key is an error, so a typo never silently
falls back to a default.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import ipaddress
import posixpath
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gpunode import distributions, nvidia_releases
from gpunode.sanitize import clean_text
from gpunode.schema import Builder, Problem, setting, spec, unknown_key

# --- value checks -------------------------------------------------------------------------

USER_NAME = r"[a-z_][a-z0-9_-]{0,31}"
_DNS_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
DNS_NAME = rf"(?=.{{1,253}}$)(\*\.)?{_DNS_LABEL}(\.{_DNS_LABEL})*"
HOST_NAME = rf"(?=.{{1,253}}$){_DNS_LABEL}(\.{_DNS_LABEL})*"
# Debian package version: [epoch:]upstream[-revision]; upstream must start with a digit.
APT_VERSION = r"([0-9]+:)?[0-9][A-Za-z0-9.+~]*(-[A-Za-z0-9.+~]+)?"
# Driver packages: the upstream part is the driver version itself, e.g. 550.127.08.
DRIVER_APT_VERSION = r"([0-9]+:)?[0-9]{3}\.[0-9]+(\.[0-9]+)?(-[A-Za-z0-9.+~]+)?"
DRIVER_BRANCH = r"[0-9]{3}"
CUDA_RELEASE = r"[0-9]{2}\.[0-9]"
# A URL's path: what apt repository paths use. No quote, semicolon, brace, space, backslash,
# '$' or '#': apt.conf has no escape for any of them, so a proxy URL is safe in it only
# because it cannot hold them; '%' only as a percent-escape.
_URL_PATH = r"(/([A-Za-z0-9._~+@:=,-]|%[0-9A-Fa-f]{2})*)*"
URL_ACCEPTS = (
    "an http:// or https:// URL: a DNS name or IP address, an optional port from 1 to 65535 "
    "and a path of letters, digits and ._~+@:=,-/ (no user, query or fragment)"
)
# A path on the node: one strict character set, no '.'/'..' components, no '//', no
# trailing '/', so that the text is already its normal form.
_PATH_CHARACTERS = r"[A-Za-z0-9._+@-]"
ABSOLUTE_PATH = rf"/|(/{_PATH_CHARACTERS}+)+"
ABSOLUTE_PATH_ACCEPTS = (
    "an absolute path of letters, digits and ._+@- with no '.' or '..' component, no '//' "
    "and no trailing '/'"
)
# Linux interface names: at most 15 bytes (IFNAMSIZ - 1), no '/' or space.
INTERFACE_NAME = r"[A-Za-z0-9_.-]{1,15}"
# RFC 5280 ub-common-name: a certificate's commonName holds at most 64 characters.
MAX_COMMON_NAME = 64
# sysctl values: words of the characters sysctls take (numbers, names, paths, masks, CPU
# lists) separated by single spaces; sysctl.d strips outer blanks, so none are allowed.
SYSCTL_VALUE = r"[A-Za-z0-9._:/%@+,=-]+( [A-Za-z0-9._:/%@+,=-]+)*"
# NCCL values: lists such as '^docker0,lo', '=eth0', 'mlx5_0:1,mlx5_1:1', paths with %h/%p.
NCCL_VALUE = r"[A-Za-z0-9._:/%@+,=^-]+"
# One word of a command gpunode runs as given (no shell syntax; quoted on the way anyway).
COMMAND_WORD = r"[A-Za-z0-9._/=:@+-]+"

SSH_KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)
MIN_RSA_BITS = 3072

# CUDA releases gpunode knows, with the driver each bundles (gpunode/nvidia_releases.py has
# NVIDIA's tables and their sources).
CUDA_MINIMUM_DRIVER: dict[str, str] = {
    release: nvidia_releases.bundled_driver(release) for release in nvidia_releases.releases()
}

# GPUs that support Multi-Instance GPU (NVIDIA MIG user guide, supported GPUs).
MIG_CAPABLE_MODELS = ("A100", "A30", "H100", "H200", "H800", "B200", "GB200")

NCCL_VARIABLES = frozenset(
    {
        "NCCL_ALGO", "NCCL_BUFFSIZE", "NCCL_COLLNET_ENABLE", "NCCL_CROSS_NIC", "NCCL_DEBUG",
        "NCCL_DEBUG_FILE", "NCCL_DEBUG_SUBSYS", "NCCL_IB_ADAPTIVE_ROUTING", "NCCL_IB_DISABLE",
        "NCCL_IB_GID_INDEX", "NCCL_IB_HCA", "NCCL_IB_PCI_RELAXED_ORDERING",
        "NCCL_IB_QPS_PER_CONNECTION", "NCCL_IB_RETRY_CNT", "NCCL_IB_SL",
        "NCCL_IB_SPLIT_DATA_ON_QPS", "NCCL_IB_TC", "NCCL_IB_TIMEOUT",
        "NCCL_IGNORE_CPU_AFFINITY", "NCCL_LAUNCH_MODE", "NCCL_MAX_NCHANNELS",
        "NCCL_MIN_NCHANNELS", "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ", "NCCL_NET_PLUGIN",
        "NCCL_NSOCKS_PERTHREAD", "NCCL_NVLS_ENABLE", "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL",
        "NCCL_PROTO", "NCCL_SHM_DISABLE", "NCCL_SOCKET_FAMILY", "NCCL_SOCKET_IFNAME",
        "NCCL_SOCKET_NTHREADS", "NCCL_TOPO_FILE",
    }
)  # fmt: skip

IB_RATES_GBPS = Literal[10, 20, 40, 56, 100, 200, 400, 800]


def upstream_version(apt_version: str) -> str:
    """'1:550.127.08-1' -> '550.127.08': the driver version nvidia-smi reports."""
    without_epoch = apt_version.split(":", 1)[-1]
    return without_epoch.rsplit("-", 1)[0] if "-" in without_epoch else without_epoch


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"[0-9]+", version))


# Python's ipaddress takes any text after '%' as an IPv6 zone id, newlines included: the
# characters of an address are checked before it is parsed.
_IP_CHARACTERS = re.compile(r"[0-9A-Fa-f.:]+")
_NETWORK_CHARACTERS = re.compile(r"[0-9A-Fa-f.:]+/[0-9]{1,3}")


def check_cidr(value: str) -> str | None:
    if "%" in value:
        return "an IPv6 zone id has no place in a network"
    if not _NETWORK_CHARACTERS.fullmatch(value):
        return "not a network in CIDR form"
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError as error:
        return "host bits set" if "host bits" in str(error) else "not a network in CIDR form"
    return None


def check_ip_address(value: str) -> str | None:
    if "%" in value:
        return "an IPv6 zone id is not accepted here"
    if not _IP_CHARACTERS.fullmatch(value):
        return "not an IP address"
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return "not an IP address"
    return None


def check_listen_address(value: str) -> str | None:
    """An IP address, or a link-local IPv6 address with the zone id of an interface name."""
    address, percent, zone = value.partition("%")
    if percent and not re.fullmatch(INTERFACE_NAME, zone):
        return "the zone id after '%' is not an interface name"
    reason = check_ip_address(address)
    if reason:
        return reason
    if percent and ipaddress.ip_address(address).version != 6:
        return "a zone id is for IPv6 addresses only"
    return None


def check_interface_address(value: str) -> str | None:
    if "%" in value:
        return "an IPv6 zone id is not accepted here"
    if "/" not in value:
        return "prefix length missing"
    if not _NETWORK_CHARACTERS.fullmatch(value):
        return "not an address with prefix length"
    try:
        ipaddress.ip_interface(value)
    except ValueError:
        return "not an address with prefix length"
    return None


_URL = re.compile(
    r"(?P<scheme>https?)://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)"
    rf"(:(?P<port>[0-9]{{1,5}}))?(?P<path>{_URL_PATH})"
)


def check_url(value: str) -> str | None:
    """A plain http(s) URL whose every part is checked for its kind (apt reads it unquoted)."""
    match = _URL.fullmatch(value)
    if match is None:
        return "malformed"
    host = match["host"]
    if host.startswith("["):
        if check_ip_address(host[1:-1]) or ipaddress.ip_address(host[1:-1]).version != 6:
            return f"{host} is not an IPv6 address"
    elif not re.fullmatch(r"[0-9.]+", host):
        if not re.fullmatch(DNS_NAME, host) or host.startswith("*"):
            return f"{host!r} is not a DNS name"
    elif check_ip_address(host):
        return f"{host!r} is not an IPv4 address"
    port = match["port"]
    if port is not None and not 1 <= int(port) <= 65535:
        return f"port {port} is not from 1 to 65535"
    return None


REPO_URL_ACCEPTS = (
    URL_ACCEPTS + "; {distro}, {arch} and {dpkg_arch} stand for the node's release and "
    "architecture as the repository names them (debian13, x86_64, amd64)"
)


def check_repo_url(value: str) -> str | None:
    """An NVIDIA repository URL: a plain URL once its placeholders are filled in."""
    return distributions.placeholder_problem(value) or check_url(
        distributions.without_placeholders(value)
    )


# Where a mount would hide or replace what the system runs on: the tree itself and
# everything under it. /var is refused whole, /var/lib included: a cache mounted over
# /var/lib/docker or /var/lib/dpkg hides what is there; point the service at the cache
# instead.
SYSTEM_TREES = (
    "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32",
    "/proc", "/root", "/run", "/sbin", "/sys", "/tmp", "/usr", "/var",
)  # fmt: skip
# Top-level directories that are refused themselves, while a directory below them is a
# normal dedicated place (/mnt/nvme, /srv/cache, /opt/cache).
SYSTEM_DIRECTORIES = ("/", "/mnt", "/media", "/opt", "/srv")


def check_absolute_path(value: str) -> str | None:
    """A node path in its normal form, of one strict character set."""
    if not value.startswith("/"):
        return "not an absolute path"
    if value != "/" and value.endswith("/"):
        return "ends with '/'"
    if "//" in value:
        return "has an empty component ('//')"
    components = value.split("/")[1:]
    if any(component in (".", "..") for component in components):
        return "has a '.' or '..' component"
    if not re.fullmatch(ABSOLUTE_PATH, value):
        return "has a character outside letters, digits and ._+@-"
    return None


def system_directory(path: str) -> str | None:
    """The system directory ``path`` is or lies under (normalised first), else None."""
    normal = posixpath.normpath("/" + path.lstrip("/"))
    if normal in SYSTEM_DIRECTORIES:
        return normal
    for tree in SYSTEM_TREES:
        if normal == tree or normal.startswith(tree + "/"):
            return tree
    return None


# Uncompressed EC points (0x04 || X || Y) per curve: the key type names its curve.
_EC_POINT_BYTES = {"nistp256": 65, "nistp384": 97, "nistp521": 133}
ED25519_KEY_BYTES = 32


def check_ssh_public_key(value: str) -> str | None:
    """One OpenSSH public key line '<type> <base64> [comment]' and nothing else: no options
    before the type (command=, from=), no second line, a blob that is exactly a key of its
    type (sshd would take a key line with an empty or truncated blob for what it says)."""
    if "PRIVATE KEY" in value:
        return "this is a PRIVATE key; give the public key (.pub) only"
    parts = value.split(" ", 2)
    if len(parts) < 2 or not parts[0] or not parts[1]:
        return "not a public key line"
    key_type, blob_text = parts[0], parts[1]
    if key_type not in SSH_KEY_TYPES:
        if any(part in SSH_KEY_TYPES for part in value.split()):
            return "options before the key type are not allowed (authorized_keys options)"
        return f"unsupported key type {key_type!r}"
    comment = parts[2] if len(parts) > 2 else ""
    if comment != comment.strip() or (len(parts) > 2 and not comment):
        return "blanks around the comment"
    if len(comment) > 256:
        return "comment longer than 256 characters"
    if not re.fullmatch(r"[A-Za-z0-9+/]+={0,2}", blob_text):
        return "key data is not valid base64"
    try:
        blob = base64.b64decode(blob_text, validate=True)
    except (binascii.Error, ValueError):
        return "key data is not valid base64"
    fields = _ssh_strings(blob)
    if not fields or fields[0] != key_type.encode():
        return "key data does not match its key type"
    return _check_key_fields(key_type, fields[1:])


def _check_key_fields(key_type: str, fields: list[bytes]) -> str | None:
    """The wire-format fields after the type: exactly those the type has, each well formed."""
    if key_type in ("ssh-ed25519", "sk-ssh-ed25519@openssh.com"):
        wanted = 1 if key_type == "ssh-ed25519" else 2  # sk keys add the application
        if len(fields) != wanted or len(fields[0]) != ED25519_KEY_BYTES:
            return f"key data is not a {ED25519_KEY_BYTES}-byte Ed25519 key"
        if wanted == 2 and not fields[1]:
            return "security key without its application"
        return None
    if key_type == "ssh-rsa":
        if len(fields) != 2 or not fields[0] or not fields[1]:
            return "key data is not an RSA exponent and modulus"
        bits = int.from_bytes(fields[1], "big").bit_length()
        if bits < MIN_RSA_BITS:
            return f"RSA key of {bits} bits is too weak"
        return None
    # ecdsa-sha2-<curve> and sk-ecdsa-sha2-<curve>@openssh.com
    curve = key_type.split("@")[0].rsplit("-", 1)[-1]
    wanted = 3 if key_type.startswith("sk-") else 2
    if len(fields) != wanted or fields[0] != curve.encode():
        return f"key data does not name the curve {curve}"
    if len(fields[1]) != _EC_POINT_BYTES[curve] or fields[1][:1] != b"\x04":
        return f"key data is not a point on {curve}"
    if wanted == 3 and not fields[2]:
        return "security key without its application"
    return None


def _ssh_strings(blob: bytes) -> list[bytes]:
    """Split an SSH wire-format blob into its length-prefixed strings; [] if malformed."""
    out: list[bytes] = []
    offset = 0
    while offset < len(blob):
        if offset + 4 > len(blob):
            return []
        (length,) = struct.unpack(">I", blob[offset : offset + 4])
        offset += 4
        if offset + length > len(blob):
            return []
        out.append(blob[offset : offset + length])
        offset += length
    return out


# --- sections --------------------------------------------------------------------------------

SSH_KEY_ACCEPTS = (
    "one OpenSSH public key line '<type> <base64> [comment]', without options "
    f"(types: {', '.join(SSH_KEY_TYPES)}; RSA >= {MIN_RSA_BITS} bits)"
)

# Accounts a Debian system (or a package on a GPU node) owns: making one of them an admin
# would hand a daemon's identity a login and sudo. The static list is base-passwd's
# (Debian's master /etc/passwd, "Users and Groups in the Debian System",
# https://red-bean.com/doc/base-passwd/users-and-groups.html); the rest are dynamic system
# users of packages gpunode installs or Debian 12 images carry.
SYSTEM_ACCOUNTS = frozenset(
    {
        "root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp",
        "proxy", "www-data", "backup", "list", "irc", "gnats", "_gnats", "nobody", "_apt",
        "messagebus", "sshd", "polkitd", "nvidia-persistenced", "tss", "avahi", "statd",
        "_rpc", "ntp", "_chrony", "dnsmasq", "uuidd", "tcpdump", "usbmux", "rtkit",
        "colord", "pulse", "saned", "lightdm", "gdm", "Debian-exim", "postfix", "dcgm",
        "nvidia-dcgm", "prometheus", "cachefilesd", "opensm", "docker", "containerd",
        "operator", "halt", "shutdown", "adm", "staff", "users", "nogroup",
    }
)  # fmt: skip
# Prefixes of whole families of system accounts (systemd-network, systemd-timesync, ...).
SYSTEM_ACCOUNT_PREFIXES = ("systemd-", "_")


def check_admin_name(value: str) -> str | None:
    if value in SYSTEM_ACCOUNTS or value.startswith(SYSTEM_ACCOUNT_PREFIXES):
        return "a system account, not a personal one"
    return None


@dataclass(frozen=True)
class AdminUser:
    """An operator account: key-only login, optionally passwordless sudo."""

    name: str = setting(
        "", "login name", pattern=USER_NAME, required=True,
        accepts="a POSIX user name matching " + USER_NAME,
    )  # fmt: skip
    ssh_keys: tuple[str, ...] = setting(
        (),
        "authorized keys; managed exclusively",
        check=check_ssh_public_key,
        accepts=SSH_KEY_ACCEPTS,
    )
    sudo: bool = setting(True, "member of the sudo group with passwordless sudo")
    shell: str = setting(
        "/bin/bash", "login shell", check=check_absolute_path, accepts=ABSOLUTE_PATH_ACCEPTS
    )

    def validate(self, builder: Builder, path: str) -> None:
        if self.name == "root":
            builder.problem(
                f"{path}.name", self.name, "root is not an admin user", "a personal account"
            )
        elif check_admin_name(self.name):
            builder.problem(
                f"{path}.name",
                self.name,
                "a system account, not a personal one",
                "a personal account name (not one of Debian's or a package's system users)",
            )


@dataclass(frozen=True)
class Sshd:
    """sshd policy. The floor is dev-sec's ssh-baseline; these are the knobs operators turn."""

    port: int = setting(22, "listening port", min=1, max=65535)
    listen_addresses: tuple[str, ...] = setting(
        (), "addresses to listen on; empty means all", check=check_listen_address,
        accepts="IP addresses; a link-local IPv6 address may name its interface "
        "(fe80::1%eth0, interface names of letters, digits and _.-)",
    )  # fmt: skip
    permit_root_login: Literal["no", "prohibit-password"] = setting(
        "no", "root login: off, or key-only"
    )
    max_auth_tries: int = setting(2, "MaxAuthTries", min=1, max=6)
    # 10, dev-sec's, though lynis's SSH-7408 wants 2 (4 partly): an admin's multiplexed
    # sessions (ControlMaster) and pyinfra's SFTP beside its commands share one connection.
    max_sessions: int = setting(10, "MaxSessions", min=1, max=100)
    login_grace_time_s: int = setting(30, "LoginGraceTime in seconds", min=5, max=600)
    client_alive_interval_s: int = setting(300, "ClientAliveInterval in seconds", min=0, max=3600)
    # 2, one below dev-sec's 3: a silent session is closed after 2 unanswered keepalives
    # (10 min at the default interval) instead of 3; a live client answers every one, so
    # only dead or abandoned sessions go sooner. lynis's SSH-7408 scores 2 as hardened, up to
    # 4 as partly (lynis 3.0.8 and 3.1.4, include/tests_ssh).
    client_alive_count_max: int = setting(2, "ClientAliveCountMax", min=0, max=10)
    allow_tcp_forwarding: bool = setting(False, "AllowTcpForwarding")
    allow_agent_forwarding: bool = setting(False, "AllowAgentForwarding")
    x11_forwarding: bool = setting(False, "X11Forwarding")
    penalty_exempt_networks: tuple[str, ...] = setting(
        (),
        "control hosts sshd never penalises (PerSourcePenaltyExemptList, where OpenSSH has "
        "per-source penalties: trixie); otherwise a scan or failed logins from them shut them "
        "out for a while",
        check=check_cidr,
        accepts="networks in CIDR form, e.g. 10.0.0.5/32",
    )


@dataclass(frozen=True)
class FirewallRule:
    """An extra allow-rule: these ports from these source networks."""

    name: str = setting("", "label used in the rule comment", pattern=r"[A-Za-z0-9_.-]{1,32}")
    ports: tuple[int, ...] = setting((), "destination ports", min=1, max=65535)
    protocol: Literal["tcp", "udp"] = setting("tcp", "transport protocol")
    sources: tuple[str, ...] = setting(
        (), "source networks", check=check_cidr, accepts="networks in CIDR form, e.g. 10.0.0.0/8"
    )

    def validate(self, builder: Builder, path: str) -> None:
        if not self.ports:
            builder.problem(f"{path}.ports", list(self.ports), "empty", "at least one port")
        if not self.sources:
            builder.problem(f"{path}.sources", list(self.sources), "empty", "at least one network")


CIDR_ACCEPTS = "networks in CIDR form, e.g. 10.0.0.0/8 or fd00::/8"


@dataclass(frozen=True)
class Firewall:
    """nftables policy in gpunode's own table: default-drop input, allow-rules from data."""

    enabled: bool = setting(False, "manage the gpunode nftables table")
    admin_networks: tuple[str, ...] = setting(
        ("0.0.0.0/0", "::/0"),
        "where SSH is allowed from (default: anywhere, so enabling never locks you out; narrow it)",
        check=check_cidr,
        accepts=CIDR_ACCEPTS,
    )
    monitoring_networks: tuple[str, ...] = setting(
        (), "where metrics exporters may be scraped from", check=check_cidr, accepts=CIDR_ACCEPTS
    )
    metrics_ports: tuple[int, ...] = setting(
        (),
        "more TCP ports to open to monitoring_networks, beside those of the exporters gpunode "
        "runs (node_exporter.port, DCGM's exporter on 9400), which are opened by themselves",
        min=1,
        max=65535,
    )
    fabric_networks: tuple[str, ...] = setting(
        (), "cluster fabric networks, allowed everything (NCCL, RoCE)", check=check_cidr,
        accepts=CIDR_ACCEPTS,
    )  # fmt: skip
    extra_rules: tuple[FirewallRule, ...] = setting((), "additional allow-rules")
    rollback_after_s: int = setting(
        60, "seconds before a ruleset no new SSH login confirmed is reverted", min=5, max=600
    )
    ssh_preflight: bool = setting(
        True,
        "refuse a ruleset that would drop the control machine's SSH session; turn off only "
        "where NAT or a bastion makes the node's view of the client address misleading",
    )

    def validate(self, builder: Builder, path: str) -> None:
        if self.enabled and not self.admin_networks:
            builder.problem(
                f"{path}.admin_networks",
                [],
                "empty while the firewall is enabled, so SSH would be dropped from everywhere",
                "at least one network SSH is allowed from",
            )


@dataclass(frozen=True)
class Tls:
    """A node certificate from the control machine's internal CA; the key stays on the node."""

    enabled: bool = setting(False, "issue and install a node certificate")
    names: tuple[str, ...] = setting(
        (), "DNS names (subjectAltName); the host name is always included", pattern=DNS_NAME,
        accepts="DNS names such as node1.cluster.example",
    )  # fmt: skip
    ip_addresses: tuple[str, ...] = setting(
        (), "IP addresses (subjectAltName)", check=check_ip_address, accepts="IP addresses"
    )
    renew_before_days: int = setting(30, "re-issue when expiry is this close", min=1, max=365)
    validity_days: int = setting(365, "lifetime of an issued certificate", min=2, max=825)
    ca_directory: str | None = setting(
        None,
        "directory on the control machine holding the CA (ca.key, ca.crt); unset: "
        "$GPUNODE_CA_DIR, else ~/.local/share/gpunode/ca",
        check=check_absolute_path, accepts="an absolute path",
    )  # fmt: skip
    ca_passphrase_file: str | None = setting(
        None,
        "file on the control machine (mode 0600) holding the CA key's passphrase; "
        "$GPUNODE_CA_PASSPHRASE or $GPUNODE_CA_PASSPHRASE_FILE win when set",
        check=check_absolute_path, accepts="an absolute path",
    )  # fmt: skip

    def validate(self, builder: Builder, path: str) -> None:
        if self.renew_before_days >= self.validity_days:
            builder.problem(
                f"{path}.renew_before_days",
                self.renew_before_days,
                f"not below validity_days ({self.validity_days}), so every run would re-issue",
                "a number of days below validity_days",
            )


SYSCTL_NAME = r"[a-z0-9_]+(\.[a-zA-Z0-9_*-]+)+"


@dataclass(frozen=True)
class Kernel:
    """sysctl and module hardening in the spirit of dev-sec os_hardening, GPU-host compatible."""

    ptrace_scope: int = setting(
        1,
        "kernel.yama.ptrace_scope: 1 lets profilers attach to their own children "
        "(cuda-gdb, py-spy); 2 is dev-sec's admin-only; 3 forbids ptrace",
        min=0,
        max=3,
    )
    ip_forward: bool | None = setting(
        None,
        "net.ipv4.ip_forward; null: on when container_runtime.engines is set (Docker and "
        "Kubernetes networking need it), else off",
    )
    sysctls: dict[str, str] = field(
        default_factory=dict,
        metadata=spec(
            "extra sysctls, overriding gpunode's hardened values",
            accepts="sysctl names (e.g. vm.max_map_count) to values: words of letters, "
            "digits and ._:/%@+,=- separated by single spaces",
            pattern=SYSCTL_VALUE,
        ),
    )
    blacklist_modules: tuple[str, ...] = setting(
        # USB and FireWire storage (lynis USB-1000, STRG-1846): a GPU server in a data centre
        # takes no removable disks, and a plugged-in one is a way to carry data off. HID
        # (keyboards on the crash cart) is untouched: only the storage drivers go. dccp, sctp,
        # rds and tipc are blacklisted, yet lynis 3.0.8's NETW-3200 still counts them: it
        # accepts only "install <protocol> /bin/true" (tests_networking), and gpunode writes
        # /bin/false so that a load fails visibly (modprobe's exit status, its log) instead of
        # pretending to succeed.
        (
            "cramfs",
            "freevxfs",
            "jffs2",
            "hfs",
            "hfsplus",
            "udf",
            "dccp",
            "sctp",
            "rds",
            "tipc",
            "usb-storage",
            "firewire-core",
            "firewire-ohci",
        ),
        "kernel modules never loaded (squashfs and vfat stay: snaps and EFI need them)",
        pattern=r"[a-z0-9_-]+",
        accepts="kernel module names",
    )

    def validate(self, builder: Builder, path: str) -> None:
        for name in self.sysctls:
            if not re.fullmatch(SYSCTL_NAME, name):
                builder.problem(
                    f"{path}.sysctls.{name}",
                    self.sysctls[name],
                    "not a sysctl name",
                    "dotted names such as net.core.somaxconn",
                )


@dataclass(frozen=True)
class UnattendedUpgrades:
    """Debian security updates on their own; never NVIDIA, CUDA or kernel packages."""

    # Off by default, though lynis's PKGS-7420 counts it (1 of 5 points without a tool, 5 as
    # soon as /usr/bin/unattended-upgrade exists: lynis 3.0.8 and 3.1.4, tests_ports_packages).
    # A GPU node's packages change in a rollout (gpunode rollout: drained, converged, its
    # health gate passed); unattended-upgrades changes them on a node running jobs at a time
    # of its own: maintainer scripts restart what they upgrade (sshd, slurmd, munge, a
    # Debian-packaged containerd or docker, which stops the containers it runs), and its apt
    # run holds dpkg's lock under a converge. Held and blacklisted NVIDIA, CUDA and kernel
    # packages would be safe; the rest is not. A site that patches this way turns it on.
    enabled: bool = setting(False, "install and enable unattended-upgrades")
    blacklist: tuple[str, ...] = setting(
        ("nvidia-", "libnvidia-", "cuda-", "libcuda", "datacenter-gpu-manager", "firmware-nvidia-",
         "xserver-xorg-video-nvidia", "libnvcuvid", "libnvoptix", "libnccl", "libcudnn",
         "linux-image-", "linux-headers-", "linux-modules-"),
        "package name prefixes unattended-upgrades must never touch",
        pattern=r"[a-z0-9][a-z0-9+.-]*",
        accepts="package name prefixes",
    )  # fmt: skip


@dataclass(frozen=True)
class Repositories:
    """Where apt looks. Every URL can point at an air-gapped mirror."""

    debian_mirror: str = setting(
        "http://deb.debian.org/debian", "Debian archive", check=check_url, accepts=URL_ACCEPTS
    )
    debian_security_mirror: str = setting(
        "http://deb.debian.org/debian-security",
        "Debian security archive",
        check=check_url,
        accepts=URL_ACCEPTS,
    )
    debian_keyring: str | None = setting(
        None,
        "binary keyring (on the control machine) that signs debian_mirror and "
        "debian_security_mirror where a site re-signs its mirror (aptly, pulp, reprepro "
        "publish with their own key); installed as their signed-by keyring (Debian nodes). "
        "Unset: Debian's own keyring on the node (debian-archive-keyring)",
        pattern=r"[^\s]+\.gpg",
        accepts="a path to a .gpg keyring file",
    )
    debian_components: tuple[Literal["main", "contrib", "non-free", "non-free-firmware"], ...] = (
        setting(
            ("main", "contrib", "non-free", "non-free-firmware"),
            "components (non-free is needed for Debian's NVIDIA driver)",
        )
    )
    # Ubuntu nodes' archive (gpunode/distributions.py: the Ubuntu rows). Defaults: Ubuntu's
    # own archive and security hosts, as a 24.04 node's ubuntu.sources names them.
    ubuntu_mirror: str = setting(
        "http://archive.ubuntu.com/ubuntu", "Ubuntu archive (amd64)", check=check_url,
        accepts=URL_ACCEPTS,
    )  # fmt: skip
    ubuntu_security_mirror: str = setting(
        "http://security.ubuntu.com/ubuntu", "Ubuntu security archive (amd64)",
        check=check_url, accepts=URL_ACCEPTS,
    )  # fmt: skip
    ubuntu_components: tuple[Literal["main", "restricted", "universe", "multiverse"], ...] = (
        setting(
            ("main", "restricted", "universe", "multiverse"),
            "Ubuntu components (restricted holds Ubuntu's NVIDIA driver and its prebuilt "
            "kernel modules)",
        )
    )
    cuda_repo_url: str = setting(
        "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/{arch}",
        "NVIDIA CUDA repository; {distro}/{arch} become the node's (debian13/x86_64)",
        check=check_repo_url,
        accepts=REPO_URL_ACCEPTS,
    )
    container_toolkit_repo_url: str = setting(
        "https://nvidia.github.io/libnvidia-container/stable/deb/{dpkg_arch}",
        "libnvidia-container repository; {dpkg_arch} becomes the node's (amd64)",
        check=check_repo_url,
        accepts=REPO_URL_ACCEPTS,
    )
    cuda_keyring: str | None = setting(
        None,
        "binary keyring (on the control machine) that signs the CUDA repository; "
        "installed as its signed-by keyring",
        pattern=r"[^\s]+\.gpg",
        accepts="a path to a .gpg keyring file",
    )
    container_toolkit_keyring: str | None = setting(
        None,
        "binary keyring (on the control machine) that signs the libnvidia-container repository",
        pattern=r"[^\s]+\.gpg",
        accepts="a path to a .gpg keyring file",
    )
    ubuntu_driver_ppa_url: str | None = setting(
        None,
        "the graphics-drivers PPA (or its mirror), an extra source of Ubuntu's driver package "
        "names, read only with nvidia_driver.source ubuntu, e.g. "
        "https://ppa.launchpadcontent.net/graphics-drivers/ppa/ubuntu",
        check=check_url,
        accepts=URL_ACCEPTS,
    )
    ubuntu_driver_ppa_keyring: str | None = setting(
        None,
        "binary keyring (on the control machine) that signs the graphics-drivers PPA; "
        "installed as its signed-by keyring (never apt-key)",
        pattern=r"[^\s]+\.gpg",
        accepts="a path to a .gpg keyring file",
    )
    proxy: str | None = setting(None, "apt HTTP proxy", check=check_url, accepts=URL_ACCEPTS)
    direct_hosts: tuple[str, ...] = setting(
        (),
        "hosts apt reaches without the proxy (an internal mirror, say)",
        # apt.conf scopes the name with '::', so an IPv6 address cannot be one.
        pattern=HOST_NAME,
        accepts="DNS host names or IPv4 addresses",
    )

    def validate(self, builder: Builder, path: str) -> None:
        if self.direct_hosts and not self.proxy:
            builder.problem(
                f"{path}.direct_hosts", list(self.direct_hosts), "no proxy to bypass",
                "set apt.proxy, or leave direct_hosts empty",
            )  # fmt: skip
        if "main" not in self.debian_components:
            builder.problem(
                f"{path}.debian_components",
                list(self.debian_components),
                "main is missing",
                "a list that includes main",
            )
        if "main" not in self.ubuntu_components:
            builder.problem(
                f"{path}.ubuntu_components",
                list(self.ubuntu_components),
                "main is missing",
                "a list that includes main",
            )


@dataclass(frozen=True)
class NvidiaDriver:
    """Which driver, pinned how, and what may happen to make it take effect."""

    source: Literal["none", "debian", "nvidia", "ubuntu"] = setting(
        "none",
        "none: leave the driver alone; debian: Debian non-free (Debian nodes); ubuntu: "
        "Ubuntu's restricted archive with Canonical's signed prebuilt kernel modules (Ubuntu "
        "nodes); nvidia: NVIDIA's repo",
    )
    ubuntu_series: Literal["server", "desktop"] = setting(
        "server",
        "ubuntu source: Ubuntu's -server driver packages (nvidia-*-<branch>-server, the "
        "data-centre branches) or its desktop ones (nvidia-*-<branch>)",
    )
    branch: str | None = setting(
        None, "driver branch, e.g. '550' (NVIDIA source)", pattern=DRIVER_BRANCH,
        accepts="a three-digit driver branch such as '550'",
    )  # fmt: skip
    version: str | None = setting(
        None, "exact apt version to pin and hold, e.g. '550.127.08-1'",
        pattern=DRIVER_APT_VERSION,
        accepts="an apt package version such as '550.127.08-1'",
    )  # fmt: skip
    flavour: Literal["open", "proprietary"] = setting("open", "kernel module flavour")
    stack: Literal["compute", "full"] = setting(
        "compute",
        "compute: NVIDIA's headless compute-only install (nvidia-driver-cuda and the kernel "
        "module); full: its nvidia-open / cuda-drivers stack with the desktop parts "
        "(nvidia source only)",
    )
    reboot: Literal["never", "if-needed"] = setting(
        "never", "reboot when the loaded module differs from the installed one"
    )
    persistence_daemon: bool = setting(True, "enable nvidia-persistenced")

    @property
    def driver_version(self) -> str | None:
        return upstream_version(self.version) if self.version else None

    def validate(self, builder: Builder, path: str) -> None:
        if self.source == "none":
            for name in ("branch", "version"):
                if getattr(self, name) is not None:
                    builder.problem(
                        f"{path}.{name}",
                        getattr(self, name),
                        "set while source is 'none', so it would be ignored",
                        "set source to 'debian', 'ubuntu' or 'nvidia', or remove the key",
                    )
            return
        if self.source == "debian" and self.stack == "full":
            builder.problem(
                f"{path}.stack", self.stack,
                "the debian source installs Debian's headless compute set only",
                "stack: compute, or source: nvidia for NVIDIA's full stack",
            )  # fmt: skip
        if self.source == "ubuntu" and self.stack == "full":
            builder.problem(
                f"{path}.stack", self.stack,
                "the ubuntu source installs Ubuntu's compute set with Canonical's prebuilt "
                "kernel module only (whether nvidia-driver-<branch> would pull DKMS beside it "
                "is not verified)",
                "stack: compute",
            )  # fmt: skip
        if self.source != "ubuntu" and self.ubuntu_series != "server":
            builder.problem(
                f"{path}.ubuntu_series", self.ubuntu_series,
                f"only read by the ubuntu source, but source is {self.source!r}",
                "remove the key, or source: ubuntu",
            )  # fmt: skip
        if self.source in ("nvidia", "ubuntu") and self.branch is None:
            builder.problem(
                f"{path}.branch", None, f"missing for source '{self.source}'",
                "a branch such as '550'",
            )  # fmt: skip
        if (
            self.branch
            and self.version
            and not upstream_version(self.version).startswith(self.branch + ".")
        ):
            builder.problem(
                f"{path}.version",
                self.version,
                f"not in branch {self.branch}",
                f"a version starting with '{self.branch}.'",
            )


@dataclass(frozen=True)
class Cuda:
    """CUDA toolkits (cuda-toolkit-X-Y, never the driver-pulling 'cuda' metapackage)."""

    versions: tuple[str, ...] = setting(
        (), "toolkit releases side by side, e.g. ['12.4', '12.8']",
        check=lambda v: None if v in CUDA_MINIMUM_DRIVER else "unknown CUDA release",
        accepts="a CUDA release: " + ", ".join(CUDA_MINIMUM_DRIVER),
    )  # fmt: skip
    default: str | None = setting(
        None, "release on PATH system-wide; defaults to the newest", pattern=CUDA_RELEASE
    )

    def validate(self, builder: Builder, path: str) -> None:
        if self.default is not None and self.default not in self.versions:
            builder.problem(
                f"{path}.default",
                self.default,
                "not among cuda.versions",
                "one of " + (", ".join(self.versions) or "(no versions declared)"),
            )


# NGC's registry and the user name its API keys log in with: "Username is the literal
# $oauthtoken (API key authentication). Password is the value of NGC_API_KEY" (NVIDIA NIM,
# "NGC Access Setup", https://docs.nvidia.com/nim/speech/latest/get-started/
# ngc-access-setup.html, read 2026-12-07).
NGC_REGISTRY = "nvcr.io"
NGC_USERNAME = "$oauthtoken"
# A registry as image references name it: a host name, an optional port.
REGISTRY_HOST = rf"{HOST_NAME}(:[0-9]{{1,5}})?"


@dataclass(frozen=True)
class RegistryLogin:
    """Credentials for one container registry; the password (an API key for NGC) is read on
    the control machine from a file only its owner may read, and never printed."""

    registry: str = setting(
        NGC_REGISTRY, "the registry, as image names give it (nvcr.io: NVIDIA's NGC)",
        pattern=REGISTRY_HOST, accepts="a registry host name with an optional :port",
    )  # fmt: skip
    username: str = setting(
        NGC_USERNAME, "the user name ($oauthtoken for an NGC API key)",
        pattern=r"\$?[A-Za-z0-9._@-]{1,128}", accepts="a user name, or $oauthtoken",
    )  # fmt: skip
    password_file: str = setting(
        "", "file on the control machine holding the password or API key (mode 0600)",
        pattern=r"[^\s]+", required=True, accepts="a path on the control machine",
    )  # fmt: skip


@dataclass(frozen=True)
class RegistryMirror:
    """Mirrors or pull-through caches containerd pulls one registry's images from, in order
    (containerd's hosts.toml; air-gapped sites: ``upstream: false``)."""

    registry: str = setting(
        "", "the registry as image names give it (docker.io, nvcr.io, registry.k8s.io)",
        pattern=REGISTRY_HOST, required=True,
        accepts="a registry host name with an optional :port",
    )  # fmt: skip
    mirrors: tuple[str, ...] = setting(
        (), "the mirrors' URLs, tried in order", check=check_url, accepts=URL_ACCEPTS
    )
    upstream: bool = setting(
        True, "fall back to the registry itself when every mirror fails (false: the last "
        "mirror is the server, and the registry is never asked: air-gapped sites)",
    )  # fmt: skip
    resolve: bool = setting(
        True, "trust the mirrors to resolve tags to digests (a private mirror); false: pull "
        "only (a public mirror, as containerd's hosts.md advises)",
    )  # fmt: skip

    def validate(self, builder: Builder, path: str) -> None:
        if not self.mirrors:
            builder.problem(f"{path}.mirrors", [], "no mirror given", "one URL or more")
        if len(set(self.mirrors)) != len(self.mirrors):
            builder.problem(f"{path}.mirrors", list(self.mirrors), "a mirror given twice",
                            "each URL once")  # fmt: skip


@dataclass(frozen=True)
class ContainerRuntime:
    """NVIDIA Container Toolkit and the engines it is wired into."""

    engines: tuple[Literal["docker", "containerd"], ...] = setting(
        (), "engines to configure with nvidia-ctk"
    )
    toolkit_version: str | None = setting(
        None, "exact nvidia-container-toolkit apt version", pattern=APT_VERSION,
        accepts="an apt package version such as '1.17.4-1'",
    )  # fmt: skip
    cdi: bool = setting(True, "generate the CDI spec (/etc/cdi/nvidia.yaml)")
    set_as_default: bool = setting(False, "make nvidia the engine's default runtime")
    registry_logins: tuple[RegistryLogin, ...] = setting(
        (), "registry credentials root's Docker client uses (/root/.docker/config.json, "
        "managed whole), e.g. nvcr.io with an NGC API key",
    )  # fmt: skip

    registry_mirrors: tuple[RegistryMirror, ...] = setting(
        (), "registry mirrors containerd pulls through (/etc/containerd/certs.d/<registry>/"
        "hosts.toml)",
    )  # fmt: skip

    def validate(self, builder: Builder, path: str) -> None:
        mirrored = [mirror.registry for mirror in self.registry_mirrors]
        for index, registry in enumerate(mirrored):
            if mirrored.index(registry) != index:
                builder.problem(f"{path}.registry_mirrors[{index}].registry", registry,
                                "a registry given twice", "one entry per registry")  # fmt: skip
        if self.registry_mirrors and "containerd" not in self.engines:
            builder.problem(
                f"{path}.registry_mirrors", mirrored,
                "the mirrors are containerd's (hosts.toml), and containerd is not among "
                "container_runtime.engines; Docker's registry-mirrors is not managed",
                "engines including containerd, or no registry_mirrors",
            )  # fmt: skip
        registries = [login.registry for login in self.registry_logins]
        for index, registry in enumerate(registries):
            if registries.index(registry) != index:
                builder.problem(f"{path}.registry_logins[{index}].registry", registry,
                                "a registry given twice", "one login per registry")  # fmt: skip
        if self.registry_logins and "docker" not in self.engines:
            builder.problem(
                f"{path}.registry_logins", [login.registry for login in self.registry_logins],
                "the credentials are Docker's (root's config.json), and docker is not among "
                "container_runtime.engines; Kubernetes pulls with its own image pull secrets",
                "engines including docker, or no registry_logins",
            )  # fmt: skip


@dataclass(frozen=True)
class FabricManager:
    """nvidia-fabricmanager: needed exactly on nodes whose GPUs sit behind NVSwitches."""

    mode: Literal["auto", "always", "never"] = setting(
        "auto", "auto: install when expected_hardware.nvswitch is true"
    )
    version: str | None = setting(
        None, "exact apt version; must equal the driver version", pattern=DRIVER_APT_VERSION,
        accepts="an apt package version such as '550.127.08-1'",
    )  # fmt: skip
    nvlsm_version: str | None = setting(
        None, "exact apt version of nvlsm (Blackwell NVSwitch systems); default: held as "
        "first installed", pattern=APT_VERSION,
        accepts="an apt package version such as '2025.10.14-1'",
    )  # fmt: skip


@dataclass(frozen=True)
class Imex:
    """NVIDIA IMEX on multi-node NVLink systems (GB200/GB300 NVL72): the service, its domain's
    nodes and the IMEX channels the driver does not create by itself."""

    mode: Literal["auto", "always", "never"] = setting(
        "auto", "auto: run IMEX where expected_hardware.gpu_model is a GB200/GB300 NVL72 tray"
    )
    nodes: tuple[str, ...] = setting(
        (), "IP addresses of every node of the NVLink domain (nodes_config.cfg)",
        check=check_ip_address, accepts="IP addresses",
    )  # fmt: skip
    channels: int = setting(1, "IMEX channels to create at boot (channel0 upwards)", min=1, max=64)


@dataclass(frozen=True)
class Dcgm:
    """DCGM and its Prometheus exporter from NVIDIA's repository, pinned and held."""

    enabled: bool = setting(False, "install DCGM and run nvidia-dcgm")
    major: Literal[3, 4] | None = setting(
        None,
        "DCGM major release: 4 (datacenter-gpu-manager-4-*) or 3 (datacenter-gpu-manager); "
        "defaults to the version's, else 4",
    )
    version: str | None = setting(
        None, "exact apt version of DCGM's packages, e.g. '1:4.7.0-1'", pattern=APT_VERSION,
        accepts="an apt package version such as '1:4.7.0-1'",
    )  # fmt: skip
    cuda_major: Literal[12, 13] | None = setting(
        None,
        "CUDA major of DCGM 4's CUDA part (datacenter-gpu-manager-4-cudaN); defaults to the "
        "newest CUDA major the pinned driver branch runs",
    )
    exporter: bool = setting(
        False, "install datacenter-gpu-manager-exporter (DCGM 4) and run its service"
    )
    exporter_version: str | None = setting(
        None, "exact apt version of the exporter, e.g. '4.9.0-1'", pattern=APT_VERSION,
        accepts="an apt package version such as '4.9.0-1'",
    )  # fmt: skip

    @property
    def upstream(self) -> str | None:
        return upstream_version(self.version) if self.version else None

    @property
    def release_major(self) -> int:
        if self.major is not None:
            return self.major
        if self.upstream and self.upstream.split(".")[0] == "3":
            return 3
        return 4

    def validate(self, builder: Builder, path: str) -> None:
        major = self.release_major
        if self.upstream and not self.upstream.startswith(f"{major}."):
            builder.problem(
                f"{path}.version", self.version, f"not a DCGM {major} release",
                f"a version of DCGM {major} (e.g. '1:{major}.x.y-1'), or leave {path}.major "
                "unset",
            )  # fmt: skip
        if self.exporter and major == 3:
            builder.problem(
                f"{path}.exporter", True,
                "NVIDIA's repository ships the exporter (datacenter-gpu-manager-exporter) "
                "with DCGM 4 only",
                f"{path}.major: 4, or exporter: false",
            )  # fmt: skip
        if self.exporter_version and not self.exporter:
            builder.problem(
                f"{path}.exporter_version", self.exporter_version,
                "set while exporter is false, so it would be ignored",
                "exporter: true, or remove the key",
            )  # fmt: skip
        if self.exporter_version and self.upstream:
            exporter = upstream_version(self.exporter_version)
            if nvidia_releases.exporter_pairs_with(exporter, self.upstream) is False:
                paired = ", ".join(nvidia_releases.DCGM_EXPORTER_PAIRS[exporter])
                builder.problem(
                    f"{path}.exporter_version", self.exporter_version,
                    f"DCGM Exporter {exporter} is paired with DCGM {paired}, not {self.upstream}",
                    f"the exporter release paired with DCGM {self.upstream}, or DCGM {paired}",
                )  # fmt: skip


@dataclass(frozen=True)
class ApplicationClocks:
    # Both required: nvidia-smi sets the pair together, and a half-declared (or empty)
    # mapping would otherwise pass with clocks of 0.
    memory_mhz: int = setting(0, "memory clock", min=1, max=20000, required=True)
    graphics_mhz: int = setting(0, "graphics clock", min=1, max=5000, required=True)


@dataclass(frozen=True)
class GpuSettings:
    """Per-GPU settings applied with nvidia-smi. null means: leave as found."""

    persistence_mode: bool | None = setting(True, "persistence mode on every GPU")
    ecc: bool | None = setting(None, "ECC mode (takes effect after a GPU reset or reboot)")
    mig: bool | None = setting(None, "MIG mode (takes effect after a GPU reset or reboot)")
    mig_layout: tuple[str, ...] = setting(
        (), "MIG GPU instance profiles per GPU, e.g. ['3g.40gb', '3g.40gb']",
        pattern=r"[1-9]g\.[0-9]+gb(\+me)?", accepts="MIG profile names such as '1g.10gb'",
    )  # fmt: skip
    power_limit_w: int | None = setting(None, "power limit in watts", min=50, max=1500)
    application_clocks: ApplicationClocks | None = setting(None, "application clocks")

    def validate(self, builder: Builder, path: str) -> None:
        if self.mig_layout and self.mig is not True:
            builder.problem(
                f"{path}.mig_layout",
                list(self.mig_layout),
                "a MIG layout needs gpu_settings.mig: true",
                "mig: true, or no mig_layout",
            )


# NVIDIA Multi-Process Service (MPS): the defaults of its pipe and log directories, as NVIDIA
# documents them (https://docs.nvidia.com/deploy/mps/latest/appendix-environment-variables.html
# and appendix-logging.html: CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY; read 2026-12-07).
MPS_DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"
MPS_DEFAULT_LOG_DIRECTORY = "/var/log/nvidia-mps"
# CUDA_MPS_PINNED_DEVICE_MEM_LIMIT's value per device: "<GPU index>=<size>", the size in M or
# G as NVIDIA's examples write it ("0=1G,1=512MB" in the MPS guide's environment appendix).
MPS_MEMORY_LIMIT = r"[1-9][0-9]{0,6}(M|MB|G|GB)"
# Trees a directory gpunode creates for MPS may not lie in: the role creates it (and
# systemd's unit names it), so a typo must not point it at the system's own files.
MPS_FORBIDDEN_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/proc", "/sbin", "/sys", "/usr")
MPS_DIRECTORY_ACCEPTS = (
    ABSOLUTE_PATH_ACCEPTS + ", at least two levels deep, outside " + " ".join(MPS_FORBIDDEN_TREES)
)


def check_mps_directory(value: str) -> str | None:
    reason = check_absolute_path(value)
    if reason:
        return reason
    if value.count("/") < 2:
        return "a top-level directory"
    top = "/" + value.split("/")[1]
    if top in MPS_FORBIDDEN_TREES:
        return f"lies in {top}"
    return None


@dataclass(frozen=True)
class Mps:
    """The CUDA MPS control daemon (nvidia-cuda-mps-control -d) as a systemd service.

    NVIDIA's multi-user setup (MPS guide, "Starting and Stopping MPS on Linux"): as root,
    the GPUs set to EXCLUSIVE_PROCESS compute mode, one control daemon per node with
    CUDA_VISIBLE_DEVICES naming its GPUs. The compute mode is set by the GPU settings role
    (its one owner), on exactly the GPUs named here.
    """

    enabled: bool = setting(False, "run the MPS control daemon on this node")
    gpus: tuple[int, ...] = setting(
        (), "GPU indexes the daemon serves (CUDA_VISIBLE_DEVICES); empty: every GPU", min=0,
        max=15,
    )  # fmt: skip
    exclusive_process: bool = setting(
        True,
        "set the served GPUs to EXCLUSIVE_PROCESS compute mode, as NVIDIA's multi-user setup "
        "does (only the MPS server then opens them)",
    )
    active_thread_percentage: int | None = setting(
        None,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE in the daemon's environment: the share of each GPU's "
        "threads a client may use; null: NVIDIA's default (100)",
        min=1,
        max=100,
    )
    pinned_device_memory_limit: dict[str, str] = field(
        default_factory=dict,
        metadata=spec(
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in the daemon's environment: each client's "
            "device memory limit per GPU index",
            accepts="GPU indexes ('0') to sizes such as '1G' or '512M'",
            pattern=MPS_MEMORY_LIMIT,
        ),
    )
    pipe_directory: str = setting(
        MPS_DEFAULT_PIPE_DIRECTORY,
        "CUDA_MPS_PIPE_DIRECTORY: the daemon's and its clients' pipes (clients must use the same)",
        check=check_mps_directory,
        accepts=MPS_DIRECTORY_ACCEPTS,
    )
    log_directory: str = setting(
        MPS_DEFAULT_LOG_DIRECTORY,
        "CUDA_MPS_LOG_DIRECTORY: control.log and server.log",
        check=check_mps_directory,
        accepts=MPS_DIRECTORY_ACCEPTS,
    )

    def validate(self, builder: Builder, path: str) -> None:
        if len(set(self.gpus)) != len(self.gpus):
            builder.problem(f"{path}.gpus", list(self.gpus), "a GPU named twice", "unique indexes")
        for index, limit in self.pinned_device_memory_limit.items():
            if not re.fullmatch(r"[0-9]|1[0-5]", str(index)):
                builder.problem(
                    f"{path}.pinned_device_memory_limit.{index}", limit, "not a GPU index",
                    "GPU indexes 0 to 15",
                )  # fmt: skip
            elif self.gpus and int(index) not in self.gpus:
                builder.problem(
                    f"{path}.pinned_device_memory_limit.{index}", limit,
                    f"GPU {index} is not one of {path}.gpus {list(self.gpus)}",
                    "a limit for a GPU the daemon serves",
                )  # fmt: skip
        if self.pipe_directory == self.log_directory:
            builder.problem(
                f"{path}.log_directory", self.log_directory, "the same as pipe_directory",
                "a directory of its own (NVIDIA's default: /var/log/nvidia-mps)",
            )  # fmt: skip


# What kubelet and CNIs need of the host's kernel (Kubernetes "Container Runtimes",
# "Forwarding IPv4 and letting iptables see bridged traffic": https://kubernetes.io/docs/setup/
# production-environment/container-runtimes/#forwarding-ipv4-and-letting-iptables-see-bridged-
# traffic, as cited by Flatcar's commit e7cd412 loading br_netfilter; kubeadm's own
# 90-kubeadm.conf in openSUSE's kubernetes packages sets the same three sysctls; read
# 2026-12-07): the overlay and br_netfilter modules, bridged traffic through iptables, IPv4
# forwarding.
KUBERNETES_MODULES = ("overlay", "br_netfilter")
KUBERNETES_SYSCTLS = {
    "net.bridge.bridge-nf-call-iptables": "1",
    "net.bridge.bridge-nf-call-ip6tables": "1",
}
KUBERNETES_PACKAGES = ("kubelet", "kubeadm", "kubectl")


@dataclass(frozen=True)
class Kubernetes:
    """A node prepared to join a Kubernetes cluster as a GPU worker; gpunode runs no cluster.

    containerd with the NVIDIA runtime and CDI (``container_runtime``: the host side of the
    GPU Operator with the driver and the Container Toolkit pre-installed: its chart's
    ``driver.enabled`` "Set this value to false when using the Operator on systems with
    pre-installed drivers", ``cdi.enabled`` for CDI; https://docs.nvidia.com/datacenter/
    cloud-native/gpu-operator/latest/install-gpu-operator.html, read 2026-12-07), kernel
    modules and sysctls, forwarding filtered
    to the pod and service networks, swap off, cgroup v2; kubelet packages only from a
    declared repository (Debian packages none: bookworm ships containerd 1.6.20 and
    kubernetes-client 1.20, trixie containerd 1.7.24 and kubernetes-client/kubectl 1.32, and
    neither kubelet nor kubeadm; apt-cache policy against Debian's archive, 2026-12-07).
    """

    enabled: bool = setting(False, "prepare this node as a Kubernetes worker")
    pod_networks: tuple[str, ...] = setting(
        (), "the cluster's pod networks: forwarded traffic from or to them is accepted",
        check=check_cidr, accepts="networks in CIDR form, e.g. 10.244.0.0/16",
    )  # fmt: skip
    service_networks: tuple[str, ...] = setting(
        (), "the cluster's service networks (forwarded traffic to them is accepted)",
        check=check_cidr, accepts="networks in CIDR form, e.g. 10.96.0.0/12",
    )  # fmt: skip
    packages: tuple[Literal["kubelet", "kubeadm", "kubectl"], ...] = setting(
        (), "packages installed from kubernetes.repository_url (empty: none)"
    )
    repository_url: str | None = setting(
        None, "a flat apt repository of the Kubernetes packages (a mirror of pkgs.k8s.io's "
        "core:/stable:/v1.NN/deb/)", check=check_url, accepts=URL_ACCEPTS,
    )  # fmt: skip
    repository_keyring: str | None = setting(
        None,
        "binary keyring (on the control machine) that signs kubernetes.repository_url",
        pattern=r"[^\s]+\.gpg",
        accepts="a path to a .gpg keyring file",
    )
    version: str | None = setting(
        None, "apt version every package is pinned to, e.g. '1.32.3-1.1'", pattern=APT_VERSION,
        accepts="a Debian package version",
    )  # fmt: skip
    hold: bool = setting(True, "hold the packages (apt-mark hold), as the NVIDIA stack is")

    def validate(self, builder: Builder, path: str) -> None:
        if not self.enabled:
            return
        if not self.pod_networks:
            builder.problem(
                f"{path}.pod_networks", [],
                "the forward path is filtered to the pod networks, and none is declared",
                "the cluster's pod networks in CIDR form (the CNI's, e.g. 10.244.0.0/16)",
            )  # fmt: skip
        if len(set(self.packages)) != len(self.packages):
            builder.problem(f"{path}.packages", list(self.packages), "a package named twice",
                            "each of kubelet, kubeadm, kubectl at most once")  # fmt: skip
        if self.packages and (self.repository_url is None or self.repository_keyring is None):
            missing = "repository_url" if self.repository_url is None else "repository_keyring"
            builder.problem(
                f"{path}.{missing}", None,
                "kubelet and kubeadm are in no Debian release: they come from a declared "
                "repository, and its URL and keyring are both needed",
                "the mirror's URL and the path of its binary keyring",
            )  # fmt: skip


@dataclass(frozen=True)
class Nccl:
    env: dict[str, str] = field(
        default_factory=dict,
        metadata=spec(
            "NCCL_* variables for /etc/nccl.conf and the system environment",
            accepts="known NCCL variables (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, ...) to values "
            "of letters, digits and ._:/%@+,=^-",
            pattern=NCCL_VALUE,
        ),
    )
    install_libnccl: bool = setting(False, "install libnccl2 matching the default CUDA")

    def validate(self, builder: Builder, path: str) -> None:
        for name in self.env:
            if name not in NCCL_VARIABLES:
                builder.problem(
                    f"{path}.env.{name}",
                    self.env[name],
                    "unknown NCCL variable",
                    ", ".join(sorted(NCCL_VARIABLES)),
                )


@dataclass(frozen=True)
class IpoibInterface:
    name: str = setting("", "interface name", pattern=r"ib[0-9]+", accepts="a name such as ib0")
    address: str = setting(
        "", "address with prefix length", check=check_interface_address,
        accepts="an address with prefix length, e.g. 192.168.100.11/24",
    )  # fmt: skip
    mtu: int = setting(2044, "MTU (2044 datagram, up to 65520 connected)", min=1280, max=65520)


@dataclass(frozen=True)
class Infiniband:
    enabled: bool = setting(False, "install rdma-core and load the IB modules")
    ipoib: tuple[IpoibInterface, ...] = setting((), "IPoIB interfaces")
    subnet_manager: bool = setting(False, "run opensm on this node")
    memlock_unlimited: bool = setting(True, "unlimited memlock for RDMA users")

    def validate(self, builder: Builder, path: str) -> None:
        seen: set[str] = set()
        for index, interface in enumerate(self.ipoib):
            if interface.name in seen:
                builder.problem(
                    f"{path}.ipoib[{index}].name", interface.name, "duplicate interface",
                    "one entry per interface",
                )  # fmt: skip
            seen.add(interface.name)


@dataclass(frozen=True)
class NvmeCache:
    enabled: bool = setting(False, "build the local NVMe cache")
    devices: tuple[str, ...] = setting(
        (), "explicit device paths", pattern=r"/dev(/[A-Za-z0-9_-]+)+", accepts="paths under /dev"
    )
    match_model: str | None = setting(
        None, "select drives whose model contains this", pattern=r"[A-Za-z0-9 ._()+/-]{1,64}",
        accepts="part of a drive model name: letters, digits, spaces and ._()+/-",
    )  # fmt: skip
    min_size_gb: int | None = setting(None, "select drives at least this large", min=1)
    filesystem: Literal["xfs", "ext4"] = setting("xfs", "filesystem")
    mount_point: str = setting(
        "/raid", "mount point", check=check_absolute_path,
        accepts=ABSOLUTE_PATH_ACCEPTS + ", not a system directory",
    )  # fmt: skip
    wipe_allowed_serials: tuple[str, ...] = setting(
        (), "serials of drives that may be wiped even though they carry data",
        pattern=r"[A-Za-z0-9_.:-]{1,64}", accepts="drive serial numbers",
    )  # fmt: skip
    cachefilesd: bool = setting(False, "run cachefilesd for NFS FS-Cache on the array")
    device_timeout_s: int = setting(
        30, "how long boot waits for the cache's device (x-systemd.device-timeout; nofail)",
        min=1, max=600,
    )  # fmt: skip

    def validate(self, builder: Builder, path: str) -> None:
        if len(set(self.devices)) != len(self.devices):
            builder.problem(
                f"{path}.devices", list(self.devices), "a device is listed twice", "unique paths"
            )
        if self.enabled and not self.devices and self.match_model is None:
            builder.problem(
                f"{path}.devices", [], "no way to choose drives", "devices, or match_model"
            )
        system = system_directory(self.mount_point)
        if system is not None:
            builder.problem(
                f"{path}.mount_point",
                self.mount_point,
                "a system directory" if system == self.mount_point else f"inside {system}",
                "a dedicated path such as /raid or /mnt/nvme (not /, "
                + ", ".join(SYSTEM_TREES)
                + " or anything under them, nor "
                + ", ".join(SYSTEM_DIRECTORIES[1:])
                + " themselves)",
            )


# --- shared training data ----------------------------------------------------------------
#
# NFS client mounts (nfs(5), "Options supported by all versions" and "Options for NFS
# version 4 only", https://man7.org/linux/man-pages/man5/nfs.5.html, read 2026-12-07):
# nconnect takes 1 to 16 connections; vers=4.1 and 4.2 are the NFSv4 minor versions with
# sessions (trunking, nconnect on v4). ``soft`` is refused: nfs(5) warns that a soft
# timeout "can cause silent data corruption" of writes. Options a mount may set beyond what
# gpunode sets from its own fields (version, nconnect, fsc, ro/rw, _netdev): a flag, or a
# name with a value of the kind nfs(5) gives it.
NFS_FLAG_OPTIONS = frozenset(
    {
        "hard", "noatime", "nodiratime", "relatime", "nosuid", "nodev", "noexec", "ac",
        "noac", "cto", "nocto", "sharecache", "nosharecache", "resvport", "noresvport",
    }
)  # fmt: skip
NFS_VALUE_OPTIONS = {
    "timeo": r"[0-9]{1,6}",
    "retrans": r"[0-9]{1,3}",
    "rsize": r"[0-9]{4,8}",
    "wsize": r"[0-9]{4,8}",
    "acregmin": r"[0-9]{1,6}",
    "acregmax": r"[0-9]{1,6}",
    "acdirmin": r"[0-9]{1,6}",
    "acdirmax": r"[0-9]{1,6}",
    "actimeo": r"[0-9]{1,6}",
    "port": r"[0-9]{1,5}",
    "max_connect": r"[0-9]{1,2}",
    "proto": r"tcp|tcp6|rdma|rdma6",
    "sec": r"sys|krb5|krb5i|krb5p",
    "lookupcache": r"all|none|pos|positive",
}
# Lustre client mount options (mount.lustre(8), "client-specific options": flock,
# localflock, noflock, user_xattr, nouser_xattr, lazystatfs, nolazystatfs;
# https://man.cx/mount.lustre(8), read 2026-12-07), with mount(8)'s noatime, nosuid, nodev.
LUSTRE_FLAG_OPTIONS = frozenset(
    {
        "flock", "localflock", "noflock", "user_xattr", "nouser_xattr", "lazystatfs",
        "nolazystatfs", "noatime", "nosuid", "nodev",
    }
)  # fmt: skip
# Options gpunode writes itself, from a field: naming them in ``options`` is refused with the
# field to use instead, so that one fact never has two sources.
OWNED_MOUNT_OPTIONS = {
    "vers": "nfs_version", "nfsvers": "nfs_version", "minorversion": "nfs_version",
    "nconnect": "nconnect", "fsc": "fsc", "ro": "read_only", "rw": "read_only",
}  # fmt: skip
REFUSED_MOUNT_OPTIONS = {
    "_netdev": "gpunode always sets it (the unit is ordered after the network)",
    "nofail": "the automount never blocks boot, so it has no use",
    "soft": "nfs(5) warns that soft timeouts can silently corrupt written data",
    "softerr": "nfs(5) warns that soft timeouts can silently corrupt written data",
}
MOUNT_OPTION_ACCEPTS = (
    "NFS: " + ", ".join(sorted(NFS_FLAG_OPTIONS)) + " or one of "
    + ", ".join(f"{name}=" for name in NFS_VALUE_OPTIONS)
    + "; Lustre: " + ", ".join(sorted(LUSTRE_FLAG_OPTIONS))
)  # fmt: skip
# A Lustre NID: an IPv4 address or host name, '@', an LNet network (tcp, o2ib, optionally
# numbered): "10.0.0.1@tcp", "mgs1@o2ib1". Failover MGS nodes are joined by ':' in the mount
# source ("<MGS NID>[:<MGS NID>]:/<fsname>": Lustre wiki, "Mounting a Lustre File System on
# Client Nodes", https://wiki.lustre.org/Mounting_a_Lustre_File_System_on_Client_Nodes, and
# mount.lustre(8); read 2026-12-07). A node's several NIDs joined by ',' are not accepted.
LUSTRE_NID = rf"({HOST_NAME}|[0-9.]+)@(tcp|o2ib)[0-9]{{0,2}}"
# Lustre file system names: at most 8 characters (mkfs.lustre --fsname).
LUSTRE_FSNAME = r"[A-Za-z0-9_]{1,8}"


def mount_option_problem(value: str) -> str | None:
    """Why one entry of ``shared_data.mounts[].options`` is not accepted, or None."""
    name, equals, argument = value.partition("=")
    if name in OWNED_MOUNT_OPTIONS:
        return f"{name} is set from a field of its own: {OWNED_MOUNT_OPTIONS[name]}"
    if name in REFUSED_MOUNT_OPTIONS:
        return f"refused: {REFUSED_MOUNT_OPTIONS[name]}"
    if name.startswith("x-systemd."):
        return "gpunode writes systemd mount and automount units itself"
    if not equals:
        if value in NFS_FLAG_OPTIONS or value in LUSTRE_FLAG_OPTIONS:
            return None
        return "not an option gpunode allows"
    pattern = NFS_VALUE_OPTIONS.get(name)
    if pattern is None:
        return "not an option gpunode allows"
    if not re.fullmatch(pattern, argument):
        return f"{name} takes {pattern.replace('|', ' or ')}"
    return None


def check_nfs_server(value: str) -> str | None:
    """An NFS server: a DNS name or an IP address (an IPv6 one without brackets)."""
    if ":" in value:
        return check_ip_address(value)
    if re.fullmatch(r"[0-9.]+", value):
        return check_ip_address(value)
    return None if re.fullmatch(HOST_NAME, value) else "not a host name or IP address"


@dataclass(frozen=True)
class SharedMount:
    """One shared file system, mounted on demand by a systemd automount unit."""

    kind: Literal["nfs", "lustre"] = setting("nfs", "nfs, or lustre (client from a mirror)")
    mount_point: str = setting(
        "", "where it is mounted on the node", check=check_absolute_path, required=True,
        accepts=ABSOLUTE_PATH_ACCEPTS + ", not a system directory",
    )  # fmt: skip
    server: str = setting(
        "", "nfs: the server's DNS name or IP address; lustre: the MGS NIDs, failover NIDs "
        "joined by ':' (10.0.0.1@tcp:10.0.0.2@tcp)", required=True,
        pattern=rf"{HOST_NAME}|[0-9A-Fa-f.:]+|{LUSTRE_NID}(:{LUSTRE_NID})*",
        accepts="a host name or IP address (nfs), or Lustre NIDs such as 10.0.0.1@tcp",
    )  # fmt: skip
    export: str = setting(
        "", "nfs: the exported path on the server; lustre: the file system name",
        required=True, pattern=rf"{ABSOLUTE_PATH}|{LUSTRE_FSNAME}",
        accepts="an absolute path (nfs), or a Lustre file system name of at most 8 letters, "
        "digits or '_'",
    )  # fmt: skip
    nfs_version: Literal["4.1", "4.2"] = setting(
        "4.2", "NFS protocol version (vers=); 4.1 and later have sessions and trunking"
    )
    nconnect: int | None = setting(
        None, "NFS: TCP connections to the server (nconnect=); null: the kernel's one", min=1,
        max=16,
    )  # fmt: skip
    options: tuple[str, ...] = setting(
        (), "further mount options, from an allow-list", check=mount_option_problem,
        accepts=MOUNT_OPTION_ACCEPTS,
    )  # fmt: skip
    read_only: bool = setting(False, "mount read-only (ro)")
    fsc: bool = setting(
        False, "NFS: cache file data locally with FS-Cache (fsc), in cachefilesd's cache on "
        "the NVMe cache (nvme_cache.cachefilesd)",
    )  # fmt: skip
    mount_timeout_s: int = setting(
        90, "how long one mount attempt may take before it fails (the mount unit's "
        "TimeoutSec)", min=5, max=600,
    )  # fmt: skip

    def validate(self, builder: Builder, path: str) -> None:
        system = system_directory(self.mount_point) if self.mount_point else None
        if system is not None:
            builder.problem(
                f"{path}.mount_point", self.mount_point,
                "a system directory" if system == self.mount_point else f"inside {system}",
                "a dedicated path such as /data or /mnt/datasets (not /, "
                + ", ".join(SYSTEM_TREES) + " or anything under them, nor "
                + ", ".join(SYSTEM_DIRECTORIES[1:]) + " themselves)",
            )  # fmt: skip
        if self.kind == "nfs":
            self._validate_nfs(builder, path)
        else:
            self._validate_lustre(builder, path)
        names = [option.partition("=")[0] for option in self.options]
        for name in sorted({name for name in names if names.count(name) > 1}):
            builder.problem(f"{path}.options", list(self.options), f"{name} given twice",
                            "each option at most once")  # fmt: skip

    def _validate_nfs(self, builder: Builder, path: str) -> None:
        if self.server:
            reason = check_nfs_server(self.server)
            if reason:
                builder.problem(f"{path}.server", self.server, reason,
                                "the NFS server's DNS name or IP address")  # fmt: skip
        if self.export and check_absolute_path(self.export):
            builder.problem(f"{path}.export", self.export, "not an exported path",
                            ABSOLUTE_PATH_ACCEPTS)  # fmt: skip
        for option in self.options:
            if option in LUSTRE_FLAG_OPTIONS and option not in NFS_FLAG_OPTIONS:
                builder.problem(f"{path}.options", option, "a Lustre option, not an NFS one",
                                MOUNT_OPTION_ACCEPTS)  # fmt: skip

    def _validate_lustre(self, builder: Builder, path: str) -> None:
        if self.server and not re.fullmatch(rf"{LUSTRE_NID}(:{LUSTRE_NID})*", self.server):
            builder.problem(f"{path}.server", self.server, "not Lustre MGS NIDs",
                            "NIDs such as 10.0.0.1@tcp, failover NIDs joined by ':'")  # fmt: skip
        if self.export and not re.fullmatch(LUSTRE_FSNAME, self.export):
            builder.problem(f"{path}.export", self.export, "not a Lustre file system name",
                            "at most 8 letters, digits or '_'")  # fmt: skip
        for key, value in (("nconnect", self.nconnect), ("fsc", self.fsc or None)):
            if value is not None:
                builder.problem(f"{path}.{key}", value, "an NFS option, not a Lustre one",
                                "null (false) for a Lustre mount")  # fmt: skip
        for option in self.options:
            if option not in LUSTRE_FLAG_OPTIONS:
                builder.problem(f"{path}.options", option, "an NFS option, not a Lustre one",
                                ", ".join(sorted(LUSTRE_FLAG_OPTIONS)))  # fmt: skip


@dataclass(frozen=True)
class SharedData:
    """Shared training data: NFS and Lustre client mounts, each a systemd automount.

    A mount is attempted on first access, never at boot: a node whose server is down boots,
    and the drift check reports the mount. Lustre's client kernel modules are in no Debian
    release (Ubuntu's universe carries lustre-client-utils, packages.ubuntu.com, read
    2026-12-07); the client comes only from a declared repository (a mirror of
    Whamcloud's, or a vendor's such as Azure Managed Lustre's packages.microsoft.com/repos/
    amlfs, whose Packages index lists the lustre source packages; read 2026-12-07).
    """

    mounts: tuple[SharedMount, ...] = setting((), "shared file systems to mount")
    lustre_repository_url: str | None = setting(
        None, "a flat apt repository of the Lustre client packages", check=check_url,
        accepts=URL_ACCEPTS,
    )  # fmt: skip
    lustre_repository_keyring: str | None = setting(
        None, "binary keyring (on the control machine) that signs lustre_repository_url",
        pattern=r"[^\s]+\.gpg", accepts="a path to a .gpg keyring file",
    )  # fmt: skip
    lustre_packages: tuple[str, ...] = setting(
        (), "the Lustre client packages to install from the repository, as it names them "
        "(e.g. lustre-client-utils and the client modules package for the node's kernel)",
        pattern=r"[a-z0-9][a-z0-9+.-]+", accepts="Debian package names",
    )  # fmt: skip

    @property
    def kinds(self) -> set[str]:
        return {mount.kind for mount in self.mounts}

    def validate(self, builder: Builder, path: str) -> None:
        points = [mount.mount_point for mount in self.mounts if mount.mount_point]
        for index, mount in enumerate(self.mounts):
            point = mount.mount_point
            if not point:
                continue
            if points.count(point) > 1:
                builder.problem(f"{path}.mounts[{index}].mount_point", point,
                                "declared twice", "one mount per mount point")  # fmt: skip
            for other in points:
                if other != point and point.startswith(other.rstrip("/") + "/"):
                    builder.problem(
                        f"{path}.mounts[{index}].mount_point", point, f"inside {other}",
                        "mount points that do not nest (an automount over another's tree)",
                    )  # fmt: skip
        if "lustre" in self.kinds:
            for key, value in (("lustre_repository_url", self.lustre_repository_url),
                               ("lustre_repository_keyring", self.lustre_repository_keyring),
                               ("lustre_packages", self.lustre_packages or None)):  # fmt: skip
                if value is None:
                    builder.problem(
                        f"{path}.{key}", value,
                        "a Lustre mount is declared, and Lustre's client (its kernel modules "
                        "above all) is installed only from a declared repository, with its "
                        "keyring and the package names it uses; nothing is half-installed",
                        "the mirror's URL, its binary keyring and the client packages",
                    )  # fmt: skip


@dataclass(frozen=True)
class GpuMetrics:
    """Node-local health metrics: the GPU probe writes a node_exporter textfile on a timer."""

    enabled: bool = setting(False, "install the probe and its timer on the node")
    interval_minutes: int = setting(5, "how often the probe runs", min=1, max=60)
    textfile_dir: str = setting(
        "/var/lib/prometheus/node-exporter",
        "node_exporter's textfile collector directory (Debian's default)",
        check=check_absolute_path,
        accepts=ABSOLUTE_PATH_ACCEPTS,
    )


# A systemd OnCalendar expression (systemd.time(7)): the characters its forms use.
CALENDAR = r"[A-Za-z0-9*:,./~ -]{1,64}"
CALENDAR_ACCEPTS = "a systemd OnCalendar expression such as '*-*-* 03:30:00' or 'daily'"


@dataclass(frozen=True)
class FileIntegrity:
    """AIDE over the system's programs and configuration, checked on a schedule; what
    changed outside a gpunode run is an alert in the drift report until it is accepted."""

    enabled: bool = setting(False, "install AIDE, build its database, check on a schedule")
    paths: tuple[str, ...] = setting(
        ("/boot", "/etc", "/usr/bin", "/usr/sbin", "/usr/lib/modules", "/usr/lib/systemd",
         "/usr/local"),
        "what AIDE watches (Debian 12 and 13 have merged /usr: /bin and /sbin are in /usr). "
        "Never datasets, scratch space or the NVMe cache: they change all the time",
        pattern=ABSOLUTE_PATH, accepts=ABSOLUTE_PATH_ACCEPTS,
    )  # fmt: skip
    exclude: tuple[str, ...] = setting(
        # Rewritten by the system itself: the dynamic linker's cache (ldconfig after every
        # library install), the clock's drift file, files the container or DHCP client
        # writes, lock files and AIDE's own.
        ("/etc/ld.so.cache", "/etc/adjtime", "/etc/resolv.conf", "/etc/hostname",
         "/etc/hosts", "/etc/mtab", "/etc/.pwd.lock", "/etc/machine-id", "/etc/aide"),
        "paths under those not watched",
        pattern=ABSOLUTE_PATH, accepts=ABSOLUTE_PATH_ACCEPTS,
    )  # fmt: skip
    schedule: str = setting(
        "*-*-* 03:30:00", "when the check runs (a 30 min random delay is added)",
        pattern=CALENDAR, accepts=CALENDAR_ACCEPTS,
    )  # fmt: skip
    max_age_hours: int = setting(
        48, "a last check older than this is a drift finding (the timer stopped)", min=1,
        max=24 * 31,
    )  # fmt: skip

    def validate(self, builder: Builder, path: str) -> None:
        check_path_lists(builder, path, {"paths": self.paths, "exclude": self.exclude})
        if self.enabled and not self.paths:
            builder.problem(f"{path}.paths", [], "nothing to watch", "at least one path")


def check_path_lists(builder: Builder, path: str, lists: dict[str, Any]) -> None:
    """Each entry of each named list an absolute path (audit paths and exclusions)."""
    for key, values in lists.items():
        for index, value in enumerate(values):
            reason = check_absolute_path(value)
            if reason is not None:
                builder.problem(f"{path}.{key}[{index}]", value, reason, ABSOLUTE_PATH_ACCEPTS)


# --- audit.malware_scan: ClamAV ----------------------------------------------------------

# A URL freshclam downloads from (its text is checked by check_url; this pattern only keeps
# blanks and control characters out before that).
_SIGNATURE_URL = r"https?://[^\s]{1,500}"


@dataclass(frozen=True)
class MalwareSignatures:
    """Where freshclam (Debian's clamav-freshclam) gets ClamAV's signatures. An air-gapped
    site points ``private_mirror`` at its own mirror of ClamAV's databases (made with
    ClamAV's cvdupdate) and may add databases of its own (``custom_urls``). Options from
    freshclam.conf(5) of clamav-freshclam 1.4.6+dfsg-0+deb12u1, read on a Debian 12 test node
    2026-12-02: PrivateMirror (no DNS check, If-Modified-Since; overrides DatabaseMirror),
    DatabaseCustomURL, ExcludeDatabase."""

    private_mirror: str | None = setting(
        None,
        "a private mirror of ClamAV's databases (freshclam's PrivateMirror); unset: ClamAV's "
        "own CDN, database.clamav.net (freshclam's default)",
        check=check_url, accepts=URL_ACCEPTS,
    )  # fmt: skip
    custom_urls: tuple[str, ...] = setting(
        (),
        "extra signature databases (freshclam's DatabaseCustomURL), e.g. a site's own .hdb",
        pattern=_SIGNATURE_URL, accepts=URL_ACCEPTS,
    )  # fmt: skip
    official: bool = setting(
        True,
        "fetch ClamAV's official databases (main, daily, bytecode); false: only custom_urls "
        "(freshclam's ExcludeDatabase for each; freshclam still needs a mirror to be set)",
    )
    max_age_hours: int = setting(
        72, "a last successful signature update older than this is a drift finding",
        min=1, max=24 * 31,
    )  # fmt: skip

    def validate(self, builder: Builder, path: str) -> None:
        for index, value in enumerate(self.custom_urls):
            reason = check_url(value)
            if reason is not None:
                builder.problem(f"{path}.custom_urls[{index}]", value, reason, URL_ACCEPTS)
        if not self.official and not self.custom_urls:
            builder.problem(f"{path}.custom_urls", [], "no signatures left to fetch",
                            "official: true, or at least one custom URL")  # fmt: skip
        if not self.official and self.private_mirror is None:
            builder.problem(
                f"{path}.private_mirror", None,
                "freshclam refuses to run without a mirror, even for custom databases only",
                "the URL of the site's mirror (it may serve nothing but the custom databases)",
            )  # fmt: skip


@dataclass(frozen=True)
class MalwareScan:
    """ClamAV's clamscan over the system's paths on a schedule, report only: a file it finds
    is a critical drift finding, never deleted or moved (a false positive on a node running
    jobs must not break a job or the system; a person decides).

    clamscan, not clamd: clamd keeps the whole signature database in memory (about 1 GiB
    and more) all day on a node whose memory is for jobs; clamscan loads it for the scan
    alone, once a day.

    Off by default: the scan reads every file under the paths and loads the database, a cost
    an operator chooses for a node running jobs (it runs niced, with idle I/O priority)."""

    enabled: bool = setting(False, "install ClamAV, fetch its signatures, scan on a schedule")
    paths: tuple[str, ...] = setting(
        ("/usr", "/etc", "/home", "/root", "/tmp", "/var/tmp", "/opt"),
        "what clamscan scans: programs, configuration, home and temporary directories (where "
        "a download lands). A /home shared over NFS is better scanned once on its file server "
        "than from every node. Mounts below these are not entered (--cross-fs=no): datasets "
        "and scratch space mounted there are never scanned",
        pattern=ABSOLUTE_PATH, accepts=ABSOLUTE_PATH_ACCEPTS,
    )  # fmt: skip
    exclude: tuple[str, ...] = setting(
        # The NVMe cache holds datasets and scratch data: terabytes that change every job and
        # run no code of the node's; scanning it would cost hours of I/O taken from jobs. The
        # cache's configured mount point is always excluded too (gpunode.expected).
        (NvmeCache.__dataclass_fields__["mount_point"].default,),
        "directories under those not scanned (with everything below them)",
        pattern=ABSOLUTE_PATH, accepts=ABSOLUTE_PATH_ACCEPTS,
    )  # fmt: skip
    schedule: str = setting(
        "*-*-* 04:30:00", "when the scan runs (a 30 min random delay is added); after AIDE's",
        pattern=CALENDAR, accepts=CALENDAR_ACCEPTS,
    )  # fmt: skip
    max_age_hours: int = setting(
        48, "a last scan older than this is a drift finding (the timer stopped); raise it for "
        "a weekly schedule", min=1, max=24 * 31,
    )  # fmt: skip
    signatures: MalwareSignatures = setting(
        MalwareSignatures(), "where the signatures come from (freshclam)"
    )

    def validate(self, builder: Builder, path: str) -> None:
        check_path_lists(builder, path, {"paths": self.paths, "exclude": self.exclude})
        if self.enabled and not self.paths:
            builder.problem(f"{path}.paths", [], "nothing to scan", "at least one path")
        for index, value in enumerate(self.paths):
            if value == "/":
                builder.problem(f"{path}.paths[{index}]", value,
                                "/ would scan /proc, /sys and every mount",
                                "the directories to scan")  # fmt: skip


@dataclass(frozen=True)
class Auditd:
    """The Linux audit daemon (Debian's ``auditd``) with gpunode's rules: who changed the
    accounts, sudoers, sshd's configuration or gpunode's own files. Where the kernel refuses
    audit (a container shares its host's kernel), the role reports a skip with the reason."""

    enabled: bool = setting(
        True, "install auditd, load gpunode's watch rules (augenrules) and keep it running"
    )


@dataclass(frozen=True)
class Lynis:
    """Debian's lynis audit on a schedule; its hardening index and findings are facts of the
    drift report."""

    enabled: bool = setting(False, "install lynis and run 'lynis audit system' on a timer")
    schedule: str = setting(
        "*-*-* 04:30:00", "when the audit runs (a 30 min random delay is added)",
        pattern=CALENDAR, accepts=CALENDAR_ACCEPTS,
    )  # fmt: skip
    min_hardening_index: int = setting(
        70, "a hardening index below this is a drift finding", min=0, max=100
    )
    max_age_hours: int = setting(
        48, "a report older than this is a drift finding (the timer stopped)", min=1,
        max=24 * 31,
    )  # fmt: skip


@dataclass(frozen=True)
class AuditTools:
    """Debian's small audit and accounting tools lynis asks a server for. Each is cheap on a
    GPU node and answers a question after an incident; each can be turned off."""

    # ACCT-9622: who ran what, when (lastcomm, sa): the first thing asked after an incident.
    process_accounting: bool = setting(True, "install acct (process accounting)")
    # ACCT-9626: CPU, memory, I/O and network history (sar), to tell a slow job from a slow node.
    sysstat: bool = setting(True, "install sysstat and collect its history (ENABLED=true)")
    # PKGS-7370: files of installed packages against dpkg's checksums, weekly.
    debsums: bool = setting(True, "install debsums and check packages' files weekly")
    # DEB-0831: which services still run old libraries after an upgrade. List mode only:
    # a restart of nvidia-persistenced, slurmd or the fabric manager kills running jobs, so
    # an operator drains the node and restarts it (the rollout does), never apt on its own.
    needrestart: bool = setting(True, "install needrestart in list mode (never restarts)")
    # DEB-0811: what an upgrade changes, in apt's log, before it lands.
    apt_listchanges: bool = setting(True, "install apt-listchanges")
    # DEB-0280: a private $TMPDIR per login session (no /tmp races between users' jobs).
    pam_tmpdir: bool = setting(True, "install libpam-tmpdir (private $TMPDIR per session)")
    # HOME-9304: no user's files readable by other users of a shared node.
    private_home_directories: bool = setting(
        True, "home directories of login accounts under /home lose group write and others' access"
    )
    # LOGG-2154: a copy of the logs off the node, where an intruder cannot edit them. A site
    # choice (its log host): off until the inventory names one.
    remote_syslog_host: str = setting(
        "", "forward syslog (rsyslog, over TCP) to this host; empty: no forwarding",
        pattern=rf"|{HOST_NAME}", accepts="a host name or address, or empty",
    )  # fmt: skip
    remote_syslog_port: int = setting(514, "its TCP port", min=1, max=65535)


@dataclass(frozen=True)
class Audit:
    """Security audits on a schedule: file integrity (AIDE), malware scans (ClamAV), auditd,
    lynis and the tools lynis asks for."""

    file_integrity: FileIntegrity = setting(FileIntegrity(), "AIDE file integrity")
    malware_scan: MalwareScan = setting(MalwareScan(), "ClamAV malware scans")
    auditd: Auditd = setting(Auditd(), "the Linux audit daemon and gpunode's rules")
    lynis: Lynis = setting(Lynis(), "lynis audits on a schedule")
    tools: AuditTools = setting(AuditTools(), "audit and accounting tools (lynis items)")


# nvidia-dcgm-exporter's listen port (its default address is ":9400"; roles/dcgm.py passes it).
DCGM_EXPORTER_PORT = 9400


@dataclass(frozen=True)
class NodeExporter:
    """Debian's prometheus-node-exporter, serving only TLS 1.3 with the node certificate and
    only to clients holding a client certificate from gpunode's CA (a monitoring host's
    scraper certificate, not another node's); it serves gpu_metrics' textfile."""

    enabled: bool = setting(
        False, "install prometheus-node-exporter and serve it over mutual TLS (needs tls.enabled)"
    )
    port: int = setting(
        9100,
        "TCP port it listens on; the firewall opens it to firewall.monitoring_networks only",
        min=1,
        max=65535,
    )


# Prometheus' web user: a word that sits unquoted as a YAML key of its web configuration.
PROMETHEUS_WEB_USER = r"[a-z][a-z0-9_-]{0,31}"


@dataclass(frozen=True)
class Prometheus:
    """A Prometheus server on this host (the monitoring host): Debian's ``prometheus``
    scraping the node_exporter of every host of the inventory that runs one, over mutual
    TLS 1.3 with a client certificate of its own from gpunode's CA, with gpunode's alerting
    and recording rules (monitoring/rules). Its web UI and HTTP API are served over TLS 1.3
    with the node certificate, to ``web_user`` with the password in ``web_password_file``
    only (basic authentication)."""

    enabled: bool = setting(
        False,
        "install prometheus here and scrape the inventory's node_exporters (needs tls.enabled: "
        "gpunode's CA issues its scraper certificate, and the node certificate serves its web "
        "UI; and web_password_file)",
    )
    port: int = setting(9090, "TCP port of its web UI and HTTP API", min=1, max=65535)
    web_user: str = setting(
        "gpunode",
        "the user name its web UI and HTTP API accept (basic authentication, over TLS only)",
        pattern=PROMETHEUS_WEB_USER,
        accepts="a lowercase letter, then up to 31 lowercase letters, digits, _ or -",
    )
    web_password_file: str | None = setting(
        None,
        "file on the control machine (mode 0600 or 0400, refused when others may read it) "
        "holding web_user's password; its bcrypt hash is all the host gets. Required: "
        "without it the fleet's metrics would be open to whoever reaches the port",
        check=check_absolute_path, accepts="an absolute path",
    )  # fmt: skip
    client_networks: tuple[str, ...] = setting(
        (),
        "where its web UI and HTTP API may be reached from (Grafana, operators) where the "
        "firewall is on; empty: firewall.admin_networks",
        check=check_cidr,
        accepts=CIDR_ACCEPTS,
    )
    scrape_interval_seconds: int = setting(30, "how often every target is scraped", min=1, max=3600)
    evaluation_interval_seconds: int = setting(
        30, "how often the alerting and recording rules are evaluated", min=1, max=3600
    )
    retention_days: int = setting(
        15, "how long samples are kept (--storage.tsdb.retention.time)", min=1, max=3650
    )


# Slurm names: a cluster (lowercase, as slurmdbd stores it), a partition, node features and
# GRES types (letters, digits and ._- only: they sit unquoted in slurm.conf and gres.conf).
SLURM_CLUSTER_NAME = r"[a-z][a-z0-9_-]{0,39}"
SLURM_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
SLURM_GRES_TYPE = r"[a-z0-9][a-z0-9_.-]{0,63}"


@dataclass(frozen=True)
class Slurm:
    """slurmd on the GPU node: a dynamic node (``slurmd -Z``) of the declared controller, its
    GRES (gres.conf) generated from the GPUs the node reports, the cluster's MUNGE key."""

    enabled: bool = setting(False, "install slurmd and munge and join the node to the cluster")
    controller: str | None = setting(
        None, "host name of the slurmctld host (SlurmctldHost)", pattern=HOST_NAME,
        accepts="a host name such as slurmctl or slurmctl.cluster.example",
    )  # fmt: skip
    controller_address: str | None = setting(
        None, "its address, where the host name does not resolve from the nodes",
        check=check_ip_address, accepts="an IP address",
    )  # fmt: skip
    cluster_name: str = setting(
        "gpunode", "ClusterName", pattern=SLURM_CLUSTER_NAME,
        accepts="lowercase letters, digits, _ and -, starting with a letter (at most 40)",
    )  # fmt: skip
    partition: str = setting(
        "gpu", "the partition every node is in (Nodes=ALL, the default partition)",
        pattern=SLURM_NAME, accepts="letters, digits and ._- (at most 64)",
    )  # fmt: skip
    features: tuple[str, ...] = setting(
        (), "node features (Feature=) besides the GPU type, which every node has",
        pattern=SLURM_NAME, accepts="letters, digits and ._- (at most 64 each)",
    )  # fmt: skip
    gpu_type: str | None = setting(
        None, "GRES type of the node's GPUs; unset: from the GPU's product name "
        "(NVIDIA H100 80GB HBM3 -> h100_80gb_hbm3)",
        pattern=SLURM_GRES_TYPE, accepts="lowercase letters, digits and ._- (at most 64)",
    )  # fmt: skip
    max_node_count: int = setting(
        1024, "MaxNodeCount: how many dynamic nodes the controller accepts", min=1, max=65000
    )
    # slurm.conf(5), ReturnToService (read 2026-12-07, SchedMD/slurm doc/man/man5/slurm.conf.5
    # of 2026-08-20): 0 a DOWN node stays DOWN until an administrator changes it; 1 a DOWN
    # node returns at its next registration with a valid configuration only if it was set
    # DOWN for not responding; 2 a DOWN node returns at its next registration whatever set
    # it DOWN (an operator's "PSU fault" too).
    return_to_service: Literal[0, 1, 2] = setting(
        1, "ReturnToService: which DOWN nodes come back by themselves when their slurmd "
        "registers again: 0 none, 1 only those DOWN for not responding (a node an operator "
        "set DOWN stays DOWN), 2 any, an operator's DOWN too",
    )  # fmt: skip
    munge_key_file: str | None = setting(
        None, "file on the control machine holding the cluster's MUNGE key (sent to the node, "
        "0400 munge:munge; never shown)", check=check_absolute_path,
        accepts="an absolute path",
    )  # fmt: skip
    cgroup_enforcement: bool = setting(
        True, "track and confine jobs with cgroups (proctrack/cgroup, task/cgroup, "
        "ConstrainDevices=yes): a job opens only the GPUs it was given",
    )  # fmt: skip

    def validate(self, builder: Builder, path: str) -> None:
        if not self.enabled:
            return
        if self.controller is None:
            builder.problem(
                f"{path}.controller", None, "slurmd needs its controller",
                "the slurmctld host's name",
            )  # fmt: skip
        if self.munge_key_file is None:
            builder.problem(
                f"{path}.munge_key_file", None,
                "slurmd authenticates to the controller with the cluster's MUNGE key",
                "the path of the key file on the control machine",
            )  # fmt: skip


@dataclass(frozen=True)
class ExpectedHardware:
    """What should be in the box; the drift check compares facts against it."""

    gpu_model: str | None = setting(None, "product name as nvidia-smi reports it")
    gpu_count: int | None = setting(None, "number of GPUs", min=0, max=16)
    nvswitch: bool | None = setting(None, "GPUs sit behind NVSwitches")
    nvlink_links_per_gpu: int | None = setting(None, "active NVLinks per GPU", min=0, max=18)
    ib_port_count: int | None = setting(None, "active InfiniBand ports", min=0, max=32)
    ib_rate_gbps: IB_RATES_GBPS | None = setting(None, "rate every IB port should train at")
    nvme_count: int | None = setting(None, "NVMe drives", min=0, max=64)

    def validate(self, builder: Builder, path: str) -> None:
        if self.nvswitch and self.nvlink_links_per_gpu == 0:
            builder.problem(
                f"{path}.nvlink_links_per_gpu", 0, "NVSwitch systems have NVLinks", "at least 1"
            )


@dataclass(frozen=True)
class Advisory:
    """Something an operator should know about a valid desired state (never a refusal)."""

    key: str
    value: Any
    message: str

    def render(self, source: str, host: str) -> str:
        return clean_text(f"{source}: {host}: note: {self.key} = {self.value!r}: {self.message}")


# What gpunode itself may carry out of a health finding's remedy (gpunode.health.catalogue's
# Remedy values), from the least disruptive on. The others (a reboot, a driver reinstall,
# reseating the board) stay an operator's.
HEALTH_ACTIONS = ("reset_gpu",)


@dataclass(frozen=True)
class Health:
    """Remedies gpunode carries out itself (``gpunode drift --remedy``), per failure class."""

    actions: dict[str, str] = field(
        default_factory=dict,
        metadata=spec(
            "failure class (gpunode/health/catalogue.py) -> the most disruptive remedy gpunode "
            "may carry out for it on its own; a finding whose remedy is more disruptive is "
            "left to an operator",
            accepts="failure classes such as gpu.recovery_action or memory.row_remap_pending "
            "to reset_gpu",
            pattern=r"[a-z_]{1,40}",
        ),
    )
    action_limit: int = setting(
        1, "remedies carried out per node within action_window_hours, at most", min=1, max=10
    )
    action_window_hours: int = setting(
        24, "the window action_limit counts in (a flapping node is not reset in a loop)",
        min=1, max=24 * 30,
    )  # fmt: skip

    def validate(self, builder: Builder, path: str) -> None:
        from gpunode.health.catalogue import FAILURE_CLASSES

        for name, remedy in self.actions.items():
            if name not in FAILURE_CLASSES:
                builder.problem(
                    f"{path}.actions.{name}", remedy, "unknown failure class",
                    ", ".join(sorted(FAILURE_CLASSES)),
                )  # fmt: skip
            elif remedy not in HEALTH_ACTIONS:
                builder.problem(
                    f"{path}.actions.{name}", remedy,
                    "not a remedy gpunode carries out (a reboot or a driver reinstall stays an "
                    "operator's)", ", ".join(HEALTH_ACTIONS),
                )  # fmt: skip


@dataclass(frozen=True)
class Reboot:
    """How the node is rebooted when a change needs it (today: a driver change)."""

    command: tuple[str, ...] = setting(
        (),
        "argv that performs the reboot where it is not the system's own (e.g. a test bench "
        "whose GPUs are simulated reboots its simulator); the run does not wait for the node "
        "then; unset: reboot the node and wait for it to return",
        pattern=COMMAND_WORD,
        accepts="command words of letters, digits and ._/=:@+-",
    )  # fmt: skip


@dataclass(frozen=True)
class DesiredState:
    """Everything gpunode manages on one host."""

    base_packages: tuple[str, ...] = setting(
        ("ca-certificates", "curl", "gnupg", "pciutils"), "packages every node gets",
        pattern=r"[a-z0-9][a-z0-9+.-]+", accepts="Debian package names",
    )  # fmt: skip
    admin_users: tuple[AdminUser, ...] = setting((), "operator accounts")
    sshd: Sshd = setting(Sshd(), "sshd policy")
    firewall: Firewall = setting(Firewall(), "nftables policy")
    tls: Tls = setting(Tls(), "node certificate")
    kernel: Kernel = setting(Kernel(), "sysctl and module hardening")
    unattended_upgrades: UnattendedUpgrades = setting(UnattendedUpgrades(), "unattended upgrades")
    apt: Repositories = setting(Repositories(), "package sources")
    nvidia_driver: NvidiaDriver = setting(NvidiaDriver(), "driver")
    cuda: Cuda = setting(Cuda(), "CUDA toolkits")
    container_runtime: ContainerRuntime = setting(ContainerRuntime(), "container toolkit")
    fabric_manager: FabricManager = setting(FabricManager(), "Fabric Manager")
    imex: Imex = setting(Imex(), "IMEX (multi-node NVLink)")
    dcgm: Dcgm = setting(Dcgm(), "DCGM")
    gpu_settings: GpuSettings = setting(GpuSettings(), "GPU settings")
    nccl: Nccl = setting(Nccl(), "NCCL")
    mps: Mps = setting(Mps(), "CUDA Multi-Process Service (MPS) control daemon")
    kubernetes: Kubernetes = setting(Kubernetes(), "Kubernetes worker readiness")
    infiniband: Infiniband = setting(Infiniband(), "InfiniBand / RDMA")
    nvme_cache: NvmeCache = setting(NvmeCache(), "NVMe cache")
    shared_data: SharedData = setting(SharedData(), "shared training data (NFS, Lustre)")
    gpu_metrics: GpuMetrics = setting(GpuMetrics(), "node-local GPU health metrics")
    node_exporter: NodeExporter = setting(NodeExporter(), "node_exporter over mutual TLS")
    prometheus: Prometheus = setting(Prometheus(), "Prometheus server (the monitoring host)")
    slurm: Slurm = setting(Slurm(), "Slurm compute node (slurmd)")
    audit: Audit = setting(
        Audit(),
        "security audits on a schedule (file integrity, malware, auditd, lynis, audit tools)",
    )
    expected_hardware: ExpectedHardware = setting(ExpectedHardware(), "expected hardware")
    reboot: Reboot = setting(Reboot(), "how the node reboots")
    health: Health = setting(Health(), "remedies gpunode carries out on health findings")

    @property
    def exporter_ports(self) -> tuple[int, ...]:
        """The ports of the metrics exporters gpunode runs here, which the firewall opens to
        firewall.monitoring_networks (with firewall.metrics_ports)."""
        ports = set()
        if self.node_exporter.enabled:
            ports.add(self.node_exporter.port)
        if self.dcgm.enabled and self.dcgm.exporter:
            ports.add(DCGM_EXPORTER_PORT)
        return tuple(sorted(ports))

    @property
    def prometheus_networks(self) -> tuple[str, ...]:
        """Where the firewall admits Prometheus' port from (prometheus.enabled), else ()."""
        if not self.prometheus.enabled:
            return ()
        return self.prometheus.client_networks or self.firewall.admin_networks

    @property
    def ip_forward(self) -> bool:
        """The one source of net.ipv4.ip_forward (and IPv6 forwarding): kernel.ip_forward,
        else on where containers or Kubernetes need it; validation refuses a contradiction."""
        if self.kernel.ip_forward is not None:
            return self.kernel.ip_forward
        return bool(self.container_runtime.engines) or self.kubernetes.enabled

    @property
    def forward_networks(self) -> tuple[str, ...]:
        """Where forwarded traffic may come from or go (the firewall's forward chain, drop
        otherwise): the Kubernetes pod and service networks; () renders no forward chain."""
        if not self.kubernetes.enabled:
            return ()
        return (*self.kubernetes.pod_networks, *self.kubernetes.service_networks)

    def _validate_kubernetes(self, builder: Builder) -> None:
        if not self.kubernetes.enabled:
            return
        runtime = self.container_runtime
        if "containerd" not in runtime.engines or not runtime.cdi:
            builder.problem(
                "container_runtime.engines", list(runtime.engines),
                "a Kubernetes GPU worker needs containerd with the NVIDIA runtime and CDI (the "
                "GPU Operator with the driver and toolkit pre-installed on the host)",
                "engines including containerd, and container_runtime.cdi: true",
            )  # fmt: skip
        if self.nvidia_driver.source == "none":
            builder.problem(
                "nvidia_driver.source", "none",
                "the GPU Operator's pre-installed mode needs the driver on the host",
                "debian, nvidia or ubuntu",
            )  # fmt: skip
        if self.kernel.ip_forward is False:
            builder.problem(
                "kernel.ip_forward", False,
                "contradicts kubernetes.enabled: pods' traffic is forwarded",
                "true or null (on for Kubernetes), or kubernetes.enabled: false",
            )  # fmt: skip
        wanted = {"net.ipv4.ip_forward": "1", **KUBERNETES_SYSCTLS}
        for name, value in self.kernel.sysctls.items():
            if name in wanted and value.strip() != wanted[name]:
                builder.problem(
                    f"kernel.sysctls.{name}", value,
                    "contradicts kubernetes.enabled, which needs it at " + wanted[name],
                    f"{wanted[name]}, or remove the key",
                )  # fmt: skip
        if not self.firewall.enabled:
            builder.problem(
                "firewall.enabled", False,
                "a Kubernetes worker forwards traffic, and the forward path is filtered by "
                "gpunode's nftables table only where the firewall is on",
                "firewall.enabled: true with kubernetes.enabled",
            )  # fmt: skip

    @property
    def needs_fabric_manager(self) -> bool:
        if self.fabric_manager.mode == "auto":
            return bool(self.expected_hardware.nvswitch)
        return self.fabric_manager.mode == "always"

    @property
    def dcgm_cuda_major(self) -> int | None:
        """The CUDA major of DCGM 4's CUDA part: data's, else the newest the pinned NVIDIA
        branch runs, else the newest of the declared toolkits; None when nothing says."""
        if self.dcgm.cuda_major is not None:
            return self.dcgm.cuda_major
        driver = self.nvidia_driver
        if driver.source == "nvidia" and driver.branch:
            known = nvidia_releases.BRANCHES.get(driver.branch)
            if known is not None:
                return known.max_cuda_major
            # An unlisted branch: the newest major whose minor-version floor it reaches.
            branch = nvidia_releases.version_key(driver.branch)
            return max(
                (
                    major
                    for major, floor in nvidia_releases.MINOR_VERSION_COMPATIBILITY.items()
                    if branch >= nvidia_releases.version_key(floor)[:1]
                ),
                default=None,
            )
        if self.cuda.versions:
            return max(int(release.split(".")[0]) for release in self.cuda.versions)
        return None

    @property
    def needs_nvlsm(self) -> bool:
        hardware = self.expected_hardware
        return self.needs_fabric_manager and nvidia_releases.needs_nvlsm(
            hardware.gpu_model, hardware.nvswitch
        )

    @property
    def needs_imex(self) -> bool:
        if self.imex.mode == "auto":
            return nvidia_releases.multi_node_nvlink(self.expected_hardware.gpu_model)
        return self.imex.mode == "always"

    def _validate_imex(self, builder: Builder) -> None:
        if not self.needs_imex:
            return
        if self.nvidia_driver.source != "nvidia":
            builder.problem(
                "imex.mode", self.imex.mode,
                "IMEX is only in NVIDIA's repository and must match its driver, but "
                f"nvidia_driver.source is {self.nvidia_driver.source!r}",
                "nvidia_driver.source: nvidia, or imex.mode: never",
            )  # fmt: skip
        if not self.imex.nodes:
            builder.problem(
                "imex.nodes", [], "IMEX needs every node of its NVLink domain",
                "the IP addresses of the domain's nodes (the NVL72 rack's compute trays)",
            )  # fmt: skip

    @property
    def exclusive_process_gpus(self) -> tuple[int, ...] | None:
        """The GPUs the GPU settings role sets to EXCLUSIVE_PROCESS compute mode for MPS (its
        one owner of compute mode): () for every GPU, None for none (compute mode is then
        left as found)."""
        if not (self.mps.enabled and self.mps.exclusive_process):
            return None
        return self.mps.gpus

    def _validate_mps(self, builder: Builder) -> None:
        mps = self.mps
        if not mps.enabled:
            return
        if self.gpu_settings.mig:
            # NVIDIA's MIG user guide, "MIG with CUDA MPS" (https://docs.nvidia.com/datacenter/
            # tesla/mig-user-guide/, section 10.8, read 2026-12-07): "CUDA MPS is supported on
            # top of MIG. The only limitation is that the maximum number of clients (48) is
            # lowered proportionally to the Compute Instance size." MPS then serves MIG devices,
            # named by their UUIDs (MIG-<GPU-UUID>/<GI>/<CI> in CUDA_VISIBLE_DEVICES), which
            # exist only once the layout is made; gpunode's daemon serves whole GPUs by index
            # and does not build a daemon per MIG device yet.
            builder.problem(
                "mps.enabled", True,
                "gpunode's MPS daemon serves whole GPUs, and gpu_settings.mig is true: NVIDIA "
                "supports MPS on top of MIG for MIG devices (MIG user guide, 'MIG with CUDA "
                "MPS'), which gpunode does not run yet",
                "mps.enabled: false on MIG nodes, or gpu_settings.mig: false",
            )  # fmt: skip
        if self.nvidia_driver.source == "none":
            builder.problem(
                "mps.enabled", True,
                "nvidia-cuda-mps-control comes with the driver's packages, and "
                "nvidia_driver.source is 'none'",
                "a driver source (debian, nvidia or ubuntu), or mps.enabled: false",
            )  # fmt: skip
        count = self.expected_hardware.gpu_count
        for position, index in enumerate(mps.gpus):
            if count is not None and index >= count:
                builder.problem(
                    f"mps.gpus[{position}]", index,
                    f"expected_hardware.gpu_count is {count}",
                    f"GPU indexes 0 to {count - 1}",
                )  # fmt: skip

    def validate(self, builder: Builder, path: str) -> None:
        self._validate_imex(builder)
        self._validate_mps(builder)
        self._validate_kubernetes(builder)
        self._validate_shared_data(builder)
        self._validate_node_exporter(builder)
        self._validate_dcgm_exporter(builder)
        self._validate_prometheus(builder)
        self._validate_admins(builder)
        self._validate_cuda_against_driver(builder)
        self._validate_kernel_module_flavour(builder)
        self._validate_fabric_manager(builder)
        if self.dcgm.enabled and self.dcgm.release_major == 4 and self.dcgm_cuda_major is None:
            builder.problem(
                "dcgm.cuda_major", None,
                "DCGM 4 comes in a part per CUDA major, and neither an NVIDIA driver branch nor "
                "cuda.versions says which",
                "12 or 13 (the CUDA major the node's driver runs)",
            )  # fmt: skip
        model = self.expected_hardware.gpu_model
        if self.gpu_settings.mig and model and not any(m in model for m in MIG_CAPABLE_MODELS):
            builder.problem(
                "gpu_settings.mig",
                True,
                f"expected_hardware.gpu_model {model!r} does not support MIG",
                "mig only on " + ", ".join(MIG_CAPABLE_MODELS),
            )

    def _validate_shared_data(self, builder: Builder) -> None:
        cache = self.nvme_cache
        for index, mount in enumerate(self.shared_data.mounts):
            where = f"shared_data.mounts[{index}]"
            if mount.fsc and not (cache.enabled and cache.cachefilesd):
                builder.problem(
                    f"{where}.fsc", True,
                    "FS-Cache keeps its cache in cachefilesd's directory on the NVMe cache, "
                    "and nvme_cache.enabled and nvme_cache.cachefilesd are not both true",
                    "nvme_cache.enabled and nvme_cache.cachefilesd: true, or fsc: false",
                )  # fmt: skip
            point = mount.mount_point
            if (
                cache.enabled
                and point
                and (
                    point == cache.mount_point
                    or point.startswith(cache.mount_point + "/")
                    or cache.mount_point.startswith(point + "/")
                )
            ):
                builder.problem(
                    f"{where}.mount_point", point,
                    f"overlaps the NVMe cache's mount point {cache.mount_point}",
                    "a mount point outside the NVMe cache, and not above it",
                )  # fmt: skip

    def _validate_node_exporter(self, builder: Builder) -> None:
        exporter = self.node_exporter
        if not exporter.enabled:
            return
        if not self.tls.enabled:
            builder.problem(
                "node_exporter.enabled", True,
                "node_exporter serves only over TLS with the node certificate, and tls.enabled "
                "is false",
                "tls.enabled: true, or node_exporter.enabled: false",
            )  # fmt: skip
        taken = {self.sshd.port: "sshd.port"}
        if self.dcgm.enabled and self.dcgm.exporter:
            taken[DCGM_EXPORTER_PORT] = "DCGM's exporter (dcgm.exporter)"
        if exporter.port in taken:
            builder.problem(
                "node_exporter.port", exporter.port, f"taken by {taken[exporter.port]}",
                "a port no other service of the node listens on (9100 by default)",
            )  # fmt: skip

    def _validate_dcgm_exporter(self, builder: Builder) -> None:
        if self.dcgm.enabled and self.dcgm.exporter and not self.tls.enabled:
            builder.problem(
                "dcgm.exporter", True,
                "DCGM's exporter serves only over TLS with the node certificate, and "
                "tls.enabled is false",
                "tls.enabled: true, or dcgm.exporter: false",
            )  # fmt: skip

    def _validate_prometheus(self, builder: Builder) -> None:
        server = self.prometheus
        if not server.enabled:
            return
        if not self.tls.enabled:
            builder.problem(
                "prometheus.enabled", True,
                "Prometheus scrapes the exporters with a client certificate from gpunode's CA "
                "and serves its web UI with the node certificate, and tls.enabled is false",
                "tls.enabled: true, or prometheus.enabled: false",
            )  # fmt: skip
        if server.web_password_file is None:
            builder.problem(
                "prometheus.web_password_file", None,
                f"unset: Prometheus would serve the fleet's metrics and its HTTP API to every "
                f"network that reaches port {server.port}, without authentication",
                "the path of a file on the control machine (mode 0600) holding the password "
                "of prometheus.web_user",
            )  # fmt: skip
        taken = {self.sshd.port: "sshd.port"}
        if self.node_exporter.enabled:
            taken[self.node_exporter.port] = "node_exporter.port"
        if self.dcgm.enabled and self.dcgm.exporter:
            taken[DCGM_EXPORTER_PORT] = "DCGM's exporter (dcgm.exporter)"
        if server.port in taken:
            builder.problem(
                "prometheus.port", server.port, f"taken by {taken[server.port]}",
                "a port no other service of the host listens on (9090 by default)",
            )  # fmt: skip

    def _validate_admins(self, builder: Builder) -> None:
        seen: set[str] = set()
        for index, user in enumerate(self.admin_users):
            if user.name in seen:
                builder.problem(
                    f"admin_users[{index}].name", user.name, "duplicate user", "unique names"
                )
            seen.add(user.name)

    def _pinned_driver(self) -> str | None:
        """The pinned driver version, or the branch's newest possible one; None if unpinned."""
        driver = self.nvidia_driver
        return driver.driver_version or (f"{driver.branch}.999" if driver.branch else None)

    def _validate_cuda_against_driver(self, builder: Builder) -> None:
        driver = self.nvidia_driver
        installed = self._pinned_driver()
        if installed is None:
            return
        for index, release in enumerate(self.cuda.versions):
            if release not in CUDA_MINIMUM_DRIVER:
                continue  # refused as unknown already
            if nvidia_releases.driver_runs(release, installed) != "no":
                continue
            pinned = driver.version or f"branch {driver.branch}"
            floor = nvidia_releases.compatibility_floor(release) or CUDA_MINIMUM_DRIVER[release]
            builder.problem(
                f"cuda.versions[{index}]",
                release,
                f"CUDA {release} needs driver >= {floor} (its toolkit bundles "
                f"{CUDA_MINIMUM_DRIVER[release]}), but the driver is pinned to {pinned}",
                "a CUDA release the pinned driver runs: "
                + ", ".join(
                    r
                    for r in CUDA_MINIMUM_DRIVER
                    if nvidia_releases.driver_runs(r, installed) != "no"
                ),
            )

    def _validate_kernel_module_flavour(self, builder: Builder) -> None:
        driver = self.nvidia_driver
        if driver.source == "none":
            return
        model = self.expected_hardware.gpu_model
        architecture = nvidia_releases.architecture_of(model) if model else "other"
        if driver.flavour == "proprietary" and architecture == "blackwell":
            builder.problem(
                "nvidia_driver.flavour",
                driver.flavour,
                f"expected_hardware.gpu_model {model!r} is a Blackwell GPU, which only NVIDIA's "
                "open kernel modules support",
                "open",
            )
        elif (
            driver.flavour == "proprietary"
            and driver.branch
            and nvidia_releases.version_key(driver.branch)
            >= nvidia_releases.version_key(nvidia_releases.OPEN_ONLY_FROM_BRANCH)
        ):
            builder.problem(
                "nvidia_driver.flavour",
                driver.flavour,
                f"branch {driver.branch} ships open kernel modules only (from "
                f"{nvidia_releases.OPEN_ONLY_FROM_BRANCH} on)",
                "open",
            )
        elif driver.flavour == "open" and architecture == "pre-turing":
            builder.problem(
                "nvidia_driver.flavour",
                driver.flavour,
                f"expected_hardware.gpu_model {model!r} predates Turing; NVIDIA's open kernel "
                "modules do not support it",
                "proprietary (on a branch that still ships it, 580 at the latest)",
            )

    def advisories(self, today: datetime.date | None = None) -> list[Advisory]:
        """What the operator should know about this valid state: nothing in it is refused.

        A pinned driver branch past its end of life, or a new feature branch; a CUDA release
        that runs on the pinned driver only through minor-version compatibility.
        """
        today = today or datetime.date.today()
        driver = self.nvidia_driver
        found: list[Advisory] = []
        if driver.source == "nvidia" and driver.branch:
            notice = nvidia_releases.lifecycle_notice(driver.branch, today)
            if notice:
                found.append(Advisory("nvidia_driver.branch", driver.branch, notice))
        installed = self._pinned_driver()
        if installed is None or driver.source == "none":
            return found
        for index, release in enumerate(self.cuda.versions):
            if release not in CUDA_MINIMUM_DRIVER:
                continue
            if nvidia_releases.driver_runs(release, installed) == "minor-version compatibility":
                pinned = driver.version or f"branch {driver.branch}"
                found.append(
                    Advisory(
                        f"cuda.versions[{index}]",
                        release,
                        f"runs on the pinned driver ({pinned}) only through CUDA minor-version "
                        f"compatibility: its toolkit bundles {CUDA_MINIMUM_DRIVER[release]}; PTX "
                        "JIT of its newer PTX and APIs of newer drivers are not available",
                    )
                )
        return found

    def _validate_fabric_manager(self, builder: Builder) -> None:
        if not self.needs_fabric_manager:
            return
        driver = self.nvidia_driver
        if driver.source == "debian":
            # Debian's archive packages no Fabric Manager; NVIDIA's must match NVIDIA's driver.
            builder.problem(
                "fabric_manager.mode",
                self.fabric_manager.mode,
                "Fabric Manager must match its driver and is packaged by NVIDIA's repository "
                "and Ubuntu's archive, not Debian's, but nvidia_driver.source is 'debian'",
                "nvidia_driver.source: nvidia on NVSwitch nodes, or fabric_manager.mode: never",
            )
        if driver.source == "ubuntu" and driver.ubuntu_series != "server":
            # Ubuntu's nvidia-fabricmanager-<branch> depends on the server series' kernel common
            # files at its own version (packages.ubuntu.com, fabric-manager-580, 2026-12-07).
            builder.problem(
                "nvidia_driver.ubuntu_series",
                driver.ubuntu_series,
                "Ubuntu's Fabric Manager packages (nvidia-fabricmanager-<branch>) depend on the "
                "server series' nvidia-kernel-common-<branch>-server at their own version",
                "server on NVSwitch nodes, or fabric_manager.mode: never",
            )
        fm_version = self.fabric_manager.version
        if (
            fm_version
            and driver.version
            and upstream_version(fm_version) != upstream_version(driver.version)
        ):
            builder.problem(
                "fabric_manager.version",
                fm_version,
                f"differs from nvidia_driver.version {driver.version!r}",
                f"exactly the driver version ({upstream_version(driver.version)})",
            )


def check_host_name(name: str, state: DesiredState) -> list[Problem]:
    """Problems with the inventory's name for a host, where the desired state uses it.

    With TLS on, the name is the certificate's commonName and a subjectAltName: a DNS name
    or an IP address (no zone id), at most 64 characters (RFC 5280 ub-common-name), which is
    checked here so that the run stops before any node is touched rather than at signing.
    """
    if not state.tls.enabled:
        return []
    accepted = (
        f"a host name of at most {MAX_COMMON_NAME} characters that is a DNS name or an IP "
        "address (it is the certificate's common name)"
    )
    if len(name) > MAX_COMMON_NAME:
        reason = f"the host name is {len(name)} characters, longer than a common name may be"
    elif not re.fullmatch(HOST_NAME, name) and check_ip_address(name) is not None:
        reason = "the host name is neither a DNS name nor an IP address"
    else:
        return []
    return [Problem("tls.enabled", True, f"{reason} ({name!r})", accepted)]


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def scrape_host(name: str, state: DesiredState, address: str | None) -> str | None:
    """The name or address a Prometheus dials to scrape host ``name`` (its ``ssh_hostname``
    is ``address``), or None where its name is neither (``check_host_name`` says so).

    Prometheus verifies the exporter's certificate against the name it dials, and one
    ``tls_config.server_name`` cannot name a different host per target
    (prometheus/prometheus#4827, open): it dials ``address`` when the node certificate names
    it (an IP inventory name, or one in ``tls.ip_addresses``), else the inventory name, which
    the certificate always names and the monitoring host must resolve."""
    named = {_ip(text) for text in (name, *state.tls.ip_addresses)} - {None}
    dialled = _ip(address) if address is not None else None
    if dialled is not None and dialled in named:
        return str(dialled)
    if _ip(name) is not None:
        return str(_ip(name))
    if not re.fullmatch(HOST_NAME, name):
        return None
    return name


def scrape_endpoints(name: str, state: DesiredState, address: str | None) -> list[tuple[str, str]]:
    """(the key that makes it, ``host:port``) of each exporter gpunode runs on the host, as
    Prometheus dials it (``[v6]:port`` for an IPv6 address)."""
    dialled = scrape_host(name, state, address)
    if dialled is None:
        return []
    where = f"[{dialled}]" if ":" in dialled else dialled
    found = []
    if state.node_exporter.enabled:
        found.append(("node_exporter.port", f"{where}:{state.node_exporter.port}"))
    if state.dcgm.enabled and state.dcgm.exporter:
        found.append(("dcgm.exporter", f"{where}:{DCGM_EXPORTER_PORT}"))
    return found


def check_scrape_addresses(
    hosts: list[tuple[str, DesiredState, str | None]],
) -> list[tuple[str, Problem]]:
    """(host, problem) for each host scraped at an address an earlier host of the inventory
    is scraped at too: Prometheus would scrape one exporter twice and the other never."""
    first: dict[str, str] = {}
    found = []
    for name, state, address in hosts:
        for key, endpoint in scrape_endpoints(name, state, address):
            if endpoint in first and first[endpoint] != name:
                found.append(
                    (
                        name,
                        Problem(
                            key,
                            endpoint,
                            f"hosts {first[endpoint]} and {name} are both scraped at {endpoint}",
                            "one scrape address (ssh_hostname or the host name, and port) per "
                            "exporter of each host",
                        ),
                    )
                )
            first.setdefault(endpoint, name)
    return found


TOP_LEVEL_KEYS = tuple(DesiredState.__dataclass_fields__)

# Data keys pyinfra itself reads: connector settings and global operation arguments.
PYINFRA_KEY_PREFIXES = (
    "_", "ssh_", "docker_", "dockerssh_", "podman_", "vagrant_", "local_", "chroot_",
    "winrm_", "terraform_", "x_",
)  # fmt: skip


def build_desired_state(data: Mapping[str, Any]) -> tuple[DesiredState, list[Problem]]:
    """Check one host's merged data; returns the state (defaults where invalid) and problems."""
    builder = Builder()
    ours = {}
    for key, value in data.items():
        if key in TOP_LEVEL_KEYS:
            ours[key] = value
        elif not key.startswith(PYINFRA_KEY_PREFIXES):
            builder.problem(
                key,
                value,
                unknown_key(key, TOP_LEVEL_KEYS),
                "gpunode keys ("
                + ", ".join(TOP_LEVEL_KEYS)
                + "), pyinfra connector keys (ssh_*, _sudo, ...) or your own keys prefixed x_",
            )
    state = builder.build(DesiredState, ours, "")
    return state, builder.problems

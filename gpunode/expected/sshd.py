"""sshd as gpunode writes it: the whole /etc/ssh/sshd_config and what ``sshd -T`` must print.

The floor is dev-sec's ssh-baseline; the crypto lists are those of the ssh-audit policy the
node's release names in the distribution table (gpunode/distributions.py): "Hardened Debian
12 (version 3)" on bookworm, "Hardened Debian 13 (version 1)" on trixie, "Hardened Ubuntu
Server 22.04 LTS (version 6)" on jammy, "Hardened Ubuntu Server 24.04 LTS (version 2)" on
noble, "Hardened Ubuntu Server 26.04 LTS (version 1)" on resolute, in its order. The
role (roles/sshd.py) writes this file; the drift check compares the node's effective
settings and the file's checksum with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpunode.distributions import Distribution
from gpunode.model import Sshd

# Node names the rendered file refers to; facts/accounts.py and facts/sshd.py take them from
# here, so the fact, the role and the drift check mean the same group and key.
LOGIN_GROUP = "gpunode-login"  # sshd's AllowGroups: the only accounts that may log in
RSA_HOST_KEY = "/etc/ssh/ssh_host_rsa_key"


@dataclass(frozen=True)
class SshCrypto:
    """The algorithm lists of one ssh-audit built-in policy, in its order."""

    kex: tuple[str, ...]
    ciphers: tuple[str, ...]
    macs: tuple[str, ...]


# Every policy's ciphers, in the policies' order.
HARDENED_CIPHERS = (
    "chacha20-poly1305@openssh.com",
    "aes256-gcm@openssh.com",
    "aes256-ctr",
    "aes192-ctr",
    "aes128-gcm@openssh.com",
    "aes128-ctr",
)

# ssh-audit 3.9.0, src/ssh_audit/builtin_policies.py (`ssh-audit -L` lists the names), read
# 2026-12-01. The policies also list the pseudo-algorithms ext-info-s and
# kex-strict-s-v00@openssh.com, which sshd announces by itself; they are not configured.
POLICIES: dict[str, SshCrypto] = {
    "Hardened Debian 12 (version 3)": SshCrypto(
        kex=(
            "sntrup761x25519-sha512",
            "sntrup761x25519-sha512@openssh.com",
            "curve25519-sha256",
            "curve25519-sha256@libssh.org",
            "diffie-hellman-group16-sha512",
            "diffie-hellman-group18-sha512",
            "diffie-hellman-group-exchange-sha256",
        ),
        ciphers=HARDENED_CIPHERS,
        macs=(
            "hmac-sha2-256-etm@openssh.com",
            "hmac-sha2-512-etm@openssh.com",
            "umac-128-etm@openssh.com",
        ),
    ),
    # Post-quantum key exchanges only (OpenSSH 10 has mlkem768x25519-sha256); no group
    # exchange, so /etc/ssh/moduli no longer matters to the policy.
    "Hardened Debian 13 (version 1)": SshCrypto(
        kex=(
            "mlkem768x25519-sha256",
            "sntrup761x25519-sha512",
            "sntrup761x25519-sha512@openssh.com",
        ),
        ciphers=HARDENED_CIPHERS,
        macs=(
            "hmac-sha2-512-etm@openssh.com",
            "hmac-sha2-256-etm@openssh.com",
            "umac-128-etm@openssh.com",
        ),
    ),
    # Ubuntu's policies: ssh-audit's own, github.com/jtesta/ssh-audit
    # src/ssh_audit/builtin_policies.py @1eb1105 (2026-06-20), read 2026-12-07. OpenSSH 8.9
    # knows sntrup761 only by its @openssh.com name.
    "Hardened Ubuntu Server 22.04 LTS (version 6)": SshCrypto(
        kex=(
            "sntrup761x25519-sha512@openssh.com",
            "curve25519-sha256",
            "curve25519-sha256@libssh.org",
            "diffie-hellman-group16-sha512",
            "diffie-hellman-group18-sha512",
            "diffie-hellman-group-exchange-sha256",
        ),
        ciphers=HARDENED_CIPHERS,
        macs=(
            "hmac-sha2-256-etm@openssh.com",
            "hmac-sha2-512-etm@openssh.com",
            "umac-128-etm@openssh.com",
        ),
    ),
    # Post-quantum key exchanges only, as Debian 13's (OpenSSH 10).
    "Hardened Ubuntu Server 26.04 LTS (version 1)": SshCrypto(
        kex=(
            "mlkem768x25519-sha256",
            "sntrup761x25519-sha512",
            "sntrup761x25519-sha512@openssh.com",
        ),
        ciphers=HARDENED_CIPHERS,
        macs=(
            "hmac-sha2-512-etm@openssh.com",
            "hmac-sha2-256-etm@openssh.com",
            "umac-128-etm@openssh.com",
        ),
    ),
    "Hardened Ubuntu Server 24.04 LTS (version 2)": SshCrypto(
        kex=(
            "sntrup761x25519-sha512@openssh.com",
            "curve25519-sha256",
            "curve25519-sha256@libssh.org",
            "diffie-hellman-group18-sha512",
            "diffie-hellman-group-exchange-sha256",
            "diffie-hellman-group16-sha512",
        ),
        ciphers=HARDENED_CIPHERS,
        macs=(
            "hmac-sha2-512-etm@openssh.com",
            "hmac-sha2-256-etm@openssh.com",
            "umac-128-etm@openssh.com",
        ),
    ),
}


def crypto_for(distribution: Distribution) -> SshCrypto:
    return POLICIES[distribution.ssh_audit_policy]


# Debian 12's lists, under the names other modules have imported since before the table.
KEX_ALGORITHMS = POLICIES["Hardened Debian 12 (version 3)"].kex
CIPHERS = POLICIES["Hardened Debian 12 (version 3)"].ciphers
MACS = POLICIES["Hardened Debian 12 (version 3)"].macs

HOST_KEY_ALGORITHMS = (
    "ssh-ed25519",
    "ssh-ed25519-cert-v01@openssh.com",
    "sk-ssh-ed25519@openssh.com",
    "sk-ssh-ed25519-cert-v01@openssh.com",
    "rsa-sha2-512",
    "rsa-sha2-512-cert-v01@openssh.com",
    "rsa-sha2-256",
    "rsa-sha2-256-cert-v01@openssh.com",
)


def _yes_no(value: bool) -> str:
    return "yes" if value else "no"


def render_sshd_config(sshd: Sshd, distribution: Distribution) -> str:
    """The whole /etc/ssh/sshd_config for a node of ``distribution``; it includes no drop-ins
    (their Match blocks would win)."""
    crypto = crypto_for(distribution)
    lines = [
        "# Managed by gpunode. Nothing is included: a Match block in a drop-in would override",
        "# these settings, so /etc/ssh/sshd_config.d is not read. Set what you need in the",
        "# inventory.",
        f"Port {sshd.port}",
        "AddressFamily any",
        *(f"ListenAddress {address}" for address in sshd.listen_addresses),
        "HostKey /etc/ssh/ssh_host_ed25519_key",
        f"HostKey {RSA_HOST_KEY}",
        f"HostKeyAlgorithms {','.join(HOST_KEY_ALGORITHMS)}",
        f"KexAlgorithms {','.join(crypto.kex)}",
        f"Ciphers {','.join(crypto.ciphers)}",
        f"MACs {','.join(crypto.macs)}",
        f"PermitRootLogin {sshd.permit_root_login}",
        f"AllowGroups {LOGIN_GROUP}",
        "PubkeyAuthentication yes",
        "AuthorizedKeysFile .ssh/authorized_keys",
        "AuthenticationMethods publickey",
        "PasswordAuthentication no",
        "PermitEmptyPasswords no",
        "KbdInteractiveAuthentication no",
        "HostbasedAuthentication no",
        "IgnoreRhosts yes",
        "IgnoreUserKnownHosts yes",
        "KerberosAuthentication no",
        "GSSAPIAuthentication no",
        "UsePAM yes",
        "StrictModes yes",
        f"MaxAuthTries {sshd.max_auth_tries}",
        f"MaxSessions {sshd.max_sessions}",
        "MaxStartups 10:30:60",
        f"LoginGraceTime {sshd.login_grace_time_s}",
        f"ClientAliveInterval {sshd.client_alive_interval_s}",
        f"ClientAliveCountMax {sshd.client_alive_count_max}",
        "TCPKeepAlive no",
        "SyslogFacility AUTH",
        "LogLevel VERBOSE",
        "PermitUserEnvironment no",
        "PermitTunnel no",
        f"AllowTcpForwarding {_yes_no(sshd.allow_tcp_forwarding)}",
        f"AllowAgentForwarding {_yes_no(sshd.allow_agent_forwarding)}",
        "GatewayPorts no",
        f"X11Forwarding {_yes_no(sshd.x11_forwarding)}",
        "X11UseLocalhost yes",
        "PrintMotd no",
        "PrintLastLog no",
        "Banner none",
        "DebianBanner no",
        "Compression no",
        "UseDNS no",
        *(
            [f"PerSourcePenaltyExemptList {','.join(sshd.penalty_exempt_networks)}"]
            if sshd.penalty_exempt_networks and distribution.per_source_penalties
            else []
        ),
        "AcceptEnv LANG LC_*",
        "Subsystem sftp /usr/lib/openssh/sftp-server -f AUTHPRIV -l INFO",
    ]
    return "\n".join(lines) + "\n"


# Keywords `sshd -T` does not print once (or at all), and spellings it normalises.
_NOT_SINGLE_IN_EFFECTIVE = {"debianbanner", "hostkey", "listenaddress", "subsystem", "acceptenv"}
_EFFECTIVE_SPELLING = {("permitrootlogin", "prohibit-password"): "without-password"}


def expected_effective(sshd: Sshd, distribution: Distribution) -> dict[str, str]:
    """What ``sshd -T`` must print for every single-valued setting gpunode writes."""
    expected = {}
    for line in render_sshd_config(sshd, distribution).splitlines():
        if not line or line.startswith("#"):
            continue
        keyword, _, value = line.partition(" ")
        key = keyword.lower()
        if key not in _NOT_SINGLE_IN_EFFECTIVE:
            expected[key] = _EFFECTIVE_SPELLING.get((key, value), value)
    return expected

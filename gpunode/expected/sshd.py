"""sshd as gpunode writes it: the whole /etc/ssh/sshd_config and what ``sshd -T`` must print.

The floor is dev-sec's ssh-baseline; the crypto lists are those of ssh-audit's "Hardened
Debian 12 (version 3)" policy, in its order. The role (roles/sshd.py) writes this file; the
drift check compares the node's effective settings and the file's checksum with it.
"""

from __future__ import annotations

from gpunode.model import Sshd

# Node names the rendered file refers to; facts/accounts.py and facts/sshd.py take them from
# here, so the fact, the role and the drift check mean the same group and key.
LOGIN_GROUP = "gpunode-login"  # sshd's AllowGroups: the only accounts that may log in
RSA_HOST_KEY = "/etc/ssh/ssh_host_rsa_key"

KEX_ALGORITHMS = (
    "sntrup761x25519-sha512",
    "sntrup761x25519-sha512@openssh.com",
    "curve25519-sha256",
    "curve25519-sha256@libssh.org",
    "diffie-hellman-group16-sha512",
    "diffie-hellman-group18-sha512",
    "diffie-hellman-group-exchange-sha256",
)
CIPHERS = (
    "chacha20-poly1305@openssh.com",
    "aes256-gcm@openssh.com",
    "aes256-ctr",
    "aes192-ctr",
    "aes128-gcm@openssh.com",
    "aes128-ctr",
)
MACS = (
    "hmac-sha2-256-etm@openssh.com",
    "hmac-sha2-512-etm@openssh.com",
    "umac-128-etm@openssh.com",
)
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


def render_sshd_config(sshd: Sshd) -> str:
    """The whole /etc/ssh/sshd_config; it includes no drop-ins (their Match blocks would win)."""
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
        f"KexAlgorithms {','.join(KEX_ALGORITHMS)}",
        f"Ciphers {','.join(CIPHERS)}",
        f"MACs {','.join(MACS)}",
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
        "AcceptEnv LANG LC_*",
        "Subsystem sftp /usr/lib/openssh/sftp-server -f AUTHPRIV -l INFO",
    ]
    return "\n".join(lines) + "\n"


# Keywords `sshd -T` does not print once (or at all), and spellings it normalises.
_NOT_SINGLE_IN_EFFECTIVE = {"debianbanner", "hostkey", "listenaddress", "subsystem", "acceptenv"}
_EFFECTIVE_SPELLING = {("permitrootlogin", "prohibit-password"): "without-password"}


def expected_effective(sshd: Sshd) -> dict[str, str]:
    """What ``sshd -T`` must print for every single-valued setting gpunode writes."""
    expected = {}
    for line in render_sshd_config(sshd).splitlines():
        if not line or line.startswith("#"):
            continue
        keyword, _, value = line.partition(" ")
        key = keyword.lower()
        if key not in _NOT_SINGLE_IN_EFFECTIVE:
            expected[key] = _EFFECTIVE_SPELLING.get((key, value), value)
    return expected

"""SSH server checks: dev-sec ssh-baseline server controls (sshd-01 ... sshd-50) that apply,
plus the crypto of ssh-audit's policy for the node's release: "Hardened Debian 12 (version 3)"
on Debian 12, "Hardened Debian 13 (version 1)" on Debian 13, "Hardened Ubuntu Server 22.04 LTS
(version 6)", "... 24.04 LTS (version 2)" and "... 26.04 LTS (version 1)" on Ubuntu's.

Values are read from the *effective* configuration (``sshd -T``), so drop-ins count, and
again for every declared admin and root as sshd applies it to a login from outside
(``sshd -T -C user=...,addr=<a non-local address>``), so Match blocks count too.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpunode.model import DesiredState

# ssh-audit's "Hardened Debian 12 (version 3)" policy, in its order (sshd -T prints them so).
KEX_ALGORITHMS_DEBIAN_12 = (
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
MACS_DEBIAN_12 = (
    "hmac-sha2-256-etm@openssh.com",
    "hmac-sha2-512-etm@openssh.com",
    "umac-128-etm@openssh.com",
)
# ssh-audit's "Hardened Debian 13 (version 1)": post-quantum key exchanges only.
KEX_ALGORITHMS_DEBIAN_13 = (
    "mlkem768x25519-sha256",
    "sntrup761x25519-sha512",
    "sntrup761x25519-sha512@openssh.com",
)
MACS_DEBIAN_13 = (
    "hmac-sha2-512-etm@openssh.com",
    "hmac-sha2-256-etm@openssh.com",
    "umac-128-etm@openssh.com",
)
# ssh-audit's Ubuntu policies (github.com/jtesta/ssh-audit src/ssh_audit/builtin_policies.py,
# read 2026-12-07). OpenSSH 8.9 (22.04) and 9.6 (24.04) offer no ML-KEM; 26.04's is
# post-quantum only, as Debian 13's.
KEX_ALGORITHMS_UBUNTU_2204 = (
    "sntrup761x25519-sha512@openssh.com",
    "curve25519-sha256",
    "curve25519-sha256@libssh.org",
    "diffie-hellman-group16-sha512",
    "diffie-hellman-group18-sha512",
    "diffie-hellman-group-exchange-sha256",
)
KEX_ALGORITHMS_UBUNTU_2404 = (
    "sntrup761x25519-sha512@openssh.com",
    "curve25519-sha256",
    "curve25519-sha256@libssh.org",
    "diffie-hellman-group18-sha512",
    "diffie-hellman-group-exchange-sha256",
    "diffie-hellman-group16-sha512",
)
# By the node's os-release ID and VERSION_ID.
KEX_ALGORITHMS = {
    ("debian", "12"): KEX_ALGORITHMS_DEBIAN_12,
    ("debian", "13"): KEX_ALGORITHMS_DEBIAN_13,
    ("ubuntu", "22.04"): KEX_ALGORITHMS_UBUNTU_2204,
    ("ubuntu", "24.04"): KEX_ALGORITHMS_UBUNTU_2404,
    ("ubuntu", "26.04"): KEX_ALGORITHMS_DEBIAN_13,
}
MACS = {
    ("debian", "12"): MACS_DEBIAN_12,
    ("debian", "13"): MACS_DEBIAN_13,
    ("ubuntu", "22.04"): MACS_DEBIAN_12,
    ("ubuntu", "24.04"): MACS_DEBIAN_13,
    ("ubuntu", "26.04"): MACS_DEBIAN_13,
}
RELEASES = tuple(KEX_ALGORITHMS)
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

# (control, sshd -T keyword, expected value): the fixed part of the baseline.
FIXED_SETTINGS = [
    ("sshd-11", "pubkeyauthentication", "yes"),
    ("sshd-12", "passwordauthentication", "no"),
    ("sshd-13", "permitemptypasswords", "no"),
    ("sshd-14", "kbdinteractiveauthentication", "no"),
    ("sshd-15", "authenticationmethods", "publickey"),
    ("sshd-16", "usepam", "yes"),
    ("sshd-17", "ignorerhosts", "yes"),
    ("sshd-18", "ignoreuserknownhosts", "yes"),
    ("sshd-19", "hostbasedauthentication", "no"),
    ("sshd-20", "maxstartups", "10:30:60"),
    ("sshd-21", "strictmodes", "yes"),
    ("sshd-22", "syslogfacility", "AUTH"),
    ("sshd-23", "loglevel", "VERBOSE"),
    ("sshd-24", "permituserenvironment", "no"),
    ("sshd-25", "tcpkeepalive", "no"),
    ("sshd-27", "permittunnel", "no"),
    ("sshd-28", "gatewayports", "no"),
    ("sshd-29", "x11uselocalhost", "yes"),
    ("sshd-30", "printmotd", "no"),
    ("sshd-31", "printlastlog", "no"),
    ("sshd-32", "banner", "none"),
    ("sshd-34", "kerberosauthentication", "no"),
    ("sshd-35", "gssapiauthentication", "no"),
    ("sshd-36", "compression", "no"),
    ("sshd-37", "usedns", "no"),
    ("gpunode-login-group", "allowgroups", "gpunode-login"),
    ("gpunode-key-file", "authorizedkeysfile", ".ssh/authorized_keys"),
]
# A login from outside, for the per-account evaluation (TEST-NET-1: never local).
OUTSIDE_ADDRESS = "192.0.2.1"


def _settings_from_data(desired: DesiredState) -> dict[str, str]:
    sshd = desired.sshd
    yes_no = {True: "yes", False: "no"}
    return {
        "permitrootlogin": sshd.permit_root_login.replace("prohibit-password", "without-password"),
        "port": str(sshd.port),
        "maxauthtries": str(sshd.max_auth_tries),
        "maxsessions": str(sshd.max_sessions),
        "logingracetime": str(sshd.login_grace_time_s),
        "clientaliveinterval": str(sshd.client_alive_interval_s),
        "clientalivecountmax": str(sshd.client_alive_count_max),
        "allowtcpforwarding": yes_no[sshd.allow_tcp_forwarding],
        "allowagentforwarding": yes_no[sshd.allow_agent_forwarding],
        "x11forwarding": yes_no[sshd.x11_forwarding],
    }


DATA_SETTINGS = [
    ("sshd-06", "permitrootlogin"),
    ("sshd-07", "port"),
    ("sshd-38", "maxauthtries"),
    ("sshd-39", "maxsessions"),
    ("sshd-40", "logingracetime"),
    ("sshd-41", "clientaliveinterval"),
    ("sshd-42", "clientalivecountmax"),
    ("sshd-43", "allowtcpforwarding"),
    ("sshd-44", "allowagentforwarding"),
    ("sshd-45", "x11forwarding"),
]


_effective_by_host: dict[str, dict[str, list[str]]] = {}


def effective(host: Any) -> dict[str, list[str]]:
    """``sshd -T`` of this host, read once per test session."""
    name = host.backend.get_hostname()
    if name not in _effective_by_host:
        output = host.check_output(
            "/usr/sbin/sshd -T -C user=root,host=localhost,addr=127.0.0.1,lport=22"
        )
        settings: dict[str, list[str]] = {}
        for line in output.splitlines():
            keyword, _, value = line.partition(" ")
            settings.setdefault(keyword, []).append(value)
        _effective_by_host[name] = settings
    return _effective_by_host[name]


@pytest.mark.parametrize(("control", "keyword", "expected"), FIXED_SETTINGS)
def test_sshd_setting(host: Any, control: str, keyword: str, expected: str) -> None:
    assert effective(host).get(keyword) == [expected], f"{control}: {keyword}"


@pytest.mark.parametrize(("control", "keyword"), DATA_SETTINGS)
def test_sshd_setting_from_data(
    host: Any, desired: DesiredState, control: str, keyword: str
) -> None:
    assert effective(host).get(keyword) == [_settings_from_data(desired)[keyword]], control


def node_release(host: Any) -> tuple[str, str]:
    """The node's os-release ID and VERSION_ID: the policy depends on them."""
    found = tuple(host.run('. /etc/os-release && echo "$ID $VERSION_ID"').stdout.split())
    assert found in RELEASES, f"{found}: not a release gpunode converges ({RELEASES})"
    return found[0], found[1]


@pytest.mark.parametrize(
    ("control", "keyword", "expected"),
    [
        ("sshd-01", "ciphers", dict.fromkeys(RELEASES, CIPHERS)),
        ("sshd-02", "kexalgorithms", KEX_ALGORITHMS),
        ("sshd-03", "macs", MACS),
        ("ssh-audit host keys", "hostkeyalgorithms", dict.fromkeys(RELEASES, HOST_KEY_ALGORITHMS)),
    ],
)
def test_sshd_crypto_is_exactly_the_hardened_list(
    host: Any, control: str, keyword: str, expected: dict[tuple[str, str], tuple[str, ...]]
) -> None:
    wanted = expected[node_release(host)]
    assert effective(host)[keyword] == [",".join(wanted)], control


def test_sshd_04_ssh_directory_owned_by_root_and_not_writable_by_others(host: Any) -> None:
    directory = host.file("/etc/ssh")
    assert directory.user == "root" and directory.group == "root"
    assert directory.mode & 0o022 == 0


def test_sshd_05_sshd_config_root_only(host: Any) -> None:
    config = host.file("/etc/ssh/sshd_config")
    assert (config.user, config.group, config.mode) == ("root", "root", 0o600)


def test_sshd_09_listen_addresses_from_data(host: Any, desired: DesiredState) -> None:
    listening = effective(host).get("listenaddress", [])
    if desired.sshd.listen_addresses:
        assert sorted(a.rsplit(":", 1)[0].strip("[]") for a in listening) == sorted(
            desired.sshd.listen_addresses
        )
    else:
        assert sorted(listening) == sorted(
            [f"[::]:{desired.sshd.port}", f"0.0.0.0:{desired.sshd.port}"]
        )


def test_sshd_33_banner_does_not_reveal_the_debian_version(
    host: Any, desired: DesiredState
) -> None:
    banner = host.check_output(
        f"timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/{desired.sshd.port}; head -1 <&3'"
    )
    assert banner.startswith("SSH-2.0-OpenSSH_")
    assert "Debian" not in banner


def test_sshd_48_no_moduli_below_3072_bits(host: Any) -> None:
    weak = host.check_output("awk '!/^#/ && $5 < 3071' /etc/ssh/moduli | wc -l")
    assert weak.strip() == "0"


def test_sshd_49_no_crypto_overrides_on_the_command_line(host: Any) -> None:
    options = host.check_output(
        "cat /proc/$(systemctl show -p MainPID --value ssh.service)/cmdline | tr '\\0' ' '"
    )
    for keyword in ("Ciphers", "MACs", "KexAlgorithms", "HostKeyAlgorithms"):
        assert keyword.lower() not in options.lower()


def test_sshd_50_rsa_host_key_is_4096_bits(host: Any) -> None:
    line = host.check_output("ssh-keygen -l -f /etc/ssh/ssh_host_rsa_key.pub")
    assert line.split()[0] == "4096"


def test_sshd_runs_as_a_service_not_socket_activated(host: Any) -> None:
    assert host.service("ssh").is_running
    assert host.service("ssh").is_enabled
    # Debian ships ssh.socket disabled; on Ubuntu 22.10 and later, which start sshd from it,
    # gpunode masks it. `systemctl is-enabled` answers either, or nothing for no such unit.
    state = host.run("systemctl is-enabled ssh.socket").stdout.strip()
    assert state in ("disabled", "masked", ""), state


def test_admin_keys_are_exactly_those_in_the_inventory(host: Any, desired: DesiredState) -> None:
    for user in desired.admin_users:
        path = f"/home/{user.name}/.ssh/authorized_keys"
        keys = {
            line.strip() for line in host.file(path).content_string.splitlines() if line.strip()
        }
        assert keys == set(user.ssh_keys), user.name


def test_admin_sudoers_dropin_is_root_only(host: Any) -> None:
    dropin = host.file("/etc/sudoers.d/gpunode-admins")
    assert (dropin.user, dropin.mode) == ("root", 0o440)
    assert host.run("visudo -c -q -f /etc/sudoers.d/gpunode-admins").rc == 0


def test_sshd_config_includes_nothing(host: Any) -> None:
    # A Match block in a drop-in would override every setting above it.
    lines = host.file("/etc/ssh/sshd_config").content_string.splitlines()
    assert not [line for line in lines if line.split(" ")[0].lower() in ("include", "match")]


def test_each_admin_and_root_get_the_hardened_settings_from_outside(
    host: Any, desired: DesiredState
) -> None:
    expected = {
        "passwordauthentication": "no",
        "kbdinteractiveauthentication": "no",
        "authenticationmethods": "publickey",
        "pubkeyauthentication": "yes",
        "allowgroups": "gpunode-login",
        "authorizedkeysfile": ".ssh/authorized_keys",
        "permitrootlogin": _settings_from_data(desired)["permitrootlogin"],
    }
    for user in ["root", *(admin.name for admin in desired.admin_users)]:
        output = host.check_output(
            f"/usr/sbin/sshd -T -C user={user},host={OUTSIDE_ADDRESS},addr={OUTSIDE_ADDRESS},"
            f"lport={desired.sshd.port}"
        )
        settings = dict(line.partition(" ")[::2] for line in output.splitlines())
        assert {key: settings.get(key) for key in expected} == expected, user


def test_only_declared_admins_and_the_login_user_may_log_in(
    host: Any, desired: DesiredState
) -> None:
    login_user = host.check_output("echo ${SUDO_USER:-$(id -un)}").strip()
    allowed = {admin.name for admin in desired.admin_users} | {login_user}
    if desired.sshd.permit_root_login != "no":
        allowed.add("root")
    members = host.check_output("getent group gpunode-login | cut -d: -f4").strip()
    assert set(filter(None, members.split(","))) <= allowed

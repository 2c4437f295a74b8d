"""sshd role: rendering, lock-out refusal, and the operation's commands from the fact."""

from __future__ import annotations

import hashlib
from typing import Any

from pyinfra.api import FunctionCommand

from facts.sshd import SshdState, parse_effective
from gpunode.model import DesiredState, Sshd, build_desired_state
from roles.sshd import CIPHERS, hardened_sshd, lockout_risks, render_sshd_config

from .fakehost import fake_host

CONFIG = render_sshd_config(Sshd())


def fact(**overrides: Any) -> dict[type, Any]:
    good = {
        "effective": {},
        "effective_error": "",
        "config_sha1": hashlib.sha1(CONFIG.encode()).hexdigest(),
        "rsa_host_key_bits": 4096,
        "weak_moduli": 0,
        "socket_enabled": False,
    }
    return {SshdState: good | overrides}


def run(facts: dict[type, Any]) -> tuple[list[str], list[str], list[Any]]:
    with fake_host(facts) as host:
        yielded = list(hardened_sshd._inner(config=CONFIG, port=22))
    shell = [str(c) for c in yielded if not isinstance(c, FunctionCommand)]
    functions = [c for c in yielded if isinstance(c, FunctionCommand)]
    return shell, host.noops, functions


def test_hardened_settings_come_before_the_drop_in_include() -> None:
    lines = CONFIG.splitlines()
    include = lines.index("Include /etc/ssh/sshd_config.d/*.conf")
    assert include == len(lines) - 1
    assert lines.index("PasswordAuthentication no") < include
    assert f"Ciphers {','.join(CIPHERS)}" in lines


def test_data_knobs_reach_the_config() -> None:
    config = render_sshd_config(Sshd(port=2222, permit_root_login="prohibit-password"))
    assert "Port 2222" in config.splitlines()
    assert "PermitRootLogin prohibit-password" in config.splitlines()


def test_everything_in_place_is_a_noop() -> None:
    shell, noops, functions = run(fact())
    assert shell == [] and functions == []
    assert noops == ["sshd already hardened and effective"]


def test_changed_config_is_validated_then_confirmed_by_a_new_login() -> None:
    shell, _, functions = run(fact(config_sha1="0" * 40))
    assert shell[0].startswith("mkdir -p -m 0700 /var/lib/gpunode/sshd-previous")
    assert shell[1].startswith("printf '%s' '# Managed by gpunode.")
    assert shell[2] == (
        "/usr/sbin/sshd -t -f /etc/ssh/sshd_config.gpunode-candidate || "
        "{ rm -f /etc/ssh/sshd_config.gpunode-candidate; exit 1; }"
    )
    assert shell[3] == "mv /etc/ssh/sshd_config.gpunode-candidate /etc/ssh/sshd_config"
    assert shell[4] == "systemctl enable ssh.service && systemctl reload-or-restart ssh.service"
    assert len(functions) == 1 and functions[0].args == (22,)


def test_weak_rsa_key_socket_activation_and_moduli_are_fixed() -> None:
    shell, _, _ = run(fact(rsa_host_key_bits=3072, weak_moduli=60, socket_enabled=True))
    joined = "\n".join(shell)
    assert "systemctl disable --now ssh.socket && systemctl mask ssh.socket" in joined
    assert "ssh-keygen -q -t rsa -b 4096 -N '' -f /etc/ssh/ssh_host_rsa_key" in joined
    assert "awk '/^#/ || $5 >= 3071' /etc/ssh/moduli" in joined


def test_root_login_deploy_with_root_login_off_is_refused() -> None:
    (risk,) = lockout_risks(DesiredState(), login_user="root", password=False)
    assert "logs in as root and sshd.permit_root_login is 'no'" in risk
    state, _ = build_desired_state({"sshd": {"permit_root_login": "prohibit-password"}})
    assert lockout_risks(state, login_user="root", password=False) == []
    assert lockout_risks(DesiredState(), login_user="debian", password=False) == []


def test_password_deploy_is_refused() -> None:
    (risk,) = lockout_risks(DesiredState(), login_user="debian", password=True)
    assert "logs in with a password" in risk


def test_effective_parser_keeps_repeated_keywords() -> None:
    parsed = parse_effective(["port 22", "listenaddress [::]:22", "listenaddress 0.0.0.0:22"])
    assert parsed == {"port": ["22"], "listenaddress": ["[::]:22", "0.0.0.0:22"]}

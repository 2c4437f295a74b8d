"""sshd role: rendering, lock-out refusal, and the operation's commands from the fact."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import FunctionCommand

from facts.sshd import (
    CANDIDATES_COMMAND,
    PER_USER_COMMAND,
    SSHD_CONFIG,
    SshdState,
    parse_effective,
    parse_per_user,
)
from gpunode import framing
from gpunode.distributions import BY_CODENAME
from gpunode.expected.sshd import CIPHERS, expected_effective, render_sshd_config
from gpunode.framing import PartOutput
from gpunode.model import DesiredState, Sshd, build_desired_state
from roles import sshd as sshd_role
from roles.sshd import hardened_sshd, lockout_risks, login_group_guard

from .fakehost import fake_host

BOOKWORM = BY_CODENAME["bookworm"]
CONFIG = render_sshd_config(Sshd(), BOOKWORM)


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


def run(
    facts: dict[type, Any], login_user: str | None = None
) -> tuple[list[str], list[str], list[Any]]:
    with fake_host(facts) as host:
        yielded = list(hardened_sshd._inner(config=CONFIG, port=22, login_user=login_user))
    shell = [str(c) for c in yielded if not isinstance(c, FunctionCommand)]
    functions = [c for c in yielded if isinstance(c, FunctionCommand)]
    return shell, host.noops, functions


def test_config_reads_no_drop_ins_and_lets_only_the_login_group_in() -> None:
    # A drop-in's Match block overrides first-value-wins, so nothing is included at all.
    lines = CONFIG.splitlines()
    assert not [line for line in lines if line.split(" ")[0].lower() in ("include", "match")]
    assert "AllowGroups gpunode-login" in lines
    assert "AuthorizedKeysFile .ssh/authorized_keys" in lines
    assert "PasswordAuthentication no" in lines
    assert f"Ciphers {','.join(CIPHERS)}" in lines


@pytest.mark.parametrize("codename", sorted(BY_CODENAME))
def test_no_release_s_config_reads_cloud_init_s_drop_in(codename: str) -> None:
    # Ubuntu's and Debian's cloud images ship /etc/ssh/sshd_config.d/50-cloud-init.conf
    # (PasswordAuthentication yes where the image was asked for passwords), and their own
    # sshd_config includes that directory before anything else: sshd keeps the first value,
    # so the drop-in would win. gpunode's whole file includes nothing, on every release.
    config = render_sshd_config(Sshd(), BY_CODENAME[codename]).splitlines()
    keywords = [line.split()[0].lower() for line in config if line.strip()]
    assert "include" not in keywords and "match" not in keywords
    assert "PasswordAuthentication no" in config
    assert "KbdInteractiveAuthentication no" in config


def test_expected_effective_covers_login_group_and_key_file() -> None:
    expected = expected_effective(Sshd(), BOOKWORM)
    assert expected["allowgroups"] == "gpunode-login"
    assert expected["authorizedkeysfile"] == ".ssh/authorized_keys"


def test_data_knobs_reach_the_config() -> None:
    config = render_sshd_config(Sshd(port=2222, permit_root_login="prohibit-password"), BOOKWORM)
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
    assert shell[4] == "systemctl enable ssh.service && { systemctl restart ssh.service || true; }"
    assert len(functions) == 1 and functions[0].args == (22, False)


def test_weak_rsa_key_socket_activation_and_moduli_are_fixed() -> None:
    shell, _, _ = run(fact(rsa_host_key_bits=3072, weak_moduli=60, socket_enabled=True))
    joined = "\n".join(shell)
    assert "systemctl disable --now ssh.socket && systemctl mask ssh.socket" in joined
    assert "ssh-keygen -q -t rsa -b 4096 -N '' -f /etc/ssh/ssh_host_rsa_key" in joined
    assert "awk '/^#/ || $5 >= 3071' /etc/ssh/moduli" in joined


def test_a_login_cut_on_a_socket_activated_node_gives_sshd_back_to_ssh_socket() -> None:
    # Ubuntu 24.04 starts sshd from ssh.socket; the run moves it to ssh.service. If the new
    # login fails, the restore starts it as it was: from the socket, ssh.service disabled.
    for socket_enabled in (True, False):
        _, _, functions = run(fact(socket_enabled=socket_enabled, config_sha1="0" * 40))
        (confirm,) = functions
        assert confirm.function is sshd_role._confirm_or_restore
        assert confirm.args[1] is socket_enabled
    socket = sshd_role._restore_command(socket_activated=True)
    assert socket.endswith(
        "systemctl stop ssh.service && systemctl unmask ssh.socket && "
        "systemctl enable --now ssh.socket && systemctl disable ssh.service"
    )
    assert "reload-or-restart" not in socket
    assert sshd_role._restore_command().endswith("systemctl restart ssh.service")


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


def test_deploy_user_must_be_in_the_login_group_before_anything_changes() -> None:
    shell, _, _ = run(fact(config_sha1="0" * 40), login_user="debian")
    assert shell[0] == login_group_guard("debian")
    assert shell[0].startswith("id -Gn -- debian | tr ' ' '\\n' | grep -qx gpunode-login || {")
    assert "the deploy user debian is not in gpunode-login" in shell[0]
    assert shell[1].startswith("mkdir -p -m 0700 /var/lib/gpunode/sshd-previous")
    # Nothing to change: no guard either.
    shell, _, _ = run(fact(), login_user="debian")
    assert shell == []


def test_per_user_view_keeps_each_account_and_the_control_address() -> None:
    parsed = parse_per_user(
        [
            "connection 10.213.0.1 22",
            "gpunode:user=gpuadmin",
            "passwordauthentication yes",
            "allowgroups gpunode-login",
            "gpunode:user=root",
            "Bad configuration option: Match",
            "gpunode:user=BAD;rm",
            "passwordauthentication no",
        ]
    )
    assert parsed["address"] == "10.213.0.1" and parsed["port"] == 22
    assert parsed["users"]["gpuadmin"] == {
        "passwordauthentication": ["yes"],
        "allowgroups": ["gpunode-login"],
    }
    assert parsed["users"]["root"] == {"error": ["Bad configuration option: Match"]}
    assert set(parsed["users"]) == {"gpuadmin", "root"}


def test_per_user_view_refuses_a_hostile_address() -> None:
    parsed = parse_per_user(["connection 10.0.0.1;reboot 22x"])
    assert parsed == {"address": None, "port": None, "users": {}}


def test_fact_evaluates_sshd_per_user_from_a_non_local_address() -> None:
    command = SshdState().command()
    assert '/usr/sbin/sshd -T -C "user=$u,host=$addr,addr=$addr,lport=$lport"' in command
    assert "SSH_CONNECTION" in command and "addr=192.0.2.1" in command


def _per_user_run(tmp_path: Path, config: str | None) -> tuple[dict[str, Any], list[str]]:
    """The per-user part, run by the shell with a stand-in sshd that logs its calls and a
    config file of ``config`` (None: no file); the accounts are root, gpuadmin and debian."""
    calls = tmp_path / "calls"
    sshd = tmp_path / "sshd"
    sshd.write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\necho "port 22"\necho "passwordauthentication no"\n'
    )
    sshd.chmod(0o755)
    path = tmp_path / "sshd_config"
    if config is not None:
        path.write_text(config)
    command = (
        PER_USER_COMMAND.replace(CANDIDATES_COMMAND, 'users="debian gpuadmin root"')
        .replace("/usr/sbin/sshd", str(sshd))
        .replace(SSHD_CONFIG, str(path))
    )
    env = {key: value for key, value in os.environ.items() if key != "SSH_CONNECTION"}
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)
    logged = calls.read_text().splitlines() if calls.exists() else []
    evaluations = [c for c in logged if c.startswith("-T -C user=")]
    return parse_per_user(done.stdout.splitlines()), evaluations


def _per_user_shell(tmp_path: Path, config: str) -> list[str]:
    """What the per-user part prints for accounts root, gpuadmin and debian and ``config``."""
    path = tmp_path / "sshd_config"
    path.write_text(config)
    command = PER_USER_COMMAND.replace(CANDIDATES_COMMAND, 'users="debian gpuadmin root"').replace(
        SSHD_CONFIG, str(path)
    )
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout.splitlines()


def test_without_match_blocks_the_effective_settings_stand_for_every_account(
    tmp_path: Path,
) -> None:
    parsed, evaluations = _per_user_run(tmp_path, "PermitRootLogin no\n# Match User x\n")
    assert evaluations == []  # the fact's "effective" part has run sshd -T already
    assert set(parsed["users"]) == {"debian", "gpuadmin", "root"}
    assert parsed["address"] is None  # not looked up: no Match can use it
    shell = _per_user_shell(tmp_path, "PermitRootLogin no\n")
    parts: dict[str, PartOutput | list[str]] = {
        "effective": ["port 22", "passwordauthentication no"],
        "config_sha1": [], "rsa_bits": [], "weak_moduli": [], "socket": [],
        "per_user": shell, "accounts": [],
    }  # fmt: skip
    state = SshdState().process(framing.output_of(parts))
    settings = {"port": ["22"], "passwordauthentication": ["no"]}
    assert state["per_user"]["users"] == dict.fromkeys(("debian", "gpuadmin", "root"), settings)
    parts["effective"] = PartOutput("effective", ["/etc/ssh/sshd_config line 3: bad"], [], 255)
    failed = SshdState().process(framing.output_of(parts))
    assert failed["per_user"]["users"]["root"] == {"error": ["/etc/ssh/sshd_config line 3: bad"]}


def test_match_include_or_an_unreadable_config_evaluate_each_account(tmp_path: Path) -> None:
    for config in ("Match User gpuadmin\n  X11Forwarding yes\n", "  include /etc/x.conf\n",
                   "MATCH=all\n", None):  # fmt: skip
        (tmp_path / "calls").unlink(missing_ok=True)
        parsed, evaluations = _per_user_run(tmp_path, config)
        assert [call.split(",")[0] for call in evaluations] == [
            "-T -C user=debian", "-T -C user=gpuadmin", "-T -C user=root"
        ], config  # fmt: skip
        assert set(parsed["users"]) == {"debian", "gpuadmin", "root"}
        (tmp_path / "sshd_config").unlink(missing_ok=True)


def test_fact_reads_each_part_and_names_a_failed_sshd_t() -> None:
    parts: dict[str, PartOutput | list[str]] = {
        "effective": ["passwordauthentication no", "port 22"],
        "config_sha1": ["0123abcd"],
        "rsa_bits": ["4096"],
        "weak_moduli": ["0"],
        "socket": ["disabled"],
        "per_user": [],
        "accounts": [],
    }
    parsed = SshdState().process(framing.output_of(parts))
    assert parsed["effective"] == {"passwordauthentication": ["no"], "port": ["22"]}
    assert (parsed["config_sha1"], parsed["rsa_host_key_bits"]) == ("0123abcd", 4096)
    assert parsed["socket_enabled"] is False and parsed["effective_error"] == ""
    parts["effective"] = PartOutput("effective", ["/etc/ssh/sshd_config line 3: bad"], [], 255)
    failed = SshdState().process(framing.output_of(parts))
    assert failed["effective"] == {}
    assert failed["effective_error"] == "/etc/ssh/sshd_config line 3: bad"
    assert failed["rsa_host_key_bits"] == 4096  # the other parts are still read
    cut = SshdState().process(framing.output_of({"effective": parts["effective"]}, complete=False))
    assert cut["config_sha1"] is None and cut["effective"] == {}


def _in(root: Path, command: str) -> str:
    """A backup or restore command of the role, pointed at ``root`` instead of the node."""
    return (
        command.replace("/var/lib/gpunode/sshd-previous", str(root / "backup"))
        .replace("/etc/ssh", str(root / "ssh"))
        .replace("systemctl restart ssh.service", "true")
    )


def test_restore_puts_back_the_previous_host_key_or_removes_the_one_the_run_made(
    tmp_path: Path,
) -> None:
    ssh = tmp_path / "ssh"
    ssh.mkdir()
    (ssh / "sshd_config").write_text("previous\n")
    (ssh / "moduli").write_text("all\n")
    key = ssh / "ssh_host_rsa_key"
    for had_key in (True, False):
        if had_key:
            key.write_text("old key\n")
            key.with_suffix(".pub").write_text("old key pub\n")
        else:
            key.unlink()
            key.with_suffix(".pub").unlink()
        backup = _in(tmp_path, sshd_role._backup_command())
        subprocess.run(["sh", "-c", backup], check=True)
        # What the run changes: the configuration, the moduli, a new 4096-bit key.
        (ssh / "sshd_config").write_text("new\n")
        (ssh / "moduli").write_text("strong only\n")
        key.write_text("new key\n")
        key.with_suffix(".pub").write_text("new key pub\n")
        restore = _in(tmp_path, sshd_role._restore_command())
        assert subprocess.run(["sh", "-c", restore]).returncode == 0
        assert (ssh / "sshd_config").read_text() == "previous\n"
        assert (ssh / "moduli").read_text() == "all\n"
        if had_key:
            assert key.read_text() == "old key\n"
            assert key.with_suffix(".pub").read_text() == "old key pub\n"
        else:
            # The backup of the earlier round is not taken for this one's.
            assert not key.exists() and not key.with_suffix(".pub").exists()


class _Answer:
    def __init__(self, lines: list[str]) -> None:
        self.stdout_lines = lines


class _Host:
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.commands: list[str] = []

    def run_shell_command(self, command: str, _sudo: bool) -> tuple[bool, _Answer]:
        self.commands.append(command)
        return True, _Answer(self.lines)


def test_a_failed_sshd_is_named_with_its_errors_and_a_running_one_is_not() -> None:
    failed = _Host(
        [
            "ssh.service is failed",
            "error: Bind to port 22 on 192.0.2.1 failed: Cannot assign requested address.",
            "fatal: Cannot bind any address.",
        ]
    )
    assert sshd_role._sshd_state(failed) == (
        "; sshd did not come back (ssh.service is failed: error: Bind to port 22 on 192.0.2.1 "
        "failed: Cannot assign requested address.; fatal: Cannot bind any address.)"
    )
    assert failed.commands == [sshd_role.SSHD_STATE_COMMAND]
    assert sshd_role._sshd_state(_Host([])) == ""

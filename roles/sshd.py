"""The SSH server, hardened so that its *effective* configuration holds, without lock-outs.

gpunode writes the whole of /etc/ssh/sshd_config and it includes nothing: the drop-in
directory /etc/ssh/sshd_config.d is not read. A drop-in cannot be trusted to only "add
settings": sshd keeps the first value it reads for a keyword, but a ``Match`` block in a
drop-in (``Match all``, ``Match User``, ``Match Address``) overrides everything before it for
the connections it matches. Files there (cloud-init's 50-cloud-init.conf, a planted one) are
left in place and have no effect; a setting a site needs belongs in the inventory.

Only members of gpunode's login group (``AllowGroups gpunode-login``) may log in: the declared
admins and the deploy user (see roles/admin_users.py). Keys are read from
``.ssh/authorized_keys`` only, the file gpunode manages (not the unmanaged authorized_keys2).
The file is rendered in gpunode/expected/sshd.py (the floor is dev-sec's ssh-baseline, the
crypto lists those of the ssh-audit policy of the node's release: "Hardened Debian 12
(version 3)" on bookworm, "Hardened Debian 13 (version 1)" on trixie).

Safety: a configuration that would leave the deploy user unable to log in is refused before
anything changes; before the new configuration is written the deploy user must be in the
login group; a new configuration is checked with ``sshd -t`` before it is used; after the
restart a *new* SSH login is made from the control side, and if it fails the previous
configuration (and host key, and moduli) is restored and the run fails loudly.
"""

from __future__ import annotations

import hashlib
import shlex
from typing import Any

from pyinfra import host
from pyinfra.api import FunctionCommand, OperationError, deploy, operation

from facts.accounts import LOGIN_GROUP
from facts.sshd import MIN_MODULUS_FIELD, MODULI, RSA_HOST_KEY, SSHD_CONFIG, SshdState
from gpunode.converge import this_node
from gpunode.expected.sshd import render_sshd_config
from gpunode.model import DesiredState
from gpunode.reach import fresh_login
from gpunode.refusal import NodeRefused
from roles.admin_users import deploy_user

RSA_HOST_KEY_BITS = 4096
BACKUP_DIR = "/var/lib/gpunode/sshd-previous"
CANDIDATE = f"{SSHD_CONFIG}.gpunode-candidate"


def lockout_risks(desired: DesiredState, login_user: str | None, password: bool) -> list[str]:
    """Why applying ``desired`` would leave nobody able to log in with a key and sudo."""
    risks = []
    if password:
        risks.append(
            "this deploy logs in with a password, and the hardened sshd accepts keys only; "
            "switch the inventory to ssh_key first"
        )
    if (login_user in (None, "root")) and desired.sshd.permit_root_login == "no":
        risks.append(
            "this deploy logs in as root and sshd.permit_root_login is 'no'; log in as an "
            "admin user with sudo (ssh_user + _sudo), or set permit_root_login: prohibit-password"
        )
    return risks


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


# The RSA host key's copy in the backup (absent where the node had no RSA host key).
BACKUP_KEY = f"{BACKUP_DIR}/{RSA_HOST_KEY.rsplit('/', 1)[1]}"


def _backup_command() -> str:
    """The configuration, moduli and RSA host key as they are, or the key's absence."""
    return (
        f"mkdir -p -m 0700 {BACKUP_DIR} && rm -f {BACKUP_KEY} {BACKUP_KEY}.pub && "
        f"cp -p {SSHD_CONFIG} {MODULI} {BACKUP_DIR}/ && "
        f"{{ [ ! -e {RSA_HOST_KEY} ] || cp -p {RSA_HOST_KEY} {RSA_HOST_KEY}.pub {BACKUP_DIR}/; }}"
    )


# Back to socket activation, where the run took sshd from ssh.socket (Ubuntu 22.10 and later):
# sshd of ssh.service stopped (KillMode=process: the sessions it started stay, this run's
# included), then the socket listens again and starts ssh.service at the next connection.
RESTORE_SOCKET = (
    "systemctl stop ssh.service && systemctl unmask ssh.socket && "
    "systemctl enable --now ssh.socket && systemctl disable ssh.service"
)


# sshd takes a new configuration by a restart, never a reload. A reload is SIGHUP, which
# systemctl sends and returns from at once: the old sshd goes on accepting connections until it
# gets round to re-executing itself, so a confirming login made in that moment reached the old
# configuration and proved nothing (a loaded Ubuntu 24.04 node took a configuration that
# listened on 127.0.0.1 only, "confirmed", and then refused every login). ssh.service is
# Type=notify on Debian 12 and 13 and Ubuntu 24.04: a restart returns once the new sshd listens;
# KillMode=process: the sessions the old one started, this run's included, stay.
START_SSHD = "systemctl restart ssh.service"


def _restore_command(socket_activated: bool = False) -> str:
    """Back to the backup: a host key made by this run goes again where there was none, and
    sshd is started as it was (by ssh.socket where ``socket_activated``)."""
    start = RESTORE_SOCKET if socket_activated else START_SSHD
    return (
        f"cp -p {BACKUP_DIR}/sshd_config {SSHD_CONFIG} && cp -p {BACKUP_DIR}/moduli {MODULI}; "
        f"if [ -e {BACKUP_KEY} ]; then cp -p {BACKUP_KEY} {BACKUP_KEY}.pub /etc/ssh/; "
        f"else rm -f {RSA_HOST_KEY} {RSA_HOST_KEY}.pub; fi; "
        f"{start}"
    )


# What sshd said when it did not come back, if it did not: ssh.service's state and its last
# error lines (the journal of the last five minutes; a reload is seconds ago).
SSHD_STATE_COMMAND = (
    'state=$(systemctl is-active ssh.service); [ "$state" = active ] || { '
    'echo "ssh.service is $state"; journalctl -u ssh.service --since -5min -o cat '
    "--no-pager 2>/dev/null | grep -E '^(error|fatal):' | tail -n 2; }"
)


def _sshd_state(host: Any) -> str:
    """``; sshd did not come back (ssh.service is failed: <its errors>)``, or nothing."""
    answered, output = host.run_shell_command(SSHD_STATE_COMMAND, _sudo=True)
    lines = [line.strip() for line in output.stdout_lines if line.strip()] if answered else []
    if not lines:
        return ""
    said = f": {'; '.join(lines[1:])}" if lines[1:] else ""
    return f"; sshd did not come back ({lines[0]}{said})"


def _confirm_or_restore(state: Any, host: Any, port: int, socket_activated: bool = False) -> None:
    """Control side: a brand-new login must work, else the previous sshd comes back (from
    ssh.socket again where it was socket activated)."""
    error = fresh_login(host, port=port)
    if error is None:
        return
    sshd_state = _sshd_state(host)
    restored, _ = host.run_shell_command(_restore_command(socket_activated), _sudo=True)
    raise OperationError(
        f"{host.name}: the new sshd configuration was rolled back because {error}{sshd_state}; "
        + ("the previous configuration is active again" if restored else "RESTORE FAILED")
    )


def login_group_guard(login_user: str) -> str:
    """A command that fails, changing nothing, unless ``login_user`` may log in under
    ``AllowGroups``: it must already be in the login group when the new sshd starts."""
    user = shlex.quote(login_user)
    message = shlex.quote(
        f"sshd hardening refused, nothing changed: the deploy user {login_user} is not in "
        f"{LOGIN_GROUP}, and AllowGroups {LOGIN_GROUP} would lock it out"
    )
    return (
        f"id -Gn -- {user} | tr ' ' '\\n' | grep -qx {LOGIN_GROUP} || "
        f"{{ echo {message} >&2; exit 1; }}"
    )


@operation()
def hardened_sshd(config: str, port: int = 22, login_user: str | None = None):
    """sshd runs ``config`` with a 4096-bit RSA host key, no moduli below 3072 bits and
    ssh.service (not socket activation); every change is proven by a new SSH login.

    + config: the whole sshd_config
    + port: the port the new login is made to
    + login_user: the deploy user; it must be in the login group before anything changes
    """
    current = host.get_fact(SshdState)
    changes: list[str] = []
    if current["socket_enabled"]:
        # Socket activation ignores Port/ListenAddress from sshd_config.
        changes.append("systemctl disable --now ssh.socket && systemctl mask ssh.socket")
    if current["rsa_host_key_bits"] != RSA_HOST_KEY_BITS:
        changes.append(
            f"rm -f {RSA_HOST_KEY} {RSA_HOST_KEY}.pub && "
            f"ssh-keygen -q -t rsa -b {RSA_HOST_KEY_BITS} -N '' -f {RSA_HOST_KEY}"
        )
    if current["weak_moduli"]:
        changes.append(
            f"awk '/^#/ || $5 >= {MIN_MODULUS_FIELD}' {MODULI} > {MODULI}.gpunode "
            f"&& mv {MODULI}.gpunode {MODULI}"
        )
    if current["config_sha1"] != hashlib.sha1(config.encode()).hexdigest():
        changes.append("sshd_config")
    if not changes:
        host.noop("sshd already hardened and effective")
        return
    if login_user is not None:
        yield login_group_guard(login_user)
    yield _backup_command()
    yield f"printf '%s' {_shell_quote(config)} > {CANDIDATE} && chmod 0600 {CANDIDATE}"
    yield f"/usr/sbin/sshd -t -f {CANDIDATE} || {{ rm -f {CANDIDATE}; exit 1; }}"
    yield from (change for change in changes if change != "sshd_config")
    yield f"mv {CANDIDATE} {SSHD_CONFIG}"
    # A new sshd that cannot start (an address the node lacks) fails the confirming login
    # next, which restores the previous one: the restart's own failure must not end the
    # operation before that.
    yield f"systemctl enable ssh.service && {{ {START_SSHD} || true; }}"
    yield FunctionCommand(_confirm_or_restore, (port, bool(current["socket_enabled"])), {})


@deploy("SSH server")
def sshd(desired: DesiredState) -> None:
    risks = lockout_risks(
        desired,
        login_user=host.data.get("ssh_user"),
        password=bool(host.data.get("ssh_password")),
    )
    if risks:
        raise NodeRefused(f"{host.name}: sshd hardening refused: " + "; ".join(risks))
    hardened_sshd(
        name="Hardened sshd (validated, confirmed by a new login)",
        config=render_sshd_config(desired.sshd, this_node()[0]),
        port=desired.sshd.port,
        login_user=deploy_user(host.data),
    )

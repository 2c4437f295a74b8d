"""nftables firewall in gpunode's own table, applied so that it cannot lock the operator out.

Only ``table inet gpunode`` is ever written or deleted: Docker's, Kubernetes' and CNI's
tables stay, and Debian's /etc/nftables.conf (which starts with ``flush ruleset``) is not
used. The table holds one chain, input (policy drop, allow-rules from data); forward and
output are not filtered, so container networking keeps working.

A changed ruleset is applied behind two guards:

1. Preflight: the node tells where the control machine's SSH session comes from
   (``$SSH_CLIENT``); a ruleset that would not accept that address on that port is refused
   before anything changes.
2. Rollback: before the new table is loaded, a systemd timer on the node is armed to load
   the previous table (or remove ours, if there was none) after ``rollback_after_s``
   seconds. Only a brand-new SSH login from the control side disarms it; only then does the
   new ruleset become the persistent one loaded at boot. The preflight cannot see NAT,
   port forwards or a bastion's own firewall; this guard covers whatever it misses.

Data: firewall.rollback_after_s (default 60 s) and firewall.ssh_preflight (guard 1), validated
with the rest of the inventory; nothing else switches a guard off.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shlex
import time
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import OperationError, deploy, operation
from pyinfra.api.command import FileUploadCommand, FunctionCommand
from pyinfra.facts.files import Sha1File
from pyinfra.operations import apt, files, systemd

from facts.firewall import (
    ROLLBACK_UNIT,
    RULESET_PATH,
    STATE_DIR,
    TABLE,
    UNIT_NAME,
    UNIT_PATH,
    FirewallState,
    SshClient,
    UfwActive,
)
from gpunode.expected.firewall import AllowRule, allow_rules, render_ruleset, service_rules
from gpunode.model import DesiredState, Firewall
from gpunode.reach import fresh_login

CANDIDATE_PATH = f"{STATE_DIR}/firewall.candidate.nft"
PREVIOUS_PATH = f"{STATE_DIR}/firewall.previous.nft"
APPLIED_LISTING_PATH = f"{STATE_DIR}/firewall.applied.list"
NFT = "/usr/sbin/nft"

DEFAULT_ROLLBACK_AFTER_S = 60
MIN_ROLLBACK_AFTER_S = 5
# How long past the rollback's due time access may take to come back before we give up.
ROLLBACK_GRACE_S = 30

UNIT = f"""\
# Managed by gpunode: loads table {TABLE} from {RULESET_PATH} at boot.
# Debian's nftables.service is not used: its /etc/nftables.conf starts with `flush ruleset`,
# which would wipe Docker's and Kubernetes' tables. Ordered after it in case it is enabled.
[Unit]
Description=gpunode firewall (nftables table {TABLE})
Documentation=man:nft(8)
DefaultDependencies=no
Wants=network-pre.target
Before=network-pre.target shutdown.target
After=nftables.service
Conflicts=shutdown.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={NFT} -f {RULESET_PATH}
ExecReload={NFT} -f {RULESET_PATH}

[Install]
WantedBy=sysinit.target
"""


# --- guard 1: preflight ----------------------------------------------------------------------


def ssh_cut_reason(
    firewall: Firewall, ssh_port: int, client: dict | None, exporter_ports: tuple[int, ...] = ()
) -> str | None:
    """Why the ruleset would cut the current SSH session's source off, or None if it would not.

    ``client`` is the SshClient fact; None (not an SSH connection) cannot be judged here.
    """
    if client is None:
        return None
    address = ipaddress.ip_address(client["address"])
    port = client["server_port"]
    if address.is_loopback:
        return None
    rules = allow_rules(firewall, ssh_port, exporter_ports)
    if any(rule.admits(address, port) for rule in rules):
        return None
    return (
        f"the control machine reaches this node from {address} to TCP port {port} ($SSH_CLIENT "
        f"on the node), which the new ruleset would drop: firewall.admin_networks = "
        f"{list(firewall.admin_networks)}, sshd.port = {ssh_port}. Applying it would cut SSH "
        "off. Add the control machine's network to "
        "firewall.admin_networks (or fabric_networks)"
    )


def refuse_if_ufw_active() -> None:
    """An active ufw loads its own rules (and again at boot) beside gpunode's table: two
    firewalls deciding one packet is no declared state, so gpunode refuses rather than fight
    it, and the operator chooses."""
    active = host.get_fact(UfwActive)
    if isinstance(active, str):
        raise OperationError(
            f"{host.name}: firewall refused: whether ufw filters on the node could not be read "
            f"(`ufw status` answered: {active}); run the deploy with sudo, or check "
            "`sudo ufw status` on the node"
        )
    if active:
        raise OperationError(
            f"{host.name}: firewall refused: ufw is active on the node, and gpunode's firewall "
            f"(table {TABLE}) would filter beside its rules; run `ufw disable` on the node "
            "(its rules stay in /etc/ufw), or set firewall.enabled to false to keep ufw"
        )


def refuse_if_ssh_would_be_cut(
    firewall: Firewall, ssh_port: int, exporter_ports: tuple[int, ...] = ()
) -> None:
    client = host.get_fact(SshClient, _sudo=False)
    reason = ssh_cut_reason(firewall, ssh_port, client, exporter_ports)
    if reason:
        raise OperationError(f"{host.name}: firewall refused: {reason}")


# --- guard 2: rollback -----------------------------------------------------------------------


def _arm_rollback_command(rollback_after_s: int) -> str:
    """Save the live table (or its absence) and schedule loading it back on the node."""
    timer = f"{ROLLBACK_UNIT}.timer"
    return (
        f"if systemctl is-active --quiet {timer}; then echo 'a firewall rollback is already "
        "armed: an earlier run was interrupted before it confirmed SSH access; rerun once it "
        f"has fired' >&2; exit 1; fi; "
        f"systemctl reset-failed {ROLLBACK_UNIT}.service >/dev/null 2>&1; "
        f"{{ printf 'table {TABLE} {{}}\\ndelete table {TABLE}\\n' && "
        f"if nft list tables | grep -qx 'table {TABLE}'; then nft -s list table {TABLE}; fi; }}"
        f" > {PREVIOUS_PATH} && nft -c -f {PREVIOUS_PATH} && "
        f"systemd-run --quiet --unit={ROLLBACK_UNIT} --on-active={rollback_after_s}s "
        f"--timer-property=AccuracySec=100ms {NFT} -f {PREVIOUS_PATH}"
    )


def _disarm_rollback_command() -> str:
    """Stop the timer; fail if it fired first (the listing is no longer what was applied)."""
    return (
        f"systemctl stop {ROLLBACK_UNIT}.timer && "
        f"nft -s list table {TABLE} | cmp -s - {APPLIED_LISTING_PATH} || "
        "{ echo 'the firewall rollback fired before it could be disarmed (SSH confirmation "
        "took longer than the rollback delay): the previous ruleset is live; rerun' >&2; "
        "exit 1; }"
    )


def _login_timeout(rollback_after_s: int) -> float:
    return max(2.0, min(15.0, rollback_after_s / 3))


def confirm_ssh_access(rollback_after_s: int) -> None:
    """Control side, right after the new table went live: prove a new SSH login works.

    On failure the armed rollback is left to fire; once a new login works again the
    operation fails, naming the host. The persistent ruleset was never replaced.
    """
    applied_at = time.monotonic()
    failure = fresh_login(host, timeout=_login_timeout(rollback_after_s))
    if failure is None:
        return
    # The timer was armed before the apply, so by this time it has fired.
    due = applied_at + rollback_after_s
    deadline = due + ROLLBACK_GRACE_S
    time.sleep(max(0.0, due - time.monotonic()))
    restored = fresh_login(host, timeout=3.0)
    while restored is not None and time.monotonic() < deadline:
        time.sleep(1.0)
        restored = fresh_login(host, timeout=3.0)
    if restored is not None:
        raise OperationError(
            f"{host.name}: the new firewall ruleset cut SSH off ({failure}), and access did "
            f"not come back within {rollback_after_s + ROLLBACK_GRACE_S} s although a "
            f"rollback was armed ({restored}). Use the console: `nft -f {PREVIOUS_PATH}` "
            "loads the previous ruleset"
        )
    raise OperationError(
        f"{host.name}: the new firewall ruleset would have cut SSH off ({failure}); the "
        f"previous ruleset was restored by the armed rollback and a new SSH login works "
        f"again ({time.monotonic() - applied_at:.1f} s after the apply). {RULESET_PATH} was "
        f"not replaced; the refused ruleset is in {CANDIDATE_PATH}"
    )


# --- operations ------------------------------------------------------------------------------


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@operation()
def ruleset(
    firewall: Firewall,
    ssh_port: int,
    rollback_after_s: int = DEFAULT_ROLLBACK_AFTER_S,
    check_ssh_source: bool = True,
    exporter_ports: tuple[int, ...] = (),
    services: tuple[AllowRule, ...] = (),
    forward_networks: tuple[str, ...] = (),
):
    """Table inet gpunode is live as rendered from ``firewall``, and loaded at boot from
    /etc/gpunode/firewall.nft. Applied when the file differs or the live table has drifted
    from what the file loads; every apply is confirmed by a new SSH login or rolled back.

    + firewall: the declared firewall (``DesiredState.firewall``) the ruleset is rendered from
    + ssh_port: sshd's port (``sshd.port``), accepted from ``firewall.admin_networks``
    + rollback_after_s: seconds after which the armed rollback loads the previous table back,
      unless a new SSH login confirmed access first (guard 2)
    + check_ssh_source: whether a ruleset that would drop the current SSH session's source is
      refused before anything changes (guard 1, ``firewall.ssh_preflight``)
    + exporter_ports: the ports of the exporters gpunode runs (``DesiredState.exporter_ports``),
      opened to ``firewall.monitoring_networks`` only
    + services: allow-rules of the servers gpunode runs here (``service_rules``: Prometheus'
      port on the monitoring host)
    + forward_networks: where forwarded traffic may go (``DesiredState.forward_networks``:
      a Kubernetes worker's pod and service networks); () adds no forward chain
    """
    content = render_ruleset(firewall, ssh_port, exporter_ports, services, forward_networks)
    if check_ssh_source:
        refuse_if_ssh_would_be_cut(firewall, ssh_port, exporter_ports)
    current = host.get_fact(FirewallState)
    if current["file_load_error"]:
        # Without a scratch namespace drift cannot be judged; applying again is the safe side.
        logger.warning(
            f"{host.name}: cannot load {RULESET_PATH} in a scratch network namespace to "
            f"compare it with the live table ({current['file_load_error']}); applying it"
        )
    if (
        current["file_sha256"] == _sha256(content)
        and current["live"] is not None
        and current["live"] == current["file_loads"]
    ):
        host.noop(f"table {TABLE} is live exactly as {RULESET_PATH} loads it")
        return
    if current["rollback_armed"]:
        raise OperationError(
            f"{host.name}: a firewall rollback is armed ({ROLLBACK_UNIT}.timer): an earlier "
            "run was interrupted before it confirmed SSH access. Rerun once it has fired"
        )
    yield f"mkdir -p {os.path.dirname(RULESET_PATH)} {STATE_DIR}"
    yield FileUploadCommand(StringIO(content), CANDIDATE_PATH)
    yield f"nft -c -f {CANDIDATE_PATH}"
    yield _arm_rollback_command(rollback_after_s)
    yield f"nft -f {CANDIDATE_PATH} && nft -s list table {TABLE} > {APPLIED_LISTING_PATH}"
    yield FunctionCommand(confirm_ssh_access, (rollback_after_s,), {})
    yield _disarm_rollback_command()
    # Only a confirmed ruleset becomes the one loaded at boot (mv within /etc/gpunode is atomic).
    yield (
        f"cp {CANDIDATE_PATH} {RULESET_PATH}.new && mv -f {RULESET_PATH}.new {RULESET_PATH} && "
        f"rm -f {CANDIDATE_PATH}"
    )


@operation()
def absent():
    """No table inet gpunode, no persisted ruleset, no boot unit, no rollback state.

    Removing the table only opens the node, so no guard is needed.
    """
    current = host.get_fact(FirewallState)
    if current["rollback_armed"]:
        # A pending rollback would load the table again.
        yield f"systemctl stop {ROLLBACK_UNIT}.timer"
    if current["unit_file"] or current["unit_enabled"]:
        # The unit has no ExecStop (stopping it never opens the node), so --now is harmless.
        yield f"systemctl disable --now {UNIT_NAME}"
        yield f"rm -f {UNIT_PATH}"
        yield "systemctl daemon-reload"
    if current["file_sha256"] is not None:
        yield f"rm -f {RULESET_PATH}"
    if current["live"] is not None:
        yield f"nft delete table {TABLE}"
    if current["state_files"]:
        yield "rm -f " + " ".join(shlex.quote(path) for path in sorted(current["state_files"]))
    if not (
        current["rollback_armed"]
        or current["unit_file"]
        or current["unit_enabled"]
        or current["file_sha256"]
        or current["live"] is not None
        or current["state_files"]
    ):
        host.noop(f"table {TABLE} absent and not persisted")


# --- the role --------------------------------------------------------------------------------


@deploy("Firewall")
def firewall(
    desired: DesiredState,
    rollback_after_s: int | None = None,
    check_ssh_source: bool | None = None,
) -> None:
    """nftables per ``desired.firewall``; removed entirely when firewall.enabled is false.

    ``rollback_after_s`` defaults to firewall.rollback_after_s, ``check_ssh_source`` to
    firewall.ssh_preflight.
    """
    wanted = desired.firewall
    if not wanted.enabled:
        absent(name=f"No table {TABLE} (firewall.enabled is false)")
        return
    if rollback_after_s is None:
        rollback_after_s = wanted.rollback_after_s
    if check_ssh_source is None:
        check_ssh_source = wanted.ssh_preflight
    ssh_port = desired.sshd.port
    exporter_ports = desired.exporter_ports
    # At prepare time, so that nothing on the node changes.
    refuse_if_ufw_active()
    # At prepare time, so a ruleset that would cut SSH stops the run before any change.
    if check_ssh_source:
        refuse_if_ssh_would_be_cut(wanted, ssh_port, exporter_ports)

    nft_installed = host.get_fact(FirewallState)["nft"]
    apt.packages(
        name="nftables",
        packages=["nftables"],
        update=not nft_installed,
        cache_time=86400,
    )
    unit_sha1 = hashlib.sha1(UNIT.encode()).hexdigest()
    unit_changed = host.get_fact(Sha1File, path=UNIT_PATH) != unit_sha1
    files.put(
        name=f"Boot unit {UNIT_NAME} (loads {RULESET_PATH}, never `flush ruleset`)",
        src=StringIO(UNIT),
        dest=UNIT_PATH,
        mode="644",
    )
    ruleset(
        name=f"Table {TABLE}: default-drop input, allow-rules from data (SSH-confirmed)",
        firewall=wanted,
        ssh_port=ssh_port,
        rollback_after_s=rollback_after_s,
        check_ssh_source=check_ssh_source,
        exporter_ports=exporter_ports,
        services=service_rules(desired),
        forward_networks=desired.forward_networks,
    )
    systemd.service(
        name=f"{UNIT_NAME} enabled",
        service=UNIT_NAME,
        enabled=True,
        running=True,
        daemon_reload=unit_changed,
    )

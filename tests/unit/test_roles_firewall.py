"""Firewall role: ruleset rendering, the apply decision, the SSH preflight and the guarded
apply sequence (facts in, commands out), and the control-side confirmation callback."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from pyinfra.api import OperationError
from pyinfra.api.command import FileUploadCommand, FunctionCommand

import roles.firewall as role
from facts.firewall import (
    NOTHING,
    FirewallState,
    SshClient,
    parse_firewall_state,
    parse_ssh_client,
)
from gpunode import framing
from gpunode.expected.firewall import render_ruleset, service_rules
from gpunode.framing import PartOutput
from gpunode.model import Firewall, FirewallRule, build_desired_state
from roles.firewall import absent, ruleset, ssh_cut_reason

from .fakehost import fake_host

CONTROL = {"address": "10.213.4.1", "server_port": 22}
LIVE = "table inet gpunode {\n\tchain input {\n\t}\n}\n"


def firewall(**settings: Any) -> Firewall:
    defaults: dict[str, Any] = {"enabled": True, "admin_networks": ("10.213.4.0/24",)}
    return Firewall(**(defaults | settings))


def state(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "nft": True,
        "file_sha256": None,
        "unit_file": False,
        "unit_enabled": False,
        "rollback_armed": False,
        "state_files": [],
        "live": None,
        "file_loads": None,
        "file_load_error": None,
    }
    return base | overrides


def converged_state(wanted: Firewall, ssh_port: int = 22, **overrides: Any) -> dict[str, Any]:
    content = render_ruleset(wanted, ssh_port)
    digest = hashlib.sha256(content.encode()).hexdigest()
    return state(**({"file_sha256": digest, "live": LIVE, "file_loads": LIVE} | overrides))


def run(operation: Any, facts: dict[type, Any], **kwargs: Any) -> tuple[list[Any], list[str]]:
    """(the commands an operation yields, unstringified, and its no-op notes)."""
    with fake_host(facts) as host:
        commands = list(operation._inner(**kwargs))
    return commands, host.noops


# --- rendering ---------------------------------------------------------------------------------


def test_ipv4_and_ipv6_networks_go_into_their_own_sets_and_rules() -> None:
    text = render_ruleset(firewall(admin_networks=("10.0.0.0/8", "fd00::/8")), 22)
    assert "set admin_ipv4 {\n\t\ttype ipv4_addr\n\t\tflags interval\n" in text
    assert "elements = { 10.0.0.0/8 }" in text
    assert "set admin_ipv6 {\n\t\ttype ipv6_addr\n\t\tflags interval\n" in text
    assert "elements = { fd00::/8 }" in text
    assert "ip saddr @admin_ipv4 tcp dport 22 accept" in text
    assert "ip6 saddr @admin_ipv6 tcp dport 22 accept" in text


def test_a_family_without_networks_gets_no_set_and_no_rule() -> None:
    text = render_ruleset(firewall(admin_networks=("fd00::/8",)), 22)
    assert "admin_ipv4" not in text
    assert "ip6 saddr @admin_ipv6 tcp dport 22 accept" in text


def test_ssh_rule_follows_sshd_port() -> None:
    text = render_ruleset(firewall(), 2222)
    assert "ip saddr @admin_ipv4 tcp dport 2222 accept" in text
    assert "dport 22 " not in text


def test_overlapping_networks_are_merged_so_the_set_never_conflicts() -> None:
    text = render_ruleset(firewall(admin_networks=("10.1.0.0/16", "10.0.0.0/8", "10.9.9.9/32")), 22)
    assert "elements = { 10.0.0.0/8 }" in text


def test_monitoring_fabric_and_extra_rules() -> None:
    text = render_ruleset(
        firewall(
            monitoring_networks=("192.168.0.0/24",),
            metrics_ports=(9400, 9100),
            fabric_networks=("172.16.0.0/12", "fd01::/16"),
            extra_rules=(
                FirewallRule(name="nfs", ports=(2049,), protocol="udp", sources=("10.9.0.0/16",)),
                FirewallRule(name="web", ports=(443, 80), sources=("fd02::/16",)),
            ),
        ),
        22,
    )
    assert (
        "ip saddr @monitoring_ipv4 tcp dport { 9100, 9400 } accept "
        'comment "metrics from firewall.monitoring_networks"' in text
    )
    assert 'ip saddr @fabric_ipv4 accept comment "everything from' in text
    assert 'ip6 saddr @fabric_ipv6 accept comment "everything from' in text
    assert 'ip saddr @extra_0_ipv4 udp dport 2049 accept comment "firewall.extra_rules nfs"' in text
    assert (
        'ip6 saddr @extra_1_ipv6 tcp dport { 80, 443 } accept comment "firewall.extra_rules web"'
        in text
    )
    assert "extra_1_ipv4" not in text


def test_the_exporters_ports_open_to_the_monitoring_networks_only() -> None:
    wanted = firewall(monitoring_networks=("192.168.0.0/24",), metrics_ports=(9200,))
    text = render_ruleset(wanted, 22, exporter_ports=(9100, 9400))
    assert (
        "ip saddr @monitoring_ipv4 tcp dport { 9100, 9200, 9400 } accept "
        'comment "metrics from firewall.monitoring_networks"' in text
    )
    assert text.count("9100") == 1
    # No monitoring network: an exporter's port stays closed.
    assert "9100" not in render_ruleset(firewall(), 22, exporter_ports=(9100,))


def test_the_monitoring_hosts_prometheus_port_opens_to_its_client_networks_only() -> None:
    base = {
        "firewall": {"enabled": True, "admin_networks": ["10.1.0.0/16"]},
        "tls": {"enabled": True},
        "prometheus": {"enabled": True, "port": 9091, "web_password_file": "/etc/prometheus.pw"},
    }
    state, problems = build_desired_state(base)
    assert problems == []
    # Without prometheus.client_networks: the admin networks.
    text = render_ruleset(state.firewall, 22, state.exporter_ports, service_rules(state))
    assert "elements = { 10.1.0.0/16 }" in text
    assert (
        'ip saddr @prometheus_ipv4 tcp dport 9091 accept comment "Prometheus from '
        'prometheus.client_networks (firewall.admin_networks)"'
    ) in text
    narrowed = {**base, "prometheus": {**base["prometheus"], "client_networks": ["fd00::/64"]}}
    state, problems = build_desired_state(narrowed)
    assert problems == []
    text = render_ruleset(state.firewall, 22, state.exporter_ports, service_rules(state))
    assert "ip6 saddr @prometheus_ipv6 tcp dport 9091 accept" in text
    assert "@prometheus_ipv4" not in text
    # No Prometheus here: no rule, whatever the networks say.
    off = {**narrowed, "prometheus": {"enabled": False, "client_networks": ["fd00::/64"]}}
    state, _ = build_desired_state(off)
    assert service_rules(state) == () and "9091" not in render_ruleset(state.firewall, 22)


def test_prometheus_client_networks_are_validated() -> None:
    _, problems = build_desired_state(
        {"tls": {"enabled": True},
         "prometheus": {"enabled": True, "client_networks": ["10.0.0.0/33"],
                        "web_password_file": "/etc/prometheus.pw"}}
    )  # fmt: skip
    assert [problem.key for problem in problems] == ["prometheus.client_networks[0]"]


def test_monitoring_networks_without_metrics_ports_open_nothing() -> None:
    text = render_ruleset(firewall(monitoring_networks=("192.168.0.0/24",), metrics_ports=()), 22)
    assert "monitoring" not in text


def test_input_is_default_drop_with_the_essentials_and_nothing_else_is_filtered() -> None:
    text = render_ruleset(firewall(admin_networks=()), 22)
    assert "type filter hook input priority filter; policy drop;" in text
    for essential in (
        "ct state established,related accept",
        "ct state invalid drop",
        'iif "lo" accept',
        "icmp type echo-request limit rate",
        "icmpv6 type echo-request limit rate",
        "nd-neighbor-solicit",
        "nd-router-advert",
        "packet-too-big",
    ):
        assert essential in text
    assert "hook forward" not in text
    assert "hook output" not in text
    assert "saddr @" not in text, "no networks in data: nothing but the essentials"


def test_file_replaces_only_gpunode_table_in_one_transaction() -> None:
    text = render_ruleset(firewall(), 22)
    assert "flush" not in text
    body = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert body[:3] == [
        "table inet gpunode {}",
        "delete table inet gpunode",
        "table inet gpunode {",
    ]
    assert [line for line in body if line.startswith("table")] == [
        "table inet gpunode {}",
        "table inet gpunode {",
    ]


def test_rendering_is_deterministic_whatever_the_order_of_the_data() -> None:
    one = firewall(admin_networks=("10.2.0.0/16", "fd00::/8", "10.1.0.0/16"))
    two = firewall(admin_networks=("fd00::/8", "10.1.0.0/16", "10.2.0.0/16"))
    assert render_ruleset(one, 22) == render_ruleset(two, 22)


# --- decision ---------------------------------------------------------------------------------


def test_noop_when_live_table_is_what_the_unchanged_file_loads() -> None:
    wanted = firewall()
    commands, noops = run(
        ruleset,
        {FirewallState: converged_state(wanted), SshClient: CONTROL},
        firewall=wanted,
        ssh_port=22,
    )
    assert commands == []
    assert noops == ["table inet gpunode is live exactly as /etc/gpunode/firewall.nft loads it"]


def test_drifted_live_table_is_applied_again() -> None:
    wanted = firewall()
    drifted = converged_state(wanted, live=LIVE.replace("\t}", "\t\tiif lo accept\n\t}"))
    commands, noops = run(
        ruleset, {FirewallState: drifted, SshClient: CONTROL}, firewall=wanted, ssh_port=22
    )
    assert commands
    assert noops == []


@pytest.mark.parametrize(
    "current",
    [
        state(),  # first run: nothing there
        state(file_sha256="0" * 64, live=LIVE, file_loads=LIVE),  # the data changed
        state(file_sha256=None, live=LIVE),  # someone else's table of that name, no file
    ],
    ids=["absent", "file-differs", "no-file"],
)
def test_apply_when_file_differs_or_is_missing(current: dict[str, Any]) -> None:
    commands, _ = run(
        ruleset, {FirewallState: current, SshClient: CONTROL}, firewall=firewall(), ssh_port=22
    )
    assert commands


def test_table_deleted_by_hand_is_applied_again() -> None:
    wanted = firewall()
    commands, _ = run(
        ruleset,
        {FirewallState: converged_state(wanted, live=None), SshClient: CONTROL},
        firewall=wanted,
        ssh_port=22,
    )
    assert commands


def test_armed_rollback_from_an_interrupted_run_stops_the_apply() -> None:
    with pytest.raises(OperationError, match="rollback is armed"):
        run(
            ruleset,
            {FirewallState: state(rollback_armed=True), SshClient: CONTROL},
            firewall=firewall(),
            ssh_port=22,
        )


# --- the guarded apply sequence ---------------------------------------------------------------


def describe(command: Any) -> str:
    if isinstance(command, FileUploadCommand):
        return f"upload {command.dest}"
    if isinstance(command, FunctionCommand):
        return f"call {command.function.__name__}{command.args}"
    return str(command)


def test_check_arm_apply_confirm_disarm_persist_in_that_order() -> None:
    wanted = firewall()
    commands, _ = run(
        ruleset,
        {FirewallState: state(), SshClient: CONTROL},
        firewall=wanted,
        ssh_port=22,
        rollback_after_s=15,
    )
    steps = [describe(command) for command in commands]
    assert steps[0] == "mkdir -p /etc/gpunode /var/lib/gpunode"
    assert steps[1] == "upload /var/lib/gpunode/firewall.candidate.nft"
    assert steps[2] == "nft -c -f /var/lib/gpunode/firewall.candidate.nft"
    arm = steps[3]
    # The previous table (or its absence) is saved so that loading it also removes the new one.
    assert (
        "{ printf 'table inet gpunode {}\\ndelete table inet gpunode\\n' && "
        "if nft list tables | grep -qx 'table inet gpunode'; then "
        "nft -s list table inet gpunode; fi; } > /var/lib/gpunode/firewall.previous.nft" in arm
    )
    assert arm.endswith(
        "systemd-run --quiet --unit=gpunode-firewall-rollback --on-active=15s "
        "--timer-property=AccuracySec=100ms /usr/sbin/nft -f /var/lib/gpunode/firewall.previous.nft"
    )
    assert steps[4] == (
        "nft -f /var/lib/gpunode/firewall.candidate.nft && "
        "nft -s list table inet gpunode > /var/lib/gpunode/firewall.applied.list"
    )
    assert steps[5] == "call confirm_ssh_access(15,)"
    assert steps[6].startswith("systemctl stop gpunode-firewall-rollback.timer && ")
    assert "cmp -s - /var/lib/gpunode/firewall.applied.list" in steps[6]
    assert steps[7] == (
        "cp /var/lib/gpunode/firewall.candidate.nft /etc/gpunode/firewall.nft.new && "
        "mv -f /etc/gpunode/firewall.nft.new /etc/gpunode/firewall.nft && "
        "rm -f /var/lib/gpunode/firewall.candidate.nft"
    )
    assert len(steps) == 8
    assert commands[1].src.read() == render_ruleset(wanted, 22)
    # The persistent file is written once, last, after the confirmation.
    assert [s for s in steps if "/etc/gpunode/firewall.nft " in s + " "] == [steps[7]]


# --- guard 1: preflight -----------------------------------------------------------------------


def test_refused_before_any_command_when_admin_networks_exclude_the_control_address() -> None:
    with pytest.raises(OperationError) as refused:
        run(
            ruleset,
            {FirewallState: state(), SshClient: CONTROL},
            firewall=firewall(admin_networks=("192.168.0.0/16",)),
            ssh_port=22,
        )
    message = str(refused.value)
    assert message.startswith("node-1: firewall refused: ")
    assert "from 10.213.4.1 to TCP port 22" in message
    assert "Applying it would cut SSH off. Add the control machine's network" in message
    # "Nothing was changed." is added once, where the refusal fails the node (gpunode.refusal).
    assert "nothing was changed" not in message.lower()


def test_refused_when_ssh_moves_to_a_port_the_session_does_not_use() -> None:
    reason = ssh_cut_reason(firewall(), 2222, CONTROL)
    assert reason is not None
    assert "sshd.port = 2222" in reason


@pytest.mark.parametrize(
    ("settings", "client"),
    [
        ({}, CONTROL),
        ({"admin_networks": (), "fabric_networks": ("10.213.0.0/16",)}, CONTROL),
        (
            {
                "admin_networks": (),
                "extra_rules": (FirewallRule(ports=(22,), sources=("10.213.4.1/32",)),),
            },
            CONTROL,
        ),
        ({"admin_networks": ("fd00::/8",)}, {"address": "fd00::7", "server_port": 22}),
        ({"admin_networks": ()}, {"address": "127.0.0.1", "server_port": 22}),
        ({"admin_networks": ()}, None),  # not an SSH session: left to the rollback guard
    ],
    ids=["admin", "fabric", "extra-rule", "ipv6", "loopback", "unknown"],
)
def test_allowed_sources_pass_the_preflight(settings: dict[str, Any], client: Any) -> None:
    assert ssh_cut_reason(firewall(**settings), 22, client) is None


def test_udp_extra_rule_does_not_count_as_ssh_access() -> None:
    settings = firewall(
        admin_networks=(),
        extra_rules=(FirewallRule(ports=(22,), protocol="udp", sources=("10.0.0.0/8",)),),
    )
    assert ssh_cut_reason(settings, 22, CONTROL) is not None


def test_preflight_can_be_skipped_explicitly_leaving_the_rollback_guard() -> None:
    commands, _ = run(
        ruleset,
        {FirewallState: state(), SshClient: CONTROL},
        firewall=firewall(admin_networks=("192.168.0.0/16",)),
        ssh_port=22,
        check_ssh_source=False,
    )
    assert "call confirm_ssh_access(60,)" in [describe(command) for command in commands]


# --- guard 2: the control-side confirmation -------------------------------------------------


class Clock:
    """time.monotonic and time.sleep for the callback, without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def confirm(monkeypatch: pytest.MonkeyPatch, logins: list[str | None]) -> Clock:
    """Run confirm_ssh_access with fresh_login answering ``logins`` in turn (the last one
    repeats); each login takes one second."""
    clock = Clock()
    answers = iter(logins)
    last: list[str | None] = [None]

    def fresh_login(host: Any, port: int | None = None, timeout: float = 15.0) -> str | None:
        clock.now += 1
        last[0] = next(answers, last[0])
        return last[0]

    monkeypatch.setattr(role, "fresh_login", fresh_login)
    monkeypatch.setattr(role.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(role.time, "sleep", clock.sleep)
    with fake_host({}):
        role.confirm_ssh_access(20)
    return clock


def test_confirmed_login_returns_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = confirm(monkeypatch, [None])
    assert clock.now == 1001.0


def test_failed_login_waits_for_the_rollback_and_fails_loudly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(OperationError) as failed:
        confirm(monkeypatch, ["timed out", "timed out", None])
    message = str(failed.value)
    assert message.startswith("node-1: the new firewall ruleset would have cut SSH off (timed out)")
    assert "the previous ruleset was restored" in message
    assert "/etc/gpunode/firewall.nft was not replaced" in message


def test_access_that_never_comes_back_is_reported_with_the_way_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(OperationError) as failed:
        confirm(monkeypatch, ["timed out"])
    message = str(failed.value)
    assert "did not come back within 50 s" in message
    assert "nft -f /var/lib/gpunode/firewall.previous.nft" in message


# --- disabled ---------------------------------------------------------------------------------


def test_disabled_and_already_absent_is_a_noop() -> None:
    commands, noops = run(absent, {FirewallState: state(nft=False)})
    assert commands == []
    assert noops == ["table inet gpunode absent and not persisted"]


def test_disabled_removes_table_file_unit_and_rollback_state() -> None:
    current = state(
        file_sha256="a" * 64,
        unit_file=True,
        unit_enabled=True,
        rollback_armed=True,
        live=LIVE,
        state_files=["/var/lib/gpunode/firewall.previous.nft", "/var/lib/gpunode/firewall.a b"],
    )
    commands, _ = run(absent, {FirewallState: current})
    assert commands == [
        "systemctl stop gpunode-firewall-rollback.timer",
        "systemctl disable --now gpunode-firewall.service",
        "rm -f /etc/systemd/system/gpunode-firewall.service",
        "systemctl daemon-reload",
        "rm -f /etc/gpunode/firewall.nft",
        "nft delete table inet gpunode",
        "rm -f '/var/lib/gpunode/firewall.a b' /var/lib/gpunode/firewall.previous.nft",
    ]


def test_disabled_with_only_leftover_rollback_state_removes_it() -> None:
    current = state(state_files=["/var/lib/gpunode/firewall.candidate.nft"])
    commands, noops = run(absent, {FirewallState: current})
    assert commands == ["rm -f /var/lib/gpunode/firewall.candidate.nft"]
    assert noops == []


# --- facts ------------------------------------------------------------------------------------


def test_firewall_state_fact_parses_live_and_file_listings() -> None:
    table = ["table inet gpunode {", "\tchain input {", "\t}", "}"]
    output = framing.output_of(
        {
            "state": [
                "file_sha256=abc",
                "unit_file=present",
                "unit_enabled=enabled",
                "state_file=/var/lib/gpunode/firewall.previous.nft",
            ],
            "live": table,
            "file_loads": table,
        }
    )
    parsed = parse_firewall_state(output)
    assert parsed["nft"] is True
    assert parsed["file_sha256"] == "abc"
    assert parsed["unit_file"] is True
    assert parsed["unit_enabled"] is True
    assert parsed["rollback_armed"] is False
    assert parsed["state_files"] == ["/var/lib/gpunode/firewall.previous.nft"]
    assert parsed["live"] == "table inet gpunode {\n\tchain input {\n\t}\n}\n"
    assert parsed["live"] == parsed["file_loads"]


def test_firewall_state_fact_on_a_bare_node() -> None:
    parsed = parse_firewall_state(
        framing.output_of(
            {
                "state": ["unit_enabled="],
                "live": PartOutput("live", absent=True),
                "file_loads": PartOutput("file_loads", absent=True),
            }
        )
    )
    assert parsed == state(nft=False)


def test_no_table_and_no_file_are_no_listings() -> None:
    nothing = {"live": PartOutput("live", exit_status=NOTHING)}
    nothing["file_loads"] = PartOutput("file_loads", exit_status=NOTHING)
    parsed = parse_firewall_state(framing.output_of({"state": [], **nothing}))
    assert parsed == state(nft=True)


def test_file_that_does_not_load_is_reported_not_compared() -> None:
    parsed = parse_firewall_state(
        framing.output_of(
            {
                "state": ["file_sha256=abc"],
                "live": PartOutput("live", exit_status=NOTHING),
                "file_loads": PartOutput(
                    "file_loads", ["/etc/gpunode/firewall.nft:3:1-5: Error: syntax error"], [], 1
                ),
            }
        )
    )
    assert parsed["file_loads"] is None
    assert parsed["file_load_error"] == "/etc/gpunode/firewall.nft:3:1-5: Error: syntax error"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("10.213.4.1 51234 22", {"address": "10.213.4.1", "server_port": 22}),
        ("::ffff:10.0.0.5 51234 2222", {"address": "10.0.0.5", "server_port": 2222}),
        ("fe80::1%eth0 51234 22", {"address": "fe80::1", "server_port": 22}),
        ("", None),
        ("garbage here too", None),
    ],
)
def test_ssh_client_parsing(line: str, expected: Any) -> None:
    assert parse_ssh_client(line) == expected


def test_file_that_cannot_be_compared_is_applied_again() -> None:
    wanted = firewall()
    current = converged_state(
        wanted, file_loads=None, file_load_error="unshare: Operation not permitted"
    )
    commands, noops = run(
        ruleset, {FirewallState: current, SshClient: CONTROL}, firewall=wanted, ssh_port=22
    )
    assert commands
    assert noops == []


def test_an_active_ufw_is_refused_naming_ufw_disable_and_an_inactive_one_is_not() -> None:
    from facts.firewall import UfwActive, parse_ufw_status
    from roles.firewall import refuse_if_ufw_active

    # `ufw status` as ufw 0.36 prints it, first line (inactive: a single line).
    assert parse_ufw_status(["Status: active", "", "To   Action  From"]) is True
    assert parse_ufw_status(["Status: inactive"]) is False
    assert parse_ufw_status([]) is False  # no ufw installed: the fact prints nothing
    # An answer that is neither: unknown, refused below rather than taken as inactive.
    assert parse_ufw_status(["ERROR: You need to be root to run this script"]) == (
        "ERROR: You need to be root to run this script"
    )
    with (
        fake_host({UfwActive: "ERROR: You need to be root to run this script"}),
        pytest.raises(OperationError, match=r"could not be read.*need to be root"),
    ):
        refuse_if_ufw_active()
    with fake_host({UfwActive: True}), pytest.raises(OperationError, match="`ufw disable`"):
        refuse_if_ufw_active()
    with fake_host({UfwActive: False}):
        refuse_if_ufw_active()

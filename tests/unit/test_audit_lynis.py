"""auditd and lynis (audit.auditd, audit.lynis, audit.tools): the rule file, the kernel
check's answer, lynis's report parser on a real report, the drift rules and the renderers."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from facts.auditd import parse_auditd, parse_support
from facts.lynis import parse_home_modes, parse_lynis, parse_report
from gpunode import framing
from gpunode.drift.findings import Severity
from gpunode.drift.rules import auditd_rules, lynis_rules
from gpunode.expected import auditd as expected_auditd
from gpunode.expected import lynis as expected_lynis
from gpunode.model import AuditTools, DesiredState, build_desired_state
from roles.auditd import missing_watches

REPORT = (
    Path(__file__).resolve().parents[1] / "fixtures" / "lynis" / "lab-bookworm-harden.report.dat"
)
NOW = datetime.datetime(2026, 12, 2, 12, 0, tzinfo=datetime.UTC)
REFUSED = "refused EPERM Operation not permitted"


def state(**audit: Any) -> DesiredState:
    desired, problems = build_desired_state({"audit": audit})
    assert problems == []
    return desired


# --- auditd ---------------------------------------------------------------------------------


def test_the_rules_watch_accounts_sudoers_sshd_and_gpunode_with_keys() -> None:
    lines = expected_auditd.render_rules().splitlines()
    assert lines[0].startswith("# Managed by gpunode")
    watched = {line.split()[1]: line.split()[-1] for line in lines[1:]}
    for path in ("/etc/passwd", "/etc/shadow", "/etc/group", "/etc/gshadow"):
        assert watched[path] == "gpunode-identity"
    assert watched["/etc/sudoers"] == watched["/etc/sudoers.d"] == "gpunode-sudoers"
    assert watched["/etc/ssh/sshd_config"] == watched["/etc/ssh/sshd_config.d"] == "gpunode-sshd"
    assert watched["/etc/gpunode"] == "gpunode-own"
    assert all(line.split()[2:4] == ["-p", "wa"] for line in lines[1:])
    # What auditctl -l prints for them reads back as the same watches.
    assert [expected_auditd.loaded_watch(line) for line in lines[1:]] == list(
        expected_auditd.WATCHES
    )


def test_the_kernel_check_reads_allowed_refused_and_the_command_line() -> None:
    assert parse_support(["allowed"], "quiet") == (True, "")
    allows, why = parse_support([REFUSED], "quiet")
    assert allows is False and "EPERM: Operation not permitted" in why and "container" in why
    assert parse_support(["allowed"], "ro audit=0 quiet") == (
        False, "audit=0 on the kernel command line",
    )  # fmt: skip
    assert parse_support(["refused EPERM \x1b[31mhostile"], "")[1].endswith(
        "(EPERM: (unreadable message)): a container, which shares its host's kernel, "
        "or a kernel without audit"
    )
    assert parse_support(["what?"], "")[0] is None
    assert parse_support([], "")[0] is None


def _auditd_output(support: list[str], active: str, rules: list[str] | None) -> list[str]:
    return framing.output_of(
        {
            "support": support,
            "cmdline": ["quiet"],
            "active": framing.PartOutput("active", [active], [], 0 if active == "active" else 3),
            "rules": rules if rules is not None else framing.PartOutput("rules", absent=True),
        }
    )


def test_the_fact_on_a_container_says_why_and_that_nothing_is_installed() -> None:
    fact = parse_auditd(_auditd_output([REFUSED], "inactive", None))
    assert fact["state"] == "ok" and fact["kernel_allows"] is False
    assert fact["installed"] is False and fact["active"] is False and fact["watches"] == []


def test_the_fact_reads_loaded_watches_and_names_its_own_unreadable_rules() -> None:
    rules = [*expected_auditd.render_rules().splitlines()[1:], "-a always,exit -F arch=b64 -S x",
             "-w /etc/\x1bbad -p wa -k gpunode-own"]  # fmt: skip
    fact = parse_auditd(_auditd_output(["allowed"], "active", rules))
    assert fact["active"] is True and fact["unit_state"] == "active"
    assert [(w["path"], w["key"]) for w in fact["watches"]] == list(expected_auditd.WATCHES)
    # A site's own rule is its business; a gpunode rule gpunode cannot read is named.
    assert len(fact["problems"]) == 1 and "gpunode-own" in fact["problems"][0]
    assert missing_watches(fact) == []
    assert missing_watches({"watches": fact["watches"][1:]}) == ["/etc/passwd gpunode-identity"]


def test_output_cut_short_is_unreadable() -> None:
    assert parse_auditd(["garbage"])["state"] == "unreadable"


def _auditd_findings(facts: dict[str, Any], desired: DesiredState | None = None) -> list:
    return [(f[0], f[1]) for f in auditd_rules(desired or state(), {"auditd": facts})]


def test_drift_reports_a_container_s_skip_as_info_with_the_reason() -> None:
    fact = parse_auditd(_auditd_output([REFUSED], "inactive", None))
    found = list(auditd_rules(state(), {"auditd": fact}))
    assert [(f[0], f[1]) for f in found] == [("audit.auditd.skipped", Severity.INFO)]
    assert "EPERM" in found[0][3]


def test_drift_on_a_real_kernel_wants_auditd_running_with_every_watch() -> None:
    rules = expected_auditd.render_rules().splitlines()[1:]
    running = parse_auditd(_auditd_output(["allowed"], "active", rules))
    assert _auditd_findings(running) == []
    stopped = parse_auditd(_auditd_output(["allowed"], "failed", rules))
    assert _auditd_findings(stopped) == [("audit.auditd", Severity.WARNING)]
    not_installed = parse_auditd(_auditd_output(["allowed"], "inactive", None))
    assert _auditd_findings(not_installed) == [("audit.auditd", Severity.WARNING)]
    partial = parse_auditd(_auditd_output(["allowed"], "active", rules[2:]))
    found = list(auditd_rules(state(), {"auditd": partial}))
    assert [(f[0], f[1]) for f in found] == [("audit.auditd.rules", Severity.WARNING)]
    assert found[0][3].startswith("2 not loaded: /etc/passwd (gpunode-identity)")
    # Turned off: no opinion.
    assert _auditd_findings(stopped, state(auditd={"enabled": False})) == []


# --- lynis ------------------------------------------------------------------------------------


def test_the_parser_reads_a_real_report_and_names_what_it_cannot() -> None:
    parsed = parse_report(REPORT.read_text())
    report = parsed["report"]
    assert report["hardening_index"] == 74
    assert report["report_end"] == "2026-12-02 01:18:04"
    assert report["lynis_version"] == "3.0.8"
    assert [item["test"] for item in report["warnings"]] == ["PKGS-7392"]
    assert len(report["suggestions"]) == 27
    assert {"NETW-3200", "LYNIS", "ACCT-9628"} <= {i["test"] for i in report["suggestions"]}
    assert parsed["problems"] == []


def test_hostile_report_lines_are_named_cut_and_cleaned() -> None:
    text = (
        "hardening_index=999\n"
        "report_datetime_end=yesterday\n"
        "warning[]=rm -rf /|x|-|-|\n"
        "suggestion[]=SSH-7408|\x1b[31mred" + "x" * 500 + "|detail|-|\n"
        "not a report line\n"
    )
    parsed = parse_report(text)
    report = parsed["report"]
    assert report["hardening_index"] is None and report["report_end"] is None
    assert report["warnings"] == []
    (suggestion,) = report["suggestions"]
    assert suggestion["text"].startswith("?[31mred") and len(suggestion["text"]) == 200
    assert suggestion["detail"] == "detail"
    assert [p.split(":")[0] for p in parsed["problems"]] == [
        "hardening_index", "report_datetime_end", "warning[]", "line 5",
    ]  # fmt: skip


def _lynis_fact(text: str | None) -> dict[str, Any]:
    part: framing.PartOutput | list[str] = (
        text.splitlines() if text is not None else framing.PartOutput("report", [], [], 1)
    )
    return parse_lynis(framing.output_of({"report": part}))


def _lynis_findings(fact: dict[str, Any], **settings: Any) -> list[tuple[str, Severity]]:
    desired = state(lynis={"enabled": True, **settings})
    return [(f[0], f[1]) for f in lynis_rules(desired, {"lynis": fact}, now=NOW)]


def test_drift_holds_the_index_to_the_floor_and_the_report_to_its_age() -> None:
    fact = _lynis_fact(REPORT.read_text())
    assert fact["state"] == "ok"
    assert _lynis_findings(fact, min_hardening_index=74) == []
    low = list(lynis_rules(state(lynis={"enabled": True, "min_hardening_index": 80}),
                           {"lynis": fact}, now=NOW))  # fmt: skip
    assert [(f[0], f[1]) for f in low] == [("audit.lynis.index", Severity.WARNING)]
    assert low[0][3].startswith("hardening index 74; lynis tests with findings: ACCT-9628")
    old = NOW + datetime.timedelta(hours=60)
    late = lynis_rules(state(lynis={"enabled": True, "min_hardening_index": 50}),
                       {"lynis": fact}, now=old)  # fmt: skip
    assert [(f[0], f[1]) for f in late] == [("audit.lynis.overdue", Severity.WARNING)]
    assert _lynis_findings(_lynis_fact(None)) == [("audit.lynis.report", Severity.WARNING)]
    assert _lynis_fact(None)["state"] == "missing"
    assert _lynis_findings({"state": "absent", "reason": "lynis is not installed"}) == [
        ("audit.lynis.report", Severity.WARNING)
    ]
    # Off: no opinion.
    assert list(lynis_rules(state(), {"lynis": _lynis_fact(None)}, now=NOW)) == []


def test_the_drop_ins_keep_debian_s_units_with_the_schedule_and_oneshot() -> None:
    timer = expected_lynis.render_timer_drop_in("Sun *-*-* 04:30:00").splitlines()
    assert timer[1:5] == ["[Timer]", "OnCalendar=", "OnCalendar=Sun *-*-* 04:30:00",
                          "Persistent=true"]  # fmt: skip
    assert "Type=oneshot" in expected_lynis.render_service_drop_in().splitlines()


@pytest.mark.parametrize("schedule", ["daily; rm -rf /", "daily\nExecStart=/bin/sh", "%h", ""])
def test_a_schedule_that_is_not_a_calendar_expression_is_refused(schedule: str) -> None:
    _, problems = build_desired_state({"audit": {"lynis": {"schedule": schedule}}})
    assert [p.key for p in problems] == ["audit.lynis.schedule"]


def test_min_hardening_index_is_a_percentage() -> None:
    _, problems = build_desired_state({"audit": {"lynis": {"min_hardening_index": 101}}})
    assert [p.key for p in problems] == ["audit.lynis.min_hardening_index"]


# --- the audit tools --------------------------------------------------------------------------


def test_tool_packages_follow_the_switches() -> None:
    assert expected_lynis.tool_packages(AuditTools()) == [
        "acct", "sysstat", "debsums", "needrestart", "apt-listchanges", "libpam-tmpdir",
    ]  # fmt: skip
    off = AuditTools(
        process_accounting=False, sysstat=False, debsums=False, needrestart=False,
        apt_listchanges=False, pam_tmpdir=False, remote_syslog_host="logs.example",
    )  # fmt: skip
    assert expected_lynis.tool_packages(off) == ["rsyslog"]


def test_needrestart_only_lists() -> None:
    lines = expected_lynis.render_needrestart_conf().splitlines()
    assert "$nrconf{restart} = 'l';" in lines
    assert not [line for line in lines if "restart} = 'a'" in line]


def test_remote_syslog_goes_over_tcp_and_refuses_what_is_not_a_host() -> None:
    assert "*.* @@logs.dc1.example.net:6514" in expected_lynis.render_rsyslog_forward(
        "logs.dc1.example.net", 6514
    )
    for bad in ("logs:514", "logs example", "@@evil", "-logs"):
        _, problems = build_desired_state({"audit": {"tools": {"remote_syslog_host": bad}}})
        assert [p.key for p in problems] == ["audit.tools.remote_syslog_host"], bad


def test_home_modes_read_only_homes_and_loose_is_group_write_or_any_other_bit() -> None:
    modes = parse_home_modes(["755 /home/debian", "750 /home/gpuadmin", "700 /root",
                              "garbage", "777 /home/../etc"])  # fmt: skip
    assert modes == {"/home/debian": 0o755, "/home/gpuadmin": 0o750}
    assert expected_lynis.loose_home(0o755) and expected_lynis.loose_home(0o770)
    assert not expected_lynis.loose_home(0o750) and not expected_lynis.loose_home(0o700)

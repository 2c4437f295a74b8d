"""lynis as gpunode runs it on a node, and the audit tools lynis asks for.

Debian's lynis package ships lynis.service (``ExecStart=/usr/sbin/lynis audit system
--cronjob``, Type=simple) and lynis.timer (``OnCalendar=daily``, enabled on install); read
from lynis 3.0.8-1.1 on a Debian 12 test node 2026-12-02. gpunode keeps Debian's units and
adds drop-ins: the inventory's schedule, and Type=oneshot so a start returns once the report
is written. ``--cronjob``: "Perform automatic scan with cron safe options (no colors, no
questions, no breaks)" (lynis(8)). Each run rewrites /var/log/lynis-report.dat: ``key=value``
lines, ``warning[]=TEST-ID|text|...`` and ``suggestion[]=TEST-ID|text|detail|solution|``,
``hardening_index=N``, ``report_datetime_end=YYYY-MM-DD HH:MM:SS`` (the node's local time).
"""

from __future__ import annotations

from gpunode.model import AuditTools

REPORT = "/var/log/lynis-report.dat"
SERVICE_DROP_IN = "/etc/systemd/system/lynis.service.d/gpunode.conf"
TIMER_DROP_IN = "/etc/systemd/system/lynis.timer.d/gpunode.conf"

# needrestart.conf(5) keys, from the comments of Debian 12's /etc/needrestart/needrestart.conf
# (needrestart 3.6-4, read 2026-12-02): restart 'l' = list only; kernelhints -1 = print the
# kernel hint without the interactive prompt.
NEEDRESTART_CONF = "/etc/needrestart/conf.d/50-gpunode.conf"
# sysstat's /etc/default/sysstat: ENABLED="true" makes its timer collect (sysstat 12.6.1-1).
SYSSTAT_DEFAULTS = "/etc/default/sysstat"
# debsums' /etc/default/debsums: CRON_CHECK=never|daily|weekly|monthly (debsums 3.0.2.1);
# lynis PKGS-7370 looks for a debsums file under /etc/cron*.
DEBSUMS_DEFAULTS = "/etc/default/debsums"
RSYSLOG_FORWARD = "/etc/rsyslog.d/90-gpunode-remote.conf"


def render_service_drop_in() -> str:
    return "\n".join(
        [
            "# Managed by gpunode (audit.lynis).",
            "[Service]",
            # A start returns once the report is written (Debian's unit is Type=simple).
            "Type=oneshot",
            "IOSchedulingClass=idle",
            "",
        ]
    )


def render_timer_drop_in(schedule: str) -> str:
    return "\n".join(
        [
            "# Managed by gpunode (audit.lynis).",
            "[Timer]",
            # An empty OnCalendar= first clears Debian's "daily" (systemd.timer(5)).
            "OnCalendar=",
            f"OnCalendar={schedule}",
            "Persistent=true",
            "",
        ]
    )


def tool_packages(tools: AuditTools) -> list[str]:
    """Debian packages of the audit tools the inventory turns on."""
    chosen = [
        ("acct", tools.process_accounting),
        ("sysstat", tools.sysstat),
        ("debsums", tools.debsums),
        ("needrestart", tools.needrestart),
        ("apt-listchanges", tools.apt_listchanges),
        ("libpam-tmpdir", tools.pam_tmpdir),
        ("rsyslog", bool(tools.remote_syslog_host)),
    ]
    return [package for package, wanted in chosen if wanted]


def render_needrestart_conf() -> str:
    return "\n".join(
        [
            "# Managed by gpunode (wherever needrestart is installed; audit.tools.needrestart",
            "# installs it): list, never restart. A restart of nvidia-persistenced, slurmd or",
            "# the fabric manager kills the jobs running on the node; an operator drains it first.",
            "$nrconf{restart} = 'l';",
            "$nrconf{kernelhints} = -1;",
            "",
        ]
    )


def render_rsyslog_forward(host: str, port: int) -> str:
    """rsyslog's legacy forwarding selector: ``@@`` is TCP (rsyslog.conf(5))."""
    return "\n".join(
        [
            "# Managed by gpunode (audit.tools.remote_syslog_host).",
            f"*.* @@{host}:{port}",
            "",
        ]
    )


def loose_home(mode: int) -> bool:
    """Whether a home directory's mode lets its group write or others in (HOME-9304)."""
    return bool(mode & 0o027)

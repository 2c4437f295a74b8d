"""lynis audits on a schedule, and the audit tools lynis asks a server for.

lynis: Debian's package and its units, with gpunode's drop-ins (gpunode.expected.lynis): the
inventory's schedule, a oneshot service. The LynisReport fact reads its report for the drift
check. The tools (audit.tools): Debian packages and their switches, each a lynis item that
fits a GPU server; a tool turned off is not installed by gpunode (one installed earlier is
left, with its configuration).
"""

from __future__ import annotations

import shlex
from collections.abc import Generator
from io import StringIO

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.operations import files, systemd

from facts.freshness import UnitsNeedDaemonReload
from facts.lynis import LoginHomeModes, LynisReport
from gpunode.expected import lynis as expected
from gpunode.model import DesiredState
from roles.packages import install_packages

UNITS = ["lynis.service", "lynis.timer"]


@deploy("lynis")
def lynis(desired: DesiredState) -> None:
    settings = desired.audit.lynis
    if not settings.enabled:
        timer = files.file(name="No lynis timer drop-in", path=expected.TIMER_DROP_IN,
                           present=False)  # fmt: skip
        service = files.file(name="No lynis service drop-in", path=expected.SERVICE_DROP_IN,
                             present=False)  # fmt: skip
        systemd.daemon_reload(name="Reload systemd after removing lynis drop-ins",
                              _if=lambda: timer.did_change() or service.did_change())  # fmt: skip
        if host.get_fact(LynisReport)["state"] != "absent":
            # Installed earlier: Debian's own daily timer would go on auditing, unread.
            systemd.service(name="lynis.timer stopped and disabled", service="lynis.timer",
                            running=False, enabled=False)  # fmt: skip
        return
    # lynis alone: it recommends menu (desktop menus), of no use on a server.
    install_packages("lynis", ["lynis"], no_recommends=True)
    for drop_in in (expected.SERVICE_DROP_IN, expected.TIMER_DROP_IN):
        directory = drop_in.rsplit("/", 1)[0]
        files.directory(name=f"Directory {directory}", path=directory, mode="755")
    service = files.put(name="lynis.service drop-in (oneshot)",
                        src=StringIO(expected.render_service_drop_in()),
                        dest=expected.SERVICE_DROP_IN, mode="644")  # fmt: skip
    timer = files.put(name="lynis.timer drop-in (schedule)",
                      src=StringIO(expected.render_timer_drop_in(settings.schedule)),
                      dest=expected.TIMER_DROP_IN, mode="644")  # fmt: skip
    unloaded = host.get_fact(UnitsNeedDaemonReload, units=UNITS)
    systemd.daemon_reload(
        name="Reload systemd after a lynis drop-in change",
        _if=lambda: service.did_change() or timer.did_change() or unloaded,
    )
    systemd.service(name="lynis.timer enabled and running", service="lynis.timer",
                    running=True, enabled=True)  # fmt: skip


@operation()
def home_directories_private(modes: dict[str, int]) -> Generator[str, None, None]:
    """
    Take group write and others' access from the home directories that have them.

    + modes: home directory -> mode, of the accounts with a login shell (LoginHomeModes)
    """
    loose = sorted(home for home, mode in modes.items() if expected.loose_home(mode))
    if not loose:
        host.noop("no home directory is writable by its group or open to others")
        return
    for home in loose:
        yield f"chmod g-w,o-rwx -- {shlex.quote(home)}"


@deploy("Audit tools")
def audit_tools(desired: DesiredState) -> None:
    tools = desired.audit.tools
    packages = expected.tool_packages(tools)
    if packages:
        install_packages("Audit tools", packages, no_recommends=True)
    if tools.sysstat:
        files.line(name="sysstat collects", path=expected.SYSSTAT_DEFAULTS,
                   line="^ENABLED=.*", replace='ENABLED="true"')  # fmt: skip
        systemd.service(name="sysstat enabled and running", service="sysstat",
                        running=True, enabled=True)  # fmt: skip
    if tools.debsums:
        files.line(name="debsums checks weekly", path=expected.DEBSUMS_DEFAULTS,
                   line="^CRON_CHECK=.*", replace="CRON_CHECK=weekly")  # fmt: skip
    if tools.needrestart:
        files.put(name="needrestart lists, never restarts",
                  src=StringIO(expected.render_needrestart_conf()),
                  dest=expected.NEEDRESTART_CONF, mode="644")  # fmt: skip
    if tools.private_home_directories:
        # A declared admin's home made in this same run (after the fact was read) is taken
        # as open until a run reads its mode.
        modes = {f"/home/{user.name}": 0o777 for user in desired.admin_users}
        modes.update(host.get_fact(LoginHomeModes))
        home_directories_private(name="Home directories private", modes=modes)
    if tools.remote_syslog_host:
        forward = files.put(
            name="rsyslog forwards to the log host",
            src=StringIO(expected.render_rsyslog_forward(tools.remote_syslog_host,
                                                         tools.remote_syslog_port)),
            dest=expected.RSYSLOG_FORWARD, mode="644",
        )  # fmt: skip
        systemd.service(name="rsyslog enabled and running", service="rsyslog", running=True,
                        enabled=True)  # fmt: skip
        systemd.service(name="rsyslog restarted after a forwarding change", service="rsyslog",
                        restarted=True, _if=forward.did_change)  # fmt: skip
    else:
        files.file(name="No syslog forwarding", path=expected.RSYSLOG_FORWARD, present=False)

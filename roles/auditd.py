"""The Linux audit daemon: Debian's auditd with gpunode's watch rules (gpunode.expected.auditd).

Who changed the accounts, sudoers, sshd's configuration or gpunode's own files, and when:
``ausearch -k gpunode-identity`` (and the other keys) answers after the fact. The kernel is
asked first (the AuditdState fact): where it refuses audit, as it does for a container, the
role reports a skip with the reason and installs nothing (auditd would only fail there).
"""

from __future__ import annotations

from collections.abc import Generator
from io import StringIO

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.operations import files, server, systemd

from facts.auditd import AuditdState
from gpunode.expected import auditd as expected
from gpunode.model import DesiredState
from roles.packages import install_packages


@operation()
def auditd_skipped(reason: str) -> Generator[str, None, None]:
    """
    Report that auditd is not set up on this node, and why; changes nothing.

    + reason: why the kernel does not allow audit here (the AuditdState fact)
    """
    host.noop(f"auditd skipped: {reason}")
    yield from ()


def missing_watches(state: dict) -> list[str]:
    """gpunode's watches the kernel has not loaded, as ``path key``."""
    loaded = {(watch.get("path"), watch.get("key")) for watch in state.get("watches") or []}
    return [f"{path} {key}" for path, key in expected.WATCHES if (path, key) not in loaded]


@deploy("auditd")
def auditd(desired: DesiredState) -> None:
    state = host.get_fact(AuditdState)
    if not desired.audit.auditd.enabled:
        removed = files.file(name="No gpunode audit rules", path=expected.RULES_FILE,
                             present=False)  # fmt: skip
        if state.get("installed") and state.get("kernel_allows"):
            server.shell(name="Audit rules reloaded (augenrules --load)",
                         commands=["augenrules --load"], _if=removed.did_change)  # fmt: skip
        return
    if state.get("kernel_allows") is not True:
        reason = state.get("refused_because") or state.get("reason") or "unknown"
        auditd_skipped(name="auditd skipped where the kernel refuses audit", reason=reason)
        return
    install_packages("auditd", ["auditd"], no_recommends=True)
    rules = files.put(
        name="gpunode's audit rules",
        src=StringIO(expected.render_rules()),
        dest=expected.RULES_FILE,
        mode="640",
    )
    missing = missing_watches(state)
    server.shell(
        name="Audit rules loaded (augenrules --load)",
        commands=["augenrules --load"],
        _if=lambda: rules.did_change() or bool(missing),
    )
    systemd.service(
        name="auditd enabled and running", service=expected.SERVICE, running=True, enabled=True
    )

"""The hardening roles, in their order, shared by deploys/harden.py and deploys/gpu_node.py."""

from __future__ import annotations

from gpunode.model import DesiredState
from roles.admin_users import admin_users
from roles.auditd import auditd
from roles.firewall import firewall
from roles.kernel import kernel_hardening
from roles.lynis import audit_tools, lynis
from roles.sshd import sshd
from roles.tls import tls_certificate
from roles.unattended_upgrades import unattended_upgrades


def node_hardening(desired: DesiredState) -> None:
    """Admins, firewall, sshd, TLS, kernel and login settings, the audit tools, auditd and
    lynis; each change that could cut SSH is proven by a new login or undone."""
    admin_users(desired=desired)
    firewall(desired=desired)
    sshd(desired=desired)
    tls_certificate(desired=desired)
    # Before the kernel and login settings: the cron files its packages add get their modes.
    audit_tools(desired=desired)
    kernel_hardening(desired=desired)
    unattended_upgrades(desired=desired)
    auditd(desired=desired)
    # Last of these: its audit, when the timer runs it, sees the node as the others left it.
    lynis(desired=desired)

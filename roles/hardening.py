"""The hardening roles, in their order, shared by deploys/harden.py and deploys/gpu_node.py."""

from __future__ import annotations

from gpunode.model import DesiredState
from roles.admin_users import admin_users
from roles.firewall import firewall
from roles.kernel import kernel_hardening
from roles.sshd import sshd
from roles.tls import tls_certificate
from roles.unattended_upgrades import unattended_upgrades


def node_hardening(desired: DesiredState) -> None:
    """Admins, firewall, sshd, TLS, kernel and login settings; each change that could cut SSH
    is proven by a new login or undone."""
    admin_users(desired=desired)
    firewall(desired=desired)
    sshd(desired=desired)
    tls_certificate(desired=desired)
    kernel_hardening(desired=desired)
    unattended_upgrades(desired=desired)

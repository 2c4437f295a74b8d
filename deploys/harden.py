"""Harden a node and nothing else: admins, firewall, sshd, TLS, kernel and login settings.

    pyinfra inventories/prod.py deploys/harden.py

The same roles, in the same order, as in deploys/gpu_node.py; the whole inventory is
validated first, and each change that could cut SSH is proven by a new login or undone.
"""

import sys
from pathlib import Path

# Roles and facts live at the project root; pyinfra only adds the working directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpunode import factcache
from gpunode.inventory import desired_state
from roles.admin_users import admin_users
from roles.firewall import firewall
from roles.kernel import kernel_hardening
from roles.refusal import refusals_fail_this_node
from roles.run_lock import node_run_lock
from roles.sshd import sshd
from roles.tls import tls_certificate
from roles.unattended_upgrades import unattended_upgrades

factcache.install()
desired = desired_state()
node_run_lock()

# A node refused by a role fails alone, before anything changes on it.
with refusals_fail_this_node():
    admin_users(desired=desired)
    firewall(desired=desired)
    sshd(desired=desired)
    tls_certificate(desired=desired)
    kernel_hardening(desired=desired)
    unattended_upgrades(desired=desired)

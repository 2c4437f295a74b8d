"""Kernel, module and login hardening and unattended upgrades, on their own.

    pyinfra inventories/prod.py deploys/os_hardening.py

The whole inventory is validated before anything runs; one bad host stops every host.
"""

import sys
from pathlib import Path

# Roles and facts live at the project root; pyinfra only adds the working directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpunode import factcache
from gpunode.inventory import desired_state
from roles.kernel import kernel_hardening
from roles.refusal import refusals_fail_this_node
from roles.run_lock import node_run_lock
from roles.unattended_upgrades import unattended_upgrades

factcache.install()
desired = desired_state()
node_run_lock()

# A node refused by a role fails alone, before anything changes on it.
with refusals_fail_this_node():
    kernel_hardening(desired=desired)
    unattended_upgrades(desired=desired)

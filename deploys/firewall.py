"""Converge only the nftables firewall (gpunode's own table) to the desired state.

    pyinfra inventories/prod.py deploys/firewall.py

The whole inventory is validated before anything runs; one bad host stops every host. A
ruleset that would cut SSH is refused, or, if that cannot be seen beforehand, rolled back.
"""

import sys
from pathlib import Path

# Roles and facts live at the project root; pyinfra only adds the working directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpunode import factcache
from gpunode.inventory import desired_state
from roles.firewall import firewall
from roles.refusal import refusals_fail_this_node
from roles.run_lock import node_run_lock

factcache.install()
desired = desired_state()
node_run_lock()

# A node refused by a role fails alone, before anything changes on it.
with refusals_fail_this_node():
    firewall(desired=desired)

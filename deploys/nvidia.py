"""Converge the NVIDIA driver stack declared in the inventory: repositories, driver, Fabric
Manager.

    pyinfra inventories/prod.py deploys/nvidia.py

The whole inventory is validated before anything runs; one bad host stops every host.
"""

import sys
from pathlib import Path

# Roles and facts live at the project root; pyinfra only adds the working directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpunode import factcache
from gpunode.inventory import desired_state
from roles.fabric_manager import fabric_manager
from roles.nvidia_driver import nvidia_driver
from roles.nvidia_repos import nvidia_repositories
from roles.refusal import refusals_fail_this_node
from roles.run_lock import node_run_lock

factcache.install()
desired = desired_state()
node_run_lock()

# A node refused by a role fails alone, before anything changes on it.
with refusals_fail_this_node():
    nvidia_repositories(desired=desired)
    nvidia_driver(desired=desired)
    fabric_manager(desired=desired)

"""Converge the NVIDIA driver stack declared in the inventory: repositories, driver, Fabric
Manager.

    pyinfra inventories/prod.py deploys/nvidia.py

The whole inventory is validated before anything runs; one bad host stops every host.
"""

import sys
from pathlib import Path

# Roles and facts live at the project root; pyinfra only adds the working directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpunode.converge import converging
from roles.audit import file_integrity_takes_this_run
from roles.base import package_database
from roles.fabric_manager import fabric_manager
from roles.nvidia_driver import nvidia_driver
from roles.nvidia_repos import nvidia_repositories

with converging() as desired:
    # A driver change cut short (the node rebooted or lost power while dpkg worked) is
    # finished first: apt installs nothing until it is.
    package_database()
    nvidia_repositories(desired=desired)
    nvidia_driver(desired=desired)
    fabric_manager(desired=desired)
    # Last: this run's changes into the file integrity database (where it is on).
    file_integrity_takes_this_run(desired=desired)

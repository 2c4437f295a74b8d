"""Kernel, module and login hardening and unattended upgrades, on their own.

    pyinfra inventories/prod.py deploys/os_hardening.py

The whole inventory is validated before anything runs; one bad host stops every host.
"""

import sys
from pathlib import Path

# Roles and facts live at the project root; pyinfra only adds the working directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpunode.converge import converging
from roles.kernel import kernel_hardening
from roles.unattended_upgrades import unattended_upgrades

with converging() as desired:
    kernel_hardening(desired=desired)
    unattended_upgrades(desired=desired)

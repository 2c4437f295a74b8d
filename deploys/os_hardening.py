"""Kernel, module and login hardening and unattended upgrades, on their own.

    pyinfra inventories/prod.py deploys/os_hardening.py

The whole inventory is validated before anything runs; one bad host stops every host.
"""

import sys
from pathlib import Path

# Roles and facts live at the project root; pyinfra only adds the working directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpunode.converge import converging
from roles.audit import file_integrity_takes_this_run
from roles.kernel import kernel_hardening
from roles.unattended_upgrades import unattended_upgrades

with converging() as desired:
    kernel_hardening(desired=desired)
    unattended_upgrades(desired=desired)
    # Last: this run's changes into the file integrity database (where it is on).
    file_integrity_takes_this_run(desired=desired)

"""Converge only the nftables firewall (gpunode's own table) to the desired state.

    pyinfra inventories/prod.py deploys/firewall.py

The whole inventory is validated before anything runs; one bad host stops every host. A
ruleset that would cut SSH is refused, or, if that cannot be seen beforehand, rolled back.
"""

import sys
from pathlib import Path

# Roles and facts live at the project root; pyinfra only adds the working directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpunode.converge import converging
from roles.audit import file_integrity_takes_this_run
from roles.firewall import firewall

with converging() as desired:
    firewall(desired=desired)
    # Last: this run's changes into the file integrity database (where it is on).
    file_integrity_takes_this_run(desired=desired)

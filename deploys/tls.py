"""Issue and install each node's TLS certificate from the control machine's internal CA.

    pyinfra inventories/prod.py deploys/tls.py

The CA lives in GPUNODE_CA_DIR, else the inventory's tls.ca_directory, else
~/.local/share/gpunode/ca; its passphrase comes from GPUNODE_CA_PASSPHRASE,
GPUNODE_CA_PASSPHRASE_FILE or tls.ca_passphrase_file. Hosts with tls.enabled false are left
alone.
"""

import sys
from pathlib import Path

# Roles and facts live at the project root; pyinfra only adds the working directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpunode.converge import converging
from roles.audit import file_integrity_takes_this_run
from roles.tls import tls_certificate

with converging() as desired:
    tls_certificate(desired=desired)
    # Last: this run's changes into the file integrity database (where it is on).
    file_integrity_takes_this_run(desired=desired)

"""Issue and install each node's TLS certificate from the control machine's internal CA.

    pyinfra inventories/prod.py deploys/tls.py

The CA lives in GPUNODE_CA_DIR (default ~/.local/share/gpunode/ca); its passphrase comes from
GPUNODE_CA_PASSPHRASE or GPUNODE_CA_PASSPHRASE_FILE. Hosts with tls.enabled false are left
alone.
"""

import sys
from pathlib import Path

# Roles and facts live at the project root; pyinfra only adds the working directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpunode import factcache
from gpunode.inventory import desired_state
from roles.refusal import refusals_fail_this_node
from roles.run_lock import node_run_lock
from roles.tls import tls_certificate

factcache.install()
desired = desired_state()
node_run_lock()

# A node refused by a role fails alone, before anything changes on it.
with refusals_fail_this_node():
    tls_certificate(desired=desired)

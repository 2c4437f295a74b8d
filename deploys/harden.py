"""Harden a node and nothing else: admins, firewall, sshd, TLS, kernel and login settings.

    pyinfra inventories/prod.py deploys/harden.py

The same roles, in the same order, as in deploys/gpu_node.py; the whole inventory is
validated first, and each change that could cut SSH is proven by a new login or undone.
"""

import sys
from pathlib import Path

# Roles and facts live at the project root; pyinfra only adds the working directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpunode.converge import converging
from roles.audit import file_integrity
from roles.hardening import node_hardening
from roles.malware_scan import malware_scan

with converging() as desired:
    node_hardening(desired)
    malware_scan(desired=desired)
    # Last: AIDE's database built, or this run's changes taken into it (where it is on).
    file_integrity(desired=desired)

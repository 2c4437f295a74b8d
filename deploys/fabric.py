"""Converge the fabric and storage of a GPU node: NCCL settings, InfiniBand/RDMA, NVMe cache,
shared data (NFS and Lustre mounts).

    pyinfra inventories/prod.py deploys/fabric.py

Every refusal (an interface or HCA that NCCL is told to use but the node lacks, a cache drive
that holds data or is missing, a shared-data mount point that holds data or is taken) happens
while pyinfra prepares: that node fails with nothing changed on it, and the other nodes are
converged.
"""

import sys
from pathlib import Path

# Roles and facts live at the project root; pyinfra only adds the working directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpunode.converge import converging
from roles.audit import file_integrity_takes_this_run
from roles.infiniband import infiniband
from roles.nccl import nccl
from roles.nvme_cache import nvme_cache
from roles.shared_data import shared_data

with converging() as desired:
    nccl(desired=desired)
    infiniband(desired=desired)
    nvme_cache(desired=desired)
    # After the NVMe cache: an fsc mount follows the cachefilesd it runs there.
    shared_data(desired=desired)
    # Last: this run's changes into the file integrity database (where it is on).
    file_integrity_takes_this_run(desired=desired)

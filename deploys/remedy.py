"""Carry out a health remedy ``gpunode drift --remedy`` decided on, on one node.

    GPUNODE_REMEDY_GPUS=00000000:18:00.0 pyinfra -y inventories/prod.py deploys/remedy.py \
        --limit gpu-h100-01

Run by ``gpunode drift --remedy`` itself (gpunode/fleet/remedies.py), which sets the variable
for its own pyinfra process: no inventory can ask for a reset. Each GPU is checked against the
PCI bus-id pattern before anything reaches the node (roles/remedy.py: refused where a process
uses a GPU). Without the variable the deploy refuses and changes nothing.
"""

import os
import sys
from pathlib import Path

# Roles and facts live at the project root; pyinfra only adds the working directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyinfra.api import DeployError

from gpunode.converge import converging
from gpunode.fleet.remedies import GPU_BUS_ID, REMEDY_GPUS_VARIABLE
from roles.audit import file_integrity_takes_this_run
from roles.remedy import gpus_reset

gpus = [gpu for gpu in os.environ.get(REMEDY_GPUS_VARIABLE, "").split(",") if gpu]
malformed = [gpu for gpu in gpus if not GPU_BUS_ID.fullmatch(gpu)]
if not gpus or malformed:
    raise DeployError(
        f"{REMEDY_GPUS_VARIABLE} must name the GPUs to reset as PCI bus ids such as "
        f"00000000:18:00.0, comma-separated (gpunode drift --remedy sets it); got "
        f"{os.environ.get(REMEDY_GPUS_VARIABLE, '')[:200]!r}"
    )

with converging() as desired:
    gpus_reset(name=f"GPU reset of {', '.join(gpus)} (health remedy)", gpus=gpus)
    # Last, as in every deploy: this run into the file integrity database (where it is on).
    file_integrity_takes_this_run(desired=desired)

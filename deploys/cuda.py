"""Converge the NVIDIA user-space stack: CUDA toolkits, NVIDIA Container Toolkit, DCGM.

    pyinfra inventories/prod.py deploys/cuda.py

The driver is not touched (roles/nvidia_driver.py). With GPUNODE_GPU_CONTAINER_CHECK set (to a
CUDA image, or to 1 for the default image), the run ends by starting a container with the GPUs
requested through docker on every host that has docker and a real GPU, and reports why it
skipped the others. The check is opt-in because it changes nothing and would otherwise count as
a change on every run.
"""

import os
import sys
from pathlib import Path

# Roles and facts live at the project root; pyinfra only adds the working directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpunode.converge import converging
from roles.audit import file_integrity_takes_this_run
from roles.container_toolkit import DEFAULT_CHECK_IMAGE, container_toolkit, gpu_container_check
from roles.cuda import cuda_toolkits
from roles.dcgm import dcgm
from roles.nvidia_repos import nvidia_repositories

with converging() as desired:
    nvidia_repositories(desired=desired)
    cuda_toolkits(desired=desired)
    container_toolkit(desired=desired)
    dcgm(desired=desired)

    check_image = os.environ.get("GPUNODE_GPU_CONTAINER_CHECK", "")
    if check_image:
        gpu_container_check(
            desired=desired, image=DEFAULT_CHECK_IMAGE if check_image == "1" else check_image
        )
    # Last: this run's changes into the file integrity database (where it is on).
    file_integrity_takes_this_run(desired=desired)

"""Every host of every inventory here: the fleet's NVIDIA stack, pinned in this one place.

Production, the lab and the Vagrant boxes converge the same pins, so what the lab certifies is
what production runs. An inventory that tries the next stack first (staging) overrides these
keys in its own group data; pyinfra gives group data precedence over ``all``.
"""

# pyinfra runs this file (the group data of every inventory in this folder) before it connects
# to any host, whatever its working directory. config.py adds the post-quantum key exchange a
# hardened Debian 13 sshd insists on (gpunode/ssh_kex.py), but pyinfra reads config.py only
# from its working directory: started from elsewhere, it could not even log in to say what was
# missing. Added here too, a run from anywhere reaches the node, and the deploy then stops with
# one line naming --chdir (gpunode/converge.py). The imported name is not host data: pyinfra
# leaves out names a group data file imports.
from gpunode import ssh_kex

ssh_kex.install()


# R580: NVIDIA's long-term support branch (end of life June 2028; gpunode/nvidia_releases.py),
# the last of the branch-suffixed packaging era, compute-only (headless) install.
nvidia_driver = {
    "source": "nvidia",
    "branch": "580",
    "version": "580.105.08-1",
    "flavour": "open",
    "stack": "compute",
    "reboot": "if-needed",
}
# Held at exactly the driver's version (Fabric Manager refuses to start otherwise).
fabric_manager = {"version": "580.105.08-1"}
# CUDA 13.0 runs fully on 580 (its toolkit bundles 580.95.05); 12.8 stays for older builds.
cuda = {"versions": ["12.8", "13.0"], "default": "13.0"}
# 1.18 and later keep the CDI spec themselves (nvidia-cdi-refresh, /var/run/cdi/nvidia.yaml).
container_runtime = {"engines": ["docker"], "toolkit_version": "1.18.2-1"}
# DCGM 4 for CUDA 13 with the exporter release NVIDIA pairs with it (4.8.3 with DCGM 4.6.0).
dcgm = {"enabled": True, "version": "1:4.6.0-1", "exporter": True, "exporter_version": "4.8.3-1"}

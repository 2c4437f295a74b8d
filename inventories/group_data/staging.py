"""Every host of inventories/staging.py: the next driver pin is tried here first."""

ssh_user = "gpuadmin"
_sudo = True

firewall = {"enabled": True, "admin_networks": ["10.10.0.0/16"]}
# As production: node certificates, which DCGM's exporter (group_data/all.py) serves over.
tls = {"enabled": True, "renew_before_days": 30}

# The next branch: R595 (production branch, end of life March 2027), the first pin of the
# packaging era locked by nvidia-driver-pinning-<branch>.
nvidia_driver = {"source": "nvidia", "branch": "595", "version": "595.71.05-1", "flavour": "open"}
fabric_manager = {"version": "595.71.05-1"}
cuda = {"versions": ["12.8", "13.0"], "default": "13.0"}
container_runtime = {"engines": ["docker"], "toolkit_version": "1.20.1-1"}

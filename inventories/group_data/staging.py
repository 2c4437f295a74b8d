"""Every host of inventories/staging.py: the next driver pin is tried here first."""

ssh_user = "gpuadmin"
_sudo = True

firewall = {"enabled": True, "admin_networks": ["10.10.0.0/16"]}

nvidia_driver = {"source": "nvidia", "branch": "580", "version": "580.95.05-1", "flavour": "open"}
fabric_manager = {"version": "580.95.05-1"}
cuda = {"versions": ["12.8", "13.0"], "default": "12.8"}
container_runtime = {"engines": ["docker"]}

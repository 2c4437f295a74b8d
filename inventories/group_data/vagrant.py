"""Every host of inventories/vagrant.py: VMs without GPUs, for hardening and base roles only.

The fleet's NVIDIA stack (group_data/all.py) is not for them: no driver, toolkit or runtime.
"""

from typing import Any

nvidia_driver: dict[str, Any] = {"source": "none"}
fabric_manager: dict[str, Any] = {"mode": "never"}
cuda: dict[str, Any] = {"versions": []}
container_runtime: dict[str, Any] = {"engines": []}
dcgm: dict[str, Any] = {"enabled": False}

"""The GPU settings as they live on a node between runs: the boot unit that applies them again.

Used by ``roles.gpu_settings`` (which writes the unit) and by the drift rules (whose finding
names it when a GPU came back from a reboot without its MIG layout).
"""

from __future__ import annotations

BOOT_UNIT = "gpunode-gpu-settings.service"

"""Single-GPU PCIe nodes (A10G): the lab's and Vagrant's small profile."""

expected_hardware = {
    "gpu_model": "NVIDIA A10G",
    "gpu_count": 1,
    "nvswitch": False,
    "nvlink_links_per_gpu": 0,
    "ib_port_count": 0,
    "nvme_count": 1,
}

gpu_settings = {"persistence_mode": True}

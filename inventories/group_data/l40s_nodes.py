"""L40S PCIe inference nodes: no NVLink, no InfiniBand."""

expected_hardware = {
    "gpu_model": "NVIDIA L40S",
    "gpu_count": 4,
    "nvswitch": False,
    "nvlink_links_per_gpu": 0,
    "ib_port_count": 0,
    "nvme_count": 2,
}

gpu_settings = {"persistence_mode": True}

"""HGX H100 8-GPU nodes: NVSwitch fabric, 8 x 400 Gb/s InfiniBand, 8 NVMe drives."""

expected_hardware = {
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "gpu_count": 8,
    "nvswitch": True,
    "nvlink_links_per_gpu": 18,
    "ib_port_count": 8,
    "ib_rate_gbps": 400,
    "nvme_count": 8,
}

gpu_settings = {"persistence_mode": True, "ecc": True}

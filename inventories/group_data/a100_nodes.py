"""HGX A100 8-GPU nodes: NVSwitch fabric, 8 x 200 Gb/s InfiniBand (HDR)."""

expected_hardware = {
    "gpu_model": "NVIDIA A100-SXM4-80GB",
    "gpu_count": 8,
    "nvswitch": True,
    "nvlink_links_per_gpu": 12,
    "ib_port_count": 8,
    "ib_rate_gbps": 200,
    "nvme_count": 4,
}

gpu_settings = {"persistence_mode": True, "ecc": True}

"""Production fleet (example): HGX H100 and A100 training nodes, L40S inference nodes.

Group data lives in inventories/group_data/<group>.py; data for every host of this file
in inventories/group_data/prod.py.
"""

h100_nodes = [
    (f"gpu-h100-{index:02d}.dc1.example.net", {"ssh_hostname": f"10.20.1.{10 + index}"})
    for index in range(1, 5)
]

a100_nodes = [
    ("gpu-a100-01.dc1.example.net", {"ssh_hostname": "10.20.2.11"}),
    ("gpu-a100-02.dc1.example.net", {"ssh_hostname": "10.20.2.12"}),
]

l40s_nodes = [
    ("gpu-l40s-01.dc1.example.net", {"ssh_hostname": "10.20.3.11"}),
    ("gpu-l40s-02.dc1.example.net", {"ssh_hostname": "10.20.3.12"}),
]

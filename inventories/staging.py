"""Staging: one node of each production kind, converged before production is."""

h100_nodes = [("gpu-h100-stg-01.dc1.example.net", {"ssh_hostname": "10.30.1.11"})]
a100_nodes = [("gpu-a100-stg-01.dc1.example.net", {"ssh_hostname": "10.30.2.11"})]
l40s_nodes = [("gpu-l40s-stg-01.dc1.example.net", {"ssh_hostname": "10.30.3.11"})]

"""Every host of inventories/prod.py: who may log in, from where, and what runs there."""

ssh_user = "gpuadmin"
_sudo = True

admin_users = [
    {
        "name": "alice",
        "ssh_keys": [
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBmmC5c0MskzCLCOGiqga2hOzIWStr5uPr30UKQpetWS "
            "alice@ops.example"
        ],
    },
    {
        "name": "bob",
        "ssh_keys": [
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPQUZFlnFqnyKh8mjHvR7CC/2uUH0GpU0OUx4lvzQEVU "
            "bob@ops.example"
        ],
    },
]

sshd = {"permit_root_login": "no", "max_auth_tries": 2}

firewall = {
    "enabled": True,
    "admin_networks": ["10.10.0.0/16"],
    "monitoring_networks": ["10.10.50.0/24"],
    "fabric_networks": ["10.100.0.0/16"],
}

tls = {"enabled": True, "renew_before_days": 30}

# GPU health on every node: the probe's textfile, served by node_exporter over mutual TLS to
# the monitoring network only (firewall.monitoring_networks); alert rules in monitoring/.
gpu_metrics = {"enabled": True}
node_exporter = {"enabled": True}
# Files changed outside a gpunode run (no package explains them) are drift findings: AIDE
# over the system's programs and configuration, checked nightly.
# auditd's watches on accounts, sudoers, sshd and gpunode's files; lynis weekly (Sunday), its
# index floor what deploys/harden.py reaches on a real kernel less a margin; the audit tools
# (the model's defaults: all on) and a copy of the logs on the site's log host. Malware scans
# (ClamAV, report only) of the system's paths nightly after AIDE, with the signatures from the
# site's mirror of ClamAV's databases (made with ClamAV's cvdupdate).
audit = {
    "file_integrity": {"enabled": True, "schedule": "*-*-* 03:30:00"},
    "malware_scan": {
        "enabled": True,
        "schedule": "*-*-* 04:30:00",
        "signatures": {"private_mirror": "http://mirror.dc1.example.net/clamav"},
    },
    "auditd": {"enabled": True},
    "lynis": {
        "enabled": True,
        "schedule": "Sun *-*-* 05:30:00",
        "max_age_hours": 8 * 24,
        "min_hardening_index": 75,
    },
    "tools": {"remote_syslog_host": "logs.dc1.example.net"},
}

# An air-gapped site: every repository is the local mirror.
apt = {
    "debian_mirror": "http://mirror.dc1.example.net/debian",
    "debian_security_mirror": "http://mirror.dc1.example.net/debian-security",
    "cuda_repo_url": "http://mirror.dc1.example.net/nvidia/cuda/{distro}/{arch}",
    "container_toolkit_repo_url": "http://mirror.dc1.example.net/nvidia/libnvidia-container",
    # Keyrings checked once by the operator (gpg --dearmor of NVIDIA's published keys).
    "cuda_keyring": "keyrings/cuda-archive-keyring.gpg",
    "container_toolkit_keyring": "keyrings/nvidia-container-toolkit-keyring.gpg",
}

# The NVIDIA stack's pins: group_data/all.py.

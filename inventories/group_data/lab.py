"""Data for every host of inventories/lab.py (pyinfra names this group after the file)."""

from lab import LOGIN_USER, REBOOT_COMMAND, Lab

_lab = Lab()

# Connection: the lab's own key and known_hosts, a cloud-image style sudo user.
ssh_user = LOGIN_USER
ssh_key = str(_lab.key_path)
ssh_known_hosts_file = str(_lab.known_hosts_path)
ssh_strict_host_key_checking = "yes"
_sudo = True

admin_users = [
    {
        "name": "gpuadmin",
        "ssh_keys": [_lab.key_path.with_suffix(".pub").read_text().strip()]
        if _lab.key_path.with_suffix(".pub").exists()
        else [],
    }
]

# The lab's internal CA lives beside the lab, under a generated passphrase
# (GPUNODE_CA_DIR / GPUNODE_CA_PASSPHRASE in the environment still win). inventories/lab.py
# gives each node this with its address added (tls.ip_addresses): keep the two alike.
tls = {
    "enabled": True,
    "ca_directory": str(_lab.ca_dir),
    "ca_passphrase_file": str(_lab.ca_passphrase_file()),
}

# NVIDIA's hosts are unreachable from the lab, as at an air-gapped site: the lab serves
# signed stand-in repositories on its bridge (gpunode lab up) and every URL points there.
# Debian's packages come through the lab's apt-cacher-ng (fetched once for all nodes); the
# stand-in repositories on the gateway are reached directly. Each node's release and
# architecture fill in {distro}/{arch}/{dpkg_arch}, as they do for production's mirror.
# An Ubuntu lab node's archive is the lab's stand-in (lab.aptrepo.ubuntu_redirect): Debian's
# signed archive of the suite the node is built from, under Ubuntu's suite names.
_repo = _lab.repo_base_url
apt = {
    "proxy": _lab.package_cache_url,
    "ubuntu_mirror": f"{_repo}/ubuntu",
    "ubuntu_security_mirror": f"{_repo}/ubuntu-security",
    "direct_hosts": [_lab.gateway],
    "cuda_repo_url": f"{_repo}/cuda/{{distro}}/{{arch}}",
    "container_toolkit_repo_url": f"{_repo}/libnvidia-container/stable/deb/{{dpkg_arch}}",
    "cuda_keyring": str(_lab.repo_dir / "keyrings" / "cuda-archive-keyring.gpg"),
    "container_toolkit_keyring": str(
        _lab.repo_dir / "keyrings" / "nvidia-container-toolkit-keyring.gpg"
    ),
    # The test suite's labs (GPUNODE_LAB_DEBIAN=subset): Debian's archive as the lab's signed
    # subset of it (lab.debian_subset), trusted through apt.debian_keyring as a site's
    # re-signed mirror is; otherwise Debian's own archive through the cache (nothing here).
    **_lab.debian_apt_data(),
}

# The control side reaches the lab from the bridge's gateway; nodes talk freely to each other.
firewall = {
    "enabled": True,
    "admin_networks": [f"{_lab.gateway}/32"],
    "monitoring_networks": [f"{_lab.gateway}/32"],
    "fabric_networks": [_lab.subnet],
}

gpu_metrics = {"enabled": True}
# Scraped over mutual TLS from the control side (firewall.monitoring_networks above).
node_exporter = {"enabled": True}

# The control side scans sshd (ssh-audit) and tries refused logins in tests: OpenSSH 10's
# per-source penalties must not shut it out of the trixie nodes for the runs that follow.
sshd = {"penalty_exempt_networks": [f"{_lab.gateway}/32"]}

# The NVIDIA stack's pins are production's (group_data/all.py), served by the lab's stand-in
# repositories. The simulated GPUs load the installed driver on a (simulated) reboot, which
# reboot: if-needed performs through the lab's reboot command.
reboot = {"command": list(REBOOT_COMMAND)}

# The fabric: simulated HCAs (ibstat) and the lab bridge as the NCCL socket interface.
infiniband = {"enabled": True}
nccl = {"env": {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "mlx5", "NCCL_DEBUG": "WARN"}}

# Audits: off for the lab's runs, so every module's converge stays fast and its node as the
# module left it (a fresh lab node would install auditd's and lynis's packages otherwise);
# tests/integration/test_audit.py and test_malware_scan.py turn them on for their own runs
# (--data), as test_file_integrity.py does AIDE. auditd would be skipped here anyway: a
# container's kernel (its host's) refuses audit. Where a run turns malware scans on, the
# signatures come from the lab's own mirror, as at an air-gapped site: one custom database
# that detects the EICAR test file (lab/signatures.py), ClamAV's official databases excluded
# (database.clamav.net is unreachable from the lab).
audit = {
    "malware_scan": {
        "enabled": False,
        "signatures": {
            "private_mirror": _lab.clamav_mirror_url,
            "custom_urls": [f"{_lab.clamav_mirror_url}/gpunode-lab.hdb"],
            "official": False,
        },
    },
    "auditd": {"enabled": False},
    "lynis": {"enabled": False},
    "tools": {
        "process_accounting": False,
        "sysstat": False,
        "debsums": False,
        "needrestart": False,
        "apt_listchanges": False,
        "pam_tmpdir": False,
        "private_home_directories": False,
    },
}

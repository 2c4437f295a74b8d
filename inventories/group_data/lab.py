"""Data for every host of inventories/lab.py (pyinfra names this group after the file)."""

from gpunode.lab import LOGIN_USER, Lab
from gpunode.pki import use_lab_ca

_lab = Lab()
# The lab's internal CA lives beside the lab (unless GPUNODE_CA_DIR says otherwise).
use_lab_ca(_lab.state_dir)

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

tls = {"enabled": True}

# The control side reaches the lab from the bridge's gateway; nodes talk freely to each other.
firewall = {
    "enabled": True,
    "admin_networks": [f"{_lab.gateway}/32"],
    "monitoring_networks": [f"{_lab.gateway}/32"],
    "fabric_networks": [_lab.subnet],
}

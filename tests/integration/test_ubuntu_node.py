"""An Ubuntu 24.04 (noble) lab node, in a one-node lab of its own beside the shared one.

What an Ubuntu lab node is and is not: lab.UBUNTU_LAB_BASES. Here: the node is noble as
gpunode reads it (os-release, lsb-release, sshd from ssh.socket, ufw, needrestart,
unattended-upgrades, AppArmor, netplan; a simulated Ubuntu kernel release, lab.hwsim.kernel);
an active ufw is refused before anything changes; a new sshd that cuts logins is rolled back
to socket activation; the converge (base system, hardening, sshd, firewall, InfiniBand's user
space and the NVIDIA driver and, on this HGX node, Fabric Manager from Ubuntu's archive, source
"ubuntu": the lab's stand-in of Ubuntu's packages, lab.standin.ubuntu; CUDA, DCGM and the
Container Toolkit from the stand-ins of NVIDIA's Ubuntu 24.04 tree and its toolkit repository,
inventories/lab.py) makes the inventory's sshd settings the effective ones whatever
cloud-init's drop-in says, installs Canonical's prebuilt module for the running kernel and
Ubuntu's Fabric Manager at the driver's version, running with it, and the rest of the stack as
the group data pins it, changes nothing the second time, moves the held packages on a branch
change and leaves no drift; under Secure Boot the signed prebuilt module asks nothing of the
operator, while a kernel Canonical builds no module for (DKMS) is refused before anything
changes until the key DKMS signs with is enrolled; then, Secure Boot still on, that kernel gets
DKMS, as ``--dry`` predicted, which goes again once the node is back on a kernel with a
prebuilt module.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import Lab

from .conftest import PYINFRA, ROOT, PyinfraRun, ssh

# A lab of its own, none of the shared lab's nodes (tests/tiers.py: own_lab).
pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

DEPLOY = "deploys/gpu_node.py"
GPUNODE = str(Path(sys.executable).with_name("gpunode"))
SSH_AUDIT = str(Path(sys.executable).with_name("ssh-audit"))
NOBLE_OS_RELEASE = (ROOT / "tests/fixtures/os-release/ubuntu-24.04-noble").read_text()
# What a refused run must leave as it was: sources, apt and needrestart configuration, sshd's
# configuration and how it is started, nftables (not installed on a fresh node) and its tables.
SNAPSHOT = (
    "ls /etc/apt/sources.list.d /etc/apt/apt.conf.d /etc/needrestart/conf.d; "
    "sha1sum /etc/ssh/sshd_config /etc/apt/sources.list.d/*; "
    "systemctl is-enabled ssh.socket ssh.service; "
    "if command -v nft >/dev/null; then nft list tables; else echo no nft; fi"
)

CLOUD_INIT_DROP_IN = "/etc/ssh/sshd_config.d/50-cloud-init.conf"
FABRIC_MANAGER_STATE = (
    "systemctl is-enabled nvidia-fabricmanager; systemctl is-active nvidia-fabricmanager; true"
)


# The inventory's driver (inventories/lab.py) and an older branch to start from.
DRIVER_580 = "580.173.02-0ubuntu0.24.04.1"
DRIVER_570 = "570.211.01-0ubuntu1.24.04.1"
BRANCH_570 = {
    "source": "ubuntu", "branch": "570", "version": DRIVER_570, "ubuntu_series": "server",
    "flavour": "open", "reboot": "if-needed",
}  # fmt: skip
# The simulated running kernel (lab.hwsim.kernel): noble's generic one, for which the stand-in
# archive carries Canonical's prebuilt modules, and a locally built one it carries none for.
# What the 570 driver runs: CUDA 12 only (13.0 needs 580; the inventory's 580 adds it).
ON_570 = (
    "--data", "nvidia_driver=" + json.dumps(BRANCH_570),
    "--data", "cuda=" + json.dumps({"versions": ["12.8"], "default": "12.8"}),
)  # fmt: skip
KERNEL = "6.8.0-64-generic"
CUSTOM_KERNEL = "6.8.0-64-custom"
KERNEL_RELEASE_PATH = "/var/lib/gpunode-lab/kernel-release"
DRIVER_OPERATION = (
    "NVIDIA driver | NVIDIA driver {version} (open kernel module, ubuntu source): "
    "installed and held"
)


def nvidia_stack(ubuntu: UbuntuLab) -> dict[str, str]:
    """Installed and held packages of NVIDIA's repositories (CUDA toolkits, DCGM, the
    Container Toolkit) -> version; one installed but not held is missing from it."""
    listing = ubuntu.sudo(
        "dpkg-query -W -f '${db:Status-Abbrev}|${Package}|${Version}\\n' "
        "'cuda-toolkit-1*' 'datacenter-gpu-manager*' nvidia-container-toolkit 2>/dev/null; "
        "echo; apt-mark showhold"
    )
    installed_part, held_part = listing.split("\n\n", 1)
    held = set(held_part.split())
    # A package dpkg knows but has not installed (un) has no version.
    installed = (line.split("|") for line in installed_part.splitlines())
    return {
        name: version
        for status, name, version in installed
        if status[1:2] == "i" and name in held and not name.endswith("-config-common")
    }


def ubuntu_packages(node_sudo: Any) -> dict[str, tuple[str, str]]:
    """Installed Ubuntu driver and Fabric Manager packages: name -> (version, hold mark);
    the Container Toolkit's (NVIDIA's own repository) are not among them."""
    listing = node_sudo(
        "dpkg-query -W -f '${db:Status-Abbrev}|${Package}|${Version}\\n' "
        "'*nvidia*' 2>/dev/null; echo; apt-mark showhold"
    )
    installed_part, held_part = listing.split("\n\n", 1)
    held = set(held_part.split())
    found = {}
    for line in installed_part.splitlines():
        status, name, version = line.split("|")
        if "-container" in name:
            continue
        if status[1:2] == "i":  # installed (ii, or hi: held)
            found[name] = (version, "held" if name in held else "not held")
    return found


class UbuntuLab:
    def __init__(self, lab: Lab, env: dict[str, str]) -> None:
        self.lab, self.env = lab, env
        (self.node,) = lab.nodes()

    def pyinfra(self, *args: str) -> tuple[PyinfraRun, float]:
        started = time.monotonic()
        result = subprocess.run(
            [PYINFRA, *([] if "--dry" in args else ["-y"]), "--json", "inventories/lab.py", *args],
            cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        took = time.monotonic() - started
        try:
            results = json.loads(result.stdout)
        except json.JSONDecodeError:
            results = None
        return PyinfraRun(result.returncode, result.stdout + result.stderr, results), took

    def sudo(self, command: str) -> str:
        result = ssh(self.lab, self.node, f"sudo sh -c {shlex.quote(command)}")
        assert result.returncode == 0, result.stderr
        return result.stdout

    def drift(self) -> dict[str, Any]:
        result = subprocess.run(
            [GPUNODE, "drift", "inventories/lab.py", "--json"],
            cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        return json.loads(result.stdout)


@pytest.fixture(scope="module")
def ubuntu(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UbuntuLab]:
    state = tmp_path_factory.mktemp("ubuntu")
    subnet = int(lab.network_prefix.rsplit(".", 1)[1]) + 105
    fresh = Lab(state_dir=state / "lab", name=f"{lab.name}-ubuntu", subnet_index=subnet)
    env = {
        **os.environ,
        "GPUNODE_LAB_DIR": str(state / "lab"),
        "GPUNODE_LAB_NAME": fresh.name,
        "GPUNODE_LAB_SUBNET": str(subnet),
        "GPUNODE_FACT_PLAN_DIR": str(state / "plans"),
    }
    # An HGX H100 node (NVSwitch): the driver's Fabric Manager comes from Ubuntu's archive.
    fresh.up(1, profiles=["hgx-h100"], releases=["noble"])
    try:
        yield UbuntuLab(fresh, env)
    finally:
        fresh.down(keep_image=True)


def test_the_node_is_noble_as_a_24_04_server_has_it(ubuntu: UbuntuLab) -> None:
    assert ubuntu.sudo("cat /etc/os-release") == NOBLE_OS_RELEASE
    assert ubuntu.sudo("cat /usr/lib/os-release") == NOBLE_OS_RELEASE
    assert ubuntu.sudo("readlink /etc/os-release") == "../usr/lib/os-release\n"
    assert "DISTRIB_ID=Ubuntu\nDISTRIB_RELEASE=24.04\nDISTRIB_CODENAME=noble\n" in ubuntu.sudo(
        "cat /etc/lsb-release"
    )
    # sshd from ssh.socket: the socket enabled and listening, ssh.service not enabled (this
    # very login started it).
    assert ubuntu.sudo(
        "systemctl is-enabled ssh.socket ssh.service; systemctl is-active ssh.socket; true"
    ).split() == ["enabled", "disabled", "active"]
    assert ubuntu.sudo("ufw status") == "Status: inactive\n"
    installed = ubuntu.sudo(
        "dpkg-query -W -f '${Package} ${db:Status-Abbrev}\\n' "
        "ufw needrestart unattended-upgrades apparmor netplan.io"
    )
    assert [line.split()[1] for line in installed.splitlines()] == ["ii"] * 5, installed
    assert ubuntu.sudo("systemctl is-enabled unattended-upgrades") == "enabled\n"
    sources = ubuntu.sudo("ls /etc/apt/sources.list.d")
    assert sources == "ubuntu.sources\n"


def test_an_active_ufw_is_refused_before_anything_changes(ubuntu: UbuntuLab) -> None:
    # SSH allowed first, as an operator enabling ufw over SSH does.
    ubuntu.sudo("ufw allow 22/tcp >/dev/null && ufw --force enable >/dev/null")
    try:
        before = ubuntu.sudo(SNAPSHOT)
        run, _ = ubuntu.pyinfra(DEPLOY)
        assert run.returncode != 0, run.output
        assert "firewall refused: ufw is active on the node" in run.output
        assert "`ufw disable`" in run.output
        assert "Nothing was changed." in run.output
        assert ubuntu.sudo(SNAPSHOT) == before
    finally:
        ubuntu.sudo("ufw --force disable >/dev/null")
    assert ubuntu.sudo("ufw status") == "Status: inactive\n"


def test_an_sshd_that_cuts_logins_goes_back_to_socket_activation(ubuntu: UbuntuLab) -> None:
    # sshd -t accepts listening on loopback only, but no new login could reach the node.
    exempt = [f"{ubuntu.lab.gateway}/32"]
    cut = {"penalty_exempt_networks": exempt, "listen_addresses": ["127.0.0.1"]}
    before = ubuntu.sudo("sha1sum /etc/ssh/sshd_config")
    run, _ = ubuntu.pyinfra(DEPLOY, "--data", "sshd=" + json.dumps(cut))
    assert run.returncode != 0, run.output
    assert "the new sshd configuration was rolled back because new SSH login" in run.output
    assert "the previous configuration is active again" in run.output
    assert ubuntu.sudo("sha1sum /etc/ssh/sshd_config") == before
    assert ubuntu.sudo(
        "systemctl is-enabled ssh.socket ssh.service; systemctl is-active ssh.socket; true"
    ).split() == ["enabled", "disabled", "active"]


def effective_password_authentication(ubuntu: UbuntuLab) -> str:
    """``sshd -T``'s passwordauthentication: what sshd applies, drop-ins included."""
    settings = ubuntu.sudo("/usr/sbin/sshd -T").splitlines()
    (value,) = [line.split()[1] for line in settings if line.startswith("passwordauthentication ")]
    return value


def test_the_converge_installs_the_prebuilt_module_and_is_idempotent(ubuntu: UbuntuLab) -> None:
    assert ubuntu.sudo("uname -r").strip() == KERNEL
    # cloud-init's drop-in of a cloud image that was asked for password logins: the node's
    # own sshd_config includes sshd_config.d first, and sshd keeps the first value it reads.
    ubuntu.sudo(f"echo 'PasswordAuthentication yes' > {CLOUD_INIT_DROP_IN}")
    assert effective_password_authentication(ubuntu) == "yes"
    first, first_s = ubuntu.pyinfra(DEPLOY, *ON_570)
    assert first.returncode == 0, first.output
    # gpunode's sshd_config includes no drop-in: the inventory's setting is the effective one.
    assert effective_password_authentication(ubuntu) == "no"
    assert ubuntu.sudo(f"cat {CLOUD_INIT_DROP_IN}") == "PasswordAuthentication yes\n"
    # The roles before sshd were converged by the run the login cut stopped; sshd now.
    changed = first.changed_operations()
    assert "SSH server | Hardened sshd (validated, confirmed by a new login)" in changed
    assert "gpunode" in ubuntu.sudo("nft list tables")
    # Ubuntu's archive, as the product renders it, answered by the lab's stand-in.
    sources = ubuntu.sudo("cat /etc/apt/sources.list.d/ubuntu.sources")
    assert f"URIs: {ubuntu.lab.repo_base_url}/ubuntu\nSuites: noble noble-updates\n" in sources
    assert "Components: main restricted universe multiverse\n" in sources
    assert "Suites: noble-security\n" in sources
    assert "$nrconf{restart} = 'l';" in ubuntu.sudo("cat /etc/needrestart/conf.d/50-gpunode.conf")
    # sshd now runs from ssh.service (Port and ListenAddress are sshd_config's), the socket
    # masked; ufw was left alone, inactive.
    assert ubuntu.sudo(
        "systemctl is-enabled ssh.socket ssh.service; systemctl is-active ssh.service; ufw status"
    ).split() == ["masked", "enabled", "active", "Status:", "inactive"]
    # Ubuntu's compute set at the pinned version, held, with Canonical's prebuilt module for the
    # running kernel (at the kernel's version, held apart), no DKMS and no headers.
    # Fabric Manager and NSCQ from Ubuntu's multiverse, at the driver's version, held.
    assert ubuntu_packages(ubuntu.sudo) == {
        "libnvidia-compute-570-server": (DRIVER_570, "held"),
        "nvidia-utils-570-server": (DRIVER_570, "held"),
        "nvidia-compute-utils-570-server": (DRIVER_570, "held"),
        "nvidia-kernel-common-570-server": (DRIVER_570, "held"),
        f"linux-modules-nvidia-570-server-open-{KERNEL}": ("6.8.0-64.67+1", "held"),
        "nvidia-fabricmanager-570": (DRIVER_570, "held"),
        "libnvidia-nscq-570": (DRIVER_570, "held"),
    }
    assert "linux-headers" not in ubuntu.sudo("dpkg-query -W -f '${Package}\\n'")
    # The lab's "reboot" loaded it: the simulated GPUs run the installed driver, and Fabric
    # Manager (which starts only with its own driver version) runs with it.
    assert set(
        ubuntu.sudo("nvidia-smi --query-gpu=driver_version --format=csv,noheader").split()
    ) == {DRIVER_570.split("-")[0]}
    assert ubuntu.sudo(FABRIC_MANAGER_STATE).split() == ["enabled", "active"]
    # The rest of the stack from NVIDIA's repositories, as the group data pins it: CUDA and
    # DCGM (its CUDA 12 part: the newest CUDA declared) from the Ubuntu 24.04 tree, the
    # Container Toolkit from its own repository.
    assert "/cuda/ubuntu2404/x86_64" in ubuntu.sudo("cat /etc/apt/sources.list.d/*")
    assert nvidia_stack(ubuntu) == {
        "cuda-toolkit-12-8": "12.8.1-1",
        "datacenter-gpu-manager-4-core": "1:4.6.0-1",
        "datacenter-gpu-manager-4-cuda12": "1:4.6.0-1",
        "datacenter-gpu-manager-exporter": "4.8.3-1",
        "nvidia-container-toolkit": "1.18.2-1",
    }
    dcgm = ubuntu.sudo("systemctl is-active nvidia-dcgm nvidia-dcgm-exporter; true")
    assert dcgm.split() == ["active", "active"]
    again, again_s = ubuntu.pyinfra(DEPLOY, *ON_570)
    assert again.returncode == 0, again.output
    assert again.changed_operations() == {}
    print(f"noble node: converge from sshd on {first_s:.1f} s, no-op run {again_s:.1f} s")


def test_the_hardened_sshd_meets_ssh_audits_hardened_ubuntu_24_04_policy_but_its_version(
    ubuntu: UbuntuLab,
) -> None:
    """The real ssh-audit, with its built-in policy for Ubuntu 24.04 servers (the one
    gpunode/distributions.py names for noble), against the converged node. What answers is
    the lab's sshd: Debian 12's OpenSSH 9.2 with the configuration gpunode renders for noble
    (lab.UBUNTU_LAB_BASES). Every algorithm list, host key and modulus the policy names is
    met; the one difference is ``ext-info-s`` in the key exchanges, a marker the policy
    expects from noble's OpenSSH 9.6 and that the lab's 9.2 does not send, which no
    configuration can add."""
    policy = "Hardened Ubuntu Server 24.04 LTS (version 2)"
    result = subprocess.run(
        [SSH_AUDIT, "-P", policy, ubuntu.node.address],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    report = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)
    errors = report.split("Errors:", 1)[-1]
    assert result.returncode != 0 and errors.count("did not match") == 1, report
    expected = re.search(
        r"Key exchanges did not match\.\s+- Expected:\s+(.*)\n\s+- Actual:\s+(.*)", errors
    )
    assert expected is not None, report
    wanted, offered = (set(group.split(", ")) for group in expected.groups())
    assert wanted - offered == {"ext-info-s"} and offered <= wanted, report


def test_a_branch_change_moves_the_held_packages_and_leaves_no_drift(ubuntu: UbuntuLab) -> None:
    # 570 -> the inventory's 580: unhold, install 580's set and prebuilt module, remove 570's.
    changed, _ = ubuntu.pyinfra(DEPLOY)
    assert changed.returncode == 0, changed.output
    assert DRIVER_OPERATION.format(version=DRIVER_580) in changed.changed_operations()
    assert ubuntu_packages(ubuntu.sudo) == {
        "libnvidia-compute-580-server": (DRIVER_580, "held"),
        "nvidia-utils-580-server": (DRIVER_580, "held"),
        "nvidia-compute-utils-580-server": (DRIVER_580, "held"),
        "nvidia-kernel-common-580-server": (DRIVER_580, "held"),
        f"linux-modules-nvidia-580-server-open-{KERNEL}": ("6.8.0-64.67+1", "held"),
        "nvidia-fabricmanager-580": (DRIVER_580, "held"),
        "libnvidia-nscq-580": (DRIVER_580, "held"),
    }
    assert set(
        ubuntu.sudo("nvidia-smi --query-gpu=driver_version --format=csv,noheader").split()
    ) == {DRIVER_580.split("-")[0]}
    # 570's Fabric Manager went with its driver; 580's runs with the new one.
    assert ubuntu.sudo(FABRIC_MANAGER_STATE).split() == ["enabled", "active"]
    # The 580 driver runs CUDA 13 too: its toolkit, and DCGM's part for it in place of 12's.
    assert nvidia_stack(ubuntu) == {
        "cuda-toolkit-12-8": "12.8.1-1",
        "cuda-toolkit-13-0": "13.0.2-1",
        "datacenter-gpu-manager-4-core": "1:4.6.0-1",
        "datacenter-gpu-manager-4-cuda13": "1:4.6.0-1",
        "datacenter-gpu-manager-exporter": "4.8.3-1",
        "nvidia-container-toolkit": "1.18.2-1",
    }
    again, _ = ubuntu.pyinfra(DEPLOY)
    assert again.returncode == 0, again.output
    assert again.changed_operations() == {}
    report = ubuntu.drift()
    assert report["findings"] == [] and report["unreachable"] == {}, report


IPOIB = {"enabled": True, "ipoib": [{"name": "ib0", "address": "192.168.100.11/24"}]}
NETPLAN_IPOIB = "/etc/netplan/60-gpunode-ipoib-ib0.yaml"
# What netplan generates from it for systemd-networkd (the renderer of Ubuntu servers).
NETWORKD_IB0 = "/run/systemd/network/10-netplan-ib0.network"
BROKEN_NETPLAN = "/etc/netplan/40-operator.yaml"


def test_ipoib_is_a_netplan_file_the_nodes_netplan_validates_before_it_is_written(
    ubuntu: UbuntuLab,
) -> None:
    """noble configures its network with netplan: an IPoIB interface is a netplan file of
    gpunode's, read by the node's real netplan (Debian's netplan.io here). An operator's file
    netplan cannot read refuses the change before anything is written, in netplan's words."""
    ubuntu.sudo(
        f"printf 'network:\\n  version: 2\\n  ethernets: [eth9\\n' > {BROKEN_NETPLAN} && "
        f"chmod 600 {BROKEN_NETPLAN}"
    )
    refused, _ = ubuntu.pyinfra(DEPLOY, "--data", "infiniband=" + json.dumps(IPOIB))
    assert refused.returncode != 0, refused.output
    assert (
        f"netplan refuses {NETPLAN_IPOIB}; the netplan configuration is as it was" in refused.output
    )
    assert "40-operator.yaml" in refused.output  # netplan names the file it cannot read
    assert ubuntu.sudo(f"ls {NETPLAN_IPOIB} {NETWORKD_IB0} 2>&1 || true").count("No such") == 2
    ubuntu.sudo(f"rm {BROKEN_NETPLAN}")

    done, _ = ubuntu.pyinfra(DEPLOY, "--data", "infiniband=" + json.dumps(IPOIB))
    assert done.returncode == 0, done.output
    assert set(done.changed_operations()) == {"InfiniBand and RDMA | IPoIB ib0 (netplan)"}
    assert ubuntu.sudo(f"stat -c '%a %U' {NETPLAN_IPOIB}") == "600 root\n"
    network = ubuntu.sudo(f"cat {NETWORKD_IB0}")
    assert "Name=ib0" in network and "Address=192.168.100.11/24" in network, network
    assert "MTUBytes=2044" in network, network
    again, _ = ubuntu.pyinfra(DEPLOY, "--data", "infiniband=" + json.dumps(IPOIB))
    assert again.returncode == 0, again.output
    assert again.changed_operations() == {}
    # Declared away (the inventory has none): the file goes, and netplan's unit with it.
    gone, _ = ubuntu.pyinfra(DEPLOY)
    assert gone.returncode == 0, gone.output
    assert set(gone.changed_operations()) == {
        "InfiniBand and RDMA | No other gpunode IPoIB interfaces"
    }
    assert ubuntu.sudo(f"ls {NETPLAN_IPOIB} {NETWORKD_IB0} 2>&1 || true").count("No such") == 2


# Secure Boot on the noble node: the lab's simulated UEFI firmware (lab.hwsim.firmware) read by
# the real mokutil, installed from the archive as an operator would (the lab's stand-in Ubuntu
# archive answers with Debian's build). The key Ubuntu's DKMS signs with is shim-signed's
# (gpunode.expected.secure_boot.UBUNTU_KEY), made here as update-secureboot-policy --new-key
# makes it: the stand-in packages run no DKMS.
UBUNTU_MOK = "/var/lib/shim-signed/mok/MOK.der"
MAKE_UBUNTU_MOK = (
    "mkdir -p /var/lib/shim-signed/mok && openssl req -new -x509 -nodes -days 36500 "
    "-subj '/CN=gpunode-lab Secure Boot Module Signature key' -newkey rsa:2048 "
    f"-keyout /var/lib/shim-signed/mok/MOK.priv -outform DER -out {UBUNTU_MOK} >/dev/null 2>&1"
)
MOK_HASH = "/root/mok-password.hash"
REQUEST_ENROLMENT = (
    f"mokutil --generate-hash=gpunode-lab > {MOK_HASH} && "
    f"mokutil --import {UBUNTU_MOK} --hash-file {MOK_HASH}; status=$?; rm -f {MOK_HASH}; "
    "exit $status"
)


def secure_boot_findings(ubuntu: UbuntuLab) -> list[str]:
    return [
        f"{finding['id']} {finding['severity']}: {finding['found']}"
        for finding in ubuntu.drift()["findings"]
        if finding["id"].startswith("secure_boot.")
    ]


def test_under_secure_boot_the_prebuilt_module_needs_no_key_and_dkms_waits_for_one(
    ubuntu: UbuntuLab,
) -> None:
    """Canonical signs its prebuilt module: on the generic kernel nothing is asked of the
    operator. A kernel Canonical builds no module for means DKMS, whose module loads only once
    the key it is signed with is enrolled: refused, before anything changes, naming the
    enrolment step; then the operator enrols the key (request, then the console)."""
    ubuntu.sudo(
        "export DEBIAN_FRONTEND=noninteractive; "
        "apt-get install -y -q --no-install-recommends mokutil >/dev/null 2>&1 || "
        "{ apt-get update -q >/dev/null && "
        "apt-get install -y -q --no-install-recommends mokutil >/dev/null; }"
    )
    ubuntu.sudo(
        "gpunode-lab-hw set firmware.uefi true && gpunode-lab-hw set firmware.secure_boot true"
    )
    assert ubuntu.sudo("mokutil --sb-state") == "SecureBoot enabled\n"
    on_generic, _ = ubuntu.pyinfra(DEPLOY)
    assert on_generic.returncode == 0, on_generic.output
    assert on_generic.changed_operations() == {}
    assert secure_boot_findings(ubuntu) == []

    ubuntu.sudo(MAKE_UBUNTU_MOK)
    ubuntu.sudo(f"echo {CUSTOM_KERNEL} > {KERNEL_RELEASE_PATH}")
    before = (ubuntu_packages(ubuntu.sudo), ubuntu.sudo(SNAPSHOT))
    refusal = (
        f"{ubuntu.node.name}: NVIDIA driver {DRIVER_580} (open kernel module, ubuntu source) "
        "not installed: Secure Boot is on and no machine owner key DKMS signs the NVIDIA "
        "module with is enrolled: the module would not load; enrol the key DKMS signs with: "
        f"mokutil --import {UBUNTU_MOK}, then confirm the enrolment at the console on the next "
        "boot (MokManager)"
    )
    for args in (("--dry",), ()):
        refused, _ = ubuntu.pyinfra(*args, DEPLOY)
        assert refused.returncode != 0, refused.output
        assert refusal in refused.output
        assert "Nothing was changed" in refused.output
        assert (ubuntu_packages(ubuntu.sudo), ubuntu.sudo(SNAPSHOT)) == before

    ubuntu.sudo(REQUEST_ENROLMENT)
    assert f"{UBUNTU_MOK} is already in the enrollment request" in ubuntu.sudo(
        f"mokutil --test-key {UBUNTU_MOK} 2>&1 || true"
    )
    ubuntu.sudo("gpunode-lab-hw mok-manager")
    assert f"{UBUNTU_MOK} is already enrolled" in ubuntu.sudo(
        f"mokutil --test-key {UBUNTU_MOK} 2>&1 || true"
    )
    # Back on the generic kernel: the next test takes the DKMS path, now with Secure Boot on
    # and the key enrolled, as an operator would after the enrolment.
    ubuntu.sudo(f"echo {KERNEL} > {KERNEL_RELEASE_PATH}")
    assert secure_boot_findings(ubuntu) == []


def test_a_kernel_without_prebuilt_modules_gets_dkms_as_dry_predicts(ubuntu: UbuntuLab) -> None:
    # The node now runs a kernel Canonical builds no NVIDIA module for (a locally built one):
    # apt offers no linux-modules-nvidia-580-server-open-6.8.0-64-custom.
    ubuntu.sudo(f"echo {CUSTOM_KERNEL} > {KERNEL_RELEASE_PATH}")
    assert ubuntu.sudo("uname -r").strip() == CUSTOM_KERNEL
    before = ubuntu_packages(ubuntu.sudo)
    dry, _ = ubuntu.pyinfra("--dry", DEPLOY)
    assert dry.returncode == 0, dry.output
    assert dry.results is not None
    predicted = {op["name"] for op in dry.results["plan"] if op["hosts_with_change"]}
    assert DRIVER_OPERATION.format(version=DRIVER_580) in predicted
    assert ubuntu_packages(ubuntu.sudo) == before, "--dry changed the node"
    real, _ = ubuntu.pyinfra(DEPLOY)
    assert real.returncode == 0, real.output
    assert set(real.changed_operations()) == predicted
    after = ubuntu_packages(ubuntu.sudo)
    # DKMS builds the module for this kernel; the prebuilt one of the generic kernel belongs
    # to that kernel and stays.
    assert after == {**before, "nvidia-dkms-580-server-open": (DRIVER_580, "held")}
    again, _ = ubuntu.pyinfra(DEPLOY)
    assert again.returncode == 0, again.output
    assert again.changed_operations() == {}
    # Back on the generic kernel: its prebuilt module is there, the DKMS one goes (it would be
    # loaded instead), the loaded driver stays, and nothing drifts.
    ubuntu.sudo(f"echo {KERNEL} > {KERNEL_RELEASE_PATH}")
    back, _ = ubuntu.pyinfra(DEPLOY)
    assert back.returncode == 0, back.output
    assert set(back.changed_operations()) == {DRIVER_OPERATION.format(version=DRIVER_580)}
    assert ubuntu_packages(ubuntu.sudo) == before
    report = ubuntu.drift()
    assert report["findings"] == [] and report["unreachable"] == {}, report


def test_the_verify_suite_passes_on_the_converged_ubuntu_node(ubuntu: UbuntuLab) -> None:
    """tests/verify against the noble node as the inventory declares it: Ubuntu's sshd policy
    and socket unit, the ubuntu source's held packages and prebuilt module, every check that
    applies passing (it once knew Debian's sshd and packages alone)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/verify", "--inventory", "inventories/lab.py",
         "-q", "-p", "no:cacheprovider", "-rf"],
        cwd=ROOT, env=ubuntu.env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1]

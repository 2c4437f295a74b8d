"""The desired-state model: every bad input gets one precise message; good data passes."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest

from gpunode.inventory import InvalidInventory, validate_hosts
from gpunode.model import DesiredState, build_desired_state, upstream_version

ROOT = Path(__file__).resolve().parents[2]
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBmmC5c0MskzCLCOGiqga2hOzIWStr5uPr30UKQpetWS a@b"
# A real 1024-bit RSA public key (ssh-keygen -t rsa -b 1024, for this test): too weak.
RSA_1024 = (
    "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQDgdfn7yl9tCVpQ/YpkZMI59T5QEUdFJ6aBwhhY/ZHKz6XE9hProa"
    "oRtdVje7rtMTwBusm18+NAjm2WfCFP/BD0UR7NOPzxfxo8044IGbU/efIDSPNVMPUl6TvutUlr+C17XgfaWrMQjgTs"
    "EgfTjd7sGTjI3XYogWtc5b5x/sPlSQ== weak@x"
)
# Generated for these tests (cryptography, 3072-bit RSA and P-384): keys that must pass.
RSA_3072 = (
    "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABgQDRQpDPCJQluXCNf/vqJsce7i2k/9kZQ2uW2eLGNYw9/qqa4OqvS"
    "jcDnE0pfSLoAe5Jr606JK9xgMEeP2hqvipoQAWI4U37RK3rFrhGbWFdkaD08wpYlSSEYPa4ojESNCdApLKtuKNakP"
    "Mfc74hLunGDw++truXisDcpE2+yJU+++Y5EjgXDA8mkNI2XW8Oow0CTtQNJnaTyHsCUkxakQkpfzoXoTQg3o01MRC"
    "Pg2jUaK1ay63OZUqRC3GAZrm/ny9g6lalMHq5ZdC3zexxElhhZkNlJrAGD0dafRd/ZKcFrBres1QKBU+oFbYxAejCW"
    "bJGWEUycoeo0WkoTV5yPYAbu6lCqwz3w3druxMurgmW7MoWInLt/+xs95fgwKX2GiGjDe1zU4wxGG//fKszP6K0sXY"
    "yJFEmyAUaXky/DJtG0vRP/PmI9rVRcnqzabfl/5KO0opzniSo0FxEGB89oa8723XI/DHMalyEY9xswP99BRyWxMdpf"
    "/ubL0iMY5niVmE= ops laptop (2026)"
)
ECDSA_384 = (
    "ecdsa-sha2-nistp384 AAAAE2VjZHNhLXNoYTItbmlzdHAzODQAAAAIbmlzdHAzODQAAABhBIrMCWT93845il7Tg"
    "EKQ/UFKGNBVHwOT0m1EAOnofTBHX29LxkvN0l08py3UAwQP87ZQG58Km+gYm8UI5/oZodJw0+T0tPSUQf8m0gjNrlgQ"
    "OjG3P/JN8FDKLsWj8xl3dw=="
)

# Issue 12's reproductions.
LISTEN_INJECTION = "fe80::1%lo\nPermitRootLogin yes\nPasswordAuthentication yes"
IPOIB_INJECTION = "fe80::1%ib0\n    up reboot/64"
APT_PROXY_INJECTION = 'http://proxy:3142/";APT::Update::Pre-Invoke{"touch${IFS}/tmp/PWNED";};//'
WEAK_KEY_WITH_OPTIONS = 'command="/bin/sh",from="*" ' + RSA_1024


def problems_of(data: dict) -> list[str]:
    _, problems = build_desired_state(data)
    return [problem.render("inventories/test.py", "node-1") for problem in problems]


# (data, the one message expected, as an exact substring of the rendered line)
BAD_INPUTS = [
    pytest.param(
        {"apt": {"direct_hosts": ["mirror.internal"]}},
        "apt.direct_hosts = ['mirror.internal']: no proxy to bypass; accepted: set apt.proxy, "
        "or leave direct_hosts empty",
        id="direct-hosts-without-proxy",
    ),
    pytest.param(
        {"apt": {"proxy": "http://cache:3142", "direct_hosts": ["bad host"]}},
        "apt.direct_hosts[0] = 'bad host'",
        id="direct-host-with-blank",
    ),
    pytest.param(
        {"nvidia_drvier": {"source": "nvidia"}},
        "host node-1: nvidia_drvier = {'source': 'nvidia'}: unknown key (did you mean "
        "'nvidia_driver'?); accepted: gpunode keys",
        id="unknown-top-level-key",
    ),
    pytest.param(
        {"sshd": {"prot": 22}},
        "sshd.prot = 22: unknown key (did you mean 'port'?); accepted: keys of sshd: "
        "allow_agent_forwarding",
        id="unknown-nested-key",
    ),
    pytest.param(
        {"sshd": {"port": 70000}},
        "sshd.port = 70000: out of range; accepted: an integer from 1 to 65535",
        id="port-out-of-range",
    ),
    pytest.param(
        {"sshd": {"port": "22"}},
        "sshd.port = '22': wrong type; accepted: an integer from 1 to 65535",
        id="port-wrong-type",
    ),
    pytest.param(
        {"sshd": {"permit_root_login": "yes"}},
        "sshd.permit_root_login = 'yes': not an accepted value; accepted: one of 'no', "
        "'prohibit-password'",
        id="root-login-yes",
    ),
    pytest.param(
        {"sshd": {"x11_forwarding": "no"}},
        "sshd.x11_forwarding = 'no': wrong type; accepted: true or false",
        id="bool-as-string",
    ),
    pytest.param(
        {"firewall": {"admin_networks": ["10.0.0.1/8"]}},
        "firewall.admin_networks[0] = '10.0.0.1/8': host bits set; accepted: networks in CIDR",
        id="cidr-host-bits",
    ),
    pytest.param(
        {"firewall": {"fabric_networks": ["10.300.0.0/16"]}},
        "firewall.fabric_networks[0] = '10.300.0.0/16': not a network in CIDR form",
        id="invalid-cidr",
    ),
    pytest.param(
        {"firewall": {"admin_networks": "10.0.0.0/8"}},
        "firewall.admin_networks = '10.0.0.0/8': wrong type; accepted: networks in CIDR form",
        id="cidr-not-a-list",
    ),
    pytest.param(
        {"firewall": {"extra_rules": [{"name": "nfs", "ports": [2049], "sources": []}]}},
        "firewall.extra_rules[0].sources = []: empty; accepted: at least one network",
        id="rule-without-sources",
    ),
    pytest.param(
        {"firewall": {"metrics_ports": [0]}},
        "firewall.metrics_ports[0] = 0: out of range; accepted: an integer from 1 to 65535",
        id="metrics-port-zero",
    ),
    pytest.param(
        {"node_exporter": {"enabled": True}},
        "node_exporter.enabled = True: node_exporter serves only over TLS with the node "
        "certificate, and tls.enabled is false; accepted: tls.enabled: true, or "
        "node_exporter.enabled: false",
        id="node-exporter-without-tls",
    ),
    pytest.param(
        {"tls": {"enabled": True}, "node_exporter": {"enabled": True, "port": 22}},
        "node_exporter.port = 22: taken by sshd.port; accepted: a port no other service of the "
        "node listens on (9100 by default)",
        id="node-exporter-on-the-ssh-port",
    ),
    pytest.param(
        {
            "tls": {"enabled": True},
            "dcgm": {"enabled": True, "exporter": True, "cuda_major": 13},
            "node_exporter": {"enabled": True, "port": 9400},
        },
        "node_exporter.port = 9400: taken by DCGM's exporter (dcgm.exporter); accepted: a port "
        "no other service of the node listens on (9100 by default)",
        id="node-exporter-on-dcgms-port",
    ),
    pytest.param(
        {"prometheus": {"enabled": True, "web_password_file": "/etc/gpunode/prometheus.pw"}},
        "prometheus.enabled = True: Prometheus scrapes the exporters with a client certificate "
        "from gpunode's CA and serves its web UI with the node certificate, and tls.enabled is "
        "false; accepted: tls.enabled: true, or prometheus.enabled: false",
        id="prometheus-without-tls",
    ),
    pytest.param(
        {
            "tls": {"enabled": True},
            "node_exporter": {"enabled": True},
            "prometheus": {
                "enabled": True,
                "port": 9100,
                "web_password_file": "/etc/gpunode/prometheus.pw",
            },
        },
        "prometheus.port = 9100: taken by node_exporter.port; accepted: a port no other service "
        "of the host listens on (9090 by default)",
        id="prometheus-on-the-exporters-port",
    ),
    pytest.param(
        {"prometheus": {"scrape_interval_seconds": 0}},
        "prometheus.scrape_interval_seconds = 0: out of range; accepted: an integer from 1 to 3600",
        id="prometheus-scrape-interval-zero",
    ),
    pytest.param(
        {"nvidia_driver": {"source": "nvidia", "branch": "550", "version": "550.abc"}},
        "nvidia_driver.version = '550.abc': malformed; accepted: an apt package version such "
        "as '550.127.08-1'",
        id="malformed-driver-version",
    ),
    pytest.param(
        {"nvidia_driver": {"source": "nvidia", "branch": "550", "version": "535.216.01-1"}},
        "nvidia_driver.version = '535.216.01-1': not in branch 550; accepted: a version "
        "starting with '550.'",
        id="version-outside-branch",
    ),
    pytest.param(
        {"nvidia_driver": {"source": "nvidia"}},
        "nvidia_driver.branch = None: missing for source 'nvidia'",
        id="nvidia-source-without-branch",
    ),
    pytest.param(
        {"nvidia_driver": {"source": "cuda"}},
        "nvidia_driver.source = 'cuda': not an accepted value; accepted: one of 'none', "
        "'debian', 'nvidia'",
        id="unknown-driver-source",
    ),
    pytest.param(
        {"nvidia_driver": {"branch": "550"}},
        "nvidia_driver.branch = '550': set while source is 'none', so it would be ignored",
        id="branch-without-source",
    ),
    pytest.param(
        {
            "nvidia_driver": {"source": "nvidia", "branch": "535", "version": "535.216.01-1"},
            "cuda": {"versions": ["13.0"]},
        },
        "cuda.versions[0] = '13.0': CUDA 13.0 needs driver >= 580 (its toolkit bundles "
        "580.65.06), but the driver is pinned to 535.216.01-1; accepted: a CUDA release the "
        "pinned driver runs: 12.0, 12.1, 12.2, 12.3, 12.4, 12.5, 12.6, 12.8, 12.9",
        id="cuda-too-new-for-driver",
    ),
    pytest.param(
        {"nvidia_driver": {"source": "nvidia", "branch": "550"}, "cuda": {"versions": ["13.0"]}},
        "cuda.versions[0] = '13.0': CUDA 13.0 needs driver >= 580 (its toolkit bundles "
        "580.65.06), but the driver is pinned to branch 550",
        id="cuda-too-new-for-branch",
    ),
    pytest.param(
        {"cuda": {"versions": ["12.7"]}},
        "cuda.versions[0] = '12.7': unknown CUDA release; accepted: a CUDA release: 12.0, 12.1",
        id="unknown-cuda-release",
    ),
    pytest.param(
        {
            "nvidia_driver": {"source": "nvidia", "branch": "595", "flavour": "proprietary"},
            "expected_hardware": {"gpu_model": "NVIDIA B200"},
        },
        "nvidia_driver.flavour = 'proprietary': expected_hardware.gpu_model 'NVIDIA B200' is a "
        "Blackwell GPU, which only NVIDIA's open kernel modules support; accepted: open",
        id="proprietary-modules-on-blackwell",
    ),
    pytest.param(
        {"nvidia_driver": {"source": "nvidia", "branch": "620", "flavour": "proprietary"}},
        "nvidia_driver.flavour = 'proprietary': branch 620 ships open kernel modules only (from "
        "620 on); accepted: open",
        id="proprietary-modules-from-620",
    ),
    pytest.param(
        {
            "nvidia_driver": {"source": "nvidia", "branch": "580", "flavour": "open"},
            "expected_hardware": {"gpu_model": "Tesla V100-SXM2-32GB"},
        },
        "nvidia_driver.flavour = 'open': expected_hardware.gpu_model 'Tesla V100-SXM2-32GB' "
        "predates Turing; NVIDIA's open kernel modules do not support it",
        id="open-modules-before-turing",
    ),
    pytest.param(
        {"cuda": {"versions": ["12.4"], "default": "12.6"}},
        "cuda.default = '12.6': not among cuda.versions; accepted: one of 12.4",
        id="cuda-default-not-installed",
    ),
    pytest.param(
        {
            "nvidia_driver": {"source": "nvidia", "branch": "550", "version": "550.127.08-1"},
            "fabric_manager": {"mode": "always", "version": "550.120-1"},
        },
        "fabric_manager.version = '550.120-1': differs from nvidia_driver.version "
        "'550.127.08-1'; accepted: exactly the driver version (550.127.08)",
        id="fabric-manager-version-mismatch",
    ),
    pytest.param(
        {"nvidia_driver": {"source": "debian"}, "expected_hardware": {"nvswitch": True}},
        "fabric_manager.mode = 'auto': Fabric Manager must match its driver and is packaged "
        "by NVIDIA's repository and Ubuntu's archive, not Debian's",
        id="fabric-manager-with-debian-driver",
    ),
    pytest.param(
        {
            "nvidia_driver": {
                "source": "ubuntu",
                "branch": "580",
                "ubuntu_series": "desktop",
                "version": "580.95.05-0ubuntu0.24.04.2",
            },
            "expected_hardware": {"nvswitch": True},
        },
        "nvidia_driver.ubuntu_series = 'desktop': Ubuntu's Fabric Manager packages "
        "(nvidia-fabricmanager-<branch>) depend on the server series' "
        "nvidia-kernel-common-<branch>-server at their own version; accepted: server on "
        "NVSwitch nodes, or fabric_manager.mode: never",
        id="fabric-manager-with-ubuntu-desktop-series",
    ),
    pytest.param(
        {"admin_users": [{"name": "alice", "ssh_keys": ["ssh-ed25519 not-base64!"]}]},
        "admin_users[0].ssh_keys[0] = 'ssh-ed25519 not-base64!': key data is not valid base64",
        id="ssh-key-bad-base64",
    ),
    pytest.param(
        {
            "admin_users": [
                {"name": "alice", "ssh_keys": [ED25519.replace("ssh-ed25519", "ssh-rsa")]}
            ]
        },
        "key data does not match its key type",
        id="ssh-key-type-mismatch",
    ),
    pytest.param(
        {"admin_users": [{"name": "alice", "ssh_keys": ["-----BEGIN OPENSSH PRIVATE KEY-----"]}]},
        "this is a PRIVATE key; give the public key (.pub) only",
        id="private-key-instead-of-public",
    ),
    pytest.param(
        {"admin_users": [{"name": "Alice", "ssh_keys": [ED25519]}]},
        "admin_users[0].name = 'Alice': malformed; accepted: a POSIX user name",
        id="bad-user-name",
    ),
    pytest.param(
        {"admin_users": [{"ssh_keys": [ED25519]}]},
        "admin_users[0].name = None: missing; accepted: a POSIX user name",
        id="admin-without-name",
    ),
    pytest.param(
        {"admin_users": [{"name": "root", "ssh_keys": [ED25519]}]},
        "admin_users[0].name = 'root': root is not an admin user",
        id="root-as-admin",
    ),
    pytest.param(
        {"admin_users": [{"name": "al"}, {"name": "al"}]},
        "admin_users[1].name = 'al': duplicate user; accepted: unique names",
        id="duplicate-admin",
    ),
    pytest.param(
        {"admin_users": {"name": "al"}},
        "admin_users = {'name': 'al'}: wrong type; accepted: a list of a mapping with keys",
        id="admin-users-not-a-list",
    ),
    pytest.param(
        {"tls": {"names": ["bad_name.example"]}},
        "tls.names[0] = 'bad_name.example': malformed; accepted: DNS names",
        id="tls-bad-dns-name",
    ),
    pytest.param(
        {"tls": {"renew_before_days": 400, "validity_days": 365}},
        "tls.renew_before_days = 400: out of range; accepted: an integer from 1 to 365",
        id="tls-renew-window-out-of-range",
    ),
    pytest.param(
        {"tls": {"renew_before_days": 90, "validity_days": 60}},
        "tls.renew_before_days = 90: not below validity_days (60), so every run would re-issue",
        id="tls-renew-window-longer-than-validity",
    ),
    pytest.param(
        {"apt": {"cuda_repo_url": "ftp://mirror/cuda"}},
        "apt.cuda_repo_url = 'ftp://mirror/cuda': malformed",
        id="mirror-url-scheme",
    ),
    pytest.param(
        {"nccl": {"env": {"NCCL_SOCKET_IFACE": "eth0"}}},
        "nccl.env.NCCL_SOCKET_IFACE = 'eth0': unknown NCCL variable",
        id="unknown-nccl-variable",
    ),
    pytest.param(
        {"infiniband": {"ipoib": [{"name": "ib0", "address": "192.168.100.11"}]}},
        "infiniband.ipoib[0].address = '192.168.100.11': prefix length missing",
        id="ipoib-address-without-prefix",
    ),
    pytest.param(
        {"expected_hardware": {"ib_rate_gbps": 300}},
        "expected_hardware.ib_rate_gbps = 300: not an accepted value; accepted: one of 10, 20",
        id="impossible-ib-rate",
    ),
    pytest.param(
        {"expected_hardware": {"gpu_count": -1}},
        "expected_hardware.gpu_count = -1: out of range; accepted: an integer from 0 to 16",
        id="negative-gpu-count",
    ),
    pytest.param(
        {"gpu_settings": {"mig": True}, "expected_hardware": {"gpu_model": "NVIDIA L40S"}},
        "gpu_settings.mig = True: expected_hardware.gpu_model 'NVIDIA L40S' does not support MIG",
        id="mig-on-non-mig-gpu",
    ),
    pytest.param(
        {"gpu_settings": {"mig_layout": ["3g.40gb"]}},
        "gpu_settings.mig_layout = ['3g.40gb']: a MIG layout needs gpu_settings.mig: true",
        id="mig-layout-without-mig",
    ),
    pytest.param(
        {"nvme_cache": {"enabled": True}},
        "nvme_cache.devices = []: no way to choose drives; accepted: devices, or match_model",
        id="nvme-cache-without-devices",
    ),
    pytest.param(
        {"nvme_cache": {"mount_point": "/var"}},
        "nvme_cache.mount_point = '/var': a system directory",
        id="nvme-cache-on-system-directory",
    ),
    pytest.param(
        {"container_runtime": {"engines": ["podman"]}},
        "container_runtime.engines[0] = 'podman': not an accepted value; accepted: one of "
        "'docker', 'containerd'",
        id="unknown-container-engine",
    ),
]


@pytest.mark.parametrize(("data", "message"), BAD_INPUTS)
def test_bad_input_gets_exactly_one_precise_message(data: dict, message: str) -> None:
    messages = problems_of(data)
    assert len(messages) == 1, messages
    assert message in messages[0]
    assert messages[0].startswith("inventories/test.py: host node-1: ")


def test_weak_rsa_key_is_refused_with_its_size() -> None:
    (message,) = problems_of({"admin_users": [{"name": "al", "ssh_keys": [RSA_1024]}]})
    assert "admin_users[0].ssh_keys[0] = 'ssh-rsa AAAA" in message
    assert ": RSA key of 1024 bits is too weak; accepted: " in message


def test_every_problem_is_reported_not_just_the_first() -> None:
    messages = problems_of({"sshd": {"port": 0, "max_auth_tries": 99}, "bogus": 1})
    assert [m.split(": ")[2].split(" = ")[0] for m in messages] == [
        "bogus",
        "sshd.port",
        "sshd.max_auth_tries",
    ]


def test_the_exporters_gpunode_runs_are_the_ports_the_firewall_opens() -> None:
    state, problems = build_desired_state({})
    assert problems == [] and state.exporter_ports == ()
    state, problems = build_desired_state(
        {
            "tls": {"enabled": True},
            "node_exporter": {"enabled": True, "port": 9101},
            "dcgm": {"enabled": True, "exporter": True, "cuda_major": 13},
        }
    )
    assert problems == [] and state.exporter_ports == (9101, 9400)
    state, problems = build_desired_state({"dcgm": {"enabled": False, "exporter": True}})
    assert problems == [] and state.exporter_ports == ()


def test_defaults_are_valid_and_safe() -> None:
    state, problems = build_desired_state({})
    assert problems == []
    assert state == DesiredState()
    assert state.nvidia_driver.source == "none"
    assert state.nvidia_driver.reboot == "never"
    assert state.firewall.admin_networks == ("0.0.0.0/0", "::/0")
    assert state.sshd.permit_root_login == "no"


def test_pyinfra_and_operator_keys_pass_through() -> None:
    assert problems_of({"ssh_user": "debian", "_sudo": True, "x_rack": "r12"}) == []


def test_valid_data_builds_typed_state() -> None:
    state, problems = build_desired_state(
        {
            "admin_users": [{"name": "alice", "ssh_keys": [ED25519]}],
            "nvidia_driver": {"source": "nvidia", "branch": "570", "version": "570.195.03-1"},
            "fabric_manager": {"version": "570.195.03-1"},
            "cuda": {"versions": ["12.6", "12.8"], "default": "12.8"},
            "expected_hardware": {"nvswitch": True, "gpu_count": 8},
        }
    )
    assert problems == []
    assert state.admin_users[0].ssh_keys == (ED25519,)
    assert state.nvidia_driver.driver_version == "570.195.03"
    assert state.needs_fabric_manager


def test_upstream_version_strips_epoch_and_revision() -> None:
    assert upstream_version("1:550.127.08-1") == "550.127.08"
    assert upstream_version("535.216.01-1~deb12u1") == "535.216.01"


def test_invalid_inventory_lists_every_host_and_changes_nothing() -> None:
    with pytest.raises(InvalidInventory) as raised:
        validate_hosts(
            "inventories/prod.py",
            [("good", {}), ("bad-1", {"sshd": {"port": 0}}), ("bad-2", {"cuda": 1})],
        )
    text = str(raised.value)
    assert "2 problems; nothing was changed on any host" in text
    assert "inventories/prod.py: host bad-1: sshd.port = 0: out of range" in text
    assert "inventories/prod.py: host bad-2: cuda = 1: wrong type" in text


@pytest.mark.parametrize("inventory", ["prod", "staging", "vagrant"])
def test_shipped_inventories_validate(inventory: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpunode.cli", "validate", f"inventories/{inventory}.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "desired state valid" in result.stdout


def test_validate_command_names_inventory_host_and_key(tmp_path: Path) -> None:
    inventory = tmp_path / "broken.py"
    inventory.write_text('h100_nodes = [("gpu-1", {"firewall": {"enabled": "yes"}})]\n')
    result = subprocess.run(
        [sys.executable, "-m", "gpunode.cli", "validate", str(inventory)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2  # invalid data: a configuration error, never "findings"
    assert (
        f"{inventory}: host gpu-1: firewall.enabled = 'yes': wrong type; accepted: true or false"
        in result.stderr
    )


def test_data_overrides_are_validated_as_a_deploy_s_would_be(tmp_path: Path) -> None:
    inventory = tmp_path / "fleet.py"
    inventory.write_text('h100_nodes = [("gpu-1", {})]\n')

    def validate(*data: str) -> subprocess.CompletedProcess[str]:
        arguments = [argument for pair in data for argument in ("--data", pair)]
        return subprocess.run(
            [sys.executable, "-m", "gpunode.cli", "validate", str(inventory), *arguments],
            cwd=ROOT, capture_output=True, text=True,
        )  # fmt: skip

    good = validate('audit={"file_integrity": {"enabled": true}}')
    assert good.returncode == 0, good.stderr
    bad = validate('audit={"file_integrity": {"enabled": true, "schedule": "daily; reboot"}}')
    assert bad.returncode == 2
    assert "host gpu-1: audit.file_integrity.schedule = 'daily; reboot': malformed" in bad.stderr
    malformed = validate("audit")
    assert malformed.returncode == 2 and "--data 'audit': not KEY=VALUE" in malformed.stderr


def test_defaults_command_documents_every_setting() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpunode.cli", "defaults"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "nvidia_driver.reboot" in result.stdout and "'never'" in result.stdout
    assert "sshd.max_auth_tries" in result.stdout


# --- issue 12: inventory data that passed validation and injected --------------------------


def _ssh_string(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def _key_line(key_type: str, *fields: bytes) -> str:
    blob = _ssh_string(key_type.encode()) + b"".join(_ssh_string(f) for f in fields)
    return f"{key_type} {base64.b64encode(blob).decode()} x@y"


def problem_at(data: dict, key: str) -> str:
    """The one rendered problem for ``key`` (the data may name it, others may not)."""
    found = [m for m in problems_of(data) if m.split(": ", 2)[2].startswith(f"{key} = ")]
    assert len(found) == 1, problems_of(data)
    return found[0]


INJECTED = [
    pytest.param(
        {"sshd": {"listen_addresses": [LISTEN_INJECTION]}},
        "sshd.listen_addresses[0]",
        "contains a control character (U+000A)",
        id="listen-address-zone-id-with-sshd-directives",
    ),
    pytest.param(
        {"sshd": {"listen_addresses": ["fe80::1%eth0;x"]}},
        "sshd.listen_addresses[0]",
        "the zone id after '%' is not an interface name",
        id="listen-address-zone-id-not-an-interface",
    ),
    pytest.param(
        {"infiniband": {"ipoib": [{"name": "ib0", "address": IPOIB_INJECTION}]}},
        "infiniband.ipoib[0].address",
        "contains a control character (U+000A)",
        id="ipoib-address-with-up-hook",
    ),
    pytest.param(
        {"infiniband": {"ipoib": [{"name": "ib0", "address": "fe80::1%ib0/64"}]}},
        "infiniband.ipoib[0].address",
        "an IPv6 zone id is not accepted here",
        id="ipoib-address-zone-id",
    ),
    pytest.param(
        {"apt": {"proxy": APT_PROXY_INJECTION}},
        "apt.proxy",
        "malformed",
        id="apt-proxy-pre-invoke",
    ),
    pytest.param(
        {"apt": {"proxy": "http://proxy:99999"}},
        "apt.proxy",
        "port 99999 is not from 1 to 65535",
        id="apt-proxy-port-out-of-range",
    ),
    pytest.param(
        {"apt": {"debian_mirror": "http://mirror/debian\nTypes: deb"}},
        "apt.debian_mirror",
        "contains a control character (U+000A)",
        id="mirror-url-with-second-deb822-field",
    ),
    pytest.param(
        {"apt": {"cuda_repo_url": "http://mirror/cuda repo"}},
        "apt.cuda_repo_url",
        "malformed",
        id="repository-url-with-space",
    ),
    pytest.param(
        {"nvme_cache": {"mount_point": "/raid$(touch${IFS}/tmp/PWNED)"}},
        "nvme_cache.mount_point",
        "has a character outside letters, digits and ._+@-",
        id="mount-point-command-substitution",
    ),
    pytest.param(
        {"nvme_cache": {"mount_point": "/etc/"}},
        "nvme_cache.mount_point",
        "ends with '/'",
        id="mount-point-etc-with-slash",
    ),
    pytest.param(
        {"nvme_cache": {"mount_point": "/raid/../etc"}},
        "nvme_cache.mount_point",
        "has a '.' or '..' component",
        id="mount-point-dot-dot",
    ),
    pytest.param(
        {"nvme_cache": {"mount_point": "/boot/efi"}},
        "nvme_cache.mount_point",
        "inside /boot",
        id="mount-point-boot-efi",
    ),
    pytest.param(
        {"nvme_cache": {"mount_point": "/var/lib/docker"}},
        "nvme_cache.mount_point",
        "inside /var",
        id="mount-point-under-var",
    ),
    pytest.param(
        {"nvme_cache": {"mount_point": "/raid//x"}},
        "nvme_cache.mount_point",
        "has an empty component ('//')",
        id="mount-point-double-slash",
    ),
    pytest.param(
        {"admin_users": [{"name": "al", "ssh_keys": [ED25519 + "\n" + WEAK_KEY_WITH_OPTIONS]}]},
        "admin_users[0].ssh_keys[0]",
        "contains a control character (U+000A)",
        id="ssh-key-second-line-weak-rsa-with-options",
    ),
    pytest.param(
        {"admin_users": [{"name": "al", "ssh_keys": [WEAK_KEY_WITH_OPTIONS]}]},
        "admin_users[0].ssh_keys[0]",
        "options before the key type are not allowed",
        id="ssh-key-options-prefix",
    ),
    pytest.param(
        {"admin_users": [{"name": "al", "ssh_keys": [_key_line("ssh-ed25519", b"")]}]},
        "admin_users[0].ssh_keys[0]",
        "key data is not a 32-byte Ed25519 key",
        id="ssh-key-ed25519-empty-blob",
    ),
    pytest.param(
        {"admin_users": [{"name": "al", "ssh_keys": [_key_line("ssh-ed25519")]}]},
        "admin_users[0].ssh_keys[0]",
        "key data is not a 32-byte Ed25519 key",
        id="ssh-key-ed25519-type-only",
    ),
    pytest.param(
        {
            "admin_users": [
                {"name": "al", "ssh_keys": [_key_line("ecdsa-sha2-nistp256", b"nistp384", b"\4")]}
            ]
        },
        "admin_users[0].ssh_keys[0]",
        "key data does not name the curve nistp256",
        id="ssh-key-ecdsa-wrong-curve",
    ),
    pytest.param(
        {"admin_users": [{"name": "al", "ssh_keys": [_key_line("ssh-rsa", b"\1\0\1")]}]},
        "admin_users[0].ssh_keys[0]",
        "key data is not an RSA exponent and modulus",
        id="ssh-key-rsa-without-modulus",
    ),
    pytest.param(
        {"admin_users": [{"name": "al", "ssh_keys": [ED25519 + "\x1b[2J"]}]},
        "admin_users[0].ssh_keys[0]",
        "contains a control character (U+001B)",
        id="ssh-key-comment-with-escape",
    ),
    pytest.param(
        {"nccl": {"env": {"NCCL_DEBUG": "WARN\nNCCL_NET_PLUGIN=/tmp/evil"}}},
        "nccl.env.NCCL_DEBUG",
        "contains a control character (U+000A)",
        id="nccl-value-with-newline",
    ),
    pytest.param(
        {"nccl": {"env": {"NCCL_SOCKET_IFNAME": "eth0 lo"}}},
        "nccl.env.NCCL_SOCKET_IFNAME",
        "malformed",
        id="nccl-value-with-space",
    ),
    pytest.param(
        {"kernel": {"sysctls": {"vm.max_map_count": "262144\nkernel.modprobe = /tmp/x"}}},
        "kernel.sysctls.vm.max_map_count",
        "contains a control character (U+000A)",
        id="sysctl-value-with-newline",
    ),
    pytest.param(
        {"kernel": {"sysctls": {"vm.max_map_count": " 262144"}}},
        "kernel.sysctls.vm.max_map_count",
        "malformed",
        id="sysctl-value-with-outer-blank",
    ),
    pytest.param(
        {"firewall": {"admin_networks": ["fe80::%eth0/64"]}},
        "firewall.admin_networks[0]",
        "an IPv6 zone id has no place in a network",
        id="cidr-with-zone-id",
    ),
    pytest.param(
        {"tls": {"ip_addresses": ["fe80::1%eth0"]}},
        "tls.ip_addresses[0]",
        "an IPv6 zone id is not accepted here",
        id="tls-ip-with-zone-id",
    ),
    pytest.param(
        {"firewall": {"enabled": True, "admin_networks": []}},
        "firewall.admin_networks",
        "empty while the firewall is enabled, so SSH would be dropped from everywhere",
        id="firewall-without-admin-networks",
    ),
    pytest.param(
        {"gpu_settings": {"application_clocks": {}}},
        "gpu_settings.application_clocks.memory_mhz",
        "missing",
        id="application-clocks-empty",
    ),
    pytest.param(
        {"gpu_settings": {"application_clocks": {"memory_mhz": 2619}}},
        "gpu_settings.application_clocks.graphics_mhz",
        "missing",
        id="application-clocks-half",
    ),
    pytest.param(
        {"admin_users": [{"name": "sshd", "ssh_keys": [ED25519]}]},
        "admin_users[0].name",
        "a system account, not a personal one",
        id="system-account-as-admin",
    ),
    pytest.param(
        {"admin_users": [{"name": "systemd-network", "ssh_keys": [ED25519]}]},
        "admin_users[0].name",
        "a system account, not a personal one",
        id="systemd-account-as-admin",
    ),
    pytest.param(
        {"nvme_cache": {"match_model": "SAMSUNG\u2028x"}},
        "nvme_cache.match_model",
        "contains a line separator (U+2028)",
        id="line-separator-in-free-text",
    ),
    pytest.param(
        {"expected_hardware": {"gpu_model": "NVIDIA \ud800"}},
        "expected_hardware.gpu_model",
        "contains a lone surrogate (U+D800)",
        id="lone-surrogate",
    ),
    pytest.param(
        {"expected_hardware": {"gpu_model": "NVIDIA \x85H100"}},
        "expected_hardware.gpu_model",
        "contains a control character (U+0085)",
        id="c1-control",
    ),
]


@pytest.mark.parametrize(("data", "key", "reason"), INJECTED)
def test_injecting_inventory_data_is_refused_naming_its_key(
    data: dict, key: str, reason: str
) -> None:
    message = problem_at(data, key)
    assert f": {reason}" in message
    assert "\n" not in message and "\x1b" not in message


def test_link_local_listen_address_with_interface_zone_is_accepted() -> None:
    state, problems = build_desired_state(
        {"sshd": {"listen_addresses": ["fe80::1%eth0", "10.0.0.1", "::1"]}}
    )
    assert problems == []
    assert state.sshd.listen_addresses == ("fe80::1%eth0", "10.0.0.1", "::1")


def test_plain_urls_paths_and_keys_still_validate() -> None:
    state, problems = build_desired_state(
        {
            "apt": {
                "proxy": "http://[fd00::1]:3142",
                "debian_mirror": "https://mirror.example:8443/debian/%7Eprod",
                "direct_hosts": ["mirror.internal"],
            },
            "nvme_cache": {"mount_point": "/mnt/nvme-cache"},
            "kernel": {"sysctls": {"net.ipv4.tcp_rmem": "4096 87380 16777216"}},
            "nccl": {"env": {"NCCL_SOCKET_IFNAME": "^docker0,lo", "NCCL_IB_HCA": "=mlx5_0:1"}},
            "admin_users": [{"name": "alice", "ssh_keys": [ED25519, RSA_3072, ECDSA_384]}],
        }
    )
    assert problems == []
    assert state.nvme_cache.mount_point == "/mnt/nvme-cache"


def test_tls_host_name_longer_than_a_common_name_is_refused() -> None:
    host_name = ".".join(["abcdefghij" * 2] * 4) + ".ab"
    assert len(host_name) == 86
    with pytest.raises(InvalidInventory) as raised:
        validate_hosts("inventories/prod.py", [(host_name, {"tls": {"enabled": True}})])
    assert (
        f"host {host_name}: tls.enabled = True: the host name is 86 characters, longer than a "
        "common name may be" in str(raised.value)
    )
    # Without TLS the name is only pyinfra's, and a long one is fine.
    validate_hosts("inventories/prod.py", [(host_name, {})])


def test_tls_host_name_with_a_zone_id_is_refused() -> None:
    with pytest.raises(InvalidInventory, match="neither a DNS name nor an IP address"):
        validate_hosts("inventories/prod.py", [("fe80::1%eth0", {"tls": {"enabled": True}})])


def test_validate_renders_escape_sequences_in_keys_and_values_as_text() -> None:
    messages = problems_of(
        {
            "\x1b[2Jbogus": 1,
            "kernel": {"sysctls": {"vm.\x1b]0;owned\x07x": "1"}},
            "expected_hardware": {"gpu_model": "\x1b[31mH100\x00"},
        }
    )
    assert len(messages) == 3, messages
    for message in messages:
        assert message.isprintable(), message
    assert messages[0].startswith("inventories/test.py: host node-1: \\x1b[2Jbogus = 1: ")
    assert "kernel.sysctls.vm.\\x1b]0;owned\\x07x = " in messages[1]


def test_host_name_with_escape_sequence_is_rendered_as_text() -> None:
    with pytest.raises(InvalidInventory) as raised:
        validate_hosts("inventories/x.py", [("gpu-1\x1b[2J", {"sshd": {"port": 0}})])
    assert "host gpu-1\\x1b[2J: sshd.port = 0" in str(raised.value)
    assert "\x1b" not in str(raised.value)


def test_validate_command_prints_no_escape_sequence_from_the_inventory(tmp_path: Path) -> None:
    inventory = tmp_path / "hostile.py"
    inventory.write_text(
        'h100_nodes = [("gpu-1", {"kernel": {"sysctls": {"vm.\\x1b[2J\\x1b[H": "1"}},'
        ' "nccl": {"env": {"NCCL_DEBUG": "WARN\\nforged: line"}}})]\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "gpunode.cli", "validate", str(inventory)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "\x1b" not in result.stderr
    assert "kernel.sysctls.vm.\\x1b[2J\\x1b[H = " in result.stderr
    assert not any(line.startswith("forged") for line in result.stderr.splitlines())

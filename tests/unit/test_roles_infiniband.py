"""InfiniBand role: module loading (or why not), memlock, IPoIB, subnet manager; facts parsing."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
from pyinfra.api import OperationError
from pyinfra.facts.files import File, FileContents, FindFiles, FindInFile

from facts.fabric import (
    KernelModuleStatus,
    MemlockLimit,
    NetworkInterfaces,
    UnitState,
    parse_ip_addresses,
    parse_memlock,
    parse_module_status,
    parse_unit_state,
)
from gpunode.model import IpoibInterface, build_desired_state
from roles.infiniband import (
    has_hcas,
    interfaces_sources_directory,
    ipoib_up,
    memlock_reported,
    modules_loaded,
    netplan_ipoib,
    netplan_path,
    opensm_running,
    opensm_stopped,
    rdma_modules,
    render_ipoib,
    render_modules_load,
    render_netplan_ipoib,
    stale_ipoib_files_removed,
    stale_netplan_ipoib_removed,
)

from .fakehost import commands_of

MODULES = ["ib_umad", "ib_ipoib", "nvidia_peermem"]
IB0 = IpoibInterface(name="ib0", address="192.168.100.11/24", mtu=2044)


def module_status(container: str = "none", **modules: tuple[bool, bool]) -> dict[str, Any]:
    return {
        "container": container,
        "modules": {
            name: {"loaded": loaded, "available": available}
            for name, (loaded, available) in modules.items()
        },
    }


def interface(mtu: int = 2044, addresses: tuple[str, ...] = (), state: str = "UP") -> dict:
    return {"mtu": mtu, "operstate": state, "addresses": list(addresses)}


def unit(installed: bool = True, active: bool = False, enabled: bool = False) -> dict[str, Any]:
    return {"installed": installed, "active": active, "enabled": enabled, "unit_file_state": None}


# --- which modules ---------------------------------------------------------------------------


def desired(**data: Any):  # type: ignore[no-untyped-def]
    state, problems = build_desired_state(data)
    assert problems == []
    return state


def test_gpu_nodes_with_hcas_also_load_gpudirect_rdma() -> None:
    gpu_node = desired(expected_hardware={"gpu_count": 8})
    assert rdma_modules(gpu_node, hcas=True) == MODULES
    assert rdma_modules(gpu_node, hcas=False) == ["ib_umad", "ib_ipoib"]
    assert rdma_modules(desired(), hcas=True) == ["ib_umad", "ib_ipoib"]
    assert rdma_modules(desired(nvidia_driver={"source": "debian"}), hcas=True) == MODULES


def test_hcas_are_known_from_sysfs_ibstat_or_expected_hardware() -> None:
    none = {"state": "absent", "reason": "no ibstat"}
    assert has_hcas(desired(), ["mlx5_0"], none)
    assert has_hcas(desired(), [], {"state": "ok", "cas": [{"name": "mlx5_0"}]})
    assert has_hcas(desired(expected_hardware={"ib_port_count": 4}), [], none)
    assert not has_hcas(desired(), [], none)


def test_modules_load_file_lists_one_module_per_line() -> None:
    assert render_modules_load(MODULES).splitlines()[1:] == MODULES


# --- modules now -----------------------------------------------------------------------------


def test_modules_are_loaded_with_modprobe_on_a_host() -> None:
    status = module_status(
        ib_umad=(True, True), ib_ipoib=(False, True), nvidia_peermem=(False, True)
    )
    commands, noops = commands_of(modules_loaded, {KernelModuleStatus: status}, modules=MODULES)
    assert commands == ["modprobe ib_ipoib", "modprobe nvidia_peermem"]
    assert noops == ["kernel modules already loaded: ib_umad"]


def test_a_container_reports_every_module_it_cannot_load() -> None:
    status = module_status(
        "docker", ib_umad=(False, False), ib_ipoib=(False, False), nvidia_peermem=(False, False)
    )
    commands, noops = commands_of(modules_loaded, {KernelModuleStatus: status}, modules=MODULES)
    assert commands == []
    assert noops == [
        f"kernel module {module} not loaded: this is a docker container, which cannot load "
        "kernel modules (the host's kernel must have it loaded); "
        "/etc/modules-load.d/gpunode-rdma.conf loads it at boot on a real node"
        for module in MODULES
    ]


def test_all_loaded_is_a_noop() -> None:
    status = module_status(ib_umad=(True, True), ib_ipoib=(True, True))
    commands, noops = commands_of(
        modules_loaded, {KernelModuleStatus: status}, modules=["ib_umad", "ib_ipoib"]
    )
    assert (commands, noops) == ([], ["kernel modules already loaded: ib_umad, ib_ipoib"])


def test_peermem_before_the_driver_is_reported_not_fatal() -> None:
    status = module_status(
        ib_umad=(True, True), ib_ipoib=(True, True), nvidia_peermem=(False, False)
    )
    commands, noops = commands_of(modules_loaded, {KernelModuleStatus: status}, modules=MODULES)
    assert commands == []
    assert noops[1].startswith("kernel module nvidia_peermem not loaded: the running kernel")


def test_a_kernel_without_ib_modules_fails_the_host() -> None:
    status = module_status(ib_umad=(False, False), ib_ipoib=(False, True))
    with pytest.raises(OperationError, match="the running kernel has no module ib_umad"):
        commands_of(modules_loaded, {KernelModuleStatus: status}, modules=["ib_umad", "ib_ipoib"])


# --- memlock ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "note"),
    [
        ({"container": "none", "hard_kib": None, "can_raise": True}, "memlock hard limit is "
         "already unlimited"),
        ({"container": "none", "hard_kib": 8192, "can_raise": True}, "memlock unlimited from "
         "the next login (hard limit now 8192 KiB)"),
        ({"container": "docker", "hard_kib": 8192, "can_raise": False}, "memlock stays at 8192 "
         "KiB for logins: root lacks CAP_SYS_RESOURCE here (docker container), so pam_limits "
         "cannot raise it; /etc/security/limits.d/gpunode-rdma.conf takes effect on a real node"),
    ],
)  # fmt: skip
def test_memlock_is_reported_never_changed(limit: dict, note: str) -> None:
    assert commands_of(memlock_reported, {MemlockLimit: limit}) == ([], [note])


def test_memlock_fact_reads_limit_and_capability() -> None:
    lines = ["container=docker", "hard=8192", "capbnd=00000000a80425fb"]
    assert parse_memlock(lines) == {"container": "docker", "hard_kib": 8192, "can_raise": False}
    host_lines = ["container=none", "hard=unlimited", "capbnd=000001ffffffffff"]
    assert parse_memlock(host_lines) == {"container": "none", "hard_kib": None, "can_raise": True}


# --- IPoIB -----------------------------------------------------------------------------------


def test_ipoib_file_is_an_ifupdown_static_stanza() -> None:
    assert render_ipoib(IB0).splitlines()[1:] == [
        "auto ib0",
        "iface ib0 inet static",
        "    address 192.168.100.11/24",
        "    mtu 2044",
    ]


def test_large_mtu_selects_connected_mode_and_ipv6_uses_inet6() -> None:
    big = IpoibInterface(name="ib1", address="fd00::11/64", mtu=65520)
    lines = render_ipoib(big).splitlines()
    assert "iface ib1 inet6 static" in lines
    assert lines[-1] == "    pre-up echo connected > /sys/class/net/ib1/mode"
    assert "pre-up" not in render_ipoib(IpoibInterface("ib2", "10.0.0.1/24", 4092))


def test_missing_ipoib_interface_is_reported() -> None:
    commands, noops = commands_of(
        ipoib_up, {NetworkInterfaces: {"eth0": interface(1500)}}, interface=IB0
    )
    assert commands == []
    assert noops == [
        "ib0 does not exist on this node (no IPoIB port: no HCA, or ib_ipoib not loaded); "
        "/etc/network/interfaces.d/gpunode-ipoib-ib0 brings it up at boot"
    ]


def test_missing_interface_is_brought_up_when_this_run_loads_ib_ipoib() -> None:
    commands, _ = commands_of(
        ipoib_up, {NetworkInterfaces: {}}, interface=IB0, ipoib_module_loading=True
    )
    assert commands == ["ifup ib0"]


def test_configured_interface_is_a_noop() -> None:
    live = {"ib0": interface(2044, ("192.168.100.11/24", "fe80::1/64"), "UNKNOWN")}
    commands, noops = commands_of(ipoib_up, {NetworkInterfaces: live}, interface=IB0)
    assert (commands, noops) == ([], ["ib0 is up with 192.168.100.11/24, MTU 2044"])


@pytest.mark.parametrize(
    "live",
    [
        interface(2044, ("192.168.100.12/24",)),  # another address
        interface(1500, ("192.168.100.11/24",)),  # another MTU
        interface(2044, ("192.168.100.11/24",), "DOWN"),
        interface(2044, ()),
    ],
)
def test_interface_that_differs_is_reset_and_brought_up(live: dict) -> None:
    commands, _ = commands_of(ipoib_up, {NetworkInterfaces: {"ib0": live}}, interface=IB0)
    assert commands == ["ifdown --force ib0 2>/dev/null; ip address flush dev ib0; ifup ib0"]


def test_only_stale_gpunode_ipoib_files_go() -> None:
    present = [
        "/etc/network/interfaces.d/gpunode-ipoib-ib0",
        "/etc/network/interfaces.d/gpunode-ipoib-ib3",
    ]
    commands, _ = commands_of(
        stale_ipoib_files_removed,
        {FindFiles: present},
        keep=["/etc/network/interfaces.d/gpunode-ipoib-ib0"],
    )
    assert commands == [
        "ifdown --force ib3 2>/dev/null; rm -f /etc/network/interfaces.d/gpunode-ipoib-ib3"
    ]
    assert commands_of(stale_ipoib_files_removed, {FindFiles: []}, keep=[]) == (
        [],
        ["no other gpunode IPoIB interface files"],
    )


def test_stale_ipoib_file_names_from_the_node_are_quoted() -> None:
    # The file names are node output: a planted name must stay one word of the command.
    planted = "/etc/network/interfaces.d/gpunode-ipoib-ib9;touch $(id) PWNED"
    commands, _ = commands_of(stale_ipoib_files_removed, {FindFiles: [planted]}, keep=[])
    words = shlex.split(commands[0])
    assert "ib9;touch $(id) PWNED" in words and planted in words
    assert "touch" not in words


def test_ipoib_renderer_refuses_a_second_line() -> None:
    # Validation refuses it (tests/unit/test_model.py); the renderer asserts it too.
    with pytest.raises(ValueError, match="control character"):
        render_ipoib(IpoibInterface("ib0", "fe80::1%ib0\n    up reboot/64", 2044))


# --- subnet manager --------------------------------------------------------------------------


def test_opensm_enabled_and_started_where_an_hca_answers() -> None:
    commands, _ = commands_of(opensm_running, {UnitState: unit(enabled=False), File: {"mode": 444}})
    assert commands == ["systemctl enable opensm.service", "systemctl start opensm.service"]


def test_opensm_without_mad_interface_is_reported() -> None:
    commands, noops = commands_of(opensm_running, {UnitState: unit(enabled=True), File: None})
    assert commands == []
    assert noops[0].startswith("opensm is enabled but not started: /sys/class/infiniband_mad/")


def test_running_opensm_is_a_noop() -> None:
    facts: dict[type, Any] = {UnitState: unit(enabled=True, active=True), File: {"mode": 444}}
    assert commands_of(opensm_running, facts) == ([], ["opensm is running"])


def test_opensm_is_stopped_and_disabled_where_not_wanted() -> None:
    commands, _ = commands_of(opensm_stopped, {UnitState: unit(active=True, enabled=True)})
    assert commands == ["systemctl stop opensm.service", "systemctl disable opensm.service"]
    assert commands_of(opensm_stopped, {UnitState: unit(installed=False)}) == (
        [],
        ["opensm is not installed"],
    )
    assert commands_of(opensm_stopped, {UnitState: unit()}) == (
        [],
        ["opensm is stopped and disabled"],
    )


# --- facts -----------------------------------------------------------------------------------


def test_interfaces_fact_reads_ip_json_and_falls_back_to_names() -> None:
    text = (
        '[{"ifname":"lo","mtu":65536,"operstate":"UNKNOWN","addr_info":[{"family":"inet",'
        '"local":"127.0.0.1","prefixlen":8}]},{"ifname":"ib0","mtu":2044,"operstate":"UP",'
        '"addr_info":[{"family":"inet","local":"10.9.0.1","prefixlen":24},{"family":"inet6",'
        '"local":"fe80::1","prefixlen":64}]}]'
    )
    assert parse_ip_addresses(text) == {
        "lo": {"mtu": 65536, "operstate": "UNKNOWN", "addresses": ["127.0.0.1/8"]},
        "ib0": {"mtu": 2044, "operstate": "UP", "addresses": ["10.9.0.1/24", "fe80::1/64"]},
    }
    assert list(parse_ip_addresses("eth0\nlo\n")) == ["eth0", "lo"]


def test_module_fact_reads_container_and_each_module() -> None:
    lines = ["container=docker", "module=ib_umad loaded=no available=no", "module=md_mod "
             "loaded=yes available=yes"]  # fmt: skip
    assert parse_module_status(lines) == {
        "container": "docker",
        "modules": {
            "ib_umad": {"loaded": False, "available": False},
            "md_mod": {"loaded": True, "available": True},
        },
    }


def test_unit_fact() -> None:
    assert parse_unit_state(["LoadState=loaded", "ActiveState=inactive", "UnitFileState=enabled"])[
        "enabled"
    ]
    assert not parse_unit_state(["LoadState=not-found", "ActiveState=inactive", "UnitFileState="])[
        "installed"
    ]


def test_opensm_about_to_be_installed_is_left_to_its_package() -> None:
    assert commands_of(opensm_running, {UnitState: unit(installed=False), File: None}) == (
        [],
        ["opensm is installed by this run; its package enables it"],
    )


@pytest.mark.parametrize(
    ("source_lines", "ifup", "commands"),
    [
        (["source /etc/network/interfaces.d/*"], {"mode": 755}, []),
        (None, None, []),  # ifupdown (installed later in the run) writes the file
        (
            None,
            {"mode": 755},
            ["echo 'source /etc/network/interfaces.d/*' >> /etc/network/interfaces"],
        ),
        (
            [],
            {"mode": 755},
            ["echo 'source /etc/network/interfaces.d/*' >> /etc/network/interfaces"],
        ),
    ],
)
def test_interfaces_file_reads_the_directory(
    source_lines: list[str] | None, ifup: dict | None, commands: list[str]
) -> None:
    found, notes = commands_of(interfaces_sources_directory, {FindInFile: source_lines, File: ifup})
    assert found == commands
    assert len(notes) == (0 if commands else 1)


def test_an_ipoib_interface_declared_twice_is_a_validation_error() -> None:
    ipoib = [{"name": "ib0", "address": "10.0.0.1/24"}, {"name": "ib0", "address": "10.0.1.1/24"}]
    _, problems = build_desired_state({"infiniband": {"enabled": True, "ipoib": ipoib}})
    assert [problem.render("inv.py", "n") for problem in problems] == [
        "inv.py: host n: infiniband.ipoib[1].name = 'ib0': duplicate interface; accepted: one "
        "entry per interface"
    ]


# --- IPoIB on a netplan release (Ubuntu) ---------------------------------------------------

NETPLAN_IB0 = """\
# Managed by gpunode (infiniband.ipoib); local edits are replaced.
network:
  version: 2
  ethernets:
    ib0:
      addresses:
        - "192.168.100.11/24"
      mtu: 2044
"""


def test_an_ipoib_interface_is_a_netplan_file_of_its_own_connected_mode_only_when_asked() -> None:
    assert netplan_path(IB0) == "/etc/netplan/60-gpunode-ipoib-ib0.yaml"
    assert render_netplan_ipoib(IB0) == NETPLAN_IB0
    connected = IpoibInterface(name="ib1", address="fd00::11/64", mtu=65520)
    assert render_netplan_ipoib(connected).endswith(
        '    ib1:\n      addresses:\n        - "fd00::11/64"\n      mtu: 65520\n'
        "      infiniband-mode: connected\n"
    )


def netplan_facts(content: str | None, mode: int = 600, live: dict | None = None) -> dict:
    return {
        FileContents: None if content is None else content.rstrip("\n").split("\n"),
        File: None if content is None else {"mode": mode},
        NetworkInterfaces: {} if live is None else {"ib0": live},
    }


def test_the_netplan_file_is_validated_by_netplan_before_it_is_written() -> None:
    commands, noops = commands_of(netplan_ipoib, netplan_facts(None), interface=IB0)
    assert noops == []
    (script,) = commands
    validate = script.index('netplan generate --root-dir "$scratch"')
    write = script.index("install -m 600 -o root -g root")
    assert validate < write
    assert "the netplan configuration is as it was" in script[validate:write]
    # The node's own netplan files are what it is validated beside.
    assert 'cp -a /etc/netplan/. "$scratch"/etc/netplan/' in script
    # Only the IPoIB interface is reconfigured, never the whole network (netplan apply).
    assert "netplan apply" not in script
    assert script.endswith("networkctl reload && networkctl reconfigure ib0; fi")


def test_a_netplan_file_in_place_is_left_alone_and_says_where_the_interface_is() -> None:
    commands, noops = commands_of(netplan_ipoib, netplan_facts(NETPLAN_IB0), interface=IB0)
    assert commands == []
    assert noops == [
        "/etc/netplan/60-gpunode-ipoib-ib0.yaml as declared; ib0 does not exist on this node (no "
        "IPoIB port: no HCA, or ib_ipoib not loaded); netplan brings it up at boot"
    ]
    up = interface(2044, ("192.168.100.11/24",))
    commands, noops = commands_of(netplan_ipoib, netplan_facts(NETPLAN_IB0, live=up), interface=IB0)
    assert commands == [] and noops[0].endswith("ib0 is up with 192.168.100.11/24, MTU 2044")


@pytest.mark.parametrize(
    "facts",
    [
        pytest.param(netplan_facts(NETPLAN_IB0.replace("2044", "4092")), id="edited"),
        pytest.param(netplan_facts(NETPLAN_IB0, mode=644), id="readable-by-others"),
        pytest.param(netplan_facts(NETPLAN_IB0, live=interface(2044)), id="live-without-address"),
    ],
)
def test_a_netplan_file_or_interface_not_as_declared_is_written_and_applied(facts: dict) -> None:
    commands, _ = commands_of(netplan_ipoib, facts, interface=IB0)
    assert len(commands) == 1 and "install -m 600" in commands[0]


def test_stale_netplan_files_go_and_their_interfaces_lose_their_addresses() -> None:
    keep = ["/etc/netplan/60-gpunode-ipoib-ib0.yaml"]
    commands, noops = commands_of(stale_netplan_ipoib_removed, {FindFiles: keep}, keep=keep)
    assert commands == [] and noops == ["no other gpunode IPoIB netplan files"]
    planted = "/etc/netplan/60-gpunode-ipoib-ib1;reboot.yaml"
    commands, _ = commands_of(stale_netplan_ipoib_removed, {FindFiles: [*keep, planted]}, keep=keep)
    assert commands == [
        f"rm -f {shlex.quote(planted)} && netplan generate; "
        f"ip address flush dev {shlex.quote('ib1;reboot')} 2>/dev/null; true"
    ]

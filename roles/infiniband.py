"""InfiniBand / RDMA: user space, kernel modules, locked-memory limits, IPoIB, subnet manager.

* rdma-core, infiniband-diags and ibverbs-utils are installed.
* ib_umad and ib_ipoib (and nvidia_peermem, GPUDirect RDMA, on GPU nodes with HCAs) are
  loaded now and at every boot (/etc/modules-load.d/gpunode-rdma.conf). Where a module cannot
  be loaded from here (inside a container; nvidia_peermem before the NVIDIA driver is
  installed) the run says so for each module instead of failing.
* memlock is unlimited for every login (/etc/security/limits.d/gpunode-rdma.conf): RDMA pins
  the memory it registers. Logins that cannot be granted it (a container without
  CAP_SYS_RESOURCE) are reported.
* IPoIB interfaces are configured with ifupdown, Debian's own network configuration on
  servers: one file per interface in /etc/network/interfaces.d, which Debian's
  /etc/network/interfaces sources; an interface that exists is brought up with ``ifup``.
  Datagram mode up to MTU 4092; a larger MTU selects connected mode (where the HCA offers
  it; ConnectX-4 and later with enhanced IPoIB only do datagram). On a release configured
  by netplan (Ubuntu) each interface is a netplan file of its own instead
  (/etc/netplan/60-gpunode-ipoib-<name>.yaml, mode 600; connected mode as netplan's
  ``infiniband-mode``), which the node's own netplan validates together with the node's
  other netplan files, in a scratch root, before it is written: a configuration netplan
  refuses is refused before anything changes, as it would leave the node's network
  unconfigurable at its next boot. An interface that exists is then reconfigured alone by
  systemd-networkd (``networkctl reconfigure``), never the whole network (``netplan apply``
  would touch the interface the run's own SSH session uses).
* opensm runs where ``subnet_manager`` is set; elsewhere an installed opensm is stopped and
  disabled, so no node becomes a subnet manager by accident.

A kernel without ib_umad or ib_ipoib stops the run at prepare time, before anything changes.
With ``enabled: false`` gpunode's own files (and the IPoIB interfaces they configured) are
removed; packages and a subnet manager set up by hand are left alone.
"""

from __future__ import annotations

import ipaddress
import shlex
from io import StringIO
from typing import Any

from pyinfra import host
from pyinfra.api import OperationError, deploy, operation
from pyinfra.facts.files import File, FileContents, FindFiles, FindInFile
from pyinfra.facts.server import Which
from pyinfra.operations import files

from facts.fabric import (
    KernelModuleStatus,
    MemlockLimit,
    NetworkInterfaces,
    RdmaDevices,
    UnitState,
    module_name,
)
from facts.hardware import InfinibandPorts
from gpunode.converge import this_node
from gpunode.model import DesiredState, IpoibInterface
from gpunode.refusal import NodeRefused
from gpunode.schema import one_line
from roles.packages import install_packages

RDMA_PACKAGES = ["rdma-core", "infiniband-diags", "ibverbs-utils"]
MODULES_LOAD_PATH = "/etc/modules-load.d/gpunode-rdma.conf"
LIMITS_PATH = "/etc/security/limits.d/gpunode-rdma.conf"
INTERFACES_PATH = "/etc/network/interfaces"
INTERFACES_DIR = "/etc/network/interfaces.d"
IPOIB_FILE_PREFIX = "gpunode-ipoib-"
NETPLAN_DIR = "/etc/netplan"
NETPLAN_FILE_PREFIX = "60-gpunode-ipoib-"
# The directories netplan reads its configuration from (netplan generate(8)).
NETPLAN_CONFIG_DIRS = ("/lib/netplan", "/etc/netplan", "/run/netplan")
SOURCE_LINE = "source /etc/network/interfaces.d/*"
CORE_MODULES = ("ib_umad", "ib_ipoib")
PEERMEM_MODULE = "nvidia_peermem"
# Largest IPoIB MTU in datagram mode (4K IB MTU less the 4-byte IPoIB header).
DATAGRAM_MAX_MTU = 4092
OPENSM_UNIT = "opensm.service"
# opensm.service does not start without it (ConditionPathExists): ib_umad and an HCA.
UMAD_ABI_PATH = "/sys/class/infiniband_mad/abi_version"

LIMITS = (
    "# Managed by gpunode (infiniband.memlock_unlimited): RDMA pins the memory it registers.\n"
    "* soft memlock unlimited\n"
    "* hard memlock unlimited\n"
)


# --- modules -----------------------------------------------------------------------------


def is_gpu_node(desired: DesiredState) -> bool:
    hardware = desired.expected_hardware
    return bool(hardware.gpu_count or hardware.gpu_model or desired.nvidia_driver.source != "none")


def has_hcas(desired: DesiredState, sysfs_hcas: list[str], ibstat: dict[str, Any]) -> bool:
    listed = ibstat.get("state") == "ok" and bool(ibstat.get("cas"))
    return bool(sysfs_hcas) or listed or bool(desired.expected_hardware.ib_port_count)


def rdma_modules(desired: DesiredState, hcas: bool) -> list[str]:
    """Modules loaded at boot: IB management and IPoIB; GPUDirect RDMA on GPU nodes with HCAs."""
    modules = list(CORE_MODULES)
    if hcas and is_gpu_node(desired):
        modules.append(PEERMEM_MODULE)
    return modules


def render_modules_load(modules: list[str]) -> str:
    lines = ["# Managed by gpunode (infiniband): RDMA modules loaded at boot.", *modules]
    return "\n".join(lines) + "\n"


def module_decisions(
    modules: list[str], status: dict[str, Any]
) -> tuple[list[str], list[str], list[str]]:
    """(modprobe commands, notes on modules left as they are, modules that cannot load)."""
    container = status["container"]
    commands: list[str] = []
    notes: list[str] = []
    impossible: list[str] = []
    loaded: list[str] = []
    for module in modules:
        state = status["modules"].get(module_name(module), {"loaded": False, "available": False})
        if state["loaded"]:
            loaded.append(module)
        elif container != "none":
            notes.append(
                f"kernel module {module} not loaded: this is a {container} container, which "
                "cannot load kernel modules (the host's kernel must have it loaded); "
                f"{MODULES_LOAD_PATH} loads it at boot on a real node"
            )
        elif state["available"]:
            commands.append(f"modprobe {shlex.quote(module)}")
        elif module == PEERMEM_MODULE:
            notes.append(
                f"kernel module {module} not loaded: the running kernel has no such module "
                "yet (it comes with the NVIDIA driver); it loads at boot once installed"
            )
        else:
            impossible.append(module)
    if loaded:
        notes.insert(0, f"kernel modules already loaded: {', '.join(loaded)}")
    return commands, notes, impossible


@operation()
def modules_loaded(modules: list[str]):
    """Each of ``modules`` is loaded in the running kernel, or the reason it is not is reported.

    A module the running kernel does not have at all is an error (nvidia_peermem excepted: it
    comes with the NVIDIA driver).

    + modules: the kernel modules' names (those of ``rdma_modules``)
    """
    status = host.get_fact(KernelModuleStatus, modules=modules)
    commands, notes, impossible = module_decisions(modules, status)
    if impossible:
        raise OperationError(missing_modules_message(impossible))
    for note in notes:
        host.noop(note)
    yield from commands


def missing_modules_message(modules: list[str]) -> str:
    return (
        f"{host.name}: infiniband: the running kernel has no module {', '.join(modules)} "
        "(modinfo finds none): install the kernel's modules or disable infiniband"
    )


# --- memlock -----------------------------------------------------------------------------


@operation()
def memlock_reported():
    """Reports logins that cannot be granted unlimited memlock; changes nothing."""
    limit = host.get_fact(MemlockLimit)
    if limit["hard_kib"] is None:
        host.noop("memlock hard limit is already unlimited")
    elif limit["can_raise"]:
        host.noop(f"memlock unlimited from the next login (hard limit now {limit['hard_kib']} KiB)")
    else:
        host.noop(
            f"memlock stays at {limit['hard_kib']} KiB for logins: root lacks "
            f"CAP_SYS_RESOURCE here ({limit['container']} container), so pam_limits cannot "
            f"raise it; {LIMITS_PATH} takes effect on a real node"
        )
    yield from ()


# --- IPoIB -------------------------------------------------------------------------------


def require_netplan(node: str, names: list[str]) -> None:
    """A netplan release's IPoIB interfaces are netplan's: a node without netplan (removed by
    hand) is refused before anything changes, rather than given files nothing reads."""
    if not host.get_fact(Which, command="netplan"):
        raise NodeRefused(
            f"{node}: infiniband.ipoib ({', '.join(names)}) is written for netplan, which "
            "configures this release's network, but netplan is not installed; install "
            "netplan.io, or remove infiniband.ipoib"
        )


def netplan_path(interface: IpoibInterface) -> str:
    return f"{NETPLAN_DIR}/{NETPLAN_FILE_PREFIX}{interface.name}.yaml"


def render_netplan_ipoib(interface: IpoibInterface) -> str:
    """One IPoIB interface as netplan YAML (netplan's ``ethernets``; ``infiniband-mode`` from
    netplan.io 0.105, LP #1848471, 2022-08-18: written only where connected mode is wanted,
    datagram being the kernel's default). The name and address are validated by the model."""
    lines = [
        "# Managed by gpunode (infiniband.ipoib); local edits are replaced.",
        "network:",
        "  version: 2",
        "  ethernets:",
        f"    {interface.name}:",
        "      addresses:",
        f'        - "{ipaddress.ip_interface(interface.address)}"',
        f"      mtu: {interface.mtu}",
    ]
    if interface.mtu > DATAGRAM_MAX_MTU:
        lines.append("      infiniband-mode: connected")
    return "\n".join(lines) + "\n"


def netplan_write_script(path: str, content: str, interface: str) -> str:
    """Validate ``content`` as ``path`` with the node's own netplan, beside the node's other
    netplan files in a scratch root, then write it (mode 600: netplan warns of configuration
    others can read) and have systemd-networkd reconfigure ``interface`` alone where it
    exists. A configuration netplan refuses stops here, with netplan's words, before
    anything changes."""
    copies = "; ".join(
        f'if [ -d {d} ]; then mkdir -p "$scratch"{d} && cp -a {d}/. "$scratch"{d}/; fi'
        for d in NETPLAN_CONFIG_DIRS
    )
    name = shlex.quote(interface)
    return (
        "scratch=$(mktemp -d) && trap 'rm -rf \"$scratch\"' EXIT && "
        f"{{ {copies}; }} && "
        f'mkdir -p "$scratch"{NETPLAN_DIR} && '
        f'printf %s {shlex.quote(content)} > "$scratch"{shlex.quote(path)} && '
        f'if ! refusal=$(netplan generate --root-dir "$scratch" 2>&1); then '
        f'echo "netplan refuses {path}; the netplan configuration is as it was: $refusal" >&2; '
        "exit 1; fi && "
        f'install -m 600 -o root -g root "$scratch"{shlex.quote(path)} {shlex.quote(path)} && '
        "netplan generate && "
        f"if [ -e /sys/class/net/{name} ] && systemctl is-active --quiet systemd-networkd; then "
        f"networkctl reload && networkctl reconfigure {name}; fi"
    )


@operation()
def netplan_ipoib(interface: IpoibInterface):
    """The IPoIB interface's netplan file is gpunode's, validated by netplan first; the
    interface, where it exists, has its address and MTU now.

    + interface: the declared IPoIB interface (an ``infiniband.ipoib`` entry): name, address
      with prefix length, MTU
    """
    path = netplan_path(interface)
    content = render_netplan_ipoib(interface)
    current = host.get_fact(FileContents, path=path)
    stat = host.get_fact(File, path=path)
    in_place = (
        current is not None
        and "\n".join(current) + "\n" == content
        and isinstance(stat, dict)
        and stat.get("mode") == 600
    )
    live = host.get_fact(NetworkInterfaces).get(interface.name)
    if in_place and (live is None or ipoib_is_live(interface, live)):
        where = (
            f"{interface.name} is up with {interface.address}, MTU {interface.mtu}"
            if live
            else f"{interface.name} does not exist on this node (no IPoIB port: no HCA, or "
            "ib_ipoib not loaded); netplan brings it up at boot"
        )
        host.noop(f"{path} as declared; {where}")
        return
    yield netplan_write_script(path, content, interface.name)


@operation()
def stale_netplan_ipoib_removed(keep: list[str]):
    """gpunode's IPoIB netplan files are exactly ``keep``; the addresses of the others'
    interfaces are taken away.

    + keep: paths of the netplan files (``netplan_path``) of the declared interfaces; every
      other ``60-gpunode-ipoib-*.yaml`` in /etc/netplan is removed
    """
    present = host.get_fact(FindFiles, path=NETPLAN_DIR, fname=f"{NETPLAN_FILE_PREFIX}*.yaml")
    stale = sorted(path for path in present or [] if path not in keep)
    if not stale:
        host.noop("no other gpunode IPoIB netplan files")
        return
    # Both come from the node's file names: quoted.
    removals = " ".join(shlex.quote(path) for path in stale)
    names = [
        path.rsplit("/", 1)[1].removeprefix(NETPLAN_FILE_PREFIX).removesuffix(".yaml")
        for path in stale
    ]
    flushes = "; ".join(f"ip address flush dev {shlex.quote(name)} 2>/dev/null" for name in names)
    yield f"rm -f {removals} && netplan generate; {flushes}; true"


def ipoib_path(interface: IpoibInterface) -> str:
    return f"{INTERFACES_DIR}/{IPOIB_FILE_PREFIX}{interface.name}"


def render_ipoib(interface: IpoibInterface) -> str:
    address = ipaddress.ip_interface(interface.address)
    family = "inet6" if address.version == 6 else "inet"
    lines = [
        "# Managed by gpunode (infiniband.ipoib); local edits are replaced.",
        f"auto {interface.name}",
        f"iface {interface.name} {family} static",
        f"    address {one_line(interface.address)}",
        f"    mtu {interface.mtu}",
    ]
    if interface.mtu > DATAGRAM_MAX_MTU:
        lines.append(f"    pre-up echo connected > /sys/class/net/{interface.name}/mode")
    return "\n".join(lines) + "\n"


def ipoib_is_live(interface: IpoibInterface, live: dict[str, Any]) -> bool:
    wanted = str(ipaddress.ip_interface(interface.address))
    addresses = {str(ipaddress.ip_interface(address)) for address in live["addresses"]}
    return wanted in addresses and live["mtu"] == interface.mtu and live["operstate"] != "DOWN"


@operation()
def ipoib_up(interface: IpoibInterface, ipoib_module_loading: bool = False):
    """The IPoIB interface has its address and MTU now, where the interface exists.

    + interface: the declared IPoIB interface (an ``infiniband.ipoib`` entry): name, address
      with prefix length, MTU
    + ipoib_module_loading: ib_ipoib is loaded by this run, so the interface may appear
    """
    live = host.get_fact(NetworkInterfaces).get(interface.name)
    if live is None:
        if ipoib_module_loading:
            yield f"ifup {shlex.quote(interface.name)}"
            return
        host.noop(
            f"{interface.name} does not exist on this node (no IPoIB port: no HCA, or "
            f"ib_ipoib not loaded); {ipoib_path(interface)} brings it up at boot"
        )
        return
    if ipoib_is_live(interface, live):
        host.noop(f"{interface.name} is up with {interface.address}, MTU {interface.mtu}")
        return
    # ifup does nothing for an interface ifupdown counts as up, and ifdown only removes the
    # address its (new) file names: both are reset before ifup applies the file.
    name = shlex.quote(interface.name)
    yield f"ifdown --force {name} 2>/dev/null; ip address flush dev {name}; ifup {name}"


SOURCE_PATTERN = r"^\s*source(-directory)?\s+/etc/network/interfaces\.d(/\*)?\s*$"


@operation()
def interfaces_sources_directory():
    """/etc/network/interfaces reads the files in /etc/network/interfaces.d.

    Debian's file does already; where ifupdown is not installed yet, its package writes it.
    """
    present = host.get_fact(FindInFile, path=INTERFACES_PATH, pattern=SOURCE_PATTERN,
                            extended_regex=True)  # fmt: skip
    if present:
        host.noop(f"{INTERFACES_PATH} reads {INTERFACES_DIR}")
    elif present is None and not host.get_fact(File, path="/sbin/ifup"):
        host.noop(f"{INTERFACES_PATH} is written by the ifupdown package this run installs")
    else:
        yield f"echo {shlex.quote(SOURCE_LINE)} >> {INTERFACES_PATH}"


@operation()
def stale_ipoib_files_removed(keep: list[str]):
    """gpunode's IPoIB files are exactly ``keep``; the interfaces of others are taken down.

    + keep: paths of the IPoIB files (``ipoib_path``) of the declared interfaces; every other
      ``gpunode-ipoib-*`` file in /etc/network/interfaces.d is removed
    """
    present = host.get_fact(FindFiles, path=INTERFACES_DIR, fname=f"{IPOIB_FILE_PREFIX}*")
    stale = sorted(path for path in present or [] if path not in keep)
    if not stale:
        host.noop("no other gpunode IPoIB interface files")
    for path in stale:
        # Both come from the node's file names: quoted.
        name = shlex.quote(path.rsplit("/", 1)[1].removeprefix(IPOIB_FILE_PREFIX))
        yield f"ifdown --force {name} 2>/dev/null; rm -f {shlex.quote(path)}"


# --- subnet manager ----------------------------------------------------------------------


@operation()
def opensm_running():
    """opensm is enabled, and runs where an HCA's MAD interface exists (else says why not)."""
    unit = host.get_fact(UnitState, unit=OPENSM_UNIT)
    if not unit["installed"]:
        # Predicting a run that installs opensm: Debian's package enables and starts it.
        host.noop("opensm is installed by this run; its package enables it")
        return
    if not unit["enabled"]:
        yield f"systemctl enable {OPENSM_UNIT}"
    if unit["active"]:
        host.noop("opensm is running")
    elif not host.get_fact(File, path=UMAD_ABI_PATH):
        host.noop(
            f"opensm is enabled but not started: {UMAD_ABI_PATH} is absent (no HCA, or ib_umad "
            "not loaded), a start condition of opensm.service; it starts once that exists"
        )
    else:
        yield f"systemctl start {OPENSM_UNIT}"


@operation()
def opensm_stopped():
    """An installed opensm is stopped and disabled: this node is no subnet manager."""
    unit = host.get_fact(UnitState, unit=OPENSM_UNIT)
    if not unit["installed"]:
        host.noop("opensm is not installed")
        return
    if not unit["active"] and not unit["enabled"]:
        host.noop("opensm is stopped and disabled")
    if unit["active"]:
        yield f"systemctl stop {OPENSM_UNIT}"
    if unit["enabled"]:
        yield f"systemctl disable {OPENSM_UNIT}"


# --- the role ----------------------------------------------------------------------------


def _put(name: str, path: str, content: str) -> Any:
    return files.put(
        name=name, src=StringIO(content), dest=path, mode="644", user="root", group="root"
    )


@deploy("InfiniBand and RDMA")
def infiniband(desired: DesiredState) -> None:
    ib = desired.infiniband
    netplan = this_node()[0].network_configuration == "netplan"
    if not ib.enabled:
        for path, what in ((MODULES_LOAD_PATH, "RDMA modules at boot"), (LIMITS_PATH, "memlock")):
            files.file(name=f"No gpunode {what} file", path=path, present=False)
        if netplan:
            stale_netplan_ipoib_removed(name="No gpunode IPoIB interfaces", keep=[])
        else:
            stale_ipoib_files_removed(name="No gpunode IPoIB interfaces", keep=[])
        return

    sysfs_hcas = host.get_fact(RdmaDevices)
    modules = rdma_modules(desired, has_hcas(desired, sysfs_hcas, host.get_fact(InfinibandPorts)))
    status = host.get_fact(KernelModuleStatus, modules=modules)
    modprobes, _, impossible = module_decisions(modules, status)
    if impossible:
        raise NodeRefused(missing_modules_message(impossible))

    install_packages("RDMA user space (rdma-core, infiniband-diags, ibverbs-utils)", RDMA_PACKAGES)
    _put("RDMA kernel modules at boot", MODULES_LOAD_PATH, render_modules_load(modules))
    modules_loaded(name="RDMA kernel modules in the running kernel", modules=modules)

    if ib.memlock_unlimited:
        _put("Unlimited memlock for RDMA users", LIMITS_PATH, LIMITS)
        memlock_reported(name="Unlimited memlock at login")
    else:
        files.file(name="No gpunode memlock limits", path=LIMITS_PATH, present=False)

    if netplan:
        if ib.ipoib:
            require_netplan(host.name, [i.name for i in ib.ipoib])
        for interface in ib.ipoib:
            netplan_ipoib(name=f"IPoIB {interface.name} (netplan)", interface=interface)
        stale_netplan_ipoib_removed(
            name="No other gpunode IPoIB interfaces", keep=[netplan_path(i) for i in ib.ipoib]
        )
    else:
        if ib.ipoib:
            install_packages("ifupdown for IPoIB interfaces", ["ifupdown"])
            interfaces_sources_directory(name="/etc/network/interfaces reads interfaces.d")
        for interface in ib.ipoib:
            _put(
                f"IPoIB {interface.name} configuration",
                ipoib_path(interface),
                render_ipoib(interface),
            )
            ipoib_up(
                name=f"IPoIB {interface.name} up",
                interface=interface,
                ipoib_module_loading="modprobe ib_ipoib" in modprobes,
            )
        stale_ipoib_files_removed(
            name="No other gpunode IPoIB interfaces", keep=[ipoib_path(i) for i in ib.ipoib]
        )

    if ib.subnet_manager:
        install_packages("Subnet manager (opensm)", ["opensm"])
        opensm_running(name="Subnet manager running")
    else:
        opensm_stopped(name="No subnet manager")

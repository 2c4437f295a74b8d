"""Health and drift rules: the inventory's desired state and expected hardware against facts.

Each rule reads one section of a host's NodeState fact and returns findings. Severity follows
what an operator does about it: critical means jobs should not land on the node (hardware
fault, driver broken, GPU missing); warning means a deploy or a reset fixes it; info is worth
knowing but needs no action tonight. Thresholds follow the public node health checks (Azure
aznhc, LBNL NHC, DCGM) named in the project's reference notes; GPU health (XIDs, a lost GPU,
memory errors, the driver's recovery action) is judged by ``gpunode.health`` against NVIDIA's
own catalogues (``gpu_health_rules``).
"""

from __future__ import annotations

import datetime
import hashlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from gpunode.distributions import Distribution, UnsupportedNode, platform_of, supported
from gpunode.drift.findings import HARDWARE_TICKET, RUN_DEPLOY, Finding, Severity
from gpunode.drift.shape import checked_facts
from gpunode.expected import kubernetes as expected_kubernetes
from gpunode.expected import mps as expected_mps
from gpunode.expected import registry_access as expected_registry_access
from gpunode.expected import secure_boot
from gpunode.expected import shared_data as expected_shared_data
from gpunode.expected.audit import is_system_binary
from gpunode.expected.auditd import WATCHES
from gpunode.expected.firewall import TABLE, render_ruleset, service_rules
from gpunode.expected.gpu_settings import BOOT_UNIT
from gpunode.expected.packages import held_packages, toolkit_keeps_cdi_spec
from gpunode.expected.slurm import GRES_CONF, GresGpu, gres_gpus, gres_summary
from gpunode.expected.sshd import expected_effective, render_sshd_config
from gpunode.health import judge as judge_health
from gpunode.health.infiniband import judge as judge_infiniband
from gpunode.health.infiniband_counters import judge as judge_infiniband_counters
from gpunode.model import DesiredState, MalwareScan
from gpunode.nvidia_releases import CDI_REFRESH_SPEC
from gpunode.sanitize import clean_tree

Section = dict[str, Any]
# A rule yields (id, severity, expected, found, fix), a health rule adds its health fields.
Rule = Callable[[DesiredState, dict[str, Any]], Iterator[tuple[Any, ...]]]

REBOOT = "reboot the node (drain first)"
CHECK_CABLE = "check the cable and the switch port"
RESET_GPU = "drain and reset the GPU (nvidia-smi -r) or reboot"

REPORT_BUG = "report a gpunode bug with this host's facts; check the node by hand meanwhile"

CRIT, WARN, INFO = Severity.CRITICAL, Severity.WARNING, Severity.INFO


def _unreadable(name: str, section: Section) -> Iterator[tuple[str, Severity, str, str, str]]:
    reason = section.get("reason") or section.get("state") or "no data"
    yield f"{name}.unreadable", WARN, f"{name} facts readable", f"unreadable: {reason}", RUN_DEPLOY


# How many unread lines one finding shows: enough to see what changed, few enough for a table.
MAX_UNREAD_LINES_SHOWN = 5


def _unread_lines(name: str, command: str, problems: Any) -> Iterator[tuple]:
    """One finding for every line of ``command``'s output the parser could not read.

    Their data is kept and checked; these lines are not, so someone must look at them. The
    lines are node text: the parser quotes them (repr) and cuts them, the facts and the
    finding clean them again (``gpunode.sanitize``).
    """
    if not problems:
        return
    shown = "; ".join(str(problem) for problem in problems[:MAX_UNREAD_LINES_SHOWN])
    more = len(problems) - MAX_UNREAD_LINES_SHOWN
    found = f"{len(problems)} not read: {shown}" + (f" (and {more} more)" if more > 0 else "")
    yield f"{name}.unread_line", WARN, f"every line of {command} read", found, REPORT_BUG


def gpu_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    report: Section = facts.get("gpu") or {}
    expected = desired.expected_hardware
    state = report.get("state")
    if state == "driver_not_loaded":
        yield "gpu.driver_loaded", CRIT, "NVIDIA driver loaded", "not loaded", REBOOT
        return
    if state == "absent":
        if expected.gpu_count:
            yield "gpu.tooling", CRIT, "nvidia-smi present", "not installed", RUN_DEPLOY
        return
    if state != "ok":
        yield from _unreadable("gpu", report)
        return
    gpus = report.get("gpus", [])
    yield from _unread_lines(
        "nvlink", "nvidia-smi nvlink -s", (report.get("problems") or {}).get("nvlink")
    )
    yield from _unread_lines(
        "nvlink_errors", "nvidia-smi nvlink -e", (report.get("problems") or {}).get("nvlink_errors")
    )
    if expected.gpu_count is not None and len(gpus) != expected.gpu_count:
        yield "gpu.count", CRIT, f"{expected.gpu_count} GPUs", f"{len(gpus)} GPUs", HARDWARE_TICKET
    pinned = desired.nvidia_driver.driver_version
    if pinned and report.get("driver_version") != pinned:
        yield "driver.version", CRIT, pinned, str(report.get("driver_version")), RUN_DEPLOY
    versions = report.get("driver_versions") or {}
    if versions.get("mismatch"):
        found = (
            f"kernel module {versions.get('kernel_module')}, userspace {versions.get('userspace')}"
        )
        yield "driver.mismatch", CRIT, "kernel module and userspace agree", found, REBOOT
    installed, loaded = versions.get("installed_package"), report.get("driver_version")
    if installed and loaded and installed != loaded:
        yield "node.reboot_required", WARN, f"driver {installed} loaded", f"{loaded} loaded", REBOOT
    if expected.nvswitch:
        fabric = (report.get("fabric_manager") or {}).get("state")
        if fabric != "active":
            yield "fabric_manager", CRIT, "nvidia-fabricmanager active", str(fabric), RUN_DEPLOY
    # XIDs, a lost GPU and memory health: gpu_health_rules (gpunode.health). A lost GPU's
    # values are all unknown: its one finding is gpu.lost, not a wrong model or setting.
    for gpu in (gpu for gpu in gpus if not gpu.get("lost")):
        yield from _gpu_device_rules(desired, gpu)
        yield from _mig_rules(desired, gpu, report.get("mig_listing") or {})


def _gpu_device_rules(desired: DesiredState, gpu: dict[str, Any]) -> Iterator[tuple]:
    expected = desired.expected_hardware
    settings = desired.gpu_settings
    label = f"{gpu.get('index')}"
    if expected.gpu_model and gpu.get("name") != expected.gpu_model:
        yield f"gpu.model:{label}", CRIT, expected.gpu_model, str(gpu.get("name")), HARDWARE_TICKET
    wanted_persistence = settings.persistence_mode
    persistence = gpu.get("persistence_mode")
    if wanted_persistence is not None and persistence not in (None, wanted_persistence):
        want, got = _on_off(wanted_persistence), _on_off(bool(persistence))
        yield f"gpu.persistence:{label}", WARN, f"persistence {want}", got, RUN_DEPLOY
    # The settings the driver forgets at a reboot (re-applied at boot by the gpu_settings
    # role's unit): a node back from a reboot with its driver's defaults must take no job.
    limit = (gpu.get("power_w") or {}).get("limit")
    if settings.power_limit_w is not None and limit is not None and limit != settings.power_limit_w:
        yield (
            f"gpu.power_limit:{label}", CRIT, f"power limit {settings.power_limit_w} W",
            f"{limit:g} W", RUN_DEPLOY,
        )  # fmt: skip
    clocks, wanted_clocks = gpu.get("application_clocks_mhz"), settings.application_clocks
    if wanted_clocks is not None and clocks is not None:
        mhz = {"memory": wanted_clocks.memory_mhz, "graphics": wanted_clocks.graphics_mhz}
        if clocks != mhz:
            yield (
                f"gpu.application_clocks:{label}", CRIT,
                f"memory {mhz['memory']} MHz, graphics {mhz['graphics']} MHz",
                f"memory {clocks.get('memory')} MHz, graphics {clocks.get('graphics')} MHz",
                RUN_DEPLOY,
            )  # fmt: skip
    ecc = gpu.get("ecc_mode") or {}
    if settings.ecc is not None and ecc.get("current") not in (None, settings.ecc):
        pending = ecc.get("pending") == settings.ecc
        yield (
            f"gpu.ecc:{label}", INFO if pending else WARN, f"ECC {_on_off(settings.ecc)}",
            f"ECC {_on_off(ecc['current'])}" + (" (change pending a reset)" if pending else ""),
            RESET_GPU if pending else RUN_DEPLOY,
        )  # fmt: skip
    yield from _nvlink_rules(desired, gpu, label)
    # Clocks held down (gpu.throttle), temperature and the PCIe link (gpu.pcie_width): health
    # failure classes, judged by gpunode.health.clocks and .pcie in gpu_health_rules.


# The MIG layout is lost at every reset or reboot; the gpu_settings role's boot unit lays it out
# again before the scheduler starts. Without it jobs get other GPU slices than declared.
MIG_LAYOUT_FIX = f"systemctl status {BOOT_UNIT} on the node; run deploys/gpu_node.py"


def _mig_rules(desired: DesiredState, gpu: dict[str, Any], listing: Section) -> Iterator[tuple]:
    """MIG mode as declared (gpu_settings.mig), and a GPU in MIG mode holding exactly the
    declared GPU instances (gpu_settings.mig_layout, a multiset of profile names)."""
    settings = desired.gpu_settings
    label = f"{gpu.get('index')}"
    mode = gpu.get("mig_mode") or {}
    current = mode.get("current")
    if settings.mig is not None and current is not None and current != settings.mig:
        pending = mode.get("pending") == settings.mig
        # Not pending: the scheduler hands out other devices than the inventory declares.
        yield (
            f"gpu.mig_mode:{label}", INFO if pending else CRIT, f"MIG {_on_off(settings.mig)}",
            f"MIG {_on_off(current)}" + (" (change pending a reset)" if pending else ""),
            RESET_GPU if pending else RUN_DEPLOY,
        )  # fmt: skip
    if not (settings.mig and settings.mig_layout and current is True):
        return
    wanted = sorted(settings.mig_layout)
    instances = gpu.get("gpu_instances")
    if instances is None:
        why = listing.get("reason") or listing.get("state") or "not read"
        yield (
            f"gpu.mig_layout:{label}", CRIT, f"GPU instances {wanted}",
            f"unreadable: {why}", REPORT_BUG,
        )  # fmt: skip
        return
    found = sorted(str(instance.get("profile")) for instance in instances)
    if Counter(found) != Counter(wanted):
        shown = f"GPU instances {found}" if found else "no GPU instances (none laid out at boot)"
        yield f"gpu.mig_layout:{label}", CRIT, f"GPU instances {wanted}", shown, MIG_LAYOUT_FIX


def _nvlink_rules(desired: DesiredState, gpu: dict[str, Any], label: str) -> Iterator[tuple]:
    wanted = desired.expected_hardware.nvlink_links_per_gpu
    if not wanted:
        return
    nvlink = gpu.get("nvlink") or {}
    active = nvlink.get("active") or 0
    if nvlink.get("state") == "unreadable":
        yield f"gpu.nvlink:{label}", WARN, f"{wanted} NVLinks active", "unreadable", RUN_DEPLOY
    elif nvlink.get("state") == "mig_mode":  # nvidia-smi will not list links in MIG mode
        found = "not queryable in MIG mode"
        yield f"gpu.nvlink:{label}", WARN, f"{wanted} NVLinks active", found, "query NVML or DCGM"
    elif active < wanted:
        found = "all inactive" if nvlink.get("state") == "all_inactive" else f"{active} active"
        yield f"gpu.nvlink:{label}", CRIT, f"{wanted} NVLinks active", found, HARDWARE_TICKET


def gpu_health_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    """GPU health (``gpunode.health``): a lost GPU, memory errors, the driver's recovery
    action and XIDs, each with its failure class, evidence, confidence and remedy. A report
    nvidia-smi could not read may still name a lost GPU (exit status 15, "Unable to determine
    the device handle"): that is judged too."""
    report: Section = facts.get("gpu") or {}
    if report.get("state") != "ok" and not report.get("lost_gpus"):
        return
    # Links per GPU declared in the inventory: gpu.nvlink judges against that number.
    declared_links = bool(desired.expected_hardware.nvlink_links_per_gpu)
    for finding in judge_health(report):
        if declared_links and finding.failure_class == "nvlink.inactive":
            continue
        yield (finding.id, Severity(finding.severity.value), finding.expected, finding.found,
               finding.fix, finding.detail())  # fmt: skip


def _on_off(value: bool) -> str:
    return "on" if value else "off"


def infiniband_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    expected = desired.expected_hardware
    if not expected.ib_port_count:
        return
    section: Section = facts.get("infiniband") or {}
    if section.get("state") != "ok":
        if section.get("state") == "absent":
            yield "ib.tooling", CRIT, "ibstat present", "not installed", RUN_DEPLOY
        else:
            yield from _unreadable("ib", section)
        return
    yield from _unread_lines("ib", "ibstat", section.get("problems"))
    ports = [p for p in section.get("ports", []) if p.get("link_layer") == "InfiniBand"]
    if len(ports) != expected.ib_port_count:
        expected_text = f"{expected.ib_port_count} InfiniBand ports"
        yield "ib.count", CRIT, expected_text, f"{len(ports)} ports", HARDWARE_TICKET
    for port in ports:
        if port.get("state") is None or port.get("physical_state") is None:
            # A port whose state lines were not read is no down port: ib.unread_line says why.
            name = f"{port.get('ca')}/{port.get('port')}"
            yield f"ib.port:{name}", WARN, "Active / LinkUp", "state not read", REPORT_BUG
    # Ports down or slow: health failure classes (gpunode.health.infiniband), with the
    # declared rate, or the rate of their sibling ports where the inventory declares none.
    for finding in judge_infiniband(ports, expected.ib_rate_gbps):
        yield (finding.id, Severity(finding.severity.value), finding.expected, finding.found,
               finding.fix, finding.detail())  # fmt: skip


def infiniband_counter_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    """Error counters of the RDMA ports (``gpunode.health.infiniband_counters``), wherever the
    node has RDMA devices; their section unreadable is named where InfiniBand ports are
    declared."""
    section: Section = facts.get("ib_counters") or {}
    if section.get("state") != "ok":
        if desired.expected_hardware.ib_port_count and "ib_counters" in facts:
            yield from _unreadable("ib_counters", section)
        return
    yield from _unread_lines("ib_counters", "/sys/class/infiniband counters",
                             section.get("problems"))  # fmt: skip
    for finding in judge_infiniband_counters(section.get("ports") or []):
        yield (finding.id, Severity(finding.severity.value), finding.expected, finding.found,
               finding.fix, finding.detail())  # fmt: skip


def nvme_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    wanted = desired.expected_hardware.nvme_count
    if wanted is None:
        return
    section: Section = facts.get("nvme") or {}
    if section.get("state") == "absent" and wanted == 0:
        return
    if section.get("state") != "ok":
        yield from _unreadable("nvme", section)
        return
    found = len(section.get("devices", []))
    if found != wanted:
        yield "nvme.count", CRIT, f"{wanted} NVMe drives", f"{found} drives", HARDWARE_TICKET


def node_distribution(facts: dict[str, Any]) -> Distribution | None:
    """The node's release from its os section; None where it is unreadable or unsupported
    (os_rules reports which)."""
    section: Section = facts.get("os") or {}
    if section.get("state") == "unreadable":
        return None
    try:
        return platform_of(section)[0]
    except UnsupportedNode:
        return None


def os_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    section: Section = facts.get("os") or {}
    if section.get("state") == "unreadable" or "os" not in facts:
        yield from _unreadable("os", section)
        return
    try:
        platform_of(section)
    except UnsupportedNode as error:
        yield "os.release", CRIT, f"one of {supported()}", str(error), "reinstall the node"


def sshd_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    section: Section = facts.get("sshd") or {}
    effective = section.get("effective") or {}
    if not effective:
        yield from _unreadable("sshd", {"reason": section.get("effective_error")})
        return
    distribution = node_distribution(facts)
    if distribution is None:
        return  # what sshd must be depends on the release; os_rules reports it
    for keyword, wanted in expected_effective(desired.sshd, distribution).items():
        found = effective.get(keyword, ["(unset)"])
        if found != [wanted]:
            yield f"sshd.{keyword}", WARN, wanted, ",".join(found), RUN_DEPLOY
    rendered = hashlib.sha1(render_sshd_config(desired.sshd, distribution).encode()).hexdigest()
    if section.get("config_sha1") != rendered:
        yield "sshd.config", WARN, "sshd_config as gpunode wrote it", "edited", RUN_DEPLOY


def firewall_drift(desired: DesiredState, state: dict) -> list[tuple[str, Severity, str, str]]:
    """(subject, severity, expected, found) for each way the node's firewall differs from
    ``desired``; the FirewallState fact is ``state``."""
    from facts.firewall import RULESET_PATH, UNIT_NAME

    wanted = desired.firewall
    live = state.get("live")
    if not wanted.enabled:
        if live is not None:
            return [("table", Severity.INFO, f"no table {TABLE}", "table present")]
        return []
    if live is None:
        return [("table", Severity.CRITICAL, f"table {TABLE} live", "absent: input not filtered")]
    drift = []
    if live != state.get("file_loads"):
        drift.append(
            ("rules", Severity.WARNING, f"live rules as {RULESET_PATH}", "changed by hand")
        )
    rendered = hashlib.sha256(
        render_ruleset(
            wanted,
            desired.sshd.port,
            desired.exporter_ports,
            service_rules(desired),
            desired.forward_networks,
        ).encode()
    ).hexdigest()
    if state.get("file_sha256") != rendered:
        drift.append(("ruleset", Severity.WARNING, "ruleset from inventory data", "different"))
    if not state.get("unit_enabled"):
        drift.append(("boot_unit", Severity.WARNING, f"{UNIT_NAME} enabled", "disabled"))
    return drift


def firewall_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    section: Section = facts.get("firewall") or {}
    if "state" in section and section.get("state") == "unreadable":
        yield from _unreadable("firewall", section)
        return
    for subject, severity, expected, found in firewall_drift(desired, section):
        yield f"firewall.{subject}", severity, expected, found, RUN_DEPLOY


def tls_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    wanted = desired.tls
    if not wanted.enabled:
        return
    cert: Section = facts.get("tls") or {}
    state = cert.get("state")
    if state == "absent":
        yield "tls.certificate", WARN, "a node certificate", "none", RUN_DEPLOY
        return
    if state != "present":
        yield from _unreadable("tls", cert)
        return
    if cert.get("key") != "matches":
        yield "tls.key", CRIT, "key matches certificate", str(cert.get("key")), RUN_DEPLOY
    days = cert.get("days_to_expiry")
    if isinstance(days, int) and days <= wanted.renew_before_days:
        severity = CRIT if days <= 7 else WARN
        found = f"expires in {days} days ({cert.get('not_after')})"
        yield "tls.expiry", severity, f"> {wanted.renew_before_days} days left", found, RUN_DEPLOY


def package_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    """Every package a role pins and holds (driver, Fabric Manager, NVLink subnet manager,
    IMEX, DCGM and its exporter, container toolkit) installed at its version and held: a
    package changed, removed or unheld by hand is drift."""
    wanted = held_packages(desired)
    section: Section = facts.get("packages") or {}
    if "packages" not in section:
        if wanted:
            yield from _unreadable("packages", section)
        return
    installed: dict[str, str] = section["packages"]
    held = set(section.get("held", []))
    for name, version in sorted(wanted.items()):
        found = installed.get(name)
        if found is None or (version is not None and found != version):
            yield (
                f"packages.version:{name}",
                CRIT,
                version or "installed",
                found or "not installed",
                RUN_DEPLOY,
            )
        elif name not in held:
            yield f"packages.hold:{name}", WARN, "held", "not held", RUN_DEPLOY


def secure_boot_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    """The installed NVIDIA kernel module loads under the node's Secure Boot: Canonical's
    signed prebuilt one, or a DKMS-built one with an enrolled machine owner key. One that
    would not is critical: at its next boot the node comes back without its GPUs."""
    if desired.nvidia_driver.source == "none" or "secure_boot" not in facts:
        return
    section: Section = facts["secure_boot"] or {}
    packages: Section = facts.get("packages") or {}
    if "state" not in section or section.get("state") == "unreadable":
        yield from _unreadable("secure_boot", section)
        return
    if "packages" not in packages:
        return  # the packages rules say the packages are unreadable
    kind = secure_boot.installed_module_kind(packages["packages"], packages.get("kernel"))
    reason = secure_boot.unloadable_reason(section, kind)
    if reason:
        yield (
            "secure_boot.module", CRIT, "the NVIDIA kernel module loads under Secure Boot",
            f"module would not load under Secure Boot: {reason}",
            secure_boot.next_step(section),
        )  # fmt: skip


def container_runtime_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    """Every declared engine runs GPU containers: nvidia runtime configured, CDI spec current."""
    runtime = desired.container_runtime
    if not runtime.engines:
        return
    section: Section = facts.get("container_runtime") or {}
    if section.get("state") == "unreadable":
        yield from _unreadable("container_runtime", section)
        return
    for engine in runtime.engines:
        config = section.get(engine) or {}
        if config.get("error"):
            yield f"runtime.{engine}", CRIT, "a readable config", str(config["error"]), RUN_DEPLOY
        elif not config.get("nvidia_runtime"):
            yield f"runtime.{engine}", WARN, "nvidia runtime configured", "missing", RUN_DEPLOY
        elif runtime.set_as_default and config.get("default_runtime") != "nvidia":
            found = str(config.get("default_runtime"))
            yield f"runtime.{engine}.default", WARN, "nvidia", found, RUN_DEPLOY
    if runtime.cdi:
        # Which toolkit: the pinned, else the installed; unknown, the spec gpunode writes.
        version = runtime.toolkit_version or section.get("nvidia_ctk_version")
        own = version is not None and toolkit_keeps_cdi_spec(version, None)
        path = CDI_REFRESH_SPEC if own else "/etc/cdi/nvidia.yaml"
        spec = section.get("cdi_refresh_spec" if own else "cdi_spec") or {}
        other, other_path = (
            ("cdi_spec", "/etc/cdi/nvidia.yaml") if own else ("cdi_refresh_spec", CDI_REFRESH_SPEC)
        )
        if (section.get(other) or {}).get("present"):
            # Two specs for the same devices: engines may pick the one that is wrong.
            yield "runtime.cdi.second_spec", WARN, f"no {other_path}", "present", RUN_DEPLOY
        gpus = (facts.get("gpu") or {}).get("gpus") or []
        uuids = sorted(gpu.get("uuid") for gpu in gpus if gpu.get("uuid"))
        # A GPU missing from the box is a hardware finding; a spec still listing it is not news.
        expected_count = desired.expected_hardware.gpu_count
        complete = expected_count is None or len(uuids) == expected_count
        if not spec.get("present"):
            yield "runtime.cdi", WARN, f"CDI spec {path}", "missing", RUN_DEPLOY
        elif complete and uuids and sorted(spec.get("uuids") or []) != uuids:
            yield "runtime.cdi", WARN, "CDI spec lists every GPU", "stale", RUN_DEPLOY


def nccl_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    """/etc/nccl.conf and the login environment carry exactly the declared NCCL settings."""
    from facts.fabric import NCCL_FILES

    wanted = desired.nccl.env
    if not wanted:
        return
    section: Section = facts.get("nccl") or {}
    if section.get("state") == "unreadable":
        yield from _unreadable("nccl", section)
        return
    for kind, path in NCCL_FILES.items():
        found: dict[str, str] | None = section.get(kind)
        if found is None:
            yield f"nccl.{kind}", WARN, f"{path} with {len(wanted)} settings", "missing", RUN_DEPLOY
            continue
        for name in sorted(set(wanted) | set(found)):
            if wanted.get(name) != found.get(name):
                yield (
                    f"nccl.{kind}:{name}", WARN, _setting(name, wanted.get(name)),
                    _setting(name, found.get(name)), RUN_DEPLOY,
                )  # fmt: skip


def _setting(name: str, value: str | None) -> str:
    return f"{name} unset" if value is None else f"{name}={value}"


def nvme_cache_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    """The NVMe cache is mounted where declared, writable, with its filesystem and noatime.

    Not mounted is critical: jobs would write their scratch data to the root disk.
    """
    cache = desired.nvme_cache
    if not cache.enabled:
        return
    mounts: Section = facts.get("mounts") or {}
    if mounts.get("state") == "unreadable":
        yield from _unreadable("mounts", mounts)
        return
    wanted = f"{cache.filesystem} mounted at {cache.mount_point}"
    mount = mounts.get(cache.mount_point)
    if mount is None:
        fix = f"{RUN_DEPLOY}; if a drive is gone, {HARDWARE_TICKET}"
        yield "nvme_cache.mount", CRIT, wanted, "not mounted", fix
        return
    if mount.get("fstype") != cache.filesystem:
        found = f"{mount.get('fstype')} from {mount.get('source')}"
        yield "nvme_cache.filesystem", WARN, wanted, found, RUN_DEPLOY
    options = mount.get("options") or []
    if "ro" in options:
        # The kernel remounts a filesystem read-only after I/O errors.
        found = f"read-only ({mount.get('source')})"
        yield "nvme_cache.read_only", CRIT, "mounted read-write", found, HARDWARE_TICKET
    if "noatime" not in options:
        yield "nvme_cache.options", WARN, "noatime", ",".join(options), RUN_DEPLOY


def registry_access_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    """Root's Docker client holds a login for each declared registry, readable by root only.

    A missing login is a warning (pulls of that registry's private images fail; public ones
    still work); a file others may read exposes the keys (critical).
    """
    yield from _registry_mirror_rules(desired, facts)
    logins = desired.container_runtime.registry_logins
    if not logins:
        return
    section: Section = facts.get("registry_access") or {}
    if section.get("state") == "unreadable":
        yield from _unreadable("registry_access", section)
        return
    path = expected_registry_access.DOCKER_CLIENT_CONFIG
    mode = section.get("mode")
    if section.get("present") and mode != expected_registry_access.CONFIG_MODE:
        yield ("registry_access.mode", CRIT, f"{path} mode 0600", f"mode {mode or 'unknown'}",
               f"chmod 600 {path}; rotate the keys it holds; {RUN_DEPLOY}")  # fmt: skip
    held = set(section.get("registries") or [])
    for login in logins:
        if login.registry not in held:
            found = "no login" if section.get("present") else f"no {path}"
            yield (f"registry_access.login:{login.registry}", WARN,
                   f"a login for {login.registry} in {path}", found, RUN_DEPLOY)  # fmt: skip


def _registry_mirror_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    """Declared mirrors are read only where containerd's registry config_path names their
    directory: otherwise every pull goes to the registries themselves (a warning; on an
    air-gapped site pulls fail)."""
    if not desired.container_runtime.registry_mirrors:
        return
    runtime: Section = facts.get("container_runtime") or {}
    if runtime.get("state") == "unreadable":
        return  # the container runtime rules report it
    containerd = runtime.get("containerd") or {}
    if containerd.get("error"):
        return  # the container runtime rules report it
    found = containerd.get("registry_config_path")
    if not expected_registry_access.reads_hosts_directory(found):
        directory = expected_registry_access.HOSTS_DIRECTORY
        yield ("registry_access.mirrors_unread", WARN,
               f"containerd registry config_path naming {directory}",
               f"config_path {found!r}" if found else "no config_path",
               f'add config_path = "{directory}" to the registry table of '
               "/etc/containerd/config.toml, then restart containerd")  # fmt: skip


SHARED_DATA_FIX = f"{RUN_DEPLOY} (roles/shared_data.py writes and starts the automount)"


def shared_data_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    """Each declared shared file system: its automount armed (autofs) or the file system
    mounted from the declared source with the declared options, answering.

    Neither, or a mount that is stale or hangs, is critical: jobs find no training data.
    Another file system there, or the declared one with other options (version, nconnect,
    read-only), is a warning.
    """
    declared = desired.shared_data.mounts
    if not declared:
        return
    mounts: Section = facts.get("mounts") or {}
    if mounts.get("state") == "unreadable":
        yield from _unreadable("mounts", mounts)
        return
    network: Section = facts.get("network_mounts") or {}
    if network.get("state") == "unreadable":
        yield from _unreadable("network_mounts", network)
    else:
        yield from _unread_lines("network_mounts", "stat -f of the network mounts",
                                 network.get("problems"))  # fmt: skip
    answers = (network.get("answers") or {}) if network.get("state") != "unreadable" else {}
    for mount in declared:
        point = mount.mount_point
        key = f"shared_data.mount:{point}"
        source = expected_shared_data.source(mount)
        wanted = f"{mount.kind} {source} at {point} (or its automount)"
        found = mounts.get(point)
        if found is None:
            yield key, CRIT, wanted, "nothing mounted, no automount", SHARED_DATA_FIX
            continue
        fstype = found.get("fstype")
        if fstype == expected_shared_data.AUTOFS:
            continue  # armed: mounted on first access
        if fstype not in expected_shared_data.MOUNTED_TYPES[mount.kind] or (
            found.get("source") != source
        ):
            yield (key, WARN, wanted, f"{found.get('source')} ({fstype})",
                   "unmount what is there, then " + SHARED_DATA_FIX)  # fmt: skip
            continue
        answer = str(answers.get(point) or "")
        if answer and answer != "ok":
            yield (f"shared_data.answer:{point}", CRIT, f"{point} answers stat -f",
                   answer, "check the server and the network; drain the node, then "
                   f"systemctl restart {expected_shared_data.mount_unit(mount)}")  # fmt: skip
        options = found.get("options") or []
        missing = [o for o in expected_shared_data.expected_kernel_options(mount)
                   if o not in options]  # fmt: skip
        if missing:
            yield (f"shared_data.options:{point}", WARN, ",".join(missing),
                   ",".join(options), "drain, then systemctl restart "
                   + expected_shared_data.mount_unit(mount))  # fmt: skip


def _may_log_in(name: str, account: dict[str, Any], effective: dict[str, Any]) -> bool:
    """sshd's own access checks (AllowUsers, DenyUsers, AllowGroups, DenyGroups, root login,
    public keys) for ``name``, from its effective settings."""
    from fnmatch import fnmatchcase

    def values(keyword: str) -> list[str]:
        return [part for value in effective.get(keyword, []) for part in str(value).split()]

    def matches(patterns: list[str], names: list[str]) -> bool:
        return any(fnmatchcase(n, p.split("@", 1)[0]) for p in patterns for n in names)

    groups = [str(group) for group in account.get("groups") or []]
    if effective.get("pubkeyauthentication") == ["no"]:
        return False
    if name == "root" and effective.get("permitrootlogin") == ["no"]:
        return False
    if matches(values("denyusers"), [name]) or matches(values("denygroups"), groups):
        return False
    if values("allowusers") and not matches(values("allowusers"), [name]):
        return False
    return not values("allowgroups") or matches(values("allowgroups"), groups)


def access_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    """Who can log in. sshd's settings for every account that could log in, evaluated from
    the control host's address, must be the hardened ones (a Match block shows only here);
    no account the inventory does not declare may log in, except the deploy user this check
    logs in as; every declared admin with keys can log in."""
    from facts.accounts import expired

    section: Section = facts.get("sshd") or {}
    base = section.get("effective") or {}
    per_user = (section.get("per_user") or {}).get("users")
    accounts = section.get("accounts")
    distribution = node_distribution(facts)
    if not base or not isinstance(per_user, dict) or not isinstance(accounts, dict):
        return  # sshd_rules reports an unreadable sshd
    if distribution is None:
        return  # os_rules reports the release
    wanted = expected_effective(desired.sshd, distribution)
    for user, effective in sorted(per_user.items()):
        if "error" in effective:
            found = ",".join(effective["error"])
            yield f"sshd.user:{user}", WARN, "sshd -T evaluates", found, RUN_DEPLOY
            continue
        for keyword, value in wanted.items():
            found_values = effective.get(keyword, ["(unset)"])
            # What differs for everyone is already sshd.<keyword>; here only what one gets.
            if found_values != [value] and found_values != base.get(keyword, ["(unset)"]):
                found = ",".join(found_values)
                yield f"sshd.user:{user}.{keyword}", WARN, value, found, RUN_DEPLOY
    if accounts.get("state") != "ok":
        yield from _unreadable("accounts", accounts)
        return
    today = accounts.get("today")
    on_node: dict[str, Any] = accounts.get("accounts") or {}

    def can_log_in(name: str, account: dict[str, Any]) -> bool:
        effective = per_user.get(name) or base
        return (
            bool(account.get("keys"))
            and bool(account.get("shell_usable"))
            and not expired(account, today)
            and "error" not in effective
            and _may_log_in(name, account, effective)
        )

    declared = {user.name: user for user in desired.admin_users}
    if desired.sshd.permit_root_login != "no":
        declared_names = set(declared) | {"root"}
    else:
        declared_names = set(declared)
    for name, account in sorted(on_node.items()):
        if name in declared_names or name == accounts.get("session_user"):
            continue
        if can_log_in(name, account):
            found = f"{name} can log in ({account.get('keys')} authorized keys)"
            yield (
                f"accounts.undeclared:{name}", WARN,
                "no SSH login for accounts the inventory does not declare", found, RUN_DEPLOY,
            )  # fmt: skip
    for name, user in sorted(declared.items()):
        account = on_node.get(name)
        if user.ssh_keys and (account is None or not can_log_in(name, account)):
            found = "no such account" if account is None else "cannot log in"
            yield f"accounts.admin:{name}", WARN, f"{name} can log in", found, RUN_DEPLOY


SLURM_GRES_FIX = (
    "drain the node; once its GPUs are as they should be, run deploys/gpu_node.py (it "
    "rewrites gres.conf from the GPUs and restarts slurmd)"
)


def slurm_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    """The GRES slurmd hands out (gres.conf) against the GPUs the driver reports.

    Critical: Slurm gives jobs the GPUs of gres.conf; one the node no longer has is handed to
    a job that then fails (or waits on a GPU that is not there), so jobs should not land on
    the node until it is repaired or its GRES rewritten.
    """
    if not desired.slurm.enabled:
        return
    section: Section = facts.get("slurm") or {}
    state = section.get("state")
    if state == "absent":
        found = f"absent: {section.get('reason') or 'no gres.conf'}"
        yield "slurm.gres_conf", WARN, "gres.conf of the node's GPUs", found, RUN_DEPLOY
        return
    if state != "ok":
        yield from _unreadable("slurm", section)
        return
    yield from _unread_lines("slurm", GRES_CONF, section.get("problems"))
    report: Section = facts.get("gpu") or {}
    if report.get("state") != "ok":
        return  # the GPU rules say why the GPUs are unknown
    expected, _ = gres_gpus(report.get("gpus") or [], desired.slurm.gpu_type)
    listed_gres = sorted(
        GresGpu(str(gpu.get("type")), str(gpu.get("file"))) for gpu in section["gres"]
    )
    if listed_gres == expected:
        return
    files = {gpu.file for gpu in expected}
    listed = {gpu.file for gpu in listed_gres}
    details = [f"gres.conf {gres_summary(listed_gres)}"]
    if gone := sorted(listed - files):
        details.append(f"no GPU of the node at {', '.join(gone)}")
    if unlisted := sorted(files - listed):
        details.append(f"GPUs not in gres.conf: {', '.join(unlisted)}")
    expected_text = f"GRES {gres_summary(expected)} (the node's {len(expected)} GPUs)"
    yield "slurm.gres", CRIT, expected_text, "; ".join(details), SLURM_GRES_FIX


INTEGRITY_FIX = (
    "find out who changed it (auditd, shell history, the package log); reinstall the package "
    "or restore the file, then accept: sudo python3 -I /usr/local/lib/gpunode-audit/"
    "file_integrity.py --config /etc/gpunode/aide.conf --state /var/lib/gpunode/aide accept"
)
INTEGRITY_OVERDUE_FIX = "systemctl status gpunode-file-integrity.timer; run deploys/gpu_node.py"
# The alerts one finding lists by name: enough to start looking, few enough for a table.
MAX_INTEGRITY_PATHS_SHOWN = 5


def file_integrity_rules(
    desired: DesiredState, facts: dict[str, Any], now: datetime.datetime | None = None
) -> Iterator[tuple]:
    """AIDE's alerts (files changed outside a gpunode run that no package explains):
    critical where a program or library changed (a trojaned binary runs every job), a
    warning elsewhere; a database missing or a check overdue is a warning."""
    settings = desired.audit.file_integrity
    if not settings.enabled:
        return
    section: Section = facts.get("file_integrity") or {}
    state = section.get("state")
    if state == "absent":
        found = f"absent: {section.get('reason') or 'aide is not installed'}"
        yield "audit.file_integrity", WARN, "AIDE installed and checking", found, RUN_DEPLOY
        return
    if state != "ok":
        yield from _unreadable("file_integrity", section)
        return
    yield from _unread_lines("file_integrity", "summary.json", section.get("problems"))
    if not section.get("database"):
        yield ("audit.file_integrity.database", WARN, "AIDE's database built",
               "no database", RUN_DEPLOY)  # fmt: skip
        return
    summary: Section = section.get("summary") or {}
    if summary.get("last_error"):
        yield ("audit.file_integrity.error", WARN, "the last AIDE check ran",
               str(summary["last_error"]), REPORT_BUG)  # fmt: skip
    last = summary.get("last_check") or summary.get("initialised")
    now = now or datetime.datetime.now(datetime.UTC)
    if last:
        checked = datetime.datetime.strptime(last, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.UTC
        )
        age_hours = (now - checked).total_seconds() / 3600
        if age_hours > settings.max_age_hours:
            yield ("audit.file_integrity.overdue", WARN,
                   f"an AIDE check within {settings.max_age_hours} h",
                   f"last check {last} ({age_hours:.0f} h ago)",
                   INTEGRITY_OVERDUE_FIX)  # fmt: skip
    alerts = summary.get("alerts") or []
    count = max(int(summary.get("alert_count") or 0), len(alerts))
    if not count:
        return
    binaries = [alert for alert in alerts if is_system_binary(str(alert.get("path")))]
    severity = CRIT if binaries else WARN
    shown = (binaries or alerts)[:MAX_INTEGRITY_PATHS_SHOWN]
    listed = "; ".join(f"{alert.get('kind')} {alert.get('path')}" for alert in shown)
    more = count - len(shown)
    found = f"{count} changed outside a gpunode run: {listed}" + (
        f" (and {more} more)" if more > 0 else ""
    )
    where = "system programs or libraries" if binaries else "watched files"
    yield ("audit.file_integrity.changed", severity, f"{where} as gpunode or a package left them",
           found, INTEGRITY_FIX)  # fmt: skip


DCGM_DIAG_FIX = "drain the node; run dcgmi diag -r 2 -v on it and open a hardware ticket"


def dcgm_diag_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    """DCGM's diagnostic, where it was run (``gpunode drift --dcgm-diag LEVEL`` on a node that
    declares DCGM): every test passes. A diagnostic that could not run or be read fails too:
    a gate must not pass a node it could not check."""
    yield from dcgm_diag_findings(facts.get("dcgm_diag"))


def dcgm_diag_findings(section: Section | None) -> Iterator[tuple]:
    """The findings of one DCGM diagnostic result (``parse_dcgm_diag``'s), as the drift check
    and ``gpunode triage`` report them."""
    if section is None:
        return
    expected = "every DCGM diagnostic test passes"
    state = section.get("state")
    if state == "absent":
        yield "dcgm.diag", CRIT, expected, "dcgmi is not installed", RUN_DEPLOY
        return
    if state != "ok":
        reason = section.get("reason") or state or "no data"
        yield "dcgm.diag", CRIT, expected, f"not run or unreadable: {reason}", DCGM_DIAG_FIX
        return
    details = {test.get("name"): test.get("detail") or [] for test in section.get("tests") or []}
    failing = {test.get("name"): _dcgm_failing_parts(test) for test in section.get("tests") or []}
    for name in section.get("failed") or []:
        words = "; ".join(str(word) for word in details.get(name, [])[:2])
        parts = failing.get(name) or ""
        found = (
            f"{name} failed" + (f" on {parts}" if parts else "") + (f": {words}" if words else "")
        )
        yield f"dcgm.diag:{name}", CRIT, expected, found, DCGM_DIAG_FIX
    yield from _unread_lines("dcgm", "dcgmi diag -j", section.get("problems"))


def _dcgm_failing_parts(test: dict[str, Any]) -> str:
    """The parts a DCGM test failed on, as DCGM names them (DCGM 4: "GPU 1 (serial ...)"), where
    it failed on some and not all of them: a test failed on every part names none."""
    results = [result for result in test.get("results") or [] if result.get("entity")]
    failed = [result for result in results if result.get("status") == "fail"]
    if not failed or len(failed) == len(results):
        return ""
    return ", ".join(
        str(result["entity"]) + (f" (serial {result['serial']})" if result.get("serial") else "")
        for result in failed
    )


MALWARE_FIX = (
    "isolate the node (drain it), look at each file (a false positive, or how it got there: "
    "auditd, shell history, the owner); remove or restore it by hand, then run the scan "
    "again: sudo systemctl start gpunode-malware-scan.service (gpunode never deletes a file)"
)
MALWARE_OVERDUE_FIX = "systemctl status gpunode-malware-scan.timer; run deploys/gpu_node.py"
SIGNATURES_FIX = (
    "journalctl -u gpunode-malware-scan.service (freshclam's lines); check the mirror in "
    "audit.malware_scan.signatures and that the node reaches it"
)
MAX_MALWARE_PATHS_SHOWN = 5


def _hours_since(moment: str, now: datetime.datetime) -> float:
    then = datetime.datetime.strptime(moment, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    return (now - then).total_seconds() / 3600


def malware_scan_rules(
    desired: DesiredState, facts: dict[str, Any], now: datetime.datetime | None = None
) -> Iterator[tuple]:
    """ClamAV's last scan: a file found is critical (the node may run someone else's code);
    a scan missing or overdue, an error, or signatures missing or stale, a warning."""
    settings = desired.audit.malware_scan
    if not settings.enabled:
        return
    section: Section = facts.get("malware_scan") or {}
    state = section.get("state")
    if state == "absent":
        found = f"absent: {section.get('reason') or 'clamscan is not installed'}"
        yield "audit.malware_scan", WARN, "ClamAV installed and scanning", found, RUN_DEPLOY
        return
    if state != "ok":
        yield from _unreadable("malware_scan", section)
        return
    yield from _unread_lines("malware_scan", "result.json", section.get("problems"))
    now = now or datetime.datetime.now(datetime.UTC)
    result: Section = section.get("result") or {}
    yield from _signature_findings(settings, section, result, now)
    finished = result.get("finished")
    if not finished:
        yield ("audit.malware_scan.overdue", WARN, f"a scan within {settings.max_age_hours} h",
               "no scan result", MALWARE_OVERDUE_FIX)  # fmt: skip
        return
    age = _hours_since(finished, now)
    if age > settings.max_age_hours:
        yield ("audit.malware_scan.overdue", WARN, f"a scan within {settings.max_age_hours} h",
               f"last scan {finished} ({age:.0f} h ago)", MALWARE_OVERDUE_FIX)  # fmt: skip
    if result.get("status") == "error":
        errors = "; ".join(str(line) for line in (result.get("errors") or [])[:3])
        found = f"clamscan exited {result.get('exit_status')}: {errors or 'no message'}"
        yield "audit.malware_scan.error", WARN, "the last scan ran", found, REPORT_BUG
    yield from _unread_lines("malware_scan", "clamscan's output", result.get("unread"))
    infected = result.get("infected") or []
    count = max(int(result.get("infected_count") or 0), len(infected))
    if not count:
        return
    shown = infected[:MAX_MALWARE_PATHS_SHOWN]
    listed = "; ".join(f"{entry.get('path')} ({entry.get('signature')})" for entry in shown)
    more = count - len(shown)
    found = f"{count} found by the scan of {finished}: {listed or 'names not kept'}" + (
        f" (and {more} more)" if more > 0 else ""
    )
    yield "audit.malware_scan.found", CRIT, "no malware found", found, MALWARE_FIX


def _signature_findings(
    settings: MalwareScan, section: Section, result: Section, now: datetime.datetime
) -> Iterator[tuple]:
    databases = section.get("databases") or []
    if not databases:
        found = "no database in /var/lib/clamav"
        if result.get("signatures_update_output"):
            found += ": " + "; ".join(map(str, result["signatures_update_output"][-2:]))
        yield ("audit.malware_scan.signatures", WARN, "ClamAV's signature database present",
               found, SIGNATURES_FIX)  # fmt: skip
        return
    limit = settings.signatures.max_age_hours
    updated = result.get("signatures_updated")
    if updated:
        age = _hours_since(updated, now)
        where = f"last updated {updated} ({age:.0f} h ago)"
    else:
        newest = max(int(database.get("mtime") or 0) for database in databases)
        age = (now.timestamp() - newest) / 3600
        where = f"no successful update recorded; newest database file {age:.0f} h old"
    if age > limit:
        yield ("audit.malware_scan.signatures_stale", WARN,
               f"signatures updated within {limit} h", where, SIGNATURES_FIX)  # fmt: skip


AUDITD_FIX = "systemctl status auditd; journalctl -u auditd; run deploys/harden.py"


def auditd_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    """auditd where the kernel allows it: running, with gpunode's watches loaded (a warning
    each: a deploy fixes them, and nothing about the node keeps jobs from it). Where the
    kernel refuses audit (a container), an info finding with the reason: nothing to fix."""
    if not desired.audit.auditd.enabled:
        return
    section: Section = facts.get("auditd") or {}
    if section.get("state") != "ok":
        yield from _unreadable("auditd", section)
        return
    if section.get("kernel_allows") is False:
        found = f"skipped: {section.get('refused_because') or 'the kernel refuses audit'}"
        yield "audit.auditd.skipped", INFO, "auditd running", found, "none (the kernel's limit)"
        return
    if section.get("kernel_allows") is None:
        found = f"unknown: {section.get('refused_because') or 'the kernel check gave no answer'}"
        yield "audit.auditd.unknown", WARN, "the kernel's audit support known", found, REPORT_BUG
        return
    yield from _unread_lines("auditd", "auditctl -l", section.get("problems"))
    if not section.get("installed"):
        yield "audit.auditd", WARN, "auditd running", "not installed", RUN_DEPLOY
        return
    if not section.get("active"):
        found = f"auditd {section.get('unit_state') or 'not running'}"
        yield "audit.auditd", WARN, "auditd running", found, AUDITD_FIX
        return
    loaded = {(w.get("path"), w.get("key")) for w in section.get("watches") or []}
    missing = [f"{path} ({key})" for path, key in WATCHES if (path, key) not in loaded]
    if missing:
        shown = ", ".join(missing[:MAX_INTEGRITY_PATHS_SHOWN])
        more = len(missing) - MAX_INTEGRITY_PATHS_SHOWN
        found = f"{len(missing)} not loaded: {shown}" + (f" (and {more} more)" if more > 0 else "")
        yield ("audit.auditd.rules", WARN, f"gpunode's {len(WATCHES)} audit watches loaded",
               found, "augenrules --load; run deploys/harden.py")  # fmt: skip


LYNIS_FIX = (
    "read /var/log/lynis-report.dat's warning[] and suggestion[] lines; run deploys/harden.py"
)
LYNIS_OVERDUE_FIX = "systemctl status lynis.timer lynis.service; run deploys/harden.py"
# The lynis test IDs one finding names: enough to start looking, few enough for a table.
MAX_LYNIS_TESTS_SHOWN = 8


def lynis_rules(
    desired: DesiredState, facts: dict[str, Any], now: datetime.datetime | None = None
) -> Iterator[tuple]:
    """The last lynis report: an index below the inventory's floor is a warning (settings
    drifted from the hardening a deploy makes: a deploy or a look fixes it, and nothing in
    it keeps jobs off the node; file integrity and auditd carry the tampering alarms); a
    report missing, unreadable or older than max_age_hours (the timer stopped) is a warning.
    report_datetime_end is the node's local time: gpunode's nodes keep UTC (systemd's
    default, timedatectl), so it is read as UTC."""
    settings = desired.audit.lynis
    if not settings.enabled:
        return
    section: Section = facts.get("lynis") or {}
    state = section.get("state")
    if state in ("absent", "missing"):
        found = f"{state}: {section.get('reason') or 'no report'}"
        yield "audit.lynis.report", WARN, "a lynis report", found, LYNIS_OVERDUE_FIX
        return
    if state != "ok":
        yield from _unreadable("lynis", section)
        return
    yield from _unread_lines("lynis", "lynis-report.dat", section.get("problems"))
    report: Section = section.get("report") or {}
    ended = report.get("report_end")
    now = now or datetime.datetime.now(datetime.UTC)
    if not ended:
        yield ("audit.lynis.report", WARN, "a finished lynis report", "no report_datetime_end",
               LYNIS_OVERDUE_FIX)  # fmt: skip
    else:
        finished = datetime.datetime.strptime(ended, "%Y-%m-%d %H:%M:%S").replace(
            tzinfo=datetime.UTC
        )
        age_hours = (now - finished).total_seconds() / 3600
        if age_hours > settings.max_age_hours:
            yield ("audit.lynis.overdue", WARN, f"a lynis report within {settings.max_age_hours} h",
                   f"last report {ended} ({age_hours:.0f} h ago)", LYNIS_OVERDUE_FIX)  # fmt: skip
    index = report.get("hardening_index")
    if index is None:
        yield ("audit.lynis.index", WARN, "a hardening index in the report", "none",
               LYNIS_OVERDUE_FIX)  # fmt: skip
    elif index < settings.min_hardening_index:
        tests = sorted(
            {
                str(item.get("test"))
                for item in (report.get("warnings") or []) + (report.get("suggestions") or [])
            }
        )
        shown = ", ".join(tests[:MAX_LYNIS_TESTS_SHOWN])
        more = len(tests) - MAX_LYNIS_TESTS_SHOWN
        found = f"hardening index {index}; lynis tests with findings: {shown}" + (
            f" (and {more} more)" if more > 0 else ""
        )
        yield ("audit.lynis.index", WARN,
               f"hardening index at least {settings.min_hardening_index}", found,
               LYNIS_FIX)  # fmt: skip


MPS_FIX = (
    f"systemctl status {expected_mps.UNIT}; journalctl -u {expected_mps.UNIT}; "
    "run deploys/gpu_node.py"
)
COMPUTE_MODE_FIX = (
    f"drain the node; nvidia-smi -i <GPU> -c {expected_mps.EXCLUSIVE_PROCESS} (or run "
    "deploys/gpu_node.py); find who changed it"
)


def mps_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    """The MPS control daemon runs, and its GPUs are in EXCLUSIVE_PROCESS compute mode.

    A GPU whose compute mode was changed back to Default takes CUDA contexts outside MPS;
    a stopped daemon makes every job open the GPUs directly (and, in EXCLUSIVE_PROCESS mode,
    only the first of them succeeds): both are critical for a node sold as MPS-shared.
    """
    if not desired.mps.enabled:
        return
    section: Section = facts.get("mps") or {}
    if section.get("state") == "unreadable":
        yield from _unreadable("mps", section)
        return
    yield from _unread_lines("mps", "nvidia-smi --query-gpu=index,compute_mode",
                             section.get("problems"))  # fmt: skip
    if not section.get("control_installed"):
        yield ("mps.control", CRIT, f"{expected_mps.CONTROL} installed", "missing",
               RUN_DEPLOY)  # fmt: skip
    elif not section.get("active"):
        found = str(section.get("unit_state") or "unknown")
        yield "mps.daemon", CRIT, f"{expected_mps.UNIT} active", found, MPS_FIX
    modes = section.get("compute_modes")
    if desired.exclusive_process_gpus is None or modes is None:
        return
    indexes = sorted(int(index) for index in modes if str(index).isdigit())
    for index in expected_mps.exclusive_gpus(desired, indexes):
        found = modes.get(str(index))
        if found != expected_mps.EXCLUSIVE_PROCESS_SHOWN:
            yield (f"mps.compute_mode:gpu{index}", CRIT, expected_mps.EXCLUSIVE_PROCESS_SHOWN,
                   str(found), COMPUTE_MODE_FIX)  # fmt: skip
    for index in desired.mps.gpus:
        if str(index) not in modes:
            yield (f"mps.compute_mode:gpu{index}", CRIT, expected_mps.EXCLUSIVE_PROCESS_SHOWN,
                   "GPU not listed by nvidia-smi", HARDWARE_TICKET)  # fmt: skip


KUBERNETES_HOST_FIX = "run deploys/gpu_node.py (roles/kubernetes.py says what it cannot change)"


def kubernetes_rules(desired: DesiredState, facts: dict[str, Any]) -> Iterator[tuple]:
    """A Kubernetes worker's host: cgroup v2, no swap, overlay and br_netfilter, forwarding
    and bridged traffic through iptables, and gpunode's forward chain filtering.

    cgroup v1 and active swap keep kubelet from running (critical); a missing module or
    sysctl breaks pod networking (critical); an unfiltered forward path is a security
    regression, not an outage (warning).
    """
    if not desired.kubernetes.enabled:
        return
    section: Section = facts.get("kubernetes") or {}
    if section.get("state") == "unreadable":
        yield from _unreadable("kubernetes", section)
        return
    yield from _unread_lines("kubernetes", "the Kubernetes host checks", section.get("problems"))
    cgroup = section.get("cgroup")
    if cgroup != "v2":
        yield ("kubernetes.cgroup", CRIT, "cgroup v2 (unified hierarchy)", str(cgroup or "unknown"),
               "boot with systemd.unified_cgroup_hierarchy=1 (drain first)")  # fmt: skip
    swap = section.get("swap_active") or []
    if swap:
        yield ("kubernetes.swap", CRIT, "no swap active", ", ".join(swap),
               "swapoff -a; remove swap from /etc/fstab; run deploys/gpu_node.py")  # fmt: skip
    loaded = set(section.get("modules") or [])
    for module in expected_kubernetes.KUBERNETES_MODULES:
        if module not in loaded:
            yield (f"kubernetes.module:{module}", CRIT, f"{module} loaded", "not loaded",
                   KUBERNETES_HOST_FIX)  # fmt: skip
    live = section.get("sysctls") or {}
    for name, value in expected_kubernetes.wanted_sysctls(desired).items():
        if live.get(name) != value:
            yield (f"kubernetes.sysctl:{name}", CRIT, f"{name} = {value}",
                   f"{name} = {live.get(name) or 'absent'}", KUBERNETES_HOST_FIX)  # fmt: skip
    if section.get("forward_filtered") is not True:
        found = "no nft to read it" if section.get("forward_filtered") is None else "missing"
        yield ("kubernetes.forward", WARN, f"table {TABLE} chain forward, policy drop", found,
               RUN_DEPLOY)  # fmt: skip
    installed = section.get("packages") or {}
    wanted = desired.kubernetes
    for name in wanted.packages:
        package = installed.get(name)
        expected = f"{name} {wanted.version or 'installed'}" + (", held" if wanted.hold else "")
        if package is None:
            yield f"kubernetes.package:{name}", WARN, expected, "not installed", RUN_DEPLOY
        elif (wanted.version and package.get("version") != wanted.version) or (
            wanted.hold and not package.get("held")
        ):
            found = f"{name} {package.get('version')}" + (", held" if package.get("held") else "")
            yield f"kubernetes.package:{name}", WARN, expected, found, RUN_DEPLOY


RULES: tuple[Rule, ...] = (
    os_rules,
    gpu_rules,
    gpu_health_rules,
    infiniband_rules,
    infiniband_counter_rules,
    nvme_rules,
    sshd_rules,
    firewall_rules,
    tls_rules,
    package_rules,
    secure_boot_rules,
    container_runtime_rules,
    nccl_rules,
    nvme_cache_rules,
    access_rules,
    slurm_rules,
    file_integrity_rules,
    dcgm_diag_rules,
    malware_scan_rules,
    auditd_rules,
    lynis_rules,
    mps_rules,
    kubernetes_rules,
    shared_data_rules,
    registry_access_rules,
)


def advisory_findings(
    host: str, desired: DesiredState, today: datetime.date | None
) -> list[Finding]:
    """The desired state's advisories (``DesiredState.advisories``) as info findings: a pinned
    driver branch past its end of life or a new feature branch, a toolkit that runs on the
    pinned driver only through minor-version compatibility. Dated by ``today``."""
    return [
        Finding(f"advisory:{advisory.key}", host, INFO, f"{advisory.key} = {advisory.value}",
                advisory.message, "review the inventory's pin")
        for advisory in desired.advisories(today)
    ]  # fmt: skip


def evaluate(
    host: str, desired: DesiredState, facts: Any, today: datetime.date | None = None
) -> list[Finding]:
    """Every rule over one host's facts, never raising.

    The facts come from the node: their text is cleaned once (``gpunode.sanitize``), then
    each section that does not fit the shape its rules read becomes unreadable
    (``gpunode.drift.shape``). A rule that still fails on this host's facts becomes a finding
    for this host alone; the other rules, and the other hosts, are still evaluated.
    """
    if not isinstance(facts, dict):
        found = f"not an object of sections: {type(facts).__name__}"
        return [Finding("facts.unreadable", host, WARN, "facts readable", found, RUN_DEPLOY)]
    facts = checked_facts(clean_tree(facts))
    findings = []
    for rule in RULES:
        try:
            for item in rule(desired, facts):
                finding_id, severity, expected, found, fix = item[:5]
                # A health rule's sixth item: failure_class, evidence, confidence, remedy.
                extra: dict[str, str] = item[5] if len(item) > 5 else {}
                findings.append(Finding(finding_id, host, severity, expected, found, fix, **extra))
        except Exception as error:  # one rule's failure on one host is that host's finding
            name = getattr(rule, "__name__", "rule")
            found = f"{type(error).__name__}: {error}"
            findings.append(
                Finding(f"drift.rule_failed:{name}", host, WARN, f"{name} evaluates", found,
                        REPORT_BUG)
            )  # fmt: skip
    return findings + advisory_findings(host, desired, today)

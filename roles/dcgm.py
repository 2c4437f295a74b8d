"""DCGM: its packages pinned and held, nvidia-dcgm enabled and running; DCGM's exporter.

DCGM 4 (``dcgm.major``, the default) is NVIDIA's ``datacenter-gpu-manager-4-core`` with the
part built for the node's CUDA major (``datacenter-gpu-manager-4-cuda12`` / ``-cuda13``:
``DesiredState.dcgm_cuda_major``); DCGM 3 is the single ``datacenter-gpu-manager``. The
packages move together at ``dcgm.version``; without it they are held at the version first
installed. NVIDIA's packages install ``nvidia-dcgm.service`` without enabling it, so gpunode
enables and starts it.

``dcgm.exporter`` adds ``datacenter-gpu-manager-exporter`` from the same repository (DCGM 4
only; its release is paired with a DCGM release, which validation checks where gpunode knows
the pair) and runs its service, listening on port 9400, over the same TLS 1.3 and client
certificate settings as node_exporter: exporter-toolkit's web configuration
(``gpunode.expected.exporters``) through dcgm-exporter's ``--web-config-file`` flag, which a
systemd drop-in adds to the packaged unit's command line (NVIDIA's unit,
packaging/config-files/systemd/nvidia-dcgm-exporter.service, read 2026-12-02, runs
``dcgm-exporter -f /etc/dcgm-exporter/default-counters.csv``). That unit runs it as
``User=root``, so it reads the node key itself (0600 root:root, roles/tls.py): unlike
node_exporter it needs no copy. The web configuration and drop-in are in place before the
package, so its first start is already over mutual TLS; exporter-toolkit reads the web
configuration, certificate and key again for every new connection, so a renewed certificate
is served without a restart (no scrape fails); a change of the drop-in restarts it. The
firewall opens the port to ``firewall.monitoring_networks`` only (``exporter_ports``), and the
model requires ``tls.enabled`` with the exporter. A repository that does not carry a package
is an error naming the package and the repository URL, before anything changes, never a
silent skip. A node moving from DCGM 3 to 4 has ``datacenter-gpu-manager`` removed in the
same apt run (the packages conflict), its hold lifted first. A node whose CUDA major moves
(12 to 13 with a driver branch that runs it) has DCGM's part for the old major removed, its
hold lifted, before the new part is installed: held at its version, which it needs the core
at exactly, it would stop the next DCGM upgrade.

``dcgm.enabled: false`` leaves DCGM as found: gpunode does not remove a DCGM it may not have
installed.
"""

from __future__ import annotations

import re
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus
from pyinfra.operations import files, systemd

from facts.container_runtime import DpkgPackageState
from facts.freshness import UnitOlderThanFile, UnitsNeedDaemonReload
from facts.nvidia_packages import NvidiaPackages
from facts.tls import CA_PATH, CERT_PATH, KEY_PATH
from gpunode.expected.exporters import render_web_config
from gpunode.expected.packages import DCGM3_PACKAGE, DCGM_EXPORTER_PACKAGE, dcgm_packages
from gpunode.model import DCGM_EXPORTER_PORT, DesiredState
from roles.cuda import held_packages, require_offered

DCGM_SERVICE = "nvidia-dcgm"
EXPORTER_SERVICE = "nvidia-dcgm-exporter"
EXPORTER_UNIT = f"{EXPORTER_SERVICE}.service"
EXPORTER_DROP_IN_DIR = f"/etc/systemd/system/{EXPORTER_UNIT}.d"
EXPORTER_DROP_IN_PATH = f"{EXPORTER_DROP_IN_DIR}/gpunode.conf"
EXPORTER_CONFIG_DIR = "/etc/gpunode/dcgm-exporter"
EXPORTER_WEB_CONFIG_PATH = f"{EXPORTER_CONFIG_DIR}/web.yml"
# The packaged unit's command (NVIDIA/dcgm-exporter packaging/config-files/systemd/
# nvidia-dcgm-exporter.service, read 2026-12-02), which the drop-in repeats with gpunode's flags.
EXPORTER_BINARY = "/usr/bin/dcgm-exporter"
EXPORTER_COUNTERS = "/etc/dcgm-exporter/default-counters.csv"


def render_exporter_web_config() -> str:
    """node_exporter's web configuration, with the node key itself (the exporter runs as
    root)."""
    return render_web_config("dcgm", CERT_PATH, KEY_PATH, CA_PATH)


def exporter_arguments(port: int = DCGM_EXPORTER_PORT) -> list[str]:
    """dcgm-exporter's command line: the packaged one's counters, its listen address
    (``-a``/``--address``) and the web configuration (``--web-config-file``)."""
    return [
        EXPORTER_BINARY,
        "-f",
        EXPORTER_COUNTERS,
        f"--address=:{port}",
        f"--web-config-file={EXPORTER_WEB_CONFIG_PATH}",
    ]


def render_exporter_drop_in(port: int = DCGM_EXPORTER_PORT) -> str:
    """The unit's drop-in: its ``ExecStart`` replaced (emptied first, as systemd requires for
    a service's single command) by the packaged command with the web configuration."""
    command = " ".join(shlex.quote(argument) for argument in exporter_arguments(port))
    return (
        "# Managed by gpunode (dcgm): DCGM's exporter serves over mutual TLS 1.3\n"
        f"# ({EXPORTER_WEB_CONFIG_PATH}); local edits are replaced on the next run.\n"
        f"[Service]\nExecStart=\nExecStart={command}\n"
    )


@operation()
def service_enabled_and_running(service: str):
    """``service`` starts at boot and runs now (its unit may arrive with a package in this run).

    + service: the systemd service's name, without ``.service``
    """
    unit = f"{service}.service"
    running = host.get_fact(SystemdStatus, services=[unit]).get(unit, False)
    enabled = host.get_fact(SystemdEnabled, services=[unit]).get(unit, False)
    if not enabled:
        yield f"systemctl enable {unit}"
    if not running:
        yield f"systemctl start {unit}"
    if enabled and running:
        host.noop(f"{unit} is enabled and running")


@operation()
def dcgm3_replaced(packages: list[str]):
    """DCGM 3's ``datacenter-gpu-manager`` is gone before DCGM 4's packages arrive (they
    conflict, and a held package would stop apt).

    + packages: DCGM 4's packages that replace it
    """
    state = host.get_fact(DpkgPackageState, packages=[DCGM3_PACKAGE])[DCGM3_PACKAGE]
    if not state["installed"]:
        host.noop(f"{DCGM3_PACKAGE} (DCGM 3) is not installed")
        return
    if state["held"]:
        yield f"apt-mark unhold {DCGM3_PACKAGE}"
    yield (
        "DEBIAN_FRONTEND=noninteractive apt-get remove -y -q --allow-change-held-packages "
        f"{DCGM3_PACKAGE}"
    )


# DCGM 4's parts built for one CUDA major (datacenter-gpu-manager-4-cuda11/-cuda12/-cuda13:
# NVIDIA's Ubuntu 24.04 Packages index, research anchors, read 2026-12-01).
DCGM_CUDA_PART = re.compile(r"datacenter-gpu-manager-[0-9]+-cuda[0-9]+")


@operation()
def other_cuda_parts_removed(packages: list[str]):
    """DCGM's parts for other CUDA majors than the one in ``packages`` are not installed.

    + packages: DCGM's packages for this node (``dcgm_packages``), with its one CUDA part
    """
    facts = host.get_fact(NvidiaPackages)
    others = sorted(
        name
        for name in facts["packages"]
        if DCGM_CUDA_PART.fullmatch(name) and name not in packages
    )
    if not others:
        host.noop("no DCGM part for another CUDA major is installed")
        return
    words = " ".join(shlex.quote(name) for name in others)
    held = sorted(set(others) & set(facts["held"]))
    if held:
        yield f"apt-mark unhold {' '.join(shlex.quote(name) for name in held)}"
    yield (
        f"DEBIAN_FRONTEND=noninteractive apt-get remove -y -q --allow-change-held-packages {words}"
    )


@deploy("DCGM")
def dcgm(desired: DesiredState) -> None:
    settings = desired.dcgm
    if not settings.enabled:
        host.noop("dcgm.enabled is false: DCGM left as found")
        return
    url = desired.apt.cuda_repo_url
    packages = list(dcgm_packages(settings.release_major, desired.dcgm_cuda_major))
    # Checked before anything changes: a missing exporter must not leave a half-done run.
    require_offered(packages, url, version=settings.version)
    if settings.exporter:
        require_offered([DCGM_EXPORTER_PACKAGE], url, version=settings.exporter_version)
    if settings.release_major != 3:
        dcgm3_replaced(name=f"{DCGM3_PACKAGE} (DCGM 3) replaced by DCGM 4", packages=packages)
    if any(DCGM_CUDA_PART.fullmatch(name) for name in packages):
        other_cuda_parts_removed(
            name=f"DCGM's parts for another CUDA major than {packages[-1]}'s", packages=packages
        )
    held_packages(
        name=f"{' '.join(packages)} {settings.version or '(unpinned)'}, held",
        packages=packages,
        repository_url=url,
        version=settings.version,
    )
    service_enabled_and_running(name=f"{DCGM_SERVICE} enabled and running", service=DCGM_SERVICE)
    if settings.exporter:
        dcgm_exporter(settings.exporter_version, url)


def dcgm_exporter(version: str | None, repository_url: str) -> None:
    """The exporter over mutual TLS: its web configuration and drop-in first, then the
    package, its service, and a restart when the drop-in changed since it started."""
    files.directory(
        name=f"Directory {EXPORTER_CONFIG_DIR}",
        path=EXPORTER_CONFIG_DIR,
        mode="755",
        user="root",
        group="root",
    )
    files.put(
        name=f"Web configuration {EXPORTER_WEB_CONFIG_PATH} (TLS 1.3, client certificates)",
        src=StringIO(render_exporter_web_config()),
        dest=EXPORTER_WEB_CONFIG_PATH,
        mode="644",
        user="root",
        group="root",
    )
    files.directory(name=f"Directory {EXPORTER_DROP_IN_DIR}", path=EXPORTER_DROP_IN_DIR, mode="755")
    drop_in = files.put(
        name=f"{EXPORTER_DROP_IN_PATH} (--web-config-file)",
        src=StringIO(render_exporter_drop_in()),
        dest=EXPORTER_DROP_IN_PATH,
        mode="644",
        user="root",
        group="root",
    )
    unloaded = host.get_fact(UnitsNeedDaemonReload, units=[EXPORTER_UNIT])
    systemd.daemon_reload(
        name=f"Reload systemd after a change of {EXPORTER_UNIT}'s drop-in",
        _if=lambda: drop_in.did_change() or unloaded,
    )
    held_packages(
        name=f"{DCGM_EXPORTER_PACKAGE} {version or '(unpinned)'}, held",
        packages=[DCGM_EXPORTER_PACKAGE],
        repository_url=repository_url,
        version=version,
    )
    service_enabled_and_running(
        name=f"{EXPORTER_SERVICE} enabled and running", service=EXPORTER_SERVICE
    )
    # Its command line is read at start only (the web configuration, certificate and key at
    # every connection); or it still runs since before the drop-in: a run cut off before this.
    stale = host.get_fact(UnitOlderThanFile, unit=EXPORTER_UNIT, path=EXPORTER_DROP_IN_PATH)
    systemd.service(
        name=f"{EXPORTER_UNIT} restarted for its new command line",
        service=EXPORTER_UNIT,
        restarted=True,
        _if=lambda: drop_in.did_change() or bool(stale),
    )

"""DCGM: datacenter-gpu-manager pinned and held, nvidia-dcgm enabled and running; dcgm-exporter.

``dcgm.version`` pins the package exactly; without it the package is held at the version first
installed. NVIDIA's package installs ``nvidia-dcgm.service`` without enabling it, so gpunode
enables and starts it. ``dcgm.exporter`` adds NVIDIA's ``dcgm-exporter`` package (service
``dcgm-exporter``) from the same repository; a repository that does not carry it is an error
naming the package and the repository URL, never a silent skip.

``dcgm.enabled: false`` leaves DCGM as found: gpunode does not remove a DCGM it may not have
installed.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from gpunode.model import DesiredState
from roles.cuda import held_packages, require_offered

DCGM_PACKAGE = "datacenter-gpu-manager"
DCGM_SERVICE = "nvidia-dcgm"
EXPORTER_PACKAGE = "dcgm-exporter"
EXPORTER_SERVICE = "dcgm-exporter"


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


@deploy("DCGM")
def dcgm(desired: DesiredState) -> None:
    settings = desired.dcgm
    if not settings.enabled:
        host.noop("dcgm.enabled is false: DCGM left as found")
        return
    url = desired.apt.cuda_repo_url
    # Checked before anything changes: a missing exporter must not leave a half-done run.
    require_offered([DCGM_PACKAGE], url, version=settings.version)
    if settings.exporter:
        require_offered([EXPORTER_PACKAGE], url)
    held_packages(
        name=f"{DCGM_PACKAGE} {settings.version or '(unpinned)'}, held",
        packages=[DCGM_PACKAGE],
        repository_url=url,
        version=settings.version,
    )
    service_enabled_and_running(name=f"{DCGM_SERVICE} enabled and running", service=DCGM_SERVICE)
    if settings.exporter:
        held_packages(
            name=f"{EXPORTER_PACKAGE}, held", packages=[EXPORTER_PACKAGE], repository_url=url
        )
        service_enabled_and_running(
            name=f"{EXPORTER_SERVICE} enabled and running", service=EXPORTER_SERVICE
        )

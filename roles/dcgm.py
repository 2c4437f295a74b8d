"""DCGM: its packages pinned and held, nvidia-dcgm enabled and running; DCGM's exporter.

DCGM 4 (``dcgm.major``, the default) is NVIDIA's ``datacenter-gpu-manager-4-core`` with the
part built for the node's CUDA major (``datacenter-gpu-manager-4-cuda12`` / ``-cuda13``:
``DesiredState.dcgm_cuda_major``); DCGM 3 is the single ``datacenter-gpu-manager``. The
packages move together at ``dcgm.version``; without it they are held at the version first
installed. NVIDIA's packages install ``nvidia-dcgm.service`` without enabling it, so gpunode
enables and starts it.

``dcgm.exporter`` adds ``datacenter-gpu-manager-exporter`` from the same repository (DCGM 4
only; its release is paired with a DCGM release, which validation checks where gpunode knows
the pair) and runs its service, listening on port 9400. A repository that does not carry a
package is an error naming the package and the repository URL, before anything changes, never
a silent skip. A node moving from DCGM 3 to 4 has ``datacenter-gpu-manager`` removed in the
same apt run (the packages conflict), its hold lifted first.

``dcgm.enabled: false`` leaves DCGM as found: gpunode does not remove a DCGM it may not have
installed.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from facts.container_runtime import DpkgPackageState
from gpunode.expected.packages import DCGM3_PACKAGE, DCGM_EXPORTER_PACKAGE, dcgm_packages
from gpunode.model import DesiredState
from roles.cuda import held_packages, require_offered

DCGM_SERVICE = "nvidia-dcgm"
EXPORTER_SERVICE = "nvidia-dcgm-exporter"


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
    held_packages(
        name=f"{' '.join(packages)} {settings.version or '(unpinned)'}, held",
        packages=packages,
        repository_url=url,
        version=settings.version,
    )
    service_enabled_and_running(name=f"{DCGM_SERVICE} enabled and running", service=DCGM_SERVICE)
    if settings.exporter:
        held_packages(
            name=f"{DCGM_EXPORTER_PACKAGE} {settings.exporter_version or '(unpinned)'}, held",
            packages=[DCGM_EXPORTER_PACKAGE],
            repository_url=url,
            version=settings.exporter_version,
        )
        service_enabled_and_running(
            name=f"{EXPORTER_SERVICE} enabled and running", service=EXPORTER_SERVICE
        )

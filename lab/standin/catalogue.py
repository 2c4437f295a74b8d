"""The stand-in package catalogue: names, versions and dependencies of NVIDIA's apt repositories,
generated from the data file ``world.toml`` beside this module.

``world.toml`` records every release and every package template (control fields and the real
package's relations, with ``{placeholders}``) and, for each, where it comes from: a
``[sources.KEY]`` entry (URL where one was seen, the date it was read, what it says) or
``assumed`` with the reason. Where the stand-in departs from the real relations (no ``dkms``, no
X/GL libraries, no InfiniBand userspace: the lab stays hermetic and the packages tiny) the data
lists the departure; ``tests/unit/test_standin_catalogue.py`` checks the built relations are
exactly the recorded ones minus/plus those. This module adds only what the data cannot say: the
tiny contents (scripts, systemd units, maintainer scripts), keyed by each template's ``id``.

Repositories, laid out and named as NVIDIA publishes them:

- ``CUDA_REPO``: NVIDIA's CUDA repository, served for Debian 12 and Debian 13
  (``compute/cuda/repos/debian12/x86_64`` and ``debian13/x86_64``, the same package set): the
  driver for branches 550, 570, 580 and 595 (two releases each, ``DRIVER_VERSIONS``) in both
  kernel module flavours, Fabric Manager, NSCQ, IMEX, NVLSM, DCGM 3 and 4 with the exporter,
  CUDA toolkits 12.4, 12.8, 12.9, 13.0 and 13.1, the ``cuda`` metapackage and NCCL.
- ``LIBNVIDIA_CONTAINER_REPO``: the NVIDIA Container Toolkit repository
  (``libnvidia-container/stable/deb/amd64``), ``CONTAINER_TOOLKIT_VERSIONS``.

Dependency shapes follow the real repositories, including the parts that bite:

- NVIDIA's Debian packaging of the driver (same names as Debian's ``nvidia-graphics-drivers``):
  ``nvidia-driver`` needs ``nvidia-kernel-dkms (= V) | nvidia-kernel-V``; both kernel module
  packages provide ``nvidia-kernel-V`` and conflict with each other; ``libcuda1`` *recommends*
  the kernel module, so a userspace-only install needs ``--no-install-recommends``.
- NVIDIA's installation guide for Debian: ``nvidia-open`` (open modules) or ``cuda-drivers``
  (proprietary) for a full install; ``nvidia-driver-cuda`` plus ``nvidia-kernel-open-dkms`` or
  ``nvidia-kernel-dkms`` for a compute-only node (no ``nvidia-driver``).
- Two packaging eras. Up to 580 ``cuda-drivers`` depends on the branch's ``cuda-drivers-<b>``;
  from 590 on there are no branch-suffixed metapackages and ``cuda-drivers`` / ``nvidia-open``
  track the newest driver unless ``nvidia-driver-pinning-<b>`` (580 and 595 here; Provides,
  Conflicts and Replaces ``nvidia-driver-pinning``) installs an apt preferences file pinning the
  branch at priority 1000. Fabric Manager is ``nvidia-fabricmanager-<b>`` (provides, replaces and
  conflicts with ``nvidia-fabricmanager``) up to 570 and plain ``nvidia-fabricmanager`` +
  ``libnvidia-nscq`` (+ ``nvidia-imex``) at the driver's version from 580.
- Metapackages require ``>=`` versions (``cuda-drivers-550`` is satisfied by the 570 driver,
  ``cuda-toolkit-12-4=12.4.0-1`` pulls the newest ``cuda-nvcc-12-4``) while the driver's own
  packages require ``=``: installing an old release needs apt preferences (or every package
  named with its version), exactly as on the real repository.
- ``cuda`` -> ``cuda-X-Y`` -> ``cuda-runtime-X-Y`` -> ``cuda-drivers (>= the release's
  driver)``: installing ``cuda`` installs a driver; ``cuda-toolkit-X-Y`` does not.
- DCGM 4 (``datacenter-gpu-manager-4-core`` and ``-4-cuda12`` / ``-4-cuda13``, epoch 1)
  replaces DCGM 3 (``datacenter-gpu-manager``); ``datacenter-gpu-manager-exporter`` comes in the
  release paired with each DCGM 4 release and ships ``nvidia-dcgm-exporter.service``.
- Container Toolkit 1.18 and later: ``nvidia-container-toolkit-base`` ships
  ``nvidia-cdi-refresh.service`` / ``.path`` and its postinst enables them, as NVIDIA's does.

Libraries are not shipped (only ``/usr/share/doc/<package>/README.gpunode-lab``), so nothing
triggers ``ldconfig``; DKMS is never invoked. The kernel module packages record what a reboot
would load instead: ``INSTALLED_DRIVER_VERSION_PATH`` (e.g. ``550.127.08``) and
``INSTALLED_KERNEL_MODULE_FLAVOUR_PATH`` (``open`` or ``proprietary``), removed again when the
package goes. Stand-in programs (``nvidia-ctk``, daemons) run with the node's ``/usr/bin/python3``.

What the stand-in programs do:

- ``/usr/bin/nvidia-smi`` (package ``nvidia-smi``): says the driver is not loaded and exits 9.
  On lab nodes the GPU simulator owns that path (dpkg diversion) and this copy lands at
  ``/usr/bin/nvidia-smi.distrib``.
- ``nvidia-persistenced`` (enabled and started on install, like Debian's package),
  ``nv-fabricmanager``, ``nv-hostengine`` (DCGM 3 and 4), ``nvidia-imex`` and ``dcgm-exporter``
  (installed but not enabled): ``daemon.py``. Fabric Manager refuses to start unless the loaded
  driver (``nvidia-smi``) has exactly its version; the exporter serves a few ``DCGM_FI_DEV_*``
  metrics of the simulated GPUs on ``:9400``.
- ``nvidia-ctk`` (``nvidia-container-toolkit-base``): ``nvidia_ctk.py``, behaving as its release.
- ``nvcc --version``, ``dcgmi --version`` / ``discovery -l``, ``nvidia-container-cli
  --version``, ``nvidia-container-runtime`` (runs ``runc`` when present): short shell scripts.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpunode.nvidia_releases import driver_cuda_version

from . import nvidia_ctk

CUDA_REPO = "cuda"
LIBNVIDIA_CONTAINER_REPO = "libnvidia-container"
# The lab's stand-in Ubuntu archive (restricted): Ubuntu's own driver packages (ubuntu.py).
UBUNTU_REPO = "ubuntu"

INSTALLED_DRIVER_VERSION_PATH = "/var/lib/gpunode-lab/installed-driver-version"
INSTALLED_KERNEL_MODULE_FLAVOUR_PATH = "/var/lib/gpunode-lab/installed-kernel-module-flavour"
# The CUDA version that driver reports (nvidia_releases.driver_cuda_version), for the simulator.
INSTALLED_DRIVER_CUDA_VERSION_PATH = "/var/lib/gpunode-lab/installed-driver-cuda-version"

CUDA_MAINTAINER = "cudatools <cudatools@nvidia.com>"
CONTAINER_MAINTAINER = "NVIDIA CORPORATION <cudatools@nvidia.com>"
# The Maintainer field of Ubuntu's packages (Ubuntu's archive policy).
UBUNTU_MAINTAINER = "Ubuntu Core Developers <ubuntu-devel-discuss@lists.ubuntu.com>"
HERE = Path(__file__).resolve().parent
WORLD_PATH = HERE / "world.toml"
PYTHON_SHEBANG = "#!/usr/bin/python3 -I\n"  # -I: the script's directory must not shadow stdlib

RELATION_FIELDS = ("depends", "recommends", "provides", "conflicts", "replaces", "breaks")
# The families of package templates, and the repository each one's packages are published in.
FAMILY_REPOSITORY = {
    "driver": CUDA_REPO,
    "nvlsm": CUDA_REPO,
    "dcgm3": CUDA_REPO,
    "dcgm4": CUDA_REPO,
    "dcgm-exporter": CUDA_REPO,
    "cuda-common": CUDA_REPO,
    "cuda-toolkit": CUDA_REPO,
    "nccl": CUDA_REPO,
    "container-toolkit": LIBNVIDIA_CONTAINER_REPO,
}
# A family's package version when its template names none.
FAMILY_VERSION = {"driver": "{deb}", "cuda-toolkit": "{deb}"}


def load_world(path: Path = WORLD_PATH) -> dict[str, Any]:
    """The data file, parsed."""
    with path.open("rb") as stream:
        return tomllib.load(stream)


WORLD = load_world()


@dataclass(frozen=True)
class DriverBranch:
    """One driver branch: its releases and which packaging era each part of it is in."""

    branch: str
    releases: tuple[str, ...]
    metas: str  # "suffixed": cuda-drivers-<branch> exists; "unsuffixed": from 590 on
    fabricmanager: str  # "suffixed": nvidia-fabricmanager-<branch>; "unsuffixed": from 580 on
    pinning: bool  # nvidia-driver-pinning-<branch> exists

    @property
    def flags(self) -> frozenset[str]:
        flags = {f"metas-{self.metas}", f"fabricmanager-{self.fabricmanager}"}
        return frozenset(flags | ({"pinning"} if self.pinning else set()))


@dataclass(frozen=True)
class CudaToolkit:
    """One CUDA toolkit release: the versions of its parts and the driver it needs."""

    release: str  # e.g. 12.4.1: the version of cuda-toolkit-12-4, cuda-12-4, cuda
    nvcc: str
    cudart: str
    minimum_driver: str  # the driver bundled with the release (cuda-runtime -> cuda-drivers)
    nvcc_built_on: str
    nvcc_build: str

    @property
    def major_minor(self) -> str:
        return ".".join(self.release.split(".")[:2])

    @property
    def major(self) -> str:
        return self.release.split(".")[0]

    @property
    def dashed(self) -> str:
        return self.major_minor.replace(".", "-")


@dataclass(frozen=True)
class DcgmRelease:
    """A DCGM 4 release and the exporter release NVIDIA pairs with it."""

    version: str  # e.g. 1:4.5.3-1
    exporter: str  # e.g. 4.8.2-1


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


DRIVER_BRANCHES = tuple(
    DriverBranch(
        str(raw["branch"]),
        tuple(raw["releases"]),
        raw["metas"],
        raw["fabricmanager"],
        bool(raw["pinning"]),
    )
    for raw in WORLD["driver_branch"]
)
# Driver releases in the repository, oldest first, two per branch.
DRIVER_VERSIONS = tuple(version for branch in DRIVER_BRANCHES for version in branch.releases)
DCGM_VERSIONS = tuple(WORLD["dcgm3"]["versions"])
DCGM4_RELEASES = tuple(DcgmRelease(raw["version"], raw["exporter"]) for raw in WORLD["dcgm4"])
DCGM4_VERSIONS = tuple(release.version for release in DCGM4_RELEASES)
DCGM_EXPORTER_VERSIONS = tuple(release.exporter for release in DCGM4_RELEASES)
CONTAINER_TOOLKIT_VERSIONS = tuple(WORLD["container_toolkit"]["versions"])
CDI_REFRESH_FROM = WORLD["container_toolkit"]["cdi_refresh_from"]
NCCL_VERSIONS = tuple(WORLD["nccl"]["versions"])
NVLSM_VERSIONS = tuple(WORLD["nvlsm"]["versions"])
CUDA_TOOLKITS = tuple(
    CudaToolkit(
        raw["release"],
        raw["nvcc"],
        raw["cudart"],
        raw["minimum_driver"],
        raw["nvcc_built_on"],
        raw["nvcc_build"],
    )
    for raw in WORLD["cuda_toolkit"]
)
# Release -> path of the CUDA repository for it; the first is the default (debian12).
CUDA_REPOSITORY_PATHS: dict[str, str] = dict(WORLD["repositories"]["cuda"])
# Release -> the package families its CUDA repository does not carry (world.toml says why).
CUDA_TREE_LEFT_OUT: dict[str, frozenset[str]] = {
    release: frozenset(families)
    for release, families in WORLD["repositories"].get("left_out", {}).items()
}
ARCHITECTURE_PATHS: dict[str, str] = dict(WORLD["repositories"]["architectures"])


@dataclass(frozen=True)
class PackageFile:
    """A file a stand-in package installs."""

    path: str  # absolute path on the node
    content: str
    mode: int = 0o644


@dataclass(frozen=True)
class StandinPackage:
    """One binary package: its control fields, files and maintainer scripts."""

    name: str
    version: str
    repository: str  # CUDA_REPO or LIBNVIDIA_CONTAINER_REPO
    summary: str
    section: str = "utils"
    architecture: str = "amd64"
    depends: tuple[str, ...] = ()
    recommends: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    replaces: tuple[str, ...] = ()
    breaks: tuple[str, ...] = ()
    files: tuple[PackageFile, ...] = ()
    scripts: dict[str, str] = field(default_factory=dict)  # postinst, prerm, postrm
    family: str = ""  # the world's template family (world.toml), not a control field

    @property
    def maintainer(self) -> str:
        if self.repository == UBUNTU_REPO:
            return UBUNTU_MAINTAINER
        return CUDA_MAINTAINER if self.repository == CUDA_REPO else CONTAINER_MAINTAINER

    @property
    def upstream_version(self) -> str:
        """The version without epoch and Debian revision: 1:3.3.9 -> 3.3.9, 550.1-1 -> 550.1."""
        version = self.version.split(":", 1)[-1]
        return version.rsplit("-", 1)[0] if "-" in version else version

    @property
    def filename(self) -> str:
        """The .deb file name as dpkg-name writes it (the epoch is not part of it)."""
        return f"{self.name}_{self.version.split(':', 1)[-1]}_{self.architecture}.deb"

    def control(self) -> str:
        fields = [
            ("Package", self.name),
            ("Version", self.version),
            ("Architecture", self.architecture),
            ("Maintainer", self.maintainer),
            ("Section", self.section),
            ("Priority", "optional"),
            ("Depends", ", ".join(self.depends)),
            ("Recommends", ", ".join(self.recommends)),
            ("Provides", ", ".join(self.provides)),
            ("Conflicts", ", ".join(self.conflicts)),
            ("Breaks", ", ".join(self.breaks)),
            ("Replaces", ", ".join(self.replaces)),
            ("Homepage", "https://developer.nvidia.com"),
        ]
        text = "".join(f"{name}: {value}\n" for name, value in fields if value)
        return text + (
            f"Description: {self.summary}\n"
            " gpunode lab stand-in: the real package's name, version and dependencies,\n"
            " with tiny placeholder contents. For lab nodes only.\n"
        )


# --- generation from the data ------------------------------------------------------------------


@dataclass(frozen=True)
class Generated:
    """One built package with the data template and release context it was generated from."""

    template: dict[str, Any]
    context: dict[str, str]
    package: StandinPackage


def render(text: str, context: dict[str, str]) -> str:
    """A template string with its ``{placeholders}`` filled; an unknown one raises KeyError."""
    return text.format_map(context)


def real_relations(template: dict[str, Any], context: dict[str, str]) -> dict[str, list[str]]:
    """The relations the real package declares, as the data records them."""
    return {
        name: [render(item, context) for item in template.get(name, [])] for name in RELATION_FIELDS
    }


def standin_relations(template: dict[str, Any], context: dict[str, str]) -> dict[str, list[str]]:
    """The real relations with the data's listed departures applied (remove, then add)."""
    relations = real_relations(template, context)
    departures = template.get("departures", {})
    for name in RELATION_FIELDS:
        change = departures.get(name, {})
        removed = {render(item, context) for item in change.get("remove", [])}
        relations[name] = [item for item in relations[name] if item not in removed]
        relations[name] += [render(item, context) for item in change.get("add", [])]
    return relations


def _contexts(family: str) -> Iterator[tuple[dict[str, str], frozenset[str]]]:
    """Each release of ``family``: its placeholder values and its era flags."""
    if family == "driver":
        for branch in DRIVER_BRANCHES:
            for version in branch.releases:
                context = {"version": version, "deb": f"{version}-1", "branch": branch.branch}
                yield context, branch.flags
    elif family == "cuda-toolkit":
        for toolkit in CUDA_TOOLKITS:
            yield _toolkit_context(toolkit), frozenset()
    elif family == "cuda-common":
        majors: dict[str, CudaToolkit] = {}
        for toolkit in CUDA_TOOLKITS:
            newest = majors.get(toolkit.major)
            if newest is None or _version_key(toolkit.cudart) > _version_key(newest.cudart):
                majors[toolkit.major] = toolkit
        newest_major = max(majors, key=int)
        for major, toolkit in majors.items():
            flags = frozenset({"newest-major"} if major == newest_major else set())
            yield {"major": major, "cudart": toolkit.cudart}, flags
    elif family == "dcgm3":
        for version in DCGM_VERSIONS:
            yield {"version": version}, frozenset()
    elif family == "dcgm4":
        for release in DCGM4_RELEASES:
            yield {"version": release.version, "exporter": release.exporter}, frozenset()
    elif family == "dcgm-exporter":
        for release in DCGM4_RELEASES:
            yield {"version": release.exporter, "dcgm": release.version}, frozenset()
    elif family == "container-toolkit":
        for version in CONTAINER_TOOLKIT_VERSIONS:
            yield {"version": version, "upstream": version.rsplit("-", 1)[0]}, frozenset()
    elif family == "nccl":
        for version in NCCL_VERSIONS:
            yield {"version": version}, frozenset()
    elif family == "nvlsm":
        for version in NVLSM_VERSIONS:
            yield {"version": version}, frozenset()
    else:
        raise ValueError(f"world.toml: unknown package family {family!r}")


def _toolkit_context(toolkit: CudaToolkit) -> dict[str, str]:
    return {
        "release": toolkit.release,
        "deb": f"{toolkit.release}-1",
        "dashed": toolkit.dashed,
        "dotted": toolkit.major_minor,
        "major": toolkit.major,
        "nvcc": toolkit.nvcc,
        "cudart": toolkit.cudart,
        "minimum_driver": toolkit.minimum_driver,
    }


def generated() -> list[Generated]:
    """Every stand-in package, with the template and context it came from (data order)."""
    results: list[Generated] = []
    for template in WORLD["package"]:
        family = template["family"]
        when = frozenset(template.get("when", []))
        for context, flags in _contexts(family):
            if not when <= flags:
                continue
            relations = standin_relations(template, context)
            version = template.get("version", FAMILY_VERSION.get(family, "{version}"))
            package = StandinPackage(
                name=render(template["name"], context),
                version=render(version, context),
                repository=FAMILY_REPOSITORY[family],
                family=family,
                summary=render(template["summary"], context),
                section=template.get("section", "utils"),
                architecture=template.get("architecture", "amd64"),
                depends=tuple(relations["depends"]),
                recommends=tuple(relations["recommends"]),
                provides=tuple(relations["provides"]),
                conflicts=tuple(relations["conflicts"]),
                replaces=tuple(relations["replaces"]),
                breaks=tuple(relations["breaks"]),
            )
            contents = CONTENTS.get(template["id"])
            if contents is not None:
                files, scripts = contents(context)
                package = replace(package, files=tuple(files), scripts=scripts)
            results.append(Generated(template, context, _with_readme(package)))
    return results


def catalogue() -> list[StandinPackage]:
    """Every stand-in package of both repositories."""
    return [item.package for item in generated()]


def in_cuda_tree(package: StandinPackage, release: str) -> bool:
    """Whether the CUDA repository tree of ``release`` (a CUDA_REPOSITORY_PATHS key) carries
    ``package``."""
    return package.repository == CUDA_REPO and package.family not in CUDA_TREE_LEFT_OUT.get(
        release, frozenset()
    )


# --- contents, per template id -----------------------------------------------------------------

Contents = tuple[list[PackageFile], dict[str, str]]


def _kernel_module_contents(flavour: str) -> Callable[[dict[str, str]], Contents]:
    def contents(context: dict[str, str]) -> Contents:
        version = context["version"]
        files = [PackageFile(f"/usr/src/nvidia-{version}/dkms.conf", _dkms_conf(version))]
        return files, _kernel_module_scripts(version, flavour)

    return contents


def _gsp_contents(context: dict[str, str]) -> Contents:
    path = f"/lib/firmware/nvidia/{context['version']}/README.gpunode-lab"
    return [PackageFile(path, "GSP firmware placeholder (gpunode lab stand-in).\n")], {}


def _nvidia_smi_contents(context: dict[str, str]) -> Contents:
    script = _nvidia_smi_script(context["version"])
    return [PackageFile("/usr/bin/nvidia-smi", script, 0o755)], {}


def _persistenced_contents(context: dict[str, str]) -> Contents:
    daemon = _python_standin("daemon.py", context["version"])
    files = [
        PackageFile("/usr/bin/nvidia-persistenced", daemon, 0o755),
        PackageFile("/lib/systemd/system/nvidia-persistenced.service", PERSISTENCED_UNIT),
    ]
    return files, _systemd_scripts("nvidia-persistenced.service", enable=True)


def _modprobe_contents(context: dict[str, str]) -> Contents:
    script = _nvidia_modprobe_script(context["version"])
    return [PackageFile("/usr/bin/nvidia-modprobe", script, 0o755)], {}


def _pinning_contents(context: dict[str, str]) -> Contents:
    branch = context["branch"]
    path = f"/etc/apt/preferences.d/nvidia-driver-pinning-{branch}"
    return [PackageFile(path, _pinning_preferences(branch))], {}


def _fabricmanager_contents(context: dict[str, str]) -> Contents:
    return fabricmanager_files(context["version"])


def fabricmanager_files(version: str) -> Contents:
    """Fabric Manager's daemon (which runs only with the driver of ``version``), its unit and
    configuration: NVIDIA's packages and Ubuntu's ship the same (lab.standin.ubuntu)."""
    daemon = _python_standin("daemon.py", version)
    files = [
        PackageFile("/usr/bin/nv-fabricmanager", daemon, 0o755),
        PackageFile("/lib/systemd/system/nvidia-fabricmanager.service", FABRICMANAGER_UNIT),
        PackageFile("/usr/share/nvidia/nvswitch/fabricmanager.cfg", FABRICMANAGER_CFG),
    ]
    return files, _systemd_scripts("nvidia-fabricmanager.service", enable=False)


def _imex_contents(context: dict[str, str]) -> Contents:
    version = context["version"]
    files = [
        PackageFile("/usr/bin/nvidia-imex", _python_standin("daemon.py", version), 0o755),
        PackageFile("/usr/bin/nvidia-imex-ctl", _imex_ctl_script(version), 0o755),
        PackageFile("/lib/systemd/system/nvidia-imex.service", IMEX_UNIT),
        PackageFile("/etc/nvidia-imex/config.cfg", IMEX_CONFIG),
        PackageFile("/etc/nvidia-imex/nodes_config.cfg", IMEX_NODES_CONFIG),
    ]
    return files, _systemd_scripts("nvidia-imex.service", enable=False)


def _dcgm_contents(context: dict[str, str]) -> Contents:
    upstream = context["version"].split(":", 1)[-1].rsplit("-", 1)[0]
    files = [
        PackageFile("/usr/bin/nv-hostengine", _python_standin("daemon.py", upstream), 0o755),
        PackageFile("/usr/bin/dcgmi", _dcgmi_script(upstream), 0o755),
        PackageFile("/lib/systemd/system/nvidia-dcgm.service", DCGM_UNIT),
    ]
    return files, _systemd_scripts("nvidia-dcgm.service", enable=False)


def _exporter_contents(context: dict[str, str]) -> Contents:
    upstream = context["version"].rsplit("-", 1)[0]
    files = [
        PackageFile("/usr/bin/dcgm-exporter", _python_standin("daemon.py", upstream), 0o755),
        PackageFile("/etc/dcgm-exporter/default-counters.csv", EXPORTER_COUNTERS),
        PackageFile("/lib/systemd/system/nvidia-dcgm-exporter.service", EXPORTER_UNIT),
    ]
    return files, _systemd_scripts("nvidia-dcgm-exporter.service", enable=False)


def _alternatives_contents(context: dict[str, str]) -> Contents:
    return [], _cuda_alternatives_scripts(context["dotted"])


def _toolkit_of(context: dict[str, str]) -> CudaToolkit:
    return next(t for t in CUDA_TOOLKITS if t.release == context["release"])


def _cudart_contents(context: dict[str, str]) -> Contents:
    path = f"/usr/local/cuda-{context['dotted']}/targets/x86_64-linux/lib/README.gpunode-lab"
    return [PackageFile(path, "CUDA runtime libraries placeholder (gpunode lab stand-in).\n")], {}


def _nvcc_contents(context: dict[str, str]) -> Contents:
    path = f"/usr/local/cuda-{context['dotted']}/bin/nvcc"
    return [PackageFile(path, _nvcc_script(_toolkit_of(context)), 0o755)], {}


def _toolkit_meta_contents(context: dict[str, str]) -> Contents:
    path = f"/usr/local/cuda-{context['dotted']}/version.json"
    return [PackageFile(path, _cuda_version_json(_toolkit_of(context)))], {}


def _container_tools_contents(context: dict[str, str]) -> Contents:
    script = _container_cli_script(context["upstream"])
    return [PackageFile("/usr/bin/nvidia-container-cli", script, 0o755)], {}


# The stand-in's Python, beside /usr/bin/nvidia-ctk (found from it, so that an unpacked
# package runs too).
NVIDIA_CTK_STANDIN = "/usr/lib/gpunode-lab-standin/nvidia_ctk.py"


def _nvidia_ctk_wrapper(upstream: str) -> str:
    """/usr/bin/nvidia-ctk: the real one is a Go program that answers ``--version`` at once,
    and the drift check and every no-op deploy ask it; so this answers that itself, without
    a Python start-up, and runs the stand-in for everything else."""
    lines = nvidia_ctk.version_text(upstream).splitlines()
    printed = " ".join(shlex.quote(line) for line in lines)
    return f"""#!/bin/sh
# gpunode lab stand-in for nvidia-ctk {upstream}.
case "$*" in
    --version|-v) printf '%s\\n' {printed}; exit 0 ;;
esac
exec /usr/bin/python3 -I "${{0%/*}}/../lib/gpunode-lab-standin/nvidia_ctk.py" "$@"
"""


def cdi_refresh_shipped(upstream: str) -> bool:
    """Whether this Container Toolkit release's -base package ships the nvidia-cdi-refresh units."""
    return _version_key(upstream) >= _version_key(CDI_REFRESH_FROM)


def _toolkit_base_contents(context: dict[str, str]) -> Contents:
    upstream = context["upstream"]
    files = [
        PackageFile("/usr/bin/nvidia-ctk", _nvidia_ctk_wrapper(upstream), 0o755),
        PackageFile(NVIDIA_CTK_STANDIN, _python_standin("nvidia_ctk.py", upstream), 0o644),
        PackageFile(
            "/usr/bin/nvidia-container-runtime", _container_runtime_script(upstream), 0o755
        ),
        PackageFile("/usr/bin/nvidia-cdi-hook", _noop_script("nvidia-cdi-hook", upstream), 0o755),
    ]
    if not cdi_refresh_shipped(upstream):
        return files, {"postinst": TOOLKIT_BASE_POSTINST, "postrm": TOOLKIT_BASE_POSTRM}
    files += [
        PackageFile("/lib/systemd/system/nvidia-cdi-refresh.service", CDI_REFRESH_SERVICE),
        PackageFile("/lib/systemd/system/nvidia-cdi-refresh.path", CDI_REFRESH_PATH),
        PackageFile("/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env", CDI_REFRESH_ENV),
    ]
    return files, {
        "postinst": TOOLKIT_BASE_POSTINST_CDI_REFRESH,
        "prerm": TOOLKIT_BASE_PRERM_CDI_REFRESH,
        "postrm": TOOLKIT_BASE_POSTRM,
    }


def _toolkit_contents(context: dict[str, str]) -> Contents:
    hook = _noop_script("nvidia-container-runtime-hook", context["upstream"])
    files = [PackageFile("/usr/bin/nvidia-container-runtime-hook", hook, 0o755)]
    return files, {"postinst": TOOLKIT_POSTINST, "postrm": TOOLKIT_POSTRM}


CONTENTS: dict[str, Callable[[dict[str, str]], Contents]] = {
    "firmware-nvidia-gsp": _gsp_contents,
    "nvidia-kernel-dkms": _kernel_module_contents("proprietary"),
    "nvidia-kernel-open-dkms": _kernel_module_contents("open"),
    "nvidia-smi": _nvidia_smi_contents,
    "nvidia-persistenced": _persistenced_contents,
    "nvidia-modprobe": _modprobe_contents,
    "nvidia-driver-pinning": _pinning_contents,
    "nvidia-fabricmanager-branch": _fabricmanager_contents,
    "nvidia-fabricmanager": _fabricmanager_contents,
    "nvidia-imex": _imex_contents,
    "datacenter-gpu-manager": _dcgm_contents,
    "datacenter-gpu-manager-4-core": _dcgm_contents,
    "datacenter-gpu-manager-exporter": _exporter_contents,
    "cuda-toolkit-minor-config-common": _alternatives_contents,
    "cuda-cudart": _cudart_contents,
    "cuda-nvcc": _nvcc_contents,
    "cuda-toolkit-minor": _toolkit_meta_contents,
    "libnvidia-container-tools": _container_tools_contents,
    "nvidia-container-toolkit-base": _toolkit_base_contents,
    "nvidia-container-toolkit": _toolkit_contents,
}


# --- file contents ----------------------------------------------------------------------------


def _with_readme(package: StandinPackage) -> StandinPackage:
    readme = PackageFile(
        f"/usr/share/doc/{package.name}/README.gpunode-lab",
        f"{package.name} {package.version}: gpunode lab stand-in for the NVIDIA package of that\n"
        "name and version. Built by lab.aptrepo; for lab nodes only.\n",
    )
    return replace(package, files=(*package.files, readme))


def _python_standin(module: str, version: str) -> str:
    """A node-side stand-in module as an executable script, with its version filled in."""
    source = (HERE / module).read_text(encoding="utf-8")
    source, count = re.subn(
        r'^STANDIN_VERSION = "[^"]*"', f'STANDIN_VERSION = "{version}"', source, flags=re.M
    )
    if count != 1:
        raise ValueError(f"{module} must define STANDIN_VERSION exactly once")
    return PYTHON_SHEBANG + source


def _fake_commit(text: str) -> str:
    """A stable commit-like id for --version output (not a real upstream commit)."""
    return hashlib.sha1(text.encode()).hexdigest()


def _nvidia_smi_script(version: str) -> str:
    return f"""#!/bin/sh
# gpunode lab stand-in for nvidia-smi {version}. On lab nodes the GPU simulator owns
# /usr/bin/nvidia-smi (dpkg diversion) and this copy is installed as nvidia-smi.distrib.
printf '%s\\n\\n' "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA \
driver. Make sure that the latest NVIDIA driver is installed and running."
exit 9
"""


def _nvidia_modprobe_script(version: str) -> str:
    return f"""#!/bin/sh
# gpunode lab stand-in for nvidia-modprobe {version}: lab nodes load no kernel modules.
case "$1" in
    -v|--version) echo "nvidia-modprobe:  version {version}"; exit 0 ;;
esac
exit 0
"""


def _nvcc_script(toolkit: CudaToolkit) -> str:
    return f"""#!/bin/sh
# gpunode lab stand-in for nvcc {toolkit.nvcc} (CUDA {toolkit.release}).
case "$1" in
    --version|-V)
        cat <<'EOF'
nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-{toolkit.nvcc_built_on[-4:]} NVIDIA Corporation
Built on {toolkit.nvcc_built_on}
Cuda compilation tools, release {toolkit.major_minor}, V{toolkit.nvcc}
Build {toolkit.nvcc_build}
EOF
        exit 0 ;;
esac
echo "nvcc fatal   : No input files specified; use option --help for more information" >&2
exit 1
"""


def _cuda_version_json(toolkit: CudaToolkit) -> str:
    components = {
        "cuda": ("CUDA SDK", toolkit.release),
        "cuda_nvcc": ("CUDA NVCC", toolkit.nvcc),
        "cuda_cudart": ("CUDA Runtime (cudart)", toolkit.cudart),
    }
    document = {
        key: {"name": name, "version": version} for key, (name, version) in components.items()
    }
    return json.dumps(document, indent=3) + "\n"


def _dkms_conf(version: str) -> str:
    return (
        "# gpunode lab stand-in: DKMS is never run for this package.\n"
        f'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="{version}"\nAUTOINSTALL="yes"\n'
    )


# Run on the node by the node's python3, from the stand-in dcgmi itself.
DCGMI_DIAG_SOURCE = (Path(__file__).with_name("dcgmi_diag.py")).read_text(encoding="utf-8")


def _dcgmi_script(version: str) -> str:
    return f"""#!/bin/sh
# gpunode lab stand-in for dcgmi {version}: --version, and discovery -l from nvidia-smi -L
# and diag -r 1|2 -j from the simulated GPUs (lab/standin/dcgmi_diag.py) while nv-hostengine
# runs.
PID_FILE=/var/run/nvidia-hostengine/nv-hostengine.pid
case "$1" in
    -v|--version) echo "dcgmi  version: {version}"; exit 0 ;;
esac
if ! [ -r "$PID_FILE" ] || ! kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then
    echo "Error: unable to establish a connection to the specified host: localhost"
    echo "Error: Unable to connect to host engine. Host engine connection invalid/disconnected."
    exit 1
fi
if [ "$1" = discovery ] && [ "$2" = -l ]; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep '^GPU ')
    echo "$(printf '%s\\n' "$gpus" | grep -c '^GPU ') GPUs found."
    echo "+--------+----------------------------------------------------------------------+"
    echo "| GPU ID | Device Information                                                   |"
    echo "+--------+----------------------------------------------------------------------+"
    printf '%s\\n' "$gpus" |
    sed -n 's/^GPU \\([0-9]*\\): \\(.*\\) (UUID: \\(.*\\))$/\\1 \\2|\\3/p' |
    while IFS='|' read -r index_name uuid; do
        printf '| %-6s | Name: %-63s |\\n' "${{index_name%% *}}" "${{index_name#* }}"
        printf '|        | Device UUID: %-55s |\\n' "$uuid"
        echo "+--------+----------------------------------------------------------------------+"
    done
    exit 0
fi
if [ "$1" = diag ]; then
    exec python3 - {version} "$@" <<'DCGMI_DIAG'
{DCGMI_DIAG_SOURCE}
DCGMI_DIAG
fi
echo "dcgmi: the gpunode lab stand-in only answers --version, discovery -l and diag" >&2
exit 1
"""


def _container_cli_script(version: str) -> str:
    return f"""#!/bin/sh
# gpunode lab stand-in for nvidia-container-cli {version}.
case "$1" in
    -V|--version)
        echo "cli-version: {version}"
        echo "lib-version: {version}"
        echo "build revision: {_fake_commit("libnvidia-container " + version)}"
        echo "build platform: x86_64"
        exit 0 ;;
esac
echo "nvidia-container-cli: initialization error: nvml error: driver not loaded" >&2
exit 1
"""


def _container_runtime_script(version: str) -> str:
    return f"""#!/bin/sh
# gpunode lab stand-in for nvidia-container-runtime {version}: a plain runc, no GPU injection.
case "$1" in
    --version|-v)
        echo "NVIDIA Container Runtime version {version}"
        echo "commit: {_fake_commit("nvidia-container-toolkit " + version)}"
        echo "spec: 1.2.0"
        exit 0 ;;
esac
if command -v runc >/dev/null 2>&1; then
    exec runc "$@"
fi
echo "nvidia-container-runtime: runc not found" >&2
exit 1
"""


def _noop_script(name: str, version: str) -> str:
    return f"""#!/bin/sh
# gpunode lab stand-in for {name} {version}: a hook that changes nothing.
case "$1" in
    --version|-v) echo "{name} version {version}"; exit 0 ;;
esac
exit 0
"""


def _kernel_module_scripts(version: str, flavour: str) -> dict[str, str]:
    # Recorded for the GPU simulator: what a (simulated) reboot would load. DKMS never runs.
    cuda = driver_cuda_version(version) or "N/A"
    postinst = f"""#!/bin/sh
set -e
if [ "$1" = configure ]; then
    mkdir -p {Path(INSTALLED_DRIVER_VERSION_PATH).parent}
    echo {version} > {INSTALLED_DRIVER_VERSION_PATH}.new
    mv {INSTALLED_DRIVER_VERSION_PATH}.new {INSTALLED_DRIVER_VERSION_PATH}
    echo {flavour} > {INSTALLED_KERNEL_MODULE_FLAVOUR_PATH}
    echo {cuda} > {INSTALLED_DRIVER_CUDA_VERSION_PATH}
fi
exit 0
"""
    postrm = f"""#!/bin/sh
set -e
case "$1" in
    remove|purge)
        if [ "$(cat {INSTALLED_DRIVER_VERSION_PATH} 2>/dev/null)" = {version} ]; then
            rm -f {INSTALLED_DRIVER_VERSION_PATH} {INSTALLED_KERNEL_MODULE_FLAVOUR_PATH} \\
                {INSTALLED_DRIVER_CUDA_VERSION_PATH}
        fi ;;
esac
exit 0
"""
    return {"postinst": postinst, "postrm": postrm}


def _systemd_scripts(unit: str, enable: bool) -> dict[str, str]:
    """Maintainer scripts as dh_installsystemd writes them (``enable=False``: --no-enable)."""
    if enable:
        configure = f"""    deb-systemd-helper unmask '{unit}' >/dev/null || true
    if deb-systemd-helper --quiet was-enabled '{unit}'; then
        deb-systemd-helper enable '{unit}' >/dev/null || true
    else
        deb-systemd-helper update-state '{unit}' >/dev/null || true
    fi
    if [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
        if [ -n "$2" ]; then _dh_action=restart; else _dh_action=start; fi
        deb-systemd-invoke $_dh_action '{unit}' >/dev/null || true
    fi
"""
    else:
        # debhelper's postinst-systemd-dont-enable: the unmask undoes the mask another package's
        # postrm left on the same unit (DCGM 3 -> DCGM 4 both ship nvidia-dcgm.service).
        configure = f"""    if deb-systemd-helper debian-installed '{unit}'; then
        deb-systemd-helper unmask '{unit}' >/dev/null || true
        if deb-systemd-helper --quiet was-enabled '{unit}'; then
            deb-systemd-helper enable '{unit}' >/dev/null || true
        fi
    fi
    deb-systemd-helper update-state '{unit}' >/dev/null || true
    if [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
    fi
"""
    postinst = f"""#!/bin/sh
set -e
case "$1" in
configure|abort-upgrade|abort-deconfigure|abort-remove)
{configure}    ;;
esac
exit 0
"""
    prerm = f"""#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
    deb-systemd-invoke stop '{unit}' >/dev/null || true
fi
exit 0
"""
    postrm = f"""#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
if [ "$1" = remove ] && [ -x /usr/bin/deb-systemd-helper ]; then
    deb-systemd-helper mask '{unit}' >/dev/null || true
fi
if [ "$1" = purge ] && [ -x /usr/bin/deb-systemd-helper ]; then
    deb-systemd-helper purge '{unit}' >/dev/null || true
    deb-systemd-helper unmask '{unit}' >/dev/null || true
fi
exit 0
"""
    return {"postinst": postinst, "prerm": prerm, "postrm": postrm}


def _cuda_alternatives_scripts(dotted: str) -> dict[str, str]:
    # /usr/local/cuda and /usr/local/cuda-12 follow the newest installed toolkit, as with NVIDIA's.
    major = dotted.split(".")[0]
    priority = dotted.replace(".", "")
    postinst = f"""#!/bin/sh
set -e
if [ "$1" = configure ]; then
    update-alternatives --install /usr/local/cuda cuda /usr/local/cuda-{dotted} {priority}
    update-alternatives --install /usr/local/cuda-{major} cuda-{major} \\
        /usr/local/cuda-{dotted} {priority}
fi
exit 0
"""
    prerm = f"""#!/bin/sh
set -e
if [ "$1" = remove ] || [ "$1" = deconfigure ]; then
    update-alternatives --remove cuda /usr/local/cuda-{dotted}
    update-alternatives --remove cuda-{major} /usr/local/cuda-{dotted}
fi
exit 0
"""
    return {"postinst": postinst, "prerm": prerm}


PERSISTENCED_UNIT = """\
[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target

[Service]
Type=forking
PIDFile=/var/run/nvidia-persistenced/nvidia-persistenced.pid
Restart=always
ExecStart=/usr/bin/nvidia-persistenced --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""

FABRICMANAGER_UNIT = """\
[Unit]
Description=NVIDIA fabric manager service
After=network-online.target
Requires=network-online.target

[Service]
User=root
PrivateTmp=false
Type=forking
TimeoutStartSec=240
PIDFile=/var/run/nvidia-fabricmanager/nv-fabricmanager.pid
ExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg
LimitCORE=infinity

[Install]
WantedBy=multi-user.target
"""

FABRICMANAGER_CFG = """\
# gpunode lab stand-in of the Fabric Manager configuration.
LOG_LEVEL=4
LOG_FILE_NAME=/var/log/fabricmanager.log
LOG_APPEND_TO_LOG=1
DAEMONIZE=1
BIND_INTERFACE_IP=127.0.0.1
STARTING_TCP_PORT=16000
FABRIC_MODE=0
FABRIC_MODE_RESTART=0
FM_STAY_RESIDENT_ON_FAILURES=0
ACCESS_LINK_FAILURE_MODE=0
"""

DCGM_UNIT = """\
[Unit]
Description=NVIDIA DCGM service
Conflicts=dcgm.service

[Service]
User=root
PrivateTmp=false
ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm
Restart=on-abort

[Install]
WantedBy=multi-user.target
"""

TOOLKIT_BASE_POSTINST = """\
#!/bin/sh
set -e
case "$1" in
    configure)
        /usr/bin/nvidia-ctk --quiet config \\
            --config-file=/etc/nvidia-container-runtime/config.toml --in-place
    ;;
esac
exit 0
"""

# The generated config.toml is no conffile, so dpkg would leave it behind on purge.
TOOLKIT_BASE_POSTRM = """\
#!/bin/sh
set -e
if [ "$1" = purge ]; then
    rm -f /etc/nvidia-container-runtime/config.toml
    rmdir /etc/nvidia-container-runtime 2>/dev/null || true
fi
exit 0
"""

TOOLKIT_POSTINST = """\
#!/bin/sh
set -e
NVIDIA_CONTAINER_RUNTIME_HOOK=/usr/bin/nvidia-container-runtime-hook
NVIDIA_CONTAINER_TOOLKIT=/usr/bin/nvidia-container-toolkit
case "$1" in
    configure)
        if [ -f "${NVIDIA_CONTAINER_RUNTIME_HOOK}" ] && [ ! -e "${NVIDIA_CONTAINER_TOOLKIT}" ]; then
            ln -s ${NVIDIA_CONTAINER_RUNTIME_HOOK} ${NVIDIA_CONTAINER_TOOLKIT}
        fi
    ;;
esac
exit 0
"""

TOOLKIT_POSTRM = """\
#!/bin/sh
set -e
if [ "$1" = purge ] && [ -L /usr/bin/nvidia-container-toolkit ]; then
    rm /usr/bin/nvidia-container-toolkit
fi
exit 0
"""


# --- the new era's contents -------------------------------------------------------------------


def _pinning_preferences(branch: str) -> str:
    # Priority 1000 is sourced (cuda-repo-ubuntu2404-capture); the globs are the lab's guess at
    # "the driver's packages" (NVIDIA's file was not seen): a version pin leaves every package
    # without a <branch>.* version (the container toolkit's, DCGM's) at its default priority.
    return (
        f"# nvidia-driver-pinning-{branch}: track driver branch {branch} (gpunode lab stand-in).\n"
        "Package: nvidia-* libnvidia-* libcuda* libnv* firmware-nvidia-gsp* cuda-drivers*\n"
        f"Pin: version {branch}.*\n"
        "Pin-Priority: 1000\n"
    )


def _imex_ctl_script(version: str) -> str:
    return f"""#!/bin/sh
# gpunode lab stand-in for nvidia-imex-ctl {version}.
case "$1" in
    -v|--version) echo "IMEX version is: {version}"; exit 0 ;;
esac
echo "nvidia-imex-ctl: the gpunode lab stand-in only answers --version" >&2
exit 1
"""


# NVIDIA's unit was not seen; this is the one sites that replace it write (world.toml
# imex-unit-copies), which they model on the packaged one.
IMEX_UNIT = """\
[Unit]
Description=NVIDIA IMEX service
After=network-online.target
Requires=network-online.target

[Service]
User=root
PrivateTmp=false
Type=forking
TimeoutStartSec=infinity
ExecStart=/usr/bin/nvidia-imex -c /etc/nvidia-imex/config.cfg
LimitCORE=infinity

[Install]
WantedBy=multi-user.target
"""

IMEX_CONFIG = """\
# gpunode lab stand-in of the IMEX configuration.
LOG_LEVEL=4
LOG_FILE_NAME=/var/log/nvidia-imex.log
SERVER_PORT=50000
IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg
"""

IMEX_NODES_CONFIG = "# One IP address per line: the nodes of this IMEX domain.\n"

# NVIDIA/dcgm-exporter packaging/config-files/systemd/nvidia-dcgm-exporter.service (its
# license header left out).
EXPORTER_UNIT = """\
[Unit]
Description=NVIDIA DCGM-exporter service
Wants=nvidia-dcgm.service
After=nvidia-dcgm.service

[Service]
User=root
PrivateTmp=false

StandardOutput=append:/var/dcgm-exporter.log
StandardError=append:/var/dcgm-exporter.log

ExecStart=/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/default-counters.csv

Restart=on-abort

[Install]
WantedBy=multi-user.target
"""

# The fields the stand-in exporter serves (dcgm-exporter's CSV format: field, type, help).
EXPORTER_COUNTERS = """\
# Format
# If line starts with a '#' it is considered a comment
# DCGM FIELD, Prometheus metric type, help message
DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).
DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).
DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).
DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).
"""

# NVIDIA/nvidia-container-toolkit deployments/systemd/ (license headers left out).
CDI_REFRESH_SERVICE = """\
[Unit]
Description=Refresh NVIDIA CDI specification file
ConditionPathExists=|/usr/bin/nvidia-smi
ConditionPathExists=|/usr/sbin/nvidia-smi
ConditionPathExists=/usr/bin/nvidia-ctk
After=multi-user.target

[Service]
Type=oneshot
# Values from Environment will be replaced if defined in EnvironmentFile
Environment=NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=/var/run/cdi/nvidia.yaml
EnvironmentFile=-/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env
ExecCondition=/usr/bin/grep -qE '/(nvidia|nvidia-current)\\\\.ko' /lib/modules/%v/modules.dep
ExecStart=/usr/bin/nvidia-ctk cdi generate
CapabilityBoundingSet=CAP_SYS_MODULE CAP_SYS_ADMIN CAP_MKNOD
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target
"""

CDI_REFRESH_PATH = """\
[Unit]
Description=Trigger CDI refresh on NVIDIA driver install / uninstall events

[Path]
PathChanged=/lib/modules/%v/modules.dep
PathChanged=/lib/modules/%v/modules.dep.bin

[Install]
WantedBy=multi-user.target
"""

CDI_REFRESH_ENV = """\
# This file can be used to override the configuration of the
#   nvidia-ctk cdi generate
# command invoked by the nvidia-cdi-refresh.service.
#
# ENVVAR=value
#
# NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=/var/run/cdi/nvidia.yaml
"""

# packaging/debian/nvidia-container-toolkit-base.postinst of 1.18 and later.
TOOLKIT_BASE_POSTINST_CDI_REFRESH = """\
#!/bin/sh
set -e
case "$1" in
    configure)
        /usr/bin/nvidia-ctk --quiet config \\
            --config-file=/etc/nvidia-container-runtime/config.toml --in-place
        if command -v systemctl >/dev/null 2>&1; then
          SYSTEMD_STATE=$(systemctl is-system-running 2>/dev/null || true)
          case "$SYSTEMD_STATE" in
            running|degraded)
              systemctl daemon-reload || echo "Warning: Failed to reload systemd daemon" >&2
              systemctl enable --now nvidia-cdi-refresh.path || \\
                  echo "Warning: Failed to enable nvidia-cdi-refresh.path" >&2
              systemctl enable --now nvidia-cdi-refresh.service || \\
                  echo "Warning: Failed to enable nvidia-cdi-refresh.service" >&2
              echo "Regenerating NVIDIA CDI specification..."
              systemctl start nvidia-cdi-refresh.service || \\
                  echo "Warning: Failed to trigger CDI refresh" >&2
              ;;
          esac
        fi
    ;;
    abort-upgrade|abort-remove|abort-deconfigure)
    ;;
    *)
        echo "postinst called with unknown argument \\`$1'" >&2
        exit 1
    ;;
esac
exit 0
"""

# The lab's: NVIDIA's prerm was not seen. Removing the package must not leave enabled units
# pointing at files that are gone.
TOOLKIT_BASE_PRERM_CDI_REFRESH = """\
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
    systemctl disable --now nvidia-cdi-refresh.path nvidia-cdi-refresh.service \\
        >/dev/null 2>&1 || true
fi
exit 0
"""

"""The stand-in package catalogue: names, versions and dependencies of NVIDIA's apt repositories.

Two repositories, laid out and named as NVIDIA publishes them:

- ``CUDA_REPO``: NVIDIA's Debian 12 CUDA repository (``compute/cuda/repos/debian12/x86_64``):
  the driver for branches 550 and 570 (two releases each, ``DRIVER_VERSIONS``) in both kernel
  module flavours, Fabric Manager, DCGM, CUDA toolkits 12.4 and 12.8 (two updates each), the
  ``cuda`` metapackage and NCCL.
- ``LIBNVIDIA_CONTAINER_REPO``: the NVIDIA Container Toolkit repository
  (``libnvidia-container/stable/deb/amd64``), two releases (``CONTAINER_TOOLKIT_VERSIONS``).

Dependency shapes follow the real repositories, including the parts that bite:

- NVIDIA's Debian packaging of the driver (same names as Debian's ``nvidia-graphics-drivers``):
  ``nvidia-driver`` needs ``nvidia-kernel-dkms (= V) | nvidia-kernel-V``; both kernel module
  packages (``nvidia-kernel-dkms`` proprietary, ``nvidia-kernel-open-dkms`` open) provide
  ``nvidia-kernel-V`` and conflict with each other; ``libcuda1`` *recommends* the kernel module,
  so a userspace-only install needs ``--no-install-recommends``.
- NVIDIA's installation guide for Debian: ``nvidia-open`` (open modules) or ``cuda-drivers``
  (proprietary) for a full install; ``nvidia-driver-cuda`` plus ``nvidia-kernel-open-dkms`` or
  ``nvidia-kernel-dkms`` for a compute-only node.
- Metapackages require ``>=`` versions (``cuda-drivers-550`` is satisfied by the 570 driver,
  ``cuda-toolkit-12-4=12.4.0-1`` pulls the newest ``cuda-nvcc-12-4``) while the driver's own
  packages require ``=``: installing an old release needs apt preferences (or every package
  named with its version), exactly as on the real repository.
- ``nvidia-container-toolkit`` needs ``nvidia-container-toolkit-base (= V)`` and
  ``libnvidia-container-tools (>= V), (<< 2.0.0)`` (NVIDIA/nvidia-container-toolkit
  ``packaging/debian/control``); ``nvidia-fabricmanager-<branch>`` provides, replaces and
  conflicts with ``nvidia-fabricmanager`` (NVIDIA/apt-packaging-fabric-manager).
- ``cuda`` -> ``cuda-12-X`` -> ``cuda-runtime-12-X`` -> ``cuda-drivers``: installing ``cuda``
  installs a driver; ``cuda-toolkit-12-X`` does not.

Departures, all to keep the lab hermetic and the packages tiny: no dependency on ``dkms``,
``systemd-coredump`` or X/GL libraries (the lab node has none and must not fetch them);
libraries are not shipped (only ``/usr/share/doc/<package>/README.gpunode-lab``), so nothing
triggers ``ldconfig``; DKMS is never invoked. The kernel module packages record what a reboot
would load instead: ``INSTALLED_DRIVER_VERSION_PATH`` (e.g. ``550.127.08``) and
``INSTALLED_KERNEL_MODULE_FLAVOUR_PATH`` (``open`` or ``proprietary``), removed again when the
package goes. Stand-in programs (``nvidia-ctk``, daemons) run with the node's ``/usr/bin/python3``.

What the stand-in programs do:

- ``/usr/bin/nvidia-smi`` (package ``nvidia-smi``): says the driver is not loaded and exits 9.
  On lab nodes the GPU simulator owns that path (dpkg diversion) and this copy lands at
  ``/usr/bin/nvidia-smi.distrib``.
- ``nvidia-persistenced`` (enabled and started on install, like Debian's package),
  ``nv-fabricmanager`` and ``nv-hostengine`` (``nvidia-fabricmanager``, ``nvidia-dcgm``:
  installed but not enabled, as NVIDIA's packages do): ``daemon.py``. Fabric Manager refuses to
  start unless the loaded driver (``nvidia-smi``) has exactly its version.
- ``nvidia-ctk`` (``nvidia-container-toolkit-base``): ``nvidia_ctk.py``.
- ``nvcc --version``, ``dcgmi --version`` / ``discovery -l``, ``nvidia-container-cli
  --version``, ``nvidia-container-runtime`` (runs ``runc`` when present): short shell scripts.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

CUDA_REPO = "cuda"
LIBNVIDIA_CONTAINER_REPO = "libnvidia-container"

INSTALLED_DRIVER_VERSION_PATH = "/var/lib/gpunode-lab/installed-driver-version"
INSTALLED_KERNEL_MODULE_FLAVOUR_PATH = "/var/lib/gpunode-lab/installed-kernel-module-flavour"

CUDA_MAINTAINER = "cudatools <cudatools@nvidia.com>"
CONTAINER_MAINTAINER = "NVIDIA CORPORATION <cudatools@nvidia.com>"
HERE = Path(__file__).resolve().parent
PYTHON_SHEBANG = "#!/usr/bin/python3 -I\n"  # -I: the script's directory must not shadow stdlib

# Driver releases in the repository, oldest first, two per branch.
DRIVER_VERSIONS = ("550.127.08", "550.144.03", "570.124.06", "570.195.03")
DCGM_VERSIONS = ("1:3.3.8", "1:3.3.9")
CONTAINER_TOOLKIT_VERSIONS = ("1.17.4-1", "1.17.8-1")
NCCL_VERSIONS = ("2.21.5-1+cuda12.4", "2.25.1-1+cuda12.8", "2.26.2-1+cuda12.8")


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
    def dashed(self) -> str:
        return self.major_minor.replace(".", "-")


CUDA_TOOLKITS = (
    CudaToolkit(
        "12.4.0",
        "12.4.99",
        "12.4.99",
        "550.54.14",
        "Tue_Feb_27_16:19:38_PST_2024",
        "cuda_12.4.r12.4/compiler.33961263_0",
    ),
    CudaToolkit(
        "12.4.1",
        "12.4.131",
        "12.4.127",
        "550.54.15",
        "Thu_Mar_28_02:18:24_PDT_2024",
        "cuda_12.4.r12.4/compiler.34097967_0",
    ),
    CudaToolkit(
        "12.8.0",
        "12.8.61",
        "12.8.57",
        "570.86.10",
        "Wed_Jan_15_19:20:09_PST_2025",
        "cuda_12.8.r12.8/compiler.35404655_0",
    ),
    CudaToolkit(
        "12.8.1",
        "12.8.93",
        "12.8.90",
        "570.124.06",
        "Fri_Feb_21_20:23:50_PST_2025",
        "cuda_12.8.r12.8/compiler.35583870_0",
    ),
)


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

    @property
    def maintainer(self) -> str:
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


def catalogue() -> list[StandinPackage]:
    """Every stand-in package of both repositories."""
    packages: list[StandinPackage] = []
    for version in DRIVER_VERSIONS:
        packages += _driver_packages(version)
        packages += _fabricmanager_packages(version)
    for dcgm_version in DCGM_VERSIONS:
        packages.append(_dcgm_package(dcgm_version))
    packages += _cuda_packages()
    for nccl_version in NCCL_VERSIONS:
        packages += _nccl_packages(nccl_version)
    for toolkit_version in CONTAINER_TOOLKIT_VERSIONS:
        packages += _container_toolkit_packages(toolkit_version)
    return [_with_readme(package) for package in packages]


# --- driver --------------------------------------------------------------------------------


def _driver_packages(version: str) -> list[StandinPackage]:
    deb = f"{version}-1"
    exact = f"(= {deb})"
    at_least = f"(>= {version})"
    branch = version.split(".")[0]
    kernel_virtual = f"nvidia-kernel-{version}"

    def cuda(name: str, summary: str, **fields: Any) -> StandinPackage:
        return StandinPackage(name, deb, CUDA_REPO, summary, **fields)

    def kernel_module(name: str, flavour: str, other: str, summary: str) -> StandinPackage:
        return cuda(
            name,
            summary,
            section="kernel",
            depends=(f"nvidia-kernel-support {exact}", f"firmware-nvidia-gsp {exact}"),
            provides=(kernel_virtual,),
            conflicts=(other,),
            files=(PackageFile(f"/usr/src/nvidia-{version}/dkms.conf", _dkms_conf(version)),),
            scripts=_kernel_module_scripts(version, flavour),
        )

    return [
        cuda(
            "firmware-nvidia-gsp",
            "NVIDIA GSP firmware",
            section="kernel",
            files=(
                PackageFile(
                    f"/lib/firmware/nvidia/{version}/README.gpunode-lab",
                    "GSP firmware placeholder (gpunode lab stand-in).\n",
                ),
            ),
        ),
        cuda(
            "nvidia-kernel-support",
            "NVIDIA binary kernel module support files",
            section="kernel",
            provides=("nvidia-kernel-support--v1",),
        ),
        kernel_module(
            "nvidia-kernel-dkms",
            "proprietary",
            "nvidia-kernel-open-dkms",
            "NVIDIA binary kernel module DKMS source",
        ),
        kernel_module(
            "nvidia-kernel-open-dkms",
            "open",
            "nvidia-kernel-dkms",
            "NVIDIA binary kernel module DKMS source open flavor",
        ),
        cuda(
            "libnvidia-ml1",
            "NVIDIA Management Library (NVML) runtime library",
            section="libs",
            depends=("libc6",),
        ),
        cuda(
            "libcuda1",
            "NVIDIA CUDA Driver Library",
            section="libs",
            depends=("libc6",),
            recommends=(f"nvidia-kernel-dkms {exact} | {kernel_virtual}",),
        ),
        cuda(
            "nvidia-smi",
            "NVIDIA System Management Interface",
            depends=(f"libnvidia-ml1 {exact}",),
            files=(PackageFile("/usr/bin/nvidia-smi", _nvidia_smi_script(version), 0o755),),
        ),
        cuda(
            "nvidia-persistenced",
            "daemon to maintain persistent software state in the NVIDIA driver",
            depends=("libc6",),
            files=(
                PackageFile(
                    "/usr/bin/nvidia-persistenced", _python_standin("daemon.py", version), 0o755
                ),
                PackageFile("/lib/systemd/system/nvidia-persistenced.service", PERSISTENCED_UNIT),
            ),
            scripts=_systemd_scripts("nvidia-persistenced.service", enable=True),
        ),
        cuda(
            "nvidia-modprobe",
            "utility to load NVIDIA kernel modules and create device nodes",
            depends=("libc6",),
            files=(
                PackageFile("/usr/bin/nvidia-modprobe", _nvidia_modprobe_script(version), 0o755),
            ),
        ),
        cuda(
            "nvidia-driver-libs",
            "NVIDIA metapackage (OpenGL/GLX/EGL/GLES libraries)",
            section="libs",
        ),
        cuda(
            "nvidia-driver-cuda",
            "NVIDIA driver CUDA integration components",
            depends=(
                f"libcuda1 {exact}",
                f"libnvidia-ml1 {exact}",
                f"nvidia-smi {exact}",
                f"nvidia-persistenced {exact}",
                f"nvidia-modprobe {exact}",
            ),
        ),
        cuda(
            "nvidia-driver",
            "NVIDIA metapackage",
            section="metapackages",
            depends=(
                f"nvidia-driver-libs {exact}",
                f"nvidia-kernel-dkms {exact} | {kernel_virtual}",
            ),
            recommends=(f"nvidia-smi {exact}", f"nvidia-persistenced {exact}"),
        ),
        # Kernel module first: apt then picks the open flavour for nvidia-driver's alternative.
        cuda(
            "nvidia-open",
            "NVIDIA Driver meta-package, Open GPU kernel modules, latest version",
            section="metapackages",
            depends=(
                f"nvidia-kernel-open-dkms {at_least}",
                f"nvidia-driver {at_least}",
                f"nvidia-driver-cuda {at_least}",
            ),
        ),
        cuda(
            f"cuda-drivers-{branch}",
            f"CUDA Driver meta-package, branch-specific ({branch})",
            section="metapackages",
            depends=(
                f"nvidia-kernel-dkms {at_least}",
                f"nvidia-driver {at_least}",
                f"nvidia-driver-cuda {at_least}",
            ),
        ),
        cuda(
            "cuda-drivers",
            "CUDA Driver meta-package, proprietary kernel modules",
            section="metapackages",
            depends=(f"cuda-drivers-{branch} {exact}",),
        ),
    ]


def _fabricmanager_packages(version: str) -> list[StandinPackage]:
    deb = f"{version}-1"
    branch = version.split(".")[0]
    fabricmanager = f"nvidia-fabricmanager-{branch}"
    nscq = f"libnvidia-nscq-{branch}"
    return [
        StandinPackage(
            nscq,
            deb,
            CUDA_REPO,
            "NVSwitch Configuration and Query library",
            section="libs",
            depends=("libc6",),
            provides=("libnvidia-nscq",),
            conflicts=("libnvidia-nscq",),
            replaces=("libnvidia-nscq",),
        ),
        StandinPackage(
            fabricmanager,
            deb,
            CUDA_REPO,
            "Fabric Manager for NVSwitch based systems.",
            depends=("libc6 (>= 2.2.1)",),
            provides=("nvidia-fabricmanager",),
            conflicts=("nvidia-fabricmanager",),
            replaces=("nvidia-fabricmanager",),
            files=(
                PackageFile(
                    "/usr/bin/nv-fabricmanager", _python_standin("daemon.py", version), 0o755
                ),
                PackageFile("/lib/systemd/system/nvidia-fabricmanager.service", FABRICMANAGER_UNIT),
                PackageFile("/usr/share/nvidia/nvswitch/fabricmanager.cfg", FABRICMANAGER_CFG),
            ),
            scripts=_systemd_scripts("nvidia-fabricmanager.service", enable=False),
        ),
        StandinPackage(
            f"cuda-drivers-fabricmanager-{branch}",
            deb,
            CUDA_REPO,
            f"Meta-package for FM and Driver ({branch})",
            section="metapackages",
            depends=(
                f"cuda-drivers-{branch} (= {deb})",
                f"{fabricmanager} (= {deb})",
                f"{nscq} (= {deb})",
            ),
        ),
        StandinPackage(
            "cuda-drivers-fabricmanager",
            deb,
            CUDA_REPO,
            "Meta-package for FM and Driver",
            section="metapackages",
            depends=(f"cuda-drivers-fabricmanager-{branch} (= {deb})",),
        ),
    ]


def _dcgm_package(version: str) -> StandinPackage:
    upstream = version.split(":", 1)[-1]
    return StandinPackage(
        "datacenter-gpu-manager",
        version,
        CUDA_REPO,
        "NVIDIA® Datacenter GPU Management Tools",
        depends=("libc6",),
        files=(
            PackageFile("/usr/bin/nv-hostengine", _python_standin("daemon.py", upstream), 0o755),
            PackageFile("/usr/bin/dcgmi", _dcgmi_script(upstream), 0o755),
            PackageFile("/lib/systemd/system/nvidia-dcgm.service", DCGM_UNIT),
        ),
        scripts=_systemd_scripts("nvidia-dcgm.service", enable=False),
    )


# --- CUDA toolkit, cuda metapackage, NCCL ---------------------------------------------------


def _cuda_packages() -> list[StandinPackage]:
    packages: list[StandinPackage] = []
    newest_cudart = CUDA_TOOLKITS[-1].cudart
    for common in ("cuda-toolkit-config-common", "cuda-toolkit-12-config-common"):
        packages.append(
            StandinPackage(
                common,
                f"{newest_cudart}-1",
                CUDA_REPO,
                "Common config package for CUDA Toolkit",
                section="devel",
                architecture="all",
            )
        )
    for toolkit in CUDA_TOOLKITS:
        packages += _cuda_toolkit_packages(toolkit)
    return packages


def _cuda_toolkit_packages(toolkit: CudaToolkit) -> list[StandinPackage]:
    dashed, dotted, release = toolkit.dashed, toolkit.major_minor, toolkit.release
    prefix = f"/usr/local/cuda-{dotted}"
    deb = f"{release}-1"

    def cuda(name: str, version: str, summary: str, **fields: Any) -> StandinPackage:
        return StandinPackage(name, version, CUDA_REPO, summary, section="devel", **fields)

    return [
        cuda(
            f"cuda-toolkit-{dashed}-config-common",
            f"{toolkit.cudart}-1",
            "Common config package for CUDA Toolkit",
            architecture="all",
            scripts=_cuda_alternatives_scripts(dotted),
        ),
        cuda(
            f"cuda-cudart-{dashed}",
            f"{toolkit.cudart}-1",
            "CUDA Runtime native Libraries",
            depends=(
                f"cuda-toolkit-{dashed}-config-common",
                "cuda-toolkit-12-config-common",
                "cuda-toolkit-config-common",
            ),
            files=(
                PackageFile(
                    f"{prefix}/targets/x86_64-linux/lib/README.gpunode-lab",
                    "CUDA runtime libraries placeholder (gpunode lab stand-in).\n",
                ),
            ),
        ),
        cuda(
            f"cuda-nvcc-{dashed}",
            f"{toolkit.nvcc}-1",
            "CUDA nvcc",
            depends=(f"cuda-cudart-{dashed} (>= {toolkit.cudart})",),
            files=(PackageFile(f"{prefix}/bin/nvcc", _nvcc_script(toolkit), 0o755),),
        ),
        cuda(
            f"cuda-toolkit-{dashed}",
            deb,
            f"CUDA Toolkit {dotted} meta-package",
            depends=(
                f"cuda-nvcc-{dashed} (>= {toolkit.nvcc})",
                f"cuda-cudart-{dashed} (>= {toolkit.cudart})",
            ),
            files=(PackageFile(f"{prefix}/version.json", _cuda_version_json(toolkit)),),
        ),
        cuda(
            f"cuda-runtime-{dashed}",
            deb,
            f"CUDA Runtime {dotted} meta-package",
            depends=(
                f"cuda-cudart-{dashed} (>= {toolkit.cudart})",
                f"cuda-drivers (>= {toolkit.minimum_driver})",
            ),
        ),
        cuda(
            f"cuda-{dashed}",
            deb,
            f"CUDA {dotted} meta-package",
            depends=(
                f"cuda-runtime-{dashed} (>= {release})",
                f"cuda-toolkit-{dashed} (>= {release})",
            ),
        ),
        cuda(
            "cuda-toolkit",
            deb,
            "CUDA Toolkit meta-package",
            depends=(f"cuda-toolkit-{dashed} (>= {release})",),
        ),
        cuda("cuda", deb, "CUDA meta-package", depends=(f"cuda-{dashed} (>= {release})",)),
    ]


def _nccl_packages(version: str) -> list[StandinPackage]:
    return [
        StandinPackage(
            "libnccl2",
            version,
            CUDA_REPO,
            "NVIDIA Collective Communication Library (NCCL) Runtime",
            section="libs",
        ),
        StandinPackage(
            "libnccl-dev",
            version,
            CUDA_REPO,
            "NVIDIA Collective Communication Library (NCCL) Development Files",
            section="libdevel",
            depends=(f"libnccl2 (= {version})",),
        ),
    ]


# --- NVIDIA Container Toolkit ----------------------------------------------------------------


def _container_toolkit_packages(version: str) -> list[StandinPackage]:
    upstream = version.rsplit("-", 1)[0]

    def package(name: str, summary: str, **fields: Any) -> StandinPackage:
        return StandinPackage(name, version, LIBNVIDIA_CONTAINER_REPO, summary, **fields)

    return [
        package(
            "libnvidia-container1",
            "NVIDIA container runtime library",
            section="libs",
            depends=("libc6",),
        ),
        package(
            "libnvidia-container-tools",
            "NVIDIA container runtime library (command-line tools)",
            depends=(f"libnvidia-container1 (>= {version})", "libc6"),
            files=(
                PackageFile(
                    "/usr/bin/nvidia-container-cli", _container_cli_script(upstream), 0o755
                ),
            ),
        ),
        package(
            "nvidia-container-toolkit-base",
            "NVIDIA Container Toolkit Base",
            breaks=("nvidia-container-toolkit (<= 1.10.0-1)",),
            replaces=("nvidia-container-toolkit (<= 1.10.0-1)",),
            files=(
                PackageFile(
                    "/usr/bin/nvidia-ctk", _python_standin("nvidia_ctk.py", upstream), 0o755
                ),
                PackageFile(
                    "/usr/bin/nvidia-container-runtime", _container_runtime_script(upstream), 0o755
                ),
                PackageFile(
                    "/usr/bin/nvidia-cdi-hook", _noop_script("nvidia-cdi-hook", upstream), 0o755
                ),
            ),
            scripts={"postinst": TOOLKIT_BASE_POSTINST, "postrm": TOOLKIT_BASE_POSTRM},
        ),
        package(
            "nvidia-container-toolkit",
            "NVIDIA Container toolkit",
            depends=(
                f"nvidia-container-toolkit-base (= {version})",
                f"libnvidia-container-tools (>= {version})",
                "libnvidia-container-tools (<< 2.0.0)",
                "libseccomp2",
            ),
            breaks=("nvidia-container-runtime (<= 3.5.0-1)", "nvidia-container-runtime-hook"),
            replaces=("nvidia-container-runtime (<= 3.5.0-1)", "nvidia-container-runtime-hook"),
            files=(
                PackageFile(
                    "/usr/bin/nvidia-container-runtime-hook",
                    _noop_script("nvidia-container-runtime-hook", upstream),
                    0o755,
                ),
            ),
            scripts={"postinst": TOOLKIT_POSTINST, "postrm": TOOLKIT_POSTRM},
        ),
    ]


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


def _dcgmi_script(version: str) -> str:
    return f"""#!/bin/sh
# gpunode lab stand-in for dcgmi {version}: --version, and discovery -l from nvidia-smi -L
# while nv-hostengine runs.
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
echo "dcgmi: the gpunode lab stand-in only answers --version and discovery -l" >&2
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
    postinst = f"""#!/bin/sh
set -e
if [ "$1" = configure ]; then
    mkdir -p {Path(INSTALLED_DRIVER_VERSION_PATH).parent}
    echo {version} > {INSTALLED_DRIVER_VERSION_PATH}.new
    mv {INSTALLED_DRIVER_VERSION_PATH}.new {INSTALLED_DRIVER_VERSION_PATH}
    echo {flavour} > {INSTALLED_KERNEL_MODULE_FLAVOUR_PATH}
fi
exit 0
"""
    postrm = f"""#!/bin/sh
set -e
case "$1" in
    remove|purge)
        if [ "$(cat {INSTALLED_DRIVER_VERSION_PATH} 2>/dev/null)" = {version} ]; then
            rm -f {INSTALLED_DRIVER_VERSION_PATH} {INSTALLED_KERNEL_MODULE_FLAVOUR_PATH}
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
        configure = f"""    deb-systemd-helper update-state '{unit}' >/dev/null || true
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

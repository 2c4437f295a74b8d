"""The stand-in of Ubuntu's own NVIDIA driver packages (``nvidia_driver.source: ubuntu``), for
the lab's stand-in Ubuntu archive (``lab.aptrepo``: ``ubuntu/dists/noble-updates``, components
restricted and multiverse), generated from the data file ``ubuntu_world.toml`` beside this
module.

The data records each package's real relations, as Ubuntu's ``Packages`` indexes show them
(packages.ubuntu.com pages, read 2026-12-07), with where each comes from or why it is assumed,
and where the stand-in departs (no Ubuntu kernel image, no dkms on a lab node);
``tests/unit/test_standin_ubuntu.py`` checks the built relations are exactly those. The
package graph is Ubuntu's: the compute set ``libnvidia-compute-<branch>-server``,
``nvidia-utils-``, ``nvidia-compute-utils-``, ``nvidia-kernel-common-``; the kernel module as
``nvidia-dkms-<branch>-server[-open]`` or, for each kernel the archive carries,
Canonical's prebuilt ``linux-modules-nvidia-<branch>-server[-open]-<abi>-<flavour>`` at the
kernel's own version with its flavour's meta package; ``nvidia-headless-`` and
``nvidia-driver-<branch>-server[-open]`` above them; Fabric Manager's
``nvidia-fabricmanager-<branch>`` and ``libnvidia-nscq-<branch>`` (multiverse), which need the
server series' kernel common files at exactly their upstream version.

Contents, as the NVIDIA stand-ins' (``catalogue.py``): a kernel module package (prebuilt or
DKMS) records what a (simulated) reboot would load, the driver's upstream version and the
module flavour, for the lab's GPU simulator (``module_scripts``: per package, as modules of
one driver for several kernels are installed side by side); ``nvidia-compute-utils-``
ships the stand-in ``nvidia-persistenced`` and its unit, ``nvidia-fabricmanager-`` the
stand-in ``nv-fabricmanager`` (which, like the real one, runs only with the driver of its own
version) and its unit. No library, no module, nothing built.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpunode.nvidia_releases import driver_cuda_version

from .catalogue import (
    INSTALLED_DRIVER_CUDA_VERSION_PATH,
    INSTALLED_DRIVER_VERSION_PATH,
    INSTALLED_KERNEL_MODULE_FLAVOUR_PATH,
    PERSISTENCED_UNIT,
    UBUNTU_REPO,
    PackageFile,
    StandinPackage,
    _python_standin,
    _systemd_scripts,
    _with_readme,
    fabricmanager_files,
    render,
    standin_relations,
)

WORLD_PATH = Path(__file__).resolve().with_name("ubuntu_world.toml")
# The module record the lab's GPU simulator and modinfo double read (catalogue.py's paths).
STATE_DIR = str(Path(INSTALLED_DRIVER_VERSION_PATH).parent)
VERSION_FILE = Path(INSTALLED_DRIVER_VERSION_PATH).name
FLAVOUR_FILE = Path(INSTALLED_KERNEL_MODULE_FLAVOUR_PATH).name
CUDA_FILE = Path(INSTALLED_DRIVER_CUDA_VERSION_PATH).name


def load_world(path: Path = WORLD_PATH) -> dict[str, Any]:
    with path.open("rb") as stream:
        return tomllib.load(stream)


WORLD = load_world()
# Where the packages are published: the suite of the stand-in Ubuntu archive.
SUITE: str = WORLD["meta"]["suite"]
# The Ubuntu release whose archive this is (noble-updates -> noble).
CODENAME = SUITE.split("-", 1)[0]
MODULE_FLAVOURS = {"proprietary": "", "open": "-open"}


@dataclass(frozen=True)
class UbuntuDriverRelease:
    branch: str
    series: str  # "-server" (the data-centre series) or ""
    version: str  # Ubuntu's version, 580.173.02-0ubuntu0.24.04.1

    @property
    def upstream(self) -> str:
        return self.version.split("-", 1)[0]


@dataclass(frozen=True)
class PrebuiltKernel:
    """A kernel the archive carries Canonical's prebuilt modules for."""

    kernel: str  # 6.8.0-64
    kernel_flavour: str  # generic
    kernel_version: str  # 6.8.0-64.67+1

    @property
    def release(self) -> str:
        """``uname -r`` of this kernel."""
        return f"{self.kernel}-{self.kernel_flavour}"


DRIVER_RELEASES = tuple(
    UbuntuDriverRelease(str(raw["branch"]), raw["series"], raw["version"])
    for raw in WORLD["driver"]
)
PREBUILT_KERNELS = tuple(
    PrebuiltKernel(raw["kernel"], raw["kernel_flavour"], raw["kernel_version"])
    for raw in WORLD["kernel"]
)


@dataclass(frozen=True)
class Generated:
    template: dict[str, Any]
    context: dict[str, str]
    package: StandinPackage


def _contexts(family: str) -> Iterator[dict[str, str]]:
    for driver in DRIVER_RELEASES:
        base = {
            "branch": driver.branch,
            "series": driver.series,
            "version": driver.version,
            "upstream": driver.upstream,
        }
        if family == "driver":
            yield base
            continue
        for module_flavour, suffix in MODULE_FLAVOURS.items():
            flavoured = {**base, "flavour": suffix, "module_flavour": module_flavour}
            if family == "driver-flavoured":
                yield flavoured
            elif family == "prebuilt":
                for kernel in PREBUILT_KERNELS:
                    yield {
                        **flavoured,
                        "kernel": kernel.kernel,
                        "kernel_flavour": kernel.kernel_flavour,
                        "kernel_version": kernel.kernel_version,
                    }
            else:
                raise ValueError(f"ubuntu_world.toml: unknown package family {family!r}")


WORLD_TEMPLATES = {template["id"]: template for template in WORLD["package"]}
# Where each installed module package notes the module it holds (one file per package).
MODULES_DIR = "modules"


# Where depmod lists a kernel's modules; the Container Toolkit's nvidia-cdi-refresh.service
# runs only where the running kernel's lists nvidia.ko (its ExecCondition).
MODULES_ROOT = "/lib/modules"


@dataclass(frozen=True)
class ModuleEntry:
    """The line depmod writes for a package's nvidia.ko in its kernel's modules.dep.
    ``kernel``: the kernel release the module is for, a word, or ``$(uname -r)`` (DKMS builds
    for the running kernel)."""

    kernel: str
    path: str  # relative to /lib/modules/<kernel>, e.g. updates/dkms/nvidia.ko


def module_scripts(
    package: str,
    upstream: str,
    flavour: str,
    state_dir: str = STATE_DIR,
    entry: ModuleEntry | None = None,
    modules_root: str = MODULES_ROOT,
) -> dict[str, str]:
    """postinst and postrm of a kernel module package (prebuilt or DKMS): what a (simulated)
    reboot loads, as the NVIDIA stand-ins record it (``catalogue._kernel_module_scripts``:
    the driver's upstream version, module flavour and CUDA version), and per package, since
    on Ubuntu modules of the same driver are installed side by side, one per kernel (a
    prebuilt one for one kernel, DKMS for another): removing one leaves the record of another
    that is still installed, not none. With ``entry``, the module's line in its kernel's
    modules.dep, as depmod leaves it (the lab node has no such kernel's modules otherwise)."""
    cuda = driver_cuda_version(upstream) or "N/A"
    marker = f"{state_dir}/{MODULES_DIR}/{package}"
    version_file = f"{state_dir}/{VERSION_FILE}"
    record_files = f"{version_file} {state_dir}/{FLAVOUR_FILE} {state_dir}/{CUDA_FILE}"
    add_entry = remove_entry = ""
    if entry is not None:
        dep = f'"{modules_root}/{entry.kernel}/modules.dep"'
        line = f"{entry.path}:"
        add_entry = f"""
    mkdir -p "$(dirname {dep})"
    grep -qxF '{line}' {dep} 2>/dev/null || echo '{line}' >> {dep}"""
        remove_entry = f"""
        if [ -f {dep} ]; then
            grep -vxF '{line}' {dep} > {dep}.new || true
            mv {dep}.new {dep}
        fi"""
    postinst = f"""#!/bin/sh
set -e
if [ "$1" = configure ]; then{add_entry}
    mkdir -p {state_dir}/{MODULES_DIR}
    echo '{upstream} {flavour} {cuda}' > {marker}
    echo {upstream} > {version_file}.new
    mv {version_file}.new {version_file}
    echo {flavour} > {state_dir}/{FLAVOUR_FILE}
    echo {cuda} > {state_dir}/{CUDA_FILE}
fi
exit 0
"""
    postrm = f"""#!/bin/sh
set -e
case "$1" in
    remove|purge){remove_entry}
        rm -f {marker}
        left=$(ls {state_dir}/{MODULES_DIR} 2>/dev/null | head -n 1)
        if [ -n "$left" ]; then
            read -r version flavour cuda < "{state_dir}/{MODULES_DIR}/$left"
            echo "$version" > {version_file}.new
            mv {version_file}.new {version_file}
            echo "$flavour" > {state_dir}/{FLAVOUR_FILE}
            echo "$cuda" > {state_dir}/{CUDA_FILE}
        else
            rm -f {record_files}
        fi ;;
esac
exit 0
"""
    return {"postinst": postinst, "postrm": postrm}


def generated() -> list[Generated]:
    """Every package of the stand-in Ubuntu archive, with its template and context."""
    results = []
    for template in WORLD["package"]:
        for context in _contexts(template["family"]):
            relations = standin_relations(template, context)
            package = StandinPackage(
                name=render(template["name"], context),
                version=render(template.get("version", "{version}"), context),
                repository=UBUNTU_REPO,
                summary=render(template["summary"], context),
                section=template["section"],
                depends=tuple(relations["depends"]),
                recommends=tuple(relations["recommends"]),
                provides=tuple(relations["provides"]),
                conflicts=tuple(relations["conflicts"]),
                replaces=tuple(relations["replaces"]),
                breaks=tuple(relations["breaks"]),
            )
            files, scripts = _contents(template["id"], context)
            package = replace(package, files=tuple(files), scripts=scripts)
            results.append(Generated(template, context, _with_readme(package)))
    return results


def catalogue() -> list[StandinPackage]:
    """Every package of the stand-in Ubuntu archive."""
    return [item.package for item in generated()]


def component(package: StandinPackage) -> str:
    """The archive component ``package`` is published in, as Ubuntu's sections name it
    ("restricted/libs" is restricted's; a section without a prefix is main's)."""
    prefix, slash, _ = package.section.partition("/")
    return prefix if slash else "main"


def components() -> tuple[str, ...]:
    """The components the stand-in suite publishes, sorted (its Release lists them so)."""
    return tuple(sorted({component(package) for package in catalogue()}))


def _contents(
    template_id: str, context: dict[str, str]
) -> tuple[list[PackageFile], dict[str, str]]:
    if template_id in ("nvidia-dkms", "linux-modules-nvidia"):
        name = render(WORLD_TEMPLATES[template_id]["name"], context)
        if template_id == "nvidia-dkms":
            entry = ModuleEntry("$(uname -r)", "updates/dkms/nvidia.ko")
        else:
            # Canonical's directory of the module inside its kernel's tree is not recorded:
            # assumed; what the toolkit's check reads is the file name, nvidia.ko.
            directory = render("nvidia-{branch}{series}{flavour}", context)
            entry = ModuleEntry(f"{context['kernel']}-{context['kernel_flavour']}",
                                f"kernel/{directory}/nvidia.ko")  # fmt: skip
        scripts = module_scripts(name, context["upstream"], context["module_flavour"], entry=entry)
        return [], scripts
    if template_id == "nvidia-compute-utils":
        daemon = _python_standin("daemon.py", context["upstream"])
        files = [
            PackageFile("/usr/bin/nvidia-persistenced", daemon, 0o755),
            PackageFile("/lib/systemd/system/nvidia-persistenced.service", PERSISTENCED_UNIT),
        ]
        return files, _systemd_scripts("nvidia-persistenced.service", enable=True)
    if template_id == "nvidia-fabricmanager":
        # The daemon compares its own (upstream) version with the loaded driver's.
        return fabricmanager_files(context["upstream"])
    return [], {}

"""CUDA toolkits by exact release, side by side, one of them the system default; libnccl2 to match.

Each release in ``cuda.versions`` is the package ``cuda-toolkit-X-Y``, never the ``cuda``
metapackage (``cuda`` -> ``cuda-X-Y`` -> ``cuda-runtime-X-Y`` -> ``cuda-drivers``: it installs a
driver). Installs never take recommends. Each toolkit package is held at the version first
installed (the newest the repository offered then), so nothing upgrades it behind the operator's
back; the model has no per-release package version yet.

The default release is ``cuda.default``, else the newest declared. NVIDIA's packages manage
``/usr/local/cuda`` and ``/usr/local/cuda-<major>`` with update-alternatives (each
``cuda-toolkit-X-Y-config-common`` postinst registers ``/usr/local/cuda-X.Y`` at priority XY), so
the default is set there in manual mode: installing a newer release by hand does not move it.
``/etc/profile.d/gpunode-cuda.sh`` puts ``/usr/local/cuda/bin`` on login shells' PATH and
``/etc/ld.so.conf.d/gpunode-cuda.conf`` adds its libraries; both follow the alternative, so a
new default changes no file, and ldconfig runs only when the path file or the default changed.

Removal: gpunode records the releases it manages in ``/var/lib/gpunode/cuda-toolkits``. A release
recorded there and no longer declared is removed (its hold lifted, ``cuda-toolkit-X-Y`` and the
release's own component packages apt then finds unneeded); a toolkit installed by other means is
never touched. Removal refuses, with a message, when it would take other packages with it.

``held_packages`` is the shared "pinned and held from one repository" operation, also used by the
Container Toolkit and DCGM roles.
"""

from __future__ import annotations

import shlex
from io import StringIO
from typing import Any

from pyinfra import host
from pyinfra.api import FactBase, OperationError, deploy, operation
from pyinfra.facts.apt import noninteractive_apt
from pyinfra.operations import files, server

from facts.container_runtime import (
    AptPackagePolicy,
    DpkgPackageState,
    is_indexed,
    normalise_url,
    package_state,
    versions_from,
)
from facts.freshness import FileNewerThan
from gpunode import framing
from gpunode.model import Cuda, DesiredState, version_tuple
from gpunode.refusal import NodeRefused

RECORD_PATH = "/var/lib/gpunode/cuda-toolkits"
PROFILE_PATH = "/etc/profile.d/gpunode-cuda.sh"
LDCONFIG_PATH = "/etc/ld.so.conf.d/gpunode-cuda.conf"
CUDA_LINK = "/usr/local/cuda"
# Where the toolkit's libraries really are (lib64 is a symlink to it in NVIDIA's packages).
CUDA_LIBRARY_DIR = f"{CUDA_LINK}/targets/x86_64-linux/lib"
# Packages that install a driver: a toolkit install must never name them.
DRIVER_PULLING_PACKAGES = ("cuda", "cuda-drivers")


def dashed(release: str) -> str:
    return release.replace(".", "-")


def toolkit_package(release: str) -> str:
    return f"cuda-toolkit-{dashed(release)}"


def toolkit_dir(release: str) -> str:
    return f"/usr/local/cuda-{release}"


def default_release(cuda: Cuda) -> str | None:
    """``cuda.default``, else the newest declared release, else None."""
    if cuda.default:
        return cuda.default
    return max(cuda.versions, key=version_tuple) if cuda.versions else None


# --- packages pinned and held from one repository --------------------------------------------


def apt_install(specs: list[str]) -> str:
    """apt-get install of exact versions: no recommends (libcuda1 recommends a kernel module);
    moving a held package or going back a version is what a pin change asks for."""
    return noninteractive_apt(
        "install --no-install-recommends --allow-downgrades --allow-change-held-packages "
        + " ".join(specs)
    )


def apt_hold(packages: list[str]) -> str:
    return "apt-mark hold " + " ".join(packages)


def not_offered(package: str, url: str, version: str | None, suffix: str | None) -> str:
    if version:
        return f"{package} {version} is not offered by {url}"
    if suffix:
        return f"{package}: no version ending in {suffix} is offered by {url}"
    return f"{package} is not offered by {url}"


def select_version_shell(
    package: str,
    url: str,
    version: str | None = None,
    suffix: str | None = None,
    branch: str | None = None,
) -> str:
    """Shell printing the newest version of ``package`` that ``url`` offers (exactly ``version``,
    or ending in ``suffix``, or whose upstream version is of ``branch``: ``550`` takes
    ``550.127.08-1``), from apt-cache madison: ``pkg | version | URL  Packages``."""
    program = (
        '{ v = $2; gsub(/ /, "", v); u = v; sub(/^[0-9]+:/, "", u) } '
        'index($3, url) && (want == "" || v == want) && '
        '(suffix == "" || substr(v, length(v) - length(suffix) + 1) == suffix) && '
        '(branch == "" || index(u, branch ".") == 1) '
        "{ print v; exit }"
    )
    return (
        f"apt-cache madison {shlex.quote(package)} | awk -F'|' "
        f"-v url={shlex.quote(' ' + normalise_url(url) + ' ')} "
        f"-v want={shlex.quote(version or '')} -v suffix={shlex.quote(suffix or '')} "
        f"-v branch={shlex.quote(branch or '')} {shlex.quote(program)}"
    )


def _unavailable(packages: list[str], url: str, version: str | None, suffix: str | None) -> str:
    return (
        not_offered(packages[0], url, version, suffix)
        + " (check the repository or mirror, then apt update)"
    )


@operation()
def held_packages(
    packages: list[str],
    repository_url: str,
    version: str | None = None,
    version_suffix: str | None = None,
):
    """``packages`` installed at one version from ``repository_url``, and held.

    The version is ``version``; without it, the version already installed (when all are at one
    that ends in ``version_suffix``), else the newest the repository offers that does. A version
    the repository does not offer is an error naming package, version and URL: from apt's lists
    when it has the repository's, else from the node just before installing (the repository was
    added in this run and its lists arrive with its apt update). Deploys also call
    ``require_offered`` so that such an error comes before anything changes.

    apt is asked what the repository offers only when a package is to be installed: packages
    already at their version need dpkg's word alone.

    + packages: the Debian packages, installed together at the same version
    + repository_url: the APT repository the version must come from
    + version: the exact Debian version to install; None to keep or choose one as above
    + version_suffix: without ``version``, the ending an acceptable version must have (e.g.
      ``+cuda12.4`` for libnccl2); None accepts any
    """
    dpkg = host.get_fact(DpkgPackageState, packages=list(packages))
    installed = {dpkg[package]["installed"] for package in packages}
    target = version
    if target is None:
        only = next(iter(installed)) if len(installed) == 1 else None
        if only is not None and (not version_suffix or only.endswith(version_suffix)):
            target = only
    if target is not None and installed == {target}:
        unheld = [package for package in packages if not dpkg[package]["held"]]
        if unheld:
            yield apt_hold(unheld)
        else:
            host.noop(f"{' '.join(packages)} {target} installed and held")
        return

    policy = host.get_fact(AptPackagePolicy, packages=list(packages))
    states = {package: package_state(policy, package) for package in packages}
    indexed = is_indexed(policy, repository_url)
    if target is None and indexed:
        offered = [
            candidate
            for candidate in versions_from(states[packages[0]], repository_url)
            if not version_suffix or candidate.endswith(version_suffix)
        ]
        if not offered:
            raise OperationError(_unavailable(packages, repository_url, version, version_suffix))
        target = offered[0]

    if target is not None and indexed:
        for package in packages:
            offered = versions_from(states[package], repository_url)
            if states[package]["installed"] != target and target not in offered:
                raise OperationError(
                    f"{not_offered(package, repository_url, target, None)} (it offers: "
                    f"{', '.join(offered) or 'nothing'}; check the repository or mirror, then "
                    "apt update)"
                )

    if target is not None and indexed:
        yield apt_install([f"{package}={target}" for package in packages])
    else:
        # Resolved on the node once the repository's lists are there; the same rule as above.
        select = select_version_shell(packages[0], repository_url, version, version_suffix)
        message = "gpunode: " + _unavailable(packages, repository_url, version, version_suffix)
        yield (
            f'version="$({select})"; '
            f'if [ -z "$version" ]; then echo {shlex.quote(message)} >&2; exit 1; fi; '
            + apt_install([f'{package}="$version"' for package in packages])
        )
    yield apt_hold(list(packages))


def require_offered(
    packages: list[str],
    repository_url: str,
    version: str | None = None,
    version_suffix: str | None = None,
) -> None:
    """Deploy-time (prepare) check: refuse before any host changes when apt already has the
    repository's lists and they lack what is declared. Without its lists (the repository is
    added in this run) ``held_packages`` checks on the node instead, before installing.
    Packages installed as declared need no word from apt."""

    def wanted(candidate: str | None) -> bool:
        return (
            candidate is not None
            and (version is None or candidate == version)
            and (version_suffix is None or candidate.endswith(version_suffix))
        )

    dpkg = host.get_fact(DpkgPackageState, packages=list(packages))
    if all(wanted(dpkg[package]["installed"]) for package in packages):
        return
    policy = host.get_fact(AptPackagePolicy, packages=list(packages))
    if not is_indexed(policy, repository_url):
        return
    for package in packages:
        state = package_state(policy, package)
        offered = versions_from(state, repository_url)
        if wanted(state["installed"]) or any(wanted(candidate) for candidate in offered):
            continue
        raise NodeRefused(
            f"{host.name}: {not_offered(package, repository_url, version, version_suffix)} "
            f"(it offers: {', '.join(offered) or 'nothing'}); check the repository or mirror, "
            "then apt update"
        )


def nccl_version_suffix(desired: DesiredState) -> str:
    """libnccl2 builds are per CUDA release: ``+cudaX.Y`` of the default release."""
    release = default_release(desired.cuda)
    if release is None:
        raise NodeRefused(
            f"{host.name}: nccl.install_libnccl needs a CUDA release to match (libnccl2 is "
            "built per CUDA release, e.g. 2.26.2-1+cuda12.8); declare cuda.versions"
        )
    return f"+cuda{release}"


# --- CUDA releases ---------------------------------------------------------------------------


ALTERNATIVE_PART = "alternative."
RECORDED_PART = "recorded"


class CudaToolkitSetup(FactBase):
    """
    The /usr/local/cuda alternatives and the CUDA releases gpunode manages on this host.

    .. code:: python

        {
            "alternatives": {"cuda": {"status": "manual", "value": "/usr/local/cuda-12.8"},
                             "cuda-12": {...}},  # absent: no such alternative
            "recorded": ["12.4", "12.8"],
        }
    """

    def command(self, names: list[str]) -> str:
        # One framed part per alternative (gpunode's own names), then the recorded releases.
        parts = [
            framing.Part(
                f"{ALTERNATIVE_PART}{name}",
                f"LC_ALL=C update-alternatives --query {shlex.quote(name)}",
                stderr="drop",
            )
            for name in names
        ]
        parts.append(framing.Part(RECORDED_PART, f"cat {RECORD_PATH}", stderr="drop"))
        return framing.command(parts)

    def process(self, output: list[str]) -> dict[str, Any]:
        frame = framing.parse(output)
        alternatives: dict[str, dict[str, str | None]] = {}
        for part_name, part in frame.parts.items():
            if not part_name.startswith(ALTERNATIVE_PART):
                continue
            entry: dict[str, str | None] = {"status": None, "value": None}
            for line in part.lines:
                key, _, value = line.partition(":")
                if key in ("Status", "Value"):
                    entry[key.lower()] = value.strip()
            # An alternative update-alternatives does not know has no Status line.
            if entry["status"]:
                alternatives[part_name[len(ALTERNATIVE_PART) :]] = entry
        recorded = [line.strip() for line in frame.part(RECORDED_PART).lines if line.strip()]
        return {"alternatives": alternatives, "recorded": recorded}


def render_record(releases: list[str]) -> str:
    return "".join(f"{release}\n" for release in sorted(set(releases), key=version_tuple))


def _write_record(releases: list[str]) -> str:
    content = shlex.quote(render_record(releases))
    return f"mkdir -p {RECORD_PATH.rsplit('/', 1)[0]} && printf %s {content} > {RECORD_PATH}"


@operation()
def recorded_releases(releases: list[str]):
    """Every release in ``releases`` is in gpunode's record, before anything is installed, so a
    run that fails half-way still knows what it may remove later.

    + releases: the declared CUDA releases (``cuda.versions``, e.g. ``12.4``), added to the
      record; releases already recorded stay in it
    """
    recorded = host.get_fact(CudaToolkitSetup, names=[])["recorded"]
    missing = [release for release in releases if release not in recorded]
    if not missing:
        host.noop(f"CUDA releases {', '.join(releases)} are recorded as gpunode's")
        return
    yield _write_record([*recorded, *missing])


def _remove_release_shell(release: str) -> str:
    # The release comes from the node's record file: every use is quoted.
    package = shlex.quote(toolkit_package(release))
    # The release's own component packages (cuda-nvcc-12-4, libcublas-12-4, ...).
    release_pattern = shlex.quote(f"-{dashed(release)}($|-)")
    refusal = shlex.quote(
        f"gpunode: removing {toolkit_package(release)} would also remove other packages that "
        "depend on it; "
        "left installed:"
    )
    return (
        f"extra=$(apt-get -s remove {package} | awk '/^Remv /{{print $2}}' | grep -vx {package} "
        f'|| true); if [ -n "$extra" ]; then echo {refusal} $extra >&2; exit 1; fi; '
        f"apt-mark unhold {package} >/dev/null && "
        + noninteractive_apt(f"remove {package}")
        + f" && unneeded=$(apt-get -s autoremove | awk '/^Remv /{{print $2}}' "
        f"| grep -E -e {release_pattern} || true); "
        'if [ -n "$unneeded" ]; then ' + noninteractive_apt("remove $unneeded") + "; fi"
    )


@operation()
def undeclared_releases_removed(declared: list[str]):
    """No CUDA release that gpunode installed and that is no longer declared stays installed.

    + declared: the CUDA releases the inventory declares; every other recorded release is
      removed and the record then holds exactly these
    """
    recorded = host.get_fact(CudaToolkitSetup, names=[])["recorded"]
    undeclared = [release for release in recorded if release not in declared]
    if not undeclared:
        host.noop("no undeclared CUDA release recorded as gpunode's")
        return
    dpkg = host.get_fact(DpkgPackageState, packages=[toolkit_package(r) for r in undeclared])
    for release in undeclared:
        if dpkg[toolkit_package(release)]["installed"] is not None:
            yield _remove_release_shell(release)
    # Declared releases were recorded before their install (recorded_releases).
    yield _write_record(declared)


def _major(release: str) -> str:
    return release.split(".")[0]


@operation()
def default_toolkit(release: str):
    """``/usr/local/cuda`` and ``/usr/local/cuda-<major>`` point at ``release``, in manual mode.

    + release: the default CUDA release (e.g. ``12.4``), installed in
      ``/usr/local/cuda-<release>``
    """
    wanted = toolkit_dir(release)
    names = ["cuda", f"cuda-{_major(release)}"]
    current = host.get_fact(CudaToolkitSetup, names=names)["alternatives"]
    done = []
    for name in names:
        entry = current.get(name) or {}
        if entry.get("status") == "manual" and entry.get("value") == wanted:
            done.append(name)
        else:
            yield f"update-alternatives --set {name} {wanted}"
    if len(done) == len(names):
        host.noop(f"{CUDA_LINK} is CUDA {release} ({wanted}, manual)")


def render_profile() -> str:
    return (
        "# Managed by gpunode (cuda.default): the default CUDA toolkit on login shells' PATH.\n"
        f'case ":$PATH:" in\n    *:{CUDA_LINK}/bin:*) ;;\n'
        f'    *) PATH="{CUDA_LINK}/bin:$PATH"; export PATH ;;\nesac\n'
    )


def render_ldconfig() -> str:
    return (
        "# Managed by gpunode (cuda.default): the default CUDA toolkit's libraries.\n"
        f"{CUDA_LIBRARY_DIR}\n"
    )


@deploy("CUDA toolkits")
def cuda_toolkits(desired: DesiredState) -> None:
    cuda = desired.cuda
    url = desired.apt.cuda_repo_url
    releases = sorted(cuda.versions, key=version_tuple)
    default = default_release(cuda)

    if releases:
        require_offered([toolkit_package(release) for release in releases], url)
        recorded_releases(name="Record the CUDA releases gpunode manages", releases=releases)
    for release in releases:
        held_packages(
            name=f"CUDA {release} toolkit ({toolkit_package(release)}), pinned and held",
            packages=[toolkit_package(release)],
            repository_url=url,
        )
    undeclared_releases_removed(name="Undeclared CUDA releases removed", declared=releases)

    default_changed = None
    if default is not None:
        default_changed = default_toolkit(name=f"Default CUDA toolkit {default}", release=default)
        files.put(
            name="CUDA on login shells' PATH",
            src=StringIO(render_profile()),
            dest=PROFILE_PATH,
            mode="644",
        )
        library_path = files.put(
            name="CUDA libraries on the linker path",
            src=StringIO(render_ldconfig()),
            dest=LDCONFIG_PATH,
            mode="644",
        )
    else:
        files.file(name="No CUDA on PATH", path=PROFILE_PATH, present=False)
        library_path = files.file(name="No CUDA linker path", path=LDCONFIG_PATH, present=False)

    # Or a linker cache older than the path file: a run cut off before ldconfig.
    cache_stale = host.get_fact(FileNewerThan, path=LDCONFIG_PATH, reference="/etc/ld.so.cache")

    def linker_paths_changed() -> bool:
        return (
            library_path.did_change()
            or bool(default_changed and default_changed.did_change())
            or cache_stale
        )

    server.shell(
        name="Linker cache after a CUDA library path change",
        commands=["ldconfig"],
        _if=linker_paths_changed,
    )

    if desired.nccl.install_libnccl:
        suffix = nccl_version_suffix(desired)
        require_offered(["libnccl2"], url, version_suffix=suffix)
        held_packages(
            name=f"libnccl2 for CUDA {default}, pinned and held",
            packages=["libnccl2"],
            repository_url=url,
            version_suffix=suffix,
        )

"""NVIDIA's apt repositories (CUDA, libnvidia-container), and on Ubuntu the graphics-drivers
PPA where data names it, each with its own signed-by keyring (never apt-key).

Every URL comes from data, so an air-gapped site points them at its mirror; a repository is
configured only when something declared needs it, and removed (with its keyring) otherwise.
The PPA (``apt.ubuntu_driver_ppa_url``, e.g. https://ppa.launchpadcontent.net/graphics-drivers/
ppa/ubuntu) carries the same package names as Ubuntu's archive, for the ubuntu driver
source: a suite per Ubuntu release, component main.
"""

from __future__ import annotations

from dataclasses import dataclass
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import Sha1File
from pyinfra.operations import apt, files

from facts.apt import AptIndexedRepositories
from facts.container_runtime import normalise_url
from gpunode.converge import this_node
from gpunode.model import DesiredState
from gpunode.refusal import NodeRefused
from gpunode.schema import one_line
from roles.base import package_mirrors_reachable, sha1

KEYRING_DIR = "/usr/share/keyrings"
SOURCES_DIR = "/etc/apt/sources.list.d"


@dataclass(frozen=True)
class NvidiaRepository:
    name: str
    url: str
    keyring: str | None
    keyring_key: str  # the data key that names the keyring, for error messages
    url_key: str  # the data key that names the URL (under apt.)
    needed: bool
    # NVIDIA publishes flat repositories ("/", no components); a PPA has a suite per release.
    suite: str = "/"
    components: str = ""

    @property
    def sources_path(self) -> str:
        return f"{SOURCES_DIR}/gpunode-{self.name}.sources"

    @property
    def keyring_path(self) -> str:
        return f"{KEYRING_DIR}/gpunode-{self.name}.gpg"

    @property
    def release_file(self) -> str:
        """The first file an update reads from the repository."""
        base = self.url.rstrip("/")
        return f"{base}/InRelease" if self.suite == "/" else f"{base}/dists/{self.suite}/InRelease"

    def render_sources(self) -> str:
        components = f"Components: {self.components}\n" if self.components else ""
        return (
            "# Managed by gpunode; the URL comes from inventory data (apt.*_url).\n"
            f"Types: deb\nURIs: {one_line(self.url.rstrip('/'))}/\nSuites: {self.suite}\n"
            f"{components}Signed-By: {self.keyring_path}\n"
        )


def nvidia_repositories_for(desired: DesiredState, release: str = "") -> list[NvidiaRepository]:
    """The repositories data may configure, each saying whether this node needs it;
    ``release``: the node's codename, the PPA's suite."""
    repos = desired.apt
    runtime = desired.container_runtime
    needs_cuda_repo = (
        desired.nvidia_driver.source == "nvidia"
        or bool(desired.cuda.versions)
        or desired.dcgm.enabled
        or desired.nccl.install_libnccl
        # Fabric Manager comes from its driver's source: NVIDIA's repository for the nvidia
        # source, Ubuntu's archive for the ubuntu one; the NVLink Subnet Manager from NVIDIA's.
        or (desired.needs_fabric_manager and desired.nvidia_driver.source == "nvidia")
        or (desired.needs_nvlsm and desired.nvidia_driver.source != "none")
        or desired.needs_imex
    )
    return [
        NvidiaRepository(
            "nvidia-cuda", repos.cuda_repo_url, repos.cuda_keyring, "apt.cuda_keyring",
            "cuda_repo_url", needs_cuda_repo,
        ),
        NvidiaRepository(
            "nvidia-container-toolkit", repos.container_toolkit_repo_url,
            repos.container_toolkit_keyring, "apt.container_toolkit_keyring",
            "container_toolkit_repo_url",
            bool(runtime.engines) or runtime.toolkit_version is not None,
        ),
        NvidiaRepository(
            "ubuntu-graphics-drivers-ppa", repos.ubuntu_driver_ppa_url or "",
            repos.ubuntu_driver_ppa_keyring, "apt.ubuntu_driver_ppa_keyring",
            "ubuntu_driver_ppa_url",
            desired.nvidia_driver.source == "ubuntu" and bool(repos.ubuntu_driver_ppa_url),
            suite=release, components="main",
        ),
    ]  # fmt: skip


def _local_keyring(repo: NvidiaRepository) -> Path:
    """The control-side keyring file, or a clear refusal before anything changes."""
    if repo.keyring is None:
        raise NodeRefused(
            f"{host.name}: {repo.keyring_key} is not set, but the {repo.name} repository is "
            "needed; give the path of its binary keyring (gpg --dearmor of the published key)"
        )
    path = Path(repo.keyring).expanduser()
    if not path.is_file():
        raise NodeRefused(f"{host.name}: {repo.keyring_key} = {repo.keyring!r}: no such file")
    return path


@deploy("NVIDIA repositories")
def nvidia_repositories(desired: DesiredState) -> None:
    changed = []
    release = this_node()[0].codename
    new_sources = [
        repo
        for repo in nvidia_repositories_for(desired, release)
        if repo.needed
        and host.get_fact(Sha1File, path=repo.sources_path) != sha1(repo.render_sources())
    ]
    if new_sources:
        package_mirrors_reachable(
            name="NVIDIA repositories answer",
            urls=[repo.release_file for repo in new_sources],
            proxy=desired.apt.proxy,
            direct_hosts=list(desired.apt.direct_hosts),
        )
    for repo in nvidia_repositories_for(desired, release):
        if repo.needed:
            keyring = _local_keyring(repo)
            changed.append(
                files.put(
                    name=f"{repo.name} signing keyring",
                    src=str(keyring),
                    dest=repo.keyring_path,
                    mode="644",
                )
            )
            changed.append(
                files.put(
                    # Not the URL: it follows each node's release, and pyinfra shows one
                    # name per operation for every host (a mixed fleet's would differ).
                    name=f"{repo.name} source (apt.{repo.url_key})",
                    src=StringIO(repo.render_sources()),
                    dest=repo.sources_path,
                    mode="644",
                )
            )
        else:
            changed.append(
                files.file(
                    name=f"No {repo.name} source (nothing declared needs it)",
                    path=repo.sources_path,
                    present=False,
                )
            )
            changed.append(
                files.file(name=f"No {repo.name} keyring", path=repo.keyring_path, present=False)
            )
    # Also when apt has no lists for a declared repository: a run cut off between writing
    # the source and the update (killed, rebooted) leaves the source "unchanged" next time.
    indexed = host.get_fact(AptIndexedRepositories)
    unindexed = [
        repo.url
        for repo in nvidia_repositories_for(desired, release)
        if repo.needed and normalise_url(repo.url) not in indexed
    ]
    apt.update(
        name="Refresh package lists after a repository change",
        _if=lambda: any(op.did_change() for op in changed) or bool(unindexed),
    )

"""NVIDIA's apt repositories (CUDA, libnvidia-container), each with its own signed-by keyring.

Every URL comes from data, so an air-gapped site points them at its mirror; a repository is
configured only when something declared needs it, and removed (with its keyring) otherwise.
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

    @property
    def sources_path(self) -> str:
        return f"{SOURCES_DIR}/gpunode-{self.name}.sources"

    @property
    def keyring_path(self) -> str:
        return f"{KEYRING_DIR}/gpunode-{self.name}.gpg"

    def render_sources(self) -> str:
        # NVIDIA publishes flat repositories: the suite is "/" and there are no components.
        return (
            "# Managed by gpunode; the URL comes from inventory data (apt.*_url).\n"
            f"Types: deb\nURIs: {one_line(self.url.rstrip('/'))}/\nSuites: /\n"
            f"Signed-By: {self.keyring_path}\n"
        )


def nvidia_repositories_for(desired: DesiredState) -> list[NvidiaRepository]:
    repos = desired.apt
    runtime = desired.container_runtime
    needs_cuda_repo = (
        desired.nvidia_driver.source == "nvidia"
        or bool(desired.cuda.versions)
        or desired.dcgm.enabled
        or desired.nccl.install_libnccl
        or (desired.needs_fabric_manager and desired.nvidia_driver.source != "none")
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
    new_sources = [
        repo
        for repo in nvidia_repositories_for(desired)
        if repo.needed
        and host.get_fact(Sha1File, path=repo.sources_path) != sha1(repo.render_sources())
    ]
    if new_sources:
        package_mirrors_reachable(
            name="NVIDIA repositories answer",
            urls=[f"{repo.url.rstrip('/')}/InRelease" for repo in new_sources],
            proxy=desired.apt.proxy,
            direct_hosts=list(desired.apt.direct_hosts),
        )
    for repo in nvidia_repositories_for(desired):
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
        for repo in nvidia_repositories_for(desired)
        if repo.needed and normalise_url(repo.url) not in indexed
    ]
    apt.update(
        name="Refresh package lists after a repository change",
        _if=lambda: any(op.did_change() for op in changed) or bool(unindexed),
    )

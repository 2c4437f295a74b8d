"""Which NVIDIA repositories a node gets, and how their sources are written."""

from __future__ import annotations

from gpunode.model import build_desired_state
from roles.nvidia_repos import nvidia_repositories_for


def needed(data: dict) -> dict[str, bool]:
    state, problems = build_desired_state(data)
    assert problems == []
    return {repo.name: repo.needed for repo in nvidia_repositories_for(state)}


def test_nothing_declared_needs_no_nvidia_repository() -> None:
    assert needed({}) == {"nvidia-cuda": False, "nvidia-container-toolkit": False}


def test_debian_driver_alone_needs_no_nvidia_repository() -> None:
    assert needed({"nvidia_driver": {"source": "debian"}})["nvidia-cuda"] is False


def test_what_needs_the_cuda_repository() -> None:
    assert needed({"nvidia_driver": {"source": "nvidia", "branch": "550"}})["nvidia-cuda"]
    assert needed({"cuda": {"versions": ["12.4"]}})["nvidia-cuda"]
    assert needed({"dcgm": {"enabled": True, "cuda_major": 12}})["nvidia-cuda"]


def test_container_engines_need_the_toolkit_repository() -> None:
    assert needed({"container_runtime": {"engines": ["docker"]}})["nvidia-container-toolkit"]


def test_sources_point_at_the_mirror_with_their_own_keyring() -> None:
    state, _ = build_desired_state(
        {"apt": {"cuda_repo_url": "http://mirror.example/cuda/debian12/x86_64/"}}
    )
    cuda = nvidia_repositories_for(state)[0]
    assert cuda.render_sources().splitlines()[1:] == [
        "Types: deb",
        "URIs: http://mirror.example/cuda/debian12/x86_64/",
        "Suites: /",
        "Signed-By: /usr/share/keyrings/gpunode-nvidia-cuda.gpg",
    ]

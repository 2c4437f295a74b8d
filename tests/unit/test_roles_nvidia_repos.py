"""Which NVIDIA repositories a node gets, and how their sources are written."""

from __future__ import annotations

from gpunode.model import build_desired_state
from roles.nvidia_repos import nvidia_repositories_for


def needed(data: dict) -> dict[str, bool]:
    state, problems = build_desired_state(data)
    assert problems == []
    return {repo.name: repo.needed for repo in nvidia_repositories_for(state)}


def test_nothing_declared_needs_no_nvidia_repository() -> None:
    assert needed({}) == {
        "nvidia-cuda": False,
        "nvidia-container-toolkit": False,
        "ubuntu-graphics-drivers-ppa": False,
    }


def test_debian_driver_alone_needs_no_nvidia_repository() -> None:
    assert needed({"nvidia_driver": {"source": "debian"}})["nvidia-cuda"] is False


def test_what_needs_the_cuda_repository() -> None:
    assert needed({"nvidia_driver": {"source": "nvidia", "branch": "550"}})["nvidia-cuda"]
    assert needed({"cuda": {"versions": ["12.4"]}})["nvidia-cuda"]
    assert needed({"dcgm": {"enabled": True, "cuda_major": 12}})["nvidia-cuda"]


def test_fabric_manager_comes_from_its_drivers_source() -> None:
    nvswitch = {"expected_hardware": {"nvswitch": True}}
    nvidia = {"source": "nvidia", "branch": "580"}
    assert needed({"nvidia_driver": nvidia, **nvswitch})["nvidia-cuda"]
    # Ubuntu's archive has Fabric Manager: NVIDIA's repository is not needed for it...
    ubuntu = {"source": "ubuntu", "branch": "580", "version": "580.173.02-0ubuntu0.24.04.1"}
    assert not needed({"nvidia_driver": ubuntu, **nvswitch})["nvidia-cuda"]
    # ...but is for the NVLink Subnet Manager of a Blackwell NVSwitch system, only there.
    blackwell = {"expected_hardware": {"nvswitch": True, "gpu_model": "NVIDIA B200"}}
    assert needed({"nvidia_driver": ubuntu, **blackwell})["nvidia-cuda"]


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


PPA = "https://ppa.launchpadcontent.net/graphics-drivers/ppa/ubuntu"


def test_the_graphics_drivers_ppa_is_a_signed_by_source_of_the_node_s_release() -> None:
    data = {
        "nvidia_driver": {"source": "ubuntu", "branch": "580"},
        "apt": {"ubuntu_driver_ppa_url": PPA, "ubuntu_driver_ppa_keyring": "~/ppa.gpg"},
    }
    state, problems = build_desired_state(data)
    assert problems == []
    ppa = nvidia_repositories_for(state, "noble")[2]
    assert ppa.needed and ppa.keyring == "~/ppa.gpg"
    assert ppa.render_sources().splitlines()[1:] == [
        "Types: deb",
        f"URIs: {PPA}/",
        "Suites: noble",
        "Components: main",
        "Signed-By: /usr/share/keyrings/gpunode-ubuntu-graphics-drivers-ppa.gpg",
    ]
    assert ppa.release_file == f"{PPA}/dists/noble/InRelease"
    # NVIDIA's flat repositories keep their one file.
    assert nvidia_repositories_for(state, "noble")[0].release_file == (
        "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/{arch}/InRelease"
    )


def test_the_ppa_is_only_for_the_ubuntu_source() -> None:
    apt = {"ubuntu_driver_ppa_url": PPA}
    assert not needed({"apt": apt})["ubuntu-graphics-drivers-ppa"]
    with_nvidia = {"apt": apt, "nvidia_driver": {"source": "nvidia", "branch": "580"}}
    assert not needed(with_nvidia)["ubuntu-graphics-drivers-ppa"]
    assert not needed({"nvidia_driver": {"source": "ubuntu", "branch": "580"}})[
        "ubuntu-graphics-drivers-ppa"
    ]

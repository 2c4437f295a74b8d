"""The lab's signed apt repositories of stand-in NVIDIA packages, and the stand-in nvidia-ctk."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import re
import subprocess
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from lab import aptrepo
from lab.standin import (
    CDI_REFRESH_FROM,
    CONTAINER_TOOLKIT_VERSIONS,
    CUDA_REPO,
    DRIVER_VERSIONS,
    LIBNVIDIA_CONTAINER_REPO,
    StandinPackage,
    catalogue,
    nvidia_ctk,
)

from .conftest import BuiltRepository, gnupg_homes

# Packages every release of which the roles may pin, with the versions the repository must hold.
TOOLKIT_RELEASES = {"1.17.4-1", "1.17.8-1", "1.18.2-1", "1.20.1-1"}
EXPECTED_VERSIONS = {
    "nvidia-container-toolkit": TOOLKIT_RELEASES,
    "nvidia-container-toolkit-base": TOOLKIT_RELEASES,
    "libnvidia-container1": TOOLKIT_RELEASES,
    "libnvidia-container-tools": TOOLKIT_RELEASES,
    "cuda-drivers-550": {"550.127.08-1", "550.144.03-1"},
    "cuda-drivers-570": {"570.124.06-1", "570.195.03-1"},
    "cuda-drivers-580": {"580.95.05-1", "580.105.08-1"},
    "nvidia-fabricmanager-550": {"550.127.08-1", "550.144.03-1"},
    "nvidia-fabricmanager-570": {"570.124.06-1", "570.195.03-1"},
    "nvidia-fabricmanager": {"580.95.05-1", "580.105.08-1", "595.71.05-1", "595.91.07-1"},
    "libnvidia-nscq": {"580.95.05-1", "580.105.08-1", "595.71.05-1", "595.91.07-1"},
    "nvidia-imex": {"580.95.05-1", "580.105.08-1", "595.71.05-1", "595.91.07-1"},
    "nvidia-driver-pinning-580": {"580.95.05-1", "580.105.08-1"},
    "nvidia-driver-pinning-595": {"595.71.05-1", "595.91.07-1"},
    "nvlsm": {"2025.10.12-1", "2025.10.14-1"},
    "datacenter-gpu-manager": {"1:3.3.8", "1:3.3.9"},
    "datacenter-gpu-manager-4-core": {"1:4.5.3-1", "1:4.6.0-1"},
    "datacenter-gpu-manager-4-cuda12": {"1:4.5.3-1", "1:4.6.0-1"},
    "datacenter-gpu-manager-4-cuda13": {"1:4.5.3-1", "1:4.6.0-1"},
    "datacenter-gpu-manager-exporter": {"4.8.2-1", "4.8.3-1"},
    "cuda-toolkit-12-4": {"12.4.0-1", "12.4.1-1"},
    "cuda-toolkit-12-8": {"12.8.0-1", "12.8.1-1"},
    "cuda-toolkit-12-9": {"12.9.1-1"},
    "cuda-toolkit-13-0": {"13.0.2-1"},
    "cuda-toolkit-13-1": {"13.1.1-1"},
    "libnccl2": {"2.21.5-1+cuda12.4", "2.25.1-1+cuda12.8", "2.26.2-1+cuda12.8"},
    "libnccl-dev": {"2.21.5-1+cuda12.4", "2.25.1-1+cuda12.8", "2.26.2-1+cuda12.8"},
}
# No branch-suffixed packages from the 590 era on (Fabric Manager's: from 580 on).
NEVER_OFFERED = ("cuda-drivers-595", "nvidia-open-595", "nvidia-fabricmanager-580",
                 "nvidia-fabricmanager-595", "libnvidia-nscq-580", "libnvidia-nscq-595",
                 "cuda-drivers-fabricmanager-580", "cuda-drivers-fabricmanager-595")  # fmt: skip
DRIVER_PACKAGES = (
    "cuda-drivers", "nvidia-open", "nvidia-driver", "nvidia-driver-cuda", "nvidia-kernel-dkms",
    "nvidia-kernel-open-dkms", "libnvidia-ml1", "libcuda1", "nvidia-smi", "nvidia-persistenced",
    "nvidia-modprobe", "cuda-drivers-fabricmanager",
)  # fmt: skip
DEBIAN_BASE_PACKAGES = {"libc6", "libseccomp2"}  # on every lab node already


Built = BuiltRepository


@pytest.fixture(scope="module")
def built(built_repository: BuiltRepository) -> Built:
    """The unit tier's one build of the default repositories (tests/unit/conftest.py)."""
    return built_repository


def _run(*command: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, check=False, **kwargs
    )  # type: ignore[call-overload]


def _stanzas(text: str) -> list[dict[str, str]]:
    stanzas = []
    for block in text.strip().split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line[:1] not in (" ", "\t") and ":" in line:
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        stanzas.append(fields)
    return stanzas


def _index(repo: aptrepo.RepoInfo, repository: aptrepo.Repository) -> list[dict[str, str]]:
    return _stanzas((repo.directory / repository.path / "Packages").read_text())


@pytest.fixture
def gpg_home(tmp_path: Path) -> Iterator[dict[str, str]]:
    """An empty GNUPGHOME so gpg and gpgv never touch the user's own."""
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}
    yield env
    _run("gpgconf", "--kill", "all", env=env)


# --- the packages ------------------------------------------------------------------------------


def test_every_package_is_a_valid_deb_with_its_name_version_and_dependencies(built: Built):
    refs = {(ref.name, ref.version): ref for ref in built.repo.packages}
    for package in catalogue():
        deb = built.repo.directory / refs[(package.name, package.version)].filename
        info = _run("dpkg-deb", "--info", deb)
        assert info.returncode == 0, info.stderr
        fields = _stanzas(_run("dpkg-deb", "--field", deb).stdout)[0]
        assert fields["Package"] == package.name
        assert fields["Version"] == package.version
        assert fields.get("Depends", "") == ", ".join(package.depends)
        assert fields.get("Recommends", "") == ", ".join(package.recommends)
        assert fields.get("Provides", "") == ", ".join(package.provides)


def test_each_repository_holds_two_or_more_releases_of_every_pinnable_package(built: Built):
    versions: dict[str, set[str]] = {}
    for repository in aptrepo.REPOSITORIES:
        for stanza in _index(built.repo, repository):
            versions.setdefault(stanza["Package"], set()).add(stanza["Version"])
    for name, expected in EXPECTED_VERSIONS.items():
        assert versions.get(name) == expected, name
    for name in DRIVER_PACKAGES:
        assert versions[name] == {f"{version}-1" for version in DRIVER_VERSIONS}, name
    assert versions["cuda"] == {
        "12.4.0-1", "12.4.1-1", "12.8.0-1", "12.8.1-1", "12.9.1-1", "13.0.2-1", "13.1.1-1"
    }  # fmt: skip
    assert not set(NEVER_OFFERED) & set(versions)


def test_the_debian13_repository_holds_the_same_signed_packages(built: Built):
    debian12 = aptrepo.CUDA_REPOSITORIES["debian12"]
    debian13 = aptrepo.CUDA_REPOSITORIES["debian13"]
    assert debian13.path == "cuda/debian13/x86_64"
    assert _index(built.repo, debian13) == _index(built.repo, debian12)
    assert "Codename" not in _stanzas((built.repo.cuda_dir_for("debian13") / "Release").read_text())
    keys = {path.name: path.read_text() for path in built.repo.cuda_dir.glob("*.pub")}
    assert len(keys) == 1
    assert keys == {
        p.name: p.read_text() for p in built.repo.cuda_dir_for("debian13").glob("*.pub")
    }
    assert built.repo.sources("http://10.213.6.1:8089", distribution="debian13") == {
        "cuda-debian13-x86_64.list": "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
        "http://10.213.6.1:8089/cuda/debian13/x86_64/ /\n",
        "nvidia-container-toolkit.list": "deb [signed-by=/usr/share/keyrings/"
        "nvidia-container-toolkit-keyring.gpg] "
        "http://10.213.6.1:8089/libnvidia-container/stable/deb/amd64/ /\n",
    }


def test_the_ubuntu2404_repository_holds_the_debian_trees_packages_but_the_driver(built: Built):
    """NVIDIA's Ubuntu tree names its driver packages as Ubuntu does: the stand-in's Ubuntu
    tree has the toolkits, DCGM, NCCL and nvlsm of the Debian trees, the same files, and no
    driver package (an Ubuntu lab node's driver is the stand-in Ubuntu archive's)."""
    debian12 = aptrepo.CUDA_REPOSITORIES["debian12"]
    noble = aptrepo.CUDA_REPOSITORIES["ubuntu2404"]
    assert noble.path == "cuda/ubuntu2404/x86_64"
    debian_index = {
        stanza["Package"] + "=" + stanza["Version"]: stanza
        for stanza in _index(built.repo, debian12)
    }
    noble_index = {
        stanza["Package"] + "=" + stanza["Version"]: stanza for stanza in _index(built.repo, noble)
    }
    assert noble_index and set(noble_index) < set(debian_index)
    for key, stanza in noble_index.items():
        assert stanza["SHA256"] == debian_index[key]["SHA256"], key
    names = {stanza["Package"] for stanza in noble_index.values()}
    assert {"cuda-toolkit-12-8", "datacenter-gpu-manager-4-core", "libnccl2", "nvlsm"} <= names
    assert not names & {"nvidia-driver-cuda", "nvidia-kernel-open-dkms", "libcuda1",
                        "nvidia-open", "cuda-drivers", "nvidia-fabricmanager"}  # fmt: skip
    left_out = {stanza["Package"] for stanza in debian_index.values()} - names
    assert left_out == {p.name for p in catalogue() if p.family == "driver"}


def test_packages_sit_in_the_repository_that_publishes_them(built: Built):
    cuda, container = aptrepo.REPOSITORIES
    container_names = {stanza["Package"] for stanza in _index(built.repo, container)}
    cuda_names = {stanza["Package"] for stanza in _index(built.repo, cuda)}
    debian13 = aptrepo.CUDA_REPOSITORIES["debian13"]
    assert {stanza["Package"] for stanza in _index(built.repo, debian13)} == cuda_names
    assert container_names == {
        "nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container1",
        "libnvidia-container-tools",
    }  # fmt: skip
    assert not container_names & cuda_names
    assert {"cuda", "cuda-drivers", "nvidia-open", "datacenter-gpu-manager"} <= cuda_names


def test_the_index_describes_each_deb_with_a_flat_filename_and_its_checksum(built: Built):
    for repository in aptrepo.ALL_REPOSITORIES:
        repo_dir = built.repo.directory / repository.path
        stanzas = _index(built.repo, repository)
        assert len(stanzas) == len(list(repo_dir.glob("*.deb")))
        for stanza in stanzas:
            assert stanza["Filename"].startswith("./"), stanza["Filename"]
            data = (repo_dir / stanza["Filename"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == stanza["SHA256"]
            assert len(data) == int(stanza["Size"])
        packages = (repo_dir / "Packages").read_bytes()
        assert gzip.decompress((repo_dir / "Packages.gz").read_bytes()) == packages


def test_the_cuda_metapackage_pulls_the_driver_and_the_toolkits_do_not(built: Built):
    by_name: dict[str, list[StandinPackage]] = {}
    for package in catalogue():
        by_name.setdefault(package.name, []).append(package)

    def closure(name: str) -> set[str]:
        seen, todo = set(), [name]
        while todo:
            current = todo.pop()
            if current in seen or current not in by_name:
                continue
            seen.add(current)
            for package in by_name[current]:
                todo += [_dependency_names(dep)[0] for dep in package.depends]
        return seen

    assert "cuda-drivers" in closure("cuda")
    for toolkit in ("cuda-toolkit-12-4", "cuda-toolkit-12-8", "cuda-toolkit"):
        assert not {"cuda-drivers", "nvidia-driver", "libcuda1"} & closure(toolkit), toolkit


def _dependency_names(dependency: str) -> list[str]:
    return [alternative.split()[0] for alternative in dependency.split("|")]


def test_dependencies_name_only_catalogue_packages_or_what_every_lab_node_has():
    packages = catalogue()
    known = {p.name for p in packages} | {
        virtual.split()[0] for p in packages for virtual in p.provides
    }
    for package in packages:
        for dependency in (*package.depends, *package.recommends):
            names = set(_dependency_names(dependency))
            assert names & (known | DEBIAN_BASE_PACKAGES), f"{package.name}: {dependency}"


def test_maintainer_scripts_are_valid_shell():
    for package in catalogue():
        for script, text in package.scripts.items():
            result = _run("sh", "-n", input=text)
            assert result.returncode == 0, f"{package.name} {script}: {result.stderr}"


# The CUDA version each stand-in branch's driver reports ("CUDA Version" of nvidia-smi): CUDA
# Toolkit release notes, Table 3 (12.4 GA bundles 550.54.14, 12.8 GA 570.26, 13.0 GA 580.65.06,
# 13.2 GA 595.45.04; the next minor's GA needs the next branch).
REPORTED_CUDA = {"550": "12.4", "570": "12.8", "580": "13.0", "595": "13.2"}


def test_kernel_module_packages_record_the_version_and_flavour_they_install():
    for package in catalogue():
        if package.name not in ("nvidia-kernel-dkms", "nvidia-kernel-open-dkms"):
            continue
        flavour = "open" if "open" in package.name else "proprietary"
        postinst = package.scripts["postinst"]
        assert (
            f"echo {package.upstream_version} > /var/lib/gpunode-lab/installed-driver-version"
            in postinst
        )
        assert f"echo {flavour} > /var/lib/gpunode-lab/installed-kernel-module-flavour" in postinst
        # What nvidia-smi says after the reboot: the branch's CUDA version (its release notes).
        cuda = REPORTED_CUDA[package.upstream_version.split(".")[0]]
        assert f"echo {cuda} > /var/lib/gpunode-lab/installed-driver-cuda-version" in postinst
        assert "dkms" not in postinst.replace("nvidia-kernel", "")


@pytest.mark.parametrize(
    ("deb", "command", "expected"),
    [
        ("cuda-nvcc-12-4_12.4.131-1_amd64.deb", ["usr/local/cuda-12.4/bin/nvcc", "--version"],
         "Cuda compilation tools, release 12.4, V12.4.131\n"),
        ("cuda-nvcc-12-8_12.8.93-1_amd64.deb", ["usr/local/cuda-12.8/bin/nvcc", "--version"],
         "Cuda compilation tools, release 12.8, V12.8.93\n"),
        ("nvidia-persistenced_570.124.06-1_amd64.deb", ["usr/bin/nvidia-persistenced", "--version"],
         "nvidia-persistenced:  version 570.124.06\n"),
        ("nvidia-fabricmanager-550_550.144.03-1_amd64.deb", ["usr/bin/nv-fabricmanager", "-v"],
         "Fabric Manager version is : 550.144.03\n"),
        ("datacenter-gpu-manager_3.3.8_amd64.deb", ["usr/bin/dcgmi", "--version"],
         "dcgmi  version: 3.3.8\n"),
        ("nvidia-smi_550.127.08-1_amd64.deb", ["usr/bin/nvidia-smi"],
         "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."),
        ("cuda-nvcc-12-9_12.9.86-1_amd64.deb", ["usr/local/cuda-12.9/bin/nvcc", "--version"],
         "Built on Tue_May_27_02:21:03_PDT_2025\nCuda compilation tools, release 12.9, V12.9.86\n"),
        ("cuda-nvcc-13-0_13.0.88-1_amd64.deb", ["usr/local/cuda-13.0/bin/nvcc", "--version"],
         "release 13.0, V13.0.88\nBuild cuda_13.0.r13.0/compiler.36424714_0"),
        ("cuda-nvcc-13-1_13.1.115-1_amd64.deb", ["usr/local/cuda-13.1/bin/nvcc", "--version"],
         "Cuda compilation tools, release 13.1, V13.1.115\n"),
        ("nvidia-fabricmanager_595.91.07-1_amd64.deb", ["usr/bin/nv-fabricmanager", "-v"],
         "Fabric Manager version is : 595.91.07\n"),
        ("nvidia-imex_580.105.08-1_amd64.deb", ["usr/bin/nvidia-imex", "--version"],
         "IMEX version is: 580.105.08\n"),
        ("nvidia-imex_580.105.08-1_amd64.deb", ["usr/bin/nvidia-imex-ctl", "--version"],
         "IMEX version is: 580.105.08\n"),
        ("datacenter-gpu-manager-4-core_4.6.0-1_amd64.deb", ["usr/bin/dcgmi", "--version"],
         "dcgmi  version: 4.6.0\n"),
        ("datacenter-gpu-manager-exporter_4.8.2-1_amd64.deb", ["usr/bin/dcgm-exporter",
         "--version"], "dcgm-exporter version 4.8.2"),
    ],
)  # fmt: skip
def test_packaged_stand_in_programs_answer_like_the_real_ones(
    built: Built, tmp_path: Path, deb: str, command: list[str], expected: str
):
    extracted = _run("dpkg-deb", "-x", built.repo.cuda_dir / deb, tmp_path)
    assert extracted.returncode == 0, extracted.stderr
    result = _run(tmp_path / command[0], *command[1:])
    assert expected in result.stdout
    assert result.returncode == (9 if "nvidia-smi" in deb else 0)


def test_cuda_runtime_needs_each_releases_own_driver():
    runtime = {p.name: p for p in catalogue() if p.name.startswith("cuda-runtime-1")}
    assert runtime["cuda-runtime-12-9"].depends[-1] == "cuda-drivers (>= 575.57.08)"
    assert runtime["cuda-runtime-13-0"].depends[-1] == "cuda-drivers (>= 580.95.05)"
    assert runtime["cuda-runtime-13-1"].depends[-1] == "cuda-drivers (>= 590.48.01)"


def test_the_pinning_package_pins_its_branch_at_priority_1000(built: Built, tmp_path: Path):
    deb = built.repo.cuda_dir / "nvidia-driver-pinning-595_595.91.07-1_all.deb"
    assert _run("dpkg-deb", "-x", deb, tmp_path).returncode == 0
    preferences = (tmp_path / "etc/apt/preferences.d/nvidia-driver-pinning-595").read_text()
    assert "\nPin: version 595.*\nPin-Priority: 1000\n" in preferences
    fields = _stanzas(_run("dpkg-deb", "--field", deb).stdout)[0]
    assert (
        fields["Provides"] == fields["Conflicts"] == fields["Replaces"] == "nvidia-driver-pinning"
    )


@pytest.mark.parametrize("version", CONTAINER_TOOLKIT_VERSIONS)
def test_only_toolkits_from_1_18_ship_and_enable_the_cdi_refresh_units(
    built: Built, tmp_path: Path, version: str
):
    deb = built.repo.container_dir / f"nvidia-container-toolkit-base_{version}_amd64.deb"
    assert _run("dpkg-deb", "-x", deb, tmp_path).returncode == 0
    units = sorted(p.name for p in (tmp_path / "lib/systemd/system").glob("*")) if (
        tmp_path / "lib/systemd/system").is_dir() else []  # fmt: skip
    control = tmp_path / "control"
    assert _run("dpkg-deb", "-e", deb, control).returncode == 0
    postinst = (control / "postinst").read_text()
    if version.startswith("1.17."):
        assert units == []
        assert "nvidia-cdi-refresh" not in postinst
    else:
        assert units == ["nvidia-cdi-refresh.path", "nvidia-cdi-refresh.service"]
        service = (tmp_path / "lib/systemd/system/nvidia-cdi-refresh.service").read_text()
        assert "Environment=NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=/var/run/cdi/nvidia.yaml\n" in service
        assert "ExecStart=/usr/bin/nvidia-ctk cdi generate\n" in service
        assert "systemctl enable --now nvidia-cdi-refresh.path" in postinst
        assert "systemctl enable --now nvidia-cdi-refresh.service" in postinst


@pytest.mark.parametrize("version", CONTAINER_TOOLKIT_VERSIONS)
def test_the_packaged_nvidia_ctk_reports_its_release(built: Built, tmp_path: Path, version: str):
    deb = built.repo.container_dir / f"nvidia-container-toolkit-base_{version}_amd64.deb"
    assert _run("dpkg-deb", "-x", deb, tmp_path).returncode == 0
    result = _run(tmp_path / "usr/bin/nvidia-ctk", "--version")
    upstream = version.removesuffix("-1")
    assert result.stdout.startswith(f"NVIDIA Container Toolkit CLI version {upstream}\ncommit: ")
    # The wrapper answers --version itself; the stand-in behind it says the same.
    behind = _run(tmp_path / "usr/bin/nvidia-ctk", "--quiet", "--version")
    assert behind.returncode == 0 and behind.stdout == result.stdout


# --- signatures and keys -------------------------------------------------------------------


def test_release_files_verify_with_gpgv_against_their_own_keyring_only(
    built: Built, gpg_home: dict[str, str]
):
    keyrings = {
        CUDA_REPO: built.repo.cuda_keyring,
        LIBNVIDIA_CONTAINER_REPO: built.repo.container_keyring,
    }
    for repository in aptrepo.ALL_REPOSITORIES:
        repo_dir = built.repo.directory / repository.path
        own = keyrings[repository.name]
        other = next(path for name, path in keyrings.items() if name != repository.name)
        inline = _run("gpgv", "--keyring", own, repo_dir / "InRelease", env=gpg_home)
        assert inline.returncode == 0, inline.stderr
        assert built.repo.fingerprints[repository.name] in inline.stderr
        detached = _run("gpgv", "--keyring", own, repo_dir / "Release.gpg", repo_dir / "Release",
                        env=gpg_home)  # fmt: skip
        assert detached.returncode == 0, detached.stderr
        assert (
            _run("gpgv", "--keyring", other, repo_dir / "InRelease", env=gpg_home).returncode != 0
        )


def test_inrelease_signs_the_release_that_lists_the_indexes(built: Built):
    for repository in aptrepo.ALL_REPOSITORIES:
        repo_dir = built.repo.directory / repository.path
        release = (repo_dir / "Release").read_text()
        inrelease = (repo_dir / "InRelease").read_text()
        signed = inrelease.split("\n\n", 1)[1].split("-----BEGIN PGP SIGNATURE-----")[0]
        assert signed == release
        fields = _stanzas(release)[0]
        assert fields["Origin"] == "NVIDIA"
        assert fields["Label"] == repository.label
        for name in ("Packages", "Packages.gz"):
            digest = hashlib.sha256((repo_dir / name).read_bytes()).hexdigest()
            assert re.search(rf"^ {digest} +\d+ {re.escape(name)}$", release, re.M), name


def test_a_tampered_release_fails_verification(
    built: Built, tmp_path: Path, gpg_home: dict[str, str]
):
    repo_dir = built.repo.cuda_dir
    tampered = tmp_path / "Release"
    tampered.write_text((repo_dir / "Release").read_text().replace("NVIDIA CUDA", "NVIDIA CUDX"))
    result = _run("gpgv", "--keyring", built.repo.cuda_keyring, repo_dir / "Release.gpg",
                  tampered, env=gpg_home)  # fmt: skip
    assert result.returncode != 0
    assert "BAD signature" in result.stderr


def test_keyrings_are_binary_public_keys_and_the_armored_keys_are_served_beside_them(
    built: Built, gpg_home: dict[str, str]
):
    for keyring in (built.repo.cuda_keyring, built.repo.container_keyring):
        data = keyring.read_bytes()
        assert not data.startswith(b"-----BEGIN"), "signed-by= keyrings are binary"
        packets = _run("gpg", "--list-packets", keyring, env=gpg_home).stdout
        assert ":public key packet:" in packets
        assert "secret" not in packets
    cuda_key = built.repo.fingerprints[CUDA_REPO][-8:].lower()
    armored = [built.repo.cuda_dir / f"{cuda_key}.pub",
               built.repo.directory / "libnvidia-container" / "gpgkey"]  # fmt: skip
    for path in armored:
        assert path.read_text().startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")


def test_no_private_key_material_is_left_anywhere_after_the_build(
    built: Built, gpg_home: dict[str, str]
):
    for path in built.repo.directory.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert b"PRIVATE KEY" not in data, path
            if path.suffix in (".gpg", ".pub") or path.name in ("gpgkey", "InRelease"):
                packets = _run("gpg", "--list-packets", path, env=gpg_home).stdout
                assert "secret key packet" not in packets, path
    assert gnupg_homes() <= built.gnupg_homes_before, "temporary GNUPGHOME left behind"
    agents = [
        cmdline.read_bytes()
        for cmdline in Path("/proc").glob("[0-9]*/cmdline")
        if cmdline.exists() and aptrepo.GNUPG_PREFIX.encode() in _read_quietly(cmdline)
    ]
    assert agents == [], "a gpg-agent of the build is still running"


def _read_quietly(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


# --- cache ---------------------------------------------------------------------------------


def test_an_unchanged_build_is_reused(built: Built):
    inrelease = built.repo.cuda_dir / "InRelease"
    before = inrelease.stat().st_mtime_ns
    again = aptrepo.build_repository(built.repo.directory)
    assert not again.rebuilt
    assert again.fingerprints == built.repo.fingerprints
    assert again.content_hash == built.repo.content_hash
    assert inrelease.stat().st_mtime_ns == before


def _container_packages() -> list[StandinPackage]:
    return [p for p in catalogue() if p.repository == LIBNVIDIA_CONTAINER_REPO]


def test_changed_definitions_are_rebuilt_and_replace_the_old_build(tmp_path: Path):
    first = aptrepo.build_repository(tmp_path, _container_packages())
    assert first.rebuilt
    changed = [
        dataclasses.replace(p, version="1.17.9-1") if p.version == "1.17.8-1" else p
        for p in _container_packages()
    ]
    second = aptrepo.build_repository(tmp_path, changed)
    assert second.rebuilt
    assert second.content_hash != first.content_hash
    assert second.fingerprints != first.fingerprints  # a fresh throw-away key per build
    index = (second.container_dir / "Packages").read_text()
    assert "Version: 1.17.9-1" in index
    assert "Version: 1.17.8-1" not in index
    assert not list(second.container_dir.glob("*1.17.8-1*"))
    assert not list(tmp_path.glob(".staging-*"))


def test_a_build_with_missing_files_is_rebuilt(tmp_path: Path):
    first = aptrepo.build_repository(tmp_path, _container_packages())
    (first.container_dir / "InRelease").unlink()
    second = aptrepo.build_repository(tmp_path, _container_packages())
    assert second.rebuilt
    assert (second.container_dir / "InRelease").is_file()


def test_sources_point_signed_by_at_each_repository_keyring(built: Built):
    sources = built.repo.sources("http://10.213.6.1:8089")
    assert sources == {
        "cuda-debian12-x86_64.list": "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
        "http://10.213.6.1:8089/cuda/debian12/x86_64/ /\n",
        "nvidia-container-toolkit.list": "deb [signed-by=/usr/share/keyrings/"
        "nvidia-container-toolkit-keyring.gpg] "
        "http://10.213.6.1:8089/libnvidia-container/stable/deb/amd64/ /\n",
    }


# --- serving -------------------------------------------------------------------------------


def test_the_server_serves_the_repository_and_logs_every_request(built: Built, tmp_path: Path):
    log = tmp_path / "requests.log"
    with aptrepo.serve(built.repo.directory, "127.0.0.1", 0, log_path=log) as server:
        assert server.cuda_url == f"http://127.0.0.1:{server.port}/cuda/debian12/x86_64"
        assert server.cuda_url_for("debian12") == server.cuda_url
        assert server.cuda_url_for("debian13") == (
            f"http://127.0.0.1:{server.port}/cuda/debian13/x86_64"
        )
        with pytest.raises(aptrepo.AptRepoError, match="debian11"):
            server.cuda_url_for("debian11")
        with urllib.request.urlopen(f"{server.container_url}/InRelease", timeout=10) as reply:
            assert reply.read() == (built.repo.container_dir / "InRelease").read_bytes()
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{server.cuda_url}/no-such.deb", timeout=10)
        assert missing.value.code == 404
        assert server.requested_paths() == [
            "/libnvidia-container/stable/deb/amd64/InRelease",
            "/cuda/debian12/x86_64/no-such.deb",
        ]
    logged = [line.split()[2:] for line in log.read_text().splitlines()]
    assert logged == [
        ["GET", "/libnvidia-container/stable/deb/amd64/InRelease", "200"],
        ["GET", "/cuda/debian12/x86_64/no-such.deb", "404"],
    ]
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{server.cuda_url}/InRelease", timeout=5)


def test_requests_are_logged_beside_the_served_tree_by_default(built: Built):
    directory = built.repo.directory
    with aptrepo.serve(directory, "127.0.0.1", 0) as server:
        assert aptrepo.repository_urls(server.base_url) == {
            CUDA_REPO: server.cuda_url,
            LIBNVIDIA_CONTAINER_REPO: server.container_url,
        }
        urllib.request.urlopen(f"{server.cuda_url}/Release", timeout=10).close()
    log = directory.parent / f"{directory.name}-requests.log"
    assert log.read_text().split()[2:] == ["GET", "/cuda/debian12/x86_64/Release", "200"]
    assert not (directory / f"{directory.name}-requests.log").exists()


def test_serving_an_unbuilt_directory_says_what_to_do(tmp_path: Path):
    with pytest.raises(aptrepo.AptRepoError, match="build_repository"):
        aptrepo.serve(tmp_path, "127.0.0.1", 0)


# --- the stand-in nvidia-ctk ---------------------------------------------------------------


def ctk(*arguments: str) -> int:
    return nvidia_ctk.main(list(arguments))


DAEMON_JSON = {
    "data-root": "/srv/docker",
    "log-driver": "journald",
    "registry-mirrors": ["https://mirror.example"],
    "runtimes": {"crun": {"path": "/usr/bin/crun"}},
}


def test_docker_configure_merges_the_nvidia_runtime_keeping_every_other_key(tmp_path: Path):
    config = tmp_path / "daemon.json"
    config.write_text(json.dumps(DAEMON_JSON))
    assert ctk("runtime", "configure", "--runtime=docker", f"--config={config}") == 0
    merged = json.loads(config.read_text())
    expected = json.loads(json.dumps(DAEMON_JSON))
    expected["runtimes"]["nvidia"] = {"args": [], "path": "nvidia-container-runtime"}
    assert merged == expected
    assert config.read_text() == json.dumps(expected, indent=4, sort_keys=True)
    text = config.read_text()
    assert ctk("runtime", "configure", "--runtime", "docker", "--config", str(config)) == 0
    assert config.read_text() == text, "a second run changes nothing"


def test_docker_configure_sets_the_default_runtime_only_when_asked(tmp_path: Path):
    config = tmp_path / "daemon.json"
    assert ctk("runtime", "configure", f"--config={config}", "--set-as-default=false") == 0
    assert json.loads(config.read_text()) == {
        "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}
    }
    assert ctk("runtime", "configure", f"--config={config}", "--set-as-default") == 0
    assert json.loads(config.read_text())["default-runtime"] == "nvidia"


def test_docker_configure_leaves_a_broken_file_alone(tmp_path: Path):
    config = tmp_path / "daemon.json"
    config.write_text('{"log-driver": ')
    assert ctk("runtime", "configure", f"--config={config}") == 1
    assert config.read_text() == '{"log-driver": '


def test_dry_run_prints_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    config = tmp_path / "daemon.json"
    assert ctk("runtime", "configure", f"--config={config}", "--dry-run") == 0
    assert not config.exists()
    assert json.loads(capsys.readouterr().out)["runtimes"]["nvidia"]["path"] == (
        "nvidia-container-runtime"
    )


CONTAINERD_CONFIG = """\
# containerd configuration written by hand; this comment must survive
version = 2
root = "/var/lib/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.9"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
"""
CRI = ["plugins", "io.containerd.grpc.v1.cri"]


def _lookup(tree: dict, path: list[str]) -> object:
    for key in path:
        tree = tree[key]
    return tree


def test_containerd_configure_adds_the_runtime_with_runc_settings_and_keeps_the_rest(
    tmp_path: Path,
):
    config = tmp_path / "config.toml"
    config.write_text(CONTAINERD_CONFIG)
    assert ctk("runtime", "configure", "--runtime=containerd", f"--config={config}") == 0
    text = config.read_text()
    merged = tomllib.loads(text)
    original = tomllib.loads(CONTAINERD_CONFIG)
    nvidia = _lookup(merged, [*CRI, "containerd", "runtimes", "nvidia"])
    assert nvidia == {
        "runtime_type": "io.containerd.runc.v2",
        "options": {"SystemdCgroup": True, "BinaryName": "/usr/bin/nvidia-container-runtime"},
    }
    del merged["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["nvidia"]
    assert merged == original, "nothing else changed"
    assert text.startswith(CONTAINERD_CONFIG.split("\n\n")[0])
    assert ctk("runtime", "configure", "--runtime=containerd", f"--config={config}") == 0
    assert config.read_text() == text, "a second run changes nothing"
    assert ctk("runtime", "configure", "--runtime=containerd", f"--config={config}",
               "--set-as-default") == 0  # fmt: skip
    assert (
        _lookup(tomllib.loads(config.read_text()), [*CRI, "containerd"])["default_runtime_name"]
        == "nvidia"
    )  # type: ignore[index]


def test_containerd_configure_writes_a_version_2_config_from_nothing(tmp_path: Path):
    config = tmp_path / "containerd" / "config.toml"
    assert ctk("runtime", "configure", "--runtime=containerd", f"--config={config}") == 0
    merged = tomllib.loads(config.read_text())
    assert merged["version"] == 2
    nvidia = _lookup(merged, [*CRI, "containerd", "runtimes", "nvidia"])
    assert nvidia["options"] == {"BinaryName": "/usr/bin/nvidia-container-runtime"}  # type: ignore[index]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"  # type: ignore[index]


def test_containerd_version_3_configs_use_the_cri_runtime_plugin(tmp_path: Path):
    config = tmp_path / "config.toml"
    config.write_text(
        'version = 3\n\n[plugins."io.containerd.cri.v1.images"]\n  snapshotter = "overlayfs"\n'
    )
    assert ctk("runtime", "configure", "--runtime=containerd", f"--config={config}") == 0
    merged = tomllib.loads(config.read_text())
    assert merged["version"] == 3
    runtime = ["plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes", "nvidia"]
    assert (
        _lookup(merged, [*runtime, "options", "BinaryName"]) == "/usr/bin/nvidia-container-runtime"
    )
    assert merged["plugins"]["io.containerd.cri.v1.images"] == {"snapshotter": "overlayfs"}


def test_crio_configure_adds_the_runtime(tmp_path: Path):
    config = tmp_path / "crio.conf"
    config.write_text('[crio.runtime]\nlog_level = "info"\n')
    assert ctk("runtime", "configure", "--runtime=crio", f"--config={config}",
               "--set-as-default") == 0  # fmt: skip
    merged = tomllib.loads(config.read_text())
    assert merged["crio"]["runtime"]["log_level"] == "info"
    assert merged["crio"]["runtime"]["default_runtime"] == "nvidia"
    assert merged["crio"]["runtime"]["runtimes"]["nvidia"] == {
        "runtime_type": "oci", "runtime_path": "/usr/bin/nvidia-container-runtime",
    }  # fmt: skip


def test_an_unknown_runtime_is_an_error(tmp_path: Path):
    assert ctk("runtime", "configure", "--runtime=podman", f"--config={tmp_path / 'x'}") == 1


GPUS = (
    (0, "GPU-fd93a2ba-4632-0dec-412b-21d89b333308"),
    (1, "GPU-5cbee2ad-88ea-efd7-ea39-e8deadcdce14"),
)


@pytest.fixture
def fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An nvidia-smi on PATH that lists two GPUs of driver 550.127.08."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    listing = "\n".join(
        f"GPU {index}: NVIDIA H100 80GB HBM3 (UUID: {uuid})" for index, uuid in GPUS
    )
    script.write_text(
        f'#!/bin/sh\nif [ "$1" = -L ]; then printf "%s\\n" "{listing}"; else echo 550.127.08; fi\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return script


def test_cdi_generate_writes_a_spec_with_a_device_per_gpu(
    tmp_path: Path, fake_nvidia_smi: Path, capsys: pytest.CaptureFixture[str]
):
    output = tmp_path / "cdi" / "nvidia.yaml"
    assert ctk("cdi", "generate", f"--output={output}") == 0
    spec = yaml.safe_load(output.read_text())
    assert spec["kind"] == "nvidia.com/gpu"
    assert spec["cdiVersion"] == "0.5.0"
    devices = {
        device["name"]: device["containerEdits"]["deviceNodes"] for device in spec["devices"]
    }
    assert set(devices) == {"0", "1", "GPU-fd93a2ba-4632-0dec-412b-21d89b333308",
                            "GPU-5cbee2ad-88ea-efd7-ea39-e8deadcdce14", "all"}  # fmt: skip
    assert devices["1"] == [{"path": "/dev/nvidia1", "hostPath": "/dev/nvidia1"}]
    assert [node["path"] for node in devices["all"]] == ["/dev/nvidia0", "/dev/nvidia1"]
    mounts = [mount["hostPath"] for mount in spec["containerEdits"]["mounts"]]
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.550.127.08" in mounts
    capsys.readouterr()
    assert ctk("cdi", "list", f"--spec-dir={output.parent}") == 0
    assert capsys.readouterr().out.splitlines() == [
        "nvidia.com/gpu=0", "nvidia.com/gpu=GPU-fd93a2ba-4632-0dec-412b-21d89b333308",
        "nvidia.com/gpu=1", "nvidia.com/gpu=GPU-5cbee2ad-88ea-efd7-ea39-e8deadcdce14",
        "nvidia.com/gpu=all",
    ]  # fmt: skip


def test_cdi_generate_json_and_a_single_strategy(tmp_path: Path, fake_nvidia_smi: Path):
    output = tmp_path / "nvidia.json"
    assert ctk("cdi", "generate", f"--output={output}", "--device-name-strategy=uuid") == 0
    names = [device["name"] for device in json.loads(output.read_text())["devices"]]
    assert names == ["GPU-fd93a2ba-4632-0dec-412b-21d89b333308",
                     "GPU-5cbee2ad-88ea-efd7-ea39-e8deadcdce14", "all"]  # fmt: skip


@pytest.mark.parametrize(("release", "writes_file"), [("1.17.8", False), ("1.18.2", True)])
def test_only_refresh_era_releases_take_the_output_from_the_environment(
    tmp_path: Path,
    fake_nvidia_smi: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    release: str,
    writes_file: bool,
):
    # nvidia-cdi-refresh.service runs `nvidia-ctk cdi generate` with only this variable set.
    output = tmp_path / "run-cdi" / "nvidia.yaml"
    monkeypatch.setenv("NVIDIA_CTK_CDI_OUTPUT_FILE_PATH", str(output))
    monkeypatch.setattr(nvidia_ctk, "STANDIN_VERSION", release)
    assert ctk("cdi", "generate") == 0
    printed = capsys.readouterr().out
    assert output.exists() is writes_file
    spec_text = output.read_text() if writes_file else printed
    assert yaml.safe_load(spec_text)["kind"] == "nvidia.com/gpu"
    assert (printed == "") is writes_file


def test_the_ctk_and_the_data_agree_on_the_first_refresh_release():
    assert tuple(int(p) for p in CDI_REFRESH_FROM.split(".")) == nvidia_ctk.CDI_REFRESH_FROM
    assert nvidia_ctk.knows_cdi_refresh("1.18.0") and not nvidia_ctk.knows_cdi_refresh("1.17.8")


def test_cdi_generate_fails_without_a_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    output = tmp_path / "nvidia.yaml"
    assert ctk("cdi", "generate", f"--output={output}") == 1
    assert not output.exists()


def test_config_creates_the_default_runtime_config_and_sets_keys(tmp_path: Path):
    config = tmp_path / "nvidia-container-runtime" / "config.toml"
    # As the package's postinst runs it: global flag first, then the command.
    assert ctk("--quiet", "config", f"--config-file={config}", "--in-place") == 0
    assert tomllib.loads(config.read_text())["nvidia-container-cli"]["load-kmods"] is True
    assert "#no-cgroups = false" in config.read_text()
    assert ctk("config", f"--config-file={config}", "--in-place",
               "--set", "nvidia-container-cli.no-cgroups=true",
               "--set", "nvidia-container-runtime.log-level=debug") == 0  # fmt: skip
    parsed = tomllib.loads(config.read_text())
    assert parsed["nvidia-container-cli"]["no-cgroups"] is True
    assert parsed["nvidia-container-runtime"]["log-level"] == "debug"
    assert "#no-cgroups" not in config.read_text()
    before = config.stat().st_mtime_ns
    assert ctk("--quiet", "config", f"--config-file={config}", "--in-place") == 0
    assert config.stat().st_mtime_ns == before, "an unchanged config is not rewritten"


def test_version_and_usage_errors(capsys: pytest.CaptureFixture[str]):
    assert ctk("--version") == 0
    assert capsys.readouterr().out.startswith("NVIDIA Container Toolkit CLI version ")
    assert ctk("runtime", "configure", "--no-such-flag") == 1
    assert ctk() == 1


def test_toml_keys_parse_like_toml():
    assert nvidia_ctk.parse_key('plugins."io.containerd.grpc.v1.cri".containerd') == [
        "plugins", "io.containerd.grpc.v1.cri", "containerd",
    ]  # fmt: skip
    assert nvidia_ctk.parse_key("'a.b' . c") == ["a.b", "c"]
    assert nvidia_ctk.parse_key('"a", "b"') is None

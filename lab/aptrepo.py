"""A local, signed apt repository of stand-in NVIDIA packages, for lab nodes.

NVIDIA's repositories cannot be reached from the lab (as on an air-gapped site), so the lab host
serves its own copies of both: the stand-in packages of ``lab.standin`` (real names,
versions and dependencies; tiny contents), laid out and signed the way NVIDIA publishes them:

- ``cuda/debian12/x86_64/``: a flat repository like
  ``developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/`` (``Packages``,
  ``Packages.gz``, ``Release``, ``Release.gpg``, ``InRelease`` and the ``.deb`` files side by
  side), used as ``deb [signed-by=...] URL/cuda/debian12/x86_64/ /``; its armored public key is
  served beside them as ``<keyid>.pub``, as NVIDIA serves ``3bf863cc.pub``.
- ``cuda/debian13/x86_64/``: the same for Debian 13, with the same packages (no source seen says
  NVIDIA's Debian 13 packages differ) and signed with the same key, as NVIDIA signs both with
  one. ``REPOSITORIES`` (and ``sources()`` by default) are Debian 12's pair; the Debian 13 CUDA
  repository is ``CUDA_REPOSITORIES["debian13"]``, ``sources(..., distribution="debian13")``
  and ``server.cuda_url_for("debian13")``.
- ``libnvidia-container/stable/deb/amd64/``: the same for the Container Toolkit repository
  (``nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)``); its armored key is
  ``libnvidia-container/gpgkey``.
- ``ubuntu/``: the stand-in Ubuntu archive's own part, Ubuntu's NVIDIA driver packages
  (``lab.standin.ubuntu``) laid out as Ubuntu's archive is: ``dists/noble-updates/`` (its
  ``Release`` naming one component, ``restricted``) and ``pool/restricted/``, signed with a
  key of its own (``keyrings/gpunode-lab-ubuntu-standin-keyring.gpg``). Every other path under
  ``/ubuntu/`` is answered with a redirect to Debian's archive (``ubuntu_redirect``).

Each repository is signed with its own throw-away ed25519 key, made for the build in a temporary
``GNUPGHOME`` that is deleted (its gpg-agent stopped) once both are signed: no private key is
ever written under ``directory``. The public keys are exported as binary keyrings for
``signed-by=``: ``keyrings/cuda-archive-keyring.gpg`` and
``keyrings/nvidia-container-toolkit-keyring.gpg`` (the names NVIDIA's instructions use under
``/usr/share/keyrings``). The build needs ``dpkg-deb`` (dpkg), ``apt-ftparchive`` (apt-utils)
and ``gpg``/``gpgconf`` (gnupg); ``gpgv`` checks the signatures in the tests.

A build is reused while the package definitions (and this module) are unchanged: their content
hash is kept in ``repo.json``. Serving is a plain HTTP server in a background thread that logs
every request it answers, so tests can prove which URLs apt fetched.

Usage, from a test or from ``gpunode lab`` (the lab host is the bridge gateway, 10.213.N.1)::

    from lab import Lab, aptrepo

    lab = Lab()
    repo = aptrepo.build_repository(lab.state_dir / "aptrepo")     # seconds once, then cached
    with aptrepo.serve(repo.directory, lab.gateway, port=aptrepo.DEFAULT_PORT) as server:
        server.cuda_url            # http://10.213.N.1:8089/cuda/debian12/x86_64
        server.cuda_url_for("debian13")  # http://10.213.N.1:8089/cuda/debian13/x86_64
        server.container_url       # http://10.213.N.1:8089/libnvidia-container/stable/deb/amd64
        repo.sources(server.base_url)   # {file name in sources.list.d: one-line source}
        repo.cuda_keyring          # copy to the node's /usr/share/keyrings/
        ...                        # converge nodes; server.requested_paths() lists what apt got

A long-lived server (``gpunode lab``) keeps the handle and calls ``server.stop()`` when done,
or blocks in ``server.wait()``; code without the handle gets the URLs from
``repository_urls("http://10.213.N.1:8089")``. Port 0 picks a free port (``server.port``).
Requests are logged to ``<directory>-requests.log`` unless ``serve(log_path=...)`` says where.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from lab import DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR, UBUNTU_LAB_BASES, debian_subset
from lab.standin import (
    CUDA_REPO,
    CUDA_REPOSITORY_PATHS,
    LIBNVIDIA_CONTAINER_REPO,
    StandinPackage,
    catalogue,
    in_cuda_tree,
)
from lab.standin import ubuntu as ubuntu_standin

DEFAULT_PORT = 8089
BUILT_ARCHITECTURES = ("amd64",)  # world.toml lists sbsa paths too; only amd64 is built
DEFAULT_DISTRIBUTION = "debian12"
CUDA_PATH = CUDA_REPOSITORY_PATHS[DEFAULT_DISTRIBUTION]  # cuda/debian12/x86_64
CONTAINER_PATH = "libnvidia-container/stable/deb/amd64"
KEYRINGS_DIR = "keyrings"
CUDA_KEYRING = "cuda-archive-keyring.gpg"
CONTAINER_KEYRING = "nvidia-container-toolkit-keyring.gpg"
STATE_FILE = "repo.json"
GNUPG_PREFIX = "gpunode-aptrepo-gnupg-"
# The stand-in Ubuntu archive's own part: Ubuntu's NVIDIA driver and Fabric Manager packages
# (lab.standin.ubuntu) in one suite, restricted and multiverse, of an archive laid out as
# Ubuntu's (dists/, pool/<component>/), signed with
# the lab's own key, which an Ubuntu lab node trusts beside Debian's under Ubuntu's keyring
# name (Lab._trust_ubuntu_standin). Everything else under /ubuntu/ is Debian's (ubuntu_redirect).
UBUNTU_ARCHIVE = "ubuntu"
UBUNTU_SUITE = ubuntu_standin.SUITE  # noble-updates
UBUNTU_COMPONENTS = ubuntu_standin.components()  # multiverse, restricted
UBUNTU_SUITE_PATH = f"{UBUNTU_ARCHIVE}/dists/{UBUNTU_SUITE}"
UBUNTU_KEYRING = "gpunode-lab-ubuntu-standin-keyring.gpg"
UBUNTU_KEY_UID = "gpunode lab Ubuntu archive stand-in <ubuntu-archive@lists.ubuntu.com>"
# Every top-level entry a build owns; a rebuild replaces exactly these.
MANAGED_ENTRIES = ("cuda", "libnvidia-container", UBUNTU_ARCHIVE, KEYRINGS_DIR, STATE_FILE)
# Fixed timestamps inside the .debs: the same definitions give the same packages.
SOURCE_DATE_EPOCH = 1735689600  # 2025-01-01T00:00:00Z
REQUIRED_TOOLS = {
    "dpkg-deb": "dpkg",
    "apt-ftparchive": "apt-utils",
    "gpg": "gnupg",
    "gpgconf": "gnupg",
}


@dataclass(frozen=True)
class Repository:
    """One of the two apt repositories: where it lives and how it is signed."""

    name: str  # CUDA_REPO or LIBNVIDIA_CONTAINER_REPO
    path: str  # relative to the build directory and to the server's root URL
    origin: str
    label: str
    key_uid: str
    keyring: str  # file name under keyrings/
    sources_file: str  # the file name NVIDIA's instructions use in sources.list.d
    distribution: str = DEFAULT_DISTRIBUTION  # the release it is for (debian12, ubuntu2404)


def _cuda_repository(distribution: str) -> Repository:
    return Repository(
        name=CUDA_REPO,
        path=CUDA_REPOSITORY_PATHS[distribution],
        origin="NVIDIA",
        label="NVIDIA CUDA",
        key_uid="gpunode lab CUDA stand-in repository <cudatools@nvidia.com>",
        keyring=CUDA_KEYRING,
        sources_file=f"cuda-{distribution}-x86_64.list",
        distribution=distribution,
    )


# Debian release -> its CUDA repository (one package set, one key).
CUDA_REPOSITORIES = {name: _cuda_repository(name) for name in CUDA_REPOSITORY_PATHS}

# The Debian 12 pair: what a Debian 12 node's sources name.
REPOSITORIES = (
    CUDA_REPOSITORIES[DEFAULT_DISTRIBUTION],
    Repository(
        name=LIBNVIDIA_CONTAINER_REPO,
        path=CONTAINER_PATH,
        origin="NVIDIA",
        label="libnvidia-container",
        key_uid="gpunode lab libnvidia-container stand-in repository <cudatools@nvidia.com>",
        keyring=CONTAINER_KEYRING,
        sources_file="nvidia-container-toolkit.list",
    ),
)
# Every repository a build writes: the Debian 12 pair, then the other releases' CUDA ones.
ALL_REPOSITORIES = (
    *REPOSITORIES,
    *(r for name, r in CUDA_REPOSITORIES.items() if name != DEFAULT_DISTRIBUTION),
)


def repository_urls(base_url: str) -> dict[str, str]:
    """Repository name -> its URL under a server at ``base_url`` (e.g. http://10.213.N.1:8089),
    for Debian 12 (``cuda_repository_url`` gives another release's CUDA repository)."""
    return {
        repository.name: f"{base_url.rstrip('/')}/{repository.path}" for repository in REPOSITORIES
    }


def cuda_repository_url(base_url: str, distribution: str = DEFAULT_DISTRIBUTION) -> str:
    """The CUDA repository's URL for one Debian release (``debian12``, ``debian13``)."""
    if distribution not in CUDA_REPOSITORIES:
        known = ", ".join(CUDA_REPOSITORIES)
        raise AptRepoError(f"no CUDA repository for {distribution!r} (known: {known})")
    return f"{base_url.rstrip('/')}/{CUDA_REPOSITORIES[distribution].path}"


class AptRepoError(RuntimeError):
    """The repository could not be built or served; the message says what to do."""


@dataclass(frozen=True)
class PackageRef:
    name: str
    version: str
    repository: str
    filename: str  # relative to the build directory


@dataclass(frozen=True)
class RepoInfo:
    """A built repository pair: where everything is and what it holds."""

    directory: Path
    content_hash: str
    fingerprints: dict[str, str]  # repository name -> signing key fingerprint
    packages: tuple[PackageRef, ...]
    rebuilt: bool  # False when an unchanged earlier build was reused

    @property
    def cuda_dir(self) -> Path:
        return self.directory / CUDA_PATH

    def cuda_dir_for(self, distribution: str) -> Path:
        return self.directory / CUDA_REPOSITORIES[distribution].path

    @property
    def container_dir(self) -> Path:
        return self.directory / CONTAINER_PATH

    @property
    def cuda_keyring(self) -> Path:
        return self.directory / KEYRINGS_DIR / CUDA_KEYRING

    @property
    def container_keyring(self) -> Path:
        return self.directory / KEYRINGS_DIR / CONTAINER_KEYRING

    @property
    def ubuntu_keyring(self) -> Path:
        """The stand-in Ubuntu archive's signing key (binary keyring)."""
        return self.directory / KEYRINGS_DIR / UBUNTU_KEYRING

    def versions(self, name: str) -> list[str]:
        return [package.version for package in self.packages if package.name == name]

    def sources(
        self,
        base_url: str,
        keyring_dir: str = "/usr/share/keyrings",
        distribution: str = DEFAULT_DISTRIBUTION,
    ) -> dict[str, str]:
        """sources.list.d file name -> its one-line source, for a server at ``base_url``: the
        CUDA repository of ``distribution`` and the Container Toolkit's."""
        chosen = (CUDA_REPOSITORIES[distribution], *REPOSITORIES[1:])
        return {
            repository.sources_file: (
                f"deb [signed-by={keyring_dir}/{repository.keyring}] "
                f"{base_url.rstrip('/')}/{repository.path}/ /\n"
            )
            for repository in chosen
        }


# --- build ---------------------------------------------------------------------------------


def build_repository(
    directory: Path | str, packages: Sequence[StandinPackage] | None = None
) -> RepoInfo:
    """Build both signed repositories under ``directory`` (reused while nothing changed).

    ``packages`` defaults to the whole stand-in catalogue; tests may pass fewer.
    """
    directory = Path(directory)
    packages = list(catalogue() if packages is None else packages)
    _check_packages(packages)
    ubuntu_packages = ubuntu_standin.catalogue()
    content_hash = _content_hash([*packages, *ubuntu_packages])
    directory.mkdir(parents=True, exist_ok=True)
    # One build at a time per directory (a test session and `gpunode lab` may both ask).
    with open(directory / ".build.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        reused = _load_state(directory, content_hash)
        if reused is not None:
            return reused
        _check_tools()
        return _build(directory, packages, ubuntu_packages, content_hash)


def _build(
    directory: Path,
    packages: list[StandinPackage],
    ubuntu_packages: list[StandinPackage],
    content_hash: str,
) -> RepoInfo:
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=directory))
    try:
        _build_debs(staging, packages)
        for repository in ALL_REPOSITORIES:
            _write_indexes(staging / repository.path, repository)
        _build_ubuntu_archive(staging, ubuntu_packages)
        fingerprints = _sign(staging)
        refs = tuple(
            PackageRef(p.name, p.version, p.repository, f"{_repository(p).path}/{p.filename}")
            for p in packages
        ) + tuple(
            PackageRef(
                p.name, p.version, p.repository, f"{UBUNTU_ARCHIVE}/{ubuntu_pool(p)}/{p.filename}"
            )
            for p in ubuntu_packages
        )
        state = {
            "content_hash": content_hash,
            "fingerprints": fingerprints,
            "packages": [asdict(ref) for ref in refs],
        }
        (staging / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
        _replace_managed_entries(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return RepoInfo(directory, content_hash, fingerprints, refs, rebuilt=True)


def _repository(package: StandinPackage) -> Repository:
    return next(r for r in REPOSITORIES if r.name == package.repository)


def _check_packages(packages: Sequence[StandinPackage]) -> None:
    seen: set[tuple[str, str]] = set()
    for package in packages:
        if package.repository not in {r.name for r in REPOSITORIES}:
            raise AptRepoError(f"{package.name}: unknown repository {package.repository!r}")
        if (package.name, package.version) in seen:
            raise AptRepoError(f"{package.name} {package.version} is defined twice")
        seen.add((package.name, package.version))


def _check_tools() -> None:
    missing = sorted({pkg for tool, pkg in REQUIRED_TOOLS.items() if not shutil.which(tool)})
    if missing:
        raise AptRepoError(
            f"building the lab apt repository needs {', '.join(missing)}: "
            f"apt-get install {' '.join(missing)}"
        )


def _content_hash(packages: Sequence[StandinPackage]) -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for package in packages:
        digest.update(json.dumps(asdict(package), sort_keys=True).encode())
    return digest.hexdigest()


def _load_state(directory: Path, content_hash: str) -> RepoInfo | None:
    """The earlier build in ``directory`` if it has this hash and all its files; else None."""
    try:
        state = json.loads((directory / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if state.get("content_hash") != content_hash:
        return None
    refs = tuple(PackageRef(**raw) for raw in state["packages"])
    needed = [directory / ref.filename for ref in refs]
    for repository in ALL_REPOSITORIES:
        needed += [
            directory / repository.path / name
            for name in ("Packages", "Packages.gz", "Release", "Release.gpg", "InRelease")
        ]
        needed.append(directory / KEYRINGS_DIR / repository.keyring)
    needed += [
        directory / UBUNTU_SUITE_PATH / name for name in ("Release", "Release.gpg", "InRelease")
    ]
    needed.append(directory / KEYRINGS_DIR / UBUNTU_KEYRING)
    if not all(path.is_file() for path in needed):
        return None
    return RepoInfo(directory, content_hash, state["fingerprints"], refs, rebuilt=False)


def _replace_managed_entries(staging: Path, directory: Path) -> None:
    for entry in MANAGED_ENTRIES:
        target = directory / entry
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
        if (staging / entry).exists():
            os.replace(staging / entry, target)


def _build_debs(root: Path, packages: Sequence[StandinPackage]) -> None:
    for repository in ALL_REPOSITORIES:
        (root / repository.path).mkdir(parents=True)
    trees = root / ".trees"
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(lambda package: _build_deb(package, root, trees), packages))
    shutil.rmtree(trees)
    # The other releases' CUDA repositories hold the same .debs (hard links), less the
    # families a release's tree does not carry (the Ubuntu tree's driver: world.toml).
    default = _repository_dir(root, CUDA_REPO)
    for repository in ALL_REPOSITORIES[len(REPOSITORIES) :]:
        for package in packages:
            if in_cuda_tree(package, repository.distribution):
                os.link(default / package.filename, root / repository.path / package.filename)


def _repository_dir(root: Path, name: str) -> Path:
    return root / next(r for r in REPOSITORIES if r.name == name).path


def _build_ubuntu_archive(root: Path, packages: Sequence[StandinPackage]) -> None:
    """Ubuntu's driver packages as one suite of an Ubuntu-shaped archive, each in the pool of
    its component (``ubuntu/pool/restricted/...``) and that component's index
    (``ubuntu/dists/noble-updates/restricted/binary-amd64/Packages``), with the suite's
    unsigned Release (signed by ``_sign``)."""
    archive = root / UBUNTU_ARCHIVE
    trees = root / ".ubuntu-trees"

    def build(package: StandinPackage) -> None:
        pool = archive / ubuntu_pool(package)
        pool.mkdir(parents=True, exist_ok=True)
        _build_deb(package, root, trees, pool)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool_workers:
        list(pool_workers.map(build, packages))
    shutil.rmtree(trees, ignore_errors=True)
    suite = root / UBUNTU_SUITE_PATH
    for architecture in BUILT_ARCHITECTURES:
        for component in UBUNTU_COMPONENTS:
            binary = suite / component / f"binary-{architecture}"
            binary.mkdir(parents=True)
            index = _run(["apt-ftparchive", "packages", f"pool/{component}"], cwd=archive)
            (binary / "Packages").write_text(index)
            with gzip.GzipFile(binary / "Packages.gz", "wb", mtime=SOURCE_DATE_EPOCH) as out:
                out.write(index.encode())
    # What Ubuntu's own Release of the suite says (Origin, Label, Suite, Codename), for these
    # components.
    options = {
        "Origin": "Ubuntu",
        "Label": "Ubuntu",
        "Suite": UBUNTU_SUITE,
        "Codename": ubuntu_standin.CODENAME,
        "Components": " ".join(UBUNTU_COMPONENTS),
        "Architectures": " ".join(BUILT_ARCHITECTURES),
        "Description": "gpunode lab stand-in: Ubuntu's NVIDIA driver packages",
    }
    arguments = ["apt-ftparchive"]
    for field, value in options.items():
        arguments += ["-o", f"APT::FTPArchive::Release::{field}={value}"]
    (suite / "Release").write_text(_run([*arguments, "release", "."], cwd=suite))


def _build_deb(
    package: StandinPackage, root: Path, trees: Path, output_dir: Path | None = None
) -> None:
    tree = trees / f"{package.name}_{package.filename}"
    control_dir = tree / "DEBIAN"
    control_dir.mkdir(parents=True)
    (control_dir / "control").write_text(package.control())
    for script, text in package.scripts.items():
        path = control_dir / script
        path.write_text(text)
        path.chmod(0o755)
    for item in package.files:
        path = tree / item.path.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(item.content)
        path.chmod(item.mode)
    for path in tree.rglob("*"):
        os.utime(path, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False)
    output = (output_dir or root / _repository(package).path) / package.filename
    _run(
        ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(tree), str(output)],
        env={"SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)},
    )


def _write_indexes(repo_dir: Path, repository: Repository) -> None:
    """Packages, Packages.gz and an unsigned Release, as apt-ftparchive writes them."""
    packages = _run(["apt-ftparchive", "packages", "."], cwd=repo_dir)
    (repo_dir / "Packages").write_text(packages)
    with gzip.GzipFile(repo_dir / "Packages.gz", "wb", mtime=SOURCE_DATE_EPOCH) as compressed:
        compressed.write(packages.encode())
    options = {
        "Origin": repository.origin,
        "Label": repository.label,
        "Architectures": " ".join(BUILT_ARCHITECTURES),
        "Description": f"gpunode lab stand-in: {repository.label}",
    }
    arguments = ["apt-ftparchive"]
    for field, value in options.items():
        arguments += ["-o", f"APT::FTPArchive::Release::{field}={value}"]
    release = _run([*arguments, "release", "."], cwd=repo_dir)
    (repo_dir / "Release").write_text(release)


def _sign(root: Path) -> dict[str, str]:
    """Sign each repository with its own new key; export only the public halves."""
    home = Path(tempfile.mkdtemp(prefix=GNUPG_PREFIX))
    env = {"GNUPGHOME": str(home)}
    fingerprints = {}
    try:
        (root / KEYRINGS_DIR).mkdir()
        for repository in REPOSITORIES:  # one key per repository name
            _run(
                [
                    "gpg",
                    "--batch",
                    "--passphrase",
                    "",
                    "--quick-gen-key",
                    repository.key_uid,
                    "ed25519",
                    "sign",
                    "never",
                ],
                env=env,
            )
            fingerprint = _fingerprint(repository.key_uid, env)
            fingerprints[repository.name] = fingerprint
        for repository in ALL_REPOSITORIES:
            fingerprint = fingerprints[repository.name]
            repo_dir = root / repository.path
            gpg = [
                "gpg",
                "--batch",
                "--yes",
                "--local-user",
                fingerprint,
                "--digest-algo",
                "SHA512",
            ]
            _run(
                [*gpg, "--clearsign", "-o", str(repo_dir / "InRelease"), str(repo_dir / "Release")],
                env=env,
            )
            _run(
                [
                    *gpg,
                    "--armor",
                    "--detach-sign",
                    "-o",
                    str(repo_dir / "Release.gpg"),
                    str(repo_dir / "Release"),
                ],
                env=env,
            )
            (root / KEYRINGS_DIR / repository.keyring).write_bytes(
                _run_bytes(["gpg", "--batch", "--export", fingerprint], env=env)
            )  # the same key for every path of one name: rewritten identically
            armored = _run(["gpg", "--batch", "--armor", "--export", fingerprint], env=env)
            if repository.name == CUDA_REPO:
                (repo_dir / f"{fingerprint[-8:].lower()}.pub").write_text(armored)
            else:
                (repo_dir.parents[2] / "gpgkey").write_text(armored)
        if (root / UBUNTU_SUITE_PATH / "Release").is_file():
            fingerprints[UBUNTU_ARCHIVE] = _sign_ubuntu_suite(root, env)
    finally:
        # The private keys live only here: stop the agent that holds them, then delete.
        subprocess.run(
            ["gpgconf", "--kill", "all"],
            env={**os.environ, **env},
            capture_output=True,
            check=False,
        )
        shutil.rmtree(home, ignore_errors=True)
    return fingerprints


def _sign_ubuntu_suite(root: Path, env: dict[str, str]) -> str:
    """Sign the stand-in Ubuntu suite with a key of its own; export its public half."""
    new_key = ["--quick-gen-key", UBUNTU_KEY_UID, "ed25519", "sign", "never"]
    _run(["gpg", "--batch", "--passphrase", "", *new_key], env=env)
    fingerprint = _fingerprint(UBUNTU_KEY_UID, env)
    suite = root / UBUNTU_SUITE_PATH
    gpg = ["gpg", "--batch", "--yes", "--local-user", fingerprint, "--digest-algo", "SHA512"]
    _run([*gpg, "--clearsign", "-o", str(suite / "InRelease"), str(suite / "Release")], env=env)
    _run(
        [
            *gpg,
            "--armor",
            "--detach-sign",
            "-o",
            str(suite / "Release.gpg"),
            str(suite / "Release"),
        ],
        env=env,
    )
    (root / KEYRINGS_DIR / UBUNTU_KEYRING).write_bytes(
        _run_bytes(["gpg", "--batch", "--export", fingerprint], env=env)
    )
    return fingerprint


def _fingerprint(uid: str, env: dict[str, str]) -> str:
    listing = _run(["gpg", "--batch", "--with-colons", "--list-keys", f"={uid}"], env=env)
    for line in listing.splitlines():
        if line.startswith("fpr:"):
            return line.split(":")[9]
    raise AptRepoError(f"gpg made no key for {uid}")


def _run(command: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    return _run_bytes(command, cwd, env).decode()


def _run_bytes(
    command: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> bytes:
    result = subprocess.run(
        command, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, check=False
    )
    if result.returncode != 0:
        # Only gpg's, dpkg-deb's or apt-ftparchive's own words; no key material passes here.
        raise AptRepoError(
            f"{command[0]} failed ({result.returncode}): "
            f"{result.stderr.decode(errors='replace')[-2000:]}"
        )
    return result.stdout


# --- serve ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request the server answered."""

    time: str
    client: str
    method: str
    path: str
    status: int


class RepoServer:
    """A running HTTP server for a built repository; ``stop()`` ends it."""

    def __init__(self, directory: Path, bind_address: str, port: int, log_path: Path):
        self.directory = directory
        self.log_path = log_path
        self._requests: list[Request] = []
        self._lock = threading.Lock()
        handler = _handler_class(directory, self._record)
        try:
            self._server = http.server.ThreadingHTTPServer((bind_address, port), handler)
        except OSError as error:
            raise AptRepoError(
                f"cannot serve the lab apt repository on {bind_address}:{port}: {error}"
            ) from error
        self._server.daemon_threads = True
        self.bind_address = bind_address
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"aptrepo-{self.port}", daemon=True
        )
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://{self.bind_address}:{self.port}"

    @property
    def cuda_url(self) -> str:
        return repository_urls(self.base_url)[CUDA_REPO]

    def cuda_url_for(self, distribution: str) -> str:
        """The CUDA repository's URL for ``debian12`` or ``debian13``."""
        return cuda_repository_url(self.base_url, distribution)

    @property
    def container_url(self) -> str:
        return repository_urls(self.base_url)[LIBNVIDIA_CONTAINER_REPO]

    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    def requested_paths(self) -> list[str]:
        return [request.path for request in self.requests()]

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=10)
        self._server.server_close()

    def wait(self) -> None:
        """Block until the server stops (a foreground ``gpunode lab`` command)."""
        self._thread.join()

    def __enter__(self) -> RepoServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _record(self, request: Request) -> None:
        line = f"{request.time} {request.client} {request.method} {request.path} {request.status}\n"
        with self._lock:
            self._requests.append(request)
            with self.log_path.open("a", encoding="utf-8") as log:
                log.write(line)


def serve(
    directory: Path | str,
    bind_address: str,
    port: int = DEFAULT_PORT,
    log_path: Path | str | None = None,
) -> RepoServer:
    """Serve a built repository over HTTP from a background thread.

    Every request is appended to ``log_path`` (default: ``<directory>-requests.log``, beside
    the served tree) as ``TIME CLIENT METHOD PATH STATUS``.
    """
    directory = Path(directory)
    if not (directory / STATE_FILE).is_file():
        raise AptRepoError(f"{directory} holds no built repository: call build_repository first")
    default_log = directory.with_name(f"{directory.name}-requests.log")
    log = Path(log_path) if log_path is not None else default_log
    log.parent.mkdir(parents=True, exist_ok=True)
    log.touch()  # readers may measure the log before the first request
    return RepoServer(directory, bind_address, port, log)


# The lab's stand-in Ubuntu archive (an Ubuntu lab node's apt.ubuntu_mirror and
# apt.ubuntu_security_mirror: inventories/group_data/lab.py). Ubuntu's archive is unreachable
# from here, so a request for Ubuntu's suite is redirected to Debian's archive of the suite the
# lab node is built from (lab.UBUNTU_LAB_BASES): /ubuntu/dists/noble-updates/InRelease ->
# deb.debian.org/debian/dists/bookworm-updates/InRelease, /ubuntu/pool/... -> .../debian/pool/...
# apt follows the redirect (through the node's proxy, the lab's apt-cacher-ng) and verifies
# Debian's signature with the keys the lab node holds under Ubuntu's keyring name. What it
# serves is Debian's: Debian's components (main; apt skips restricted, universe and multiverse,
# which Debian's Release does not list) and Debian's Codename, which apt warns does not match.
UBUNTU_STANDIN_ARCHIVES = {"ubuntu": DEBIAN_MIRROR, "ubuntu-security": DEBIAN_SECURITY_MIRROR}


def ubuntu_redirect(path: str) -> str | None:
    """The Debian URL the stand-in Ubuntu archive answers ``path`` with, or None where
    ``path`` is not the stand-in's (a file of the lab's own repositories, or a suite of no
    Ubuntu lab release: a 404)."""
    parts = path.split("?", 1)[0].split("#", 1)[0].lstrip("/").split("/")
    if parts[0] not in UBUNTU_STANDIN_ARCHIVES or ".." in parts or len(parts) < 3:
        return None
    rest = parts[1:]
    if parts[0] == UBUNTU_ARCHIVE and _served_here(rest):
        return None
    if rest[0] == "dists":
        codename, dash, pocket = rest[1].partition("-")
        base = UBUNTU_LAB_BASES.get(codename)
        if base is None:
            return None
        rest = ["dists", base + dash + pocket, *rest[2:]]
    elif rest[0] != "pool":
        return None
    return UBUNTU_STANDIN_ARCHIVES[parts[0]] + "/" + "/".join(rest)


def _served_here(rest: list[str]) -> bool:
    """Whether a path under /ubuntu/ is the stand-in's own part (Ubuntu's driver packages:
    their suite, and the pool of their component, which Debian's archive does not have)."""
    if rest[0] == "dists":
        return rest[1] == UBUNTU_SUITE
    return rest[0] == "pool" and rest[1] in UBUNTU_COMPONENTS


def ubuntu_pool(package: StandinPackage) -> str:
    """Where in the stand-in Ubuntu archive ``package`` lies: the pool of its component (apt
    finds it by the index's Filename, so one directory per component serves every source)."""
    return f"pool/{ubuntu_standin.component(package)}/n/nvidia"


def _handler_class(directory: Path, record: Any) -> type[http.server.SimpleHTTPRequestHandler]:
    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, directory=str(directory), **kwargs)

        def _redirected(self) -> bool:
            target = ubuntu_redirect(self.path) or debian_subset.pool_redirect(self.path)
            if target is None:
                return False
            self.send_response(302)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return True

        def do_GET(self) -> None:
            if not self._redirected():
                super().do_GET()

        def do_HEAD(self) -> None:
            if not self._redirected():
                super().do_HEAD()

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            status = int(code) if str(code).isdigit() else 0
            record(
                Request(
                    time=datetime.now(UTC).isoformat(timespec="seconds"),
                    client=self.client_address[0],
                    method=self.command,
                    path=self.path,
                    status=status,
                )
            )

        def log_message(self, format: str, *args: Any) -> None:
            pass  # requests are recorded by log_request; keep the test output clean

    return Handler


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lab.aptrepo DIRECTORY BIND_ADDRESS [PORT]``: build, then serve
    in the foreground (the lab starts this detached, one per lab bridge)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m lab.aptrepo")
    parser.add_argument("directory", type=Path)
    parser.add_argument("bind_address")
    parser.add_argument("port", type=int, nargs="?", default=DEFAULT_PORT)
    args = parser.parse_args(argv)
    build_repository(args.directory)
    serve(args.directory, args.bind_address, args.port).wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The lab's stand-in of Ubuntu's own NVIDIA driver packages (lab/standin/ubuntu_world.toml),
against the real index excerpts it records (tests/fixtures/ubuntu-packages), against
gpunode's own name rules for the ubuntu driver source (gpunode/expected/ubuntu_driver.py), and
as the stand-in Ubuntu archive serves it (signed suite, pool of each component); and the
simulated running kernel of an Ubuntu lab node (lab/hwsim/kernel.py).

As in test_standin_catalogue.py, the relation check recomputes what the data says on its own
(``str.format_map`` of each template) rather than calling the generator's helpers.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpunode.expected import packages as expected_packages
from gpunode.expected import ubuntu_driver
from gpunode.model import NvidiaDriver
from lab import aptrepo
from lab.hwsim import kernel
from lab.standin import ubuntu
from lab.standin.catalogue import RELATION_FIELDS

from .conftest import BuiltRepository

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ubuntu-packages"
DATE = "2026-12-07"
# Names a real package depends on that no lab node has: each must be a listed departure.
LAB_ABSENT = re.compile(r"^(dkms|linux-image-.*|nvidia-kernel-source-.*)")


def _fill(items: list[str], context: dict[str, str]) -> list[str]:
    return [item.format_map(context) for item in items]


def test_every_package_declares_exactly_its_recorded_relations_and_departures() -> None:
    problems = []
    for item in ubuntu.generated():
        template, context, package = item.template, item.context, item.package
        departures = template.get("departures", {})
        for name in RELATION_FIELDS:
            real = _fill(template.get(name, []), context)
            change = departures.get(name, {})
            removed = _fill(change.get("remove", []), context)
            assert set(removed) <= set(real), (package.name, name, removed)
            expected = [entry for entry in real if entry not in removed]
            expected += _fill(change.get("add", []), context)
            if list(getattr(package, name)) != expected:
                problems.append(f"{package.name} {name}: {getattr(package, name)} != {expected}")
            # What no lab node has is always a departure, never silently kept.
            for relation in getattr(package, name):
                for alternative in relation.split(" | "):
                    assert not LAB_ABSENT.match(alternative), (package.name, relation)
    assert problems == []


def test_every_template_and_release_names_a_dated_source_or_says_why_it_is_assumed() -> None:
    sources = ubuntu.WORLD["sources"]
    for key, source in sources.items():
        assert source["seen"] == DATE, key
        assert source["url"].startswith("https://packages.ubuntu.com/"), key
        assert source["what"].strip(), key
    for entry in [*ubuntu.WORLD["package"], *ubuntu.WORLD["driver"], *ubuntu.WORLD["kernel"]]:
        if entry["source"] == "assumed":
            assert entry["assumed"].strip(), entry
        else:
            assert entry["source"] in sources, entry
    for template in ubuntu.WORLD["package"]:
        if "departures" in template:
            assert template["departures"]["why"].strip(), template["id"]


def test_the_prebuilt_kernel_is_the_one_the_real_index_excerpt_shows() -> None:
    # packages.ubuntu.com, noble-updates: linux-modules-nvidia-575-6.8.0-64-generic
    # (6.8.0-64.67+1), "Linux kernel nvidia modules for version 6.8.0-64".
    excerpt = (FIXTURES / "noble-updates_linux-modules-nvidia-575-6.8.0-64-generic.txt").read_text()
    (prebuilt,) = ubuntu.PREBUILT_KERNELS
    header = f"Package: linux-modules-nvidia-575-{prebuilt.release} ({prebuilt.kernel_version})"
    assert header in excerpt
    assert f"Linux kernel nvidia modules for version {prebuilt.kernel}" in excerpt
    parsed = ubuntu_driver.parse_kernel_release(prebuilt.release)
    assert parsed is not None and parsed.flavour == prebuilt.kernel_flavour == "generic"
    modules = [p for p in ubuntu.catalogue() if p.name.startswith("linux-modules-nvidia-")]
    assert {p.version for p in modules} == {"6.8.0-64.67+1"}


def test_nvidia_utils_depends_on_the_compute_library_and_the_common_files_as_ubuntus_does() -> None:
    # tenacious's nvidia-utils-580-server 580.178.04-0ubuntu1: "dep: libnvidia-compute-580-server
    # (>= 580.178.04)", "dep: nvidia-kernel-common-580-server-580.178.04".
    excerpt = (FIXTURES / "tenacious_nvidia-utils-580-server.txt").read_text()
    assert "dep: libnvidia-compute-580-server (>= 580.178.04)" in excerpt
    assert "dep: nvidia-kernel-common-580-server-580.178.04" in excerpt
    by_name = {p.name: p for p in ubuntu.catalogue()}
    for release in ubuntu.DRIVER_RELEASES:
        utils = by_name[f"nvidia-utils-{release.branch}-server"]
        assert f"libnvidia-compute-{release.branch}-server (>= {release.upstream})" in utils.depends
        virtual = f"nvidia-kernel-common-{release.branch}-server-{release.upstream}"
        assert virtual in utils.depends
        assert by_name[f"nvidia-kernel-common-{release.branch}-server"].provides == (virtual,)


def test_the_flavour_meta_package_depends_on_the_kernels_module_at_its_exact_version() -> None:
    excerpt = (FIXTURES / "noble_linux-modules-nvidia-550-open-generic.txt").read_text()
    assert "dep: linux-modules-nvidia-550-open-6.8.0-31-generic (= 6.8.0-31.31)" in excerpt
    by_name = {p.name: p for p in ubuntu.catalogue()}
    (prebuilt,) = ubuntu.PREBUILT_KERNELS
    meta = by_name["linux-modules-nvidia-580-server-open-generic"]
    assert meta.depends[0] == (
        f"linux-modules-nvidia-580-server-open-{prebuilt.release} (= {prebuilt.kernel_version})"
    )


@pytest.mark.parametrize("flavour", ["open", "proprietary"])
def test_every_name_gpunodes_rules_give_for_a_release_is_in_the_stand_in_archive(
    flavour: ubuntu_driver.Flavour,
) -> None:
    """What the role installs for each release, on the prebuilt kernel and on another
    (DKMS), is exactly what the stand-in archive offers: the product's name rules and the
    stand-in's graph, both from Ubuntu's indexes, agree."""
    names = {p.name for p in ubuntu.catalogue()}
    (prebuilt,) = ubuntu.PREBUILT_KERNELS
    generic = ubuntu_driver.parse_kernel_release(prebuilt.release)
    custom = ubuntu_driver.parse_kernel_release(f"{prebuilt.kernel}-custom")
    assert generic is not None and custom is not None
    for release in ubuntu.DRIVER_RELEASES:
        wanted = NvidiaDriver(
            source="ubuntu", branch=release.branch, version=release.version, flavour=flavour
        )
        on_generic = expected_packages.ubuntu_driver_packages(
            wanted, release.version, generic, names
        )
        assert on_generic.module == ubuntu_driver.prebuilt_module_package(
            release.branch, "server", flavour, generic
        )
        assert not on_generic.module_versioned
        on_custom = expected_packages.ubuntu_driver_packages(wanted, release.version, custom, names)
        assert on_custom.module == ubuntu_driver.dkms_package(release.branch, "server", flavour)
        for spec in (on_generic, on_custom):
            assert {*spec.versioned, *spec.unversioned} <= names
        for name in (
            ubuntu_driver.full_driver_package(release.branch, "server", flavour),
            ubuntu_driver.headless_package(release.branch, "server", flavour),
            ubuntu_driver.prebuilt_module_meta(release.branch, "server", flavour, "generic"),
        ):
            assert name in names


def test_kernel_module_packages_record_what_a_reboot_would_load() -> None:
    by_name = {p.name: p for p in ubuntu.catalogue()}
    (prebuilt,) = ubuntu.PREBUILT_KERNELS
    for name, version, flavour in (
        (f"linux-modules-nvidia-580-server-open-{prebuilt.release}", "580.173.02", "open"),
        (f"linux-modules-nvidia-570-server-{prebuilt.release}", "570.211.01", "proprietary"),
        ("nvidia-dkms-580-server-open", "580.173.02", "open"),
    ):
        postinst = by_name[name].scripts["postinst"]
        assert f"echo {version} > /var/lib/gpunode-lab/installed-driver-version.new" in postinst
        assert f"echo {flavour} > /var/lib/gpunode-lab/installed-kernel-module-flavour" in postinst
        assert f"/var/lib/gpunode-lab/modules/{name}\n" in postinst
    # One branch's nvidia-persistenced at a time: each ships the same path.
    utils = [p for p in by_name.values() if p.name.startswith("nvidia-compute-utils-")]
    assert len(utils) == 2
    for package in utils:
        assert "/usr/bin/nvidia-persistenced" in {f.path for f in package.files}
        assert package.conflicts == package.replaces == package.provides


def _script(text: str, argument: str) -> None:
    subprocess.run(["sh", "-c", text, "script", argument], check=True)


def test_removing_one_of_two_installed_modules_keeps_the_record_of_the_other(
    tmp_path: Path,
) -> None:
    """A prebuilt module for one kernel and a DKMS one for another, side by side: removing
    the DKMS one (the node is back on the prebuilt kernel) leaves the prebuilt one's record;
    removing the last leaves none."""
    state = str(tmp_path)
    prebuilt = ubuntu.module_scripts("linux-modules-nvidia-570-server-6.8.0-64-generic",
                                     "570.211.01", "proprietary", state)  # fmt: skip
    dkms = ubuntu.module_scripts("nvidia-dkms-580-server-open", "580.173.02", "open", state)
    record = tmp_path / "installed-driver-version"
    flavour = tmp_path / "installed-kernel-module-flavour"
    _script(prebuilt["postinst"], "configure")
    _script(dkms["postinst"], "configure")
    assert (record.read_text(), flavour.read_text()) == ("580.173.02\n", "open\n")
    _script(dkms["postrm"], "remove")
    assert (record.read_text(), flavour.read_text()) == ("570.211.01\n", "proprietary\n")
    _script(prebuilt["postrm"], "remove")
    assert not record.exists() and not flavour.exists()
    # An upgrade in place (postrm upgrade) changes nothing.
    _script(dkms["postinst"], "configure")
    _script(dkms["postrm"], "upgrade")
    assert record.read_text() == "580.173.02\n"


def test_a_module_package_lists_its_nvidia_ko_in_its_kernels_modules_dep(tmp_path: Path) -> None:
    """As depmod leaves it: the Container Toolkit's refresh service runs only where the
    running kernel's modules.dep lists nvidia.ko. Two branches' prebuilt modules for one
    kernel each have their line; removing one leaves the other's and the kernel's own."""
    state, root = str(tmp_path / "state"), tmp_path / "modules"
    dep = root / "6.8.0-64-generic" / "modules.dep"
    dep.parent.mkdir(parents=True)
    dep.write_text("kernel/drivers/net/dummy.ko:\n")

    def scripts(branch: str) -> dict[str, str]:
        entry = ubuntu.ModuleEntry("6.8.0-64-generic", f"kernel/nvidia-{branch}-server/nvidia.ko")
        return ubuntu.module_scripts(f"linux-modules-nvidia-{branch}-server-6.8.0-64-generic",
                                     f"{branch}.1", "open", state, entry, str(root))  # fmt: skip

    _script(scripts("570")["postinst"], "configure")
    _script(scripts("580")["postinst"], "configure")
    _script(scripts("580")["postinst"], "configure")  # configured again: one line still
    assert dep.read_text().splitlines() == [
        "kernel/drivers/net/dummy.ko:",
        "kernel/nvidia-570-server/nvidia.ko:",
        "kernel/nvidia-580-server/nvidia.ko:",
    ]
    _script(scripts("570")["postrm"], "remove")
    assert dep.read_text().splitlines() == [
        "kernel/drivers/net/dummy.ko:",
        "kernel/nvidia-580-server/nvidia.ko:",
    ]
    # The catalogue's packages: DKMS for the running kernel, prebuilt for their own.
    by_name = {package.name: package for package in ubuntu.catalogue()}
    assert (
        "/lib/modules/$(uname -r)/modules.dep"
        in (by_name["nvidia-dkms-580-server-open"].scripts["postinst"])
    )
    prebuilt = by_name["linux-modules-nvidia-580-server-open-6.8.0-64-generic"]
    assert "'kernel/nvidia-580-server-open/nvidia.ko:'" in prebuilt.scripts["postinst"]
    assert "/lib/modules/6.8.0-64-generic/modules.dep" in prebuilt.scripts["postinst"]


# --- the stand-in Ubuntu archive as served --------------------------------------------------


@pytest.fixture(scope="module")
def built(built_repository: BuiltRepository) -> aptrepo.RepoInfo:
    """The unit tier's one build of the default repositories (tests/unit/conftest.py)."""
    return built_repository.repo


@pytest.fixture
def gpg_home(tmp_path: Path) -> Iterator[dict[str, str]]:
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}
    yield env
    subprocess.run(["gpgconf", "--kill", "all"], env=env, capture_output=True, check=False)


def test_the_suite_is_ubuntus_signed_with_its_own_key_and_lists_its_components(
    built: aptrepo.RepoInfo, gpg_home: dict[str, str]
) -> None:
    suite = built.directory / aptrepo.UBUNTU_SUITE_PATH
    release = (suite / "Release").read_text()
    for line in ("Origin: Ubuntu", "Suite: noble-updates", "Codename: noble",
                 "Components: multiverse restricted", "Architectures: amd64"):  # fmt: skip
        assert f"\n{line}\n" in f"\n{release}", line
    for component in ("multiverse", "restricted"):
        index = suite / component / "binary-amd64" / "Packages.gz"
        digest = hashlib.sha256(index.read_bytes()).hexdigest()
        listed = rf"^ {digest} +\d+ {component}/binary-amd64/Packages.gz$"
        assert re.search(listed, release, re.M), component
    own = subprocess.run(
        ["gpgv", "--keyring", str(built.ubuntu_keyring), str(suite / "InRelease")],
        env=gpg_home, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert own.returncode == 0, own.stderr
    other = subprocess.run(
        ["gpgv", "--keyring", str(built.cuda_keyring), str(suite / "InRelease")],
        env=gpg_home, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert other.returncode != 0


def test_every_package_is_in_the_pool_of_its_component_as_the_index_says(
    built: aptrepo.RepoInfo,
) -> None:
    suite = built.directory / aptrepo.UBUNTU_SUITE_PATH
    stanzas = []
    for component in ("multiverse", "restricted"):
        packages = suite / component / "binary-amd64/Packages.gz"
        index = gzip.decompress(packages.read_bytes()).decode()
        for block in index.split("\n\n"):
            stanza = dict(re.findall(r"^(\w[\w-]*): (.*)$", block, re.M))
            if stanza:
                # In the pool of the component whose index lists it, and of its section's.
                assert stanza["Filename"].startswith(f"pool/{component}/"), stanza
                assert stanza["Section"].startswith(f"{component}/"), stanza
                stanzas.append(stanza)
    assert sorted((s["Package"], s["Version"]) for s in stanzas) == sorted(
        (p.name, p.version) for p in ubuntu.catalogue()
    )
    # Fabric Manager's packages are multiverse's, as on Ubuntu's archive.
    multiverse = {s["Package"] for s in stanzas if s["Filename"].startswith("pool/multiverse/")}
    assert multiverse == {
        f"{name}-{branch}"
        for name in ("nvidia-fabricmanager", "libnvidia-nscq")
        for branch in ("570", "580")
    }
    for stanza in stanzas:
        deb = built.directory / "ubuntu" / stanza["Filename"]
        assert hashlib.sha256(deb.read_bytes()).hexdigest() == stanza["SHA256"]
        # Served from the lab's build, never redirected to Debian's archive.
        assert aptrepo.ubuntu_redirect(f"/ubuntu/{stanza['Filename']}") is None


# --- the simulated running kernel -----------------------------------------------------------


@pytest.fixture(scope="module")
def uname_library(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The library, compiled to read its release from a file of this test's."""
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler on this machine: the lab builds the library with one")
    scratch = tmp_path_factory.mktemp("uname")
    release_file = scratch / "kernel-release"
    built = kernel.library(scratch / "state", release_path=str(release_file))
    library = scratch / "libuname.so"
    library.write_bytes(built)
    return library, release_file


def _releases(library: Path) -> list[str]:
    env = {**os.environ, "LD_PRELOAD": str(library)}
    shell = subprocess.run(["uname", "-r"], env=env, capture_output=True, text=True, check=True)
    python = subprocess.run(
        ["python3", "-c", "import os; print(os.uname().release)"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [shell.stdout.strip(), python.stdout.strip()]


def test_uname_answers_the_simulated_release_to_the_shell_and_to_python(
    uname_library: tuple[Path, Path],
) -> None:
    library, release_file = uname_library
    real = os.uname().release
    release_file.unlink(missing_ok=True)
    assert _releases(library) == [real, real]
    release_file.write_text("6.8.0-64-generic\n")
    assert _releases(library) == ["6.8.0-64-generic"] * 2
    release_file.write_text("6.8.0-64-custom")
    assert _releases(library) == ["6.8.0-64-custom"] * 2
    # Anything but one plain release line is not taken: the real release stays.
    for garbage in ("", "\n", "6.8.0; reboot\n", "6.8.0-64-generic\nextra\n", "x" * 300):
        release_file.write_text(garbage)
        assert _releases(library) == [real, real], garbage


def test_the_node_files_preload_the_library_and_start_on_the_generic_kernel(
    tmp_path: Path, uname_library: tuple[Path, Path]
) -> None:
    files = kernel.node_files(Path(tempfile.mkdtemp(dir=tmp_path)))
    assert files[kernel.PRELOAD_PATH][0] == f"{kernel.LIBRARY_PATH}\n".encode()
    assert files[kernel.KERNEL_RELEASE_PATH][0] == b"6.8.0-64-generic\n"
    assert files[kernel.LIBRARY_PATH][0].startswith(b"\x7fELF")
    with pytest.raises(ValueError):
        kernel.source('/tmp/a"b')

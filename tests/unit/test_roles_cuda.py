"""CUDA toolkit role and the shared pinned-and-held package operation: facts in, commands out."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import DeployError, OperationError

from facts.apt import AptIndexedRepositories
from facts.container_runtime import AptPackagePolicy, DpkgPackageState, parse_apt_policy
from gpunode import framing
from gpunode.model import CUDA_MINIMUM_DRIVER, build_desired_state
from gpunode.refusal import NodeRefused
from lab.standin import catalogue
from roles.cuda import (
    DRIVER_PULLING_PACKAGES,
    CudaToolkitSetup,
    _remove_release_shell,
    default_release,
    default_toolkit,
    held_packages,
    nccl_version_suffix,
    recorded_releases,
    render_profile,
    require_offered,
    select_version_shell,
    toolkit_package,
    undeclared_releases_removed,
)

from .fakehost import commands_of, dpkg_of, fake_host

CUDA_URL = "http://mirror.example:8089/cuda/debian12/x86_64"
DEBIAN_URL = "http://deb.debian.org/debian"
INSTALL = (
    "DEBIAN_FRONTEND=noninteractive apt-get -y "
    '-o Dpkg::Options::="--force-confdef" -o Dpkg::Options::="--force-confold" '
    "install --no-install-recommends --allow-downgrades --allow-change-held-packages "
)


def offered(*versions: str, url: str = CUDA_URL) -> list[dict[str, Any]]:
    return [{"version": version, "urls": [url]} for version in versions]


def package(
    installed: str | None = None, held: bool = False, versions: list | None = None
) -> dict[str, Any]:
    versions = versions or []
    return {
        "installed": installed,
        "held": held,
        "candidate": versions[0]["version"] if versions else None,
        "versions": versions,
    }


def policy(indexed: bool = True, **packages: dict[str, Any]) -> dict[type, Any]:
    names = {name.replace("_", "-"): state for name, state in packages.items()}
    return {
        AptPackagePolicy: {
            "indexed_urls": [CUDA_URL, DEBIAN_URL] if indexed else [DEBIAN_URL],
            "packages": names,
        },
        DpkgPackageState: dpkg_of(names),
    }


# --- held_packages -----------------------------------------------------------------------------


def test_fresh_release_installs_the_newest_the_mirror_offers_and_holds_it() -> None:
    facts = policy(cuda_toolkit_12_4=package(versions=offered("12.4.1-1", "12.4.0-1")))
    commands, _ = commands_of(
        held_packages, facts, packages=["cuda-toolkit-12-4"], repository_url=CUDA_URL
    )
    assert commands == [
        INSTALL + "cuda-toolkit-12-4=12.4.1-1",
        "apt-mark hold cuda-toolkit-12-4",
    ]


def test_installed_and_held_is_a_noop_even_when_the_mirror_has_newer() -> None:
    facts = policy(
        cuda_toolkit_12_4=package("12.4.0-1", held=True, versions=offered("12.4.1-1", "12.4.0-1"))
    )
    commands, noops = commands_of(
        held_packages, facts, packages=["cuda-toolkit-12-4"], repository_url=f"{CUDA_URL}/"
    )
    assert commands == []
    assert noops == ["cuda-toolkit-12-4 12.4.0-1 installed and held"]


def test_installed_but_not_held_is_only_held() -> None:
    facts = policy(cuda_toolkit_12_4=package("12.4.0-1", versions=offered("12.4.0-1")))
    commands, _ = commands_of(
        held_packages, facts, packages=["cuda-toolkit-12-4"], repository_url=CUDA_URL
    )
    assert commands == ["apt-mark hold cuda-toolkit-12-4"]


def test_pin_change_moves_every_package_and_holds_them_again() -> None:
    both = offered("1.17.8-1", "1.17.4-1")
    facts = policy(
        nvidia_container_toolkit=package("1.17.4-1", True, both),
        libnvidia_container1=package("1.17.4-1", True, both),
    )
    commands, _ = commands_of(
        held_packages,
        facts,
        packages=["nvidia-container-toolkit", "libnvidia-container1"],
        repository_url=CUDA_URL,
        version="1.17.8-1",
    )
    assert commands == [
        INSTALL + "nvidia-container-toolkit=1.17.8-1 libnvidia-container1=1.17.8-1",
        "apt-mark hold nvidia-container-toolkit libnvidia-container1",
    ]


def test_pin_to_an_older_version_downgrades() -> None:
    facts = policy(datacenter_gpu_manager=package("1:3.3.9", True, offered("1:3.3.9", "1:3.3.8")))
    commands, _ = commands_of(
        held_packages,
        facts,
        packages=["datacenter-gpu-manager"],
        repository_url=CUDA_URL,
        version="1:3.3.8",
    )
    assert commands[0] == INSTALL + "datacenter-gpu-manager=1:3.3.8"
    assert "--allow-downgrades" in commands[0]


def test_pinned_version_the_mirror_lacks_is_an_error_naming_package_version_and_url() -> None:
    facts = policy(datacenter_gpu_manager=package(versions=offered("1:3.3.9", "1:3.3.8")))
    with pytest.raises(OperationError) as error:
        commands_of(
            held_packages,
            facts,
            packages=["datacenter-gpu-manager"],
            repository_url=CUDA_URL,
            version="1:4.0.0",
        )
    message = str(error.value)
    assert "datacenter-gpu-manager 1:4.0.0 is not offered by " + CUDA_URL in message
    assert "1:3.3.9, 1:3.3.8" in message


def test_versions_from_another_repository_do_not_count() -> None:
    facts = policy(libnccl2=package(versions=offered("2.26.2-1+cuda12.8", url=DEBIAN_URL)))
    with pytest.raises(OperationError, match="libnccl2: no version ending in"):
        commands_of(
            held_packages,
            facts,
            packages=["libnccl2"],
            repository_url=CUDA_URL,
            version_suffix="+cuda12.8",
        )


NCCL = offered("2.26.2-1+cuda12.8", "2.25.1-1+cuda12.8", "2.21.5-1+cuda12.4")


def test_libnccl2_is_the_newest_build_for_the_default_release() -> None:
    for suffix, expected in (
        ("+cuda12.8", "2.26.2-1+cuda12.8"),
        ("+cuda12.4", "2.21.5-1+cuda12.4"),
    ):
        commands, _ = commands_of(
            held_packages,
            policy(libnccl2=package(versions=NCCL)),
            packages=["libnccl2"],
            repository_url=CUDA_URL,
            version_suffix=suffix,
        )
        assert commands == [INSTALL + f"libnccl2={expected}", "apt-mark hold libnccl2"]


def test_libnccl2_of_the_right_release_stays_at_its_version() -> None:
    facts = policy(libnccl2=package("2.25.1-1+cuda12.8", True, NCCL))
    commands, _ = commands_of(
        held_packages,
        facts,
        packages=["libnccl2"],
        repository_url=CUDA_URL,
        version_suffix="+cuda12.8",
    )
    assert commands == []


def test_libnccl2_of_another_release_is_replaced() -> None:
    facts = policy(libnccl2=package("2.21.5-1+cuda12.4", True, NCCL))
    commands, _ = commands_of(
        held_packages,
        facts,
        packages=["libnccl2"],
        repository_url=CUDA_URL,
        version_suffix="+cuda12.8",
    )
    assert commands[0] == INSTALL + "libnccl2=2.26.2-1+cuda12.8"


def test_unindexed_repository_resolves_the_version_on_the_node() -> None:
    commands, _ = commands_of(
        held_packages,
        policy(indexed=False),
        packages=["libnccl2"],
        repository_url=CUDA_URL,
        version_suffix="+cuda12.8",
    )
    assert len(commands) == 2
    assert commands[0].startswith('version="$(apt-cache madison libnccl2 | awk')
    assert "libnccl2: no version ending in +cuda12.8 is offered by " + CUDA_URL in commands[0]
    assert commands[0].endswith(INSTALL + 'libnccl2="$version"')
    assert commands[1] == "apt-mark hold libnccl2"


MADISON = f"""\
  libnccl2 | 2.26.2-1+cuda12.8 | {DEBIAN_URL} bookworm/non-free amd64 Packages
  libnccl2 | 2.25.1-1+cuda12.8 | {CUDA_URL}  Packages
  libnccl2 | 2.21.5-1+cuda12.4 | {CUDA_URL}  Packages
  libnccl2 | 2.20.0-1+cuda12.4 | {CUDA_URL}-old  Packages
"""


def run_select(tmp_path: Path, **selection: Any) -> str:
    """The node-side version selection, run against a fake apt-cache."""
    fake = tmp_path / "apt-cache"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{MADISON}EOF\n")
    fake.chmod(0o755)
    script = select_version_shell("libnccl2", f"{CUDA_URL}/", **selection)
    result = subprocess.run(
        ["sh", "-c", script],
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


def test_node_side_selection_matches_only_the_repository_and_the_rule(tmp_path: Path) -> None:
    assert run_select(tmp_path) == "2.25.1-1+cuda12.8"
    assert run_select(tmp_path, suffix="+cuda12.4") == "2.21.5-1+cuda12.4"
    assert run_select(tmp_path, version="2.21.5-1+cuda12.4") == "2.21.5-1+cuda12.4"
    assert run_select(tmp_path, version="2.20.0-1+cuda12.4") == ""
    assert run_select(tmp_path, suffix="+cuda13.0") == ""


# --- never the driver ------------------------------------------------------------------------


def dependency_closure(root: str) -> set[str]:
    """Every package name reachable from ``root`` in the stand-in catalogue (all versions, all
    alternatives): what apt could possibly pull in."""
    depends: dict[str, set[str]] = {}
    for standin in catalogue():
        names = depends.setdefault(standin.name, set())
        for field in standin.depends:
            for alternative in field.split("|"):
                names.add(alternative.split()[0])
    seen, todo = set(), [root]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(depends.get(name, ()))
    return seen


def test_toolkit_packages_never_pull_a_driver_but_the_cuda_metapackage_does() -> None:
    driver_packages = {"cuda-drivers", "nvidia-driver", "libcuda1", "nvidia-kernel-dkms"}
    assert driver_packages <= dependency_closure("cuda")
    for release in ("12.4", "12.8"):
        closure = dependency_closure(toolkit_package(release))
        assert toolkit_package(release) in closure
        assert not closure & (driver_packages | set(DRIVER_PULLING_PACKAGES))


def test_every_release_installs_only_its_toolkit_package_without_recommends() -> None:
    for release in CUDA_MINIMUM_DRIVER:
        name = toolkit_package(release)
        assert name == f"cuda-toolkit-{release.replace('.', '-')}"
        commands, _ = commands_of(
            held_packages,
            policy(**{name: package(versions=offered(f"{release}.0-1"))}),
            packages=[name],
            repository_url=CUDA_URL,
        )
        arguments = commands[0].split(" install ", 1)[1].split()
        packages = [word for word in arguments if not word.startswith("-")]
        assert packages == [f"{name}={release}.0-1"]
        assert "--no-install-recommends" in commands[0]
        assert not {word.split("=")[0] for word in packages} & set(DRIVER_PULLING_PACKAGES)


# --- facts -----------------------------------------------------------------------------------

POLICY_OUTPUT = f"""\
libnccl2:
  Installed: 2.26.2-1+cuda12.8
  Candidate: 2.26.2-1+cuda12.8
  Version table:
 *** 2.26.2-1+cuda12.8 500
        500 {CUDA_URL}  Packages
        100 /var/lib/dpkg/status
     2.25.1-1+cuda12.8 500
        500 {CUDA_URL}  Packages
cuda-toolkit-12-4:
  Installed: (none)
  Candidate: 12.4.1-1
  Version table:
     12.4.1-1 500
        500 {CUDA_URL}  Packages
""".splitlines()


def test_apt_policy_fact_parses_versions_sources_and_holds() -> None:
    output = framing.output_of(
        {
            # apt-get indextargets --format '$(REPO_URI)' 'Created-By: Packages': one line per
            # index file (a Debian suite has one per component)
            "files": [
                f"{CUDA_URL}/",
                f"{DEBIAN_URL}/",
                f"{DEBIAN_URL}/",
                "E: something apt says that is no URL",
            ],
            "policy": POLICY_OUTPUT,
            "dpkg": [
                "libnccl2 hold installed 2.26.2-1+cuda12.8",
                "libnvidia-container1 deinstall config-files 1.17.4-1",
            ],
            "requested": ["libnccl2", "cuda-toolkit-12-4", "dcgm-exporter", "libnvidia-container1"],
        }
    )
    fact = AptPackagePolicy().process(output)
    assert fact["indexed_urls"] == sorted([CUDA_URL, DEBIAN_URL])
    packages = fact["packages"]
    assert packages["libnccl2"] == {
        "installed": "2.26.2-1+cuda12.8",
        "held": True,
        "candidate": "2.26.2-1+cuda12.8",
        "versions": offered("2.26.2-1+cuda12.8", "2.25.1-1+cuda12.8"),
    }
    assert packages["cuda-toolkit-12-4"]["installed"] is None
    assert packages["cuda-toolkit-12-4"]["versions"] == offered("12.4.1-1")
    assert packages["dcgm-exporter"] == package()
    assert packages["libnvidia-container1"]["installed"] is None  # only its config is left


def test_apt_policy_of_an_unknown_package_is_empty() -> None:
    assert parse_apt_policy([]) == {}


def test_alternatives_fact() -> None:
    query = [
        "Name: cuda",
        "Link: /usr/local/cuda",
        "Status: manual",
        "Best: /usr/local/cuda-12.8",
        "Value: /usr/local/cuda-12.4",
        "",
        "Alternative: /usr/local/cuda-12.4",
        "Priority: 124",
    ]
    output = framing.output_of(
        {
            "alternative.cuda": query,
            # update-alternatives knows no such name: it prints nothing and exits 2.
            "alternative.cuda-13": framing.PartOutput("alternative.cuda-13", [], [], 2),
            # A recorded release that looks like a marker is a line like any other.
            "recorded": ["12.4", "12.8", "@@recorded"],
        }
    )
    assert CudaToolkitSetup().process(output) == {
        "alternatives": {"cuda": {"status": "manual", "value": "/usr/local/cuda-12.4"}},
        "recorded": ["12.4", "12.8", "@@recorded"],
    }


def test_alternatives_fact_command_runs_as_framed_parts() -> None:
    # This machine has neither the alternative nor gpunode's record: both read as absent.
    command = CudaToolkitSetup().command(["no-such-alternative-gpunode"])
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stderr == ""
    frame = framing.parse(done.stdout.splitlines())
    assert frame.complete and set(frame.parts) == {
        "alternative.no-such-alternative-gpunode",
        "recorded",
    }
    assert CudaToolkitSetup().process(done.stdout.splitlines()) == {
        "alternatives": {},
        "recorded": [],
    }


# --- releases, default, paths ----------------------------------------------------------------


def setup_fact(recorded: list[str], **alternatives: dict[str, str]) -> dict[type, Any]:
    return {
        CudaToolkitSetup: lambda names: {
            "alternatives": {
                name.replace("_", "-"): value
                for name, value in alternatives.items()
                if name.replace("_", "-") in names
            },
            "recorded": recorded,
        }
    }


def test_new_releases_are_recorded_before_install() -> None:
    commands, _ = commands_of(recorded_releases, setup_fact(["12.4"]), releases=["12.4", "12.8"])
    assert commands == [
        "mkdir -p /var/lib/gpunode && printf %s '12.4\n12.8\n' > /var/lib/gpunode/cuda-toolkits"
    ]


def test_recorded_releases_noop() -> None:
    commands, noops = commands_of(
        recorded_releases, setup_fact(["12.4", "12.8"]), releases=["12.8"]
    )
    assert commands == []
    assert noops == ["CUDA releases 12.8 are recorded as gpunode's"]


def test_undeclared_recorded_release_is_removed_and_forgotten() -> None:
    facts = {
        **setup_fact(["12.4", "12.8"]),
        **policy(cuda_toolkit_12_4=package("12.4.1-1", True)),
    }
    commands, _ = commands_of(undeclared_releases_removed, facts, declared=["12.8"])
    assert commands == [
        _remove_release_shell("12.4"),
        "mkdir -p /var/lib/gpunode && printf %s '12.8\n' > /var/lib/gpunode/cuda-toolkits",
    ]


def test_release_read_from_the_node_record_stays_one_word() -> None:
    # The record file is on the node: a planted line must not become shell syntax.
    script = _remove_release_shell("12.4;touch $(id)")
    assert "cuda-toolkit-12-4;touch $(id)" in shlex.split(script)
    assert "touch" not in shlex.split(script)


def test_recorded_release_removed_by_hand_is_only_forgotten() -> None:
    facts = {**setup_fact(["12.4"]), **policy(cuda_toolkit_12_4=package())}
    commands, _ = commands_of(undeclared_releases_removed, facts, declared=[])
    assert commands == [
        "mkdir -p /var/lib/gpunode && printf %s '' > /var/lib/gpunode/cuda-toolkits"
    ]


def test_release_not_recorded_is_never_removed() -> None:
    commands, noops = commands_of(
        undeclared_releases_removed, setup_fact(["12.8"]), declared=["12.8"]
    )
    assert commands == []
    assert noops == ["no undeclared CUDA release recorded as gpunode's"]


def run_removal(tmp_path: Path, simulated_remove: str) -> tuple[subprocess.CompletedProcess, str]:
    """The removal script against fake apt-get / apt-mark that log what they were asked."""
    log = tmp_path / "log"
    (tmp_path / "apt-get").write_text(
        "#!/bin/sh\n"
        f'echo "apt-get $*" >> {log}\n'
        'case "$*" in\n'
        f'  "-s remove cuda-toolkit-12-4") printf "{simulated_remove}" ;;\n'
        '  "-s autoremove") printf "Remv cuda-nvcc-12-4 [1]\\nRemv cuda-toolkit-12-4-config-common'
        ' [1]\\nRemv cuda-nvcc-12-8 [1]\\nRemv unrelated [1]\\n" ;;\n'
        "esac\n"
    )
    (tmp_path / "apt-mark").write_text(f'#!/bin/sh\necho "apt-mark $*" >> {log}\n')
    for tool in ("apt-get", "apt-mark"):
        (tmp_path / tool).chmod(0o755)
    result = subprocess.run(
        ["sh", "-c", _remove_release_shell("12.4")],
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    return result, log.read_text() if log.exists() else ""


def test_removal_takes_the_release_and_its_unneeded_components_only(tmp_path: Path) -> None:
    result, log = run_removal(tmp_path, "Remv cuda-toolkit-12-4 [12.4.1-1]\\n")
    assert result.returncode == 0, result.stderr
    removals = [line for line in log.splitlines() if " remove " in line and "-s" not in line]
    assert "apt-mark unhold cuda-toolkit-12-4" in log
    assert removals[0].endswith("remove cuda-toolkit-12-4")
    assert removals[1].endswith("remove cuda-nvcc-12-4 cuda-toolkit-12-4-config-common")


def test_removal_refuses_when_it_would_take_other_packages(tmp_path: Path) -> None:
    result, log = run_removal(
        tmp_path, "Remv cuda-12-4 [12.4.1-1]\\nRemv cuda-toolkit-12-4 [12.4.1-1]\\n"
    )
    assert result.returncode == 1
    assert "would also remove other packages" in result.stderr
    assert "cuda-12-4" in result.stderr
    assert "unhold" not in log
    assert not [line for line in log.splitlines() if " remove " in line and "-s" not in line]


def test_default_is_set_in_manual_mode() -> None:
    facts = setup_fact(
        [],
        cuda={"status": "auto", "value": "/usr/local/cuda-12.8"},
        cuda_12={"status": "manual", "value": "/usr/local/cuda-12.8"},
    )
    commands, _ = commands_of(default_toolkit, facts, release="12.8")
    assert commands == ["update-alternatives --set cuda /usr/local/cuda-12.8"]


def test_default_change_sets_both_links() -> None:
    facts = setup_fact(
        [],
        cuda={"status": "manual", "value": "/usr/local/cuda-12.8"},
        cuda_12={"status": "manual", "value": "/usr/local/cuda-12.8"},
    )
    commands, _ = commands_of(default_toolkit, facts, release="12.4")
    assert commands == [
        "update-alternatives --set cuda /usr/local/cuda-12.4",
        "update-alternatives --set cuda-12 /usr/local/cuda-12.4",
    ]


def test_default_noop() -> None:
    right = {"status": "manual", "value": "/usr/local/cuda-12.4"}
    commands, noops = commands_of(
        default_toolkit, setup_fact([], cuda=right, cuda_12=right), release="12.4"
    )
    assert commands == []
    assert noops == ["/usr/local/cuda is CUDA 12.4 (/usr/local/cuda-12.4, manual)"]


def state(data: dict[str, Any]) -> Any:
    desired, problems = build_desired_state(data)
    assert problems == []
    return desired


def test_default_release_is_declared_or_newest() -> None:
    assert default_release(state({"cuda": {"versions": ["12.8", "12.4"]}}).cuda) == "12.8"
    assert default_release(state({"cuda": {"versions": ["12.9", "13.0"]}}).cuda) == "13.0"
    both = {"versions": ["12.4", "12.8"], "default": "12.4"}
    assert default_release(state({"cuda": both}).cuda) == "12.4"
    assert default_release(state({}).cuda) is None


def test_libnccl2_needs_a_cuda_release() -> None:
    assert nccl_version_suffix(state({"cuda": {"versions": ["12.4", "12.8"]}})) == "+cuda12.8"
    with fake_host({}), pytest.raises(DeployError, match=r"declare cuda\.versions"):
        nccl_version_suffix(state({"nccl": {"install_libnccl": True}}))


def test_profile_puts_cuda_on_path_once(tmp_path: Path) -> None:
    profile = tmp_path / "gpunode-cuda.sh"
    profile.write_text(render_profile())
    result = subprocess.run(
        ["sh", "-c", f'. {profile}; . {profile}; echo "$PATH"'],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "/usr/local/cuda/bin:/usr/bin:/bin"


# --- apt only when something is to change ------------------------------------------------------


def test_packages_at_their_version_are_checked_with_dpkg_alone() -> None:
    # No AptPackagePolicy in the table: asking apt would fail the test.
    dpkg = {DpkgPackageState: dpkg_of({"libnccl2": package("2.26.2-1+cuda12.8", held=True)})}
    commands, noops = commands_of(
        held_packages, dpkg, packages=["libnccl2"], repository_url=CUDA_URL,
        version_suffix="+cuda12.8",
    )  # fmt: skip
    assert (commands, noops) == ([], ["libnccl2 2.26.2-1+cuda12.8 installed and held"])
    with fake_host(dpkg):
        require_offered(["libnccl2"], CUDA_URL, version_suffix="+cuda12.8")


def test_a_package_to_install_asks_apt_what_is_offered() -> None:
    facts = policy(libnccl2=package("2.25.1-1+cuda12.4", versions=offered("2.26.2-1+cuda12.8")))
    with fake_host(facts), pytest.raises(NodeRefused, match="no version ending in"):
        require_offered(["libnccl2"], CUDA_URL, version_suffix="+cuda12.9")


def test_dpkg_state_fact_names_every_requested_package() -> None:
    fact = DpkgPackageState().process(
        [
            "@requested libnccl2",
            "@requested cuda-toolkit-12-4",
            "libnccl2 hold installed 2.26.2-1+cuda12.8",
        ]
    )
    assert fact == {
        "libnccl2": {"installed": "2.26.2-1+cuda12.8", "held": True},
        "cuda-toolkit-12-4": {"installed": None, "held": False},
    }


def test_dpkg_state_fact_command_reads_this_machines_dpkg() -> None:
    command = DpkgPackageState().command(["dpkg", "no-such-package-gpunode"])
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
    fact = DpkgPackageState().process(done.stdout.splitlines())
    assert set(fact) == {"dpkg", "no-such-package-gpunode"}
    assert fact["dpkg"]["installed"] and fact["dpkg"]["held"] is False
    assert fact["no-such-package-gpunode"] == {"installed": None, "held": False}


def test_indexed_repositories_fact_keeps_urls_only() -> None:
    lines = [f"{CUDA_URL}/", f"{DEBIAN_URL}/", f"{DEBIAN_URL}/", "W: no URL", "", "x://"]
    assert AptIndexedRepositories().process(lines) == sorted([CUDA_URL, DEBIAN_URL])

"""The stand-in catalogue is generated from lab/standin/world.toml, and says where it comes from.

The relations every built package declares must be exactly the ones the data records for the
real package, minus and plus the departures the data lists (with their reason); a relation from
anywhere else fails ``test_every_package_declares_only_its_recorded_relations``. The checks here
recompute what the data says on their own (``str.format_map`` of the template with the
release's placeholders) rather than calling the generator's helpers.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from lab.standin import daemon
from lab.standin.catalogue import (
    CONTAINER_TOOLKIT_VERSIONS,
    CUDA_TOOLKITS,
    DCGM4_RELEASES,
    DRIVER_BRANCHES,
    DRIVER_VERSIONS,
    FAMILY_REPOSITORY,
    RELATION_FIELDS,
    WORLD,
    Generated,
    catalogue,
    generated,
)

DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# Names a real package depends on that no lab node has: each must be a listed departure.
LAB_ABSENT = re.compile(
    r"^(dkms|xserver-.*|libgl.*|libegl.*|libgles.*|build-essential|libibumad.*)$"
)


def _fill(items: list[str], context: dict[str, str]) -> list[str]:
    return [item.format_map(context) for item in items]


def relation_problems(items: list[Generated]) -> list[str]:
    """Every way a built package's relations differ from its template's recorded ones."""
    problems = []
    for item in items:
        template, context, package = item.template, item.context, item.package
        departures = template.get("departures", {})
        for name in RELATION_FIELDS:
            real = _fill(template.get(name, []), context)
            change = departures.get(name, {})
            removed = _fill(change.get("remove", []), context)
            added = _fill(change.get("add", []), context)
            for item_removed in removed:
                if item_removed not in real:
                    problems.append(
                        f"{package.name} {package.version}: departure removes {item_removed!r} "
                        f"that the real {name} does not have"
                    )
            expected = [entry for entry in real if entry not in removed] + added
            built = list(getattr(package, name))
            if built != expected:
                problems.append(
                    f"{package.name} {package.version} {name}: built {built}, "
                    f"recorded (with departures) {expected}"
                )
    return problems


def test_every_package_declares_only_its_recorded_relations():
    assert relation_problems(generated()) == []


def test_a_relation_the_data_does_not_record_is_caught():
    items = generated()
    first = next(item for item in items if item.package.name == "nvidia-driver-cuda")
    sneaked = dataclasses.replace(
        first.package, depends=(*first.package.depends, "nvidia-driver (= 595.91.07-1)")
    )
    dropped = dataclasses.replace(first.package, provides=("nvidia-driver-cuda-any",))
    problems = relation_problems(
        [dataclasses.replace(first, package=sneaked), dataclasses.replace(first, package=dropped)]
    )
    assert len(problems) == 2
    assert "depends" in problems[0] and "nvidia-driver (= 595.91.07-1)" in problems[0]
    assert "provides" in problems[1]


def test_a_departure_of_a_relation_the_real_package_lacks_is_caught():
    item = next(item for item in generated() if item.package.name == "nvidia-kernel-dkms")
    template = {**item.template, "departures": {"depends": {"remove": ["dkms", "no-such"]}}}
    problems = relation_problems([dataclasses.replace(item, template=template)])
    assert problems == [
        f"nvidia-kernel-dkms {item.package.version}: departure removes 'no-such' that the real "
        "depends does not have"
    ]


def test_the_catalogue_is_exactly_the_generated_packages():
    items = generated()
    assert catalogue() == [item.package for item in items]
    for item in items:
        assert item.package.name == item.template["name"].format_map(item.context)
        assert item.package.summary == item.template["summary"].format_map(item.context)
        assert item.package.section == item.template.get("section", "utils")


def test_every_template_names_its_source_or_why_it_is_assumed():
    sources = WORLD["sources"]
    ids = [template["id"] for template in WORLD["package"]]
    assert len(ids) == len(set(ids)), "template ids must be unique"
    for template in WORLD["package"]:
        source = template["source"]
        assert source == "assumed" or source in sources, template["id"]
        if source == "assumed":
            assert template.get("assumed", "").strip(), f"{template['id']}: assumed, but why?"
        assert template["family"] in FAMILY_REPOSITORY, template["id"]
        assert set(template.get("departures", {})) <= {*RELATION_FIELDS, "why"}, template["id"]
    for section in ("driver_branch", "cuda_toolkit", "dcgm4"):
        for entry in WORLD[section]:
            assert entry["source"] in sources, entry
    for section in ("dcgm3", "container_toolkit", "nccl", "nvlsm", "repositories"):
        assert WORLD[section]["source"] in sources, section


def test_every_source_says_when_it_was_seen_and_what_it_says():
    for key, source in WORLD["sources"].items():
        assert DATE.match(source["seen"]), key
        assert source["what"].strip(), key
        assert source["authority"] in ("nvidia", "secondary"), key
        if "url" in source:
            assert source["url"].startswith("https://"), key
        else:
            assert source.get("via") or key == "legacy-catalogue", f"{key}: no URL and no via"


def test_every_departure_says_why_and_what_the_lab_lacks_is_always_a_departure():
    for template in WORLD["package"]:
        departures: dict[str, Any] = template.get("departures", {})
        if departures:
            assert departures.get("why", "").strip(), template["id"]
    for package in catalogue():
        for name in RELATION_FIELDS[:2]:  # depends, recommends: what apt would fetch
            for relation in getattr(package, name):
                for alternative in relation.split("|"):
                    assert not LAB_ABSENT.match(alternative.split()[0]), (package.name, relation)


def test_architectures_are_data_and_only_built_ones_are_used():
    repositories = WORLD["repositories"]
    assert repositories["architectures"] == {"amd64": "x86_64", "arm64": "sbsa"}
    built = set(repositories["built_architectures"])
    assert {package.architecture for package in catalogue()} <= built | {"all"}


# --- the two eras --------------------------------------------------------------------------------


def _by_release(name: str) -> dict[str, Any]:
    return {p.version: p for p in catalogue() if p.name == name}


def test_branch_suffixed_metapackages_end_with_580_and_fabric_manager_with_570():
    names = {package.name for package in catalogue()}
    for branch in DRIVER_BRANCHES:
        suffixed_metas = int(branch.branch) <= 580
        suffixed_fm = int(branch.branch) <= 570
        assert (f"cuda-drivers-{branch.branch}" in names) is suffixed_metas, branch
        assert (f"nvidia-fabricmanager-{branch.branch}" in names) is suffixed_fm, branch
        assert (f"libnvidia-nscq-{branch.branch}" in names) is suffixed_fm, branch
        assert (f"nvidia-driver-pinning-{branch.branch}" in names) is (int(branch.branch) >= 580)
        cuda_drivers = _by_release("cuda-drivers")
        for release in branch.releases:
            depends = cuda_drivers[f"{release}-1"].depends
            if suffixed_metas:
                assert depends == (f"cuda-drivers-{branch.branch} (= {release}-1)",)
            else:
                assert f"nvidia-kernel-dkms (>= {release})" in depends
            if not suffixed_fm:
                for name in ("nvidia-fabricmanager", "libnvidia-nscq", "nvidia-imex"):
                    assert f"{release}-1" in _by_release(name), (name, release)
    assert not {name for name in names if re.fullmatch(r"nvidia-open-\d+", name)}


def test_the_compute_only_set_installs_without_the_desktop_driver():
    # nvidia-driver-cuda + nvidia-kernel-open-dkms (the guide's compute-only install) must not
    # reach nvidia-driver through any Depends, in any release.
    depends: dict[str, set[str]] = {}
    for package in catalogue():
        for relation in package.depends:
            depends.setdefault(package.name, set()).update(
                alternative.split()[0] for alternative in relation.split("|")
            )
    seen, todo = set(), ["nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-kernel-dkms"]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += depends.get(name, set())
    assert "nvidia-driver" not in seen
    assert "nvidia-driver-libs" not in seen


def test_the_pinning_packages_are_one_exclusive_virtual():
    pinning = [p for p in catalogue() if p.name.startswith("nvidia-driver-pinning-")]
    assert pinning
    for package in pinning:
        assert (
            package.provides == package.conflicts == package.replaces == ("nvidia-driver-pinning",)
        )
        assert package.architecture == "all"
        (preferences,) = [f for f in package.files if f.path.startswith("/etc/apt/preferences.d/")]
        branch = package.name.rsplit("-", 1)[1]
        assert f"Pin: version {branch}.*\nPin-Priority: 1000\n" in preferences.content


def test_dcgm4_and_its_exporter_come_in_the_recorded_pairs():
    exporters = _by_release("datacenter-gpu-manager-exporter")
    assert [release.exporter for release in DCGM4_RELEASES] == sorted(exporters)
    core = _by_release("datacenter-gpu-manager-4-core")
    assert sorted(core) == [release.version for release in DCGM4_RELEASES]
    for version, package in core.items():
        assert version.startswith("1:4.")
        assert "datacenter-gpu-manager" in package.conflicts
        assert {f.path for f in package.files} >= {
            "/usr/bin/nv-hostengine",
            "/lib/systemd/system/nvidia-dcgm.service",
        }
    for package in exporters.values():
        units = [f.path for f in package.files if "/systemd/" in f.path]
        assert units == ["/lib/systemd/system/nvidia-dcgm-exporter.service"]
        # Installed, not enabled (re-enabled only where the admin had it enabled), not started.
        postinst = package.scripts["postinst"]
        assert "systemctl enable" not in postinst and "deb-systemd-invoke" not in postinst
        assert "deb-systemd-helper --quiet was-enabled" in postinst


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (
            "0, GPU-aaa, NVIDIA H100 80GB HBM3, 34, 71.25, 0, 1\n"
            "1, GPU-bbb, NVIDIA H100 80GB HBM3, [N/A], 70.00, 3, 2\n",
            [
                'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-aaa",modelName="NVIDIA H100 80GB HBM3"} 34',
                'DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-bbb",modelName="NVIDIA H100 80GB HBM3"}'
                " 70",
                'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-bbb",modelName="NVIDIA H100 80GB HBM3"} 3',
                'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-aaa",modelName="NVIDIA H100 80GB HBM3"} 1',
            ],
        ),
    ],
)
def test_the_stand_in_exporter_serves_dcgm_fields_of_each_gpu(query: str, expected: list[str]):
    text = daemon.metrics_text(query)
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    for line in expected:
        assert line in samples
    # A value nvidia-smi could not give ([N/A]) is left out, not made up.
    assert not [line for line in samples if 'gpu="1"' in line and "GPU_TEMP" in line]
    assert len(samples) == 7
    assert "# TYPE DCGM_FI_DEV_GPU_TEMP gauge" in text.splitlines()


def test_the_stand_in_exporter_reads_nothing_from_garbage():
    text = daemon.metrics_text("not,a,csv\n\n")
    assert [line for line in text.splitlines() if not line.startswith("#")] == []


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def test_releases_are_listed_oldest_first_without_repeats():
    for releases in (
        DRIVER_VERSIONS,
        CONTAINER_TOOLKIT_VERSIONS,
        tuple(t.release for t in CUDA_TOOLKITS),
        tuple(r.version for r in DCGM4_RELEASES),
    ):
        assert list(releases) == sorted(set(releases), key=_key), releases


def test_every_toolkit_finds_a_driver_it_accepts_in_the_repository():
    # cuda-runtime-X-Y needs cuda-drivers (>= the release's driver): some driver must satisfy it,
    # or `apt install cuda` could not resolve.
    newest = max(DRIVER_VERSIONS, key=_key)
    for toolkit in CUDA_TOOLKITS:
        assert _key(newest) >= _key(toolkit.minimum_driver), toolkit.release

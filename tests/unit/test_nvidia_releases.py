"""NVIDIA's branch lifecycle, CUDA driver minimums and module flavours, as gpunode encodes them."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest

from gpunode import nvidia_releases as nv
from gpunode.inventory import validate_hosts
from gpunode.model import build_desired_state

TODAY = datetime.date(2026, 12, 1)


@pytest.mark.parametrize(
    ("branch", "today", "expected"),
    [
        ("570", TODAY, "driver branch 570 (production) reached its end of life in February 2026"),
        (
            "535",
            TODAY,
            "driver branch 535 (long-term support) reached its end of life in June 2026",
        ),
        ("580", TODAY, None),
        ("595", TODAY, None),
        ("580", datetime.date(2028, 6, 30), None),
        ("580", datetime.date(2028, 7, 1), "driver branch 580 (long-term support) reached its end"),
        ("590", TODAY, "driver branch 590 is a new feature branch: short-lived"),
        ("550", TODAY, "driver branch 550 is past its end of life: NVIDIA no longer lists it"),
        ("999", TODAY, "driver branch 999 is newer than gpunode's table of NVIDIA's branches"),
    ],
)
def test_lifecycle_notice_says_what_the_branch_is_today(
    branch: str, today: datetime.date, expected: str | None
) -> None:
    notice = nv.lifecycle_notice(branch, today)
    if expected is None:
        assert notice is None
    else:
        assert notice is not None and notice.startswith(expected), notice


def test_supported_branches_are_the_listed_ones_still_in_their_life() -> None:
    assert nv.supported_branches(TODAY) == ["580", "595", "620"]
    assert nv.supported_branches(datetime.date(2026, 1, 31)) == ["535", "570", "580", "595", "620"]


@pytest.mark.parametrize(
    ("release", "driver", "runs"),
    [
        ("12.8", "570.124.06", "fully"),
        ("12.8", "570.26", "fully"),
        ("12.8", "535.216.01", "minor-version compatibility"),
        ("12.0", "525.60.13", "fully"),
        ("12.4", "520.61.05", "no"),
        ("13.0", "570.195.03", "no"),
        ("13.0", "580.999", "fully"),
        ("13.3", "580.95.05", "minor-version compatibility"),
        ("13.3", "610.43.02", "fully"),
    ],
)
def test_a_cuda_release_runs_fully_through_compatibility_or_not(
    release: str, driver: str, runs: str
) -> None:
    assert nv.driver_runs(release, driver) == runs


def test_every_12_and_13_release_up_to_the_newest_table_row_is_known() -> None:
    assert nv.releases() == [
        "12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.8", "12.9",
        "13.0", "13.1", "13.2", "13.3",
    ]  # fmt: skip


def test_the_driver_table_never_goes_backwards_and_respects_its_floor() -> None:
    ordered = sorted(nv.TOOLKIT_DRIVER, key=nv.version_key)
    drivers = [nv.version_key(nv.TOOLKIT_DRIVER[release]) for release in ordered]
    assert drivers == sorted(drivers), "a newer toolkit bundles an older driver"
    for release in ordered:
        floor = nv.compatibility_floor(release)
        assert floor is not None
        assert nv.version_key(nv.TOOLKIT_DRIVER[release]) >= nv.version_key(floor), release


@pytest.mark.parametrize(
    ("model", "architecture"),
    [
        ("NVIDIA B200", "blackwell"),
        ("NVIDIA GB200", "blackwell"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "blackwell"),
        ("NVIDIA H100 80GB HBM3", "other"),
        ("NVIDIA A100-SXM4-80GB", "other"),
        ("NVIDIA L40S", "other"),
        ("Tesla V100-SXM2-32GB", "pre-turing"),
        ("Tesla P40", "pre-turing"),
        ("Tesla P4", "pre-turing"),
        ("NVIDIA GB2000 (not a product)", "other"),
    ],
)
def test_architecture_of_a_model_name(model: str, architecture: str) -> None:
    assert nv.architecture_of(model) == architecture


def test_a_valid_state_carries_its_advisories_for_the_operator() -> None:
    state, problems = build_desired_state(
        {
            "nvidia_driver": {"source": "nvidia", "branch": "535", "version": "535.216.01-1"},
            "cuda": {"versions": ["12.2", "12.8"]},
        }
    )
    assert problems == []
    advisories = state.advisories(TODAY)
    assert [(a.key, a.value) for a in advisories] == [
        ("nvidia_driver.branch", "535"),
        ("cuda.versions[1]", "12.8"),
    ]
    assert "only through CUDA minor-version compatibility" in advisories[1].message
    assert "bundles 570.26" in advisories[1].message


def test_a_current_long_term_branch_with_its_cuda_has_nothing_to_say() -> None:
    state, problems = build_desired_state(
        {"nvidia_driver": {"source": "nvidia", "branch": "580"}, "cuda": {"versions": ["13.0"]}}
    )
    assert problems == [] and state.advisories(TODAY) == []


def test_the_fleet_keeps_each_hosts_notes_and_they_render_safely() -> None:
    fleet = validate_hosts(
        "inv.py",
        [
            ("old-1", {"nvidia_driver": {"source": "nvidia", "branch": "570"}}),
            ("new-1", {"nvidia_driver": {"source": "nvidia", "branch": "580"}}),
        ],
        today=TODAY,
    )
    assert fleet.notes["new-1"] == []
    [note] = fleet.notes["old-1"]
    assert note.startswith("inv.py: old-1: note: nvidia_driver.branch = '570': driver branch 570")


FIXTURES = Path(__file__).parent.parent / "fixtures"


def _reported_pairs() -> list[tuple[str, str, str]]:
    """(driver, CUDA version, file) as real nvidia-smi output reports them: the XML captures'
    <driver_version>/<cuda_version> and the text captures' "Driver Version: ... CUDA
    Version: ..." header (tests/fixtures/PROVENANCE.md)."""
    pairs = []
    for path in sorted((FIXTURES / "nvidia-smi-xml").glob("*.xml")):
        text = path.read_text(errors="replace")
        driver = re.search(r"<driver_version>([^<]+)</driver_version>", text)
        cuda = re.search(r"<cuda_version>([^<]+)</cuda_version>", text)
        if driver and cuda:
            pairs.append((driver[1], cuda[1], path.name))
    for path in sorted((FIXTURES / "nvidia-smi-capture").glob("*.txt")):
        header = re.search(r"Driver Version: ([0-9.]+) +CUDA Version: ([0-9.]+)", path.read_text())
        if header:
            pairs.append((header[1], header[2], path.name))
    return pairs


def test_the_cuda_version_a_driver_reports_matches_every_real_capture() -> None:
    # The table starts at CUDA 12.0: drivers older than its 525.60.13 report 11.x or less.
    pairs = [
        pair for pair in _reported_pairs() if nv.version_key(pair[0]) >= nv.version_key("525.60.13")
    ]
    assert len(pairs) >= 5, pairs
    for driver, cuda, name in pairs:
        assert nv.driver_cuda_version(driver) == cuda, name
    assert nv.driver_cuda_version("418.43") is None

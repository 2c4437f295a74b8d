"""Fixtures the unit modules share."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pytest

from lab import aptrepo


@dataclasses.dataclass
class BuiltRepository:
    repo: aptrepo.RepoInfo
    # The GNUPGHOMEs of builds in the temporary directory before this one: a build that left
    # its own behind (private keys) shows as a new one.
    gnupg_homes_before: set[str]


def gnupg_homes() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob(f"{aptrepo.GNUPG_PREFIX}*")}


@pytest.fixture(scope="session")
def built_repository(tmp_path_factory: pytest.TempPathFactory) -> BuiltRepository:
    """The lab's stand-in repositories as `gpunode lab up` builds them, built once for the
    unit tier (seconds of gpg and dpkg-deb each time): the modules that only read a build
    share it; a test that changes a build makes its own."""
    before = gnupg_homes()
    return BuiltRepository(aptrepo.build_repository(tmp_path_factory.mktemp("aptrepo")), before)

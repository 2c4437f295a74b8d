"""Freshness facts: a change written but not yet taken effect, read from real files."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from facts.freshness import FileNewerThan, UnitOlderThanFile, UnitsNeedDaemonReload


def read(fact: object, **kwargs: object) -> object:
    command = fact.command(**kwargs)  # type: ignore[attr-defined]
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    return fact.process(output.stdout.splitlines())  # type: ignore[attr-defined]


def test_a_file_written_after_the_cache_is_newer(tmp_path: Path) -> None:
    config, cache = tmp_path / "cuda.conf", tmp_path / "ld.so.cache"
    config.write_text("/usr/local/cuda/lib64\n")
    cache.write_text("cache")
    os.utime(cache, (1_000_000, 1_000_000))
    assert read(FileNewerThan(), path=str(config), reference=str(cache)) is True
    os.utime(config, (500_000, 500_000))
    assert read(FileNewerThan(), path=str(config), reference=str(cache)) is False
    assert read(FileNewerThan(), path=str(tmp_path / "none"), reference=str(cache)) is False


def test_a_unit_that_is_not_running_is_not_outdated(tmp_path: Path) -> None:
    config = tmp_path / "daemon.json"
    config.write_text("{}")
    unit = "gpunode-no-such-unit.service"
    assert read(UnitOlderThanFile(), unit=unit, path=str(config)) is False


def test_systemd_saying_yes_for_any_unit_means_a_reload() -> None:
    fact = UnitsNeedDaemonReload()
    assert fact.process(["no", "yes"]) is True
    assert fact.process(["no", "no"]) is False
    assert "NeedDaemonReload" in fact.command(units=["a.service", "a.timer"])

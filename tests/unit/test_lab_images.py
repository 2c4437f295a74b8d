"""Labs side by side build a missing node image once: the first builds, the others wait for it
and use it (lab.build_once), with real processes contending for the real lock."""

from __future__ import annotations

import multiprocessing
import os
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path

from lab import build_once

CONTENDERS = 3


def _contend(lock: Path, image: Path, log: Path, start: Barrier) -> None:
    def built() -> bool:
        return image.exists()

    def build() -> None:
        with log.open("a") as record:
            record.write(f"{os.getpid()}\n")
        # Long enough for every other contender to find no image and ask for the lock.
        time.sleep(0.5)
        image.write_text("built")

    start.wait()
    build_once(lock, built, build)


def test_labs_that_all_lack_an_image_build_it_once(tmp_path: Path) -> None:
    lock, image, log = tmp_path / "locks" / "image-x.lock", tmp_path / "image", tmp_path / "log"
    context = multiprocessing.get_context("fork")
    start = context.Barrier(CONTENDERS)
    processes = [
        context.Process(target=_contend, args=(lock, image, log, start)) for _ in range(CONTENDERS)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    assert image.read_text() == "built"
    assert len(log.read_text().splitlines()) == 1


def test_an_image_already_built_is_not_built_again(tmp_path: Path) -> None:
    calls: list[str] = []
    assert build_once(tmp_path / "l.lock", lambda: True, lambda: calls.append("built")) is False
    assert calls == []
    assert build_once(tmp_path / "l.lock", lambda: False, lambda: calls.append("built")) is True
    assert calls == ["built"]

"""The gpunode checkout an inventory belongs to: where its ``facts/`` and ``roles/`` come from.

``facts`` and ``roles`` are not installed packages: pyinfra imports them from the checkout
(its deploy files put their checkout on ``sys.path``). ``gpunode drift`` and the other
commands find that checkout from the inventory's own path, so they work from any directory,
and say where they looked when there is none.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpunode.control.exits import ConfigurationError

# What makes a directory a gpunode checkout: the folders a deploy imports from and
# pyinfra's configuration file.
MARKERS = ("deploys", "roles", "facts", "config.py")


def is_checkout(directory: Path) -> bool:
    return (
        all((directory / name).exists() for name in MARKERS[:3])
        and (directory / "config.py").is_file()
    )


def package_checkout() -> Path:
    """The directory the running ``gpunode`` package sits in (an editable install's
    checkout; a plain install's site-packages, which is no checkout)."""
    return Path(__file__).resolve().parents[2]


def find_checkout(inventory: str | Path) -> Path:
    """The checkout holding ``inventory`` (its nearest ancestor with ``deploys/``, ``roles/``,
    ``facts/`` and ``config.py``), else the checkout of the running gpunode (an inventory
    kept apart from the code); ConfigurationError naming every directory looked in."""
    looked: list[Path] = []
    for directory in [*Path(inventory).resolve().parents, package_checkout()]:
        if directory in looked:
            continue
        looked.append(directory)
        if is_checkout(directory):
            return directory
    raise ConfigurationError(
        f"no gpunode checkout (a directory holding {', '.join(MARKERS)}) for {inventory}; "
        f"looked in {', '.join(str(d) for d in looked)}"
    )


def use_checkout(checkout: Path) -> None:
    """Import ``facts`` and ``roles`` from ``checkout`` first, as its deploy files do."""
    path = str(checkout)
    if path in sys.path:
        sys.path.remove(path)
    sys.path.insert(0, path)

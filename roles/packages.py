"""Debian packages a role needs, installed once and then left alone."""

from __future__ import annotations

from pyinfra import host
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt


def install_packages(name: str, packages: list[str], no_recommends: bool = False) -> None:
    """apt packages present; the package lists are refreshed (at most daily) only when one is
    missing, so a converged node makes no change and --dry predicts the run, and a node whose
    lists were never fetched (a fresh image) still installs what it lacks.

    + name: the operation's name
    + packages: Debian package names
    + no_recommends: install without the packages' recommends
    """
    installed = host.get_fact(DebPackages)
    missing = [package for package in packages if package not in installed]
    apt.packages(
        name=name,
        packages=packages,
        update=bool(missing),
        cache_time=86400,
        no_recommends=no_recommends,
    )

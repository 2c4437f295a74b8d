"""roles.packages: a role's Debian packages installed once, the package lists refreshed only
when one is missing (so a converged node, or a lab VM whose image has them, makes no change)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyinfra.facts.deb import DebPackages

import roles.packages
from roles.packages import install_packages

from .fakehost import fake_host


@pytest.fixture
def apt_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(roles.packages.apt, "packages", lambda **kwargs: calls.append(kwargs))
    return calls


def test_installed_packages_refresh_no_package_lists(apt_calls: list[dict[str, Any]]) -> None:
    with fake_host({DebPackages: {"libpam-passwdqc": ["2.0.2-1+b1"], "xfsprogs": ["6.1.0-1"]}}):
        install_packages("Checks", ["libpam-passwdqc", "xfsprogs"])
    assert apt_calls == [
        {
            "name": "Checks",
            "packages": ["libpam-passwdqc", "xfsprogs"],
            "update": False,
            "cache_time": 86400,
            "no_recommends": False,
        }
    ]


def test_a_missing_package_refreshes_the_lists_at_most_daily(
    apt_calls: list[dict[str, Any]],
) -> None:
    with fake_host({DebPackages: {"xfsprogs": ["6.1.0-1"]}}):
        install_packages("Checks", ["libpam-passwdqc", "xfsprogs"])
    (call,) = apt_calls
    assert (call["update"], call["cache_time"]) == (True, 86400)


def test_the_audit_roles_install_through_it_so_a_fresh_image_gets_its_lists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """AIDE, auditd, lynis, the audit tools and ClamAV: on a node whose package lists were
    never fetched and whose image already holds the kernel role's passwdqc, nothing else
    refreshes them."""
    import roles.audit
    import roles.auditd
    import roles.lynis
    import roles.malware_scan

    for module in (roles.audit, roles.auditd, roles.lynis, roles.malware_scan):
        assert module.install_packages is install_packages, module.__name__
        assert "apt.packages(" not in Path(str(module.__file__)).read_text(), module.__name__

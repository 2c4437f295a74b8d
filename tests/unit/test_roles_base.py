"""Base role pieces: the apt proxy file, the mirror check and dpkg's unfinished work."""

from __future__ import annotations

import subprocess

import pytest

from facts.apt import DpkgInterrupted, MirrorReachability
from roles.base import mirror_problems, render_proxy


def test_proxy_file_names_the_proxy_and_each_direct_host() -> None:
    assert render_proxy("http://cache:3142", ("10.0.0.1", "mirror.internal")) == (
        'Acquire::http::Proxy "http://cache:3142";\n'
        'Acquire::http::Proxy::10.0.0.1 "DIRECT";\n'
        'Acquire::http::Proxy::mirror.internal "DIRECT";\n'
    )


def test_mirror_check_reports_apts_own_reason_per_url() -> None:
    refused = "http://127.0.0.1:9/debian/dists/bookworm/InRelease"
    fact = MirrorReachability()
    command = fact.command(urls=[refused], proxy="http://127.0.0.1:8/", direct_hosts=["127.0.0.1"])
    assert "-o Acquire::http::Proxy::127.0.0.1=DIRECT" in command
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    found = fact.process(output.stdout.splitlines())
    # Reached directly (the proxy on port 8 would have been refused as well, but named so).
    assert found[refused] is not None and "127.0.0.1:9" in found[refused]
    assert mirror_problems(found, [refused], "node-1") == [
        f"node-1: package mirror {refused} is unreachable from the node: {found[refused]}"
    ]
    assert mirror_problems({refused: None}, [refused], "node-1") == []


def test_dpkg_journal_entries_and_audit_lines_are_unfinished_work() -> None:
    fact = DpkgInterrupted()
    assert fact.process(["journal: 0001", "", "The following packages are half configured"]) == [
        "journal: 0001",
        "The following packages are half configured",
    ]
    # This machine's dpkg is consistent: the real command reports nothing.
    output = subprocess.run(["sh", "-c", fact.command()], capture_output=True, text=True)
    assert fact.process(output.stdout.splitlines()) == []


def test_proxy_file_never_gets_a_second_line() -> None:
    # apt.conf has no escape; validation keeps quotes and ';' out of the URL and the
    # renderer refuses a line break.
    with pytest.raises(ValueError, match="control character"):
        render_proxy('http://proxy:3142/\nAPT::Update::Pre-Invoke {"touch /tmp/PWNED";};')

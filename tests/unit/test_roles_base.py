"""Base role pieces: the apt proxy file, the mirror check and dpkg's unfinished work."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from facts.apt import DpkgInterrupted, MirrorReachability
from roles.base import DPKG_LOCK_WAIT_S, DPKG_RECOVER, mirror_problems, render_proxy


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


def _recovery_with_fake_tools(
    tmp_path: Path, dpkg_script: str
) -> tuple[subprocess.CompletedProcess, str]:
    """DPKG_RECOVER run by a real shell, with dpkg, apt-get and sleep stood in on PATH: each
    writes what it was called with to a log the test reads."""
    tools = tmp_path / "bin"
    tools.mkdir()
    log = tmp_path / "calls"
    (tools / "dpkg").write_text(f'#!/bin/sh\necho "dpkg $*" >> {log}\n{dpkg_script}\n')
    (tools / "apt-get").write_text(f'#!/bin/sh\necho "apt-get $*" >> {log}\n')
    (tools / "sleep").write_text(f'#!/bin/sh\necho "sleep $*" >> {log}\n')
    for tool in tools.iterdir():
        tool.chmod(0o755)
    result = subprocess.run(
        ["sh", "-c", DPKG_RECOVER],
        capture_output=True, text=True, env={"PATH": f"{tools}:/usr/bin:/bin"},
    )  # fmt: skip
    return result, log.read_text() if log.exists() else ""


LOCKED = (
    'echo "dpkg: error: dpkg frontend lock was locked by another process with pid 621" >&2; exit 2'
)


def test_recovery_waits_while_another_package_change_holds_dpkgs_lock(tmp_path: Path) -> None:
    # Locked twice (the cut-off run's apt still finishing), then dpkg finishes the rest.
    count = tmp_path / "count"
    script = (
        f"n=$(cat {count} 2>/dev/null || echo 0); echo $((n + 1)) > {count}; "
        f'if [ "$n" -lt 2 ]; then {LOCKED}; fi; echo "Setting up nvidia-driver (580.95.05-1) ..."'
    )
    result, calls = _recovery_with_fake_tools(tmp_path, script)
    assert result.returncode == 0, result.stderr
    assert calls.splitlines() == [
        "dpkg --configure -a --force-confdef --force-confold",
        "sleep 1",
        "dpkg --configure -a --force-confdef --force-confold",
        "sleep 1",
        "dpkg --configure -a --force-confdef --force-confold",
        f"apt-get -y -o DPkg::Lock::Timeout={DPKG_LOCK_WAIT_S} -f install",
    ]
    assert "Setting up nvidia-driver" in result.stdout


def test_recovery_fails_with_dpkgs_words_on_any_other_error(tmp_path: Path) -> None:
    script = 'echo "dpkg: error processing package nvidia-kernel-dkms (--configure)" >&2; exit 1'
    result, calls = _recovery_with_fake_tools(tmp_path, script)
    assert result.returncode == 1
    assert "error processing package nvidia-kernel-dkms" in result.stderr
    assert "apt-get" not in calls and "sleep" not in calls


def test_recovery_gives_up_when_the_lock_is_never_released(tmp_path: Path) -> None:
    result, calls = _recovery_with_fake_tools(tmp_path, LOCKED)
    assert result.returncode == 1
    assert "locked by another process with pid 621" in result.stderr
    assert calls.count("sleep 1") == DPKG_LOCK_WAIT_S
    assert "apt-get" not in calls

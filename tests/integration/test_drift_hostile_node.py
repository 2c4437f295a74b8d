"""A lab node whose tool prints hostile output cannot blind or hang the drift check of the fleet.

A stand-in for ibstat (the InfiniBand tool the check runs, found before the lab's hardware
double: /usr/local/sbin leads sudo's secure_path) prints a byte that is not UTF-8 followed by
more output, floods, or stalls. Every time, the other node's findings are reported as they
are without it, and the hostile node is reported: checked, the byte in its findings, or not
checked with the reason. A hang is a failure of the subprocess's (generous) timeout.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from lab import Lab, LabNode

from .conftest import GPUNODE, ROOT, ssh

pytestmark = pytest.mark.lab

STAND_IN = "/usr/local/sbin/ibstat"
STALL_PID = "/run/gpunode-test-stalled-ibstat.pid"
# A whole check of two lab nodes takes seconds; a check that has not ended by then hangs.
HANG_S = 300
# The stalled node's deadline: long enough for the other node's answer on a loaded machine.
HOST_TIMEOUT_S = 60

BAD_BYTE_LINE = r"printf 'hostile \377 byte\n'"
STAND_INS = {
    # Old gpunode lost the node: its reader died at the byte, the output looked cut short.
    "bad-byte-then-a-little": f"{BAD_BYTE_LINE}\nseq 1 100",
    # ... and with more than the SSH window after the byte, the whole check hung.
    "bad-byte-then-3-MiB": f"{BAD_BYTE_LINE}\nseq -f 'more output after the byte: line %g' 1 90000",
    # 40 MB: more than a node's answer is read (gpunode.drift.gather.HOST_LIMITS).
    "flood": "yes 'a flood of output, line after line' | head -c 40000000",
    "stall": f"echo begin\necho $$ > {STALL_PID}\nexec sleep 900",
}


def sudo(lab: Lab, node: LabNode, command: str) -> str:
    result = ssh(lab, node, f"sudo sh -c {shlex.quote(command)}")
    assert result.returncode == 0, result.stderr
    return result.stdout


def drift_json(*args: str) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run(
        [GPUNODE, "drift", "inventories/lab.py", "--json", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    return done.returncode, json.loads(done.stdout), done.stderr


def finding_ids(report: dict[str, Any], host: str) -> set[tuple[str, Any]]:
    return {(f["id"], f["expected"]) for f in report["findings"] if f["host"] == host}


@pytest.fixture(scope="module")
def baseline(lab_nodes: list[LabNode]) -> dict[str, Any]:
    """The two nodes' findings as they are, before any node turns hostile."""
    code, report, err = drift_json()
    assert sorted(report["checked_hosts"]) == sorted(n.name for n in lab_nodes[:2]), err
    assert code in (0, 1), err
    return report


@pytest.fixture
def hostile(lab: Lab, lab_nodes: list[LabNode], request: pytest.FixtureRequest) -> Iterator[str]:
    node = lab_nodes[0]
    script = "#!/bin/sh\n" + STAND_INS[request.param] + "\n"
    sudo(lab, node, f"printf %s {shlex.quote(script)} > {STAND_IN} && chmod 755 {STAND_IN}")
    try:
        yield request.param
    finally:
        sudo(lab, node, f"rm -f {STAND_IN}")
        # The stalled stand-in, which the check stopped waiting for, by the pid it wrote.
        sudo(lab, node, f"[ ! -e {STALL_PID} ] || kill $(cat {STALL_PID}) || true; "
                        f"rm -f {STALL_PID}")  # fmt: skip


@pytest.mark.parametrize("hostile", sorted(STAND_INS), indirect=True)
def test_a_hostile_node_is_reported_and_the_others_findings_still_are(
    hostile: str, baseline: dict[str, Any], lab_nodes: list[LabNode]
) -> None:
    bad, other = lab_nodes[0].name, lab_nodes[1].name
    # The stall's deadline is shortened (the default is minutes); the others need none.
    code, report, err = drift_json(
        *(["--host-timeout", str(HOST_TIMEOUT_S)] if hostile == "stall" else [])
    )

    assert other in report["checked_hosts"], err
    assert finding_ids(report, other) == finding_ids(baseline, other)
    if hostile.startswith("bad-byte"):
        # Checked: the byte is the ibstat section's problem, shown, never a lost node.
        assert bad in report["checked_hosts"], (report["unreachable"], err)
        shown = [f["found"] for f in report["findings"] if f["host"] == bad]
        assert any("hostile \ufffd byte" in found for found in shown), shown
        assert code == 1
    else:
        assert bad not in report["checked_hosts"]
        why = report["unreachable"][bad]
        if hostile == "flood":
            assert why.startswith("answered more than 8388608 bytes"), why
        else:
            assert why.startswith(f"no whole answer within {HOST_TIMEOUT_S} s"), why
        assert code == 1

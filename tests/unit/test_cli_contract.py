"""Every gpunode command keeps one exit-status contract (0 clean, 1 findings or failed hosts,
2 usage or configuration error, 130 interrupted), prints a JSON document with --json whatever
happened, and ends without a traceback on a closed pipe or Ctrl-C."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpunode import cli, rollout
from gpunode.cli import build_parser, main
from gpunode.drift.findings import DriftResult, Finding, Severity
from gpunode.drift.output import render_table
from gpunode.schema import edit_distance, unknown_key

ROOT = Path(__file__).resolve().parents[2]


def gpunode(*args: str, cwd: Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """The real command line, in a process of its own (drift's gevent patches included)."""
    return subprocess.run(
        [sys.executable, "-m", "gpunode.cli", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120, **kwargs,  # type: ignore[call-overload]
    )  # fmt: skip


@pytest.mark.parametrize(
    "command",
    [
        ["validate", "{missing}"],
        ["drift", "{missing}"],
        ["rollout", "{missing}", "deploys/gpu_node.py", "--dry"],
    ],
)
def test_a_missing_inventory_is_a_configuration_error_not_a_finding(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nowhere.py")
    assert main([part.format(missing=missing) for part in command]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"gpunode {command[0]}: no inventory file {missing}\n"
    assert captured.out == ""


@pytest.mark.parametrize("command", ["validate", "drift"])
def test_json_errors_are_a_json_document_ending_in_a_newline(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nowhere.py")
    assert main([command, missing, "--json"]) == 2
    out = capsys.readouterr().out
    assert out.endswith("}\n")
    assert json.loads(out) == {"error": f"no inventory file {missing}", "exit_code": 2}


def test_a_usage_error_is_2_and_with_json_still_a_document(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["drift", "--json"]) == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out)["error"] == "the following arguments are required: inventory"
    assert "usage: gpunode drift" in captured.err
    assert main(["drift", "inventories/lab.py", "--host-timeout", "0"]) == 2
    assert "--host-timeout: '0': seconds" in capsys.readouterr().err


def test_invalid_data_is_2_for_validate_and_drift_with_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = tmp_path / "fleet.py"
    inventory.write_text('h100_nodes = [("gpu-1", {"sshd": {"prot": 22}})]\n')
    assert main(["validate", str(inventory)]) == 2
    assert "sshd.prot = 22: unknown key (did you mean 'port'?)" in capsys.readouterr().err
    assert main(["validate", str(inventory), "--json"]) == 2
    document = json.loads(capsys.readouterr().out)
    assert document["valid"] is False and document["exit_code"] == 2
    assert any("sshd.prot" in line for line in document["problems"])
    # drift refuses the inventory before it reaches any host (gpu-1 does not resolve)
    assert main(["drift", str(inventory), "--json"]) == 2
    assert "sshd.prot" in json.loads(capsys.readouterr().out)["error"]


def test_an_inventory_that_refuses_itself_or_does_not_load_is_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refusing = tmp_path / "refusing.py"
    refusing.write_text('raise SystemExit("no lab nodes; run `gpunode lab up` first")\n')
    assert main(["validate", str(refusing)]) == 2
    assert f"inventory {refusing}: no lab nodes" in capsys.readouterr().err
    broken = tmp_path / "broken.py"
    broken.write_text("hosts = [undefined_name]\n")
    assert main(["drift", str(broken)]) == 2
    assert "NameError: name 'undefined_name' is not defined" in capsys.readouterr().err
    assert main(["validate", str(tmp_path)]) == 2
    assert "is not a readable file" in capsys.readouterr().err


def test_validate_json_of_a_valid_inventory(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    inventory = tmp_path / "fleet.py"
    inventory.write_text('h100_nodes = [("gpu-1", {})]\n')
    assert main(["validate", str(inventory), "--json"]) == 0
    out = capsys.readouterr().out
    assert out.endswith("}\n")
    assert json.loads(out)["hosts"] == ["gpu-1"]
    assert main(["validate", str(inventory)]) == 0
    assert capsys.readouterr().out == f"{inventory}: 1 host, desired state valid\n"


def test_drift_json_of_an_unreachable_host_from_another_directory(tmp_path: Path) -> None:
    """From a directory that is no checkout (no facts/ beside it): the inventory's checkout
    gives the facts. A host nobody answers for is a failed host: 1, and the report says why,
    ending with a newline."""
    inventory = tmp_path / "fleet.py"
    inventory.write_text(
        'h100_nodes = [("ghost", {"ssh_hostname": "127.0.0.1", "ssh_port": 1, '
        '"ssh_connect_retries": 0})]\n'
    )
    done = gpunode("drift", str(inventory), "--json", cwd=tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stderr
    assert done.stdout.endswith("}\n")
    report = json.loads(done.stdout)
    assert list(report["unreachable"]) == ["ghost"] and report["exit_code"] == 1
    table = gpunode("drift", str(inventory), cwd=tmp_path)
    assert table.returncode == 1
    assert table.stdout.splitlines()[-1] == (
        "0 hosts checked, 0 without drift, 0 findings (0 critical), 1 not checked"
    )


def test_the_drift_table_counts_in_words() -> None:
    one = DriftResult(
        findings=[Finding("gpu.count", "a", Severity.CRITICAL, "8", "7", "fix")],
        checked_hosts=["a"],
    )
    assert render_table(one).splitlines()[-1] == (
        "1 host checked, 0 without drift, 1 finding (1 critical), 0 not checked"
    )


def test_a_closed_pipe_ends_quietly() -> None:
    """`gpunode defaults | head -1`: the reader has gone away (here before the first write, so
    that the output cannot fit in the pipe first); no BrokenPipeError traceback."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gpunode.cli", "defaults"],
            cwd=ROOT, stdout=writer, stderr=subprocess.PIPE, text=True, timeout=120,
        )  # fmt: skip
    finally:
        os.close(writer)
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""


def test_ctrl_c_is_130_and_interrupted_without_a_traceback(tmp_path: Path) -> None:
    """SIGINT while the inventory loads (it waits for it here, so the signal comes while
    gpunode works, not before it started)."""
    started = tmp_path / "started"
    inventory = tmp_path / "slow.py"
    inventory.write_text(
        "import pathlib, time\n"
        f"pathlib.Path({str(started)!r}).touch()\n"
        "time.sleep(120)\n"
        'h100_nodes = [("gpu-1", {})]\n'
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "gpunode.cli", "validate", str(inventory), "--json"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        while not started.exists():
            assert process.poll() is None, process.communicate()
            time.sleep(0.05)  # waiting for it to start, not timing it
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert err == "gpunode validate: interrupted\n"
    assert json.loads(out) == {"error": "interrupted", "exit_code": 130}


def test_ctrl_c_in_a_rollout_releases_its_locks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    inventory = tmp_path / "fleet.py"
    inventory.write_text('h100_nodes = [("gpu-1", {})]\n')
    deploy = ROOT / "deploys" / "gpu_node.py"
    held: list[Path] = []

    def interrupted(args: argparse.Namespace, *_: object) -> int:
        held.extend(sorted((tmp_path / "state" / "gpunode").glob("*.lock")))
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "rollout_under_lock", interrupted)
    assert main(["rollout", str(inventory), str(deploy)]) == 130
    assert capsys.readouterr().err.endswith("gpunode rollout: interrupted\n")
    assert len(held) == 2  # the state file's lock and the inventory's
    assert rollout.inventory_lock_path(str(inventory)) in held
    for path in held:  # free again: another rollout can take them
        with path.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_every_argument_of_every_command_says_what_it_is() -> None:
    def parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
        found = [parser]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    found += parsers(sub)
        return found

    undocumented = [
        f"{parser.prog} {action.dest}"
        for parser in parsers(build_parser())
        for action in parser._actions
        if not action.help and not isinstance(action, argparse._SubParsersAction)
    ]
    assert undocumented == []


def test_top_level_help_lists_every_command_and_the_exit_statuses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for name in ("validate", "defaults", "drift", "rollout", "doctor", "lab"):
        assert f" {name} " in text, name
    assert "exit status: 0 clean" in text and "2 usage or configuration error" in text
    assert "130 interrupted" in text


def test_lab_status_prints_a_header_or_says_there_is_no_lab(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUNODE_LAB_DIR", str(tmp_path / "lab"))
    monkeypatch.setenv("GPUNODE_LAB_NAME", "gpunode-unit")
    assert main(["lab", "status"]) == 0
    assert capsys.readouterr().out == (
        f"lab gpunode-unit in {tmp_path / 'lab'}\n"
        "no lab nodes; bring some up with `gpunode lab up --nodes 2`\n"
    )
    (tmp_path / "lab").mkdir()
    node = {"name": "lab-1", "container": "gpunode-unit-1", "address": "10.9.0.11"}
    node |= {"profile": "a100", "release": "bookworm"}
    (tmp_path / "lab" / "nodes.json").write_text(json.dumps([node]))
    assert main(["lab", "status"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["name", "address", "profile", "release"]
    assert lines[2].split() == ["lab-1", "10.9.0.11", "a100", "bookworm"]


@pytest.mark.parametrize(
    ("key", "known", "reason"),
    [
        ("prot", ["port", "ciphers"], "unknown key (did you mean 'port'?)"),
        ("nvidia_drvier", ["nvidia_driver", "cuda"], "unknown key (did you mean 'nvidia_driver'?)"),
        ("fierwal", ["firewall", "sshd"], "unknown key (did you mean 'firewall'?)"),
        ("sshdd", ["sshd", "ssh"], "unknown key (did you mean 'sshd'?)"),
        ("cud", ["cuda", "cue"], "unknown key (did you mean 'cuda' or 'cue'?)"),
        ("frewall_x", ["firewall"], "unknown key"),  # three edits: no guess
        ("ab", ["xy"], "unknown key"),  # as far as a key can be
    ],
)
def test_did_you_mean_within_two_edits(key: str, known: list[str], reason: str) -> None:
    assert unknown_key(key, known) == reason


def test_edit_distance_counts_a_swap_as_one() -> None:
    assert edit_distance("drvier", "driver") == 1
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("", "abc") == 3


def test_a_bad_dcgm_diag_level_is_2_before_any_host_is_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = tmp_path / "fleet.py"
    inventory.write_text('h100_nodes = [("gpu-1", {})]\n')  # gpu-1 resolves nowhere
    assert main(["drift", str(inventory), "--dcgm-diag", "7"]) == 2
    assert capsys.readouterr().err == (
        "gpunode drift: --dcgm-diag: DCGM diagnostic level 7: one of 1 (quick), 2 (medium)\n"
    )


@pytest.mark.parametrize("command", ["drift", "doctor"])
def test_a_limit_that_matches_no_host_is_a_usage_error(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = tmp_path / "fleet.py"
    inventory.write_text('h100_nodes = [("gpu-1", {})]\n')
    assert main([command, str(inventory), "--limit", "gpu-9", "--json"]) == 2
    assert json.loads(capsys.readouterr().out) == {
        "error": "--limit gpu-9 matches no host or group",
        "exit_code": 2,
    }

"""`gpunode doctor`: what the control host lacks, one line a check, exit status per the
contract (0 ready, 1 a problem, 2 an inventory that cannot be loaded or is invalid)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpunode.cli import main
from gpunode.control import doctor
from gpunode.control.doctor import OK, PROBLEM, WARNING

ROOT = Path(__file__).resolve().parents[2]


SERVER = """
import socket, sys
greetings = [bytes.fromhex(word) for word in sys.argv[1:]]
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
for greeting in greetings:
    connection, _ = listener.accept()
    with connection:
        if greeting:
            connection.sendall(greeting)
        connection.recv(1)  # until the client closes
"""


@contextmanager
def ssh_like_server(*greetings: bytes) -> Iterator[int]:
    """A TCP server on 127.0.0.1, in a process of its own, that greets its connections in
    turn with ``greetings`` as sshd greets (b"": one that says nothing); yields its port."""
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, *(greeting.hex() for greeting in greetings)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        yield int(server.stdout.readline())
    finally:
        server.kill()
        server.wait()


def closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


def test_this_control_host_passes_its_own_checks_but_the_working_directory() -> None:
    checks = doctor.control_host_checks(ROOT)
    assert [check.status for check in checks[:3]] == [OK, OK, OK], checks
    assert checks[4] == doctor.Check(OK, f"pyinfra started here reads {ROOT / 'config.py'}")


def test_an_old_python_pyinfra_or_paramiko_is_a_problem_naming_it() -> None:
    old_python = doctor.python_check((3, 10, 12))
    assert (
        old_python.status == PROBLEM and "Python 3.10.12: gpunode needs >=3.11" in old_python.text
    )
    old_pyinfra = doctor.pyinfra_check("3.9.0")
    assert old_pyinfra.status == PROBLEM and "pyinfra 3.9.0 is installed" in old_pyinfra.text
    old_paramiko = doctor.post_quantum_kex_check("3.5.1")
    assert old_paramiko.status == PROBLEM
    assert "paramiko 3.5.1: gpunode's mlkem768x25519-sha256" in old_paramiko.text


def test_commands_missing_from_path_and_a_directory_that_is_no_checkout_warn(
    tmp_path: Path,
) -> None:
    path = doctor.path_check(lambda name: None if name == "pyinfra" else "/bin/" + name)
    assert path.status == WARNING and path.text.startswith("pyinfra not on PATH: run `. ")
    elsewhere = doctor.working_directory_check(tmp_path)
    assert elsewhere.status == WARNING and f"--chdir {ROOT}" in elsewhere.text


def test_ssh_keys_missing_or_open_to_others_are_problems(tmp_path: Path) -> None:
    good, open_key = tmp_path / "id_good", tmp_path / "id_open"
    for key, mode in ((good, 0o600), (open_key, 0o644)):
        key.write_text("key")
        key.chmod(mode)
    checks = doctor.ssh_key_checks(
        {str(good): ["a"], str(open_key): ["b", "c"], str(tmp_path / "none"): ["d"]}
    )
    by_path = {
        path: check
        for check in checks
        for path in map(str, (good, open_key, tmp_path / "none"))
        if f"{path} (" in check.text
    }
    assert by_path[str(good)].status == OK
    assert by_path[str(open_key)] == doctor.Check(
        PROBLEM, f"{open_key} (ssh_key of b, c) may be read by others (0644): chmod 600 {open_key}"
    )
    assert by_path[str(tmp_path / "none")].status == PROBLEM
    assert "No such file or directory" in by_path[str(tmp_path / "none")].text


def test_hosts_are_asked_for_their_ssh_banner() -> None:
    greetings = (b"SSH-2.0-OpenSSH_10.0p2 Debian-7\r\n", b"HTTP/1.1 400 Bad\r\n", b"")
    down = closed_port()
    with ssh_like_server(*greetings) as port:
        checks = [
            doctor.reach_checks([(name, "127.0.0.1", port)], timeout_s=2.0)[0]
            for name in ("ssh", "web", "silent")
        ]
    checks += doctor.reach_checks([("down", "127.0.0.1", down)], timeout_s=2.0)
    assert checks[0] == doctor.Check(
        OK, f"ssh (127.0.0.1:{port}) answers: SSH-2.0-OpenSSH_10.0p2 Debian-7"
    )
    assert checks[1].status == PROBLEM
    assert "not as an SSH server: 'HTTP/1.1 400 Bad'" in checks[1].text
    assert checks[2] == doctor.Check(PROBLEM, f"silent (127.0.0.1:{port}): no answer within 2 s")
    assert checks[3] == doctor.Check(PROBLEM, f"down (127.0.0.1:{down}): Connection refused")


def test_a_node_s_banner_is_cleaned_before_it_is_shown() -> None:
    with ssh_like_server(b"SSH-2.0-evil\x1b[2J\x1b]0;owned\x07\r\n") as port:
        (check,) = doctor.reach_checks([("n", "127.0.0.1", port)], timeout_s=2.0)
    assert check.status == OK and "\x1b" not in check.line() and "\x07" not in check.line()


def test_doctor_with_an_inventory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "id_ed25519"
    key.write_text("key")
    key.chmod(0o640)
    inventory = tmp_path / "fleet.py"
    banner = b"SSH-2.0-OpenSSH_9.2p1\r\n"
    with ssh_like_server(banner, banner) as port:
        host = {"ssh_hostname": "127.0.0.1", "ssh_port": port, "ssh_key": str(key)}
        inventory.write_text(f"h100_nodes = [('gpu-1', {host!r})]\n")
        assert main(["doctor", str(inventory)]) == 1  # the key's mode is a problem
        out = capsys.readouterr().out.splitlines()
        key.chmod(0o600)
        code = main(["doctor", str(inventory), "--json"])
        document = json.loads(capsys.readouterr().out)
    assert f"ok       gpu-1 (127.0.0.1:{port}) answers: SSH-2.0-OpenSSH_9.2p1" in out
    assert f"problem  {key} (ssh_key of gpu-1) may be read by others (0640): chmod 600 {key}" in out
    assert out[-1].startswith("1 problem, ")
    assert code == document["exit_code"] == 0
    assert {check["status"] for check in document["checks"]} <= {OK, WARNING}


def test_doctor_exit_2_for_an_inventory_it_cannot_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", str(tmp_path / "none.py")]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"gpunode doctor: no inventory file {tmp_path / 'none.py'}\n"
    assert "ok       pyinfra 3." in captured.out  # what it found before
    invalid = tmp_path / "invalid.py"
    invalid.write_text("h100_nodes = [('gpu-1', {'fierwall': {}})]\n")
    assert main(["doctor", str(invalid), "--json"]) == 2
    assert "did you mean 'firewall'" in json.loads(capsys.readouterr().out)["error"]

"""Container registry logins (NGC's nvcr.io with an API key): the model, the key file's
refusals, the file written (never shown), its fact (which never carries a secret back) and
the drift rule."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import OperationError
from pyinfra.api.command import FileUploadCommand
from pyinfra.facts.files import File, Sha256File

from facts.registry_access import RegistryAccess, parse_registry_access
from gpunode.drift.rules import evaluate
from gpunode.expected import registry_access as expected
from gpunode.model import DesiredState, build_desired_state
from roles import registry_access as role

from .fakehost import fake_host

API_KEY = "nvapi-Xy7Qm2pLk9RtZ0aBcD3eFgH4iJ5kLmN6oPqR7sTuV8wX9yZ"


def key_file(tmp_path: Path, content: str = API_KEY + "\n", mode: int = 0o600) -> str:
    path = tmp_path / "ngc.key"
    path.write_text(content)
    path.chmod(mode)
    return str(path)


def state(*logins: dict[str, Any], engines: tuple[str, ...] = ("docker",)) -> DesiredState:
    data = {"container_runtime": {"engines": list(engines), "registry_logins": list(logins)}}
    desired, problems = build_desired_state(data)
    assert problems == [], [p.render("inv", "h") for p in problems]
    return desired


def problems_of(*logins: dict[str, Any], engines: tuple[str, ...] = ("docker",)) -> dict:
    data = {"container_runtime": {"engines": list(engines), "registry_logins": list(logins)}}
    return {p.key: p.reason for p in build_desired_state(data)[1]}


# --- the model -------------------------------------------------------------------------------


def test_an_ngc_login_needs_only_its_key_file() -> None:
    (login,) = state({"password_file": "keys/ngc.key"}).container_runtime.registry_logins
    assert (login.registry, login.username) == ("nvcr.io", "$oauthtoken")


@pytest.mark.parametrize(
    ("login", "key", "reason"),
    [
        ({}, "registry_logins[0].password_file", ""),
        ({"password_file": "k", "registry": "nvcr.io/nvidia"}, "registry_logins[0].registry", ""),
        ({"password_file": "k", "registry": "nvcr.io\n"}, "registry_logins[0].registry",
         "control character"),
        ({"password_file": "k", "username": "a b"}, "registry_logins[0].username", ""),
        ({"password_file": "k", "username": "$(reboot)"}, "registry_logins[0].username", ""),
        ({"password_file": "keys/ngc key"}, "registry_logins[0].password_file", ""),
    ],
)  # fmt: skip
def test_a_bad_login_is_refused_naming_its_key(login: dict, key: str, reason: str) -> None:
    found = problems_of(login)
    assert f"container_runtime.{key}" in found, found
    assert reason in found[f"container_runtime.{key}"]


def test_logins_need_docker_and_one_per_registry() -> None:
    found = problems_of({"password_file": "k"}, engines=("containerd",))
    assert "image pull secrets" in found["container_runtime.registry_logins"]
    found = problems_of({"password_file": "a"}, {"password_file": "b"})
    assert found["container_runtime.registry_logins[1].registry"] == "a registry given twice"


# --- the key file and the file written ----------------------------------------------------------


def test_the_key_is_read_from_a_private_file_with_one_newline_dropped(tmp_path: Path) -> None:
    (login,) = state({"password_file": key_file(tmp_path)}).container_runtime.registry_logins
    assert role.read_password(login, 0) == API_KEY


@pytest.mark.parametrize(
    ("content", "mode", "message"),
    [
        (API_KEY, 0o640, "readable by others (mode 0640); chmod 600"),
        (API_KEY, 0o604, "readable by others"),
        ("", 0o600, "not one line of printable ASCII"),
        ("\n", 0o600, "not one line of printable ASCII"),
        (API_KEY + "\nsecond line\n", 0o600, "not one line"),
        ("key with spaces", 0o600, "without spaces"),
        (API_KEY + "\x1b[2J", 0o600, "not one line"),
        ("k" * 5000, 0o600, "1 to 4096 bytes"),
    ],
)
def test_a_key_file_that_others_may_read_or_that_is_no_key_is_refused_without_its_content(
    tmp_path: Path, content: str, mode: int, message: str
) -> None:
    (login,) = state({"password_file": key_file(tmp_path, content, mode)}
                     ).container_runtime.registry_logins  # fmt: skip
    with pytest.raises(OperationError) as refused:
        role.read_password(login, 0)
    text = str(refused.value)
    assert message in text and "registry_logins[0].password_file" in text
    assert API_KEY not in text and "second line" not in text


def test_the_file_holds_one_auth_per_registry_as_docker_login_writes_it(tmp_path: Path) -> None:
    desired = state(
        {"password_file": key_file(tmp_path)},
        {"registry": "registry.example:5000", "username": "ci", "password_file": "x"},
    )
    ngc, private = desired.container_runtime.registry_logins
    text = expected.render_docker_config([(ngc, API_KEY), (private, "s3cret")]).decode()
    auths = json.loads(text)["auths"]
    assert base64.b64decode(auths["nvcr.io"]["auth"]).decode() == f"$oauthtoken:{API_KEY}"
    assert base64.b64decode(auths["registry.example:5000"]["auth"]).decode() == "ci:s3cret"
    # What the fact reads back from it: the registries, never an auth value.
    lines = text.splitlines()
    read = parse_registry_access(["mode 600", *lines])
    assert read["registries"] == ["nvcr.io", "registry.example:5000"]
    assert API_KEY not in repr(read)


def run_operation(logins: Any, facts: dict[type, Any]) -> tuple[list[Any], list[str]]:
    with fake_host(facts) as host:
        commands = list(role.docker_client_credentials._inner(logins=logins, login_user="ops"))
    return commands, host.noops


def test_the_file_is_uploaded_never_shown_and_then_left_alone(tmp_path: Path) -> None:
    logins = state({"password_file": key_file(tmp_path)}).container_runtime.registry_logins
    commands, _ = run_operation(logins, {Sha256File: None, File: None})
    shell = [str(c) for c in commands if not isinstance(c, FileUploadCommand)]
    (upload,) = [c for c in commands if isinstance(c, FileUploadCommand)]
    assert all(API_KEY not in line for line in shell)
    assert "install -d -m 0700 -o ops /run/gpunode-registry" in shell[0]
    assert "chmod 0600 /root/.docker/config.json.gpunode-new" in shell[1]
    content = upload.src.getvalue()
    digest = hashlib.sha256(content).hexdigest()
    owned = {"mode": 600, "user": "root", "group": "root"}
    commands, noops = run_operation(logins, {Sha256File: digest, File: owned})
    assert commands == [] and "0600" in noops[0] and API_KEY not in noops[0]
    # The same content readable by others is written again, 0600.
    commands, _ = run_operation(logins, {Sha256File: digest, File: {**owned, "mode": 644}})
    assert len(commands) == 3


# --- the fact and the drift rule -------------------------------------------------------------


def test_the_facts_command_reads_a_real_file_and_prints_no_secret(tmp_path: Path) -> None:
    (login,) = state({"password_file": "x"}).container_runtime.registry_logins
    config = tmp_path / "config.json"
    config.write_bytes(expected.render_docker_config([(login, API_KEY)]))
    config.chmod(0o600)
    command = RegistryAccess().command().replace(expected.DOCKER_CLIENT_CONFIG, str(config))
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert API_KEY not in done.stdout
    assert base64.b64encode(f"$oauthtoken:{API_KEY}".encode()).decode() not in done.stdout
    found = RegistryAccess().process(done.stdout.splitlines())
    assert found == {"state": "ok", "reason": "", "present": True, "mode": "600",
                     "registries": ["nvcr.io"]}  # fmt: skip
    missing = RegistryAccess().command().replace(expected.DOCKER_CLIENT_CONFIG,
                                                 str(tmp_path / "none"))  # fmt: skip
    done = subprocess.run(["sh", "-c", missing], capture_output=True, text=True, check=True)
    assert RegistryAccess().process(done.stdout.splitlines())["present"] is False


def findings(section: dict[str, Any]) -> dict[str, Any]:
    desired = state({"password_file": "x"})
    return {f.id: f for f in evaluate("node-1", desired, {"registry_access": section})
            if f.id.startswith("registry_access")}  # fmt: skip


def test_drift_reports_a_missing_login_and_a_file_others_may_read() -> None:
    ok = {"state": "ok", "reason": "", "present": True, "mode": "600", "registries": ["nvcr.io"]}
    assert findings(ok) == {}
    missing = findings({**ok, "registries": ["registry.example"]})
    assert missing["registry_access.login:nvcr.io"].severity.name == "WARNING"
    absent = findings({**ok, "present": False, "mode": None, "registries": []})
    assert absent["registry_access.login:nvcr.io"].found == "no /root/.docker/config.json"
    exposed = findings({**ok, "mode": "644"})
    assert exposed["registry_access.mode"].severity.name == "CRITICAL"

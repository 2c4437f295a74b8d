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


# --- registry mirrors (containerd's hosts.toml) ------------------------------------------------

MIRRORED = {
    "engines": ["containerd"],
    "registry_mirrors": [
        {"registry": "docker.io", "mirrors": ["https://mirror.internal:5000"]},
        {"registry": "nvcr.io", "mirrors": ["https://a.internal", "https://b.internal"],
         "upstream": False, "resolve": False},
    ],
}  # fmt: skip


def mirrored(**runtime: Any) -> DesiredState:
    desired, problems = build_desired_state({"container_runtime": {**MIRRORED, **runtime}})
    assert problems == [], [p.render("inv", "h") for p in problems]
    return desired


def test_hosts_toml_tries_the_mirrors_then_the_registry_or_never_the_registry() -> None:
    hub, nvcr = mirrored().container_runtime.registry_mirrors
    assert expected.hosts_toml_path("docker.io") == "/etc/containerd/certs.d/docker.io/hosts.toml"
    assert expected.render_hosts_toml(hub) == (
        f"{expected.HOSTS_MARKER}\n"
        'server = "https://registry-1.docker.io"\n\n'
        '[host."https://mirror.internal:5000"]\n  capabilities = ["pull", "resolve"]\n'
    )
    # Air-gapped: the last mirror is the server, the registry is never asked; a public
    # mirror pulls only.
    assert expected.render_hosts_toml(nvcr) == (
        f"{expected.HOSTS_MARKER}\n"
        'server = "https://b.internal"\n\n'
        '[host."https://a.internal"]\n  capabilities = ["pull"]\n'
    )
    import tomllib

    assert tomllib.loads(expected.render_hosts_toml(hub))["host"] == {
        "https://mirror.internal:5000": {"capabilities": ["pull", "resolve"]}
    }


@pytest.mark.parametrize(
    ("runtime", "key", "reason"),
    [
        ({"engines": ["docker"]}, "registry_mirrors", "containerd is not among"),
        ({"registry_mirrors": [{"registry": "docker.io"}]}, "registry_mirrors[0].mirrors",
         "no mirror given"),
        ({"registry_mirrors": [{"registry": "docker.io", "mirrors": ["ftp://m"]}]},
         "registry_mirrors[0].mirrors[0]", ""),
        ({"registry_mirrors": [{"registry": "docker.io", "mirrors": ['https://m"x']}]},
         "registry_mirrors[0].mirrors[0]", ""),
        ({"registry_mirrors": [{"registry": "docker.io", "mirrors": ["https://m\n"]}]},
         "registry_mirrors[0].mirrors[0]", "control character"),
        ({"registry_mirrors": [{"registry": "docker.io/library", "mirrors": ["https://m"]}]},
         "registry_mirrors[0].registry", ""),
        ({"registry_mirrors": [{"registry": "a.io", "mirrors": ["https://m"]},
                               {"registry": "a.io", "mirrors": ["https://n"]}]},
         "registry_mirrors[1].registry", "given twice"),
    ],
)  # fmt: skip
def test_a_bad_mirror_is_refused_naming_its_key(runtime: dict, key: str, reason: str) -> None:
    _, problems = build_desired_state({"container_runtime": {**MIRRORED, **runtime}})
    found = {p.key: p.reason for p in problems}
    assert f"container_runtime.{key}" in found, found
    assert reason in found[f"container_runtime.{key}"]


def test_the_renderer_refuses_what_toml_would_read_otherwise() -> None:
    from gpunode.model import RegistryMirror

    with pytest.raises(ValueError, match=r"hosts\.toml"):
        expected.render_hosts_toml(RegistryMirror(registry="a.io", mirrors=('https://m"]',)))


def test_containerd_config_path_is_read_for_its_version() -> None:
    from facts.container_runtime import parse_containerd_config

    v2 = (
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry]\n'
        'config_path = "/etc/containerd/certs.d"\n'
    )
    v3 = (
        'version = 3\n[plugins."io.containerd.cri.v1.images".registry]\n'
        'config_path = "/x:/etc/containerd/certs.d"\n'
    )
    assert parse_containerd_config(v2)["registry_config_path"] == "/etc/containerd/certs.d"
    assert expected.reads_hosts_directory(parse_containerd_config(v3)["registry_config_path"])
    assert parse_containerd_config("version = 2\n")["registry_config_path"] is None
    assert not expected.reads_hosts_directory("/etc/containerd/certs.d.old")


def test_mirrors_no_longer_declared_are_removed_and_the_run_says_what_containerd_reads() -> None:
    from facts.container_runtime import ContainerRuntimeConfig
    from facts.registry_access import ManagedRegistryMirrors

    from .fakehost import commands_of

    facts: dict[type, Any] = {ManagedRegistryMirrors: ["docker.io", "old.example:5000"]}
    commands, _ = commands_of(role.undeclared_mirrors_removed, facts, declared=["docker.io"])
    assert commands == [
        "rm -f /etc/containerd/certs.d/old.example:5000/hosts.toml && "
        "(rmdir /etc/containerd/certs.d/old.example:5000 2>/dev/null || true)"
    ]
    facts = {ContainerRuntimeConfig: {"containerd": {"registry_config_path": None}}}
    commands, noops = commands_of(role.containerd_reads_mirrors, facts)
    assert commands == [] and "does not read /etc/containerd/certs.d yet" in noops[0]
    facts = {ContainerRuntimeConfig: {"containerd": {
        "registry_config_path": "/etc/containerd/certs.d"}}}  # fmt: skip
    assert "containerd reads" in commands_of(role.containerd_reads_mirrors, facts)[1][0]


def test_the_managed_mirrors_fact_reads_a_real_directory(tmp_path: Path) -> None:
    from facts.registry_access import ManagedRegistryMirrors

    (hub,) = mirrored().container_runtime.registry_mirrors[:1]
    for registry, text in (("docker.io", expected.render_hosts_toml(hub)),
                           ("quay.io", 'server = "https://quay.io"\n')):  # fmt: skip
        (tmp_path / registry).mkdir()
        (tmp_path / registry / "hosts.toml").write_text(text)
    command = ManagedRegistryMirrors().command().replace(expected.HOSTS_DIRECTORY, str(tmp_path))
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    lines = [line.replace(str(tmp_path), expected.HOSTS_DIRECTORY) for line in done.stdout.split()]
    assert ManagedRegistryMirrors().process(lines) == ["docker.io"]


def test_drift_warns_where_containerd_does_not_read_the_mirrors() -> None:
    desired = mirrored()

    def found(config_path: str | None) -> dict[str, Any]:
        facts = {"container_runtime": {"containerd": {"registry_config_path": config_path}}}
        return {f.id: f for f in evaluate("node-1", desired, facts)
                if f.id.startswith("registry_access")}  # fmt: skip

    assert found(None)["registry_access.mirrors_unread"].severity.name == "WARNING"
    assert found("/etc/docker/certs.d")["registry_access.mirrors_unread"].found == (
        "config_path '/etc/docker/certs.d'"
    )
    assert found("/etc/containerd/certs.d:/etc/docker/certs.d") == {}

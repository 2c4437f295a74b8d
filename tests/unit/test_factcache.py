"""The fact cache: batched reads give what pyinfra's one-by-one reads give, failures are left
to pyinfra, anything that runs on a host forgets its facts, and plans hold no secrets."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import FactBase
from pyinfra.facts.files import Directory, File, FindInFile, Link, Sha1File
from pyinfra.facts.server import Which
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from facts.container_runtime import DpkgPackageState
from gpunode import factcache


class NeedsMissingTool(FactBase[str]):
    requires_command = "gpunode-no-such-tool"

    def command(self) -> str:
        return "gpunode-no-such-tool --version"


class Fails(FactBase[str]):
    def command(self) -> str:
        return "echo partial; exit 3"


class NoFinalNewline(FactBase[list[str]]):
    def command(self) -> str:
        return "printf 'one\\ntwo'"

    def process(self, output: list[str]) -> list[str]:  # type: ignore[override]
        return list(output)


def sh(script: str) -> list[str]:
    result = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    return result.stdout.splitlines()


def alone(cls: type[FactBase], kwargs: dict[str, Any]) -> Any:
    """What pyinfra gets reading the fact by itself: its command's stdout, processed."""
    fact = cls()
    lines = sh(str(fact.command(**kwargs)))
    return fact.process(lines) if lines else fact.default()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "app.conf"
    config.write_text("PasswordAuthentication no\nPort 22\n")
    # Last accessed after its last change: the batch's reads of it (sha1sum, grep) never move
    # its atime, which File's stat prints, between the batch and the reads alone (relatime
    # moves an atime that is not past the mtime; a second boundary crossed in between showed).
    now = time.time()
    os.utime(config, (now, now - 60))
    return {"config": str(config), "missing": str(tmp_path / "missing.conf")}


def test_a_batch_reads_what_each_fact_reads_alone(files: dict[str, str]) -> None:
    facts: list[tuple[type[FactBase], dict[str, Any]]] = [
        (Sha1File, {"path": files["config"]}),
        (Sha1File, {"path": files["missing"]}),
        (File, {"path": files["config"]}),
        (
            FindInFile,
            {"path": files["config"], "pattern": "^Port", "interpolate_variables": False},
        ),
        (Which, {"command": "sh"}),
    ]
    instances = [(cls(), kwargs) for cls, kwargs in facts]
    parts = factcache.parse_batch(sh(factcache.batch_script(instances)), instances)
    assert sorted(parts) == list(range(len(facts)))
    for index, (fact, _) in enumerate(instances):
        cls, kwargs = facts[index]
        read, batched = factcache.batched_value(fact, parts[index])
        assert read
        assert batched == alone(cls, kwargs), cls.__name__
    assert instances[0][0].process(parts[0].lines) is not None  # the config's hash was read


def test_path_facts_are_read_by_one_program_each_as_each_would_read_alone(
    tmp_path: Path,
) -> None:
    odd = tmp_path / "it's a -file"
    odd.write_text("x\n")
    # Read after it was last accessed: reading it (sha1sum) never moves its atime, which stat
    # prints, between the batch and the reads alone (relatime moves an atime not past mtime).
    now = time.time()
    os.utime(odd, (now, now - 60))
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(odd)
    (tmp_path / "broken").symlink_to(tmp_path / "nowhere")
    paths = [str(p) for p in (odd, tmp_path / "dir", tmp_path / "link", tmp_path / "broken")]
    paths.append(str(tmp_path / "missing"))
    facts: list[tuple[type[FactBase], dict[str, Any]]] = [
        (cls, {"path": path}) for path in paths for cls in (File, Directory, Link, Sha1File)
    ]
    facts.append((Which, {"command": "sh"}))
    instances = [(cls(), kwargs) for cls, kwargs in facts]
    assert factcache.batch_groups(instances) == {
        "stat": [i for i, (cls, _) in enumerate(facts) if cls in (File, Directory, Link)],
        "sha1": [i for i, (cls, _) in enumerate(facts) if cls is Sha1File],
    }
    script = factcache.batch_script(instances)
    assert script.count("stat -c") == 1 and script.count("sha1sum") == 1
    parts = factcache.parse_batch(sh(script), instances)
    assert sorted(parts) == list(range(len(facts)))
    for index, (fact, _) in enumerate(instances):
        cls, kwargs = facts[index]
        read, batched = factcache.batched_value(fact, parts[index])
        assert read
        assert batched == alone(cls, kwargs), (cls.__name__, kwargs)
    assert parts[0].lines and parts[len(facts) - 2].lines == []  # the file; the missing one


def test_a_group_whose_program_fails_leaves_its_facts_for_pyinfra(tmp_path: Path) -> None:
    instances = [(File(), {"path": str(tmp_path)}), (Directory(), {"path": str(tmp_path)})]
    members = factcache.batch_groups(instances)["stat"]
    failed = factcache.framing.PartOutput("group-stat", ["exists 0", "exists 1"], exit_status=1)
    assert factcache._group_outputs(failed, members) == {}
    short = factcache.framing.PartOutput(
        "group-stat", ["exists 0", "exists 1", "user=x"], exit_status=0
    )
    assert factcache._group_outputs(short, members) == {}


def test_pyinfra_file_facts_print_what_the_stat_group_prints() -> None:
    for cls in (File, Directory, Link):
        assert factcache.STAT_FORMAT in str(cls().command(path="/etc/x"))
    assert "sha1sum" in str(Sha1File().command(path="/etc/x"))


def test_failed_facts_are_left_for_pyinfra_and_missing_tools_give_the_default() -> None:
    instances = [(Fails(), {}), (NeedsMissingTool(), {}), (NoFinalNewline(), {})]
    parts = factcache.parse_batch(sh(factcache.batch_script(instances)), instances)
    assert parts[0].exit_status == 3  # pyinfra reads it itself and reports the failure
    assert factcache.batched_value(instances[0][0], parts[0]) == (False, None)
    assert parts[1].absent  # as pyinfra's get_fact does on MissingCommandError
    assert factcache.batched_value(instances[1][0], parts[1]) == (
        True,
        NeedsMissingTool().default(),
    )
    assert parts[2].lines == ["one", "two"]  # the next marker is not glued to the last line


def test_a_batch_cut_short_leaves_the_unfinished_facts_for_pyinfra() -> None:
    instances = [(NoFinalNewline(), {}), (Fails(), {}), (NoFinalNewline(), {})]
    lines = sh(factcache.batch_script(instances))
    cut = lines[: lines.index("partial") + 1]
    parts = factcache.parse_batch(cut, instances)
    assert sorted(parts) == [0]


def test_a_required_command_that_is_no_program_name_is_left_for_pyinfra() -> None:
    class OddRequirement(NeedsMissingTool):
        requires_command = "tool --with-arguments"

    instances = [(OddRequirement(), {}), (NoFinalNewline(), {})]
    assert sorted(factcache.batch_parts(instances)) == [1]


def test_plans_never_hold_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUNODE_FACT_PLAN_DIR", str(tmp_path))
    monkeypatch.setattr(factcache, "_asked", {})
    secret = "hunter2-sudo-password"
    factcache._remember("node-1", "k1", File, {"path": "/etc/a"}, {"_sudo": True})
    factcache._remember(
        "node-1", "k2", File, {"path": "/etc/b"}, {"_sudo": True, "_sudo_password": secret}
    )
    factcache.write_plans()
    (plan,) = tmp_path.iterdir()
    text = plan.read_text()
    assert secret not in text
    records = json.loads(text)
    assert [record["kwargs"] for record in records] == [{"path": "/etc/a"}]
    assert records[0]["fact"] == "pyinfra.facts.files:File"
    assert records[0]["connector"]["_sudo"] is True


def test_running_anything_on_a_host_forgets_its_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(factcache, "_values", {"node-1": {"k": 1}, "node-2": {"k": 2}})
    seen: list[dict[str, Any]] = []

    class Host:
        name = "node-1"

    def execute(self: Any, state: Any, host: Any, arguments: Any) -> bool:
        seen.append(dict(factcache._values))
        return True

    assert factcache._clearing(execute)(None, None, Host(), {}) is True
    assert seen == [{"node-2": {"k": 2}}]  # forgotten before the command ran
    assert factcache._values == {"node-2": {"k": 2}}


def test_uncacheable_facts_are_never_planned(tmp_path: Path) -> None:
    from facts.run_lock import NodeRunLock

    assert factcache._fact_class("facts.run_lock:NodeRunLock") is None
    assert factcache._fact_class("pyinfra.facts.files:File") is File
    assert factcache._fact_class("no.such.module:Fact") is None
    assert NodeRunLock.cacheable is False


# --- the plan file: only allow-listed facts, no credentials, private ----------------------------

CONNECTOR = {"_sudo": True, "_env": {}, "_shell_executable": "sh", "_success_exit_codes": [0]}


class RecordingHost:
    """Stands in for pyinfra's Host in ``prefetch``: keeps every command it is asked to run."""

    name = "node-1"

    def __init__(self) -> None:
        self.commands: list[tuple[str, dict[str, Any]]] = []

    def run_shell_command(self, command: Any, **arguments: Any) -> tuple[bool, None]:
        self.commands.append((command.get_raw_value(), arguments))
        return False, None


class QuietState:
    print_fact_output = False
    print_fact_input = False


def plant_plan(records: list[dict[str, Any]], mode: int = 0o600) -> Path:
    path = factcache.plan_path("node-1")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_text(json.dumps(records))
    path.chmod(mode)
    return path


@pytest.fixture
def plan_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "plans"
    monkeypatch.setenv("GPUNODE_FACT_PLAN_DIR", str(directory))
    monkeypatch.setattr(factcache, "_asked", {})
    monkeypatch.setattr(factcache, "_values", {})
    return directory


def test_a_planted_plan_cannot_run_commands_on_the_node(plan_dir: Path) -> None:
    import facts.nvidia_packages  # noqa: F401  (loaded by the deploys that read it)

    planted = [
        {
            "fact": "pyinfra.facts.server:Command",
            "kwargs": {"command": "touch /tmp/PWNED-command"},
            "connector": CONNECTOR,
        },
        {  # interpolated into double quotes by pyinfra: $(...) would run
            "fact": "pyinfra.facts.files:FindInFile",
            "kwargs": {
                "path": "/etc/hosts",
                "pattern": "$(touch /tmp/PWNED-pattern)",
                "interpolate_variables": True,
                "extended_regex": False,
            },
            "connector": CONNECTOR,
        },
        {  # extra find arguments: -exec
            "fact": "pyinfra.facts.files:FindFiles",
            "kwargs": {"path": "/", "args": ["-exec", "touch", "/tmp/PWNED-find", ";"]},
            "connector": CONNECTOR,
        },
        {  # gpunode's own fact whose package names go into the command unquoted
            "fact": "facts.nvidia_packages:AptPackageVersions",
            "kwargs": {"packages": ["nvidia-driver; touch /tmp/PWNED-package"]},
            "connector": CONNECTOR,
        },
        {  # ~user goes into pyinfra's command unquoted
            "fact": "pyinfra.facts.server:AuthorizedKeys",
            "kwargs": {"user": "root$(touch /tmp/PWNED-user)", "path": None},
            "connector": CONNECTOR,
        },
        {"fact": "os:system", "kwargs": {}, "connector": CONNECTOR},
        {"fact": "facts.not_loaded:Anything", "kwargs": {}, "connector": CONNECTOR},
        {  # an argument the fact does not take
            "fact": "pyinfra.facts.files:File",
            "kwargs": {"path": "/etc/hosts", "command": "touch /tmp/PWNED-kwarg"},
            "connector": CONNECTOR,
        },
        {  # a control character in a path
            "fact": "pyinfra.facts.files:File",
            "kwargs": {"path": "/etc/hosts\ntouch /tmp/PWNED-newline"},
            "connector": CONNECTOR,
        },
        {  # connector arguments that change how the command runs
            "fact": "pyinfra.facts.files:File",
            "kwargs": {"path": "/etc/hosts"},
            "connector": CONNECTOR | {"_shell_executable": "touch /tmp/PWNED-shell;sh"},
        },
        {
            "fact": "pyinfra.facts.files:File",
            "kwargs": {"path": "/etc/hosts"},
            "connector": CONNECTOR | {"_env": {"LD_PRELOAD": "/tmp/PWNED-env.so"}},
        },
    ]
    plant_plan(planted)
    host = RecordingHost()
    factcache.prefetch(QuietState(), host)
    assert host.commands == []

    allowed = {"fact": "pyinfra.facts.files:File", "kwargs": {"path": "/etc/hosts"}}
    plant_plan([*planted, allowed | {"connector": CONNECTOR}])
    factcache.prefetch(QuietState(), host)
    ((command, arguments),) = host.commands  # the one allowed fact, with sudo
    script = arguments["_stdin"]  # on stdin: sudo logs the short command line alone
    assert command.startswith('eval "$(cat)"  # gpunode script sha256:') and "\n" not in command
    assert "/etc/hosts" in script and "PWNED" not in script
    assert arguments["_sudo"] is True


def test_plans_never_hold_an_environment(plan_dir: Path) -> None:
    proxy = "http://ops:proxy-secret@proxy.example:3128"
    factcache._remember("node-1", "k1", File, {"path": "/etc/a"}, CONNECTOR)
    with_env = CONNECTOR | {"_env": {"http_proxy": proxy}}
    factcache._remember("node-1", "k2", File, {"path": "/etc/b"}, with_env)
    factcache._remember("node-1", "k3", File, {"path": "/etc/c"}, CONNECTOR | {"_chdir": "/tmp"})
    factcache.write_plans()
    (plan,) = plan_dir.iterdir()
    text = plan.read_text()
    assert "proxy-secret" not in text
    records = json.loads(text)
    assert [record["kwargs"] for record in records] == [{"path": "/etc/a"}]
    assert records[0]["connector"]["_env"] == {}


def test_plan_files_are_private_whatever_the_umask(plan_dir: Path) -> None:
    factcache._remember("node-1", "k1", File, {"path": "/etc/a"}, CONNECTOR)
    previous = os.umask(0)
    try:
        factcache.write_plans()
    finally:
        os.umask(previous)
    (plan,) = plan_dir.iterdir()
    assert stat.S_IMODE(plan_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(plan.stat().st_mode) == 0o600
    loaded = factcache._load_plan("node-1")
    assert [(cls, kwargs) for cls, kwargs, _ in loaded] == [(File, {"path": "/etc/a"})]


def test_a_plan_others_can_write_or_that_is_not_ours_is_ignored(
    plan_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = {"fact": "pyinfra.facts.files:File", "kwargs": {"path": "/etc/a"}}
    path = plant_plan([record | {"connector": CONNECTOR}])
    assert len(factcache._load_plan("node-1")) == 1
    path.chmod(0o620)
    assert factcache._load_plan("node-1") == []
    path.chmod(0o602)
    assert factcache._load_plan("node-1") == []
    path.chmod(0o600)
    plan_dir.chmod(0o777)
    assert factcache._load_plan("node-1") == []
    plan_dir.chmod(0o700)
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)
    assert factcache._load_plan("node-1") == []


def test_the_clock_and_an_accounts_keys_are_read_with_the_batch(plan_dir: Path) -> None:
    # Two facts every harden run reads: planned, they cost no round trip of their own.
    plant_plan(
        [
            {"fact": "pyinfra.facts.server:Date", "kwargs": {}, "connector": CONNECTOR},
            {
                "fact": "pyinfra.facts.server:AuthorizedKeys",
                "kwargs": {"user": "gpuadmin", "path": None},
                "connector": CONNECTOR,
            },
        ]
    )
    loaded = factcache._load_plan("node-1")
    assert [(cls.__name__, kwargs) for cls, kwargs, _ in loaded] == [
        ("Date", {}),
        ("AuthorizedKeys", {"user": "gpuadmin", "path": None}),
    ]


def test_only_allow_listed_fact_classes_are_named() -> None:
    assert factcache._fact_class("pyinfra.facts.server:Command") is None
    assert factcache._fact_class("pyinfra.facts.server:Which") is Which
    assert factcache._fact_class("facts.tls:FactBase") is None  # imported there, not defined
    assert factcache._fact_class("gpunode.cli:main") is None


SYSTEMD_CAPTURE = Path(__file__).parents[1] / "fixtures" / "systemd" / "show-trixie.json"


def test_systemd_facts_of_named_units_are_read_by_one_systemctl_as_each_reads_alone() -> None:
    capture = json.loads(SYSTEMD_CAPTURE.read_text())
    units = capture["units"]  # running, not found, an alias (sshd -> ssh), static, ...
    asked = [units[:2], [units[2]], units[3:], units[1:4]]
    instances: list[tuple[Any, dict[str, Any]]] = [
        (cls(), {"services": named, "user_mode": False, "machine": None, "user_name": None})
        for named in asked
        for cls in (SystemdStatus, SystemdEnabled)
    ]
    instances.append((SystemdStatus(), {"services": "*"}))  # a glob: read alone
    assert factcache.batch_groups(instances) == {"systemd": list(range(len(asked) * 2))}
    script = factcache.batch_script(instances)
    assert script.count("systemctl show") == 2  # the group's, and the glob's own
    members = factcache.batch_groups(instances)["systemd"]
    # systemctl's blocks print in the order the units are named: the capture's, by position.
    captured = [block.strip("\n") for block in capture["grouped"].split("\n\n")]
    block_of = dict(zip(units, captured, strict=True))
    named_in_order = [unit for index in members for unit in instances[index][1]["services"]]
    grouped = factcache.framing.PartOutput(
        "group-systemd",
        "\n\n".join(block_of[unit] for unit in named_in_order).splitlines(),
        exit_status=0,
    )
    outputs = factcache._systemd_outputs(grouped, members, instances)
    assert sorted(outputs) == members
    for index in members:
        fact, kwargs = instances[index]
        alone_lines = [
            line
            for unit in kwargs["services"]
            for line in capture["alone"][unit][fact.state_key].splitlines()
        ]
        read, value = factcache.batched_value(fact, outputs[index])
        assert read
        assert value == fact.process(alone_lines), (type(fact).__name__, kwargs)
    assert factcache.batched_value(instances[0][0], outputs[0])[1] == {
        "ssh.service": True,
        "nosuch.service": False,
    }


def test_a_systemd_group_that_does_not_print_one_block_per_unit_is_left_for_pyinfra() -> None:
    instances: list[tuple[Any, dict[str, Any]]] = [
        (SystemdStatus(), {"services": ["ssh.service", "dbus.service"]}),
        (SystemdEnabled(), {"services": ["ssh.service"]}),
    ]
    members = factcache.batch_groups(instances)["systemd"]
    one_short = factcache.framing.PartOutput(
        "group-systemd",
        ["Id=ssh.service", "SubState=running", "", "Id=dbus.service", "SubState=running"],
        exit_status=0,
    )
    assert factcache._systemd_outputs(one_short, members, instances) == {}
    failed = factcache.framing.PartOutput("group-systemd", [], exit_status=1)
    assert factcache._systemd_outputs(failed, members, instances) == {}
    absent = factcache.framing.PartOutput("group-systemd", absent=True)
    outputs = factcache._systemd_outputs(absent, members, instances)
    assert all(factcache.batched_value(instances[i][0], outputs[i]) == (True, {}) for i in members)


def test_a_fact_class_that_groups_its_reads_is_read_once_as_each_reads_alone() -> None:
    """DpkgPackageState: one dpkg-query of this machine's real dpkg for every read."""
    asked = [["dpkg", "no-such-package-gpunode"], ["sed"], ["dpkg", "sed", "grep"]]
    instances: list[tuple[Any, dict[str, Any]]] = [
        (DpkgPackageState(), {"packages": packages}) for packages in asked
    ]
    instances.append((DpkgPackageState(), {"packages": ["dpkg*"]}))  # a pattern: alone
    assert factcache.batch_groups(instances) == {"class-DpkgPackageState": [0, 1, 2]}
    script = factcache.batch_script(instances)
    assert script.count("dpkg-query") == 2
    parts = factcache.parse_batch(sh(script), instances)
    assert sorted(parts) == [0, 1, 2, 3]
    for index, (fact, kwargs) in enumerate(instances):
        read, value = factcache.batched_value(fact, parts[index])
        assert read and value == alone(DpkgPackageState, kwargs), kwargs
    assert factcache.batched_value(instances[0][0], parts[0])[1]["dpkg"]["installed"]
    broken = factcache.framing.PartOutput("group-class-DpkgPackageState", [], exit_status=2)
    assert factcache._class_outputs(broken, [0, 1, 2], instances) == {}


def test_a_script_on_stdin_runs_whole_and_its_programs_cannot_eat_the_rest() -> None:
    """The runner reads all of stdin first: a program in the script that reads its stdin
    (here ``cat``) finds nothing, and the lines after it still run."""
    command, stdin = factcache.remote_script.script_command(
        "echo first\ncat\necho 'after cat'\nexit 3\n"
    )
    done = subprocess.run(
        ["sh", "-c", command.get_raw_value()], input=stdin, capture_output=True, text=True
    )
    assert done.stdout.splitlines() == ["first", "after cat"]
    assert done.returncode == 3


def test_facts_read_with_the_projects_own_pyinfra_config_are_planned(plan_dir: Path) -> None:
    """config.py sets pyinfra's TEMP_DIR, which every read then carries as ``_temp_dir``: a
    plan must hold it, or no plan is ever written and every no-op reads fact by fact (190
    SSH commands per host instead of 3)."""
    root = Path(__file__).resolve().parents[2]
    # As pyinfra's CLI reads config.py: into the run's Config, in a process of its own.
    read = (
        "import runpy\n"
        "from pyinfra import config\n"
        "from pyinfra.api import Config\n"
        "from pyinfra.context import ctx_config\n"
        "with ctx_config.use(Config()):\n"
        "    runpy.run_path('config.py')\n"
        "    print(config.TEMP_DIR)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", read], cwd=root, capture_output=True, text=True, check=True
    )
    temp_dir = done.stdout.strip()
    assert temp_dir == "/tmp"
    factcache._remember(
        "node-1", "k1", File, {"path": "/etc/a"}, CONNECTOR | {"_temp_dir": temp_dir}
    )
    factcache.write_plans()
    loaded = factcache._load_plan("node-1")
    assert [(cls, kwargs, planned["_temp_dir"]) for cls, kwargs, planned in loaded] == [
        (File, {"path": "/etc/a"}, "/tmp")
    ]


@pytest.mark.parametrize("temp_dir", ["tmp", "/tmp; rm -rf /", "/tmp\n", "/" + "a" * 300])
def test_a_temp_dir_that_is_no_plain_absolute_path_is_never_planned(
    plan_dir: Path, temp_dir: str
) -> None:
    factcache._remember(
        "node-1", "k1", File, {"path": "/etc/a"}, CONNECTOR | {"_temp_dir": temp_dir}
    )
    factcache.write_plans()
    assert not plan_dir.exists() or list(plan_dir.iterdir()) == []

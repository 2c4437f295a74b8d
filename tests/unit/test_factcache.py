"""The fact cache: batched reads give what pyinfra's one-by-one reads give, failures are left
to pyinfra, anything that runs on a host forgets its facts, and plans hold no secrets."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api import FactBase
from pyinfra.facts.files import File, FindInFile, Sha1File
from pyinfra.facts.server import Which

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
    marker = "gpunode-prefetch-test"
    sections = factcache.parse_batch(
        sh(factcache.batch_script(instances, marker)), marker, len(facts)
    )
    assert sorted(sections) == list(range(len(facts)))
    for index, (fact, _) in enumerate(instances):
        cls, kwargs = facts[index]
        lines = sections[index]
        batched = fact.process(lines) if lines else fact.default()
        assert batched == alone(cls, kwargs), cls.__name__
    assert instances[0][0].process(sections[0]) is not None  # the config's hash was read


def test_failed_and_missing_tool_facts_are_left_for_pyinfra() -> None:
    instances = [(Fails(), {}), (NeedsMissingTool(), {}), (NoFinalNewline(), {})]
    marker = "gpunode-prefetch-test"
    sections = factcache.parse_batch(sh(factcache.batch_script(instances, marker)), marker, 3)
    assert 0 not in sections  # exit 3: pyinfra reads it itself and reports the failure
    assert sections[1] == [factcache._MISSING_COMMAND]
    assert sections[2] == ["one", "two"]  # the next marker is not glued to the last line


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

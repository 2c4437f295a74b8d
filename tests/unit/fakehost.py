"""Operation tests in pyinfra's fixture style: facts in, commands (or no-op notes) out."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from pyinfra.context import ctx_host


class FakeHost:
    """Stands in for pyinfra's Host: answers facts from a table, records no-op messages."""

    def __init__(self, facts: dict[type, Any]) -> None:
        self.facts = facts
        self.noops: list[str] = []
        self.name = "node-1"

    def get_fact(self, fact: type, *args: Any, **kwargs: Any) -> Any:
        value = self.facts[fact]
        return value(**kwargs) if callable(value) else value

    def noop(self, description: str) -> None:
        self.noops.append(description)


def dpkg_of(states: dict[str, dict[str, Any]]) -> Any:
    """A DpkgPackageState fact value (installed, held) from package states, per request."""

    def value(packages: list[str]) -> dict[str, dict[str, Any]]:
        empty = {"installed": None, "held": False}
        return {
            name: {key: states.get(name, empty)[key] for key in ("installed", "held")}
            for name in packages
        }

    return value


@contextmanager
def fake_host(facts: dict[type, Any]):  # type: ignore[no-untyped-def]
    host = FakeHost(facts)
    with ctx_host.use(host):
        yield host


def commands_of(operation: Callable[..., Any], facts: dict[type, Any], **kwargs: Any):
    """(commands the operation yields, its no-op messages)."""
    with fake_host(facts) as host:
        commands = [str(command) for command in operation._inner(**kwargs)]
    return commands, host.noops

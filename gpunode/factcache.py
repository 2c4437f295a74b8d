"""Fewer SSH round trips per deploy: facts read once per host until something changes it.

pyinfra 3 reads a fact with one SSH command every time an operation asks, and asks twice for
each operation: once while preparing (to tell whether it will change) and again while
executing. On a converged node nothing runs between those reads, so the second read always
returns what the first did; on a full-stack no-op run that is most of the round trips.

This cache keeps each host's fact values, keyed by fact, arguments and the connector
arguments that shape the read (sudo, user, environment). Anything that can change the host
clears that host's values before and after it runs: every operation command (shell, upload,
download, Python callback). A no-op run therefore reads each fact once; a run that changes
things re-reads after each change, as pyinfra does without it.

On top, ``prefetch`` reads many facts in ONE command per host (see ``FactBatch``): at the
start of a deploy, the facts this host was asked last time (remembered per host under
``.gpunode/facts/``) are read together and seed the cache.

Only the prepare and execute stages are cached; facts read anywhere else (the drift check,
tests) go straight to pyinfra.
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import importlib
import json
import os
import re
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyinfra.api import command as pyinfra_command
from pyinfra.api import facts as pyinfra_facts
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.api.command import StringCommand
from pyinfra.api.state import StateStage

CACHED_STAGES = (StateStage.Prepare, StateStage.Execute)
# Connector arguments that change what a fact command sees (who runs it, where, how).
_KEY_ARGUMENTS = tuple(sorted(CONNECTOR_ARGUMENT_KEYS))

# Never written to a plan file: a plan names facts, not credentials.
_SECRET_ARGUMENTS = ("_sudo_password", "_su_password", "_stdin")
_MISSING_COMMAND = pyinfra_facts._MISSING_COMMAND_MARKER

_values: dict[str, dict[str, Any]] = {}
_asked: dict[str, dict[str, dict[str, Any]]] = {}
_prefetched: set[str] = set()
_installed: dict[str, Callable[..., Any]] = {}
stats = {"hits": 0, "misses": 0, "clears": 0, "prefetched": 0, "prefetch_commands": 0}


def fact_key(cls: type, fact_kwargs: dict[str, Any], global_kwargs: dict[str, Any]) -> str:
    connector = {key: global_kwargs.get(key) for key in _KEY_ARGUMENTS}
    return json.dumps(
        [f"{cls.__module__}.{cls.__qualname__}", fact_kwargs, connector],
        sort_keys=True,
        default=repr,
    )


def clear(host_name: str) -> None:
    if _values.pop(host_name, None) is not None:
        stats["clears"] += 1


def _cached_get_fact(
    state: Any,
    host: Any,
    cls: type,
    args: Any = None,
    kwargs: Any = None,
    ensure_hosts: Any = None,
    apply_failed_hosts: bool = True,
) -> Any:
    original = _installed["_get_fact"]
    if state.current_stage not in CACHED_STAGES:
        return original(state, host, cls, args, kwargs, ensure_hosts, apply_failed_hosts)
    if not getattr(cls, "cacheable", True):
        return original(state, host, cls, args, kwargs, ensure_hosts, apply_failed_hosts)
    if host.name not in _prefetched:
        _prefetched.add(host.name)
        prefetch(state, host)
    fact_kwargs, global_kwargs = pyinfra_facts._handle_fact_kwargs(state, host, cls, args, kwargs)
    fact_kwargs = {name: value for name, value in fact_kwargs.items() if name != "self"}
    key = fact_key(cls, fact_kwargs, global_kwargs)
    _remember(host.name, key, cls, fact_kwargs, global_kwargs)
    values = _values.setdefault(host.name, {})
    if key in values:
        stats["hits"] += 1
        return copy.deepcopy(values[key])  # operations may change what they are given
    stats["misses"] += 1
    value = original(state, host, cls, args, kwargs, ensure_hosts, apply_failed_hosts)
    if host not in state.failed_hosts:  # a failed read is tried again, never remembered
        _values.setdefault(host.name, {})[key] = copy.deepcopy(value)
    return value


# --- the plan: which facts a deploy asked of a host last time ---------------------------------


def plan_path(host_name: str) -> Path:
    """One plan per host and deploy (the deploy files named on the command line)."""
    root = os.environ.get("GPUNODE_FACT_PLAN_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gpunode", "facts"
    )
    deploys = [arg for arg in sys.argv[1:] if arg.endswith(".py")]
    tag = hashlib.sha256(json.dumps(deploys).encode()).hexdigest()[:12]
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", host_name)
    return Path(root) / f"{safe}-{tag}.json"


def _remember(
    host_name: str,
    key: str,
    cls: type,
    fact_kwargs: dict[str, Any],
    global_kwargs: dict[str, Any],
) -> None:
    connector = {key: global_kwargs.get(key) for key in _KEY_ARGUMENTS}
    if any(connector.get(name) for name in _SECRET_ARGUMENTS):
        return
    record = {
        "fact": f"{cls.__module__}:{cls.__qualname__}",
        "kwargs": fact_kwargs,
        "connector": {k: v for k, v in connector.items() if k not in _SECRET_ARGUMENTS},
    }
    try:
        json.dumps(record)
    except (TypeError, ValueError):
        return  # arguments that do not survive JSON are simply read one by one
    _asked.setdefault(host_name, {})[key] = record


def write_plans() -> None:
    for host_name, records in _asked.items():
        path = plan_path(host_name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(".tmp")
            temporary.write_text(json.dumps(list(records.values())))
            temporary.replace(path)
        except OSError:
            pass  # a plan only saves time; failing to write one must not fail the deploy


def _load_plan(host_name: str) -> list[dict[str, Any]]:
    try:
        records = json.loads(plan_path(host_name).read_text())
    except (OSError, ValueError):
        return []
    return records if isinstance(records, list) else []


def _fact_class(name: str) -> type | None:
    module_name, _, qualname = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), qualname)
    except (ImportError, AttributeError, ValueError):
        return None
    return cls if isinstance(cls, type) and getattr(cls, "cacheable", True) else None


def _raw(command: Any) -> str:
    return command.get_raw_value() if isinstance(command, StringCommand) else str(command)


def batch_script(facts: list[tuple[Any, dict[str, Any]]], marker: str) -> str:
    """One shell script printing each fact's output, framed by ``marker`` lines with its
    exit status, the way pyinfra would have run it alone (``requires_command`` included).

    ``facts`` are (fact instance, arguments); a fact's ``process`` must be called on the same
    instance, since some keep their arguments from ``command`` (pyinfra's Sha1File does).
    """
    parts = []
    for index, (fact, kwargs) in enumerate(facts):
        command = _raw(pyinfra_facts._make_command(fact.command, dict(kwargs)))
        requires = pyinfra_facts._make_command(fact.requires_command, dict(kwargs))
        if requires:
            command = (
                f"if command -v {_raw(requires)} >/dev/null 2>&1; then ( {command} ); "
                f"else echo '{_MISSING_COMMAND}'; fi"
            )
        parts.append(
            f'out=$( ( {command}\n) 2>/dev/null ); status=$?; echo "{marker} {index} $status"; '
            '[ -n "$out" ] && printf \'%s\\n\' "$out"'
        )
    return "\n".join(parts) + "\ntrue\n"  # the script succeeds whatever each fact did


def parse_batch(lines: list[str], marker: str, count: int) -> dict[int, list[str]]:
    """index -> output lines, for the facts whose command exited 0."""
    sections: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        if line.startswith(marker + " "):
            _, index, status = line.split(" ")
            current = sections.setdefault(int(index), []) if status == "0" else None
        elif current is not None:
            current.append(line)
    return {index: lines for index, lines in sections.items() if index < count}


def prefetch(state: Any, host: Any) -> None:
    """Read every fact of this host's plan in one command per connector setting; each value
    seeds the cache. A fact that fails, is missing its tool or cannot be parsed is left for
    pyinfra to read on its own, with its usual error handling."""
    groups: dict[str, list[tuple[str, type, dict[str, Any]]]] = {}
    connectors: dict[str, dict[str, Any]] = {}
    for record in _load_plan(host.name):
        cls = _fact_class(str(record.get("fact")))
        if cls is None or not isinstance(record.get("kwargs"), dict):
            continue
        connector = {k: v for k, v in (record.get("connector") or {}).items() if v is not None}
        group = json.dumps(connector, sort_keys=True)
        connectors[group] = connector
        key = fact_key(cls, record["kwargs"], record.get("connector") or {})
        groups.setdefault(group, []).append((key, cls, record["kwargs"]))
    for group, entries in groups.items():
        marker = f"gpunode-prefetch-{secrets.token_hex(8)}"
        instances = [cls() for _, cls, _ in entries]
        script = batch_script(
            [(fact, kwargs) for fact, (_, _, kwargs) in zip(instances, entries, strict=True)],
            marker,
        )
        stats["prefetch_commands"] += 1
        try:
            ok, output = host.run_shell_command(
                StringCommand(script),
                # As pyinfra prints a fact's command and output (-vv, -vvv), so the batch's.
                print_output=state.print_fact_output,
                print_input=state.print_fact_input,
                **connectors[group],
            )
        except Exception:  # the facts are read one by one instead
            continue
        if not ok:
            continue
        values = _values.setdefault(host.name, {})
        for index, lines in parse_batch(output.stdout_lines, marker, len(entries)).items():
            key, fact = entries[index][0], instances[index]
            if lines == [_MISSING_COMMAND]:
                continue
            try:
                values[key] = fact.process(lines) if lines else fact.default()
            except Exception:
                continue
            stats["prefetched"] += 1


def _clearing(execute: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(self: Any, state: Any, host: Any, connector_arguments: Any) -> Any:
        clear(host.name)
        try:
            return execute(self, state, host, connector_arguments)
        finally:
            clear(host.name)

    return wrapper


def install() -> None:
    """Cache facts for deploys run by this process (idempotent)."""
    if _installed:
        return
    _installed["_get_fact"] = pyinfra_facts._get_fact
    pyinfra_facts._get_fact = _cached_get_fact
    atexit.register(write_plans)
    for name in (
        "StringCommand",
        "FileUploadCommand",
        "FileDownloadCommand",
        "FunctionCommand",
        "RsyncCommand",
    ):
        command_class = getattr(pyinfra_command, name)
        _installed[name] = command_class.execute
        command_class.execute = _clearing(command_class.execute)


def uninstall() -> None:
    if not _installed:
        return
    pyinfra_facts._get_fact = _installed.pop("_get_fact")
    atexit.unregister(write_plans)
    for name, execute in _installed.items():
        getattr(pyinfra_command, name).execute = execute
    _installed.clear()
    _values.clear()
    _asked.clear()
    _prefetched.clear()

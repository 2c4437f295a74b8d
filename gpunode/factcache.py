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

On top, ``prefetch`` reads many facts in ONE command per host (``batch_script``, framed by
``gpunode.framing``, each fact as pyinfra would run it alone): at
the start of a deploy, the facts this host was asked last time (remembered per host under
``~/.cache/gpunode/facts/``) are read together and seed the cache.

A plan file is read back as a list of commands to run on the node, with sudo, so it is
trusted no further than it is checked: the directory is 0700 and each file 0600, and a plan
that is not owned by this user or is writable by anyone else is ignored. Each fact it names
must be on an allow-list (gpunode's own facts, and the few pyinfra facts the deploys read,
each with the arguments it may take and what each may hold: never a fact that runs a
command it is given, such as pyinfra's ``server.Command``). Of the connector arguments a
plan keeps only who runs the fact (``_sudo``, ``_sudo_user``, ``_use_sudo_login``); a fact
read with any other (an ``_env``, which may hold proxy credentials, a password, a working
directory, another shell) is never planned and is read on its own, as pyinfra does.

Only the prepare and execute stages are cached; facts read anywhere else (the drift check,
tests) go straight to pyinfra. What this takes from pyinfra's internals (``_get_fact``, the
commands' ``execute``, how pyinfra splits a fact's arguments and makes its command) it takes
through gpunode.pyinfra_patches, which refuses a pyinfra version it was not written for.
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import importlib
import inspect
import itertools
import json
import os
import re
import secrets
import shlex
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyinfra.api import FactBase
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.api.command import StringCommand
from pyinfra.api.state import StateStage
from pyinfra.facts.files import Directory, File, Link, Sha1File
from pyinfra.facts.systemd import SYSTEMD_UNIT_NAME_REGEX, SystemdEnabled, SystemdStatus

from gpunode import framing, pyinfra_patches, remote_script
from gpunode.sanitize import nested_deeper_than

CACHED_STAGES = (StateStage.Prepare, StateStage.Execute)
# What a host's prefetch batch may answer (read so: gpunode.remote_script): a deploy's batch
# answers some tens of kB; past this, or this late, its facts are read one by one instead.
PREFETCH_LIMITS = remote_script.Limits(max_bytes=8 << 20, max_lines=200_000, deadline_s=300)
# Connector arguments that change what a fact command sees (who runs it, where, how).
_KEY_ARGUMENTS = tuple(sorted(CONNECTOR_ARGUMENT_KEYS))

_values: dict[str, dict[str, Any]] = {}
_asked: dict[str, dict[str, dict[str, Any]]] = {}
_prefetched: set[str] = set()
_installed: dict[str, pyinfra_patches.Patch] = {}
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
    original = _installed["_get_fact"].original
    if state.current_stage not in CACHED_STAGES:
        return original(state, host, cls, args, kwargs, ensure_hosts, apply_failed_hosts)
    if not getattr(cls, "cacheable", True):
        return original(state, host, cls, args, kwargs, ensure_hosts, apply_failed_hosts)
    if host.name not in _prefetched:
        _prefetched.add(host.name)
        prefetch(state, host)
    fact_kwargs, global_kwargs = pyinfra_patches.fact_arguments(state, host, cls, args, kwargs)
    fact_kwargs = {name: value for name, value in fact_kwargs.items() if name != "self"}
    key = fact_key(cls, fact_kwargs, global_kwargs)
    _remember(host.name, key, cls, fact_kwargs, global_kwargs)
    values = _values.setdefault(host.name, {})
    if key in values:
        stats["hits"] += 1
        return copy.deepcopy(values[key])  # operations may change what they are given
    stats["misses"] += 1
    value = original(state, host, cls, args, kwargs, ensure_hosts, apply_failed_hosts)
    # A failed read is tried again, never remembered; so is a value nested too deep to copy
    # (copy.deepcopy recurses once per level: a node's nesting must not crash the deploy).
    if host not in state.failed_hosts and not nested_deeper_than(value):
        _values.setdefault(host.name, {})[key] = copy.deepcopy(value)
    return value


# --- the plan: which facts a deploy asked of a host last time ---------------------------------

Check = Callable[[Any], bool]  # whether a planned value may be used
PLAN_DIR_MODE = 0o700
PLAN_FILE_MODE = 0o600
MAX_PLAN_BYTES = 4 * 1024 * 1024
MAX_TEXT = 4096
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# What a value of gpunode's own facts may hold: some of them put values into their command
# unquoted (package names from gpunode's tables), so a plan may only hold plain words.
_WORD = re.compile(r"[A-Za-z0-9_.,:/@+=*-]*")
_COMMAND_NAME = re.compile(r"[A-Za-z0-9_.+-]{1,64}")
_ACCOUNT = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_TEMP_DIR = re.compile(r"/[A-Za-z0-9_./-]{0,255}")
_GPUNODE_FACT = re.compile(r"(facts|roles)(\.[a-z_][a-z0-9_]*)+:[A-Z][A-Za-z0-9]*")


def _is_text(value: Any) -> bool:
    """Text a pyinfra fact shell-quotes itself: any, but no control characters."""
    return isinstance(value, str) and len(value) <= MAX_TEXT and not _CONTROL.search(value)


def _is_word(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= MAX_TEXT and bool(_WORD.fullmatch(value))


def _is_scalar_word(value: Any) -> bool:
    if value is None or isinstance(value, bool | int):
        return True
    return _is_word(value)


def _is_words(value: Any) -> bool:
    """A word (or number, flag, None) or a flat list of them."""
    return _is_scalar_word(value) or _list_of(_is_scalar_word)(value)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_false(value: Any) -> bool:
    return value is False


def _is_true(value: Any) -> bool:
    return value is True


def _is_none(value: Any) -> bool:
    return value is None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1 << 40


def _optional(check: Check) -> Check:
    return lambda value: value is None or check(value)


def _list_of(check: Check) -> Check:
    return lambda value: isinstance(value, list) and len(value) <= 1024 and all(map(check, value))


_PATH_ONLY: dict[str, Check] = {"path": _is_text}
_SYSTEMD: dict[str, Check] = {
    "services": lambda value: value is None or _is_text(value) or _list_of(_is_text)(value),
    "user_mode": _is_false,
    "machine": _is_none,
    "user_name": _is_none,
}
# The pyinfra facts gpunode's deploys (and the pyinfra operations they use) read, with what
# each argument may hold. Values that pyinfra shell-quotes may be any text; those it puts
# into the command as they are (FindInFile's interpolated pattern, FindFiles' extra find
# arguments and sizes, systemctl's --machine) are held to values that add no shell syntax.
PYINFRA_FACTS: dict[str, dict[str, Check]] = {
    "pyinfra.facts.files:File": _PATH_ONLY,
    "pyinfra.facts.files:Directory": _PATH_ONLY,
    "pyinfra.facts.files:Link": _PATH_ONLY,
    "pyinfra.facts.files:Sha1File": _PATH_ONLY,
    "pyinfra.facts.files:FindInFile": {
        "path": _is_text,
        "pattern": _is_text,
        "interpolate_variables": _is_false,
        "extended_regex": _is_bool,
    },
    "pyinfra.facts.files:FindFiles": {
        "path": _is_text,
        "fname": _optional(_is_text),
        "iname": _optional(_is_text),
        "regex": _optional(_is_text),
        "path_match": _optional(_is_text),
        "size": _optional(_is_count),
        "min_size": _optional(_is_count),
        "max_size": _optional(_is_count),
        "maxdepth": _optional(_is_count),
        "args": _is_none,
        "quote_path": _is_true,
    },
    "pyinfra.facts.server:Which": {"command": lambda value: bool(_is_command_name(value))},
    "pyinfra.facts.server:Users": {},
    "pyinfra.facts.server:Groups": {},
    "pyinfra.facts.server:Os": {},
    "pyinfra.facts.server:TmpDir": {},
    # The node's clock, read with the batch at the start of the run (apt's list age).
    "pyinfra.facts.server:Date": {},
    # ``~user`` goes into the command unquoted: the account name must be one.
    "pyinfra.facts.server:AuthorizedKeys": {
        "user": lambda value: bool(isinstance(value, str) and _ACCOUNT.fullmatch(value)),
        "path": _optional(_is_text),
    },
    "pyinfra.facts.systemd:SystemdStatus": _SYSTEMD,
    "pyinfra.facts.systemd:SystemdEnabled": _SYSTEMD,
    "pyinfra.facts.deb:DebPackages": {},
}


def _is_command_name(value: Any) -> bool:
    return isinstance(value, str) and bool(_COMMAND_NAME.fullmatch(value))


# Connector arguments a plan keeps, with what each may hold: who runs the fact.
PLAN_CONNECTOR_ARGUMENTS: dict[str, Check] = {
    "_sudo": _optional(_is_bool),
    "_sudo_user": lambda value: (
        value is None or bool(isinstance(value, str) and _ACCOUNT.fullmatch(value))
    ),
    "_use_sudo_login": _optional(_is_bool),
    # Where uploads go (config.py sets /tmp): nothing a fact reads depends on it. Planned
    # all the same, as a plain absolute path: without it, no plan was ever written.
    "_temp_dir": lambda value: (
        value is None or bool(isinstance(value, str) and _TEMP_DIR.fullmatch(value))
    ),
}
# The other connector arguments may only hold values that change nothing about what a fact
# reads: pyinfra's defaults (no environment, sh, exit code 0), or a retry count or timeout.
_INERT_CONNECTOR_VALUES: dict[str, Any] = {
    "_env": {},
    "_shell_executable": "sh",
    "_success_exit_codes": [0],
}
_TIMING_ARGUMENTS = ("_retries", "_retry_delay", "_timeout")


def _is_inert(name: str, value: Any) -> bool:
    if value is None:
        return True  # not given at all
    if name in _INERT_CONNECTOR_VALUES:
        return bool(value == _INERT_CONNECTOR_VALUES[name])
    if name in _TIMING_ARGUMENTS:
        return _is_count(value)
    return value is False


def _fact_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _argument_checks(name: str, cls: type) -> dict[str, Check] | None:
    """The arguments ``cls`` may be planned with and what each may hold; None when it may
    not be planned at all."""
    if name in PYINFRA_FACTS:
        return PYINFRA_FACTS[name]
    if not _GPUNODE_FACT.fullmatch(name):
        return None
    try:
        parameters = inspect.signature(cls().command).parameters
    except (TypeError, ValueError):
        return None
    checks: dict[str, Check] = {}
    for parameter in parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            return None  # a fact taking anything at all is never planned
        checks[parameter.name] = _is_words
    return checks


def plan_connector(global_kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The connector arguments to plan a fact read with, or None when the read must not be
    planned (it used an environment, a password, another shell...)."""
    connector = {key: global_kwargs.get(key) for key in _KEY_ARGUMENTS}
    for key, value in connector.items():
        check = PLAN_CONNECTOR_ARGUMENTS.get(key)
        if not (check(value) if check else _is_inert(key, value)):
            return None
    return connector


def checked_record(record: Any) -> tuple[type, dict[str, Any], dict[str, Any]] | None:
    """(fact class, its arguments, connector arguments) of a plan record that passes every
    check, else None. No module is imported because a plan names it: gpunode's facts must
    already be loaded by the deploy; pyinfra's are a fixed list."""
    if not isinstance(record, dict) or set(record) != {"fact", "kwargs", "connector"}:
        return None
    name, kwargs, connector = record["fact"], record["kwargs"], record["connector"]
    if not (isinstance(name, str) and isinstance(kwargs, dict) and isinstance(connector, dict)):
        return None
    cls = _fact_class(name)
    if cls is None:
        return None
    checks = _argument_checks(name, cls)
    if checks is None or not set(kwargs) <= set(checks):
        return None
    if not all(checks[key](value) for key, value in kwargs.items()):
        return None
    try:
        inspect.signature(cls().command).bind(**kwargs)  # nothing required is missing
    except (TypeError, ValueError):
        return None
    if not set(connector) <= set(_KEY_ARGUMENTS):
        return None
    planned = plan_connector(connector)  # an argument left out is one not given
    if planned is None:
        return None
    return cls, kwargs, planned


def plan_directory() -> Path:
    return Path(
        os.environ.get("GPUNODE_FACT_PLAN_DIR")
        or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gpunode", "facts"
        )
    )


def plan_path(host_name: str) -> Path:
    """One plan per host and deploy (the deploy files named on the command line)."""
    deploys = [arg for arg in sys.argv[1:] if arg.endswith(".py")]
    tag = hashlib.sha256(json.dumps(deploys).encode()).hexdigest()[:12]
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", host_name)
    return plan_directory() / f"{safe}-{tag}.json"


def _remember(
    host_name: str,
    key: str,
    cls: type,
    fact_kwargs: dict[str, Any],
    global_kwargs: dict[str, Any],
) -> None:
    connector = plan_connector(global_kwargs)
    if connector is None:
        return
    record = {"fact": _fact_name(cls), "kwargs": fact_kwargs, "connector": connector}
    try:
        record = json.loads(json.dumps(record))
    except (TypeError, ValueError):
        return  # arguments that do not survive JSON are simply read one by one
    if checked_record(record) is None:
        return  # what a plan would refuse to read back is never written
    _asked.setdefault(host_name, {})[key] = record


def _private(st: os.stat_result) -> bool:
    """Owned by this user and writable by nobody else."""
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _private_directory(directory: Path) -> bool:
    """The plan directory, made 0700 when it is new; False when it is not ours."""
    try:
        directory.mkdir(mode=PLAN_DIR_MODE, parents=True, exist_ok=True)
        st = directory.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            return False
        if stat.S_IMODE(st.st_mode) != PLAN_DIR_MODE:
            directory.chmod(PLAN_DIR_MODE)
    except OSError:
        return False
    return True


def write_plans() -> None:
    for host_name, records in _asked.items():
        path = plan_path(host_name)
        if not _private_directory(path.parent):
            continue  # a plan only saves time; failing to write one must not fail the deploy
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        try:
            descriptor = os.open(
                temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PLAN_FILE_MODE
            )
            with os.fdopen(descriptor, "w") as handle:
                handle.write(json.dumps(list(records.values())))
            os.chmod(temporary, PLAN_FILE_MODE)
            temporary.replace(path)
        except OSError:
            temporary.unlink(missing_ok=True)


def _load_plan(host_name: str) -> list[tuple[type, dict[str, Any], dict[str, Any]]]:
    """The checked records of this host's plan; nothing when the file is not private."""
    path = plan_path(host_name)
    try:
        if not _private(path.parent.lstat()):
            return []
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return []
    try:
        st = os.fstat(descriptor)
        if not stat.S_ISREG(st.st_mode) or not _private(st) or st.st_size > MAX_PLAN_BYTES:
            return []
        with os.fdopen(descriptor, "rb", closefd=False) as handle:
            records = json.loads(handle.read(MAX_PLAN_BYTES))
    except (OSError, ValueError):
        return []
    finally:
        os.close(descriptor)
    if not isinstance(records, list):
        return []
    return [checked for checked in map(checked_record, records) if checked is not None]


def _fact_class(name: str) -> type | None:
    """The cacheable fact class ``name`` (module:Class) names, if it may be planned."""
    module_name, _, qualname = name.partition(":")
    module: Any = None
    if name in PYINFRA_FACTS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            return None
    elif _GPUNODE_FACT.fullmatch(name):
        module = sys.modules.get(module_name)  # never imported on a plan's word
    if module is None:
        return None
    cls = getattr(module, qualname, None)
    if not (isinstance(cls, type) and issubclass(cls, FactBase)) or _fact_name(cls) != name:
        return None
    return cls if getattr(cls, "cacheable", True) else None


def _raw(command: Any) -> str:
    return command.get_raw_value() if isinstance(command, StringCommand) else str(command)


def batch_parts(facts: list[tuple[Any, dict[str, Any]]]) -> dict[int, tuple[framing.Part, ...]]:
    """index -> the framing parts that read ``facts[index]`` as pyinfra would read it alone:
    its command's stdout (stderr, which pyinfra does not hand to ``process``, dropped), its
    ``requires_command`` checked first. A fact whose required command is no plain program
    name cannot be checked that way and has no part: pyinfra reads it on its own. A fact
    read with others of its kind (``batch_groups``) has no part of its own either. A fact made
    of framing parts (``parts()``) gives the batch those parts, each named after the fact.

    ``facts`` are (fact instance, arguments); a fact's ``process`` must be called on the same
    instance, since some keep their arguments from ``command`` (pyinfra's Sha1File does).
    """
    parts = {}
    grouped = {index for members in batch_groups(facts).values() for index in members}
    for index, (fact, kwargs) in enumerate(facts):
        command = _raw(pyinfra_patches.make_command(fact.command, kwargs))
        requires = pyinfra_patches.make_command(fact.requires_command, kwargs)
        if index in grouped:
            continue
        own = _own_parts(fact, kwargs) if not requires else None
        if own is not None:
            # The fact's parts become the batch's, so that the Python parts of every fact
            # run in the batch's one Python process (gpunode.framing).
            parts[index] = tuple(framing.prefixed(f"fact{index}", own))
            continue
        try:
            parts[index] = (
                framing.Part(
                    f"fact{index}",
                    command,
                    requires=_raw(requires) if requires else None,
                    stderr="drop",
                ),
            )
        except ValueError:
            continue
    return parts


def _own_parts(fact: Any, kwargs: dict[str, Any]) -> list[framing.Part] | None:
    """The framing parts a fact's command is made of (its ``parts()``, taking the command's
    arguments), where it has them; else None."""
    parts = getattr(fact, "parts", None)
    if not callable(parts):
        return None
    return list(parts(**kwargs))


# pyinfra facts that, for one path, run one program on it once shell tests say it exists:
# a no-op deploy reads some eighty of them per host. A batch runs that program once over all
# their paths (one stat, one sha1sum: not eighty programs and subshells) and hands each fact
# the line it would have printed alone. The stat format is pyinfra's File command's (GNU
# stat; where it fails, every fact of the group is read alone, with pyinfra's fallbacks).
STAT_FORMAT = "user=%U group=%G mode=%A atime=%X mtime=%Y ctime=%Z size=%s %N"
_PATH_GROUPS: dict[type, str] = {File: "stat", Directory: "stat", Link: "stat", Sha1File: "sha1"}
# As the facts' own commands test: a directory has no hash (sha1sum fails on it, and
# pyinfra's Sha1File then prints nothing).
_GROUP_EXISTS = {"stat": 'test -e "$p" || test -L "$p"', "sha1": 'test -e "$p" && ! test -d "$p"'}
_GROUP_PROGRAM = {"stat": f"stat -c {shlex.quote(STAT_FORMAT)} --", "sha1": "sha1sum --"}
_EXISTS = "exists "
# pyinfra's SystemdStatus and SystemdEnabled, asked of named system units: a no-op deploy
# asks some twenty of them, each one ``systemctl show`` of a unit or two. The batch asks
# systemctl once for every unit named, with both facts' properties (``systemctl show``
# prints one block per unit named, in the order named, blank-line separated, duplicates
# included), and hands each fact the blocks of its own units: what it would have printed
# alone, plus the other fact's property line, which its parser passes over.
_SYSTEMD_FACTS = (SystemdStatus, SystemdEnabled)
_SYSTEMD_PROPERTIES = ("Id", SystemdStatus.state_key, SystemdEnabled.state_key)
# A unit named literally (no glob: ``*`` would expand to several blocks), as pyinfra's
# facts match a unit's name.
_LITERAL_UNIT = re.compile(SYSTEMD_UNIT_NAME_REGEX)


def _systemd_units(kwargs: dict[str, Any]) -> list[str] | None:
    """The units a SystemdStatus / SystemdEnabled read names, when it may join the group:
    system units (no --user, --machine), each named literally."""
    if set(kwargs) - {"services", "user_mode", "machine", "user_name"}:
        return None
    if kwargs.get("user_mode") or kwargs.get("machine") is not None:
        return None
    if kwargs.get("user_name") is not None:
        return None
    services = kwargs.get("services")
    units = [services] if isinstance(services, str) else services
    if not isinstance(units, list) or not units:
        return None
    if not all(isinstance(unit, str) and _LITERAL_UNIT.fullmatch(unit) for unit in units):
        return None
    return units


# A fact class of gpunode's may answer a group of its reads with one command of its own: it
# defines ``groupable(kwargs)`` (whether a read may join), ``grouped_command(members)`` and
# ``grouped_outputs(lines, members)`` (each member's lines as its own command prints them),
# members being the reads' arguments (facts.container_runtime.DpkgPackageState: one
# dpkg-query for every package a deploy asks about).
_CLASS_GROUP = "class-"
_CLASS_PROTOCOL = ("groupable", "grouped_command", "grouped_outputs")


def _groups_itself(fact: Any, kwargs: dict[str, Any]) -> bool:
    cls = type(fact)
    if not all(callable(getattr(cls, name, None)) for name in _CLASS_PROTOCOL):
        return False
    return bool(cls.groupable(kwargs)) and not fact.requires_command(**kwargs)


def _group_of(fact: Any, kwargs: dict[str, Any]) -> str | None:
    """Which group ``fact`` (with ``kwargs``) is read in, if any (see batch_groups)."""
    if _groups_itself(fact, kwargs):
        return f"{_CLASS_GROUP}{type(fact).__name__}"
    if type(fact) in _SYSTEMD_FACTS:
        return "systemd" if _systemd_units(kwargs) is not None else None
    group = _PATH_GROUPS.get(type(fact))
    path = kwargs.get("path")
    if group is None or set(kwargs) != {"path"} or not isinstance(path, str):
        return None
    if not path or "\n" in path or "\r" in path or fact.requires_command():
        return None
    return group


def batch_groups(facts: list[tuple[Any, dict[str, Any]]]) -> dict[str, list[int]]:
    """Group name -> indexes of the facts of ``facts`` read together: pyinfra's path facts
    asked of one path (no newline in it, so that each answer is one line), with nothing
    else required (see STAT_FORMAT), its systemd facts asked of named system units (see
    _SYSTEMD_FACTS), and the reads of a fact class that groups its own (_CLASS_GROUP)."""
    groups: dict[str, list[int]] = {}
    for index, (fact, kwargs) in enumerate(facts):
        group = _group_of(fact, kwargs)
        if group is not None:
            groups.setdefault(group, []).append(index)
    return {name: members for name, members in groups.items() if len(members) > 1}


def _group_part(name: str, members: list[dict[str, Any]], cls: Any = None) -> framing.Part:
    """The one part reading every member (the members' arguments, in order; ``cls``: the
    fact class of a class group)."""
    if name.startswith(_CLASS_GROUP):
        return framing.Part(f"group-{name}", str(cls.grouped_command(members)), stderr="drop")
    if name == "systemd":
        units = [unit for kwargs in members for unit in _systemd_units(kwargs) or []]
        properties = " ".join(f"--property {prop}" for prop in _SYSTEMD_PROPERTIES)
        listed = " ".join(shlex.quote(unit) for unit in units)
        return framing.Part(
            "group-systemd",
            f"systemctl show --all {properties} {listed}",
            requires="systemctl",
            stderr="drop",
        )
    # "exists <n>" for each path that exists, then the program's line for each of them.
    listed = " ".join(shlex.quote(kwargs["path"]) for kwargs in members)
    return framing.Part(
        f"group-{name}",
        f"set --; n=0; for p in {listed}; do if {_GROUP_EXISTS[name]}; then "
        f'set -- "$@" "$p"; echo "{_EXISTS}$n"; fi; n=$((n + 1)); done; '
        f'[ "$#" -eq 0 ] || {_GROUP_PROGRAM[name]} "$@"',
        stderr="drop",
    )


def _systemd_outputs(
    part: framing.PartOutput, members: list[int], facts: list[tuple[Any, dict[str, Any]]]
) -> dict[int, framing.PartOutput]:
    """Each member's blocks, as if its fact had run alone; none at all unless systemctl
    exited 0 and printed one block, starting with its Id, for every unit named."""
    if part.absent:  # no systemctl: each fact's default, as pyinfra gives it
        return {index: framing.PartOutput(f"fact{index}", absent=True) for index in members}
    if not part.complete or part.problem is not None or part.exit_status != 0:
        return {}
    blocks: list[list[str]] = [[]]
    for line in part.lines:
        if line.strip():
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    blocks = [block for block in blocks if block]
    units = [_systemd_units(facts[index][1]) or [] for index in members]
    if len(blocks) != sum(map(len, units)):
        return {}
    if any(not block[0].startswith("Id=") for block in blocks):
        return {}
    outputs, position = {}, 0
    for index, named in zip(members, units, strict=True):
        lines = [line for block in blocks[position : position + len(named)] for line in block]
        outputs[index] = framing.PartOutput(f"fact{index}", lines=lines, exit_status=0)
        position += len(named)
    return outputs


def _class_outputs(
    part: framing.PartOutput, members: list[int], facts: list[tuple[Any, dict[str, Any]]]
) -> dict[int, framing.PartOutput]:
    """Each member's lines from its class's ``grouped_outputs``; none unless the group's
    command exited 0 and the class gave one list of lines per member."""
    if not part.complete or part.problem is not None or part.exit_status != 0:
        return {}
    cls = type(facts[members[0]][0])
    try:
        outputs = cls.grouped_outputs(part.lines, [facts[index][1] for index in members])
    except Exception:  # a parser bug leaves the facts to be read one by one
        return {}
    if not isinstance(outputs, list) or len(outputs) != len(members):
        return {}
    return {
        index: framing.PartOutput(f"fact{index}", lines=list(lines), exit_status=0)
        for index, lines in zip(members, outputs, strict=True)
    }


def _group_outputs(part: framing.PartOutput, members: list[int]) -> dict[int, framing.PartOutput]:
    """Each member's output as if its fact had run alone; none at all unless the program
    exited 0 and gave one line for each path that exists."""
    if not part.complete or part.problem is not None or part.exit_status != 0:
        return {}
    existing = [line for line in part.lines if line.startswith(_EXISTS)]
    answers = part.lines[len(existing) :]
    positions = [line.removeprefix(_EXISTS) for line in existing]
    if len(answers) != len(existing) or any(not p.isdigit() for p in positions):
        return {}
    lines = {int(position): [answer] for position, answer in zip(positions, answers, strict=True)}
    if not set(lines) <= set(range(len(members))):
        return {}
    return {
        index: framing.PartOutput(f"fact{index}", lines=lines.get(n, []), exit_status=0)
        for n, index in enumerate(members)
    }


def batch_script(
    facts: list[tuple[Any, dict[str, Any]]],
    parts: dict[int, tuple[framing.Part, ...]] | None = None,
) -> str:
    """ONE shell command reading every fact of ``facts`` (see ``batch_parts``, ``batch_groups``);
    ``parts``: ``batch_parts(facts)``, where the caller has made them already."""
    groups = [
        _group_part(name, [facts[index][1] for index in members], type(facts[members[0]][0]))
        for name, members in batch_groups(facts).items()
    ]
    parts = batch_parts(facts) if parts is None else parts
    return framing.command([*itertools.chain(*parts.values()), *groups])


def parse_batch(
    lines: list[str],
    facts: list[tuple[Any, dict[str, Any]]],
    parts: dict[int, tuple[framing.Part, ...]] | None = None,
) -> dict[int, framing.PartOutput]:
    """index -> what that fact's part printed (or, for a fact read in a group, what it would
    have printed alone), for the parts whose output came back whole. ``parts``: the
    ``batch_parts(facts)`` the script was made of, where the caller has them."""
    groups = batch_groups(facts)
    parts = batch_parts(facts) if parts is None else parts
    # Facts made of parts of their own: each of their parts is one of the batch's.
    own = {index: made for index, made in parts.items() if made[0].name != f"fact{index}"}
    names = [f"fact{index}" for index in range(len(facts)) if index not in own]
    names += [part.name for made in own.values() for part in made]
    names += [f"group-{g}" for g in groups]
    frame = framing.parse(lines, names)
    outputs = {
        int(name.removeprefix("fact")): part
        for name, part in frame.parts.items()
        if name.startswith("fact") and "." not in name and part.complete and part.problem is None
    }
    for index, made in own.items():
        prefix = f"fact{index}"
        names = [part.name.removeprefix(f"{prefix}.") for part in made]
        fact_lines, _ = framing.unprefixed_output(frame, prefix, names)
        if fact_lines is not None:
            outputs[index] = framing.PartOutput(f"fact{index}", lines=fact_lines, exit_status=0)
    for name, members in groups.items():
        part = frame.parts.get(f"group-{name}")
        if part is None:
            continue
        if name.startswith(_CLASS_GROUP):
            outputs.update(_class_outputs(part, members, facts))
        elif name == "systemd":
            outputs.update(_systemd_outputs(part, members, facts))
        else:
            outputs.update(_group_outputs(part, members))
    return outputs


def batched_value(fact: Any, part: framing.PartOutput) -> tuple[bool, Any]:
    """(whether pyinfra would have read a value, the value) for one fact's part: its
    default where its required command is missing or it printed nothing, its processed
    stdout where it exited 0; a failed command is no value (pyinfra reads it again, and
    reports the failure)."""
    if part.absent:
        return True, fact.default()
    if part.exit_status != 0:
        return False, None
    return True, fact.process(part.lines) if part.lines else fact.default()


def prefetch(state: Any, host: Any) -> None:
    """Read every fact of this host's plan in one command per connector setting; each value
    seeds the cache. A fact that fails or cannot be parsed is left for pyinfra to read on its
    own, with its usual error handling; one whose required command is missing gets its
    default, as pyinfra gives it."""
    groups: dict[str, list[tuple[str, type, dict[str, Any]]]] = {}
    connectors: dict[str, dict[str, Any]] = {}
    for cls, kwargs, record_connector in _load_plan(host.name):
        connector = {k: v for k, v in record_connector.items() if v is not None}
        group = json.dumps(connector, sort_keys=True)
        connectors[group] = connector
        key = fact_key(cls, kwargs, record_connector)
        groups.setdefault(group, []).append((key, cls, kwargs))
    for group, entries in groups.items():
        instances = [cls() for _, cls, _ in entries]
        batched = [(fact, kwargs) for fact, (_, _, kwargs) in zip(instances, entries, strict=True)]
        # Made once: the script and the reading of its output need the same parts.
        parts = batch_parts(batched)
        script = batch_script(batched, parts)
        stats["prefetch_commands"] += 1
        try:
            output = remote_script.run(
                host,
                script,
                connectors[group],
                PREFETCH_LIMITS,
                # As pyinfra prints a fact's command and output (-vv, -vvv), so the batch's.
                print_input=state.print_fact_input,
                print_output=state.print_fact_output,
            )
        except Exception:  # too much, too late or failed: the facts are read one by one
            continue
        if output.exit_status != 0:
            continue
        values = _values.setdefault(host.name, {})
        for index, part in parse_batch(output.stdout_lines, batched, parts).items():
            key, fact = entries[index][0], instances[index]
            try:
                read, value = batched_value(fact, part)
            except Exception:
                continue
            if read and not nested_deeper_than(value):
                values[key] = value
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
    """Cache facts for deploys run by this process (idempotent). Refuses, before anything is
    patched, a pyinfra version gpunode.pyinfra_patches was not written for."""
    if _installed:
        return
    _installed["_get_fact"] = pyinfra_patches.replace_get_fact(_cached_get_fact)
    atexit.register(write_plans)
    for patch in pyinfra_patches.wrap_command_execute(_clearing):
        _installed[patch.owner.__name__] = patch


def uninstall() -> None:
    if not _installed:
        return
    atexit.unregister(write_plans)
    for patch in reversed(_installed.values()):
        patch.undo()
    _installed.clear()
    _values.clear()
    _asked.clear()
    _prefetched.clear()

"""Every patch of pyinfra, and every call into its private API, in one place.

gpunode changes how pyinfra 3 runs in two ways, and reads a few of its internals to do so:

- The fact cache (gpunode.factcache) reads every fact through its own function in place of
  ``pyinfra.api.facts._get_fact``. It keys a read with pyinfra's ``_handle_fact_kwargs`` and
  batches reads as pyinfra would run each (``_make_command``),
  and it wraps each command class's ``execute`` to forget a host's facts when anything runs.
- Per-node failures (gpunode.refusal) wrap ``pyinfra.api.operations._run_host_op``, so an
  OperationError raised while one host executes fails that host as a failed command would
  (recorded the way pyinfra records one).
- Roles run an operation inside another with pyinfra's ``_inner`` idiom (``inner`` below).
- pyinfra's ``all_global_arguments`` (the global arguments' type hints, evaluated anew by
  ``typing.get_type_hints`` for every operation and fact call) is read once per process
  (``remember_global_arguments``).
- Deploys order operations with ``operation_order`` in place of pyinfra's
  ``get_operation_order_from_stack``: the same line numbers, read from the frames themselves
  rather than through ``inspect.stack()``, which reads the source of every frame of the stack
  (and scans every loaded module for each) on each operation call: more than a second of
  control CPU in a no-op deploy of two nodes.

None of that is pyinfra's public API: any release may change it. So every function here first
checks the installed pyinfra against SUPPORTED_VERSIONS and refuses, naming both, a version
it was not written for; and ``WRITTEN_AGAINST`` holds the signature of each private (or
internal) name used here, which tests/unit/test_pyinfra_patches.py compares with the
installed pyinfra, one named test each. No other module of gpunode touches pyinfra's
internals (that test checks that too).

To support another pyinfra release: read each function below against that release's source,
adjust what changed, update WRITTEN_AGAINST and add the version to SUPPORTED_VERSIONS (and
the pin in pyproject.toml).
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyinfra
import pyinfra.api.arguments as pyinfra_arguments
import pyinfra.api.operations as pyinfra_operations
import pyinfra.api.util as pyinfra_util
from pyinfra.api import command as pyinfra_command
from pyinfra.api import facts as pyinfra_facts
from pyinfra.connectors import util as pyinfra_connector_util
from pyinfra.connectors.util import CommandOutput

# The module (pyinfra.api's ``operation`` is the decorator of the same name).
pyinfra_operation = importlib.import_module("pyinfra.api.operation")

SUPPORTED_VERSIONS = ("3.10.0",)

# What each name used below looked like in the supported versions: its signature without
# annotations (names, order, kinds and defaults are what the code here relies on).
WRITTEN_AGAINST: dict[str, str] = {
    # replaced by the fact cache; the replacement takes the same arguments
    "pyinfra.api.facts._get_fact": (
        "(state, host, cls, args=None, kwargs=None, ensure_hosts=None, apply_failed_hosts=True)"
    ),
    # called by the fact cache
    "pyinfra.api.facts._handle_fact_kwargs": "(state, host, cls, args, kwargs)",
    "pyinfra.api.facts._make_command": "(command_attribute, host_args)",
    # wrapped by the fact cache
    "pyinfra.api.command.StringCommand.execute": "(self, state, host, connector_arguments)",
    "pyinfra.api.command.FileUploadCommand.execute": "(self, state, host, connector_arguments)",
    "pyinfra.api.command.FileDownloadCommand.execute": ("(self, state, host, connector_arguments)"),
    "pyinfra.api.command.FunctionCommand.execute": "(self, state, host, connector_arguments)",
    "pyinfra.api.command.RsyncCommand.execute": "(self, state, host, connector_arguments)",
    # wrapped for per-node failures
    "pyinfra.api.operations._run_host_op": "(state, host, op_hash)",
    # what _run_host_op does with a failed operation, done by record_failed_operation
    "pyinfra.api.state.State.get_results_for_host": "(self, host)",
    "pyinfra.api.state.State.get_op_data_for_host": "(self, host, op_hash)",
    "pyinfra.api.state.State.trigger_callbacks": "(self, method_name, *args, **kwargs)",
    # read by host_changed_in_this_run (with StateOperationHostData's operation_meta and
    # global_arguments, and OperationMeta.will_change, a property)
    "pyinfra.api.operation.OperationMeta.did_change": "(self)",
    # what predicted_operations reads: the run's order (and marks complete with
    # OperationMeta.set_complete while it evaluates conditions)
    "pyinfra.api.state.State.get_op_order": "(self)",
    "pyinfra.api.operation.OperationMeta.is_complete": "(self)",
    "pyinfra.api.operation.OperationMeta.set_complete": (
        "(self, success, commands, combined_output, retry_attempts=0, max_retries=0)"
    ),
    "pyinfra.connectors.util.CommandOutput": "(combined_lines)",
    # what pyinfra's SSH connector runs for a command (sudo, su, env...), called by
    # exec_command (with SSHConnector's client: paramiko's SSHClient)
    "pyinfra.connectors.util.make_unix_command_for_host": (
        "(state, host, command, **command_arguments)"
    ),
    # remembered by remember_global_arguments (called by pop_global_arguments and, under
    # this name, by pyinfra.api.facts)
    "pyinfra.api.arguments.all_global_arguments": "()",
    "pyinfra.api.facts.all_global_arguments": "()",
    # replaced by operation_order (called by solve_operation_consistency under this name)
    "pyinfra.api.operation.get_operation_order_from_stack": "(state)",
    "pyinfra.api.util.get_operation_order_from_stack": "(state)",
    # run inside another operation (roles.nvidia_driver, roles.admin_users)
    "pyinfra.operations.server.reboot._inner": "(delay=10, interval=1, reboot_timeout=300)",
    "pyinfra.operations.files.directory._inner": (
        "(path, present=True, user=None, group=None, mode=None, recursive=False, force=False, "
        "force_backup=True, force_backup_dir=None, _no_check_owner_mode=False, "
        "_no_fail_on_link=False)"
    ),
    "pyinfra.operations.server.user_authorized_keys._inner": (
        "(user, public_keys, group=None, delete_keys=False, authorized_key_directory=None, "
        "authorized_key_filename=None)"
    ),
}

# The command classes whose execute runs something on a host.
COMMAND_CLASSES = (
    "StringCommand",
    "FileUploadCommand",
    "FileDownloadCommand",
    "FunctionCommand",
    "RsyncCommand",
)


class UnsupportedPyinfra(RuntimeError):
    """The installed pyinfra is not one gpunode's patches were written for."""


def installed_version() -> str:
    return importlib.metadata.version("pyinfra")


def require_supported(installed: str | None = None) -> None:
    """Refuse, naming it, a pyinfra version this module was not written for."""
    version = installed_version() if installed is None else installed
    if version not in SUPPORTED_VERSIONS:
        supported = ", ".join(SUPPORTED_VERSIONS)
        raise UnsupportedPyinfra(
            f"pyinfra {version} is installed, but gpunode patches pyinfra's private API and "
            f"was written for pyinfra {supported} only (the version pinned in pyproject.toml). "
            f"Install pyinfra=={SUPPORTED_VERSIONS[-1]}, or check gpunode/pyinfra_patches.py "
            f"against pyinfra {version} and add it to SUPPORTED_VERSIONS."
        )


@functools.cache
def _checked() -> bool:
    require_supported()  # an exception is not cached: every later call refuses again
    return True


def _guard() -> None:
    _checked()


def signature_of(target: Callable[..., Any]) -> str:
    """``target``'s signature as WRITTEN_AGAINST writes it: without annotations."""
    signature = inspect.signature(target)
    return str(
        signature.replace(
            parameters=[
                parameter.replace(annotation=inspect.Parameter.empty)
                for parameter in signature.parameters.values()
            ],
            return_annotation=inspect.Signature.empty,
        )
    )


@dataclass
class Patch:
    """One attribute of pyinfra replaced; ``undo`` puts pyinfra's own back."""

    owner: Any
    attribute: str
    original: Any

    def undo(self) -> None:
        setattr(self.owner, self.attribute, self.original)


def _replace(owner: Any, attribute: str, replacement: Any) -> Patch:
    patch = Patch(owner, attribute, getattr(owner, attribute))
    setattr(owner, attribute, replacement)
    return patch


# --- facts ------------------------------------------------------------------------------------


def replace_get_fact(replacement: Callable[..., Any]) -> Patch:
    """Make pyinfra read every fact through ``replacement``, which takes what ``_get_fact``
    takes; the patch's ``original`` is pyinfra's own, for what the replacement leaves to it."""
    _guard()
    return _replace(pyinfra_facts, "_get_fact", replacement)


def fact_arguments(
    state: Any, host: Any, cls: type, args: Any, kwargs: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the fact's own arguments, the connector arguments) of a read, as pyinfra splits them."""
    _guard()
    fact_kwargs, global_kwargs = pyinfra_facts._handle_fact_kwargs(state, host, cls, args, kwargs)
    return fact_kwargs, global_kwargs


def make_command(attribute: Any, kwargs: dict[str, Any]) -> Any:
    """A fact's ``command`` or ``requires_command`` (a value, or a method taking the fact's
    arguments) made into what pyinfra runs."""
    _guard()
    return pyinfra_facts._make_command(attribute, dict(kwargs))


# --- commands ---------------------------------------------------------------------------------


def wrap_command_execute(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> list[Patch]:
    """Run every command pyinfra runs on a host (shell, upload, download, Python callback,
    rsync) through ``wrap(execute)``, where ``execute(self, state, host, connector_arguments)``
    is the class's own."""
    _guard()
    patches = []
    for name in COMMAND_CLASSES:
        command_class = getattr(pyinfra_command, name)
        patches.append(_replace(command_class, "execute", wrap(command_class.execute)))
    return patches


# --- operations -------------------------------------------------------------------------------

_WRAPPED = "gpunode_wrapped"


def wrap_run_host_op(wrap: Callable[[Callable[..., bool]], Callable[..., bool]]) -> None:
    """Run each host's operation through ``wrap(run_host_op)``, where
    ``run_host_op(state, host, op_hash)`` is pyinfra's own; once per process (idempotent)."""
    _guard()
    current = pyinfra_operations._run_host_op
    if getattr(current, _WRAPPED, False):
        return
    wrapped = wrap(current)
    setattr(wrapped, _WRAPPED, True)
    pyinfra_operations._run_host_op = wrapped


def record_failed_operation(state: Any, host: Any, op_hash: str) -> None:
    """What pyinfra records for an operation whose command failed on ``host``: one more
    failed operation, the operation complete and unsuccessful, the error callbacks."""
    _guard()
    state.get_results_for_host(host).error_ops += 1
    meta = state.get_op_data_for_host(host, op_hash).operation_meta
    if not meta.is_complete():
        meta.set_complete(False, [], CommandOutput([]))
    state.trigger_callbacks("operation_host_error", host, op_hash)


# Connector arguments pyinfra's SSH connector takes for itself, not for the command line.
_RUN_ARGUMENTS = ("_get_pty", "_timeout", "_stdin", "_success_exit_codes")


def exec_command(
    host: Any, command: Any, connector_arguments: dict[str, Any], timeout: float | None = None
) -> Any:
    """``command`` started on ``host`` as pyinfra's SSH connector starts it (wrapped for sudo,
    su, environment by ``connector_arguments``), on a paramiko channel of the connection pyinfra
    holds, for gpunode.remote_script to read within its own limits; None where the host is
    not reached over SSH (pyinfra's @local). ``timeout``: how long the node may take to open
    the channel."""
    _guard()
    client = getattr(getattr(host, "connector", None), "client", None)
    transport = client.get_transport() if client is not None else None
    if transport is None:
        return None
    arguments = {k: v for k, v in connector_arguments.items() if k not in _RUN_ARGUMENTS}
    unix = pyinfra_connector_util.make_unix_command_for_host(host.state, host, command, **arguments)
    channel = transport.open_session(timeout=timeout)
    channel.exec_command(unix.get_raw_value())
    return channel


def host_changed_in_this_run(host: Any) -> bool:
    """Whether an operation of this run changed ``host`` (while executing: one that ran before
    the caller did), or, while the deploy is being prepared with changes predicted (--dry,
    or no -y), whether one prepared so far will. With -y nothing is predicted, and the
    caller's operation is asked only while executing.

    A prediction counts what pyinfra's own plan lists as a change (``build_plan_json``):
    an operation with an ``_if`` is only a conditional change there, its condition being
    known only when it runs, so it is not counted.
    """
    _guard()
    state = host.state
    if not state.is_executing:
        return any(
            data.operation_meta.will_change and not data.global_arguments.get("_if")
            for data in state.ops[host].values()
        )
    return any(
        data.operation_meta.is_complete() and data.operation_meta.did_change()
        for data in state.ops[host].values()
    )


@dataclass(frozen=True)
class PredictedOperation:
    name: str
    change: bool | None  # True will change, False will not, None might (not known before)
    conditional: bool  # it has an ``_if``: it runs only if its condition holds then


def predicted_operations(state: Any, host: Any) -> list[PredictedOperation]:
    """What a prepared, unexecuted run (``--dry``) will do on ``host``, operation by
    operation in run order. pyinfra's own plan lists every operation with an ``_if`` as a
    "Conditional Change", even when its condition cannot hold. Here the condition is
    evaluated as the run will evaluate it: each earlier operation whose change is predicted
    is marked complete, for the evaluation alone, with that prediction (one command or none:
    what its ``did_change()`` reads), so conditions written as ``op.did_change`` and as
    lambdas alike read the predictions. A condition that cannot be evaluated before the run
    (it asks an operation not known yet) leaves its operation a "might" (None)."""
    _guard()
    from pyinfra.context import ctx_host

    marked: list[tuple[Any, dict[str, Any]]] = []
    operations = []
    ops = state.ops.get(host, {})
    try:
        with ctx_host.use(host):
            for op_hash in state.get_op_order():
                data = ops.get(op_hash)
                if data is None:
                    continue
                meta = data.operation_meta
                conditions = data.global_arguments.get("_if") or []
                conditions = conditions if isinstance(conditions, list) else [conditions]
                change: bool | None = bool(meta.will_change)
                if change and conditions:
                    try:
                        change = all(condition() for condition in conditions)
                    except Exception:  # an operation not predicted, or a condition of the run
                        change = None
                if change is not None and not meta.is_complete():
                    marked.append((meta, dict(vars(meta))))
                    predicted = [pyinfra_command.StringCommand("predicted")] if change else []
                    meta.set_complete(True, predicted, CommandOutput([]))
                name = sorted(state.op_meta[op_hash].names)[0]
                operations.append(PredictedOperation(name, change, bool(conditions)))
    finally:
        for meta, attributes in marked:  # as they were: not complete
            vars(meta).clear()
            vars(meta).update(attributes)
    return operations


def inner(operation: Any) -> Callable[..., Any]:
    """The function under a pyinfra operation, to ``yield from`` inside another operation
    (pyinfra's own idiom for an operation that runs another)."""
    _guard()
    function: Callable[..., Any] = operation._inner
    return function


# --- operation order --------------------------------------------------------------------------


def operation_order(state: Any) -> list[int]:
    """What pyinfra's ``get_operation_order_from_stack(state)`` returns, from each frame's
    code object and line: the deploy file's line numbers of the call stack (the operation's
    place in the deploy, and for operations called in a loop or a function, where in it).

    pyinfra walks ``inspect.stack()`` (outermost frame first) from the first frame of the
    deploy file, keeping the line of every frame that is not pyinfra's own; ``getframeinfo``
    names a frame by its code's file and line, as read here. Its own frame, innermost, is
    pyinfra's: where the deploy file is not on the stack, nothing but the operation's file
    number is kept.
    """
    frames = []
    here = inspect.currentframe()
    frame = here.f_back if here is not None else None
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()
    start = 0
    if state.current_deploy_filename:
        start = next(
            (
                index
                for index, found in enumerate(frames)
                if found.f_code.co_filename == state.current_deploy_filename
            ),
            len(frames),
        )
    line_numbers = [state.current_op_file_number] if pyinfra.is_cli else []
    install_dir = pyinfra_util.PYINFRA_INSTALL_DIR
    line_numbers += [
        found.f_lineno
        for found in frames[start:]
        if not found.f_code.co_filename.startswith(install_dir)
    ]
    return line_numbers


def replace_operation_order() -> None:
    """Order operations with ``operation_order`` (idempotent)."""
    _guard()
    if getattr(pyinfra_operation, "get_operation_order_from_stack") is not operation_order:  # noqa: B009
        _replace(pyinfra_operation, "get_operation_order_from_stack", operation_order)


# --- global arguments -------------------------------------------------------------------------


# pyinfra's own, taken before anything here replaces it.
_pyinfra_global_arguments = pyinfra_arguments.all_global_arguments


@functools.cache
def _global_arguments() -> tuple[tuple[str, type], ...]:
    return tuple(_pyinfra_global_arguments())


def global_arguments() -> list[tuple[str, type]]:
    """What pyinfra's ``all_global_arguments()`` returns (a new list each call), evaluated
    once: the type hints of pyinfra's own ``AllArguments``, which do not change."""
    return list(_global_arguments())


def remember_global_arguments() -> None:
    """pyinfra reads its global arguments through ``global_arguments`` (idempotent)."""
    _guard()
    for module in (pyinfra_arguments, pyinfra_facts):
        if getattr(module, "all_global_arguments") is not global_arguments:  # noqa: B009
            _replace(module, "all_global_arguments", global_arguments)

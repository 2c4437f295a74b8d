"""Stand-in ``nvidia-ctk`` for lab nodes (node side, stdlib only; NVIDIA Container Toolkit CLI).

It does what roles ask of the real one, on the same files and with the same flags:

- ``nvidia-ctk runtime configure --runtime=docker [--set-as-default] [--config=PATH]
  [--cdi.enabled] [--dry-run]``: merges ``runtimes.nvidia`` = ``{"args": [], "path":
  "nvidia-container-runtime"}`` into ``/etc/docker/daemon.json``, keeping every other key (and
  ``default-runtime`` with ``--set-as-default``); written as the real tool writes it (keys
  sorted, four-space indent).
- ``--runtime=containerd``: adds ``plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia``
  (config version 2; ``io.containerd.cri.v1.runtime`` for version 3) to
  ``/etc/containerd/config.toml`` with ``options.BinaryName = "/usr/bin/nvidia-container-runtime"``,
  copying ``runc``'s settings (``SystemdCgroup``...) as the real tool does. Unlike the real tool,
  which rewrites the whole file, it edits only the keys it sets, so comments and layout stay.
  ``--runtime=crio`` does the same for ``crio.runtime.runtimes.nvidia``. A file it cannot merge
  into is left untouched, with an error.
- ``nvidia-ctk cdi generate [--output=/etc/cdi/nvidia.yaml] [--format=yaml|json]
  [--device-name-strategy=index|uuid ...]``: a CDI spec (``kind: nvidia.com/gpu``) with one device
  per GPU name (index and UUID by default) and ``all``, from ``nvidia-smi -L`` (on lab nodes: the
  GPU simulator). ``nvidia-ctk cdi list`` lists the devices of the specs in ``/etc/cdi`` and
  ``/var/run/cdi``. Releases 1.18.0 and later (``CDI_REFRESH_FROM``) also take the output file
  from ``NVIDIA_CTK_CDI_OUTPUT_FILE_PATH``: that is how their ``nvidia-cdi-refresh.service``
  (``ExecStart=/usr/bin/nvidia-ctk cdi generate``, no ``--output``) names
  ``/var/run/cdi/nvidia.yaml``; 1.17 knows no such variable and writes to stdout.
- ``nvidia-ctk config [--config-file=PATH] [--in-place] [--set KEY=VALUE ...]``: the toolkit's
  ``/etc/nvidia-container-runtime/config.toml`` (created with the defaults when missing, as the
  package's postinst does), e.g. ``--set nvidia-container-cli.no-cgroups=true``.
- ``nvidia-ctk --version``; ``--quiet`` and ``--debug`` global flags.

Log lines go to stderr in logrus' format (``INFO[0000] ...`` on a terminal, ``time=... level=info
msg=...`` otherwise); errors exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, NoReturn

STANDIN_VERSION = "0.0.0"  # replaced with the package's version when it is built
# The first release whose -base package ships nvidia-cdi-refresh.service (world.toml).
CDI_REFRESH_FROM = (1, 18, 0)
CDI_OUTPUT_ENV = "NVIDIA_CTK_CDI_OUTPUT_FILE_PATH"

DOCKER_CONFIG = "/etc/docker/daemon.json"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CRIO_CONFIG = "/etc/crio/crio.conf"
RUNTIME_CONFIG = "/etc/nvidia-container-runtime/config.toml"
CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
NVIDIA_RUNTIME_NAME = "nvidia"
NVIDIA_RUNTIME_EXECUTABLE = "nvidia-container-runtime"
NVIDIA_RUNTIME_PATH = "/usr/bin/nvidia-container-runtime"
NVIDIA_CDI_HOOK_PATH = "/usr/bin/nvidia-cdi-hook"
CDI_VERSION = "0.5.0"
LIBRARY_DIR = "/usr/lib/x86_64-linux-gnu"
STARTED = time.monotonic()

DEFAULT_RUNTIME_CONFIG = """\
#accept-nvidia-visible-devices-as-volume-mounts = false
#accept-nvidia-visible-devices-envvar-when-unprivileged = true
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"
#swarm-resource = "DOCKER_RESOURCE_GPU"

[nvidia-container-cli]
#debug = "/var/log/nvidia-container-toolkit.log"
environment = []
#ldcache = "/etc/ld.so.cache"
ldconfig = "@/sbin/ldconfig"
load-kmods = true
#no-cgroups = false
#path = "/usr/bin/nvidia-container-cli"
#root = "/run/nvidia/driver"
#user = "root:video"

[nvidia-container-runtime]
#debug = "/var/log/nvidia-container-runtime.log"
log-level = "info"
mode = "auto"
runtimes = ["docker-runc", "runc", "crun"]

[nvidia-container-runtime.modes]

[nvidia-container-runtime.modes.cdi]
annotation-prefixes = ["cdi.k8s.io/"]
default-kind = "nvidia.com/gpu"
spec-dirs = ["/etc/cdi", "/var/run/cdi"]

[nvidia-container-runtime.modes.csv]
mount-spec-path = "/etc/nvidia-container-runtime/host-files-for-container.d"

[nvidia-container-runtime-hook]
path = "nvidia-container-runtime-hook"
skip-mode-detection = false

[nvidia-ctk]
path = "nvidia-ctk"
"""


class CtkError(Exception):
    """What went wrong, as nvidia-ctk reports it before exiting 1."""


class Logger:
    """logrus' text format: ``INFO[0000] msg`` on a terminal, key=value pairs otherwise."""

    LEVELS: ClassVar[dict[str, int]] = {"debug": 0, "info": 1, "warning": 2, "error": 3}

    def __init__(self, quiet: bool = False, debug: bool = False):
        self.threshold = self.LEVELS["error" if quiet else "debug" if debug else "info"]

    def log(self, level: str, message: str) -> None:
        if self.LEVELS[level] < self.threshold:
            return
        if sys.stderr.isatty():
            seconds = int(time.monotonic() - STARTED)
            sys.stderr.write(f"{level[:4].upper()}[{seconds:04d}] {message}\n")
        else:
            now = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
            sys.stderr.write(f"time={json.dumps(now)} level={level} msg={json.dumps(message)}\n")

    def debug(self, message: str) -> None:
        self.log("debug", message)

    def info(self, message: str) -> None:
        self.log("info", message)

    def warning(self, message: str) -> None:
        self.log("warning", message)

    def error(self, message: str) -> None:
        self.log("error", message)


# --- command line -------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise CtkError(f"Incorrect Usage: {message}")


BOOL_FLAGS: set[str] = set()


def _bool_flag(
    parser: argparse.ArgumentParser, *names: str, help: str, dest: str | None = None
) -> None:
    """A urfave/cli boolean flag: ``--flag``; ``--flag=true|false`` is rewritten by _bool_values."""
    BOOL_FLAGS.update(names)
    options: dict[str, Any] = {"dest": dest} if dest else {}
    parser.add_argument(*names, action="store_true", help=help, **options)


def _bool_values(argv: Sequence[str]) -> list[str]:
    """``--flag=true`` -> ``--flag``, ``--flag=false`` -> nothing, for the boolean flags."""
    result = []
    for argument in argv:
        name, separator, value = argument.partition("=")
        if separator and name in BOOL_FLAGS:
            if value.lower() in ("1", "t", "true"):
                result.append(name)
            elif value.lower() not in ("0", "f", "false"):
                raise CtkError(f"Incorrect Usage: invalid boolean value {value!r} for {name}")
        else:
            result.append(argument)
    return result


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="nvidia-ctk", description="NVIDIA Container Toolkit CLI",
                     allow_abbrev=False)  # fmt: skip
    parser.add_argument("-v", "--version", action="store_true", help="print the version")
    _bool_flag(parser, "-d", "--debug", help="enable debug-level logging")
    _bool_flag(parser, "--quiet", help="suppress all output except for errors")
    commands = parser.add_subparsers(dest="command", parser_class=_Parser)

    runtime = commands.add_parser("runtime", allow_abbrev=False).add_subparsers(
        dest="subcommand", parser_class=_Parser
    )
    configure = runtime.add_parser("configure", allow_abbrev=False)
    _bool_flag(configure, "--dry-run", help="print the result instead of writing it")
    configure.add_argument("--runtime", default="docker", help="containerd, crio or docker")
    configure.add_argument("--config", default="", help="the target runtime's config file")
    configure.add_argument("--config-mode", default="", help="accepted and ignored")
    configure.add_argument("--nvidia-runtime-name", default=NVIDIA_RUNTIME_NAME)
    configure.add_argument("--nvidia-runtime-path", "--runtime-path",
                           default=NVIDIA_RUNTIME_EXECUTABLE)  # fmt: skip
    _bool_flag(configure, "--nvidia-set-as-default", "--set-as-default",
               help="make the NVIDIA runtime the default")  # fmt: skip
    _bool_flag(configure, "--cdi.enabled", "--cdi.enable", "--enable-cdi",
               help="enable CDI in the configured runtime", dest="cdi_enabled")  # fmt: skip

    cdi = commands.add_parser("cdi", allow_abbrev=False).add_subparsers(
        dest="subcommand", parser_class=_Parser
    )
    generate = cdi.add_parser("generate", allow_abbrev=False)
    generate.add_argument("--output", default="", help="the file to write (default: stdout)")
    generate.add_argument("--format", default="yaml", choices=("yaml", "json"))
    generate.add_argument("--device-name-strategy", action="append", default=[],
                          choices=("index", "uuid", "type-index"))  # fmt: skip
    generate.add_argument("--vendor", "--cdi-vendor", default="nvidia.com")
    generate.add_argument("--class", "--cdi-class", dest="device_class", default="gpu")
    generate.add_argument("--nvidia-cdi-hook-path", default=NVIDIA_CDI_HOOK_PATH)
    generate.add_argument("--mode", default="auto", help="accepted; the stand-in reads nvidia-smi")
    listing = cdi.add_parser("list", allow_abbrev=False)
    listing.add_argument("--spec-dir", action="append", default=[])

    config = commands.add_parser("config", allow_abbrev=False)
    config.add_argument("--config-file", "-c", default=RUNTIME_CONFIG)
    _bool_flag(config, "--in-place", "-i", help="write the result back to --config-file")
    config.add_argument("--output", "-o", default="")
    config.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    return parser


def main(argv: Sequence[str]) -> int:
    logger = Logger()
    try:
        parser = _parser()
        arguments = parser.parse_args(_bool_values(argv))
        logger = Logger(quiet=arguments.quiet, debug=arguments.debug)
        if arguments.version:
            sys.stdout.write(version_text())
        elif arguments.command == "runtime" and arguments.subcommand == "configure":
            configure_runtime(arguments, logger)
        elif arguments.command == "cdi" and arguments.subcommand == "generate":
            generate_cdi(arguments, logger)
        elif arguments.command == "cdi" and arguments.subcommand == "list":
            list_cdi(arguments.spec_dir or list(CDI_SPEC_DIRS), logger)
        elif arguments.command == "config":
            edit_runtime_config(arguments, logger)
        else:
            raise CtkError("Incorrect Usage: no command given (runtime configure, cdi, config)")
    except CtkError as error:
        logger.error(str(error))
        return 1
    return 0


def version_text(version: str | None = None) -> str:
    """What ``nvidia-ctk --version`` prints for ``version`` (None: this stand-in's)."""
    version = version or STANDIN_VERSION
    commit = hashlib.sha1(f"nvidia-container-toolkit {version}".encode()).hexdigest()
    return f"NVIDIA Container Toolkit CLI version {version}\ncommit: {commit}\n"


# --- runtime configure ---------------------------------------------------------------------------


def configure_runtime(arguments: argparse.Namespace, logger: Logger) -> None:
    runtime = arguments.runtime
    name, executable = arguments.nvidia_runtime_name, arguments.nvidia_runtime_path
    if runtime == "docker":
        path = Path(arguments.config or DOCKER_CONFIG)
        text = _merge_docker(
            _read(path, logger), name, executable, arguments.nvidia_set_as_default,
            arguments.cdi_enabled,
        )  # fmt: skip
    elif runtime in ("containerd", "crio"):
        if executable == NVIDIA_RUNTIME_EXECUTABLE:
            executable = NVIDIA_RUNTIME_PATH
        if not os.path.isabs(executable):
            raise CtkError(f"the NVIDIA runtime path {executable!r} is not an absolute path")
        default_path = CONTAINERD_CONFIG if runtime == "containerd" else CRIO_CONFIG
        path = Path(arguments.config or default_path)
        merge = _merge_containerd if runtime == "containerd" else _merge_crio
        text = merge(
            _read(path, logger), name, executable, arguments.nvidia_set_as_default,
            arguments.cdi_enabled,
        )  # fmt: skip
    else:
        raise CtkError(f"unrecognized runtime '{runtime}'")
    if arguments.dry_run:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    _write(path, text)
    logger.info(f"Wrote updated config to {path}")
    logger.info(f"It is recommended that {runtime} daemon be restarted.")


def _read(path: Path, logger: Logger) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        logger.info("Config file does not exist; using empty config")
        return ""
    except OSError as error:
        raise CtkError(f"unable to load config: {error}") from error


def _write(path: Path, text: str) -> None:
    """Replace ``path`` atomically, keeping its mode (0644 for a new file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    with tempfile.NamedTemporaryFile(
        "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", delete=False
    ) as temporary:
        temporary.write(text)
    os.chmod(temporary.name, mode)
    os.replace(temporary.name, path)


def _merge_docker(text: str, name: str, executable: str, set_default: bool, cdi: bool) -> str:
    try:
        config: Any = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as error:
        raise CtkError(f"unable to load config for runtime docker: {error}") from error
    if not isinstance(config, dict):
        raise CtkError("unable to load config for runtime docker: not a JSON object")
    runtimes = config.get("runtimes") or {}
    if not isinstance(runtimes, dict):
        raise CtkError("unable to update config: runtimes is not a JSON object")
    runtimes[name] = {"args": [], "path": executable}
    config["runtimes"] = runtimes
    if set_default:
        config["default-runtime"] = name
    if cdi:
        features = config.get("features") or {}
        features["cdi"] = True
        config["features"] = features
    # As Go's json.MarshalIndent writes it: sorted keys, four spaces, no final newline.
    return json.dumps(config, indent=4, sort_keys=True, ensure_ascii=False)


def _merge_containerd(text: str, name: str, executable: str, set_default: bool, cdi: bool) -> str:
    parsed = _parse_toml(text, "containerd")
    version = parsed.get("version", 2)
    plugin = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}.get(version)
    if plugin is None:
        raise CtkError(
            f"unable to load config for runtime containerd: config version {version} is not "
            "supported by the gpunode lab stand-in (versions 2 and 3 are)"
        )
    containerd = ["plugins", plugin, "containerd"]
    runtime_table = [*containerd, "runtimes", name]
    defaults: dict[str, Any] = {"runtime_type": "io.containerd.runc.v2"}
    if version == 2:
        defaults = {"privileged_without_host_devices": False, "runtime_engine": "",
                    "runtime_root": "", **defaults}  # fmt: skip
    fields, options = _runtime_template(parsed, [*containerd, "runtimes", "runc"], defaults)
    options["BinaryName"] = executable
    document = TomlText(text)
    document.set([], "version", version)
    for key, value in fields.items():
        document.set(runtime_table, key, value)
    for key, value in options.items():
        document.set([*runtime_table, "options"], key, value)
    if set_default:
        document.set(containerd, "default_runtime_name", name)
    if cdi:
        document.set(["plugins", plugin], "enable_cdi", True)
    return _checked(document, "containerd", [*runtime_table, "options", "BinaryName"], executable)


def _merge_crio(text: str, name: str, executable: str, set_default: bool, cdi: bool) -> str:
    parsed = _parse_toml(text, "crio")
    runtime_table = ["crio", "runtime", "runtimes", name]
    fields, _ = _runtime_template(
        parsed, ["crio", "runtime", "runtimes", "runc"], {"runtime_type": "oci"}
    )
    fields["runtime_path"] = executable
    document = TomlText(text)
    for key, value in fields.items():
        document.set(runtime_table, key, value)
    if set_default:
        document.set(["crio", "runtime"], "default_runtime", name)
    return _checked(document, "crio", [*runtime_table, "runtime_path"], executable)


def _parse_toml(text: str, runtime: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise CtkError(f"unable to load config for runtime {runtime}: {error}") from error


def _runtime_template(
    parsed: dict[str, Any], runc_path: list[str], defaults: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The new runtime's settings and options: runc's where runc is configured (real behaviour)."""
    runc = _lookup(parsed, runc_path)
    if not isinstance(runc, dict):
        return dict(defaults), {}
    fields = {key: value for key, value in runc.items() if not isinstance(value, dict)}
    options = runc.get("options")
    scalar_options = (
        {key: value for key, value in options.items() if not isinstance(value, dict)}
        if isinstance(options, dict)
        else {}
    )
    return fields, scalar_options


def _checked(document: TomlText, runtime: str, path: list[str], expected: str) -> str:
    """The edited text, once it parses and holds what was set; else nothing is written."""
    text = document.text()
    try:
        result = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise CtkError(
            f"unable to update config for runtime {runtime}: the gpunode lab stand-in cannot "
            f"merge into this file's layout ({error}); it was left unchanged"
        ) from error
    if _lookup(result, path) != expected:
        raise CtkError(f"unable to update config for runtime {runtime}: {'.'.join(path)} not set")
    return text


def _lookup(tree: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


# --- a TOML text editor ---------------------------------------------------------------------------

BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class TomlText:
    """Sets keys in TOML text line by line, leaving every other line as it was.

    A key that exists in its table (even commented out, ``#key = ...``) is replaced in place; a
    missing key goes after the table's last line; a missing table goes at the end of the text.
    Callers check the result parses: values spread over several lines are not handled.
    """

    def __init__(self, text: str):
        self.lines = text.splitlines()

    def text(self) -> str:
        return "\n".join(self.lines).strip("\n") + "\n"

    def set(self, table: Sequence[str], key: str, value: Any) -> None:
        assignment = f"{render_key(key)} = {render_value(value)}"
        region = self._table_region(list(table))
        if region is None:
            if self.lines and self.lines[-1].strip():
                self.lines.append("")
            self.lines += [render_header(table), f"  {assignment}"]
            return
        first, end = region
        for commented in (False, True):
            for index in range(first, end):
                line = self.lines[index]
                if _assigned_key(line, commented) == key:
                    self.lines[index] = line[: len(line) - len(line.lstrip())] + assignment
                    return
        insert_at = end
        while insert_at > first and not self.lines[insert_at - 1].strip():
            insert_at -= 1
        indent = "  " if table else ""
        self.lines.insert(insert_at, indent + assignment)

    def _table_region(self, table: list[str]) -> tuple[int, int] | None:
        """(first line after the header, end) of ``table``; the top level is ``[]``."""
        headers = [(index, _header_key(line)) for index, line in enumerate(self.lines)]
        headers = [(index, key) for index, key in headers if key is not None]
        if not table:
            return 0, headers[0][0] if headers else len(self.lines)
        for position, (index, key) in enumerate(headers):
            if key == table:
                end = headers[position + 1][0] if position + 1 < len(headers) else len(self.lines)
                return index + 1, end
        return None


def _header_key(line: str) -> list[str] | None:
    match = re.fullmatch(r"\s*\[\[?(.+?)\]\]?\s*(#.*)?", line)
    if not match:
        return None
    if line.strip().startswith("[["):
        return ["[[array]]"]  # a boundary that never matches a table we set
    return parse_key(match.group(1))


def _assigned_key(line: str, commented: bool) -> str | None:
    stripped = line.strip()
    if commented:
        if not stripped.startswith("#"):
            return None
        stripped = stripped[1:].strip()
    match = re.match(r'("(?:[^"\\]|\\.)*"|\'[^\']*\'|[A-Za-z0-9_-]+)\s*=', stripped)
    if not match:
        return None
    key = parse_key(match.group(1))
    return key[0] if key and len(key) == 1 else None


def parse_key(text: str) -> list[str] | None:
    """A dotted TOML key as its parts (``a."b.c".d`` -> [a, b.c, d]); None if it is not a key."""
    parts: list[str] = []
    position = 0
    text = text.strip()
    while True:
        rest = text[position:]
        bare = BARE_KEY.match(rest)
        if bare:
            parts.append(bare.group(0))
            position += bare.end()
        elif rest.startswith('"'):
            quoted = re.match(r'"((?:[^"\\]|\\.)*)"', rest)
            if not quoted:
                return None
            parts.append(json.loads(quoted.group(0)))
            position += quoted.end()
        elif rest.startswith("'"):
            literal = re.match(r"'([^']*)'", rest)
            if not literal:
                return None
            parts.append(literal.group(1))
            position += literal.end()
        else:
            return None
        separator = re.match(r"\s*(\.)?\s*", text[position:])
        position += separator.end() if separator else 0
        if position >= len(text):
            return parts
        if not separator or not separator.group(1):
            return None


def render_key(key: str) -> str:
    return key if BARE_KEY.fullmatch(key) else json.dumps(key)


def render_header(table: Sequence[str]) -> str:
    return "[" + ".".join(render_key(key) for key in table) + "]"


def render_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(render_value(item) for item in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{render_key(k)} = {render_value(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    return json.dumps(str(value), ensure_ascii=False)


# --- config ------------------------------------------------------------------------------------


def edit_runtime_config(arguments: argparse.Namespace, logger: Logger) -> None:
    path = Path(arguments.config_file)
    try:
        original = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        original = None
    document = TomlText(DEFAULT_RUNTIME_CONFIG if original is None else original)
    for setting in arguments.set:
        key, separator, raw = setting.partition("=")
        parts = parse_key(key)
        if not separator or not parts:
            raise CtkError(f"invalid --set value {setting!r}: expected KEY=VALUE")
        document.set(parts[:-1], parts[-1], _parse_setting(raw))
    text = document.text()
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise CtkError(f"failed to update config: {error}") from error
    if arguments.in_place:
        if text != original:
            _write(path, text)
            logger.info(f"Wrote updated config to {path}")
    elif arguments.output:
        _write(Path(arguments.output), text)
    else:
        sys.stdout.write(text)


def _parse_setting(raw: str) -> Any:
    """``true`` -> True, ``3`` -> 3, ``["a"]`` -> ["a"]; anything that is no TOML value is text."""
    try:
        return tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        return raw


# --- cdi ---------------------------------------------------------------------------------------


def read_gpus() -> list[tuple[int, str]]:
    """(index, UUID) of each GPU, from ``nvidia-smi -L``."""
    try:
        result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise CtkError(f"failed to initialize NVML: {error}") from error
    if result.returncode != 0:
        raise CtkError("failed to generate CDI spec: failed to initialize NVML: "
                       "ERROR_DRIVER_NOT_LOADED")  # fmt: skip
    pattern = re.compile(r"^GPU (\d+): .* \(UUID: (GPU-[0-9a-fA-F-]+)\)$")
    return [
        (int(match.group(1)), match.group(2))
        for match in map(pattern.match, result.stdout.splitlines())
        if match
    ]


def driver_version() -> str:
    result = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = result.stdout.split()
    if result.returncode != 0 or not lines:
        raise CtkError("failed to get driver version: ERROR_DRIVER_NOT_LOADED")
    return lines[0]


def cdi_spec(
    gpus: Sequence[tuple[int, str]],
    driver: str,
    kind: str = "nvidia.com/gpu",
    strategies: Sequence[str] = ("index", "uuid"),
    hook: str = NVIDIA_CDI_HOOK_PATH,
) -> dict[str, Any]:
    """The CDI spec ``nvidia-ctk cdi generate`` writes for these GPUs (a subset of its edits)."""

    def node(path: str) -> dict[str, str]:
        return {"path": path, "hostPath": path}

    devices = []
    for index, uuid in gpus:
        names = {"index": str(index), "uuid": uuid, "type-index": f"gpu{index}"}
        for strategy in strategies:
            devices.append(
                {"name": names[strategy],
                 "containerEdits": {"deviceNodes": [node(f"/dev/nvidia{index}")]}}
            )  # fmt: skip
    devices.append(
        {"name": "all",
         "containerEdits": {"deviceNodes": [node(f"/dev/nvidia{index}") for index, _ in gpus]}}
    )  # fmt: skip
    mount_options = ["ro", "nosuid", "nodev", "bind"]
    libraries = [f"{LIBRARY_DIR}/libcuda.so.{driver}", f"{LIBRARY_DIR}/libnvidia-ml.so.{driver}"]
    binaries = ["/usr/bin/nvidia-smi", "/usr/bin/nvidia-persistenced"]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": devices,
        "containerEdits": {
            "env": [f"NVIDIA_CTK_LIBCUDA_DIR={LIBRARY_DIR}", "NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [node(f"/dev/{name}") for name in
                            ("nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidiactl")],
            "hooks": [
                {"hookName": "createContainer", "path": hook,
                 "args": ["nvidia-cdi-hook", "create-symlinks", "--link",
                          f"libcuda.so.1::{LIBRARY_DIR}/libcuda.so"],
                 "env": ["NVIDIA_CTK_DEBUG=false"]},
                {"hookName": "createContainer", "path": hook,
                 "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", LIBRARY_DIR],
                 "env": ["NVIDIA_CTK_DEBUG=false"]},
            ],
            "mounts": [{"hostPath": path, "containerPath": path, "options": mount_options}
                       for path in libraries + binaries],
        },
    }  # fmt: skip


def generate_cdi(arguments: argparse.Namespace, logger: Logger) -> None:
    strategies = arguments.device_name_strategy or ["index", "uuid"]
    gpus = read_gpus()
    spec = cdi_spec(
        gpus,
        driver_version(),
        kind=f"{arguments.vendor}/{arguments.device_class}",
        strategies=list(dict.fromkeys(strategies)),
        hook=arguments.nvidia_cdi_hook_path,
    )
    output = arguments.output or (os.environ.get(CDI_OUTPUT_ENV, "") if knows_cdi_refresh() else "")
    json_format = arguments.format == "json" or output.endswith(".json")
    text = json.dumps(spec, indent=2) + "\n" if json_format else to_yaml(spec)
    if not output:
        sys.stdout.write(text)
    else:
        _write(Path(output), text)
    logger.info(f"Generated CDI spec with version {CDI_VERSION}")


def knows_cdi_refresh(version: str | None = None) -> bool:
    """Whether this release (default: the packaged one) is one of the nvidia-cdi-refresh era."""
    parts = re.findall(r"\d+", version or STANDIN_VERSION)[:3]
    return tuple(int(part) for part in parts) >= CDI_REFRESH_FROM


def list_cdi(spec_dirs: Sequence[str], logger: Logger) -> None:
    names: list[str] = []
    for directory in spec_dirs:
        for path in sorted(Path(directory).glob("*")):
            if path.suffix in (".yaml", ".yml", ".json") and path.is_file():
                names += _spec_device_names(path)
    logger.info(f"Found {len(names)} CDI devices")
    sys.stdout.write("".join(f"{name}\n" for name in names))


def _spec_device_names(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        spec = json.loads(text)
        return [f"{spec['kind']}={device['name']}" for device in spec.get("devices", [])]
    # The block layout to_yaml (and the real tool) writes: top-level keys, items at four spaces.
    kind = re.search(r"^kind:\s*(\S+)\s*$", text, re.M)
    block = re.search(r"^devices:\n((?:[ -].*\n?)*)", text, re.M)
    if not kind or not block:
        return []
    device_names = re.findall(r"^    - name: (.+)$", block.group(1), re.M)
    return [f"{kind.group(1)}={_yaml_scalar_text(name)}" for name in device_names]


def _yaml_scalar_text(text: str) -> str:
    text = text.strip()
    return str(json.loads(text)) if text.startswith('"') else text


def to_yaml(value: dict[str, Any]) -> str:
    """Block YAML as the real tool (yaml.v3, indent 4) writes its specs."""
    return "---\n" + "".join(f"{line}\n" for line in _yaml_mapping(value, 0, 4))


def _yaml_mapping(mapping: dict[str, Any], key_column: int, child_column: int) -> list[str]:
    lines = []
    for key, value in mapping.items():
        prefix = " " * key_column + f"{key}:"
        if isinstance(value, dict) and value:
            lines += [prefix, *_yaml_mapping(value, child_column, child_column + 4)]
        elif isinstance(value, list) and value:
            lines += [prefix, *_yaml_sequence(value, child_column)]
        else:
            lines.append(f"{prefix} {_yaml_scalar(value)}")
    return lines


def _yaml_sequence(items: list[Any], dash_column: int) -> list[str]:
    lines = []
    for item in items:
        if isinstance(item, dict) and item:
            nested = _yaml_mapping(item, dash_column + 2, dash_column + 4)
            lines += [" " * dash_column + "- " + nested[0].lstrip(), *nested[1:]]
        else:
            lines.append(" " * dash_column + "- " + _yaml_scalar(item))
    return lines


def _yaml_scalar(value: Any) -> str:
    if value == {}:
        return "{}"
    if value == []:
        return "[]"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    plain = re.fullmatch(
        r"(--?)?[A-Za-z/_][^:#\"'{}\[\],&*!|>%@`]*|[A-Za-z0-9/._-]*::[^\s:#]*|\d+(\.\d+)+", text
    )
    # What YAML would read as a number, boolean or null stays a string only when quoted.
    looks_special = re.fullmatch(
        r"[-+]?(\d[\d_]*)?(\.\d*)?([eE][-+]?\d+)?|0x[0-9a-fA-F]+|true|false|yes|no|on|off|null|~",
        text,
        re.IGNORECASE,
    )
    if plain and not looks_special and text == text.strip() and ": " not in text:
        return text
    return json.dumps(text)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main(sys.argv[1:]))

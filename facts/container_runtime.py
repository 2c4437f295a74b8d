"""Facts for the NVIDIA user-space stack: container runtime configuration and apt package state.

``ContainerRuntimeConfig`` reads what ``nvidia-ctk runtime configure`` and ``nvidia-ctk cdi
generate`` write (``/etc/docker/daemon.json``, ``/etc/containerd/config.toml``,
``/etc/cdi/nvidia.yaml``) and parses it on the control side, so a role runs ``nvidia-ctk`` only
when something is missing. ``AptPackagePolicy`` is ``apt-cache policy`` plus dpkg's hold marks
for a few packages: which versions a repository offers, what is installed, what is held. The
CUDA, Container Toolkit and DCGM roles share it, and ask it only when a package is to change:
``DpkgPackageState`` (dpkg alone, milliseconds) tells them whether one is. ``apt-cache policy``
loads apt's cache and evaluates every pin against every package, half a second of node CPU
where the driver pin's globs are.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import shlex
import tomllib
from typing import Any

from pyinfra.api import FactBase

from facts.apt import INDEXED_REPOSITORIES_COMMAND, parse_index_targets
from gpunode import framing
from gpunode.expected.registry_access import CONTAINERD_IMAGES_PLUGINS
from gpunode.nvidia_releases import CDI_REFRESH_SPEC  # kept by the toolkit itself from 1.18 on
from gpunode.sanitize import MAX_DEPTH, nested_deeper_than, parse_json

DOCKER_CONFIG = "/etc/docker/daemon.json"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CDI_SPEC = "/etc/cdi/nvidia.yaml"  # written by gpunode for Container Toolkit 1.17 and older
NVIDIA_RUNTIME = "nvidia"
NVIDIA_RUNTIME_EXECUTABLE = "nvidia-container-runtime"
ENGINE_SERVICES = ("docker", "containerd")
KERNEL_DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"

# The CRI plugin's containerd table, by containerd config version.
CONTAINERD_CRI_PLUGINS = {
    1: "cri",
    2: "io.containerd.grpc.v1.cri",
    3: "io.containerd.cri.v1.runtime",
}


def _lookup(tree: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def _is_nvidia_runtime(path: Any) -> bool:
    return isinstance(path, str) and path.rsplit("/", 1)[-1] == NVIDIA_RUNTIME_EXECUTABLE


def _absent() -> dict[str, Any]:
    return {
        "present": False,
        "error": None,
        "nvidia_runtime": False,
        "default_runtime": None,
        "cdi_enabled": False,
    }


def parse_docker_config(text: str | None) -> dict[str, Any]:
    """daemon.json: is the nvidia runtime there, which runtime is the default, is CDI on.

    ``error`` says why a file that exists cannot be used; nothing may then rewrite it.
    """
    state = _absent()
    if text is None:
        return state
    state["present"] = True
    if not text.strip():  # dockerd and nvidia-ctk both read an empty file as {}
        return state
    try:
        config = parse_json(text)
    except json.JSONDecodeError as error:
        state["error"] = f"not valid JSON ({error})"
        return state
    if not isinstance(config, dict):
        state["error"] = "not a JSON object"
        return state
    state["nvidia_runtime"] = _is_nvidia_runtime(
        _lookup(config, "runtimes", NVIDIA_RUNTIME, "path")
    )
    state["default_runtime"] = config.get("default-runtime")
    state["cdi_enabled"] = _lookup(config, "features", "cdi") is True
    return state


def parse_containerd_config(text: str | None) -> dict[str, Any]:
    """config.toml: the same questions, in the CRI plugin's table for the file's version."""
    state = _absent()
    if text is None:
        return state
    state["present"] = True
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        state["error"] = f"not valid TOML ({error})"
        return state
    except RecursionError:  # tomllib recurses once per level of nesting
        state["error"] = "not valid TOML (nested too deep to read)"
        return state
    if nested_deeper_than(config):
        state["error"] = f"not read: nested deeper than {MAX_DEPTH} levels"
        return state
    version = config.get("version", 1)
    plugin = CONTAINERD_CRI_PLUGINS.get(version) if isinstance(version, int) else None
    if plugin is None:
        state["error"] = f"containerd config version {version!r} is not one nvidia-ctk knows"
        return state
    containerd = _lookup(config, "plugins", plugin, "containerd")
    binary = _lookup(containerd, "runtimes", NVIDIA_RUNTIME, "options", "BinaryName")
    state["nvidia_runtime"] = _is_nvidia_runtime(binary)
    state["default_runtime"] = _lookup(containerd, "default_runtime_name")
    state["cdi_enabled"] = _lookup(config, "plugins", plugin, "enable_cdi") is True
    images = CONTAINERD_IMAGES_PLUGINS.get(version)
    config_path = _lookup(config, "plugins", images, "registry", "config_path") if images else None
    state["registry_config_path"] = config_path if isinstance(config_path, str) else None
    return state


def parse_cdi_spec(text: str | None) -> dict[str, Any]:
    """Which GPUs (UUIDs) and which driver (libcuda.so.<version>) the spec was made for."""
    if text is None:
        return {"present": False, "uuids": [], "driver_version": None}
    uuids = re.findall(r"\bGPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b", text)
    driver = re.search(r"libcuda\.so\.([0-9]+\.[0-9]+(?:\.[0-9]+)?)\b", text)
    return {
        "present": True,
        "uuids": sorted(set(uuids)),
        "driver_version": driver.group(1) if driver else None,
    }


def _decode(encoded: str) -> str | None:
    if encoded == "-":
        return None
    try:
        return base64.b64decode(encoded, validate=True).decode("utf-8", errors="replace")
    except (binascii.Error, ValueError):
        return None


_CONFIG_FILES = (DOCKER_CONFIG, CONTAINERD_CONFIG, CDI_SPEC, CDI_REFRESH_SPEC)
# Files travel base64-encoded: one line each, whatever they hold.
RUNTIME_COMMAND = (
    f"for f in {' '.join(_CONFIG_FILES)}; do "
    'if [ -f "$f" ]; then printf "file %s %s\\n" "$f" "$(base64 -w0 < "$f")"; '
    'else printf "file %s -\\n" "$f"; fi; done; '
    f"for s in {' '.join(ENGINE_SERVICES)}; do "
    'if systemctl list-unit-files --no-legend "$s.service" 2>/dev/null | grep -q .; '
    'then echo "service $s yes"; else echo "service $s no"; fi; done; '
    'echo "nvidia-ctk $(nvidia-ctk --version 2>/dev/null | head -n1)"; '
    f'if [ -e {KERNEL_DRIVER_VERSION_FILE} ]; then echo "kernel-driver yes"; '
    'else echo "kernel-driver no"; fi'
)
# The same in the frame's Python process; the engines' unit files from the frame's one
# systemctl (gpunode.framing).
RUNTIME_PYTHON = framing.python_source(
    r"""
import base64, os, subprocess
for path in files:
    if os.path.isfile(path):
        print(f"file {path} {base64.b64encode(read_bytes(path) or b'').decode()}")
    else:
        print(f"file {path} -")
def run(*command):
    try:
        done = subprocess.run(command, capture_output=True, stdin=subprocess.DEVNULL, text=True)
    except OSError:
        return ""
    return done.stdout
# A unit file exists where systemd does not answer "not-found" (masked: a file too).
for service in services:
    loaded = unit_properties(f"{service}.service").get("LoadState", "not-found")
    print(f"service {service} {'no' if loaded in ('', 'not-found') else 'yes'}")
print("nvidia-ctk " + (run("nvidia-ctk", "--version").splitlines() or [""])[0])
print(f"kernel-driver {'yes' if os.path.exists(driver) else 'no'}")
""",
    files=_CONFIG_FILES,
    services=ENGINE_SERVICES,
    driver=KERNEL_DRIVER_VERSION_FILE,
)


class ContainerRuntimeConfig(FactBase):
    """
    Container engines' NVIDIA runtime configuration, the CDI spec and the toolkit's version.

    .. code:: python

        {
            "docker": {"present": True, "error": None, "nvidia_runtime": True,
                       "default_runtime": None, "cdi_enabled": False},
            "containerd": {...same keys...},
            "cdi_spec": {"present": True, "uuids": ["GPU-..."], "driver_version": "550.127.08"},
            "cdi_refresh_spec": {...the same keys, for /var/run/cdi/nvidia.yaml...},
            "services": {"docker": False, "containerd": False},  # unit files installed
            "nvidia_ctk_version": "1.17.4",  # or None when nvidia-ctk is not installed
            "kernel_driver_loaded": False,  # /proc/driver/nvidia/version exists
        }
    """

    def parts(self) -> list[framing.Part]:
        units = tuple(f"{service}.service" for service in ENGINE_SERVICES)
        return [
            framing.Part("runtime", RUNTIME_COMMAND, python=RUNTIME_PYTHON, systemd_units=units)
        ]

    def command(self) -> str:
        return framing.command(self.parts())

    def process(self, output: list[str]) -> dict[str, Any]:
        # What was read is kept, a part cut short included: its lines are what came.
        output = framing.parse(output, ["runtime"]).part("runtime").lines
        files: dict[str, str | None] = {}
        services = dict.fromkeys(ENGINE_SERVICES, False)
        ctk_version = None
        kernel_driver = False
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "file":
                path, _, encoded = rest.partition(" ")
                files[path] = _decode(encoded.strip() or "")
            elif kind == "service":
                name, _, answer = rest.partition(" ")
                services[name] = answer.strip() == "yes"
            elif kind == "nvidia-ctk":
                match = re.search(r"version (\S+)", rest)
                ctk_version = match.group(1) if match else None
            elif kind == "kernel-driver":
                kernel_driver = rest.strip() == "yes"
        return {
            "docker": parse_docker_config(files.get(DOCKER_CONFIG)),
            "containerd": parse_containerd_config(files.get(CONTAINERD_CONFIG)),
            "cdi_spec": parse_cdi_spec(files.get(CDI_SPEC)),
            "cdi_refresh_spec": parse_cdi_spec(files.get(CDI_REFRESH_SPEC)),
            "services": services,
            "nvidia_ctk_version": ctk_version,
            "kernel_driver_loaded": kernel_driver,
        }


# --- apt package state ------------------------------------------------------------------------

_VERSION_LINE = re.compile(r"^ (\*\*\*| {3}) (\S+) (-?[0-9]+)$")
_SOURCE_LINE = re.compile(r"^ {8}(-?[0-9]+) (\S+)(?: (.*))?$")


def normalise_url(url: str) -> str:
    return url.rstrip("/")


def parse_apt_policy(lines: list[str]) -> dict[str, dict[str, Any]]:
    """``apt-cache policy PKG...`` -> {package: {candidate, versions: [{version, urls}]}}.

    Versions keep apt's order (newest first); ``urls`` are the repositories offering each one.
    """
    packages: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in lines:
        if line and not line.startswith(" ") and line.endswith(":"):
            current = {"candidate": None, "versions": []}
            packages[line[:-1]] = current
            continue
        if current is None:
            continue
        stripped = line.strip()
        if stripped.startswith("Candidate:"):
            candidate = stripped.split(":", 1)[1].strip()
            current["candidate"] = None if candidate == "(none)" else candidate
            continue
        version = _VERSION_LINE.match(line)
        if version:
            current["versions"].append({"version": version.group(2), "urls": []})
            continue
        source = _SOURCE_LINE.match(line)
        if source and current["versions"] and "://" in source.group(2):
            current["versions"][-1]["urls"].append(normalise_url(source.group(2)))
    return packages


def parse_dpkg_state(lines: list[str]) -> dict[str, dict[str, Any]]:
    """``dpkg-query -W -f='${Package} ${db:Status-Want} ${db:Status-Status} ${Version}'``."""
    state = {}
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        name, want, status = parts[0], parts[1], parts[2]
        installed = status in ("installed", "half-configured", "unpacked", "triggers-pending",
                               "triggers-awaited")  # fmt: skip
        state[name] = {
            "installed": parts[3] if installed and len(parts) > 3 else None,
            "held": want == "hold",
        }
    return state


DPKG_QUERY = "'${Package} ${db:Status-Want} ${db:Status-Status} ${Version}\\n'"


# A package named outright (no dpkg-query pattern): what a group of these facts may ask.
_PACKAGE_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]{0,127}")
_REQUESTED = "@requested "  # no package name starts with "@"


class DpkgPackageState(FactBase):
    """
    What dpkg says of some packages: installed version (None: not installed) and hold mark.
    Every requested package has an entry. dpkg's status file only: milliseconds, no apt.

    .. code:: python

        {"libnccl2": {"installed": "2.25.1-1+cuda12.8", "held": True},
         "cuda-toolkit-12-8": {"installed": None, "held": False}}

    The fact cache reads every such fact of a run with one dpkg-query (``grouped_command``),
    handing each the lines it would have printed alone (``grouped_outputs``).
    """

    def command(self, packages: list[str]) -> str:
        names = " ".join(shlex.quote(package) for package in packages)
        return (
            f"printf '{_REQUESTED}%s\\n' {names}; "
            f"LC_ALL=C dpkg-query -W -f={DPKG_QUERY} {names} 2>/dev/null; true"
        )

    def process(self, output: list[str]) -> dict[str, dict[str, Any]]:  # type: ignore[override]
        requested = [
            line.removeprefix(_REQUESTED).strip() for line in output if line.startswith(_REQUESTED)
        ]
        found = parse_dpkg_state([line for line in output if not line.startswith(_REQUESTED)])
        return {
            name: found.get(name) or {"installed": None, "held": False}
            for name in dict.fromkeys([*filter(None, requested), *found])
        }

    @staticmethod
    def groupable(kwargs: dict[str, Any]) -> bool:
        """Whether a read with ``kwargs`` may be answered from a group's dpkg-query: packages
        named outright (a pattern would match other packages than the group's lines say)."""
        packages = kwargs.get("packages")
        return (
            set(kwargs) == {"packages"}
            and isinstance(packages, list)
            and bool(packages)
            and all(isinstance(name, str) and _PACKAGE_NAME.fullmatch(name) for name in packages)
        )

    @staticmethod
    def grouped_command(members: list[dict[str, Any]]) -> str:
        """One dpkg-query for every package the members (groupable reads) ask about."""
        names = dict.fromkeys(name for kwargs in members for name in kwargs["packages"])
        listed = " ".join(shlex.quote(name) for name in names)
        return f"LC_ALL=C dpkg-query -W -f={DPKG_QUERY} {listed} 2>/dev/null; true"

    @staticmethod
    def grouped_outputs(lines: list[str], members: list[dict[str, Any]]) -> list[list[str]]:
        """Each member's lines as its own command prints them: its requests, and dpkg's line
        for each of its packages that dpkg knows."""
        by_name: dict[str, str] = {}
        for line in lines:
            words = line.split()
            if words and _PACKAGE_NAME.fullmatch(words[0]):
                by_name.setdefault(words[0], line)
        return [
            [f"{_REQUESTED}{name}" for name in kwargs["packages"]]
            + [by_name[name] for name in kwargs["packages"] if name in by_name]
            for kwargs in members
        ]


def empty_package_state() -> dict[str, Any]:
    return {"installed": None, "held": False, "candidate": None, "versions": []}


POLICY_PARTS = ("files", "policy", "dpkg", "requested")


class AptPackagePolicy(FactBase):
    """
    apt's view of some packages: installed version, hold mark, versions on offer and where from.

    .. code:: python

        {
            "indexed_urls": ["http://mirror/cuda/debian12/x86_64", ...],  # lists apt has
            "packages": {
                "libnccl2": {
                    "installed": "2.25.1-1+cuda12.8",  # None when not installed
                    "held": True,
                    "candidate": "2.26.2-1+cuda12.8",
                    "versions": [{"version": "2.26.2-1+cuda12.8", "urls": ["http://..."]}, ...],
                },
            },
        }

    Every requested package has an entry, empty when apt and dpkg know nothing of it.
    ``indexed_urls`` is what ``AptIndexedRepositories`` reads.
    """

    def command(self, packages: list[str]) -> str:
        names = " ".join(shlex.quote(package) for package in packages)
        return framing.command(
            [
                framing.Part("files", f"LC_ALL=C {INDEXED_REPOSITORIES_COMMAND}", stderr="drop"),
                framing.Part("policy", f"LC_ALL=C apt-cache policy {names}", stderr="drop"),
                framing.Part(
                    "dpkg", f"LC_ALL=C dpkg-query -W -f={DPKG_QUERY} {names}", stderr="drop"
                ),
                framing.Part("requested", f"printf '%s\\n' {names}"),
            ]
        )

    def process(self, output: list[str]) -> dict[str, Any]:
        frame = framing.parse(output, POLICY_PARTS)
        requested = [line.strip() for line in frame.part("requested").lines if line.strip()]
        policy = parse_apt_policy(frame.part("policy").lines)
        dpkg = parse_dpkg_state(frame.part("dpkg").lines)
        packages = {}
        for name in dict.fromkeys([*requested, *policy, *dpkg]):
            state = empty_package_state()
            state.update(policy.get(name, {}))
            state.update(dpkg.get(name, {}))
            packages[name] = state
        return {
            "indexed_urls": parse_index_targets(frame.part("files").lines),
            "packages": packages,
        }


def package_state(policy: dict[str, Any], package: str) -> dict[str, Any]:
    return dict(policy["packages"].get(package) or empty_package_state())


def versions_from(state: dict[str, Any], url: str) -> list[str]:
    """Versions of a package that the repository at ``url`` offers, newest first."""
    wanted = normalise_url(url)
    return [entry["version"] for entry in state["versions"] if wanted in entry["urls"]]


def is_indexed(policy: dict[str, Any], url: str) -> bool:
    """apt has package lists for the repository at ``url`` (it was in sources at the last
    ``apt update``); if not, what it offers is only known after the next update."""
    return normalise_url(url) in policy["indexed_urls"]

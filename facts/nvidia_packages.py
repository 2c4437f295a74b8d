"""NVIDIA package facts: what is installed and held, which kernel module is loaded and which
is installed, the running kernel and its headers (``NvidiaPackages``: dpkg and files only,
never apt), and what apt offers for a package (``AptPackageVersions``).

Loaded module: ``/proc/driver/nvidia/version``; where that file is absent (a container that
sees the GPUs but not the host's procfs), the driver version ``nvidia-smi`` reports, without a
flavour. Where no driver answers at all, nothing is loaded.

Installed module: ``modinfo nvidia`` for the running kernel (what a reboot would load).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from pyinfra.api import FactBase

from gpunode import framing
from gpunode.model import upstream_version

PROC_VERSION_PATH = "/proc/driver/nvidia/version"

# Installed packages the fact reports: NVIDIA driver, CUDA and companion packages.
REPORTED_PACKAGES = r"nvidia|^libcuda|^libnv|^cuda|^datacenter-gpu-manager|^libnccl|^nvlsm$"
SEPARATOR = "|"
# The parts of the fact's command (gpunode.framing), in order.
PARTS = ("installed", "loaded", "installed-module", "kernel", "headers", "lists")

# The module's version and licence from one ``modinfo nvidia`` (one program start, not one
# per field): its lines are "version:        550.127.08", "license:        Dual MIT/GPL".
INSTALLED_MODULE_COMMAND = (
    "modinfo nvidia 2>/dev/null | awk "
    '\'sub(/^version:[ \\t]*/, "") && v == "" {v = $0} '
    'sub(/^license:[ \\t]*/, "") && l == "" {l = $0} '
    f'END {{if (v != "") print "modinfo{SEPARATOR}" v "{SEPARATOR}" l}}\''
)

SHELL_COMMANDS = {
    "installed": (
        "dpkg-query -W "
        f"-f='${{db:Status-Abbrev}}{SEPARATOR}${{Package}}{SEPARATOR}${{Version}}\\n' "
        f"2>/dev/null | awk -F'{SEPARATOR}' '$2 ~ /{REPORTED_PACKAGES}/' || true"
    ),
    "loaded": (
        f"if [ -r {PROC_VERSION_PATH} ]; then "
        f'echo "proc{SEPARATOR}$(head -n 1 {PROC_VERSION_PATH})"; '
        "elif command -v nvidia-smi >/dev/null 2>&1; then "
        f'echo "nvidia-smi{SEPARATOR}$(nvidia-smi --query-gpu=driver_version '
        '--format=csv,noheader 2>/dev/null | head -n 1)"; fi'
    ),
    "installed-module": INSTALLED_MODULE_COMMAND,
    "kernel": "uname -r",
    "headers": "; ".join(
        (
            "headers=linux-headers-$(uname -r)",
            "status=$(dpkg-query -W -f='${db:Status-Abbrev}' \"$headers\" 2>/dev/null)",
            f'echo "status{SEPARATOR}$status"',
            f'if [ -d "/lib/modules/$(uname -r)/build" ]; then echo "build_dir{SEPARATOR}yes"; fi',
        )
    ),
    "lists": "ls /var/lib/apt/lists/ 2>/dev/null | grep -c '_Packages$' || true",
}

# dpkg's status database read in Python (gpunode.framing runs these parts in one process
# where the node has python3, and reads the database once for all of them: the frame's
# ``dpkg_packages``), printing what the shell parts' dpkg-query prints. Where the frame says
# dpkg-query must answer (records still in dpkg's journal, updates/, after an interrupted
# dpkg), the part runs its shell command.
DPKG_DIR = framing.DPKG_DIR
_SHELL_INSTEAD = r"""
import subprocess, sys
def run_shell_instead():
    sys.stdout.flush()
    sys.exit(subprocess.run(["sh", "-c", shell]).returncode)
"""
INSTALLED_PYTHON = framing.python_source(
    _SHELL_INSTEAD
    + r"""
import re
found = dpkg_packages(dpkg_dir, re.compile(names).search)
if found is None:
    run_shell_instead()
for abbrev, package, version in found:
    if abbrev[1] != "n":
        print(f"{abbrev}{sep}{package}{sep}{version}")
""",
    dpkg_dir=DPKG_DIR,
    names=REPORTED_PACKAGES,
    sep=SEPARATOR,
    shell=SHELL_COMMANDS["installed"],
)
HEADERS_PYTHON = framing.python_source(
    _SHELL_INSTEAD
    + r"""
import os
release = os.uname().release
headers = "linux-headers-" + release
found = dpkg_packages(dpkg_dir, headers.__eq__)
if found is None:
    run_shell_instead()
abbrev = next((record[0] for record in found), "")
print(f"status{sep}{abbrev}")
if os.path.isdir(f"/lib/modules/{release}/build"):
    print(f"build_dir{sep}yes")
""",
    dpkg_dir=DPKG_DIR,
    sep=SEPARATOR,
    shell=SHELL_COMMANDS["headers"],
)
KERNEL_PYTHON = "import os\nprint(os.uname().release)\n"
# ls hides names that begin with a dot.
LISTS_PYTHON = framing.python_source(
    r"""
import os
try:
    names = os.listdir(lists)
except OSError:
    names = []
print(sum(1 for name in names if name.endswith("_Packages") and not name.startswith(".")))
""",
    lists="/var/lib/apt/lists/",
)
# The module in memory: procfs where the module is loaded, else what nvidia-smi says.
LOADED_PYTHON = framing.python_source(
    r"""
import os, subprocess
if os.access(proc, os.R_OK):
    with open(proc, encoding="utf-8", errors="surrogateescape") as version:
        print(f"proc{sep}" + (version.read().split("\n", 1)[0]))
elif any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK) for d in os.environ["PATH"].split(":")):
    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    answer = subprocess.run(query, capture_output=True, stdin=subprocess.DEVNULL, text=True)
    print(f"nvidia-smi{sep}" + (answer.stdout.split("\n", 1)[0]))
""",
    proc=PROC_VERSION_PATH,
    sep=SEPARATOR,
)
# The first version: and license: lines of one ``modinfo nvidia``.
INSTALLED_MODULE_PYTHON = framing.python_source(
    r"""
import re, subprocess
try:
    shown = subprocess.run(
        ["modinfo", "nvidia"], capture_output=True, stdin=subprocess.DEVNULL, text=True
    ).stdout
except OSError:
    shown = ""
fields = {}
for line in shown.splitlines():
    found = re.match(r"(version|license):[ \t]*", line)
    if found:
        fields.setdefault(found.group(1), line[found.end():])
if fields.get("version"):
    print(f"modinfo{sep}{fields['version']}{sep}{fields.get('license', '')}")
""",
    sep=SEPARATOR,
)
PYTHON_PARTS = {
    "loaded": LOADED_PYTHON,
    "installed-module": INSTALLED_MODULE_PYTHON,
    "installed": INSTALLED_PYTHON,
    "kernel": KERNEL_PYTHON,
    "headers": HEADERS_PYTHON,
    "lists": LISTS_PYTHON,
}

# Module licence strings (modinfo -F license): the open modules are dual-licensed.
OPEN_MODULE_LICENSE = "Dual MIT/GPL"


def parse_proc_version(line: str) -> dict[str, str | None] | None:
    """The first line of /proc/driver/nvidia/version -> version and flavour.

    'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.127.08  Release Build ...'
    'NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.08  Tue Oct  8 ...'
    """
    match = re.search(r"Kernel Module(?: for \S+)?\s+([0-9]+\.[0-9]+(?:\.[0-9]+)?)", line)
    if match is None:
        return None
    flavour = "open" if "Open Kernel Module" in line else "proprietary"
    return {"version": match.group(1), "flavour": flavour}


def module_flavour(license_text: str) -> str | None:
    license_text = license_text.strip()
    if not license_text:
        return None
    return "open" if license_text == OPEN_MODULE_LICENSE else "proprietary"


def is_installed(status_abbrev: str) -> bool:
    """dpkg's abbreviated status: the second letter is the current state ("hi": held)."""
    return status_abbrev[1:2] == "i"


def _sections(lines: list[str]) -> dict[str, list[str]]:
    """Each part's non-blank lines; a part the output lacks (cut short) is missing."""
    frame = framing.parse(lines, PARTS)
    return {
        name: [line.rstrip() for line in part.lines if line.strip()]
        for name, part in frame.parts.items()
        if part.problem is None
    }


def _loaded(lines: list[str]) -> dict[str, Any] | None:
    for line in lines:
        source, _, text = line.partition(SEPARATOR)
        if source == "proc":
            parsed = parse_proc_version(text)
            if parsed:
                return {**parsed, "source": "proc"}
        elif source == "nvidia-smi" and re.fullmatch(r"[0-9]+\.[0-9]+(\.[0-9]+)?", text.strip()):
            # nvidia-smi does not say which module flavour answers.
            return {"version": text.strip(), "flavour": None, "source": "nvidia-smi"}
    return None


def _installed_module(lines: list[str]) -> dict[str, Any] | None:
    for line in lines:
        parts = line.split(SEPARATOR)
        if len(parts) != 3 or not parts[1].strip():
            continue
        source, version, license_text = parts
        return {
            "version": version.strip(),
            "flavour": module_flavour(license_text),
            "source": source,
        }
    return None


# A Debian package name (Debian policy 5.6.1): what a headers package name built from the
# node's kernel release must be before it goes into an apt command.
PACKAGE_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+")


def _headers(kernel: str, lines: list[str]) -> dict[str, Any]:
    values = dict(line.split(SEPARATOR, 1) for line in lines if SEPARATOR in line)
    package = f"linux-headers-{kernel}"
    return {
        # None: the kernel release the node reported makes no package name apt could know.
        "package": package if PACKAGE_NAME.fullmatch(package) else None,
        "installed": is_installed(values.get("status", "")),
        "build_dir": values.get("build_dir") == "yes",
    }


def reboot_required(loaded: dict[str, Any] | None, installed: dict[str, Any] | None) -> bool:
    """An installed module that is not the one in memory (version, or flavour where known)."""
    if installed is None:
        return False
    if loaded is None:
        return True
    if loaded["version"] != installed["version"]:
        return True
    return bool(
        loaded["flavour"] and installed["flavour"] and loaded["flavour"] != installed["flavour"]
    )


def parse_nvidia_packages(lines: list[str]) -> dict[str, Any]:
    sections = _sections(lines)
    packages: dict[str, str] = {}
    held: list[str] = []
    for line in sections.get("installed", []):
        parts = line.split(SEPARATOR)
        if len(parts) != 3:
            continue
        if is_installed(parts[0]):
            packages[parts[1]] = parts[2]
        # dpkg's selection "h" is what `apt-mark hold` sets and `apt-mark showhold` lists.
        if parts[0].startswith("h"):
            held.append(parts[1])
    kernel = (sections.get("kernel") or [""])[0].strip()
    loaded = _loaded(sections.get("loaded", []))
    installed = _installed_module(sections.get("installed-module", []))
    return {
        "packages": packages,
        "held": sorted(held),
        "loaded_module": loaded,
        "installed_module": installed,
        "reboot_required": reboot_required(loaded, installed),
        "kernel": kernel,
        "headers": _headers(kernel, sections.get("headers", [])),
        "package_lists": any(int(n) > 0 for n in sections.get("lists", []) if n.isdigit()),
    }


class NvidiaPackages(FactBase):
    """
    NVIDIA/CUDA packages, holds, kernel modules (loaded and installed) and kernel headers.

    .. code:: python

        {
            "packages": {"nvidia-open": "550.127.08-1", "libcuda1": "550.127.08-1"},
            "held": ["libcuda1", "nvidia-open"],  # dpkg selection "hold" (NVIDIA/CUDA names)
            "loaded_module": {"version": "550.127.08", "flavour": "open", "source": "proc"},
            "installed_module": {"version": "550.144.03", "flavour": "open",
                                 "source": "modinfo"},
            "reboot_required": True,  # installed module differs from the loaded one
            "kernel": "6.1.0-28-amd64",
            "headers": {"package": "linux-headers-6.1.0-28-amd64", "installed": False,
                        "build_dir": False},
            "package_lists": True,  # apt has package lists at all
        }

    ``loaded_module`` is None when no NVIDIA module is in memory; its ``source`` is
    ``nvidia-smi`` where procfs does not show it (see the module docstring), and then
    ``flavour`` is None.
    ``installed_module`` is None when no module is installed for the running kernel.
    ``headers["package"]`` is None when the kernel release is not a valid package name.

    Nothing here asks apt: whether the headers are installable matters only while a kernel
    module is to be built, and is then read with ``AptPackageVersions``. (``apt-cache policy``
    loads apt's whole cache and evaluates every pin against every package: half a second of
    node CPU on each read, on every node, for a no-op deploy and the nightly drift check.)
    """

    def parts(self) -> list[framing.Part]:
        return [
            framing.Part(name, SHELL_COMMANDS[name], python=PYTHON_PARTS.get(name))
            for name in PARTS
        ]

    def command(self) -> str:
        return framing.command(self.parts())

    def process(self, output: list[str]) -> dict[str, Any]:  # type: ignore[override]
        return parse_nvidia_packages(list(output))


def parse_apt_show(lines: list[str]) -> dict[str, list[dict[str, Any]]]:
    """``apt-cache show`` records -> package -> its available versions, newest record first.

    Each version says whether it builds its kernel module with DKMS (depends on dkms).
    """
    available: dict[str, list[dict[str, Any]]] = {}
    record: dict[str, str] = {}

    def flush() -> None:
        if "Package" in record and "Version" in record:
            depended_on = {
                choice.strip().split()[0]
                for part in record.get("Depends", "").split(",")
                for choice in part.split("|")
                if choice.strip()
            }
            entry = {
                "version": record["Version"],
                "upstream": upstream_version(record["Version"]),
                "dkms": "dkms" in depended_on,
            }
            versions = available.setdefault(record["Package"], [])
            if entry not in versions:
                versions.append(entry)
        record.clear()

    last_key = None
    for line in lines:
        if not line.strip():
            flush()
            last_key = None
        elif line[0] in " \t":
            if last_key:
                record[last_key] += " " + line.strip()
        elif ":" in line:
            key, value = line.split(":", 1)
            last_key = key.strip()
            record[last_key] = value.strip()
    flush()
    return available


class AptPackageVersions(FactBase):
    """
    What apt offers for each of ``packages``: every known version and whether it builds a
    kernel module with DKMS. A package apt does not know (yet) is missing from the result.

    ``apt-cache show`` reads apt's binary cache as it is, without evaluating pins (unlike
    ``apt-cache policy``, half a second per call on a node with the driver pin): tens of
    milliseconds. Roles ask it only when a package is to change.

    .. code:: python

        {"nvidia-kernel-open-dkms": [
            {"version": "550.144.03-1", "upstream": "550.144.03", "dkms": True},
            {"version": "550.127.08-1", "upstream": "550.127.08", "dkms": True},
        ]}
    """

    default = dict  # apt knows none of them

    def command(self, packages: list[str]) -> str:
        # gpunode's own package names and the node's headers package (checked against
        # PACKAGE_NAME): quoted all the same.
        names = " ".join(shlex.quote(package) for package in packages)
        return f"apt-cache show {names} 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, list[dict[str, Any]]]:  # type: ignore[override]
        return parse_apt_show(list(output))

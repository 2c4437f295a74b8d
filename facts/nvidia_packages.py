"""NVIDIA package facts: what is installed and held, which kernel module is loaded and which
is installed, the running kernel and its headers, and what apt offers for a package.

Loaded module: ``/proc/driver/nvidia/version``. Lab nodes have no kernel module at all; there
(and only where the lab's ``gpunode-lab-hw`` command exists) the GPU simulator's driver version,
as its ``nvidia-smi`` reports it, stands in for the loaded module, so reboot handling can be
tested end to end.

Installed module: ``modinfo nvidia`` for the running kernel (what a reboot would load); where
there is none, the lab stand-in driver's record ``/var/lib/gpunode-lab/installed-driver-version``
(written by the stand-in kernel module packages) stands in.
"""

from __future__ import annotations

import re
from typing import Any

from pyinfra.api import FactBase

from gpunode import framing
from gpunode.model import upstream_version

LAB_TOOL = "gpunode-lab-hw"
LAB_STATE_DIR = "/var/lib/gpunode-lab"
PROC_VERSION_PATH = "/proc/driver/nvidia/version"

# Installed packages the fact reports: NVIDIA driver, CUDA and companion packages.
REPORTED_PACKAGES = r"nvidia|^libcuda|^libnv|^cuda|^datacenter-gpu-manager|^libnccl"
SEPARATOR = "|"
# The parts of the fact's command (gpunode.framing), in order.
PARTS = ("installed", "loaded", "installed-module", "kernel", "headers", "lab", "lists")

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
        elif source == "simulator" and re.fullmatch(r"[0-9]+\.[0-9]+(\.[0-9]+)?", text.strip()):
            # The simulator has no notion of module flavour.
            return {"version": text.strip(), "flavour": None, "source": "simulator"}
    return None


def _installed_module(lines: list[str]) -> dict[str, Any] | None:
    for line in lines:
        parts = line.split(SEPARATOR)
        if len(parts) != 3 or not parts[1].strip():
            continue
        source, version, flavour_text = parts
        flavour = module_flavour(flavour_text) if source == "modinfo" else flavour_text.strip()
        return {"version": version.strip(), "flavour": flavour or None, "source": source}
    return None


def _headers(kernel: str, lines: list[str]) -> dict[str, Any]:
    values = dict(line.split(SEPARATOR, 1) for line in lines if SEPARATOR in line)
    candidate = values.get("candidate", "").strip()
    return {
        "package": f"linux-headers-{kernel}",
        "installed": is_installed(values.get("status", "")),
        "candidate": None if candidate in ("", "(none)") else candidate,
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
        "lab_simulator": bool(sections.get("lab")),
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
                        "candidate": "6.1.119-1", "build_dir": False},
            "lab_simulator": False,  # gpunode-lab-hw exists: a lab node
            "package_lists": True,  # apt has package lists at all
        }

    ``loaded_module`` is None when no NVIDIA module is in memory; its ``source`` is
    ``simulator`` on lab nodes (see the module docstring), where ``flavour`` is None.
    ``installed_module`` is None when no module is installed for the running kernel.
    """

    def command(self) -> str:
        sep = SEPARATOR
        commands = {
            "installed": (
                f"dpkg-query -W -f='${{db:Status-Abbrev}}{sep}${{Package}}{sep}${{Version}}\\n' "
                f"2>/dev/null | awk -F'{sep}' '$2 ~ /{REPORTED_PACKAGES}/' || true"
            ),
            "loaded": (
                f"if [ -r {PROC_VERSION_PATH} ]; then "
                f'echo "proc{sep}$(head -n 1 {PROC_VERSION_PATH})"; '
                f"elif command -v {LAB_TOOL} >/dev/null 2>&1; then "
                f'echo "simulator{sep}$(nvidia-smi --query-gpu=driver_version '
                '--format=csv,noheader 2>/dev/null | head -n 1)"; fi'
            ),
            "installed-module": (
                'if version=$(modinfo -F version nvidia 2>/dev/null) && [ -n "$version" ]; then '
                f'echo "modinfo{sep}$version{sep}$(modinfo -F license nvidia 2>/dev/null)"; '
                f"elif [ -r {LAB_STATE_DIR}/installed-driver-version ]; then "
                f'echo "lab{sep}$(cat {LAB_STATE_DIR}/installed-driver-version){sep}'
                f'$(cat {LAB_STATE_DIR}/installed-kernel-module-flavour 2>/dev/null)"; fi'
            ),
            "kernel": "uname -r",
            "headers": "; ".join(
                (
                    "headers=linux-headers-$(uname -r)",
                    "status=$(dpkg-query -W -f='${db:Status-Abbrev}' \"$headers\" 2>/dev/null)",
                    f'echo "status{sep}$status"',
                    # apt's candidate matters only while neither headers nor a build tree is
                    # there; reading it loads apt's whole cache, which a nightly check on every
                    # node spares.
                    f'if [ -d "/lib/modules/$(uname -r)/build" ]; then echo "build_dir{sep}yes"; '
                    'else case "$status" in ?i*) ;; *) '
                    f'echo "candidate{sep}$(apt-cache policy "$headers" 2>/dev/null '
                    "| sed -n 's/^ *Candidate: *//p')\";; esac; fi",
                )
            ),
            "lab": f"command -v {LAB_TOOL} || true",
            "lists": "ls /var/lib/apt/lists/ 2>/dev/null | grep -c '_Packages$' || true",
        }
        return framing.command(framing.Part(name, commands[name]) for name in PARTS)

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

    .. code:: python

        {"nvidia-kernel-open-dkms": [
            {"version": "550.144.03-1", "upstream": "550.144.03", "dkms": True},
            {"version": "550.127.08-1", "upstream": "550.127.08", "dkms": True},
        ]}
    """

    default = dict  # apt knows none of them

    def command(self, packages: list[str]) -> str:
        names = " ".join(packages)  # package names from gpunode's own tables, never data
        return f"apt-cache show {names} 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, list[dict[str, Any]]]:  # type: ignore[override]
        return parse_apt_show(list(output))

"""Whether the NVIDIA kernel module a node gets will load under UEFI Secure Boot.

With Secure Boot on, the kernel loads a module only if it is signed with a key it trusts:
Canonical's (its signed prebuilt ``linux-modules-nvidia-*`` packages: trusted through the
shim and kernel, nothing to enrol), or a machine owner key (MOK) the node's shim holds, which
a DKMS-built module (Debian's and NVIDIA's packages; Ubuntu's where it has no prebuilt one)
is signed with. DKMS signs with ``/var/lib/dkms/mok.pub`` (Debian's default
/etc/dkms/framework.conf); Ubuntu's shim-signed with ``/var/lib/shim-signed/mok/MOK.der``.
A key is enrolled with ``mokutil --import <key>``, confirmed at the console (MokManager)
on the next boot; until then the module does not load and the node comes back without GPUs.

The state comes from facts/secure_boot.py; the driver role refuses a module change that
would not load (before anything changes) and the drift check reports one as critical.
Sources: mokutil's own source, github.com/lcp/mokutil src/mokutil.c @9ae73db (2025-07-03):
``--sb-state`` prints "SecureBoot enabled" (SecureBoot 1 and SetupMode 0; then "SecureBoot
validation is disabled in shim" where shim does not enforce) or "SecureBoot disabled"
("Platform is in Setup Mode"); ``--test-key`` prints "<key> is already enrolled" / "is not
enrolled" / "is already in db" / "is already in the enrollment request"; r-pufky/docs
docs/service/secure_boot/README.md (DKMS's key path); read 2026-12-07.

Standard library only, as all of gpunode/expected.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

# The UEFI global variables (EFI_GLOBAL_VARIABLE GUID) that say whether Secure Boot is on:
# efivarfs files of 4 attribute bytes, then the value (1 byte: 1 on, 0 off).
EFI_DIR = "/sys/firmware/efi"
EFI_GLOBAL = "8be4df61-93ca-11d2-aa0d-00e098032b8c"
SECURE_BOOT_VARIABLE = f"{EFI_DIR}/efivars/SecureBoot-{EFI_GLOBAL}"
SETUP_MODE_VARIABLE = f"{EFI_DIR}/efivars/SetupMode-{EFI_GLOBAL}"

# The machine owner keys DKMS signs modules with: DKMS's own (Debian, DKMS 3), Ubuntu's
# shim-signed one.
DKMS_KEY = "/var/lib/dkms/mok.pub"
UBUNTU_KEY = "/var/lib/shim-signed/mok/MOK.der"
MOK_KEYS = (DKMS_KEY, UBUNTU_KEY)

State = Literal["enabled", "disabled", "not-applicable", "unknown"]
KeyStatus = Literal["enrolled", "not-enrolled", "pending", "absent", "unknown"]
ModuleKind = Literal["prebuilt", "dkms"]

# Kernel module packages that build with DKMS (Debian's, NVIDIA's, Ubuntu's) and Canonical's
# prebuilt ones, by name.
_DKMS_MODULE = re.compile(
    r"nvidia-kernel-dkms|nvidia-kernel-open-dkms|nvidia-open-kernel-dkms|"
    r"nvidia-dkms-[0-9]{3}(-server)?(-open)?"
)
_PREBUILT_MODULE = re.compile(r"linux-modules-nvidia-[0-9]{3}(-server)?(-open)?-[0-9].*")


def installed_module_kind(packages: Mapping[str, Any], kernel: str | None) -> ModuleKind | None:
    """What builds the installed NVIDIA module: DKMS (whose module is loaded before a
    prebuilt one of the same kernel), Canonical's prebuilt package for ``kernel`` (for any
    kernel where the release is unknown), or None where no module package is installed."""
    if any(_DKMS_MODULE.fullmatch(name) for name in packages):
        return "dkms"
    prebuilt = [name for name in packages if _PREBUILT_MODULE.fullmatch(name)]
    if prebuilt and (kernel is None or any(name.endswith("-" + kernel) for name in prebuilt)):
        return "prebuilt"
    return None


def enrolment_step(keys: Mapping[str, str]) -> str:
    """What the operator does so that DKMS-built modules load."""
    existing = [key for key in MOK_KEYS if keys.get(key) not in (None, "absent")]
    if not existing:
        return (
            "create the machine owner key DKMS signs with (" + " or ".join(MOK_KEYS) + "), "
            "enrol it with mokutil --import <key> and confirm the enrolment at the console "
            "on the next boot (MokManager)"
        )
    return (
        f"enrol the key DKMS signs with: mokutil --import {existing[0]}, then confirm the "
        "enrolment at the console on the next boot (MokManager)"
    )


def unloadable_reason(secure_boot: Mapping[str, Any], kind: ModuleKind | None) -> str | None:
    """Why an NVIDIA module of ``kind`` would not load on a node in this Secure Boot state,
    with what to do; None where it loads (or Secure Boot does not apply)."""
    if kind is None:
        return None
    state = secure_boot.get("state")
    if state in ("disabled", "not-applicable"):
        return None
    if secure_boot.get("shim_validation") is False:
        return None  # shim does not check signatures (mokutil --disable-validation)
    if kind == "prebuilt" and state == "enabled":
        return None  # signed by Canonical
    keys: Mapping[str, str] = secure_boot.get("keys") or {}
    if state != "enabled":
        why = "; ".join(str(problem) for problem in secure_boot.get("problems") or [])
        return (
            "the node boots with UEFI but its Secure Boot state could not be read"
            + (f" ({why})" if why else "")
            + f"; install mokutil, or check it by hand: {enrolment_step(keys)}"
        )
    if any(status == "enrolled" for status in keys.values()):
        return None
    if keys and all(status == "unknown" for status in keys.values()):
        return (
            "Secure Boot is on and whether a machine owner key DKMS signs with is enrolled "
            "could not be read (mokutil --test-key answered nothing known): install mokutil "
            f"and run again; if none is enrolled, {enrolment_step(keys)}"
        )
    pending = [key for key, status in keys.items() if status == "pending"]
    if pending:
        return (
            f"Secure Boot is on and the DKMS signing key {pending[0]} awaits its enrolment: "
            "confirm it at the console on the next boot (MokManager), then run again"
        )
    return (
        "Secure Boot is on and no machine owner key DKMS signs the NVIDIA module with is "
        f"enrolled: the module would not load; {enrolment_step(keys)}"
    )


def next_step(secure_boot: Mapping[str, Any]) -> str:
    """The one thing to do about a module that would not load in this state."""
    keys: Mapping[str, str] = secure_boot.get("keys") or {}
    unread = bool(keys) and all(status == "unknown" for status in keys.values())
    if secure_boot.get("state") != "enabled" or unread:
        return "install mokutil (or read the node's Secure Boot state by hand), then check again"
    if any(status == "pending" for status in keys.values()):
        return "confirm the pending key enrolment at the console on the next boot (MokManager)"
    return enrolment_step(keys)

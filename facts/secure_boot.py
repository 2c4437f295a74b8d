"""UEFI Secure Boot on the node, and whether a machine owner key DKMS signs with is enrolled.

Read from the firmware's own variables where efivarfs shows them (``SecureBoot`` and
``SetupMode``: 4 attribute bytes, then the value), else from ``mokutil --sb-state``; a node
that did not boot with UEFI (no /sys/firmware/efi: a BIOS boot, a container) has no Secure
Boot ("not-applicable"). Each key of gpunode.expected.secure_boot.MOK_KEYS that exists is
asked of ``mokutil --test-key``. Node output is untrusted: only known lines count, anything
else is named in ``problems``.
"""

from __future__ import annotations

import re
from typing import Any

from pyinfra.api import FactBase

from gpunode import framing
from gpunode.expected.secure_boot import (
    EFI_DIR,
    MOK_KEYS,
    SECURE_BOOT_VARIABLE,
    SETUP_MODE_VARIABLE,
    KeyStatus,
)

PARTS = ("efi", "secure-boot", "setup-mode", "sb-state", "keys")
# What the keys part prints for a key file that is not there (not mokutil's words).
ABSENT = "is absent"
_BYTES = re.compile(r"[0-9]{1,3}")
_MAX_SHOWN = 80


def _bytes_of(part: framing.PartOutput) -> list[int] | None:
    """``od -An -tu1 -v`` output -> the bytes; None where it failed or is not od's."""
    if part.exit_status != 0:
        return None
    words = part.text.split()
    if not words or len(words) > 16 or not all(_BYTES.fullmatch(word) for word in words):
        return None
    return [int(word) for word in words]


def efi_variable_value(data: list[int] | None) -> int | None:
    """An efivarfs file's bytes (4 attribute bytes, then the value of 1, 2 or 4 bytes,
    little-endian) -> the value; None for anything else."""
    if data is None or len(data) - 4 not in (1, 2, 4) or any(b > 255 for b in data):
        return None
    return int.from_bytes(bytes(data[4:]), "little")


def parse_sb_state(lines: list[str]) -> dict[str, Any]:
    """``mokutil --sb-state`` (stdout and stderr) -> state, setup mode, shim validation."""
    found: dict[str, Any] = {"state": None, "setup_mode": None, "shim_validation": None}
    unknown = []
    for line in (raw.strip() for raw in lines):
        if not line:
            continue
        if line == "SecureBoot enabled":
            found["state"], found["setup_mode"] = "enabled", False
            found["shim_validation"] = found["shim_validation"] is not False
        elif line == "SecureBoot disabled":
            found["state"] = "disabled"
        elif line == "Platform is in Setup Mode":
            found["setup_mode"] = True
        elif line == "SecureBoot validation is disabled in shim":
            found["shim_validation"] = False
        elif line == "This system doesn't support Secure Boot":
            found["state"] = "not-applicable"
        elif line.startswith("Strange data size "):
            continue  # mokutil still reads the value
        else:
            unknown.append(line[:_MAX_SHOWN])
    found["unknown"] = unknown
    return found


def parse_test_key(lines: list[str]) -> dict[str, KeyStatus]:
    """``mokutil --test-key <key>`` for each key (and the part's absence lines) -> status."""
    statuses: dict[str, KeyStatus] = {}
    endings: tuple[tuple[str, KeyStatus], ...] = (
        (" is already enrolled", "enrolled"),
        (" is already in db", "enrolled"),  # the firmware's own db trusts it
        (" is already in the enrollment request", "pending"),
        (" is not enrolled", "not-enrolled"),
        (" " + ABSENT, "absent"),
    )
    for line in (raw.strip() for raw in lines):
        for ending, status in endings:
            key = line[: -len(ending)] if line.endswith(ending) else None
            if key in MOK_KEYS:
                statuses[key] = status
    return {key: statuses.get(key, "unknown") for key in MOK_KEYS}


def parse_secure_boot(output: list[str]) -> dict[str, Any]:
    frame = framing.parse(output, PARTS)
    parts = {name: frame.part(name) for name in PARTS}
    problems: list[str] = []
    mokutil = parts["sb-state"]
    keys = (
        parse_test_key(parts["keys"].lines + parts["keys"].stderr)
        if not parts["keys"].absent
        else dict.fromkeys(MOK_KEYS, "unknown")
    )
    result: dict[str, Any] = {
        "state": "unknown", "source": None, "setup_mode": None, "shim_validation": None,
        "mokutil": not mokutil.absent, "keys": keys, "problems": problems,
    }  # fmt: skip
    efi = parts["efi"].text.strip()
    if efi == "bios":
        result["state"] = "not-applicable"
        return result
    if efi != "uefi":
        problems.append(f"efi: {parts['efi'].problem or 'unreadable'}")
    from_mokutil = parse_sb_state(mokutil.lines + mokutil.stderr) if not mokutil.absent else {}
    if from_mokutil:
        result["shim_validation"] = from_mokutil["shim_validation"]
    secure_boot = efi_variable_value(_bytes_of(parts["secure-boot"]))
    setup_mode = efi_variable_value(_bytes_of(parts["setup-mode"]))
    if secure_boot is not None:
        # mokutil's own rule: enabled only with SecureBoot 1 outside Setup Mode.
        in_setup = setup_mode == 1
        result.update(
            state="enabled" if secure_boot == 1 and not in_setup else "disabled",
            source="efivar",
            setup_mode=None if setup_mode is None else in_setup,
        )
        return result
    problems.append("SecureBoot variable: not readable in efivarfs")
    if from_mokutil.get("state"):
        result.update(
            state=from_mokutil["state"], source="mokutil", setup_mode=from_mokutil["setup_mode"]
        )
    elif mokutil.absent:
        problems.append("mokutil is not installed")
    else:
        said = "; ".join(from_mokutil.get("unknown") or []) or mokutil.problem or "nothing"
        problems.append(f"mokutil --sb-state: {said[: _MAX_SHOWN * 2]}")
    return result


class SecureBootState(FactBase):
    """
    UEFI Secure Boot and the machine owner keys DKMS signs with.

    .. code:: python

        {
            "state": "enabled",        # "disabled", "not-applicable" (no UEFI), "unknown"
            "source": "efivar",        # or "mokutil"; None where not read
            "setup_mode": False,       # None where not read
            "shim_validation": None,   # False: "SecureBoot validation is disabled in shim"
            "mokutil": True,           # installed
            "keys": {"/var/lib/dkms/mok.pub": "enrolled",   # not-enrolled, pending,
                     "/var/lib/shim-signed/mok/MOK.der": "absent"},  # absent, unknown
            "problems": [],
        }
    """

    def parts(self) -> list[framing.Part]:
        test_keys = "; ".join(
            f"if [ -e {key} ]; then mokutil --test-key {key}; else echo '{key} {ABSENT}'; fi"
            for key in MOK_KEYS
        )
        return [
            framing.Part("efi", f"if [ -d {EFI_DIR} ]; then echo uefi; else echo bios; fi"),
            framing.Part("secure-boot", f"od -An -tu1 -v {SECURE_BOOT_VARIABLE}", stderr="drop"),
            framing.Part("setup-mode", f"od -An -tu1 -v {SETUP_MODE_VARIABLE}", stderr="drop"),
            framing.Part("sb-state", "mokutil --sb-state", requires="mokutil", stderr="separate"),
            # mokutil --test-key exits 1 for a key that is not enrolled: the status says
            # nothing the text does not.
            framing.Part("keys", f"{{ {test_keys}; }}; true", requires="mokutil", stderr="merge"),
        ]

    def command(self) -> str:
        return framing.command(self.parts())

    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_secure_boot(list(output))

"""Secure Boot: the node's state from its EFI variables and mokutil's real words, whether a
DKMS signing key is enrolled, the decision whether the NVIDIA module would load, the
driver role's refusal before anything changes, and the drift check's critical finding."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from facts.secure_boot import (
    SecureBootState,
    efi_variable_value,
    parse_sb_state,
    parse_secure_boot,
    parse_test_key,
)
from gpunode import framing
from gpunode.drift.findings import Severity
from gpunode.expected.secure_boot import (
    DKMS_KEY,
    UBUNTU_KEY,
    installed_module_kind,
    next_step,
    unloadable_reason,
)
from gpunode.expected.ubuntu_driver import UbuntuKernel
from gpunode.model import build_desired_state
from gpunode.refusal import NodeRefused
from roles.nvidia_driver import require_loadable_under_secure_boot

from .fakehost import fake_host

MOKUTIL = Path(__file__).parents[1] / "fixtures" / "mokutil"


def said(name: str) -> list[str]:
    return (MOKUTIL / name).read_text().splitlines()


# --- mokutil's words --------------------------------------------------------------------------


def test_sb_state_lines_are_read_as_mokutil_prints_them() -> None:
    assert parse_sb_state(said("sb-state-enabled.txt")) == {
        "state": "enabled", "setup_mode": False, "shim_validation": True, "unknown": [],
    }  # fmt: skip
    assert parse_sb_state(said("sb-state-disabled-setup-mode.txt")) == {
        "state": "disabled", "setup_mode": True, "shim_validation": None, "unknown": [],
    }  # fmt: skip
    off = parse_sb_state(said("sb-state-enabled-shim-validation-off.txt"))
    assert (off["state"], off["shim_validation"]) == ("enabled", False)
    # What is not mokutil's is kept to name it, never read as a state.
    unknown = parse_sb_state([*said("sb-state-no-efivars.stderr"), "SecureBoot enabled?"])
    assert unknown["state"] is None
    assert unknown["unknown"] == [
        "EFI variables are not supported on this system",
        "SecureBoot enabled?",
    ]


def test_test_key_says_which_key_is_enrolled() -> None:
    assert parse_test_key(said("test-key-dkms-not-enrolled.txt")) == {
        DKMS_KEY: "not-enrolled", UBUNTU_KEY: "unknown",
    }  # fmt: skip
    both = said("test-key-dkms-enrolled.txt") + said("test-key-shim-signed-enrolled.txt")
    assert parse_test_key(both) == {DKMS_KEY: "enrolled", UBUNTU_KEY: "enrolled"}
    pending = [f"{DKMS_KEY} is already in the enrollment request", f"{UBUNTU_KEY} is absent"]
    assert parse_test_key(pending) == {DKMS_KEY: "pending", UBUNTU_KEY: "absent"}
    # Another path's line (a key gpunode does not ask about) counts for nothing.
    assert parse_test_key(["/tmp/x.der is already enrolled"])[DKMS_KEY] == "unknown"


def test_the_real_mokutil_s_words_in_the_lab_are_read_past_its_keyring_complaint() -> None:
    # Debian 12's mokutil 0.6.0 on the lab's simulated firmware, stderr merged as the fact
    # merges it: "Failed to accesss kernel trusted keyring" (no kernel keyring in a
    # container) is no key's status.
    assert parse_sb_state(said("lab/sb-state.txt"))["state"] == "enabled"
    for name, status in (
        ("lab/test-key-not-enrolled.txt", "not-enrolled"),
        ("lab/test-key-pending.txt", "pending"),
        ("lab/test-key-enrolled.txt", "enrolled"),
    ):
        assert said(name)[0].startswith("Failed to accesss kernel trusted keyring")
        assert parse_test_key(said(name)) == {DKMS_KEY: status, UBUNTU_KEY: "unknown"}, name


@pytest.mark.parametrize(
    ("data", "value"),
    [
        ([6, 0, 0, 0, 1], 1),  # 4 attribute bytes, then the value: on
        ([6, 0, 0, 0, 0], 0),
        ([6, 0, 0, 0, 1, 0], 1),  # a 2-byte value, little-endian
        ([6, 0, 0, 0], None),
        ([6, 0, 0, 0, 1, 0, 0], None),
        (None, None),
    ],
)
def test_an_efi_variable_s_value_follows_its_attributes(data: Any, value: int | None) -> None:
    assert efi_variable_value(data) == value


def frame(**parts: framing.PartOutput | list[str]) -> list[str]:
    every = {
        "efi": ["uefi"],
        "secure-boot": framing.PartOutput("secure-boot", [], [], 1),
        "setup-mode": framing.PartOutput("setup-mode", [], [], 1),
        "sb-state": framing.PartOutput("sb-state", absent=True),
        "keys": framing.PartOutput("keys", absent=True),
    }
    return framing.output_of(every | parts)


def test_the_firmware_s_variables_decide_as_mokutil_does() -> None:
    on = parse_secure_boot(
        frame(**{"secure-boot": ["   6   0   0   0   1"], "setup-mode": ["6 0 0 0 0"]})
    )
    assert (on["state"], on["source"], on["setup_mode"]) == ("enabled", "efivar", False)
    setup = parse_secure_boot(frame(**{"secure-boot": ["6 0 0 0 1"], "setup-mode": ["6 0 0 0 1"]}))
    assert (setup["state"], setup["setup_mode"]) == ("disabled", True)
    off = parse_secure_boot(frame(**{"secure-boot": ["6 0 0 0 0"]}))
    assert off["state"] == "disabled" and off["problems"] == []


def test_without_efivarfs_mokutil_says_it_and_without_uefi_nothing_applies() -> None:
    enabled = framing.PartOutput("sb-state", said("sb-state-enabled.txt"), [], 0)
    keys = framing.PartOutput("keys", said("test-key-shim-signed-enrolled.txt"), [], 0)
    found = parse_secure_boot(frame(**{"sb-state": enabled, "keys": keys}))
    assert (found["state"], found["source"], found["mokutil"]) == ("enabled", "mokutil", True)
    assert found["keys"][UBUNTU_KEY] == "enrolled"
    assert parse_secure_boot(frame(efi=["bios"]))["state"] == "not-applicable"
    unknown = parse_secure_boot(frame())
    assert unknown["state"] == "unknown"
    assert unknown["problems"] == [
        "SecureBoot variable: not readable in efivarfs",
        "mokutil is not installed",
    ]
    garbled = framing.PartOutput("sb-state", ["\x1b[31mhello"], [], 0)
    assert (
        "mokutil --sb-state: " in parse_secure_boot(frame(**{"sb-state": garbled}))["problems"][1]
    )
    # od's output that is not bytes is not a value.
    assert parse_secure_boot(frame(**{"secure-boot": ["6 0 0 0 999"]}))["state"] == "unknown"


def test_the_fact_reads_this_machine() -> None:
    fact = SecureBootState()
    output = subprocess.run(["sh", "-c", fact.command()], capture_output=True, text=True)
    found = fact.process(output.stdout.splitlines())
    if not os.path.isdir("/sys/firmware/efi"):
        assert found["state"] == "not-applicable"
    else:
        assert found["state"] in ("enabled", "disabled", "unknown")
    assert set(found["keys"]) == {DKMS_KEY, UBUNTU_KEY}


# --- the decision ----------------------------------------------------------------------------


def state(sb: str, *, shim: bool | None = None, **keys: str) -> dict[str, Any]:
    named = {DKMS_KEY: keys.get("dkms", "absent"), UBUNTU_KEY: keys.get("ubuntu", "absent")}
    return {"state": sb, "shim_validation": shim, "keys": named, "problems": []}


@pytest.mark.parametrize(
    ("secure_boot", "kind", "words"),
    [
        (state("disabled"), "dkms", None),
        (state("not-applicable"), "dkms", None),
        (state("enabled"), "prebuilt", None),  # signed by Canonical
        (state("enabled", dkms="enrolled"), "dkms", None),
        (state("enabled", dkms="not-enrolled", ubuntu="enrolled"), "dkms", None),
        (state("enabled", shim=False), "dkms", None),  # shim does not validate
        (state("enabled"), None, None),  # no module at all
        (
            state("enabled", dkms="not-enrolled"),
            "dkms",
            "mokutil --import /var/lib/dkms/mok.pub, then confirm",
        ),
        (
            state("enabled", ubuntu="not-enrolled"),
            "dkms",
            "mokutil --import /var/lib/shim-signed/mok/MOK.der",
        ),
        (state("enabled"), "dkms", "create the machine owner key DKMS signs with"),
        (state("enabled", dkms="pending"), "dkms", "awaits its enrolment: confirm it"),
        (state("unknown"), "dkms", "Secure Boot state could not be read"),
        # Secure Boot read from the firmware, but no mokutil to ask about the keys.
        (
            state("enabled", dkms="unknown", ubuntu="unknown"),
            "dkms",
            "could not be read (mokutil --test-key answered nothing known): install mokutil",
        ),
        (state("unknown"), "prebuilt", "Secure Boot state could not be read"),
    ],
)
def test_a_module_loads_unless_secure_boot_refuses_it(
    secure_boot: dict[str, Any], kind: Any, words: str | None
) -> None:
    reason = unloadable_reason(secure_boot, kind)
    if words is None:
        assert reason is None
    else:
        assert reason is not None and words in reason


def test_the_next_step_is_the_one_that_helps() -> None:
    assert next_step(state("enabled", dkms="pending")).startswith("confirm the pending key")
    assert next_step(state("enabled", dkms="not-enrolled")).startswith(
        "enrol the key DKMS signs with: mokutil --import /var/lib/dkms/mok.pub"
    )
    assert next_step(state("unknown")).startswith("install mokutil")
    assert next_step(state("enabled", dkms="unknown", ubuntu="unknown")).startswith(
        "install mokutil"
    )


def test_the_installed_module_s_kind_comes_from_its_package() -> None:
    kernel = UbuntuKernel("6.8.0", "64", "generic").release
    prebuilt = {"linux-modules-nvidia-550-server-open-6.8.0-64-generic": "6.8.0-64.67+1"}
    assert installed_module_kind(prebuilt, kernel) == "prebuilt"
    # A prebuilt module of another kernel loads nothing on this one.
    assert installed_module_kind(prebuilt, "6.8.0-65-generic") is None
    # DKMS's module wins over a prebuilt one of the same kernel.
    both = prebuilt | {"nvidia-dkms-550-server-open": "550.163.01-0ubuntu0.24.04.1"}
    assert installed_module_kind(both, kernel) == "dkms"
    assert installed_module_kind({"nvidia-kernel-open-dkms": "580.95.05-1"}, None) == "dkms"
    assert installed_module_kind({"nvidia-smi": "550.163.01-2"}, kernel) is None


# --- the driver role refuses before anything changes -------------------------------------------


def spec(source: str = "nvidia") -> Any:
    from gpunode.expected.packages import driver_packages_for, ubuntu_driver_packages

    data = {"source": source, "branch": "580", "version": "580.95.05-1"}
    wanted, problems = build_desired_state({"nvidia_driver": data})
    assert problems == []
    if source == "ubuntu":
        kernel = UbuntuKernel("6.8.0", "64", "generic")
        prebuilt = "linux-modules-nvidia-580-server-open-6.8.0-64-generic"
        return ubuntu_driver_packages(wanted.nvidia_driver, None, kernel, {prebuilt})
    return driver_packages_for(wanted.nvidia_driver, wanted.nvidia_driver.version)


def test_a_dkms_module_without_an_enrolled_key_is_refused_naming_the_enrolment() -> None:
    locked = {SecureBootState: state("enabled", dkms="not-enrolled")}
    with fake_host(locked), pytest.raises(NodeRefused) as refused:
        require_loadable_under_secure_boot(spec())
    assert refused.value.reason == (
        "node-1: NVIDIA driver 580.95.05-1 (open kernel module, nvidia source) not installed: "
        "Secure Boot is on and no machine owner key DKMS signs the NVIDIA module with is "
        "enrolled: the module would not load; enrol the key DKMS signs with: mokutil --import "
        "/var/lib/dkms/mok.pub, then confirm the enrolment at the console on the next boot "
        "(MokManager)"
    )
    assert str(refused.value).endswith("\nNothing was changed.")


def test_canonical_s_prebuilt_module_or_an_enrolled_key_goes_ahead() -> None:
    with fake_host({SecureBootState: state("enabled")}):
        require_loadable_under_secure_boot(spec("ubuntu"))  # nothing raised
    with fake_host({SecureBootState: state("enabled", dkms="enrolled")}):
        require_loadable_under_secure_boot(spec())
    locked = {SecureBootState: state("enabled", dkms="not-enrolled")}
    with fake_host(locked), pytest.raises(NodeRefused):
        require_loadable_under_secure_boot(spec())


# --- drift ------------------------------------------------------------------------------------


def test_a_module_that_would_not_load_under_secure_boot_is_critical_drift() -> None:
    from .test_drift_rules import findings, healthy_facts

    healthy = healthy_facts()
    assert findings(healthy | {"secure_boot": state("disabled")}) == {}
    locked = healthy | {"secure_boot": state("enabled", dkms="not-enrolled")}
    assert findings(locked) == {"secure_boot.module": Severity.CRITICAL}
    from gpunode.drift.rules import evaluate

    from .test_drift_rules import desired

    (finding,) = [f for f in evaluate("node-1", desired(), locked) if f.id == "secure_boot.module"]
    assert finding.found.startswith("module would not load under Secure Boot: ")
    assert finding.fix.startswith("enrol the key DKMS signs with: mokutil --import")
    assert findings(healthy | {"secure_boot": state("enabled", dkms="enrolled")}) == {}
    assert findings(healthy | {"secure_boot": {"state": 3}}) == {
        "secure_boot.unreadable": Severity.WARNING
    }

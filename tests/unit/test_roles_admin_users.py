"""The sudoers drop-in is validated by visudo before it can become active."""

from __future__ import annotations

import hashlib

from pyinfra.facts.files import Sha1File

from roles.admin_users import sudoers_dropin

from .fakehost import commands_of

CONTENT = "%gpunode-admins ALL=(ALL:ALL) NOPASSWD: ALL\n"


def test_new_dropin_is_checked_before_it_is_moved_into_place() -> None:
    commands, _ = commands_of(
        sudoers_dropin, {Sha1File: None}, path="/etc/sudoers.d/x", content=CONTENT
    )
    assert commands == [
        "printf '%s' '%gpunode-admins ALL=(ALL:ALL) NOPASSWD: ALL\n' > /etc/sudoers.d/x.new",
        "visudo -c -q -f /etc/sudoers.d/x.new && chmod 0440 /etc/sudoers.d/x.new "
        "&& mv /etc/sudoers.d/x.new /etc/sudoers.d/x",
    ]


def test_identical_dropin_is_a_noop() -> None:
    digest = hashlib.sha1(CONTENT.encode()).hexdigest()
    commands, noops = commands_of(
        sudoers_dropin, {Sha1File: digest}, path="/etc/sudoers.d/x", content=CONTENT
    )
    assert commands == []
    assert noops == ["/etc/sudoers.d/x is up to date"]

"""Unattended upgrades: Debian security updates only, never NVIDIA, CUDA or kernel packages.

A driver, CUDA library or kernel upgraded behind the operator's back breaks the GPU stack
(NVML "driver/library version mismatch" until a reboot), so the package blacklist from data
is written whether or not gpunode enables unattended-upgrades: an image or an operator may
have installed it, and it must not touch those packages either. Nothing is ever uninstalled.
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.server import Which
from pyinfra.operations import files

from gpunode.model import DesiredState, UnattendedUpgrades
from roles.packages import install_packages

CONFIG_PATH = "/etc/apt/apt.conf.d/51gpunode-unattended-upgrades"

# Debian's security archive, by codename (u-u substitutes ${distro_codename} itself). The
# second form matches the archive's older Release layout.
SECURITY_ORIGINS = (
    "origin=Debian,codename=${distro_codename}-security,label=Debian-Security",
    "origin=Debian,codename=${distro_codename},label=Debian-Security",
)


def blacklist_pattern(prefix: str) -> str:
    """A package name prefix as the regex u-u matches from the start of the name.

    Debian package names may hold '.' and '+', which are regex syntax.
    """
    return "^" + prefix.replace(".", r"\.").replace("+", r"\+")


def _apt_list(name: str, items: list[str]) -> list[str]:
    return [f"{name} {{", *(f'    "{item}";' for item in items), "};"]


def render_unattended_upgrades_conf(settings: UnattendedUpgrades) -> str:
    """apt.conf snippet, read after Debian's 50unattended-upgrades.

    Enabled: security origins only (``#clear`` drops the lists earlier files set), daily runs.
    Either way: the blacklist, and no automatic reboot.
    """
    lines = [
        "// Managed by gpunode (unattended_upgrades); local edits are replaced.",
        *_apt_list(
            "Unattended-Upgrade::Package-Blacklist",
            [blacklist_pattern(prefix) for prefix in settings.blacklist],
        ),
        'Unattended-Upgrade::Automatic-Reboot "false";',
    ]
    if settings.enabled:
        lines += [
            "#clear Unattended-Upgrade::Origins-Pattern;",
            "#clear Unattended-Upgrade::Allowed-Origins;",
            *_apt_list("Unattended-Upgrade::Origins-Pattern", list(SECURITY_ORIGINS)),
            'APT::Periodic::Update-Package-Lists "1";',
            'APT::Periodic::Unattended-Upgrade "1";',
        ]
    return "\n".join(lines) + "\n"


@deploy("Unattended upgrades")
def unattended_upgrades(desired: DesiredState) -> None:
    settings = desired.unattended_upgrades
    if settings.enabled:
        install_packages("unattended-upgrades installed", ["unattended-upgrades"])
    elif not host.get_fact(Which, command="unattended-upgrade"):
        host.noop(
            "unattended-upgrades is not installed and not enabled; its blacklist is written "
            "anyway so that a later install cannot touch NVIDIA, CUDA or kernel packages"
        )
    files.put(
        name="unattended-upgrades: security only, blacklist, no reboot",
        src=StringIO(render_unattended_upgrades_conf(settings)),
        dest=CONFIG_PATH,
        mode="644",
        user="root",
        group="root",
    )

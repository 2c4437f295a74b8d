"""Unattended upgrades: the release's security updates only (Debian's security archive;
Ubuntu's security pocket as its own default has it), never NVIDIA, CUDA or kernel packages.

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

from gpunode.converge import this_node
from gpunode.distributions import DEFAULT, Distribution
from gpunode.model import DesiredState, UnattendedUpgrades
from roles.packages import install_packages

CONFIG_PATH = "/etc/apt/apt.conf.d/51gpunode-unattended-upgrades"


def blacklist_pattern(prefix: str) -> str:
    """A package name prefix as the regex u-u matches from the start of the name.

    Debian package names may hold '.' and '+', which are regex syntax.
    """
    return "^" + prefix.replace(".", r"\.").replace("+", r"\+")


def _apt_list(name: str, items: list[str]) -> list[str]:
    return [f"{name} {{", *(f'    "{item}";' for item in items), "};"]


def render_unattended_upgrades_conf(
    settings: UnattendedUpgrades, distribution: Distribution = DEFAULT
) -> str:
    """apt.conf snippet, read after the release's own 50unattended-upgrades (u-u substitutes
    ``${distro_id}`` and ``${distro_codename}`` itself).

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
            *_apt_list(
                f"Unattended-Upgrade::{distribution.unattended_origins_list}",
                list(distribution.unattended_origins),
            ),
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
        src=StringIO(render_unattended_upgrades_conf(settings, this_node()[0])),
        dest=CONFIG_PATH,
        mode="644",
        user="root",
        group="root",
    )

"""unattended-upgrades configuration rendered from data."""

from __future__ import annotations

import re

from gpunode.distributions import BY_CODENAME
from gpunode.model import UnattendedUpgrades
from roles.unattended_upgrades import blacklist_pattern, render_unattended_upgrades_conf


def blacklist_of(text: str) -> list[str]:
    block = re.search(r"Unattended-Upgrade::Package-Blacklist \{\n(.*?)\n\};", text, re.S)
    assert block is not None, text
    return [line.strip().strip('";') for line in block.group(1).splitlines()]


def test_enabled_config_is_security_only_with_blacklist_and_no_reboot() -> None:
    text = render_unattended_upgrades_conf(UnattendedUpgrades(enabled=True))
    assert blacklist_of(text) == [
        "^nvidia-", "^libnvidia-", "^cuda-", "^libcuda", "^datacenter-gpu-manager",
        "^firmware-nvidia-", "^xserver-xorg-video-nvidia", "^libnvcuvid", "^libnvoptix",
        "^libnccl", "^libcudnn", "^linux-image-", "^linux-headers-", "^linux-modules-",
    ]  # fmt: skip
    assert 'Unattended-Upgrade::Automatic-Reboot "false";' in text
    # Debian's 50unattended-upgrades also allows point releases; #clear drops its list first.
    clear = text.index("#clear Unattended-Upgrade::Origins-Pattern;")
    origins = text.index("Unattended-Upgrade::Origins-Pattern {")
    assert clear < origins
    listed = re.findall(r'^\s+"(origin=[^"]+)";$', text, re.M)
    assert listed == [
        "origin=Debian,codename=${distro_codename}-security,label=Debian-Security",
        "origin=Debian,codename=${distro_codename},label=Debian-Security",
    ]
    assert 'APT::Periodic::Unattended-Upgrade "1";' in text


def test_disabled_config_still_blacklists_but_enables_and_narrows_nothing() -> None:
    text = render_unattended_upgrades_conf(
        UnattendedUpgrades(enabled=False, blacklist=("nvidia-",))
    )
    assert blacklist_of(text) == ["^nvidia-"]
    assert 'Unattended-Upgrade::Automatic-Reboot "false";' in text
    assert "Origins-Pattern" not in text
    assert "APT::Periodic" not in text


def test_blacklist_entries_match_prefixes_only() -> None:
    assert blacklist_pattern("libstdc++") == r"^libstdc\+\+"
    assert re.match(blacklist_pattern("nvidia-"), "nvidia-driver")
    assert not re.match(blacklist_pattern("nvidia-"), "firmware-nvidia-gsp")
    # '.' is literal: "linux-image-6.1" must not match "linux-image-6x1".
    assert not re.match(blacklist_pattern("linux-image-6.1"), "linux-image-6x1")
    assert re.match(blacklist_pattern("linux-image-6.1"), "linux-image-6.1.0-28-amd64")


def test_ubuntu_s_security_pockets_replace_its_default_lists() -> None:
    text = render_unattended_upgrades_conf(UnattendedUpgrades(enabled=True), BY_CODENAME["noble"])
    # Both of Ubuntu's default lists are cleared, then its security pockets allowed.
    assert text.index("#clear Unattended-Upgrade::Allowed-Origins;") < text.index(
        "Unattended-Upgrade::Allowed-Origins {"
    )
    assert re.findall(r'^\s+"(\$\{distro_id\}[^"]+)";$', text, re.M) == [
        "${distro_id}:${distro_codename}",
        "${distro_id}:${distro_codename}-security",
        "${distro_id}ESMApps:${distro_codename}-apps-security",
        "${distro_id}ESM:${distro_codename}-infra-security",
    ]
    assert "origin=Debian" not in text and "Origins-Pattern {" not in text
    assert "^linux-modules-" in blacklist_of(text)  # the prebuilt NVIDIA modules stay put

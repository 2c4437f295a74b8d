"""What a Kubernetes worker needs of the host: cgroup v2, no swap, the overlay and
br_netfilter modules, forwarding and bridge sysctls, a filtered forward path (roles.kubernetes,
the drift check)."""

from __future__ import annotations

import re
import shlex
from typing import Any

from pyinfra.api import FactBase

from gpunode import framing
from gpunode.expected.firewall import TABLE
from gpunode.expected.kubernetes import KUBERNETES_MODULES, KUBERNETES_PACKAGES, KUBERNETES_SYSCTLS

PARTS = ("cgroup", "swaps", "fstab_swap", "modules", "sysctls", "forward", "packages")
SYSCTLS = ("net.ipv4.ip_forward", *KUBERNETES_SYSCTLS)
# The filesystem type mounted at /sys/fs/cgroup: cgroup2 on the unified (v2) hierarchy,
# tmpfs on v1 and on the hybrid layout (v1 controllers beside a v2 mount below it).
CGROUP_KINDS = {"cgroup2": "v2", "tmpfs": "v1"}
_WORD = re.compile(r"[A-Za-z0-9._/:@+=-]{1,256}")
# dpkg-query's "${Package} ${Version} ${db:Status-Want}": the selection is "hold" when held.
_PACKAGE_LINE = re.compile(
    r"(?P<name>[a-z0-9.+-]{1,64}) (?P<version>[A-Za-z0-9.+~:-]{0,128}) "
    r"(?P<want>[a-z]{1,16})"
)
_SYSCTL_LINE = re.compile(r"(?P<key>[a-z0-9_.-]{1,80})=(?P<value>[0-9]{0,4})")
MAX_ENTRIES = 32


def _sysctl_command() -> str:
    reads = " ".join(
        f"printf '%s=%s\\n' {key} \"$(cat /proc/sys/{key.replace('.', '/')} 2>/dev/null)\";"
        for key in SYSCTLS
    )
    return f"{reads} true"


def _words(lines: list[str], name: str, problems: list[str]) -> list[str]:
    words = []
    for line in lines[:MAX_ENTRIES]:
        text = line.strip()
        if not text:
            continue
        if _WORD.fullmatch(text):
            words.append(text)
        else:
            problems.append(f"{name}: {text[:80]!r}")
    return words


def parse_kubernetes(output: list[str]) -> dict[str, Any]:
    frame = framing.parse(output, PARTS, max_output_chars=64 * 1024)
    problems: list[str] = []
    cgroup_lines = frame.part("cgroup").lines
    # The last mount at the path is the one seen there (a container may stack several).
    cgroup_type = cgroup_lines[-1].strip() if cgroup_lines else ""
    cgroup = CGROUP_KINDS.get(cgroup_type)
    if cgroup is None:
        problems.append(f"cgroup: /sys/fs/cgroup is {cgroup_type[:40]!r}")
    # /proc/swaps: a header line, then one line per active swap area (its first field).
    swaps_part = frame.part("swaps")
    swap_lines = [line.split()[0] for line in swaps_part.lines[1:] if line.split()]
    swap_active = _words(swap_lines, "swaps", problems)
    if swaps_part.exit_status != 0:
        problems.append(f"swaps: {swaps_part.problem or 'no /proc/swaps'}")
    fstab_swap = _words(frame.part("fstab_swap").lines, "fstab", problems)
    modules = [
        name for name in _words(frame.part("modules").lines, "modules", problems)
        if name in KUBERNETES_MODULES
    ]  # fmt: skip
    sysctls: dict[str, str] = {}
    for line in frame.part("sysctls").lines[: len(SYSCTLS) + 4]:
        match = _SYSCTL_LINE.fullmatch(line.strip())
        if match and match["key"] in SYSCTLS:
            sysctls[match["key"]] = match["value"]
        elif line.strip():
            problems.append(f"sysctls: {line.strip()[:80]!r}")
    forward_part = frame.part("forward")
    forward: bool | None
    if forward_part.absent:
        forward = None  # no nft: unknown
    else:
        chain = " ".join(" ".join(forward_part.lines).split())
        forward = (
            forward_part.exit_status == 0 and "hook forward" in chain and "policy drop" in chain
        )
    packages: dict[str, dict[str, Any]] = {}
    for line in frame.part("packages").lines[:MAX_ENTRIES]:
        match = _PACKAGE_LINE.fullmatch(line.strip())
        if match and match["name"] in KUBERNETES_PACKAGES:
            # dpkg lists a package it knows but has not installed with an empty version.
            if match["version"]:
                packages[match["name"]] = {
                    "version": match["version"], "held": match["want"] == "hold",
                }  # fmt: skip
        elif line.strip():
            problems.append(f"packages: {line.strip()[:80]!r}")
    return {
        "state": "ok",
        "reason": "",
        "cgroup": cgroup,
        "swap_active": swap_active,
        "fstab_swap": fstab_swap,
        "modules": sorted(modules),
        "sysctls": sysctls,
        "forward_filtered": forward,
        "packages": packages,
        "problems": problems[:20],
    }


class KubernetesNode(FactBase):
    """
    The cgroup hierarchy, active swap and fstab's swap lines, which of overlay and
    br_netfilter are loaded (or built in: ``/sys/module``), the forwarding and bridge sysctls
    whether gpunode's forward chain drops what it does not accept, and the installed
    kubelet, kubeadm and kubectl (version, held).

    .. code:: python

        {"state": "ok", "cgroup": "v2", "swap_active": [], "fstab_swap": [],
         "modules": ["br_netfilter", "overlay"],
         "sysctls": {"net.ipv4.ip_forward": "1", "net.bridge.bridge-nf-call-iptables": "1",
                     "net.bridge.bridge-nf-call-ip6tables": "1"},
         "forward_filtered": True, "packages": {"kubelet": {"version": "1.32.3-1.1",
         "held": True}}, "problems": []}
    """

    def command(self) -> str:
        return framing.command(self.parts())

    def parts(self) -> list[framing.Part]:
        modules = " ".join(KUBERNETES_MODULES)
        table = shlex.quote(TABLE.split()[0]) + " " + shlex.quote(TABLE.split()[1])
        return [
            framing.Part(
                "cgroup",
                "awk '$2 == \"/sys/fs/cgroup\" {print $3}' /proc/mounts",
                stderr="drop",
            ),
            framing.Part("swaps", "cat /proc/swaps", stderr="drop"),
            framing.Part(
                "fstab_swap",
                "awk '$1 !~ /^#/ && $3 == \"swap\" {print $1}' /etc/fstab 2>/dev/null; true",
                stderr="drop",
            ),
            framing.Part(
                "modules",
                f"for m in {modules}; do [ -d /sys/module/$m ] && echo $m; done; true",
                stderr="drop",
            ),
            framing.Part("sysctls", _sysctl_command(), stderr="drop"),
            framing.Part(
                "forward", f"nft list chain {table} forward", requires="nft", stderr="drop"
            ),
            framing.Part(
                "packages",
                "dpkg-query -W -f='${Package} ${Version} ${db:Status-Want}\\n' "
                + " ".join(KUBERNETES_PACKAGES)
                + " 2>/dev/null; true",
                requires="dpkg-query",
                stderr="drop",
            ),
        ]

    def process(self, output: list[str]) -> dict[str, Any]:  # type: ignore[override]
        return parse_kubernetes(list(output))

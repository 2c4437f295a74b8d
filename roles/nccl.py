"""NCCL settings from data: /etc/nccl.conf and the login environment.

NCCL reads /etc/nccl.conf (``NAME=value`` lines) in every process that loads it; the same
variables are exported for login shells by /etc/profile.d/gpunode-nccl.sh, so tools that read
the environment rather than the file (and people running ``env``) see the same values.
An environment variable set by a job still wins over both, as NCCL intends.

The interfaces and HCAs the variables name must exist on the node: a typo there makes NCCL
fall back to another network silently, so the role refuses at prepare time, before anything
changes, naming the node, the variable, the name and what exists. NCCL_SOCKET_IFNAME and
NCCL_IB_HCA are lists in NCCL's syntax: ``^`` excludes (excluded names are not checked),
``=`` asks for exact names, otherwise each name is a prefix; an HCA may carry ``:port``.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from io import StringIO
from typing import Any

from pyinfra import host
from pyinfra.api import OperationError, deploy, operation
from pyinfra.facts.files import FindInFile
from pyinfra.operations import files

from facts.fabric import NetworkInterfaces, RdmaDevices
from facts.hardware import InfinibandPorts
from gpunode.model import DesiredState
from gpunode.refusal import NodeRefused
from gpunode.schema import one_line

NCCL_CONF_PATH = "/etc/nccl.conf"
NCCL_PROFILE_PATH = "/etc/profile.d/gpunode-nccl.sh"
MANAGED_MARK = "# Managed by gpunode (nccl.env)"


@dataclass(frozen=True)
class NameList:
    """An NCCL interface or HCA list: ``[^][=]name[:port][,name[:port]...]``."""

    exclude: bool
    exact: bool
    names: tuple[tuple[str, int | None], ...]

    @classmethod
    def parse(cls, value: str) -> NameList:
        text = value.strip()
        exclude = text.startswith("^")
        text = text.removeprefix("^")
        exact = text.startswith("=")
        text = text.removeprefix("=")
        names: list[tuple[str, int | None]] = []
        for item in text.split(","):
            name, _, port = item.strip().partition(":")
            if name:
                names.append((name, int(port) if port.isdigit() else None))
        return cls(exclude, exact, tuple(names))

    def matches(self, name: str, existing: str) -> bool:
        return existing == name if self.exact else existing.startswith(name)


def render_nccl_conf(env: dict[str, str]) -> str:
    lines = [f"{MANAGED_MARK}; local edits are replaced."]
    lines += [one_line(f"{name}={env[name]}") for name in sorted(env)]
    return "\n".join(lines) + "\n"


def render_nccl_profile(env: dict[str, str]) -> str:
    lines = [f"{MANAGED_MARK}; local edits are replaced."]
    lines += [f"export {name}={shlex.quote(env[name])}" for name in sorted(env)]
    return "\n".join(lines) + "\n"


def _unmatched(wanted: NameList, known: list[str]) -> list[tuple[str, int | None]]:
    return [
        (name, port)
        for name, port in wanted.names
        if not any(wanted.matches(name, candidate) for candidate in known)
    ]


def interface_problems(
    value: str, existing: list[str], declared: list[str], node: str
) -> list[str]:
    """NCCL_SOCKET_IFNAME names that match no interface of ``node``.

    ``declared`` are IPoIB interfaces this run configures: they may not exist before it.
    """
    wanted = NameList.parse(value)
    if wanted.exclude:
        return []
    how = "exactly" if wanted.exact else "as a prefix"
    configured = f" (and this run configures: {', '.join(sorted(declared))})" if declared else ""
    return [
        f"{node}: nccl.env.NCCL_SOCKET_IFNAME = {value!r}: {name!r} matches no network "
        f"interface {how}; the node has: {', '.join(sorted(existing)) or 'none'}{configured}"
        for name, _ in _unmatched(wanted, sorted(set(existing) | set(declared)))
    ]


def hca_problems(value: str, hcas: dict[str, list[int]], node: str) -> list[str]:
    """NCCL_IB_HCA names (and ports) that match no HCA of ``node``.

    ``hcas``: HCA name -> its port numbers (empty where the ports are not known).
    """
    wanted = NameList.parse(value)
    if wanted.exclude:
        return []
    have = (
        ", ".join(
            f"{name} (ports {', '.join(map(str, ports))})" if ports else name
            for name, ports in sorted(hcas.items())
        )
        or "no HCA (/sys/class/infiniband and ibstat list none)"
    )
    how = "exactly" if wanted.exact else "as a prefix"
    problems = [
        f"{node}: nccl.env.NCCL_IB_HCA = {value!r}: {name!r} matches no HCA {how}; "
        f"the node has: {have}"
        for name, _ in _unmatched(wanted, list(hcas))
    ]
    for name, port in wanted.names:
        matching = [hca for hca in hcas if wanted.matches(name, hca)]
        if (
            matching
            and port is not None
            and all(hcas[hca] and port not in hcas[hca] for hca in matching)
        ):
            problems.append(
                f"{node}: nccl.env.NCCL_IB_HCA = {value!r}: {name}:{port}: no such port; "
                f"the node has: {have}"
            )
    return problems


def selection_notes(env: dict[str, str], interfaces: list[str], hcas: list[str]) -> list[str]:
    """What each interface/HCA list selects on this node, for the run's output."""
    notes = []
    for variable, existing in (("NCCL_SOCKET_IFNAME", interfaces), ("NCCL_IB_HCA", hcas)):
        if variable not in env:
            continue
        wanted = NameList.parse(env[variable])
        selected = sorted(
            candidate
            for candidate in set(existing)
            if any(wanted.matches(name, candidate) for name, _ in wanted.names) != wanted.exclude
        )
        notes.append(f"{variable}={env[variable]} selects: {', '.join(selected) or 'nothing yet'}")
    return notes


def known_hcas(sysfs: list[str], ibstat: dict[str, Any]) -> dict[str, list[int]]:
    """HCA -> port numbers, from /sys/class/infiniband and (where it reads) ibstat."""
    hcas: dict[str, list[int]] = {name: [] for name in sysfs}
    if ibstat.get("state") == "ok":
        for ca in ibstat.get("cas", []):
            hcas[ca["name"]] = sorted(port["port"] for port in ca.get("ports", []))
    return hcas


def declared_interfaces(desired: DesiredState) -> list[str]:
    ib = desired.infiniband
    return [interface.name for interface in ib.ipoib] if ib.enabled else []


def nccl_problems(
    env: dict[str, str],
    interfaces: list[str],
    hcas: dict[str, list[int]],
    declared: list[str],
    node: str,
) -> list[str]:
    problems: list[str] = []
    if "NCCL_SOCKET_IFNAME" in env:
        problems += interface_problems(env["NCCL_SOCKET_IFNAME"], interfaces, declared, node)
    if "NCCL_IB_HCA" in env:
        problems += hca_problems(env["NCCL_IB_HCA"], hcas, node)
    return problems


def _node_names(env: dict[str, str]) -> tuple[list[str], dict[str, list[int]]]:
    """The node's interfaces and HCAs as they are now (ibstat only when NCCL_IB_HCA is set)."""
    found: dict[str, Any] = host.get_fact(NetworkInterfaces)
    interfaces = list(found)
    ibstat = host.get_fact(InfinibandPorts) if "NCCL_IB_HCA" in env else {}
    return interfaces, known_hcas(host.get_fact(RdmaDevices), ibstat)


@operation()
def nccl_names_checked(env: dict[str, str], declared: list[str]):
    """The interfaces and HCAs NCCL is told to use exist; reports what they select.

    + env: the NCCL variables (``nccl.env``); NCCL_SOCKET_IFNAME and NCCL_IB_HCA are checked
    + declared: IPoIB interfaces this run configures, which may not exist before it
    """
    interfaces, hcas = _node_names(env)
    problems = nccl_problems(env, interfaces, hcas, declared, host.name)
    if problems:
        raise OperationError("\n".join(problems))
    for note in selection_notes(env, interfaces + declared, list(hcas)):
        host.noop(note)
    yield from ()


@deploy("NCCL")
def nccl(desired: DesiredState) -> None:
    env = desired.nccl.env
    if not env:
        files.file(name="No gpunode NCCL environment", path=NCCL_PROFILE_PATH, present=False)
        # /etc/nccl.conf may be the site's own: only gpunode's is removed.
        if host.get_fact(FindInFile, path=NCCL_CONF_PATH, pattern=f"^{MANAGED_MARK}"):
            files.file(name="No gpunode /etc/nccl.conf", path=NCCL_CONF_PATH, present=False)
        return
    declared = declared_interfaces(desired)
    interfaces, hcas = _node_names(env)
    problems = nccl_problems(env, interfaces, hcas, declared, host.name)
    if problems:
        raise NodeRefused("\n".join(problems))
    if "NCCL_SOCKET_IFNAME" in env or "NCCL_IB_HCA" in env:
        nccl_names_checked(name="NCCL interfaces and HCAs exist", env=env, declared=declared)
    files.put(
        name="NCCL settings in /etc/nccl.conf",
        src=StringIO(render_nccl_conf(env)),
        dest=NCCL_CONF_PATH,
        mode="644",
        user="root",
        group="root",
    )
    files.put(
        name="NCCL settings in the login environment",
        src=StringIO(render_nccl_profile(env)),
        dest=NCCL_PROFILE_PATH,
        mode="644",
        user="root",
        group="root",
    )

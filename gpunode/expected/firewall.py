"""The nftables ruleset of gpunode's own table, ``table inet gpunode``, rendered from data.

The role (roles/firewall.py) applies it behind its SSH guards; the drift check compares the
persisted file's checksum with it. Only this table is ever written or deleted.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from gpunode.model import DesiredState, Firewall

# facts/firewall.py takes the table's name from here.
TABLE = "inet gpunode"
ICMP_ECHO_LIMIT = "limit rate 10/second burst 20 packets"


# --- what the data allows --------------------------------------------------------------------


@dataclass(frozen=True)
class AllowRule:
    """Traffic from ``networks``: to ``ports`` over ``protocol``, or everything if None."""

    label: str
    comment: str
    networks: tuple[str, ...]
    protocol: str | None = None
    ports: tuple[int, ...] = ()

    def admits(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> bool:
        """Would this rule accept a new TCP connection from ``address`` to ``port``?"""
        if self.protocol not in (None, "tcp"):
            return False
        if self.protocol == "tcp" and port not in self.ports:
            return False
        return any(address in ipaddress.ip_network(network) for network in self.networks)


def service_rules(desired: DesiredState) -> tuple[AllowRule, ...]:
    """Allow-rules for the servers gpunode runs on the host beside SSH and the exporters: the
    monitoring host's Prometheus port, from ``DesiredState.prometheus_networks``."""
    networks = desired.prometheus_networks
    if not networks:
        return ()
    comment = "Prometheus from prometheus.client_networks"
    if not desired.prometheus.client_networks:
        comment += " (firewall.admin_networks)"
    return (AllowRule("prometheus", comment, networks, "tcp", (desired.prometheus.port,)),)


def allow_rules(
    firewall: Firewall,
    ssh_port: int,
    exporter_ports: tuple[int, ...] = (),
    services: tuple[AllowRule, ...] = (),
) -> list[AllowRule]:
    """The ruleset's allow-rules; ``exporter_ports`` (``DesiredState.exporter_ports``: the
    exporters gpunode runs) are opened to the monitoring networks with firewall.metrics_ports;
    ``services`` (``service_rules``) follow the fabric rule."""
    metrics_ports = tuple(sorted({*exporter_ports, *firewall.metrics_ports}))
    rules = [
        AllowRule(
            "admin", "SSH from firewall.admin_networks", firewall.admin_networks, "tcp",
            (ssh_port,),
        ),
        AllowRule(
            "monitoring", "metrics from firewall.monitoring_networks",
            firewall.monitoring_networks, "tcp", metrics_ports,
        ),
        AllowRule("fabric", "everything from firewall.fabric_networks", firewall.fabric_networks),
        *services,
    ]  # fmt: skip
    for index, extra in enumerate(firewall.extra_rules):
        rules.append(
            AllowRule(
                f"extra_{index}",
                f"firewall.extra_rules {extra.name or index}",
                extra.sources,
                extra.protocol,
                extra.ports,
            )
        )
    return [rule for rule in rules if rule.networks and (rule.protocol is None or rule.ports)]


# --- rendering -------------------------------------------------------------------------------


def _collapsed(networks: Iterable[str], version: int) -> list[str]:
    """Networks of one IP version, overlaps merged and sorted: the set never conflicts."""
    parsed = [ipaddress.ip_network(network) for network in networks]
    same_version = [network for network in parsed if network.version == version]
    collapsed = ipaddress.collapse_addresses(same_version)  # type: ignore[type-var]
    return [str(network) for network in collapsed]


def _ports(ports: Iterable[int]) -> str:
    unique = sorted(set(ports))
    return str(unique[0]) if len(unique) == 1 else "{ " + ", ".join(map(str, unique)) + " }"


def forward_chain(networks: tuple[str, ...]) -> tuple[list[str], str]:
    """(sets, chain) filtering forwarded traffic to ``networks`` (``DesiredState.
    forward_networks``: a Kubernetes worker's pod and service networks), everything else
    dropped. A packet any base chain of the forward hook drops is dropped: this chain adds a
    filter in front of the CNI's and kube-proxy's own chains, never opens what they close."""
    sets: list[str] = []
    rules = [
        "type filter hook forward priority filter; policy drop;",
        "ct state established,related accept",
        "ct state invalid drop",
    ]
    for version, family, address_type in ((4, "ip", "ipv4_addr"), (6, "ip6", "ipv6_addr")):
        collapsed = _collapsed(networks, version)
        if not collapsed:
            continue
        set_name = f"forward_ipv{version}"
        sets.append(
            f"\tset {set_name} {{\n\t\ttype {address_type}\n\t\tflags interval\n"
            f"\t\telements = {{ {', '.join(collapsed)} }}\n\t}}\n"
        )
        rules.append(f'{family} saddr @{set_name} accept comment "from kubernetes networks"')
        rules.append(f'{family} daddr @{set_name} accept comment "to kubernetes networks"')
    return sets, "\tchain forward {\n" + "".join(f"\t\t{rule}\n" for rule in rules) + "\t}\n"


def render_ruleset(
    firewall: Firewall,
    ssh_port: int,
    exporter_ports: tuple[int, ...] = (),
    services: tuple[AllowRule, ...] = (),
    forward_networks: tuple[str, ...] = (),
) -> str:
    """The file nft loads: replaces table inet gpunode, and only it, in one transaction.
    ``forward_networks``: where forwarded traffic may go (``forward_chain``); () adds no
    forward chain (Docker's own rules filter its bridges)."""
    sets: list[str] = []
    accepts: list[str] = []
    for rule in allow_rules(firewall, ssh_port, exporter_ports, services):
        match = f" {rule.protocol} dport {_ports(rule.ports)}" if rule.protocol else ""
        for version, family, address_type in ((4, "ip", "ipv4_addr"), (6, "ip6", "ipv6_addr")):
            networks = _collapsed(rule.networks, version)
            if not networks:
                continue
            set_name = f"{rule.label}_ipv{version}"
            sets.append(
                f"\tset {set_name} {{\n\t\ttype {address_type}\n\t\tflags interval\n"
                f"\t\telements = {{ {', '.join(networks)} }}\n\t}}\n"
            )
            accepts.append(f'{family} saddr @{set_name}{match} accept comment "{rule.comment}"')
    chain = [
        "type filter hook input priority filter; policy drop;",
        "ct state established,related accept",
        "ct state invalid drop",
        'iif "lo" accept',
        "icmp type { destination-unreachable, time-exceeded, parameter-problem } accept",
        f"icmp type echo-request {ICMP_ECHO_LIMIT} accept",
        "icmpv6 type { destination-unreachable, packet-too-big, time-exceeded, "
        "parameter-problem, mld-listener-query } accept",
        # Neighbour discovery and router advertisements only from the link (RFC 4861).
        "icmpv6 type { nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert } "
        "ip6 hoplimit 255 accept",
        f"icmpv6 type echo-request {ICMP_ECHO_LIMIT} accept",
        # DHCPv6 replies come from a server's link-local address, not as a tracked reply.
        'ip6 saddr fe80::/10 udp dport 546 accept comment "DHCPv6 client"',
        *accepts,
    ]
    input_chain = "\tchain input {\n" + "".join(f"\t\t{rule}\n" for rule in chain) + "\t}\n"
    chains = [input_chain]
    if forward_networks:
        forward_sets, forward = forward_chain(forward_networks)
        sets += forward_sets
        chains.append(forward)
    body = "\n".join([*sets, *chains])
    return (
        "#!/usr/sbin/nft -f\n"
        "# Managed by gpunode (firewall, sshd.port); local edits are replaced on the next run.\n"
        f"# Only table {TABLE} is replaced; every other table (Docker, Kubernetes, CNI) stays.\n"
        "# Declaring the table before deleting it makes the replace one atomic transaction\n"
        "# that also works when the table does not exist yet.\n"
        f"table {TABLE} {{}}\n"
        f"delete table {TABLE}\n\n"
        f"table {TABLE} {{\n{body}}}\n"
    )

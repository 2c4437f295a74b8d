"""Facts for gpunode's nftables table: what is live, what is persisted, who is connected.

Drift is judged by nftables itself, not by parsing rules here: the persisted ruleset file is
loaded into a scratch network namespace (``unshare --net``, which has no tables of its own)
and listed there, so "what the file would load" and "what is live" are two listings in the
same canonical form. ``-s`` leaves out counters and other state that changes by itself.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from pyinfra.api import FactBase

from gpunode import framing
from gpunode.expected.firewall import TABLE
from gpunode.sanitize import clean_text

RULESET_PATH = "/etc/gpunode/firewall.nft"
UNIT_NAME = "gpunode-firewall.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
ROLLBACK_UNIT = "gpunode-firewall-rollback"
STATE_DIR = "/var/lib/gpunode"

# The exit status of the listing parts when there is nothing to list (no table, no file).
NOTHING = 100


def parse_firewall_state(lines: list[str]) -> dict[str, Any]:
    """Turn the fact command's output into a report; never raises on odd output."""
    state: dict[str, Any] = {
        "nft": False,
        "file_sha256": None,
        "unit_file": False,
        "unit_enabled": False,
        "rollback_armed": False,
        "state_files": [],
        "live": None,
        "file_loads": None,
        "file_load_error": None,
    }
    frame = framing.parse(lines, ("state", "live", "file_loads"))
    for line in frame.part("state").lines:
        if "=" in line:
            key, _, value = line.partition("=")
            if key == "file_sha256" and value:
                state["file_sha256"] = value
            elif key == "unit_file":
                state["unit_file"] = value == "present"
            elif key == "unit_enabled":
                state["unit_enabled"] = value == "enabled"
            elif key == "rollback_armed":
                state["rollback_armed"] = value == "yes"
            elif key == "state_file" and value:
                state["state_files"].append(value)
    live, loads = frame.part("live"), frame.part("file_loads")
    state["nft"] = live.complete and not live.absent
    if live.exit_status == 0 and live.problem is None:
        state["live"] = _listing(live.lines)
    if loads.exit_status == 0 and loads.problem is None:
        state["file_loads"] = _listing(loads.lines)
    elif loads.exit_status not in (None, NOTHING):
        state["file_load_error"] = "\n".join(loads.lines).strip() or "nft -f failed"
    return state


def _listing(lines: list[str]) -> str:
    return "\n".join(line.rstrip() for line in lines).strip() + "\n"


# The state part in the frame's Python process (gpunode.framing): the file's digest read in
# the process, both units' states from the frame's one systemctl.
STATE_PYTHON = framing.python_source(
    r"""
import glob, hashlib, os
if os.path.isfile(ruleset):
    rules = read_bytes(ruleset)
    print("file_sha256=" + ("" if rules is None else hashlib.sha256(rules).hexdigest()))
if os.path.isfile(unit_path):
    print("unit_file=present")
print("unit_enabled=" + unit_properties(unit).get("UnitFileState", ""))
if unit_properties(rollback).get("ActiveState") in ("active", "reloading", "refreshing"):
    print("rollback_armed=yes")
for path in sorted(glob.glob(state_dir + "/firewall.*")):
    if os.path.exists(path):
        print(f"state_file={path}")
""",
    ruleset=RULESET_PATH,
    unit_path=UNIT_PATH,
    unit=UNIT_NAME,
    rollback=f"{ROLLBACK_UNIT}.timer",
    state_dir=STATE_DIR,
)

# The live table, asking nft once where the table is there (the shell command lists the
# tables first): only where the listing fails are the tables listed, to tell "no table"
# (NOTHING) from a failure.
LIVE_PYTHON = framing.python_source(
    r"""
import subprocess, sys
def nft(*arguments):
    return subprocess.run(["nft", *arguments], capture_output=True, text=True)
listed = nft("-s", "list", "table", *table.split())
if listed.returncode != 0 and f"table {table}" not in nft("list", "tables").stdout.splitlines():
    sys.exit(nothing)
print(listed.stdout, end="")
print(listed.stderr, end="", file=sys.stderr)
sys.exit(listed.returncode)
""",
    table=TABLE,
    nothing=NOTHING,
)


class FirewallState(FactBase):
    """
    gpunode's nftables table as it is live, as its persisted file would load it, and whether
    the boot unit and a pending rollback exist.

    .. code:: python

        {
            "nft": True,                 # the nft binary is installed
            "file_sha256": "ab12...",    # of /etc/gpunode/firewall.nft, None if absent
            "unit_file": True,           # /etc/systemd/system/gpunode-firewall.service
            "unit_enabled": True,
            "rollback_armed": False,     # gpunode-firewall-rollback.timer is waiting
            "state_files": ["/var/lib/gpunode/firewall.previous.nft", ...],  # of the guard
            "live": "table inet gpunode {...}",        # nft -s list; None if absent
            "file_loads": "table inet gpunode {...}",  # the same for the file; None if absent
            "file_load_error": None,     # why the file did not load, if it did not
        }
    """

    def parts(self) -> list[framing.Part]:
        scratch_load = f"nft -f {RULESET_PATH} && nft -s list table {TABLE}"
        state = "; ".join(
            [
                f'if [ -f {RULESET_PATH} ]; then echo "file_sha256=$(sha256sum < {RULESET_PATH}'
                " | cut -d' ' -f1)\"; fi",
                f"if [ -f {UNIT_PATH} ]; then echo unit_file=present; fi",
                f'echo "unit_enabled=$(systemctl is-enabled {UNIT_NAME} 2>/dev/null)"',
                f"if systemctl is-active --quiet {ROLLBACK_UNIT}.timer; then "
                "echo rollback_armed=yes; fi",
                f"for path in {STATE_DIR}/firewall.*; do "
                '[ -e "$path" ] && echo "state_file=$path"; done',
                "true",
            ]
        )
        live = (
            f"nft list tables | grep -qx 'table {TABLE}' || exit {NOTHING}; "
            f"nft -s list table {TABLE}"
        )
        # nft's own messages are why the file does not load: stderr is part of the text.
        file_loads = (
            f"[ -f {RULESET_PATH} ] || exit {NOTHING}; unshare --net -- sh -c '{scratch_load}' 2>&1"
        )
        return [
            framing.Part(
                "state",
                state,
                python=STATE_PYTHON,
                systemd_units=(UNIT_NAME, f"{ROLLBACK_UNIT}.timer"),
            ),
            framing.Part("live", live, requires="nft", python=LIVE_PYTHON),
            framing.Part("file_loads", file_loads, requires="nft"),
        ]

    def command(self) -> str:
        return framing.command(self.parts())

    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_firewall_state(list(output))


def parse_ssh_client(line: str) -> dict[str, Any] | None:
    """'10.0.0.1 51234 22' -> {'address': '10.0.0.1', 'server_port': 22}; None if unusable.

    An IPv4-mapped IPv6 address is given as IPv4: such packets are IPv4 to nftables.
    """
    parts = line.split()
    if len(parts) != 3:
        return None
    try:
        address = ipaddress.ip_address(parts[0].split("%", 1)[0])
        server_port = int(parts[2])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return {"address": str(address), "server_port": server_port}


class SshClient(FactBase):
    """
    Where this SSH session comes from, as the node sees it (``$SSH_CLIENT``); None when the
    connection is not SSH. Read it with ``_sudo=False``: sudo clears the variable.

    .. code:: python

        {"address": "10.213.4.1", "server_port": 22}
    """

    def command(self) -> str:
        return 'echo "ssh_client=$SSH_CLIENT"'

    def process(self, output: list[str]) -> dict[str, Any] | None:
        for line in output:
            if line.startswith("ssh_client="):
                return parse_ssh_client(line[len("ssh_client=") :])
        return None


def parse_ufw_status(output: list[str]) -> bool | str:
    """Whether ``ufw status``'s first line says ufw is active ('Status: active'): True, False
    for 'Status: inactive' or no ufw (the fact prints nothing), and ufw's own words where it
    answered anything else (not run as root, a broken install): whether it filters is then
    unknown, and the firewall role refuses rather than guess."""
    first = output[0].strip() if output else ""
    if first in ("", "Status: inactive"):
        return False
    if first == "Status: active":
        return True
    return clean_text(first, limit=200)


class UfwActive(FactBase):
    """
    Whether ufw (Ubuntu's firewall front end, installed on every Ubuntu server) is active:
    ``ufw enable`` loads its own rules and loads them again at boot. False where ufw is not
    installed. Needs root (``ufw status`` reads the live rules).

    .. code:: python

        False
    """

    def command(self) -> str:
        return "if command -v ufw >/dev/null 2>&1; then LC_ALL=C ufw status 2>&1 | head -n 1; fi"

    def process(self, output: list[str]) -> bool | str:  # type: ignore[override]
        return parse_ufw_status(list(output))

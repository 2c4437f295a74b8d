"""Kernel and login facts: live sysctls and whether each can be set here, login.defs, modes.

Inside a container most of /proc/sys is read-only or belongs to the host's kernel, so the
sysctl fact reports, per key, its value and whether its /proc/sys file is writable, together
with the container type ``systemd-detect-virt --container`` reports ("none" on a host or VM).
"""

from __future__ import annotations

import shlex
from typing import Any

from pyinfra.api import FactBase

CONTAINER_PREFIX = "container="
# Fields of one output line. Per /proc/sys file: requested key, dotted name, rw|ro|unreadable,
# value (whitespace squeezed); a key that matches no file: requested key, "missing".
FIELD_SEPARATOR = "|"


def parse_sysctl_report(lines: list[str]) -> dict[str, Any]:
    """Output of :class:`SysctlState` -> container type and, per requested key, its files.

    A plain key has at most one entry; a glob (``net.ipv4.conf.*.rp_filter``) has one per
    match. No entry at all means the key does not exist here.
    """
    container = "none"
    entries: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        if line.startswith(CONTAINER_PREFIX):
            container = line[len(CONTAINER_PREFIX) :].strip() or "none"
            continue
        parts = line.split(FIELD_SEPARATOR, 3)
        if len(parts) == 2 and parts[1] == "missing":
            entries.setdefault(parts[0], [])
            continue
        if len(parts) != 4:
            continue
        requested, name, access, value = parts
        entries.setdefault(requested, []).append(
            {
                "name": name,
                "writable": access == "rw",
                # A write-only file (net.ipv4.route.flush) cannot be read back.
                "value": " ".join(value.split()) if access != "unreadable" else None,
            }
        )
    return {"container": container, "keys": entries}


class SysctlState(FactBase):
    """
    The live value of each sysctl in ``keys`` and whether it can be written from here.

    .. code:: python

        {
            "container": "docker",  # systemd-detect-virt --container; "none" outside one
            "keys": {
                "net.ipv4.ip_forward": [
                    {"name": "net.ipv4.ip_forward", "writable": False, "value": "1"}
                ],
                "kernel.yama.ptrace_scope": [],  # not present on this kernel
            },
        }
    """

    def command(self, keys: list[str]) -> str:
        # Keys come from validated data (dotted names, maybe a '*' glob); the unquoted
        # expansion below is deliberate so that globs match every interface.
        quoted = " ".join(shlex.quote(key) for key in keys)
        sep = FIELD_SEPARATOR
        # A node reads some sixty keys. The shell finds each key's files with builtins only
        # (IFS splitting, not a tr per key) and one awk reads every value, instead of four
        # programs per key. awk's getline fails where a file cannot be opened (a write-only
        # key), as tr failed there; a file that opens but cannot be read (stable_secret
        # before it is set) makes mawk give up altogether, and then every value is read
        # again one tr each, as before.
        slow_read = (
            'if [ -z "$path" ]; then echo "$key|$name"; continue; fi; '
            'if value=$(tr "\\t\\n" "  " < "$path" 2>/dev/null); then :; '
            "else access=unreadable; value=; fi; "
            'echo "$key|$name|$access|$value"'
        )
        read_values = (
            "awk -F'|' -v OFS='|' '"
            "NF != 4 { print; next } "
            '{ value = ""; while ((status = (getline line < $4)) > 0) '
            '{ gsub(/\\t/, " ", line); value = value line " " } close($4); '
            'if (status < 0) { $3 = "unreadable"; value = "" } $4 = value; print }'
            "'"
        )
        return (
            "virt=$(systemd-detect-virt --container 2>/dev/null); "
            # Without systemd's answer, Docker's and Podman's marker files still tell.
            'if [ -z "$virt" ] || [ "$virt" = none ]; then '
            "  if [ -e /.dockerenv ]; then virt=docker; "
            "  elif [ -e /run/.containerenv ]; then virt=podman; else virt=none; fi; "
            "fi; "
            f'echo "{CONTAINER_PREFIX}$virt"; '
            f"files=$(for key in {quoted}; do "
            # The dots become slashes with the glob off, so a '*' is matched below, against
            # /proc/sys, never against the working directory.
            '  set -f; IFS=.; set -- $key; IFS=/; pattern="/proc/sys/$*"; unset IFS; set +f; '
            "  found=0; for path in $pattern; do "
            '    [ -e "$path" ] || continue; found=1; '
            '    set -f; IFS=/; set -- ${path#/proc/sys/}; IFS=.; name="$*"; unset IFS; set +f; '
            '    if [ -w "$path" ]; then access=rw; else access=ro; fi; '
            f'    echo "$key{sep}$name{sep}$access{sep}$path"; '
            "  done; "
            f'  [ $found = 1 ] || echo "$key{sep}missing"; '
            "done); "
            f'if values=$(printf "%s\\n" "$files" | {read_values}); then '
            'printf "%s\\n" "$values"; '
            "else "
            f'printf "%s\\n" "$files" | while IFS="{sep}" read -r key name access path; do '
            f"{slow_read}; done; "
            "fi"
        )

    def process(self, output: list[str]) -> dict[str, Any]:  # type: ignore[override]
        return parse_sysctl_report(list(output))


def parse_login_defs(lines: list[str]) -> dict[str, str]:
    """login.defs settings in effect: the first uncommented occurrence of each name wins."""
    settings: dict[str, str] = {}
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        parts = stripped.split(None, 1)
        settings.setdefault(parts[0], parts[1].strip() if len(parts) > 1 else "")
    return settings


class LoginDefs(FactBase):
    """
    Settings in /etc/login.defs, name -> value (None if the file does not exist).

    .. code:: python

        {"UMASK": "022", "PASS_MAX_DAYS": "99999", ...}
    """

    def command(self) -> str:
        return "cat /etc/login.defs 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, str]:  # type: ignore[override]
        return parse_login_defs(list(output))


def parse_file_modes(lines: list[str]) -> dict[str, dict[str, Any]]:
    modes: dict[str, dict[str, Any]] = {}
    for line in lines:
        parts = line.split(FIELD_SEPARATOR)
        if len(parts) != 4:
            continue
        path, mode, user, group = parts
        modes[path] = {"mode": int(mode, 8), "user": user, "group": group}
    return modes


class FileModes(FactBase):
    """
    Mode and ownership of each existing path in ``paths``; missing paths are left out.

    .. code:: python

        {"/etc/shadow": {"mode": 0o640, "user": "root", "group": "shadow"}}
    """

    def command(self, paths: list[str]) -> str:
        quoted = " ".join(shlex.quote(path) for path in paths)
        sep = FIELD_SEPARATOR
        return f"stat -c '%n{sep}%a{sep}%U{sep}%G' {quoted} 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, dict[str, Any]]:  # type: ignore[override]
        return parse_file_modes(list(output))


def parse_password_states(lines: list[str]) -> dict[str, dict[str, Any]]:
    accounts: dict[str, dict[str, Any]] = {}
    for line in lines:
        parts = line.split(FIELD_SEPARATOR)
        if len(parts) != 3:
            continue
        name, state, max_days = parts
        accounts[name] = {
            "password_locked": state == "locked",
            "max_days": int(max_days) if max_days.lstrip("-").isdigit() else None,
        }
    return accounts


class PasswordStates(FactBase):
    """
    Per account in /etc/shadow: whether its password is locked ('!' or '*', so it can only
    log in with a key) and its maximum password age in days (None: no ageing).

    Only those two facts leave the host: the hash itself is never printed.

    .. code:: python

        {"gpuadmin": {"password_locked": True, "max_days": 60}}
    """

    def command(self) -> str:
        sep = FIELD_SEPARATOR
        return (
            'awk -F: \'{ state = ($2 ~ /^[!*]/) ? "locked" : "password"; '
            f'print $1 "{sep}" state "{sep}" $5 }}\' /etc/shadow'
        )

    def process(self, output: list[str]) -> dict[str, dict[str, Any]]:  # type: ignore[override]
        return parse_password_states(list(output))

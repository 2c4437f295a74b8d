"""Who can log in over SSH: local accounts with authorized keys, their shells, expiry and groups.

Read from /etc/passwd and /etc/shadow (local accounts only: directory-service users are kept
out by sshd's AllowGroups unless they are in gpunode's login group). Everything here comes from
the node and is untrusted: names that are not POSIX user names are dropped, numbers that are
not numbers become None, and the number of accounts is capped.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from pyinfra.api import FactBase

from gpunode import framing
from gpunode.expected.sshd import LOGIN_GROUP

ADMIN_GROUP = "gpunode-admins"  # passwordless sudo
MANAGED_GROUPS = (ADMIN_GROUP, LOGIN_GROUP)
KEY_FILES = (".ssh/authorized_keys", ".ssh/authorized_keys2")
NOLOGIN_SHELL = "/usr/sbin/nologin"
MAX_ACCOUNTS = 2000

_USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")

# The account this fact runs for: sudo names the user who logged in; without sudo, it is us.
SESSION_USER = 'echo "session_user ${SUDO_USER:-$(id -un)}"'

# name:uid:home:shell:password-field:expire-day, passwd joined with shadow in one pass.
_PASSWD_WITH_SHADOW = (
    "awk -F: 'NR==FNR {pw[$1]=$2; ex[$1]=$8; next} "
    '{print $1 ":" $3 ":" $6 ":" $7 ":" pw[$1] ":" ex[$1]}\' '
    f"/etc/shadow /etc/passwd | head -n {MAX_ACCOUNTS}"
)

_KEY_COUNT = "keys=0; " + " ".join(
    f'if [ -f "$home/{path}" ]; then '
    f"n=$(grep -c '^[[:space:]]*[^#[:space:]]' \"$home/{path}\" 2>/dev/null); "
    "keys=$((keys + ${n:-0})); fi;"
    for path in KEY_FILES
)

ACCOUNTS_COMMAND = " ".join(
    [
        f"{SESSION_USER};",
        'echo "today $(( $(date +%s) / 86400 ))";',
        f"for g in {' '.join(MANAGED_GROUPS)}; do",
        'echo "group $(getent group "$g" || echo "$g")"; done;',
        f"{_PASSWD_WITH_SHADOW} | while IFS=: read -r name uid home shell password expire; do",
        _KEY_COUNT,
        'usable=no; if [ -x "$shell" ]; then case "$shell" in',
        "*/nologin|*/false) ;; *) usable=yes ;; esac; fi;",
        "case \"$password\" in '') pw=NP ;; '!'*|'*'*) pw=L ;; *) pw=P ;; esac;",
        'groups=; if [ "$keys" -gt 0 ]; then groups=$(id -Gn -- "$name" 2>/dev/null | tr \' \' ,); fi;',  # noqa: E501
        'echo "account:$name:$uid:$usable:$keys:$expire:$pw:$groups:$shell:$home";',
        "done",
    ]
)


# ACCOUNTS_COMMAND in Python (gpunode.framing runs it where the node has python3): the same
# lines, read from the same files in the fact's own process instead of a pipeline of awk,
# grep and id per account.
ACCOUNTS_PYTHON = framing.python_source(
    r"""
import grp, os, pwd, re, sys, time
print("session_user", os.environ.get("SUDO_USER") or pwd.getpwuid(os.geteuid()).pw_name)
print("today", int(time.time()) // 86400)
for name in groups:
    try:
        entry = grp.getgrnam(name)
        members = ",".join(entry.gr_mem)
        print("group", ":".join((entry.gr_name, entry.gr_passwd, str(entry.gr_gid), members)))
    except KeyError:
        print("group", name)
def fields(path):
    with open(path, encoding="utf-8", errors="surrogateescape") as lines:
        return [line.rstrip("\n").split(":") for line in lines]
try:
    shadow = {}
    for entry in fields("/etc/shadow"):
        shadow.setdefault(entry[0], (entry + [""] * 8)[:9])
    passwd = fields("/etc/passwd")
except OSError as error:
    print(f"accounts: {error}", file=sys.stderr)
    passwd = []
key_line = re.compile(rb"^[ \t\n\v\f\r]*[^# \t\n\v\f\r]")
for entry in passwd[:limit]:
    entry = (entry + [""] * 7)[:7]
    name, uid, home, shell = entry[0], entry[2], entry[5], entry[6]
    password, expire = (shadow[name][1], shadow[name][7]) if name in shadow else ("", "")
    keys = 0
    for key_file in key_files:
        path = f"{home}/{key_file}"
        if os.path.isfile(path):
            try:
                with open(path, "rb") as held:
                    keys += sum(1 for line in held.read().split(b"\n") if key_line.match(line))
            except OSError:
                pass
    refused = shell.endswith(("/nologin", "/false"))
    usable = "yes" if os.access(shell, os.X_OK) and not refused else "no"
    state = "NP" if password == "" else "L" if password[:1] in ("!", "*") else "P"
    member_of = ""
    if keys > 0:
        try:
            user = pwd.getpwnam(name)
            listed = os.getgrouplist(name, user.pw_gid)
            ids = [user.pw_gid] + [gid for gid in listed if gid != user.pw_gid]
            names = []
            for gid in ids:
                try:
                    names.append(grp.getgrgid(gid).gr_name)
                except KeyError:
                    names.append(str(gid))
            member_of = ",".join(names)
        except KeyError:
            pass
    line = f"account:{name}:{uid}:{usable}:{keys}:{expire}:{state}:{member_of}:{shell}:{home}"
    sys.stdout.buffer.write(line.encode("utf-8", "surrogateescape") + b"\n")
""",
    groups=MANAGED_GROUPS,
    key_files=KEY_FILES,
    limit=MAX_ACCOUNTS,
)


def _number(text: str) -> int | None:
    return int(text) if text.isdigit() and len(text) < 12 else None


def _names(text: str) -> list[str]:
    return sorted({name for name in text.split(",") if _USER_NAME.fullmatch(name)})


def parse_accounts(lines: list[str]) -> dict[str, Any]:
    """The command's output -> the structure documented on :class:`LoginAccounts`."""
    result: dict[str, Any] = {
        "state": "ok",
        "session_user": None,
        "today": None,
        "groups": {group: None for group in MANAGED_GROUPS},
        "accounts": {},
    }
    for raw in lines[: MAX_ACCOUNTS + 16]:
        line = raw.rstrip("\r\n")
        word, _, rest = line.partition(" ")
        if word == "session_user" and _USER_NAME.fullmatch(rest):
            result["session_user"] = rest
        elif word == "today":
            result["today"] = _number(rest)
        elif word == "group":
            name, _, tail = rest.partition(":")
            if name in MANAGED_GROUPS:
                # name:x:gid:members, or only the name when the group does not exist.
                fields = tail.split(":")
                result["groups"][name] = _names(fields[2]) if len(fields) >= 3 else None
        elif line.startswith("account:"):
            fields = line.split(":", 9)
            if len(fields) != 10 or not _USER_NAME.fullmatch(fields[1]):
                continue
            _, name, uid, usable, keys, expire, password, groups, shell, home = fields
            result["accounts"][name] = {
                "uid": _number(uid),
                "home": home[:256],
                "shell": shell[:256],
                "shell_usable": usable == "yes",
                "keys": _number(keys) or 0,
                "expire_day": _number(expire),
                "password": password if password in ("NP", "L", "P") else "unknown",
                "groups": _names(groups),
            }
    if result["today"] is None:
        result["state"] = "unreadable"
        result["reason"] = "accounts: no output (the command did not run)"
    return result


def expired(account: dict[str, Any], today: int | None) -> bool:
    """The account's expiry date has passed: PAM refuses every login, key logins included."""
    day = account.get("expire_day")
    return day is not None and today is not None and day <= today


class LoginAccounts(FactBase):
    """
    Local accounts, and which of them hold SSH keys.

    .. code:: python

        {
            "state": "ok",
            "session_user": "debian",  # the account this fact logged in as
            "today": 20423,            # days since 1970, as /etc/shadow counts
            "groups": {"gpunode-admins": ["gpuadmin"], "gpunode-login": [...]},  # None: absent
            "accounts": {
                "gpuadmin": {
                    "uid": 1001, "home": "/home/gpuadmin", "shell": "/bin/bash",
                    "shell_usable": True, "keys": 1, "expire_day": None,
                    "password": "L",   # L locked or none, P set, NP empty
                    "groups": ["gpuadmin", "gpunode-admins", "gpunode-login"],  # keys > 0 only
                },
            },
        }
    """

    def command(self) -> str:
        return ACCOUNTS_COMMAND

    def process(self, output: list[str]) -> dict[str, Any]:
        return parse_accounts(list(output))


def parse_passwd_entries(lines: list[str]) -> dict[str, dict[str, Any]]:
    """``PasswdEntries``' output -> user -> its entry; only whole entries (seven passwd
    fields, a POSIX user name) are kept."""
    entries: dict[str, dict[str, Any]] = {}
    for raw in lines[:MAX_ACCOUNTS]:
        line = raw.rstrip("\r\n")
        if not line.startswith("entry "):
            continue
        passwd, group, groups = [*line[len("entry ") :].rsplit("|", 2), "", ""][:3]
        fields = passwd.split(":")
        if len(fields) != 7 or not _USER_NAME.fullmatch(fields[0]):
            continue
        name, _, uid, gid, comment, home, shell = fields
        primary = group.strip()
        entries[name] = {
            "home": home[:256] or None,
            "comment": comment[:256] or None,
            "shell": shell[:256] or None,
            "group": primary or None,
            # Secondary groups only, as pyinfra's Users has them.
            "groups": [g for g in groups.split() if g and g != primary],
            "uid": _number(uid),
            "gid": _number(gid),
        }
    return entries


class PasswdEntries(FactBase):
    """
    The /etc/passwd entries of the named accounts and their groups: what pyinfra's
    ``server.Users`` says of them, read for these accounts only.

    .. code:: python

        {
            "gpuadmin": {
                "home": "/home/gpuadmin", "comment": None, "shell": "/bin/bash",
                "group": "gpuadmin",                             # primary group
                "groups": ["gpunode-admins", "gpunode-login"],  # secondary groups
                "uid": 1001, "gid": 1001,
            },
        }

    An account without an entry in /etc/passwd is absent. (pyinfra's ``Users`` runs five
    programs for every account on the node, lastlog included: a quarter of a second of node
    CPU on every deploy, to read the two or three accounts gpunode manages.)

    + users: the account names
    """

    default = dict

    def command(self, users: list[str]) -> str:
        names = " ".join(shlex.quote(str(name)) for name in users)
        # The shell's own read and case: a literal match on the name, no program per line.
        return (
            f'for u in {names}; do while IFS= read -r line; do case "$line" in "$u":*) '
            'echo "entry $line|$(id -gn -- "$u" 2>/dev/null)|$(id -Gn -- "$u" 2>/dev/null)"; '
            "break ;; esac; done < /etc/passwd; done"
        )

    def process(self, output: list[str]) -> dict[str, dict[str, Any]]:  # type: ignore[override]
        return parse_passwd_entries(list(output))


def key_file_targets_command(user: str) -> str:
    """Where ``user``'s home and each of its authorized_keys files resolve, and who owns each."""
    if not _USER_NAME.fullmatch(user):
        raise ValueError(f"not a user name: {user!r}")
    name = shlex.quote(user)
    lines = [
        f"entry=$(getent passwd -- {name}) || exit 0;",
        'uid=$(echo "$entry" | cut -d: -f3); home=$(echo "$entry" | cut -d: -f6);',
        'echo "home $uid $(realpath -e -- "$home" 2>/dev/null)";',
    ]
    for path in KEY_FILES:
        # -e follows links: a link to nothing reads no keys (LoginAccounts counts none).
        lines.append(
            f'if [ -e "$home/{path}" ]; then echo "key {path} '
            f'$(stat -L -c %u -- "$home/{path}") $(realpath -e -- "$home/{path}")"; fi;'
        )
    return " ".join(lines)


_NODE_PATH = re.compile(r"/[^\x00-\x1f\x7f]{0,4095}")


def parse_key_file_targets(lines: list[str]) -> dict[str, Any]:
    """The command's output -> ``{"state": "ok", "uid": 1001, "home": "/home/u",
    "keys": {".ssh/authorized_keys": {"uid": 1001, "path": "/home/u/.ssh/authorized_keys"}}}``;
    ``{"state": "absent"}`` without an account; any other line makes it ``unreadable``."""
    result: dict[str, Any] = {"state": "absent", "uid": None, "home": None, "keys": {}}
    for raw in lines[:8]:
        word, _, rest = raw.rstrip("\r\n").partition(" ")
        number, _, path = rest.partition(" ")
        if (
            word == "home"
            and _number(number) is not None
            and (path == "" or _NODE_PATH.fullmatch(path))
        ):
            result.update(state="ok", uid=_number(number), home=path or None)
        elif word == "key":
            owner, _, path = path.partition(" ")
            if number in KEY_FILES and _number(owner) is not None and _NODE_PATH.fullmatch(path):
                result["keys"][number] = {"uid": _number(owner), "path": path}
                continue
            return {"state": "unreadable", "reason": f"key file line {raw[:120]!r}"}
        else:
            return {"state": "unreadable", "reason": f"line {raw[:120]!r}"}
    if len(lines) > 8:
        return {"state": "unreadable", "reason": f"{len(lines)} lines"}
    if result["keys"] and result["state"] != "ok":
        return {"state": "unreadable", "reason": "key files without a home that resolves"}
    return result


class KeyFileTargets(FactBase):
    """
    Where an account's home and its authorized_keys files resolve (links followed), and who
    owns each file: a revocation removes only what is the account's own.

    .. code:: python

        {"state": "ok", "uid": 1001, "home": "/home/olduser",
         "keys": {".ssh/authorized_keys": {"uid": 1001,
                                           "path": "/home/olduser/.ssh/authorized_keys"}}}

    + user: the account
    """

    @staticmethod
    def default() -> dict[str, Any]:
        return {"state": "absent", "uid": None, "home": None, "keys": {}}

    def command(self, user: str) -> str:
        return key_file_targets_command(user)

    def process(self, output: list[str]) -> dict[str, Any]:  # type: ignore[override]
        return parse_key_file_targets(list(output))

"""The SSH server as it really is: effective settings (``sshd -T``), host keys, moduli, units,
and who can log in through it.

Besides the global view (root from 127.0.0.1), the effective settings are evaluated with
``sshd -T -C`` for every account that could log in (root, members of gpunode's groups, every
account holding authorized keys) connecting from the control host's address as the node sees
it: a ``Match User`` or ``Match Address`` block that loosens authentication for one of them is
visible there and nowhere else. Where the config has no Match block (and includes no file
that could hold one), every account's settings are the same: sshd evaluates them once.
"""

from __future__ import annotations

import re
from typing import Any

from pyinfra.api import FactBase

from facts.accounts import (
    ACCOUNTS_COMMAND,
    ACCOUNTS_PYTHON,
    KEY_FILES,
    MANAGED_GROUPS,
    parse_accounts,
)
from gpunode import framing
from gpunode.expected.sshd import RSA_HOST_KEY

# The parts of the fact's command (gpunode.framing), in order.
PARTS = ("effective", "config_sha1", "rsa_bits", "weak_moduli", "socket", "per_user", "accounts")
USER_MARK = "gpunode:user="
SSHD_CONFIG = "/etc/ssh/sshd_config"
MODULI = "/etc/ssh/moduli"
# /etc/ssh/moduli's fifth column is the modulus size minus one: 3071 means 3072 bits.
MIN_MODULUS_FIELD = 3071
# Any address that is not local: the stand-in when the login's own address cannot be found.
NON_LOCAL_ADDRESS = "192.0.2.1"  # TEST-NET-1
MAX_EVALUATED_USERS = 64
MAX_EFFECTIVE_LINES = 400

_ADDRESS = re.compile(r"[0-9A-Fa-f:.]{2,45}")
_PORT = re.compile(r"[0-9]{1,5}")

# The control host's address and the sshd port as this login sees them: SSH_CONNECTION of the
# nearest ancestor process that has one (sudo does not pass it on), else a non-local stand-in.
CONNECTION_COMMAND = (
    "addr=; lport=; p=$$; i=0; "
    'while [ -z "$addr" ] && [ "$i" -lt 12 ] && [ "${p:-0}" -gt 1 ]; do '
    "c=$(tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | sed -n 's/^SSH_CONNECTION=//p'); "
    'if [ -n "$c" ]; then set -- $c; addr=$1; lport=$4; fi; '
    "p=$(awk '/^PPid:/ {print $2}' /proc/$p/status 2>/dev/null); i=$((i + 1)); done; "
    f"case \"$addr\" in ''|*[!0-9A-Fa-f:.]*) addr={NON_LOCAL_ADDRESS} ;; esac; "
    "case \"$lport\" in ''|*[!0-9]*) "
    "lport=$(/usr/sbin/sshd -T 2>/dev/null | awk '$1 == \"port\" {print $2; exit}') ;; esac; "
    'echo "connection ${addr} ${lport:-22}"'
)

# root, the members of gpunode's groups and every local account holding authorized keys.
_KEY_TESTS = " || ".join(f'[ -s "$h/{path}" ]' for path in KEY_FILES)
CANDIDATES_COMMAND = (
    f"users=$({{ echo root; getent group {' '.join(MANAGED_GROUPS)} | cut -d: -f4 | tr , '\\n'; "
    f"cut -d: -f1,6 /etc/passwd | while IFS=: read -r n h; do if {_KEY_TESTS}; then "
    'echo "$n"; fi; done; } | '
    f"grep -xE '[a-z_][a-z0-9_-]{{0,31}}' | sort -u | head -n {MAX_EVALUATED_USERS})"
)

# A Match block is the only way the connection (user, address, port) changes sshd's
# settings, and Include the only way a block can come from another file: where the config
# has neither keyword (gpunode's own config has none), one evaluation stands for every
# account. Keywords are case-insensitive and may be followed by "=". grep's exit 1 is "none
# found"; 0 (found) or 2 (unreadable) evaluate each account.
WITHOUT_MATCH_COMMAND = (
    f"grep -Eiq '^[[:space:]]*(match|include)([[:space:]]|=)' {SSHD_CONFIG} 2>/dev/null; "
    '[ "$?" -eq 1 ]'
)
_EVALUATE = (
    '/usr/sbin/sshd -T -C "user=$u,host=$addr,addr=$addr,lport=$lport" 2>&1 '
    f"| head -n {MAX_EFFECTIVE_LINES}"
)

# Where the config has no Match or Include, sshd's answer is the same for every account and
# every address: the "effective" part's own ``sshd -T`` stands for each of them, and this
# part only lists the accounts (no second sshd -T, no search for the login's address).
SHARED_MARK = "gpunode:per-user=effective"
PER_USER_COMMAND = (
    f"{CANDIDATES_COMMAND}; "
    f"if {WITHOUT_MATCH_COMMAND}; then echo '{SHARED_MARK}'; "
    f'for u in $users; do echo "{USER_MARK}$u"; done; '
    f"else {CONNECTION_COMMAND}; "
    f'for u in $users; do echo "{USER_MARK}$u"; {_EVALUATE}; done; fi'
)


# The parts in Python (gpunode.framing runs them in one process where the node has python3):
# the same output as their shell commands, without a program started per line of it.
CONFIG_SHA1_PYTHON = framing.python_source(
    r"""
import hashlib
try:
    with open(path, "rb") as config:
        print(hashlib.sha1(config.read()).hexdigest())
except OSError:
    pass
""",
    path=SSHD_CONFIG,
)
# ssh-keygen -l prints an RSA key's modulus size first; read from the public key's blob
# (RFC 4253 6.6: string "ssh-rsa", mpint e, mpint n). Another kind of key: ssh-keygen.
RSA_BITS_PYTHON = framing.python_source(
    r"""
import base64, binascii, sys
def field(blob, at):
    size = int.from_bytes(blob[at:at + 4], "big")
    return blob[at + 4:at + 4 + size], at + 4 + size
try:
    with open(path + ".pub", "rb") as public:
        words = public.read().split()
except OSError:
    sys.exit(0)
try:
    blob = base64.b64decode(words[1], validate=True)
    kind, at = field(blob, 0)
    exponent, at = field(blob, at)
    modulus, at = field(blob, at)
    bits = int.from_bytes(modulus, "big").bit_length() if kind == b"ssh-rsa" and modulus else 0
except (IndexError, ValueError, binascii.Error):
    bits = 0
if bits:
    print(bits)
else:
    import subprocess  # only for a key of another kind: most nodes never need it
    command = ["ssh-keygen", "-l", "-f", path + ".pub"]
    listed = subprocess.run(command, capture_output=True, text=True)
    if listed.stdout:
        print(listed.stdout.split(" ")[0])
""",
    path=RSA_HOST_KEY,
)
# awk's '$5 < N' compares as numbers where the field is one, as text otherwise.
WEAK_MODULI_PYTHON = framing.python_source(
    r"""
import re
number = re.compile(r"[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?")
count = 0
try:
    with open(path, encoding="utf-8", errors="replace") as moduli:
        for line in moduli:
            if line.startswith("#"):
                continue
            fifth = (line.split() + [""] * 5)[4]
            if fifth.isdigit():
                count += int(fifth) < minimum
            elif number.fullmatch(fifth):
                count += float(fifth) < minimum
            else:
                count += fifth < str(minimum)
except OSError:
    pass
print(count)
""",
    path=MODULI,
    minimum=MIN_MODULUS_FIELD,
)
# Where the config has no Match or Include (gpunode's own), the accounts are listed here; a
# config with either runs the shell command, which evaluates sshd -T for each account.
PER_USER_PYTHON = framing.python_source(
    r"""
import grp, os, re, sys
users = {"root"}
for group in groups:
    try:
        users.update(grp.getgrnam(group).gr_mem)
    except KeyError:
        pass
try:
    with open("/etc/passwd", encoding="utf-8", errors="surrogateescape") as passwd:
        for line in passwd:
            fields = line.rstrip("\n").split(":")
            name, home = fields[0], (fields + [""] * 6)[5]
            held = [f"{home}/{key}" for key in key_files]
            if any(os.path.isfile(path) and os.path.getsize(path) > 0 for path in held):
                users.add(name)
except OSError:
    pass
users = sorted(u for u in users if re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", u))[:limit]
try:
    with open(config, encoding="utf-8", errors="replace") as text:
        keyword = re.compile(r"[ \t\n\v\f\r]*(match|include)([ \t\n\v\f\r]|=)", re.I)
        evaluate = any(keyword.match(line) for line in text)
except OSError:
    evaluate = True
if evaluate:
    import subprocess
    sys.stdout.flush()
    sys.exit(subprocess.run(["sh", "-c", shell]).returncode)
print(shared_mark)
for user in users:
    print(user_mark + user)
""",
    groups=MANAGED_GROUPS,
    key_files=KEY_FILES,
    limit=MAX_EVALUATED_USERS,
    config=SSHD_CONFIG,
    shell=PER_USER_COMMAND,
    shared_mark=SHARED_MARK,
    user_mark=USER_MARK,
)


def parse_sections(lines: list[str]) -> dict[str, framing.PartOutput]:
    """Each part of the fact's output; one the output lacks is empty, with its problem."""
    frame = framing.parse(lines, PARTS)
    return {name: frame.part(name) for name in PARTS}


def parse_effective(lines: list[str]) -> dict[str, list[str]]:
    """``sshd -T`` output -> lower-case keyword -> values (repeatable keywords keep all)."""
    settings: dict[str, list[str]] = {}
    for line in lines:
        keyword, _, value = line.strip().partition(" ")
        if keyword:
            settings.setdefault(keyword.lower(), []).append(value.strip())
    return settings


def parse_per_user(lines: list[str], shared: list[str] | None = None) -> dict[str, Any]:
    """The per-user section -> {"address", "port", "users": {name: effective settings}}.

    ``shared``: the effective part's lines, which every account gets where the section says
    the config has no Match (``SHARED_MARK``); the address is then not looked up (None).
    """
    address, port = None, None
    users: dict[str, list[str]] = {}
    current: list[str] | None = None
    is_shared = False
    for line in lines:
        if line == SHARED_MARK and not users:
            is_shared = True
        elif line.startswith(USER_MARK):
            name = line[len(USER_MARK) :].strip()
            valid = re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", name) and len(users) < 64
            current = users.setdefault(name, []) if valid else None
        elif line.startswith("connection ") and not users:
            _, found_address, found_port = [*line.split(), "", ""][:3]
            address = found_address if _ADDRESS.fullmatch(found_address) else None
            port = int(found_port) if _PORT.fullmatch(found_port) else None
        elif current is not None and not is_shared and len(current) < MAX_EFFECTIVE_LINES:
            current.append(line)
    if is_shared:
        same = (shared or [])[:MAX_EFFECTIVE_LINES]
        users = {name: list(same) for name in users}
    effective = {}
    for name, user_lines in users.items():
        # sshd -T prints settings as lower-case keywords; anything else is its error message.
        if user_lines and all(re.match(r"[a-z0-9]+ ", line) for line in user_lines):
            effective[name] = parse_effective(user_lines)
        else:
            effective[name] = {"error": [" ".join(user_lines)[:300] or "no output"]}
    return {"address": address, "port": port, "users": effective}


class SshdState(FactBase):
    """
    The SSH server in one round trip.

    .. code:: python

        {
            "effective": {"passwordauthentication": ["no"], ...},  # {} if sshd -T failed
            "effective_error": "",
            "config_sha1": "...",       # of /etc/ssh/sshd_config
            "rsa_host_key_bits": 4096,  # None without an RSA host key
            "weak_moduli": 0,           # moduli lines below 3072 bits
            "socket_enabled": False,    # ssh.socket (socket activation ignores Port)
            "per_user": {               # sshd -T -C user=<name>,addr=<control host>
                "address": "10.0.0.1", "port": 22,
                "users": {"gpuadmin": {"passwordauthentication": ["no"], ...}},
                # a user whose evaluation failed: {"error": ["message"]}
            },
            "accounts": {...},          # facts.accounts.LoginAccounts
        }
    """

    def parts(self) -> list[framing.Part]:
        commands = {
            # sshd's complaint is why it could not say: stderr is part of the text.
            "effective": (
                "/usr/sbin/sshd -T -C user=root,host=localhost,addr=127.0.0.1,lport=22 2>&1"
            ),
            "config_sha1": f"sha1sum {SSHD_CONFIG} 2>/dev/null | cut -d' ' -f1",
            "rsa_bits": f"ssh-keygen -l -f {RSA_HOST_KEY}.pub 2>/dev/null | cut -d' ' -f1",
            "weak_moduli": (
                f"awk '$5 < {MIN_MODULUS_FIELD}' {MODULI} 2>/dev/null | grep -vc '^#' || true"
            ),
            "socket": "systemctl is-enabled ssh.socket 2>/dev/null || true",
            "per_user": PER_USER_COMMAND,
            "accounts": ACCOUNTS_COMMAND,
        }
        python = {
            "config_sha1": CONFIG_SHA1_PYTHON,
            "rsa_bits": RSA_BITS_PYTHON,
            "weak_moduli": WEAK_MODULI_PYTHON,
            "per_user": PER_USER_PYTHON,
            # systemctl is-enabled prints the unit file's state, and nothing for no unit.
            "socket": (
                'state = unit_properties("ssh.socket").get("UnitFileState", "")\n'
                "if state:\n    print(state)\n"
            ),
            "accounts": ACCOUNTS_PYTHON,
        }
        units = {"socket": ("ssh.socket",)}
        return [
            framing.Part(
                name, commands[name], python=python.get(name), systemd_units=units.get(name, ())
            )
            for name in PARTS
        ]

    def command(self) -> str:
        return framing.command(self.parts())

    def process(self, output: list[str]) -> dict[str, Any]:
        sections = parse_sections(list(output))
        effective = sections["effective"]
        failed = effective.exit_status != 0
        reason = " ".join(effective.lines) or effective.problem or ""
        rsa = sections["rsa_bits"].text.strip()
        weak = sections["weak_moduli"].text.strip()
        return {
            "effective": {} if failed else parse_effective(effective.lines),
            "effective_error": reason[:300] if failed else "",
            "config_sha1": sections["config_sha1"].text.strip() or None,
            "rsa_host_key_bits": int(rsa) if rsa.isdigit() else None,
            "weak_moduli": int(weak) if weak.isdigit() else 0,
            "socket_enabled": sections["socket"].text.strip()
            in ("enabled", "enabled-runtime", "static"),
            "per_user": parse_per_user(sections["per_user"].lines, effective.lines),
            "accounts": parse_accounts(sections["accounts"].lines),
        }

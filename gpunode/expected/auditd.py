"""auditd as gpunode sets it up on a node: its rule file, the keys it loads, the kernel check.

Rules are auditctl(8) watch rules (``-w path -p wa -k key``: writes and attribute changes of
the path, tagged with a key ausearch -k finds), in /etc/audit/rules.d, compiled into
/etc/audit/audit.rules and loaded by augenrules(8) (``augenrules --load``). Sources:
auditctl(8), augenrules(8) and audit.rules(7) of Debian 12's auditd 1:3.0.9-1 (read on a
test node 2026-12-02); the watched files are those of the CIS Debian benchmarks' "identity",
"scope" (sudoers) and sshd rules, as ComplianceAsCode's audit rules write them (read
2026-12-02).

A container shares its host's kernel, which refuses audit requests from it: auditd fails
there (its service restarts until systemd gives up: "Cannot change priority (Operation not
permitted)", measured on a Debian 12 container 2026-12-02). ``SUPPORT_PROBE`` asks the kernel
as auditctl -s does (an AUDIT_GET over a NETLINK_AUDIT socket) before anything is installed.
"""

from __future__ import annotations

RULES_FILE = "/etc/audit/rules.d/50-gpunode.rules"
SERVICE = "auditd"

# (path, key): what is watched for writes and attribute changes, and the key of its events.
WATCHES: tuple[tuple[str, str], ...] = (
    ("/etc/passwd", "gpunode-identity"),
    ("/etc/shadow", "gpunode-identity"),
    ("/etc/group", "gpunode-identity"),
    ("/etc/gshadow", "gpunode-identity"),
    ("/etc/sudoers", "gpunode-sudoers"),
    ("/etc/sudoers.d", "gpunode-sudoers"),
    ("/etc/ssh/sshd_config", "gpunode-sshd"),
    ("/etc/ssh/sshd_config.d", "gpunode-sshd"),
    ("/etc/gpunode", "gpunode-own"),
    ("/etc/systemd/system", "gpunode-own"),
    ("/usr/local/lib/gpunode-probe", "gpunode-own"),
    ("/usr/local/lib/gpunode-audit", "gpunode-own"),
)
KEYS: tuple[str, ...] = tuple(sorted({key for _, key in WATCHES}))

# One line: "allowed", or "refused <ERRNO> <message>". AUDIT_GET is message type 1000
# (linux/audit.h); NETLINK_AUDIT is protocol 9; an NLMSG_ERROR (2) reply carries -errno.
SUPPORT_PROBE = r"""
import errno, os, socket, struct
def refused(code):
    print("refused", errno.errorcode.get(code, str(code)), os.strerror(code))
try:
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 9) as s:
        s.settimeout(5)
        s.bind((0, 0))
        s.send(struct.pack("=LHHLL", 16, 1000, 5, 1, 0))
        reply = s.recv(8192)
        kind = struct.unpack("=H", reply[4:6])[0]
        code = -struct.unpack("=i", reply[16:20])[0] if kind == 2 else 0
        refused(code) if code else print("allowed")
except OSError as error:
    refused(error.errno or 0)
""".strip()


def render_rules() -> str:
    lines = ["# Managed by gpunode (audit.auditd); local edits are replaced."]
    lines += [f"-w {path} -p wa -k {key}" for path, key in WATCHES]
    return "\n".join(lines) + "\n"


def loaded_watch(line: str) -> tuple[str, str] | None:
    """(path, key) of one ``auditctl -l`` line of a watch rule, or None.

    auditctl -l prints a watch as ``-w /etc/passwd -p wa -k gpunode-identity``.
    """
    words = line.split()
    if len(words) >= 6 and words[0] == "-w" and "-k" in words:
        key_at = words.index("-k")
        if key_at + 1 < len(words):
            return words[1], words[key_at + 1]
    return None

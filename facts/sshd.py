"""The SSH server as it really is: effective settings (``sshd -T``), host keys, moduli, units."""

from __future__ import annotations

from typing import Any

from pyinfra.api import FactBase

SECTION = "gpunode:section="
SSHD_CONFIG = "/etc/ssh/sshd_config"
RSA_HOST_KEY = "/etc/ssh/ssh_host_rsa_key"
MODULI = "/etc/ssh/moduli"
# /etc/ssh/moduli's fifth column is the modulus size minus one: 3071 means 3072 bits.
MIN_MODULUS_FIELD = 3071


def parse_sections(lines: list[str]) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        if line.startswith(SECTION):
            current = sections.setdefault(line[len(SECTION) :].strip(), [])
        elif current is not None:
            current.append(line)
    return sections


def parse_effective(lines: list[str]) -> dict[str, list[str]]:
    """``sshd -T`` output -> lower-case keyword -> values (repeatable keywords keep all)."""
    settings: dict[str, list[str]] = {}
    for line in lines:
        keyword, _, value = line.strip().partition(" ")
        if keyword:
            settings.setdefault(keyword.lower(), []).append(value.strip())
    return settings


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
        }
    """

    def command(self) -> str:
        return " ; ".join(
            [
                f"echo {SECTION}effective",
                "/usr/sbin/sshd -T -C user=root,host=localhost,addr=127.0.0.1,lport=22 2>&1"
                " || echo gpunode:sshd-T-failed",
                f"echo {SECTION}config_sha1",
                f"sha1sum {SSHD_CONFIG} 2>/dev/null | cut -d' ' -f1",
                f"echo {SECTION}rsa_bits",
                f"ssh-keygen -l -f {RSA_HOST_KEY}.pub 2>/dev/null | cut -d' ' -f1",
                f"echo {SECTION}weak_moduli",
                f"awk '$5 < {MIN_MODULUS_FIELD}' {MODULI} 2>/dev/null | grep -vc '^#' || true",
                f"echo {SECTION}socket",
                "systemctl is-enabled ssh.socket 2>/dev/null || true",
            ]
        )

    def process(self, output: list[str]) -> dict[str, Any]:
        sections = parse_sections(list(output))
        effective_lines = sections.get("effective", [])
        failed = "gpunode:sshd-T-failed" in effective_lines
        rsa = "".join(sections.get("rsa_bits", [])).strip()
        weak = "".join(sections.get("weak_moduli", [])).strip()
        return {
            "effective": {} if failed else parse_effective(effective_lines),
            "effective_error": " ".join(effective_lines[:-1])[:300] if failed else "",
            "config_sha1": "".join(sections.get("config_sha1", [])).strip() or None,
            "rsa_host_key_bits": int(rsa) if rsa.isdigit() else None,
            "weak_moduli": int(weak) if weak.isdigit() else 0,
            "socket_enabled": "".join(sections.get("socket", [])).strip()
            in ("enabled", "enabled-runtime", "static"),
        }

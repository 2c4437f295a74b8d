"""``gpunode doctor``: what this control host lacks before a first deploy, in the tone of
``brew doctor``: each check one line, each problem with what to do about it.

Checked without an inventory: the Python gpunode was built for, the pyinfra release its
patches were written for, paramiko's post-quantum key exchange (Debian 13's hardened sshd
offers no other kind), the commands on PATH, and whether pyinfra started here reads a
checkout's ``config.py``. With an inventory: that it loads and is valid (else exit status 2,
as every command), the SSH keys it names (present, a private key's mode), and which hosts
answer on their SSH port within a short timeout.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import socket
import stat
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpunode.control.checkout import find_checkout, is_checkout, package_checkout
from gpunode.control.exits import plural
from gpunode.sanitize import clean_text

OK, WARNING, PROBLEM = "ok", "warning", "problem"
# An SSH server sends its identification string first (RFC 4253 section 4.2): at most 255
# bytes, starting "SSH-".
SSH_BANNER_BYTES = 255
DEFAULT_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Check:
    status: str  # OK, WARNING or PROBLEM
    text: str  # what was found and, unless OK, what to do

    def line(self) -> str:
        return f"{self.status:<8} {clean_text(self.text, 500)}"

    def as_dict(self) -> dict[str, str]:
        return {"status": self.status, "text": clean_text(self.text, 500)}


def python_check(version: tuple[int, int, int] | None = None) -> Check:
    """The running Python against the package's Requires-Python (>=3.11)."""
    running = version or sys.version_info[:3]
    shown = ".".join(str(part) for part in running)
    needed = importlib.metadata.metadata("gpunode")["Requires-Python"] or ">=3.11"
    minimum = tuple(int(part) for part in needed.lstrip(">=").split("."))
    if tuple(running[: len(minimum)]) < minimum:
        return Check(PROBLEM, f"Python {shown}: gpunode needs {needed}; make .venv with it")
    return Check(OK, f"Python {shown} ({sys.executable}; gpunode needs {needed})")


def pyinfra_check(installed: str | None = None) -> Check:
    from gpunode import pyinfra_patches

    version = installed or pyinfra_patches.installed_version()
    try:
        pyinfra_patches.require_supported(version)
    except pyinfra_patches.UnsupportedPyinfra as error:
        return Check(PROBLEM, str(error))
    return Check(OK, f"pyinfra {version}, the release gpunode's patches were written for")


def post_quantum_kex_check(paramiko_version: str | None = None) -> Check:
    """paramiko can be given mlkem768x25519-sha256 (gpunode/ssh_kex.py) and cryptography
    computes ML-KEM-768: without both no hardened Debian 13 node can be reached."""
    from gpunode import ssh_kex

    version = paramiko_version or importlib.metadata.version("paramiko")
    if version not in ssh_kex.SUPPORTED_PARAMIKO:
        return Check(
            PROBLEM,
            f"paramiko {version}: gpunode's {ssh_kex.NAME} key exchange was written for "
            f"paramiko {', '.join(ssh_kex.SUPPORTED_PARAMIKO)}; Debian 13 nodes with the "
            "hardened sshd cannot be reached. Reinstall: ./dev setup",
        )
    try:
        from cryptography.hazmat.primitives.asymmetric import mlkem

        mlkem.MLKEM768PrivateKey.generate()
    except Exception as error:  # an OpenSSL without ML-KEM raises UnsupportedAlgorithm
        cryptography = importlib.metadata.version("cryptography")
        return Check(
            PROBLEM,
            f"cryptography {cryptography} cannot compute ML-KEM-768 ({error}): Debian 13 "
            "nodes with the hardened sshd cannot be reached",
        )
    return Check(OK, f"paramiko {version} speaks {ssh_kex.NAME} (Debian 13's hardened sshd)")


def path_check(which: Callable[[str], str | None] = shutil.which) -> Check:
    """gpunode and pyinfra as the README types them: bare names on PATH."""
    missing = [name for name in ("gpunode", "pyinfra") if which(name) is None]
    if missing:
        activate = Path(sys.executable).with_name("activate")
        return Check(
            WARNING,
            f"{' and '.join(missing)} not on PATH: run `. {activate}` (or `./dev shell` in "
            "the checkout) so the README's commands work as written",
        )
    return Check(OK, "gpunode and pyinfra are on PATH")


def working_directory_check(cwd: Path) -> Check:
    if is_checkout(cwd):
        return Check(OK, f"pyinfra started here reads {cwd / 'config.py'}")
    own = package_checkout()
    checkout = own if is_checkout(own) else "<checkout>"
    return Check(
        WARNING,
        f"{cwd} is no gpunode checkout: pyinfra reads config.py from its working directory, "
        f"so from here run it with --chdir {checkout} (gpunode's own commands work anywhere)",
    )


def control_host_checks(cwd: Path) -> list[Check]:
    return [
        python_check(),
        pyinfra_check(),
        post_quantum_kex_check(),
        path_check(),
        working_directory_check(cwd),
    ]


def ssh_key_checks(keys: dict[str, list[str]]) -> list[Check]:
    """Each private key the inventory names (``ssh_key``), with the hosts naming it: there,
    readable, and no one's but its owner's (ssh refuses such a key, gpunode does too)."""
    checks = []
    for key, hosts in sorted(keys.items()):
        who = f"ssh_key of {', '.join(hosts[:3])}{', ...' if len(hosts) > 3 else ''}"
        path = Path(key).expanduser()
        try:
            mode = path.stat().st_mode
        except OSError as error:
            checks.append(Check(PROBLEM, f"{path} ({who}): {error.strerror}"))
            continue
        if not stat.S_ISREG(mode):
            checks.append(Check(PROBLEM, f"{path} ({who}): not a regular file"))
        elif mode & 0o077:
            shown = f"{stat.S_IMODE(mode):04o}"
            fix = f"chmod 600 {path}"
            checks.append(Check(PROBLEM, f"{path} ({who}) may be read by others ({shown}): {fix}"))
        elif not os.access(path, os.R_OK):
            checks.append(Check(PROBLEM, f"{path} ({who}): not readable by this user"))
        else:
            checks.append(Check(OK, f"SSH key {path} ({who}), mode {stat.S_IMODE(mode):04o}"))
    return checks


def ssh_answer(address: str, port: int, timeout_s: float) -> str:
    """The SSH server's identification string at ``address``:``port``, cleaned (a node's
    words); OSError when nothing answers in time or what answers is no SSH server."""
    with socket.create_connection((address, port), timeout=timeout_s) as connection:
        connection.settimeout(timeout_s)
        banner = connection.recv(SSH_BANNER_BYTES)
    text = clean_text(banner.decode("utf-8", "replace").strip(), 120)
    if not text.startswith("SSH-"):
        raise OSError(f"answered, but not as an SSH server: {text!r}")
    return text


def reach_checks(
    hosts: Iterable[tuple[str, str, int]],
    timeout_s: float,
    answer: Callable[[str, int, float], str] = ssh_answer,
) -> list[Check]:
    """Each host (name, address, port) asked in parallel for its SSH banner."""

    def ask(host: tuple[str, str, int]) -> Check:
        name, address, port = host
        where = f"{name} ({address}:{port})"
        try:
            return Check(OK, f"{where} answers: {answer(address, port, timeout_s)}")
        except TimeoutError:
            return Check(PROBLEM, f"{where}: no answer within {timeout_s:g} s")
        except OSError as error:
            return Check(PROBLEM, f"{where}: {error.strerror or error}")

    listed = list(hosts)
    if not listed:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(listed))) as pool:
        return list(pool.map(ask, listed))


def inventory_checks(
    inventory: Any, path: str, timeout_s: float, limit: str | None = None
) -> list[Check]:
    """The checks that need the inventory: its checkout, its keys, its hosts' SSH ports."""
    from gpunode.drift import select_hosts

    checks = [Check(OK, f"{path}: belongs to the checkout {find_checkout(path)}")]
    keys: dict[str, list[str]] = {}
    targets = []
    for host in select_hosts(inventory, limit):
        data = host.data.dict()
        if data.get("ssh_key"):
            keys.setdefault(str(data["ssh_key"]), []).append(host.name)
        if host.name.startswith("@"):
            continue  # @local, @docker/...: no SSH port to ask
        address = str(data.get("ssh_hostname") or host.name)
        targets.append((host.name, address, int(data.get("ssh_port") or 22)))
    return checks + ssh_key_checks(keys) + reach_checks(targets, timeout_s)


def verdict(checks: list[Check]) -> str:
    problems = sum(check.status == PROBLEM for check in checks)
    warnings = sum(check.status == WARNING for check in checks)
    if not problems and not warnings:
        return "Your control host is ready to deploy."
    if not problems:
        return f"{plural(warnings, 'warning')}, no problem: it should work; see above."
    return (
        f"{plural(problems, 'problem')}, {plural(warnings, 'warning')}: a deploy would fail "
        "on what is marked 'problem' above; fix it first."
    )

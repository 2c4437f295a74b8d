"""Node certificate from the control machine's internal CA; the node's key never leaves it.

The key is made on the node (openssl, EC P-256, /etc/gpunode/tls/node.key, 0600 root). At
execution time a control-side callback has the node make a CSR, checks it against the
inventory's names, signs it with the CA and installs node.crt; ca.crt sits beside it. Whether
to (re-)issue is decided from the NodeCertificate fact before anything runs, so ``--dry``
shows exactly the certificates that will be issued.

The CA is never put into the node's system trust store (and is taken out where an earlier
gpunode put it): it carries no name constraints, so trusting it system-wide would let
whoever holds its key impersonate any site to every program on the node. Services that
should trust gpunode's certificates are pointed at /etc/gpunode/tls/ca.crt explicitly.
"""

from __future__ import annotations

import datetime
import logging
import shlex
import sys
from functools import cache
from io import StringIO
from typing import Any

from cryptography.hazmat.primitives import serialization
from pyinfra import host
from pyinfra.api import FunctionCommand, StringCommand, deploy, operation
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS
from pyinfra.facts.files import File, Link
from pyinfra.operations import apt, files

from facts.tls import CA_PATH, CERT_PATH, KEY_PATH, TLS_DIR, NodeCertificate
from gpunode.model import DesiredState, Tls
from gpunode.pki import (
    CertificateAuthority,
    PkiError,
    Usage,
    WantedCertificate,
    certificate_authority,
    reissue_reason,
    sign_csr,
    wanted_certificate,
)

logger = logging.getLogger("pyinfra")

# Where gpunode once put the CA for the system trust store; it is removed from there.
TRUST_PATH = "/usr/local/share/ca-certificates/gpunode-ca.crt"
# update-ca-certificates links each certificate it took in under /etc/ssl/certs.
TRUST_LINK = "/etc/ssl/certs/gpunode-ca.pem"
# --fresh: without it, a removed certificate's links stay behind (dangling) in /etc/ssl/certs.
UNTRUST_COMMAND = f"rm -f {TRUST_PATH} && update-ca-certificates --fresh >/dev/null"
NODE_KEY_CURVE = "P-256"
# What a dry run installs as ca.crt when the CA does not exist yet: never executed, it only
# makes the plan show the CA certificate as a change.
PLANNED_CA_PEM = "# the gpunode CA certificate, created by the first real run\n"


def key_generation_command() -> str:
    """Make node.key on the node, private to root from its first byte (umask 077)."""
    new = f"{KEY_PATH}.new"
    return (
        f"umask 077 && rm -f {new} && "
        f"openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:{NODE_KEY_CURVE} -out {new} "
        f"&& chown root:root {new} && mv -f {new} {KEY_PATH}"
    )


def csr_command(wanted: WantedCertificate) -> str:
    """Print a CSR for node.key with the wanted names (stdout: the CSR only)."""
    return (
        f"openssl req -new -key {KEY_PATH} -subj {shlex.quote('/CN=' + wanted.host_name)} "
        f"-addext {shlex.quote('subjectAltName=' + wanted.subject_alt_names())}"
    )


# openssl verify's -purpose for a certificate's usage (openssl-verification-options(1)).
VERIFY_PURPOSE = {"server": "sslserver", "client": "sslclient"}


def install_certificate_command(
    new_path: str, destination: str = CERT_PATH, usage: Usage = "server"
) -> str:
    """Move an uploaded certificate into place only once it verifies against ca.crt for
    its use (a node certificate to serve, a scraper certificate as a client)."""
    new, final = shlex.quote(new_path), shlex.quote(destination)
    return (
        f"openssl verify -purpose {VERIFY_PURPOSE[usage]} -CAfile {CA_PATH} {new} >/dev/null "
        f"&& chown root:root {new} && chmod 644 {new} && mv -f {new} {final}"
    )


def issue_node_certificate(
    state: Any,
    host: Any,
    wanted: WantedCertificate,
    reason: str,
    authority: CertificateAuthority | None,
    expected_public_key_pem: str | None,
    connector_arguments: dict[str, Any],
    certificate_path: str = CERT_PATH,
) -> bool:
    """Execution-time callback: CSR from the node, checked and signed here, cert installed
    at ``certificate_path``.

    Only the CSR (public) comes here and only the certificate goes back.
    """
    if authority is None:
        host.log_styled("no CA to sign with", fg="red", log_func=logger.error)
        return False
    printing = {"print_output": state.print_output, "print_input": state.print_input}
    made, output = host.run_shell_command(
        StringCommand(csr_command(wanted)), **printing, **connector_arguments
    )
    if not made:
        host.log_styled(
            f"the node could not make a CSR: {output.stderr[:300]}", fg="red", log_func=logger.error
        )
        return False
    expected = expected_public_key_pem.encode() if expected_public_key_pem else None
    try:
        certificate = sign_csr(authority, output.stdout.encode(), wanted, expected)
    except PkiError as error:
        host.log_styled(f"certificate refused: {error}", fg="red", log_func=logger.error)
        return False
    pem = certificate.public_bytes(serialization.Encoding.PEM).decode()
    new_path = f"{certificate_path}.new"
    if not host.put_file(StringIO(pem), new_path, **printing, **connector_arguments):
        return False
    installed, output = host.run_shell_command(
        StringCommand(install_certificate_command(new_path, certificate_path, wanted.usage)),
        **printing,
        **connector_arguments,
    )
    if not installed:
        host.log_styled(
            f"the issued certificate was not installed: {output.stderr[:300]}",
            fg="red",
            log_func=logger.error,
        )
        return False
    host.log(
        f"issued certificate {certificate.serial_number:x} for {wanted.describe()}, valid until "
        f"{certificate.not_valid_after_utc:%Y-%m-%d} ({reason})"
    )
    return True


def _connector_arguments() -> dict[str, Any]:
    """This operation's connector arguments (_sudo...), for the callback's own commands."""
    current = getattr(host, "current_op_global_arguments", None) or {}
    return {key: value for key, value in current.items() if key in CONNECTOR_ARGUMENT_KEYS}


@operation()
def node_certificate(
    wanted: WantedCertificate,
    authority: CertificateAuthority | None,
    now: datetime.datetime | None = None,
):
    """/etc/gpunode/tls/node.crt names ``wanted``, is signed by ``authority`` and belongs to
    node.key, which is made on the node if it has none.

    Issued anew only when missing, unreadable, for other names or another key, from another
    CA, or inside the renewal window.

    + wanted: the names, validity and renewal window the certificate must have
      (``wanted_certificate``: the inventory name plus ``tls.names``/``tls.ip_addresses``)
    + authority: the gpunode CA that signs it; None in a dry run before the CA exists (the
      certificate is then reported as due)
    + now: the time the renewal window is judged at; None: the current time (UTC)
    """
    report = host.get_fact(NodeCertificate)
    yield from certificate_commands(report, wanted, authority, now, make_missing_key=True)


def certificate_commands(
    report: dict[str, Any],
    wanted: WantedCertificate,
    authority: CertificateAuthority | None,
    now: datetime.datetime | None,
    make_missing_key: bool,
    certificate_path: str = CERT_PATH,
    key_will_be_made: bool = False,
):
    """What installs a certificate for ``wanted`` at ``certificate_path`` for node.key, as
    ``report`` (the NodeCertificate fact of that path) shows it: nothing (a noop) when it is
    fine, else node.key made first where it is missing and ``make_missing_key``, and the
    signing callback.

    ``key_will_be_made``: node.key is made anew earlier in this run (roles/tls.py), so the
    certificate is issued after it, for the new key, whatever the report says now.
    """
    ca_certificate = authority.certificate if authority else None
    reason = reissue_reason(
        report, wanted, ca_certificate, now or datetime.datetime.now(datetime.UTC)
    )
    if key_will_be_made:
        reason = "node.key is made in this run"
    if reason is None:
        host.noop(
            f"certificate for {wanted.describe()} valid until {report['not_after'][:10]} "
            f"({report['days_to_expiry']} days)"
        )
        return
    if authority is not None:
        # Now, while the run is still being prepared: a wrong passphrase stops it before
        # any host is changed. Only here, so a run with nothing to sign never decrypts it.
        authority.unlock()
    expected_public_key: str | None = report["public_key_pem"]
    if key_will_be_made or report["key"] in ("absent", "unreadable"):
        if make_missing_key and not key_will_be_made:
            yield key_generation_command()
        expected_public_key = None
    # python.call's own mechanism; yielded from here, only when a re-issue is due, because
    # python.call always counts as a change and a second run must report none.
    yield FunctionCommand(
        issue_node_certificate,
        (),
        {
            "wanted": wanted,
            "reason": reason,
            "authority": authority,
            "expected_public_key_pem": expected_public_key,
            "connector_arguments": _connector_arguments(),
            "certificate_path": certificate_path,
        },
    )


@operation()
def node_key_private():
    """node.key is owned by root and readable by root only (0600).

    A missing key is left to node_certificate, which makes it 0600 from the start; so the
    plan never shows this operation for a key that is about to be made.
    """
    info = host.get_fact(File, path=KEY_PATH)
    if not info:
        host.noop(f"{KEY_PATH} is not there to protect (node_certificate makes it 0600)")
        return
    if (info["mode"], info["user"], info["group"]) == (600, "root", "root"):
        host.noop(f"{KEY_PATH} is 0600 root:root")
        return
    yield f"chown root:root {KEY_PATH} && chmod 600 {KEY_PATH}"


@operation()
def ca_not_system_trusted():
    """The gpunode CA is not in the system trust store: no TRUST_PATH, no TRUST_LINK (an
    earlier gpunode put them there); update-ca-certificates rebuilds the bundle without it."""
    installed = host.get_fact(File, path=TRUST_PATH)
    linked = host.get_fact(Link, path=TRUST_LINK)
    if not installed and not linked:
        host.noop("the gpunode CA is not in the system trust store")
        return
    yield UNTRUST_COMMAND


@cache
def _dry_run() -> bool:
    """Whether the running pyinfra command has --dry (then the CA is never created).

    Deploy files cannot see click's context, so the command line is parsed again with
    pyinfra's own parser, as gpunode.inventory does.
    """
    from pyinfra_cli.cli import cli

    try:
        context = cli.make_context("pyinfra", sys.argv[1:], resilient_parsing=True)
    except Exception:  # an embedding program's argv need not be pyinfra's
        return False
    return bool(context.params.get("dry"))


def certificate_authority_for_run(tls: Tls) -> CertificateAuthority | None:
    """gpunode's CA for this run: created on a real run where it does not exist yet, never
    in a dry run (then None until it exists)."""
    return certificate_authority(tls, create=not _dry_run())


@deploy("TLS")
def tls_certificate(desired: DesiredState) -> None:
    tls = desired.tls
    if not tls.enabled:
        host.noop("tls.enabled is false: no node certificate is managed")
        return
    wanted = wanted_certificate(host.name, tls)
    # Loaded (or created, on a real run) before any host is touched: a missing or short
    # passphrase or half a CA stops the run with nothing changed; a wrong passphrase does
    # where a certificate is due (node_certificate decrypts the key while preparing).
    authority = certificate_authority_for_run(tls)
    ca_pem = authority.certificate_pem if authority else PLANNED_CA_PEM

    apt.packages(name="openssl and ca-certificates", packages=["openssl", "ca-certificates"])
    files.directory(
        name=f"Directory {TLS_DIR}", path=TLS_DIR, mode="755", user="root", group="root"
    )
    files.put(
        name=f"CA certificate {CA_PATH}",
        src=StringIO(ca_pem),
        dest=CA_PATH,
        mode="644",
        user="root",
        group="root",
    )
    node_certificate(name="Node certificate", wanted=wanted, authority=authority)
    node_key_private(name=f"Node key {KEY_PATH} private to root")
    ca_not_system_trusted(name="CA kept out of the system trust store")

"""Debian's prometheus-node-exporter, serving over TLS 1.3 to clients with a gpunode certificate.

Its web configuration file (exporter-toolkit's ``--web.config.file``) allows TLS 1.3 only,
serves the node certificate (roles/tls.py) and requires a client certificate signed by
gpunode's CA (/etc/gpunode/tls/ca.crt) for clientAuth: only a monitoring host's scraper
certificate (``gpunode.pki``, roles/prometheus.py) gets metrics; another node's certificate,
for serving only, is refused. The textfile collector reads ``gpu_metrics.textfile_dir``,
where the GPU probe (roles/gpu_metrics.py) and the drift timer write. The firewall
(roles/firewall.py) opens ``node_exporter.port`` to ``firewall.monitoring_networks`` only.

The node key stays 0600 root:root (roles/tls.py). The exporter runs as Debian's
``prometheus`` user, so it reads a copy: /etc/gpunode/node-exporter/node.key, 0640
root:gpunode-exporters, a system group gpunode makes and adds to the exporter's unit
(``SupplementaryGroups=``, a drop-in), not to the ``prometheus`` account (which a Prometheus
server on the same host would share). A copy rather than a group on node.key itself, which
stays root's alone; rather than systemd's ``LoadCredential=``, which needs a credentials file
system that a node in an unprivileged container cannot mount (systemd 252 then hands the
service a directory it cannot read). The copy is renewed whenever it differs from node.key,
and in the same run as a new key is made.

Everything is in place before the package is installed, so the exporter's first start is
already over mTLS (dpkg keeps the /etc/default file written before it: pyinfra installs with
--force-confold). exporter-toolkit reads the web configuration, certificate and key again
for every new connection: a renewed certificate is served without a restart; a change of the
exporter's arguments or of the drop-in restarts it.

``node_exporter.enabled: false`` leaves an installed exporter as found (the firewall no
longer opens its port).
"""

from __future__ import annotations

import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.files import File, Sha256File
from pyinfra.operations import apt, files, server, systemd

from facts.freshness import UnitOlderThanFile, UnitsNeedDaemonReload
from facts.tls import CA_PATH, CERT_PATH, KEY_PATH, NodeCertificate
from gpunode.expected.exporters import render_web_config as exporter_web_config
from gpunode.model import DesiredState

PACKAGE = "prometheus-node-exporter"
SERVICE = "prometheus-node-exporter.service"
# Holds the exporters allowed to read the node key's copy (their units join it).
GROUP = "gpunode-exporters"
DROP_IN_PATH = f"/etc/systemd/system/{SERVICE}.d/gpunode.conf"
DEFAULTS_PATH = "/etc/default/prometheus-node-exporter"
CONFIG_DIR = "/etc/gpunode/node-exporter"
WEB_CONFIG_PATH = f"{CONFIG_DIR}/web.yml"
KEY_COPY_PATH = f"{CONFIG_DIR}/node.key"
KEY_COPY_MODE = 640


def render_web_config(
    certificate: str = CERT_PATH, key: str = KEY_COPY_PATH, ca: str = CA_PATH
) -> str:
    """exporter-toolkit's web configuration: TLS 1.3 only, client certificates required
    (the text DCGM's exporter gets too). The paths are the node's (tests serve their own)."""
    return exporter_web_config("node_exporter", certificate, key, ca)


def render_drop_in() -> str:
    return (
        "# Managed by gpunode (node_exporter): the exporter may read its copy of the node key.\n"
        f"[Service]\nSupplementaryGroups={GROUP}\n"
    )


def exporter_arguments(
    port: int, textfile_dir: str, web_config: str = WEB_CONFIG_PATH
) -> list[str]:
    return [
        f"--web.listen-address=:{port}",
        f"--web.config.file={web_config}",
        f"--collector.textfile.directory={textfile_dir}",
    ]


def render_defaults(port: int, textfile_dir: str) -> str:
    """/etc/default/prometheus-node-exporter: the ARGS Debian's unit starts it with.

    systemd splits ``$ARGS`` at whitespace and reads the file's quotes itself; the model's
    path pattern admits no whitespace, quote, backslash or ``$`` to split or expand.
    """
    arguments = exporter_arguments(port, textfile_dir)
    for argument in arguments:
        if shlex.quote(argument) != argument:
            raise ValueError(f"{argument!r} cannot be passed through $ARGS unquoted")
    return (
        "# Managed by gpunode (node_exporter, gpu_metrics.textfile_dir); local edits are\n"
        "# replaced on the next run. Read by prometheus-node-exporter.service.\n"
        f'ARGS="{" ".join(arguments)}"\n'
    )


@operation()
def exporter_key(key_will_be_made: bool = False):
    """/etc/gpunode/node-exporter/node.key is node.key's content, 0640 root:gpunode-exporters.

    + key_will_be_made: roles/tls.py makes a new node.key in this run (there is none, or it
      is unreadable), so the copy is renewed after it whatever the facts say now
    """
    source = host.get_fact(Sha256File, path=KEY_PATH)
    copy = host.get_fact(Sha256File, path=KEY_COPY_PATH)
    info = host.get_fact(File, path=KEY_COPY_PATH)
    same = source is not None and copy == source and not key_will_be_made
    owned = False
    if info:
        owned = (info["mode"], info["user"], info["group"]) == (KEY_COPY_MODE, "root", GROUP)
    if same and owned:
        host.noop(f"{KEY_COPY_PATH} is node.key's, 0{KEY_COPY_MODE} root:{GROUP}")
        return
    new = f"{KEY_COPY_PATH}.new"
    # umask 077: the copy is never readable by others, not even before its chmod.
    yield (
        f"umask 077 && rm -f {new} && cp {KEY_PATH} {new} && chown root:{GROUP} {new} && "
        f"chmod 0{KEY_COPY_MODE} {new} && mv -f {new} {KEY_COPY_PATH}"
    )


@deploy("node_exporter")
def node_exporter(desired: DesiredState) -> None:
    wanted = desired.node_exporter
    if not wanted.enabled:
        host.noop("node_exporter.enabled is false: node_exporter left as found")
        return
    textfile_dir = desired.gpu_metrics.textfile_dir
    server.group(name=f"System group {GROUP}", group=GROUP, system=True)
    files.directory(
        name=f"Directory {CONFIG_DIR}", path=CONFIG_DIR, mode="755", user="root", group="root"
    )
    files.directory(name=f"Directory {textfile_dir}", path=textfile_dir, mode="755")
    certificate = host.get_fact(NodeCertificate)
    exporter_key(
        name=f"Node key copy {KEY_COPY_PATH} for the exporters' group",
        key_will_be_made=certificate["key"] in ("absent", "unreadable"),
    )
    files.put(
        name=f"Web configuration {WEB_CONFIG_PATH} (TLS 1.3, client certificates)",
        src=StringIO(render_web_config()),
        dest=WEB_CONFIG_PATH,
        mode="644",
        user="root",
        group="root",
    )
    defaults = files.put(
        name=f"{DEFAULTS_PATH} (port {wanted.port}, web configuration, textfile directory)",
        src=StringIO(render_defaults(wanted.port, textfile_dir)),
        dest=DEFAULTS_PATH,
        mode="644",
        user="root",
        group="root",
    )
    files.directory(
        name=f"Directory {DROP_IN_PATH.rsplit('/', 1)[0]}",
        path=DROP_IN_PATH.rsplit("/", 1)[0],
        mode="755",
    )
    drop_in = files.put(
        name=f"{DROP_IN_PATH} (joins {GROUP})",
        src=StringIO(render_drop_in()),
        dest=DROP_IN_PATH,
        mode="644",
        user="root",
        group="root",
    )
    unloaded = host.get_fact(UnitsNeedDaemonReload, units=[SERVICE])
    systemd.daemon_reload(
        name="Reload systemd after a drop-in change",
        _if=lambda: drop_in.did_change() or unloaded,
    )
    # The -collectors package it recommends adds timers writing textfiles of their own.
    apt.packages(name=PACKAGE, packages=[PACKAGE], no_recommends=True)
    systemd.service(
        name=f"{SERVICE} enabled and running", service=SERVICE, running=True, enabled=True
    )
    # Arguments and groups are read at start only (certificates and web.yml at every
    # connection); or it still runs with an older file: a run cut off before this restart.
    stale = any(
        host.get_fact(UnitOlderThanFile, unit=SERVICE, path=path)
        for path in (DEFAULTS_PATH, DROP_IN_PATH)
    )
    systemd.service(
        name=f"{SERVICE} restarted for its new arguments",
        service=SERVICE,
        restarted=True,
        _if=lambda: defaults.did_change() or drop_in.did_change() or stale,
    )

"""What gpunode's metrics exporters are given on a node: exporter-toolkit's web configuration.

node_exporter (``--web.config.file``) and DCGM's exporter (``--web-config-file``: its flag,
NVIDIA/dcgm-exporter pkg/cmd/app.go ``CLIWebConfigFile``, read 2026-12-02) both serve through
Prometheus' exporter-toolkit, which reads this file (prometheus/exporter-toolkit
docs/web-configuration.md, read 2026-12-02): TLS 1.3 only, the node certificate, and a client
certificate required and verified against gpunode's CA. One text, so the two cannot drift
apart.

Only the monitoring host's scraper is admitted, not any holder of a gpunode certificate: the
verification of a client's chain asks for clientAuth (Go's crypto/tls, golang/go
src/crypto/tls/handshake_server.go, read 2026-12-07), and gpunode's CA issues clientAuth to
scraper certificates alone; a node certificate is for serverAuth only (``gpunode.pki``).
exporter-toolkit's ``client_allowed_sans`` (docs/web-configuration.md, read 2026-12-07) would
name the scrapers too, but Debian 12's exporters predate it: prometheus-node-exporter
1.5.0-1+b6 reads the file strictly and refuses to serve with "field client_allowed_sans not
found in type web.TLSConfig" (tried 2026-12-07), as does promtool 2.42.0's check.
"""

from __future__ import annotations

import re

# Paths reach the file unquoted: absolute, no whitespace, quote, '#' or YAML indicator.
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9._/-]+")


def render_web_config(exporter: str, certificate: str, key: str, ca: str) -> str:
    """The web configuration of ``exporter`` (named in its header comment)."""
    for path in (certificate, key, ca):
        if not _PLAIN_PATH.fullmatch(path):
            raise ValueError(f"{path!r} is not a plain absolute path")
    return (
        f"# Managed by gpunode ({exporter}); local edits are replaced on the next run.\n"
        "# TLS 1.3 only, the node certificate, and a client certificate from gpunode's CA.\n"
        "tls_server_config:\n"
        f"  cert_file: {certificate}\n"
        f"  key_file: {key}\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        f"  client_ca_file: {ca}\n"
        "  min_version: TLS13\n"
        "  max_version: TLS13\n"
    )

"""The monitoring host: Prometheus scraping the inventory's node_exporters over mutual TLS.

    pyinfra inventories/prod.py deploys/monitoring.py --limit monitoring

Runs on the hosts with ``prometheus.enabled`` (every other host is left alone): their
firewall first (roles/firewall.py, where ``firewall.enabled``: Prometheus' port open to
``prometheus.client_networks``, by default ``firewall.admin_networks``, only), their node
certificate (roles/tls.py; it serves Prometheus' web UI, and its key is the one the
scraper's own client certificate is issued for), then Debian's prometheus with the scrape
targets of every host of the inventory whose node_exporter or DCGM exporter is enabled,
gpunode's rules, the scraper certificate and the web configuration that admits
``prometheus.web_user`` alone (roles/prometheus.py).
"""

import sys
from pathlib import Path

# Roles and facts live at the project root; pyinfra only adds the working directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpunode.converge import converging
from roles.audit import file_integrity_takes_this_run
from roles.firewall import firewall
from roles.prometheus import prometheus
from roles.tls import tls_certificate

with converging() as desired:
    if desired.prometheus.enabled:
        firewall(desired=desired)
        tls_certificate(desired=desired)
    prometheus(desired=desired)
    # Last: this run's changes into the file integrity database (where it is on).
    file_integrity_takes_this_run(desired=desired)

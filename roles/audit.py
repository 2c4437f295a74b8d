"""Security audits on a schedule: file integrity with AIDE.

AIDE (Debian's ``aide``) with gpunode's own configuration (gpunode.expected.audit) over the
declared paths; ``file_integrity.py`` (installed beside it) keeps the database and a summary
the drift check reads. The database is built once; a timer checks on the schedule; and the
last step of every run that changed the node takes that run's changes into the database,
so a deploy is never reported as tampering, while what changed before the run started is
classified as a nightly check would (an alert unless a package explains it). A removal
leaves no ctime of its own: the run reads, with its facts, which watched directories had
already changed since the last check, and a removal in one of those is never the run's.

Every deploy ends with ``file_integrity_takes_this_run``: whichever roles it runs, it must
see every operation before it (a change by deploys/tls.py is a gpunode run's as much as one
by deploys/gpu_node.py).
"""

from __future__ import annotations

from collections.abc import Generator
from datetime import datetime
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.server import Date
from pyinfra.operations import files

from facts.audit import DirectoriesChangedSinceCheck, FileIntegrityState
from gpunode import pyinfra_patches
from gpunode.expected import audit as expected
from gpunode.model import DesiredState
from gpunode.probe import file_integrity as file_integrity_program
from roles.packages import install_packages
from roles.scheduled_units import no_scheduled_unit, scheduled_unit


@operation()
def integrity_database_built(initialised: bool) -> Generator[str, None, None]:
    """
    Build AIDE's database of the watched paths, once: later checks compare with it.

    + initialised: whether the node has one (the FileIntegrityState fact)
    """
    if initialised:
        host.noop("AIDE's database exists")
        return
    yield expected.init_command()


@operation()
def integrity_database_takes_this_run(
    run_started: datetime, changed_before_run: list[str] | None
) -> Generator[str, None, None]:
    """
    Take what this run changed on the node into AIDE's database (only when it changed
    something), classifying what changed before the run as a nightly check does.

    + run_started: the node's clock when the run read its facts, before any change
    + changed_before_run: the watched directories changed since the last check, read then
      (None: unknown; then no removal is taken as the run's)
    """
    if not pyinfra_patches.host_changed_in_this_run(host):
        host.noop("nothing else changed on the node in this run")
        return
    yield expected.adopt_command(run_started.timestamp(), changed_before_run)


@deploy("File integrity (AIDE)")
def file_integrity(desired: DesiredState) -> None:
    settings = desired.audit.file_integrity
    if not settings.enabled:
        no_scheduled_unit(expected.UNIT, "file integrity")
        return
    # aide alone: aide-common (recommended) brings Debian's configuration and its daily
    # check of the whole system, which this role does not use.
    install_packages("AIDE", ["aide"], no_recommends=True)
    files.directory(name=f"Directory {expected.PROGRAM_DIR}", path=expected.PROGRAM_DIR,
                    mode="755")  # fmt: skip
    files.put(
        name="file integrity program",
        src=str(Path(file_integrity_program.__file__)),
        dest=expected.PROGRAM,
        mode="644",
    )
    files.directory(name="Directory /etc/gpunode", path="/etc/gpunode", mode="755")
    files.put(
        name="AIDE configuration (watched paths)",
        src=StringIO(expected.render_aide_conf(settings)),
        dest=expected.CONFIG,
        mode="644",
    )
    files.link(
        name=f"{expected.CONFIG_LINK} -> {expected.CONFIG} (where lynis looks for it)",
        path=expected.CONFIG_LINK,
        target=expected.CONFIG,
    )
    files.directory(name=f"Directory {expected.STATE_DIR}", path=expected.STATE_DIR, mode="700")
    scheduled_unit(
        expected.UNIT, expected.render_service(), expected.render_timer(settings.schedule)
    )
    # Last, after every other role of the deploy: a database of the node as this run leaves
    # it (on the first run the node is trusted as it is then), or this run's changes into it.
    _this_run_into_the_database(built=False)


@deploy("File integrity (AIDE)")
def file_integrity_takes_this_run(desired: DesiredState) -> None:
    """The last step of a deploy without the ``file_integrity`` role (deploys/tls.py, ...):
    what this run changed, into AIDE's database, where file integrity is on and the node has
    its database (``file_integrity``, in deploys/gpu_node.py and harden.py, builds it)."""
    if desired.audit.file_integrity.enabled:
        _this_run_into_the_database(built=True)


def _this_run_into_the_database(built: bool) -> None:
    """``built``: only where the node has its database already (nothing installed here)."""
    # Read with the run's other facts, before anything changes the node: the run's start.
    run_started = host.get_fact(Date)
    # A removal leaves only its directory's ctime, which the run's own writes move too.
    changed_before_run = host.get_fact(DirectoriesChangedSinceCheck)
    if not host.get_fact(FileIntegrityState).get("database"):
        if built:
            host.noop("no AIDE database on the node yet (deploys/gpu_node.py builds it)")
            return
        integrity_database_built(name="AIDE database built", initialised=False)
        return
    integrity_database_takes_this_run(
        name="AIDE database takes this run's changes",
        run_started=run_started,
        changed_before_run=changed_before_run,
    )

"""Slurm on a GPU node: Debian's slurmd and munge, the node a dynamic node of the declared
controller, its GRES generated from the GPUs the driver reports.

What is written (gpunode/expected/slurm.py renders it all, the drift check reads the same):

- /etc/munge/munge.key: the cluster's MUNGE key, read on the control machine from
  ``slurm.munge_key_file`` and uploaded from a file object, 0400 munge:munge. It is compared
  by checksum, never shown: no diff (``--diff``), no command line and no log carries it. It
  travels over SFTP into a directory only the login user and root can open (pyinfra uploads
  as the login user, then copies with sudo), then into /etc/munge (0700 munge).
- /etc/slurm/slurm.conf: the cluster's file, from the ``slurm`` settings only (the same on
  every node and on the controller).
- /etc/slurm/gres.conf: one ``Name=gpu Type=... File=/dev/nvidiaN`` line per GPU the node's
  driver reports (type from the product name or ``slurm.gpu_type``, N its minor number).
- /etc/slurm/cgroup.conf: ``ConstrainDevices`` (with ``slurm.cgroup_enforcement``).
- slurmd's drop-in: ``slurmd -Z --conf "Gres=gpu:<type>:<N> Feature=..."``.

The packages are installed before any file: Debian's munge makes a key of its own at
install (replaced here), and Debian's slurmd does not start while there is no slurm.conf,
so it first starts with gpunode's files. slurmd reads them at start only: a change restarts
it (so does a slurmd older than one of its files: a run cut off before its restart).

A node whose GPUs cannot be read (no driver yet, nvidia-smi failing) is left as found: its
GRES would be guessed. ``slurm.enabled: false`` leaves an installed slurmd as found.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from io import BytesIO, StringIO
from typing import Any

from pyinfra import host
from pyinfra.api import OperationError, deploy, operation
from pyinfra.api.command import FileUploadCommand
from pyinfra.facts.files import File, Sha256File
from pyinfra.operations import apt, files, systemd

from facts.freshness import UnitOlderThanFile, UnitsNeedDaemonReload
from facts.gpu import GpuDevices
from gpunode.expected.slurm import (
    CGROUP_CONF,
    CONFIG_DIR,
    GRES_CONF,
    MUNGE_KEY,
    SLURM_CONF,
    SLURMD_DROP_IN,
    SLURMD_SERVICE,
    gres_gpus,
    render_cgroup_conf,
    render_gres_conf,
    render_slurm_conf,
    render_slurmd_drop_in,
)
from gpunode.model import USER_NAME, DesiredState
from gpunode.secret_files import SecretFileError, read_secret_file

PACKAGES = ("munge", "slurmd")
MUNGE_SERVICE = "munge.service"
MUNGE_KEY_MODE = 400
# munged refuses a shorter key (munge 0.5's MUNGE_MINIMUM_SECRET_KEY_LEN).
MIN_MUNGE_KEY_BYTES = 32
MAX_MUNGE_KEY_BYTES = 1 << 16
# Where the key waits between the login user's SFTP upload and root's copy: tmpfs, a
# directory only the login user (and root) may open, removed once the key is in place.
STAGING_DIR = "/run/gpunode-munge"
USER_NAME_PATTERN = re.compile(USER_NAME)


def read_munge_key(path: str) -> bytes:
    """The key file's bytes; an error names the file and why, never its content. A key the
    group or others may read is refused, as the CA's key is (gpunode.secret_files)."""
    try:
        key = read_secret_file(path, "slurm.munge_key_file", MAX_MUNGE_KEY_BYTES)
    except SecretFileError as error:
        raise OperationError(str(error)) from None
    if not MIN_MUNGE_KEY_BYTES <= len(key) <= MAX_MUNGE_KEY_BYTES:
        raise OperationError(
            f"slurm.munge_key_file {path}: {len(key)} bytes; munged needs "
            f"{MIN_MUNGE_KEY_BYTES} to {MAX_MUNGE_KEY_BYTES}"
        )
    return key


@operation()
def munge_key(key_file: str, login_user: str = "root"):
    """
    /etc/munge/munge.key holds the cluster's key, 0400 munge:munge.

    + key_file: the key on the control machine (compared by SHA-256, never shown)
    + login_user: the SSH user pyinfra uploads as (it alone may open the staging directory)
    """
    key = read_munge_key(key_file)
    wanted = hashlib.sha256(key).hexdigest()
    current = host.get_fact(Sha256File, path=MUNGE_KEY)
    info = host.get_fact(File, path=MUNGE_KEY)
    owned = False
    if info:
        owned = (info["mode"], info["user"], info["group"]) == (MUNGE_KEY_MODE, "munge", "munge")
    if current == wanted and owned:
        host.noop(f"{MUNGE_KEY} is the cluster's key, 0{MUNGE_KEY_MODE} munge:munge")
        return
    if not USER_NAME_PATTERN.fullmatch(login_user):
        raise OperationError(f"login user {login_user!r} is not a user name")
    new = f"{MUNGE_KEY}.gpunode-new"
    yield f"rm -rf {STAGING_DIR} && install -d -m 0700 -o {shlex.quote(login_user)} {STAGING_DIR}"
    yield FileUploadCommand(BytesIO(key), new, remote_temp_filename=f"{STAGING_DIR}/key")
    yield (
        f"chown munge:munge {new} && chmod 0{MUNGE_KEY_MODE} {new} && mv -f {new} {MUNGE_KEY}"
        f" && rm -rf {STAGING_DIR}"
    )


def _login_user() -> str:
    user = host.data.get("ssh_user")
    return str(user) if user else "root"


def _put(name: str, text: str, dest: str) -> Any:
    return files.put(
        name=name, src=StringIO(text), dest=dest, mode="644", user="root", group="root"
    )


@deploy("slurm")
def slurm(desired: DesiredState) -> None:
    wanted = desired.slurm
    if not wanted.enabled:
        host.noop("slurm.enabled is false: slurmd left as found")
        return
    report: dict[str, Any] = host.get_fact(GpuDevices)
    if report.get("state") != "ok":
        host.noop(
            f"GPUs unreadable ({report.get('state')}: {report.get('reason') or 'no reason'}): "
            "slurmd left as found, its GRES would be guessed"
        )
        return
    gres, problems = gres_gpus(report.get("gpus") or [], wanted.gpu_type)
    for problem in problems:
        host.noop(f"left out of gres.conf: {problem}")
    assert wanted.munge_key_file is not None  # the model requires it when enabled
    apt.packages(name="slurmd and munge", packages=list(PACKAGES), no_recommends=True)
    key = munge_key(
        name=f"MUNGE key {MUNGE_KEY} (the cluster's, 0400 munge:munge)",
        key_file=wanted.munge_key_file,
        login_user=_login_user(),
    )
    # munged reads its key at start only; or it still runs with an older one (a cut-off run).
    munge_stale = host.get_fact(UnitOlderThanFile, unit=MUNGE_SERVICE, path=MUNGE_KEY)
    systemd.service(
        name=f"{MUNGE_SERVICE} enabled and running", service=MUNGE_SERVICE, running=True,
        enabled=True,
    )  # fmt: skip
    systemd.service(
        name=f"{MUNGE_SERVICE} restarted for the cluster's key",
        service=MUNGE_SERVICE,
        restarted=True,
        _if=lambda: key.did_change() or munge_stale,
    )
    files.directory(name=f"Directory {CONFIG_DIR}", path=CONFIG_DIR, mode="755")
    changed = [
        _put(
            f"{SLURM_CONF} (cluster {wanted.cluster_name})", render_slurm_conf(wanted), SLURM_CONF
        ),
        _put(f"{GRES_CONF} (one line per GPU of the node)", render_gres_conf(gres), GRES_CONF),
        _put(f"{CGROUP_CONF} (ConstrainDevices)", render_cgroup_conf(wanted), CGROUP_CONF),
    ]
    drop_in_dir = SLURMD_DROP_IN.rsplit("/", 1)[0]
    files.directory(name=f"Directory {drop_in_dir}", path=drop_in_dir, mode="755")
    drop_in = _put(
        f"{SLURMD_DROP_IN} (a dynamic node with the GRES of its GPUs)",
        render_slurmd_drop_in(wanted, gres),
        SLURMD_DROP_IN,
    )
    unloaded = host.get_fact(UnitsNeedDaemonReload, units=[SLURMD_SERVICE])
    systemd.daemon_reload(
        name="Reload systemd after a drop-in change",
        _if=lambda: drop_in.did_change() or unloaded,
    )
    systemd.service(
        name=f"{SLURMD_SERVICE} enabled and running", service=SLURMD_SERVICE, running=True,
        enabled=True,
    )  # fmt: skip
    stale = any(
        host.get_fact(UnitOlderThanFile, unit=SLURMD_SERVICE, path=path)
        for path in (SLURM_CONF, GRES_CONF, CGROUP_CONF, SLURMD_DROP_IN)
    )
    systemd.service(
        name=f"{SLURMD_SERVICE} restarted for its new configuration",
        service=SLURMD_SERVICE,
        restarted=True,
        _if=lambda: any(op.did_change() for op in [*changed, drop_in]) or stale,
    )

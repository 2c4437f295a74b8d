"""Install the nightly drift check on the control host (a systemd service and timer).

    pyinfra @local deploys/drift_timer.py --data x_drift_inventory=inventories/prod.py \
        --data x_drift_ssh_key=~/.ssh/gpunode_drift

It runs `gpunode drift` against the inventory every night, keeps the JSON report (and uses
yesterday's as the baseline, so new findings stand out), writes a JUnit file for CI
dashboards and a Prometheus textfile for node_exporter. Data (all optional but the first):
x_drift_inventory (a path inside this checkout), x_drift_schedule (systemd OnCalendar,
default 05:30 daily), x_drift_output_dir (default /var/lib/gpunode/drift), x_drift_textfile
(default /var/lib/prometheus/node-exporter/gpunode_drift.prom; in node_exporter's textfile
directory or under one of gpunode's, gpunode.expected.timers), x_drift_ssh_key (the
private key the check logs in to the nodes with; best one of its own) and
x_drift_known_hosts (the nodes' host keys, default ~/.ssh/known_hosts): both are files on
the machine that runs this deploy, copied to the control host. x_drift_drain: 'critical' runs
the check with --drain critical (scheduler nodes with critical findings drained, those it
drained resumed once clean), default 'off'; x_drift_scheduler_ssh: the [user@]host it reaches
Slurm's commands on then (over SSH with the check's key and known_hosts, sudo -n there),
default this host (the drift user must then be allowed to drain).

The check never runs as root. It runs as the system user gpunode-drift (no password, no
login shell, home /var/lib/gpunode-drift, which it cannot write), in a systemd sandbox: no
new privileges and no capabilities, the whole file system read-only but for the output
directory and the textfile's directory, the home directories hidden (the checkout and its
Python are mounted back read-only when they live there), a private /tmp, no devices, no
kernel tunables, modules, logs or clock, a system-call allow-list, umask 0077, and a memory
ceiling (MemoryMax, gpunode.expected.timers.DRIFT_MEMORY_MAX_MIB).

What it reads and how: the checkout (venv, inventory) like any other user, so it must be
readable by others (a checkout made with the usual umask 022 is; the deploy refuses one
that is not) and gpunode-drift owns nothing in it. The SSH key and known_hosts are copied
to ~gpunode-drift/.ssh/ as root's files, group gpunode-drift, mode 0640, beside an SSH
config that points at them: gpunode-drift can read them and change none of them. An
inventory that sets ``ssh_key`` or ``ssh_known_hosts_file`` itself overrides that config,
and its paths must then be readable by gpunode-drift.
"""

import posixpath
import re
import shlex
import sys
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import DeployError
from pyinfra.operations import files, server, systemd

from facts.kernel import FileModes
from gpunode.expected.timers import (
    DRIFT_MEMORY_MAX_MIB,
    drift_output_dir_problem,
    drift_textfile_problem,
)
from gpunode.secret_files import SecretFileError, read_secret_file

PROJECT = Path(__file__).resolve().parents[1]
UNIT = "gpunode-drift"
DRIFT_USER = "gpunode-drift"
DRIFT_HOME = "/var/lib/gpunode-drift"
DRIFT_SSH_DIR = f"{DRIFT_HOME}/.ssh"
# Where the home directories are that ProtectHome=tmpfs hides.
HOME_ROOTS = ("/home", "/root", "/run/user")
# Where PrivateTmp=yes gives the check a /tmp of its own: a checkout there is out of its sight.
PRIVATE_TMP_ROOTS = ("/tmp", "/var/tmp")
# Where the check may write: its output directory and the textfile's directory.
WRITABLE_ROOTS = ("/var/lib/", "/var/cache/", "/srv/")

# Every path that reaches the unit file: no spaces, quotes, `$` or `%` (systemd expands
# those even inside quotes), no control characters.
PATH = re.compile(r"/[A-Za-z0-9_.@+/-]*")
INVENTORY = re.compile(r"[A-Za-z0-9_.-][A-Za-z0-9_./-]*\.py")
CALENDAR = re.compile(r"[A-Za-z0-9*:,./~ -]{1,64}")
# Where the check reaches Slurm's commands with --drain (an SSH destination, never an option).
SSH_DESTINATION = re.compile(r"([a-z_][a-z0-9_-]{0,31}@)?[A-Za-z0-9][A-Za-z0-9.-]{0,252}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _refuse(setting: str, value: object, why: str) -> DeployError:
    return DeployError(f"{setting} = {value!r}: {why}")


def checked_path(setting: str, value: object) -> str:
    """An absolute, normalised path made of plain characters."""
    if not isinstance(value, str) or not PATH.fullmatch(value):
        raise _refuse(setting, value, "not an absolute path of letters, digits and _.@+/-")
    if posixpath.normpath(value) != value:
        raise _refuse(setting, value, f"not normalised (write {posixpath.normpath(value)})")
    return value


def writable_path(setting: str, value: object) -> str:
    path = checked_path(setting, value)
    if not path.startswith(WRITABLE_ROOTS) or path.rstrip("/") + "/" in WRITABLE_ROOTS:
        raise _refuse(setting, value, "must lie under " + ", ".join(WRITABLE_ROOTS))
    return path


def under_home(path: str) -> bool:
    return any(path == root or path.startswith(root + "/") for root in HOME_ROOTS)


def local_file(setting: str, value: object) -> Path | None:
    """A file on the machine running this deploy, to be copied to the control host."""
    if value is None:
        return None
    if not isinstance(value, str) or _CONTROL.search(value):
        raise _refuse(setting, value, "not a file name")
    path = Path(value).expanduser()
    if not path.is_file():
        raise _refuse(setting, value, "no such file here")
    return path


inventory = host.data.get("x_drift_inventory")
if not inventory:
    raise DeployError("x_drift_inventory is not set: --data x_drift_inventory=inventories/prod.py")
if (
    not isinstance(inventory, str)
    or not INVENTORY.fullmatch(inventory)
    or posixpath.normpath(inventory) != inventory
    or inventory.startswith("../")
):
    raise _refuse("x_drift_inventory", inventory, "not a normalised .py path inside the checkout")
if not (PROJECT / inventory).is_file():
    raise DeployError(f"x_drift_inventory = {inventory!r}: no such file under {PROJECT}")
schedule = host.data.get("x_drift_schedule", "*-*-* 05:30:00")
if not isinstance(schedule, str) or not CALENDAR.fullmatch(schedule):
    raise _refuse("x_drift_schedule", schedule, "not a systemd OnCalendar expression")
output_dir = writable_path(
    "x_drift_output_dir", host.data.get("x_drift_output_dir", "/var/lib/gpunode/drift")
)
if output_dir_problem := drift_output_dir_problem(output_dir, DRIFT_USER):
    raise _refuse("x_drift_output_dir", output_dir, output_dir_problem)
textfile = writable_path(
    "x_drift_textfile",
    host.data.get("x_drift_textfile", "/var/lib/prometheus/node-exporter/gpunode_drift.prom"),
)
if not textfile.endswith(".prom"):
    raise _refuse("x_drift_textfile", textfile, "node_exporter reads only *.prom files")
if textfile_problem := drift_textfile_problem(textfile, DRIFT_USER):
    raise _refuse("x_drift_textfile", textfile, textfile_problem)
textfile_dir = posixpath.dirname(textfile)
# Health-driven drain (gpunode drift --drain critical), off unless the data turns it on.
drain = host.data.get("x_drift_drain", "off")
if drain not in ("off", "critical"):
    raise _refuse("x_drift_drain", drain, "not 'off' or 'critical'")
scheduler_ssh = host.data.get("x_drift_scheduler_ssh")
if scheduler_ssh is not None and (
    not isinstance(scheduler_ssh, str) or not SSH_DESTINATION.fullmatch(scheduler_ssh)
):
    raise _refuse("x_drift_scheduler_ssh", scheduler_ssh, "not a [user@]host to reach Slurm on")
if scheduler_ssh is not None and drain == "off":
    raise _refuse("x_drift_scheduler_ssh", scheduler_ssh, "given, but x_drift_drain is 'off'")
drain_arguments = (
    ["--drain", drain, *(["--scheduler-ssh", scheduler_ssh] if scheduler_ssh else [])]
    if drain != "off"
    else []
)


ssh_key = local_file("x_drift_ssh_key", host.data.get("x_drift_ssh_key"))
if ssh_key is not None:  # a private key: refused when others may read it, as the CA's is
    try:
        read_secret_file(str(ssh_key), "x_drift_ssh_key", 1 << 16)
    except SecretFileError as error:
        raise DeployError(str(error)) from None
known_hosts = local_file(
    "x_drift_known_hosts", host.data.get("x_drift_known_hosts", "~/.ssh/known_hosts")
)
project = checked_path("the checkout's path", str(PROJECT))
gpunode = checked_path("the gpunode command's path", str(Path(sys.executable).with_name("gpunode")))
python_prefix = checked_path("the Python installation's path", sys.base_prefix)
for what, path in (("checkout", project), ("Python installation", python_prefix)):
    if any(path == root or path.startswith(root + "/") for root in PRIVATE_TMP_ROOTS):
        raise DeployError(
            f"the {what} lives in {path}, under a temporary directory the sandboxed check "
            "gets a private copy of (PrivateTmp): move it to a lasting place such as /opt or /srv"
        )


def _chain(path: str, top: str) -> list[str]:
    """``path`` and every directory above it, up to and including ``top``."""
    chain = [path]
    while path != top and path != "/":
        path = posixpath.dirname(path)
        chain.append(path)
    return chain


# What gpunode-drift must be able to read, as "others" (it owns nothing there): from the
# sandbox's root down, or from the checkout down where the sandbox mounts it back.
readable_top = project if under_home(project) else "/"
inventory_path = posixpath.join(project, inventory)
needed = {
    inventory_path: 0o004,
    gpunode: 0o005,
    **{directory: 0o001 for directory in _chain(posixpath.dirname(inventory_path), readable_top)},
    **{directory: 0o001 for directory in _chain(posixpath.dirname(gpunode), readable_top)},
}
modes = host.get_fact(FileModes, paths=sorted(needed))
for path, bits in sorted(needed.items()):
    if path not in modes:
        raise DeployError(f"{path} does not exist on {host.name}; the drift check runs it")
    if modes[path]["mode"] & bits != bits:
        raise DeployError(
            f"{path} (mode {modes[path]['mode']:o}) is not readable by {DRIFT_USER}: the check "
            f"reads the checkout as any user does; chmod o+rX it (never make it writable)"
        )

latest = f"{output_dir}/latest.json"
command = " ".join(
    shlex.quote(part)
    for part in [
        gpunode, "drift", inventory, "--baseline", latest, "--write-baseline", latest,
        "--junit", f"{output_dir}/latest.xml", "--prometheus", textfile, *drain_arguments,
    ]
)  # fmt: skip
# The checkout and its Python are read where they are; home directories are hidden, so
# one that lives there is mounted back, read-only ("-": a path that is not there is skipped).
bind_read_only = " ".join(f"-{path}" for path in (project, python_prefix) if under_home(path))
ssh_config = f"""# Managed by gpunode (deploys/drift_timer.py): how the drift check logs in.
Host *
    StrictHostKeyChecking yes
    UserKnownHostsFile {DRIFT_SSH_DIR}/known_hosts
""" + (f"    IdentityFile {DRIFT_SSH_DIR}/id_drift\n" if ssh_key is not None else "")

service = f"""[Unit]
Description=gpunode nightly drift check ({inventory})
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
User={DRIFT_USER}
Group={DRIFT_USER}
WorkingDirectory={project}
ExecStart={command}
# 1 means drift was found and reported: the check itself worked.
SuccessExitStatus=1
UMask=0077
NoNewPrivileges=yes
CapabilityBoundingSet=
AmbientCapabilities=
ProtectSystem=strict
ReadWritePaths={output_dir} {textfile_dir}
ProtectHome=tmpfs
{f"BindReadOnlyPaths={bind_read_only}" if bind_read_only else ""}
PrivateTmp=yes
PrivateDevices=yes
DevicePolicy=closed
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
ProcSubset=pid
RestrictSUIDSGID=yes
RestrictRealtime=yes
RestrictNamespaces=yes
LockPersonality=yes
MemoryDenyWriteExecute=yes
RemoveIPC=yes
KeyringMode=private
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallFilter=~@privileged @resources
SystemCallErrorNumber=EPERM
# Each host's answer is read up to a cap (gpunode.drift.gather.HOST_LIMITS): 64 hosts at once
# fit this; a check that grew past it is stopped here, not by the control host's OOM killer.
MemoryMax={DRIFT_MEMORY_MAX_MIB}M
"""
timer = f"""[Unit]
Description=Run the gpunode drift check nightly

[Timer]
OnCalendar={schedule}
RandomizedDelaySec=10min
Persistent=true

[Install]
WantedBy=timers.target
"""

server.group(name=f"Group {DRIFT_USER}", group=DRIFT_USER, system=True)
server.user(
    name=f"User {DRIFT_USER} (no password, no login shell)",
    user=DRIFT_USER,
    group=DRIFT_USER,
    system=True,
    shell="/usr/sbin/nologin",
    home=DRIFT_HOME,
    ensure_home=False,
    comment="gpunode nightly drift check",
)
# Its home, SSH config, key and known_hosts are root's: gpunode-drift reads them (group),
# never changes them.
for directory in (DRIFT_HOME, DRIFT_SSH_DIR):
    files.directory(
        name=f"Directory {directory}", path=directory, user="root", group=DRIFT_USER, mode="750"
    )
for name, source in (
    ("config", StringIO(ssh_config)),
    ("known_hosts", known_hosts),
    ("id_drift", ssh_key),
):
    if source is not None:
        files.put(
            name=f"{DRIFT_SSH_DIR}/{name}",
            src=source if isinstance(source, StringIO) else str(source),
            dest=f"{DRIFT_SSH_DIR}/{name}",
            user="root",
            group=DRIFT_USER,
            mode="640",
        )
files.directory(
    name=f"Directory {output_dir}", path=output_dir, user=DRIFT_USER, group=DRIFT_USER, mode="750"
)
# node_exporter's textfile directory: gpunode-drift may add its file there.
files.directory(name=f"Directory {textfile_dir}", path=textfile_dir, group=DRIFT_USER, mode="775")
service_op = files.put(
    name=f"{UNIT}.service", src=StringIO(service), dest=f"/etc/systemd/system/{UNIT}.service"
)
timer_op = files.put(
    name=f"{UNIT}.timer", src=StringIO(timer), dest=f"/etc/systemd/system/{UNIT}.timer"
)
systemd.daemon_reload(
    name="Reload systemd after a unit change",
    _if=lambda: service_op.did_change() or timer_op.did_change(),
)
systemd.service(name=f"{UNIT}.timer enabled", service=f"{UNIT}.timer", running=True, enabled=True)

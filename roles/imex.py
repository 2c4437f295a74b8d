"""NVIDIA IMEX on multi-node NVLink systems (GB200/GB300 NVL72 compute trays).

What results where ``DesiredState.needs_imex`` (``imex.mode: always``, or ``auto`` with a
GB200/GB300 ``expected_hardware.gpu_model``; validation requires the ``nvidia`` driver source
and ``imex.nodes``):

* ``nvidia-imex`` (``nvidia-imex-<branch>`` up to 575) installed at exactly the driver's
  version and held, like Fabric Manager: IMEX is part of the driver release.
* ``/etc/nvidia-imex/nodes_config.cfg`` lists ``imex.nodes``, one address a line: every node of
  the NVLink domain, the same file on each.
* IMEX channels: the driver does not create them and they do not survive a reboot (NVIDIA IMEX
  guide, "IMEX Channels"), so ``gpunode-imex-channels.service`` creates ``imex.channels`` of
  them under ``/dev/nvidia-caps-imex-channels`` at every boot, before ``nvidia-imex``, from the
  major number the driver registers in ``/proc/devices``.
* Both services enabled; started once the loaded driver is IMEX's version (until then, a
  pending reboot is reported).

Where IMEX is not needed nothing is installed; an installed IMEX is left as found (removing it
from a rack that uses it would stop its jobs' memory sharing).
"""

from __future__ import annotations

import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus
from pyinfra.operations import files

from facts.nvidia_packages import NvidiaPackages
from gpunode.expected.packages import imex_packages
from gpunode.model import DesiredState, upstream_version
from gpunode.nvidia_releases import IMEX_CHANNEL_DIR, IMEX_NODES_CONFIG
from roles.fabric_manager import INSTALLED_DRIVER_VERSION, loaded_after_driver
from roles.nvidia_driver import APT_INSTALL, driver_reboots_in_this_run, installed_driver_version

IMEX_SERVICE = "nvidia-imex.service"
CHANNELS_SERVICE = "gpunode-imex-channels.service"
CHANNELS_UNIT_PATH = f"/etc/systemd/system/{CHANNELS_SERVICE}"
CHANNELS_SCRIPT_PATH = "/usr/local/sbin/gpunode-imex-channels"
CHANNELS_SCRIPT = f"""#!/bin/sh
# Managed by gpunode (imex): creates IMEX channels 0..N-1, which the NVIDIA driver neither
# creates nor keeps across a reboot.
set -eu
count=$1
major=$(awk '$2 == "nvidia-caps-imex-channels" {{print $1}}' /proc/devices)
if [ -z "$major" ]; then
    echo "nvidia-caps-imex-channels is not in /proc/devices: is the NVIDIA driver loaded?" >&2
    exit 1
fi
mkdir -p {IMEX_CHANNEL_DIR}
i=0
while [ "$i" -lt "$count" ]; do
    channel="{IMEX_CHANNEL_DIR}/channel$i"
    [ -e "$channel" ] || mknod -m 0666 "$channel" c "$major" "$i"
    i=$((i + 1))
done
"""


def render_channels_unit(channels: int) -> str:
    return (
        "# Managed by gpunode (imex).\n"
        "[Unit]\n"
        "Description=IMEX channels for nvidia-imex (gpunode)\n"
        "After=systemd-modules-load.service\n"
        f"Before={IMEX_SERVICE}\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        f"ExecStart={CHANNELS_SCRIPT_PATH} {int(channels)}\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def render_nodes_config(nodes: tuple[str, ...]) -> str:
    # IMEX reads one address a line; nothing else goes in the file.
    return "".join(f"{node}\n" for node in nodes)


@operation()
def imex_package(branch: str, version: str | None = None):
    """``branch``'s IMEX package is installed at exactly ``version`` (None: the installed
    driver's) and held.

    + branch: the driver branch (``nvidia_driver.branch``)
    + version: the exact apt version (``nvidia_driver.version``); None: the installed driver's
    """
    facts = host.get_fact(NvidiaPackages)
    packages: dict[str, str] = facts["packages"]
    held = set(facts["held"])
    names = imex_packages(branch)
    version = version or installed_driver_version(packages)
    if version and all(packages.get(name) == version and name in held for name in names):
        host.noop(f"{' '.join(names)} {version} installed and held")
        return
    words = " ".join(shlex.quote(name) for name in names)
    if held & set(names):
        yield f"apt-mark unhold {' '.join(sorted(held & set(names)))}"
    wanted = shlex.quote(version) if version else INSTALLED_DRIVER_VERSION
    yield f"{APT_INSTALL} " + " ".join(f"{shlex.quote(name)}={wanted}" for name in names)
    yield f"apt-mark hold {words}"


@operation()
def imex_services(
    branch: str, daemon_reload: bool = False, driver_reboots: bool = False,
    driver_version: str | None = None,
):  # fmt: skip
    """The channel service and nvidia-imex are enabled, and running while the loaded driver is
    IMEX's version; otherwise a pending reboot is reported.

    + branch: the driver branch whose IMEX package provides nvidia-imex
    + daemon_reload: the channel unit changed in this run: systemd reads it again first
    + driver_reboots: the driver role reboots into ``driver_version`` if needed
    + driver_version: the driver's declared apt version (``nvidia_driver.version``), or None
    """
    units = [CHANNELS_SERVICE, IMEX_SERVICE]
    if daemon_reload:
        yield "systemctl daemon-reload"
    enabled = host.get_fact(SystemdEnabled, services=units)
    running = host.get_fact(SystemdStatus, services=units)
    disabled = [unit for unit in units if not enabled.get(unit)]
    if disabled:
        yield f"systemctl enable {' '.join(disabled)}"
    facts = host.get_fact(NvidiaPackages)
    installed = facts["packages"].get(imex_packages(branch)[0])
    loaded = loaded_after_driver(facts, driver_reboots, driver_version)
    expected = upstream_version(driver_version) if driver_version else None
    version = upstream_version(installed) if installed else expected
    if version is None or loaded != version:
        host.noop(
            f"nvidia-imex not started: pending a reboot into driver {version or 'of its branch'}"
            f" (loaded: {loaded or 'none'})"
        )
        return
    stopped = [unit for unit in units if not running.get(unit)]
    if stopped:
        yield f"systemctl start {' '.join(stopped)}"
    elif not disabled:
        host.noop("IMEX channels created and nvidia-imex running")


@deploy("NVIDIA IMEX")
def imex(desired: DesiredState) -> None:
    if not desired.needs_imex:
        host.noop("IMEX not needed here (imex.mode, expected_hardware.gpu_model): left as found")
        return
    driver = desired.nvidia_driver
    branch = str(driver.branch)
    imex_package(
        name="nvidia-imex at the driver's version, held", branch=branch, version=driver.version
    )
    files.put(
        name=f"IMEX domain nodes in {IMEX_NODES_CONFIG}",
        src=StringIO(render_nodes_config(desired.imex.nodes)),
        dest=IMEX_NODES_CONFIG,
        mode="644",
    )
    script = files.put(
        name=f"IMEX channel script {CHANNELS_SCRIPT_PATH}",
        src=StringIO(CHANNELS_SCRIPT),
        dest=CHANNELS_SCRIPT_PATH,
        mode="755",
    )
    unit = files.put(
        name=f"{CHANNELS_SERVICE}: {desired.imex.channels} channel(s) at boot",
        src=StringIO(render_channels_unit(desired.imex.channels)),
        dest=CHANNELS_UNIT_PATH,
        mode="644",
    )
    imex_services(
        name="IMEX channels and nvidia-imex enabled, running with their driver",
        branch=branch,
        daemon_reload=unit.will_change or script.will_change,
        driver_reboots=driver_reboots_in_this_run(driver.reboot),
        driver_version=driver.version,
    )

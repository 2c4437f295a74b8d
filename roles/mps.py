"""The CUDA Multi-Process Service control daemon as a systemd service (``mps``).

What results where ``mps.enabled``:

* ``gpunode-mps.service`` (``gpunode.expected.mps.render_unit``): ``nvidia-cuda-mps-control
  -d`` with ``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY``, ``CUDA_VISIBLE_DEVICES``
  (``mps.gpus``), ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` in its environment, stopped with ``echo quit``;
  enabled and running. A changed unit restarts the daemon (its environment is read at start).
* The served GPUs' compute mode is EXCLUSIVE_PROCESS: set by ``roles.gpu_settings`` (the one
  owner of compute mode, run before this role), applied again at every boot by its unit.

The control binary ships with the driver (Debian's ``nvidia-cuda-mps``, Ubuntu's
``nvidia-compute-utils-<branch>``); this role installs no package: where the binary is
missing the node is refused, naming the package, and nothing is changed.

Where ``mps.enabled`` is false, a unit gpunode installed earlier is stopped, disabled and
removed (jobs then open the GPUs directly); the compute mode is left as found.
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.files import File
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus
from pyinfra.operations import files

from facts.mps import MpsState
from gpunode.expected import mps as expected
from gpunode.model import DesiredState
from gpunode.refusal import NodeRefused


@operation()
def mps_service(restart: bool = False, start: bool = True):
    """gpunode-mps.service is enabled and running; restarted when its unit changed.

    + restart: the unit changed in this run: systemd reads it again and the daemon restarts
    + start: the control binary is there; False: enabled only (the driver is installed in
      this run, and the next boot or run starts the daemon)
    """
    unit = expected.UNIT
    if restart:
        yield "systemctl daemon-reload"
    enabled = host.get_fact(SystemdEnabled, services=[unit]).get(unit)
    running = host.get_fact(SystemdStatus, services=[unit]).get(unit)
    if not enabled:
        yield f"systemctl enable {unit}"
    if not start:
        host.noop(f"{unit} not started: {expected.CONTROL} comes with the driver of this run")
        return
    if restart and running:
        yield f"systemctl restart {unit}"
    elif not running:
        yield f"systemctl start {unit}"
    elif enabled:
        host.noop(f"{unit} enabled and running")


@operation()
def mps_removed():
    """gpunode's MPS unit is gone: stopped, disabled, its file removed."""
    unit = expected.UNIT
    if not host.get_fact(File, path=expected.UNIT_PATH):
        host.noop(f"no {unit}: MPS is not run here")
        return
    yield f"systemctl disable --now {unit}"
    yield f"rm -f {expected.UNIT_PATH}"
    yield "systemctl daemon-reload"


@deploy("CUDA MPS")
def mps(desired: DesiredState) -> None:
    if not desired.mps.enabled:
        mps_removed(name="MPS not declared: gpunode's MPS daemon removed")
        return
    state = host.get_fact(MpsState)
    # A node whose driver is installed (nvidia-smi answers) but has no control binary lacks
    # the MPS package; a node without the driver yet gets it in this run.
    if not state["control_installed"] and state["nvidia_smi"]:
        source = desired.nvidia_driver.source
        package = expected.PACKAGE_BY_SOURCE.get(source, "the driver's MPS package")
        raise NodeRefused(
            f"mps.enabled: {expected.CONTROL} is not installed (it ships in {package} with "
            "the driver); install it, or set mps.enabled: false"
        )
    unit = files.put(
        name=f"{expected.UNIT}: the MPS control daemon",
        src=StringIO(expected.render_unit(desired)),
        dest=expected.UNIT_PATH,
        mode="644",
        user="root",
        group="root",
    )
    mps_service(
        name=f"{expected.UNIT} enabled and running",
        restart=unit.will_change,
        start=bool(state["control_installed"]),
    )

"""What ``mps`` means on a node: the MPS control daemon's systemd unit and its environment.

NVIDIA's multi-user MPS setup (MPS guide, "Appendix: Common Tasks", "Starting and Stopping MPS
on Linux", https://docs.nvidia.com/deploy/mps/latest/appendix-common-tasks.html, read
2026-12-07): as root, ``CUDA_VISIBLE_DEVICES`` names the GPUs, ``nvidia-smi -i <GPU> -c
EXCLUSIVE_PROCESS`` sets their compute mode, ``nvidia-cuda-mps-control -d`` starts the daemon
("only one instance ... should be run per node"), ``echo quit | nvidia-cuda-mps-control``
stops it. The daemon writes ``nvidia-cuda-mps-control.pid`` into its pipe directory (MPS
guide, "Appendix: Tools and Interface Reference"). ``CUDA_MPS_PIPE_DIRECTORY``,
``CUDA_MPS_LOG_DIRECTORY``, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` set in the control daemon's environment are inherited by
the MPS servers it starts (MPS guide, "Appendix: Environment Variables").

Used by ``roles.mps`` (which writes the unit), ``roles.gpu_settings`` (compute mode) and the
drift rules (which name the unit).
"""

from __future__ import annotations

from gpunode.model import DesiredState, Mps

UNIT = "gpunode-mps.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
CONTROL = "/usr/bin/nvidia-cuda-mps-control"
# nvidia-smi's words: what ``-c`` takes, and what ``--query-gpu=compute_mode`` prints.
EXCLUSIVE_PROCESS = "EXCLUSIVE_PROCESS"
EXCLUSIVE_PROCESS_SHOWN = "Exclusive_Process"
# Where the control binary comes from, by driver source, for the refusal when it is missing:
# Debian's nvidia-cuda-mps (source nvidia-graphics-drivers, non-free;
# https://packages.debian.org/sid/nvidia-cuda-mps), Ubuntu's nvidia-compute-utils-<branch>
# (the man page's "Provided by", https://manpages.ubuntu.com/manpages/noble/man1/
# nvidia-cuda-mps-control.1.html); both read 2026-12-07.
PACKAGE_BY_SOURCE = {
    "debian": "nvidia-cuda-mps",
    "nvidia": "nvidia-cuda-mps",
    "ubuntu": "nvidia-compute-utils-<branch>",
}


def environment(mps: Mps) -> dict[str, str]:
    """The daemon's environment, in a fixed order (the unit's text never changes by itself)."""
    values = {
        "CUDA_MPS_PIPE_DIRECTORY": mps.pipe_directory,
        "CUDA_MPS_LOG_DIRECTORY": mps.log_directory,
    }
    if mps.gpus:
        values["CUDA_VISIBLE_DEVICES"] = ",".join(str(int(index)) for index in mps.gpus)
    if mps.active_thread_percentage is not None:
        values["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(int(mps.active_thread_percentage))
    if mps.pinned_device_memory_limit:
        values["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
            f"{int(index)}={limit}"
            for index, limit in sorted(
                mps.pinned_device_memory_limit.items(), key=lambda item: int(item[0])
            )
        )
    for name, value in values.items():
        # Validated to digits, commas, '=', M/G and path characters; a renderer asserts it
        # rather than write a second line into the unit.
        if not value.isprintable() or " " in value:
            raise ValueError(f"refusing to render {name}: {value!r}")
    return values


def render_unit(desired: DesiredState) -> str:
    """The control daemon's unit: after the GPU settings' boot unit (the compute mode is set
    again at boot before the daemon opens the GPUs), before slurmd (jobs find MPS running)."""
    mps = desired.mps
    # Values are validated to digits, commas, '=', M/G and path characters: no quote, space
    # or '%' that systemd would read otherwise.
    env_lines = "\n".join(
        f'Environment="{name}={value}"' for name, value in environment(mps).items()
    )
    return f"""# Managed by gpunode (roles/mps.py): the CUDA MPS control daemon
[Unit]
Description=NVIDIA CUDA Multi-Process Service control daemon (declared by gpunode)
After=systemd-modules-load.service nvidia-persistenced.service gpunode-gpu-settings.service
Before=slurmd.service

[Service]
Type=forking
{env_lines}
ExecStartPre=/usr/bin/install -d -m 0755 {mps.pipe_directory} {mps.log_directory}
ExecStart={CONTROL} -d
ExecStop=/bin/sh -c 'echo quit | {CONTROL}'
PIDFile={mps.pipe_directory}/nvidia-cuda-mps-control.pid
Restart=on-failure

[Install]
WantedBy=multi-user.target
"""


def exclusive_gpus(desired: DesiredState, indexes: list[int]) -> list[int]:
    """Of the node's GPU ``indexes``, those the model wants in EXCLUSIVE_PROCESS mode."""
    wanted = desired.exclusive_process_gpus
    if wanted is None:
        return []
    return [index for index in indexes if not wanted or index in wanted]

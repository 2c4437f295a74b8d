"""The CPU that lab nodes use, from the kernel's own accounts, by lab.

A lab container's processes are not the test's: they are the container's systemd and what it
starts (sshd and each login, apt, dpkg and maintainer scripts), so a test's own process tree
(``wait4``'s rusage) leaves them out. Their CPU is in the container's cgroup
(cgroup v1 ``cpuacct.usage``, v2 ``cpu.stat``'s ``usage_usec``), which counts from zero when
the container is made. A lab VM is a qemu process that detaches from whoever started it; its
CPU is in ``/proc/PID/stat``, and its lab is in its ``-name`` (``<lab>-<vm>``).

``lab_usage`` reads both, keyed so that a container or VM made again is a new key;
``LabCpuMeter`` samples it in a thread and gives each sample's growth to whoever holds the lab
the container or VM belongs to (tests/tiers.py: the test module a lab shard runs), so that a
suite on a CPU-bound machine says which module's work the CPU went to, not only how long each
waited for it. Used by bench/cpu_profile.py too.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CGROUP_ROOTS = (Path("/sys/fs/cgroup/cpuacct/docker"), Path("/sys/fs/cgroup/system.slice"))
DOCKER_CONTAINERS = Path("/var/lib/docker/containers")
NODE_SUFFIX = re.compile(r"-\d+$")
CONTAINER_ID = re.compile(r"(?:docker-)?([0-9a-f]{64})(?:\.scope)?")


def container_names(root: Path = DOCKER_CONTAINERS) -> dict[str, str]:
    """Container id -> name, from the Docker daemon's own records (no API call per sample)."""
    names: dict[str, str] = {}
    for config in root.glob("*/config.v2.json"):
        try:
            names[config.parent.name] = str(json.loads(config.read_text())["Name"]).lstrip("/")
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return names


def container_cgroups(roots: tuple[Path, ...] = CGROUP_ROOTS) -> dict[str, Path]:
    """Container id -> its cgroup directory."""
    found: dict[str, Path] = {}
    for root in roots:
        if not root.is_dir():
            continue
        for entry in root.iterdir():
            match = CONTAINER_ID.fullmatch(entry.name)
            if match:
                found[match.group(1)] = entry
    return found


def cgroup_cpu_s(path: Path) -> float | None:
    """CPU seconds a cgroup (and every cgroup below it) has used; None when unreadable."""
    try:
        if (path / "cpuacct.usage").exists():
            return int((path / "cpuacct.usage").read_text()) / 1e9
        for line in (path / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    except (OSError, ValueError):
        return None
    return None


def lab_of(name: str) -> str:
    """The lab of a container or VM name: the name without its ``-N`` node number."""
    return NODE_SUFFIX.sub("", name)


def qemu_usage(proc: Path = Path("/proc")) -> dict[str, tuple[str, float]]:
    """``pid:start`` -> (lab, CPU seconds) of each qemu process that names itself (``-name``)."""
    found: dict[str, tuple[str, float]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if not argv or b"qemu-system" not in argv[0] or b"-name" not in argv:
                continue
            name = argv[argv.index(b"-name") + 1].decode(errors="replace")
            stat = (entry / "stat").read_text()
        except (OSError, IndexError):
            continue
        rest = stat[stat.rindex(")") + 2 :].split()
        # After the name: state(0) ppid(1) ... utime(11) stime(12) ... starttime(19).
        used = (int(rest[11]) + int(rest[12])) / CLOCK_TICKS
        found[f"{entry.name}:{rest[19]}"] = (lab_of(name), used)
    return found


def lab_usage(names: dict[str, str], cgroups: dict[str, Path]) -> dict[str, tuple[str, float]]:
    """Key -> (lab, CPU seconds so far) of every lab container (``cgroups``, named by
    ``names``: the caller reads Docker's records again when an id is new to it) and lab VM."""
    usage: dict[str, tuple[str, float]] = {}
    for cid, path in cgroups.items():
        used = cgroup_cpu_s(path)
        if used is not None and cid in names:
            usage[cid] = (lab_of(names[cid]), used)
    usage.update(qemu_usage())
    return usage


def owner_of(lab: str, holders: dict[str, object]) -> object | None:
    """Who holds ``lab``: the holder of the longest held lab name that is ``lab`` itself or
    that ``lab`` extends (``gpunode-lab-shard1-drill`` belongs to ``gpunode-lab-shard1``, not
    to ``gpunode-lab``: a module's lab of its own is named after its shard's)."""
    best = ""
    for name in holders:
        if (lab == name or lab.startswith(name + "-")) and len(name) > len(best):
            best = name
    return holders[best] if best else None


class LabCpuMeter:
    """Samples ``lab_usage`` every ``interval`` seconds in a thread; the growth of each
    container's or VM's CPU since the last sample goes to the holder of its lab then (one that
    appears between two samples counts from zero, as its account does), or to ``unheld``.

    A lab's CPU in the last interval before it is given back, or before a container is removed,
    is not seen: at most ``interval`` seconds of it."""

    def __init__(self, interval: float = 2.0) -> None:
        self.interval = interval
        self.unheld = 0.0
        self._lock = threading.Lock()
        self._holders: dict[str, object] = {}
        self._totals: dict[int, float] = {}
        self._last: dict[str, float] | None = None
        self._names: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lab-cpu-meter", daemon=True)

    def start(self) -> LabCpuMeter:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.sample()

    def hold(self, lab: str, holder: object) -> None:
        """``holder`` runs on ``lab`` (and on the labs named after it) from now."""
        self.sample()
        with self._lock:
            self._holders[lab] = holder
            self._totals[id(holder)] = 0.0

    def release(self, lab: str) -> float:
        """The holder of ``lab`` is done: the CPU seconds its labs used while it held them."""
        self.sample()
        with self._lock:
            holder = self._holders.pop(lab, None)
            return self._totals.pop(id(holder), 0.0) if holder is not None else 0.0

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        containers = container_cgroups()
        with self._lock:
            if any(cid not in self._names for cid in containers):
                self._names = container_names()
            usage = lab_usage(self._names, containers)
            if self._last is None:  # the first sample: where everything starts from
                self._last = {key: used for key, (_, used) in usage.items()}
                return
            for key, (lab, used) in usage.items():
                grown = max(0.0, used - self._last.get(key, 0.0))
                self._last[key] = used
                holder = owner_of(lab, self._holders)
                if holder is None:
                    self.unheld += grown
                else:
                    self._totals[id(holder)] = self._totals.get(id(holder), 0.0) + grown
            for gone in set(self._last) - set(usage):
                del self._last[gone]

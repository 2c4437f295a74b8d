"""Hardware profiles of the lab's simulated GPU servers and their factory state (control side).

A profile describes one kind of server: GPU model and count, driver, NVSwitch, InfiniBand and
NVMe drives. ``initial_state`` turns it into the JSON state the node-side doubles answer from
(``hwstate``). Values are taken from the real captures under ``tests/fixtures``:

- ``hgx-h100``: the H100 ``nvidia-smi`` capture of driver 590.48.01 (``-q``, ``--query-gpu``,
  ``nvlink -s``) and the CAs of ``ibstat.47.0.h100.all.active.0``;
- ``a100``: ``nvidia-smi-xml/a100-sxm4-v12.xml`` (driver 535.54.03) and
  ``ibstat.47.0.a100.all.active.0``;
- ``pcie-a10g``: ``nvidia-smi-xml/a10g.xml`` (driver 515.105.01).

Where a capture masks a value (serials, UUIDs, GUIDs) or has none (NVMe drives, H100 supported
clocks, A100/A10G row-remapper bank counts), a plausible value is chosen and said so below.
Identifiers are derived from a hash of hostname and position: nodes differ, reruns are stable.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import firmware

IBSTAT_CAPTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "ibstat"


@dataclass(frozen=True)
class SupportedClocks:
    """One memory clock and its graphics clocks, ``graphics_max`` down to ``graphics_min``.

    Every captured list steps by 15 MHz, so the range is enough to rebuild it.
    """

    memory: int
    graphics_max: int
    graphics_min: int


@dataclass(frozen=True)
class MigProfile:
    """One GPU instance profile as ``nvidia-smi mig -lgip`` and ``-lgipp`` list it.

    ``placements`` are the start slices a new instance may take, each ``size`` memory slices
    wide (8 on A100/H100); ``compute_slices`` is the N of "Ng". Engines: ``sm`` multiprocessors,
    ``ce`` copy engines, ``dec``/``enc``/``jpeg``/``ofa`` media engines.
    """

    name: str
    profile_id: int
    instances: int
    memory_mib: int
    sm: int
    dec: int
    enc: int
    ce: int
    jpeg: int
    ofa: int
    placements: tuple[int, ...]
    size: int

    @property
    def compute_slices(self) -> int:
        return int(self.name.split("g.")[0])


# Compute instance profile id of the default (whole GPU instance) compute instance, by the
# number of compute slices (NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,7}_SLICE).
DEFAULT_CI_PROFILE_IDS = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}
ONE_SLICE = tuple(range(7))
TWO_SLICES = (0, 2, 4, 6)


def _mig_profiles(
    rows: tuple[tuple[str, int, int, int, int, int, int, int, int, int], ...],
) -> tuple[MigProfile, ...]:
    """(name, id, instances, MiB, SM, DEC, ENC, CE, JPEG, OFA) rows; placements by slice size.

    The placements are those ``nvidia-smi mig -lgipp`` prints for the H100 80GB (captured) and
    the A100 80GB, which share the 8-slice memory layout.
    """
    placements = {
        "1g.10gb": (ONE_SLICE, 1),
        "1g.10gb+me": (ONE_SLICE, 1),
        "1g.20gb": (TWO_SLICES, 2),
        "2g.20gb": ((0, 2, 4), 2),
        "3g.40gb": ((0, 4), 4),
        "4g.40gb": ((0,), 4),
        "7g.80gb": ((0,), 8),
    }
    return tuple(
        MigProfile(name, pid, count, mib, sm, dec, enc, ce, jpeg, ofa, *placements[name])
        for name, pid, count, mib, sm, dec, enc, ce, jpeg, ofa in rows
    )


# ``nvidia-smi mig -lgip`` of an H100 80GB HBM3 (driver 535 era; memory 9.75 GiB = 9984 MiB).
H100_80GB_MIG_PROFILES = _mig_profiles(
    (
        ("1g.10gb", 19, 7, 9984, 16, 1, 0, 1, 1, 0),
        ("1g.10gb+me", 20, 1, 9984, 16, 1, 0, 1, 1, 1),
        ("1g.20gb", 15, 4, 20096, 26, 1, 0, 1, 1, 0),
        ("2g.20gb", 14, 3, 20096, 32, 2, 0, 2, 2, 0),
        ("3g.40gb", 9, 2, 40448, 60, 3, 0, 3, 3, 0),
        ("4g.40gb", 5, 1, 40448, 64, 4, 0, 4, 4, 0),
        ("7g.80gb", 0, 1, 81152, 132, 7, 0, 8, 7, 1),
    )
)
# ``nvidia-smi mig -lgip`` of an A100 80GB (driver 515), plus the 1g.20gb profile drivers from
# R525 on offer, with the engines of the 1g.20gb MIG devices in the A100 XML capture.
A100_80GB_MIG_PROFILES = _mig_profiles(
    (
        ("1g.10gb", 19, 7, 9728, 14, 0, 0, 1, 0, 0),
        ("1g.10gb+me", 20, 1, 9728, 14, 1, 0, 1, 1, 1),
        ("1g.20gb", 15, 4, 19968, 14, 1, 0, 1, 0, 0),
        ("2g.20gb", 14, 3, 19968, 28, 1, 0, 2, 0, 0),
        ("3g.40gb", 9, 2, 40192, 42, 2, 0, 3, 0, 0),
        ("4g.40gb", 5, 1, 40192, 56, 2, 0, 4, 0, 0),
        ("7g.80gb", 0, 1, 80896, 98, 5, 0, 7, 1, 1),
    )
)


@dataclass(frozen=True)
class GpuModel:
    name: str
    architecture: str
    pci_device_id: str
    pci_sub_system_id: str
    vbios_version: str
    board_part_number: str
    gpu_part_number: str
    inforom: Mapping[str, str]
    compute_cap: str
    memory_total_mib: int
    memory_reserved_mib: int
    bar1_total_mib: int
    power_draw_w: float
    power_default_w: float
    power_min_w: float
    power_max_w: float
    temperature_c: int
    memory_temperature_c: int | None
    performance_state: str
    idle: bool
    clocks_mhz: Mapping[str, int]
    max_clocks_mhz: Mapping[str, int]
    # None where the driver reports application clocks as deprecated (590 on Hopper).
    default_applications_clocks_mhz: Mapping[str, int] | None
    supported_clocks: tuple[SupportedClocks, ...]
    pcie_gen: tuple[int, int]  # current, max
    pcie_width: tuple[int, int]  # current, max
    fan_speed_percent: int | None
    mig_profiles: tuple[MigProfile, ...]  # empty: MIG not supported
    remapped_rows_histogram_max: int
    nvlink_count: int
    nvlink_speed: str | None
    fabric: tuple[str, str] | None  # (state, status) where the driver reports the NVLink fabric
    serial_prefix: str


@dataclass(frozen=True)
class NvmeModel:
    model: str
    firmware: str
    physical_size: int
    sector_size: int
    serial_prefix: str
    serial_length: int


@dataclass(frozen=True)
class HardwareProfile:
    description: str
    gpu: GpuModel
    gpu_bus_ids: tuple[str, ...]
    gpu_module_ids: tuple[int, ...]  # SXM baseboard slot of each GPU; 0 for a PCIe card
    driver_version: str
    cuda_version: str
    smi_xml_template: str
    # Which driver generation's output the nvidia-smi double imitates: r515, r535 or r590.
    smi_generation: str
    nvswitch_count: int
    ibstat_capture: str | None
    # CA types shown with link layer InfiniBand although the capture has them as Ethernet (RoCE).
    infiniband_ca_types: frozenset[str]
    nvme: NvmeModel | None
    nvme_count: int


H100_SXM = GpuModel(
    name="NVIDIA H100 80GB HBM3",
    architecture="Hopper",
    pci_device_id="233010DE",
    pci_sub_system_id="16C110DE",
    vbios_version="96.00.A5.00.01",
    board_part_number="692-2G520-0200-000",
    gpu_part_number="2330-885-A1",
    inforom={"img": "G520.0200.00.05", "oem": "2.1", "ecc": "7.16"},
    compute_cap="9.0",
    memory_total_mib=81559,
    memory_reserved_mib=479,
    bar1_total_mib=131072,
    power_draw_w=69.85,
    power_default_w=700.0,
    power_min_w=200.0,
    power_max_w=700.0,
    temperature_c=41,
    memory_temperature_c=48,
    performance_state="P0",
    idle=True,
    clocks_mhz={"graphics": 345, "sm": 345, "memory": 2619, "video": 765},
    max_clocks_mhz={"graphics": 1980, "sm": 1980, "memory": 2619, "video": 1545},
    default_applications_clocks_mhz=None,
    # Not in the capture: max and idle graphics clock of the capture, the usual 15 MHz steps.
    supported_clocks=(SupportedClocks(memory=2619, graphics_max=1980, graphics_min=345),),
    pcie_gen=(5, 5),
    pcie_width=(16, 16),
    fan_speed_percent=None,
    mig_profiles=H100_80GB_MIG_PROFILES,
    remapped_rows_histogram_max=2560,
    nvlink_count=18,
    nvlink_speed="26.562 GB/s",
    fabric=("Completed", "Success"),
    serial_prefix="1654",
)

A100_SXM4_80GB = GpuModel(
    name="NVIDIA A100-SXM4-80GB",
    architecture="Ampere",
    pci_device_id="20B210DE",
    pci_sub_system_id="147F10DE",
    vbios_version="92.00.36.00.02",
    board_part_number="692-2G506-0212-002",
    gpu_part_number="20B2-895-A1",
    inforom={"img": "G506.0212.00.01", "oem": "2.0", "ecc": "6.16"},
    compute_cap="8.0",
    memory_total_mib=81920,
    memory_reserved_mib=869,
    bar1_total_mib=131072,
    power_draw_w=67.03,
    power_default_w=500.0,
    power_min_w=100.0,
    power_max_w=500.0,
    temperature_c=27,
    memory_temperature_c=44,
    performance_state="P0",
    idle=False,
    clocks_mhz={"graphics": 1275, "sm": 1275, "memory": 1593, "video": 1275},
    max_clocks_mhz={"graphics": 1410, "sm": 1410, "memory": 1593, "video": 1290},
    default_applications_clocks_mhz={"graphics": 1275, "memory": 1593},
    supported_clocks=(SupportedClocks(memory=1593, graphics_max=1410, graphics_min=210),),
    pcie_gen=(4, 4),
    pcie_width=(16, 16),
    fan_speed_percent=None,
    mig_profiles=A100_80GB_MIG_PROFILES,
    remapped_rows_histogram_max=640,  # not in the capture (MIG was on): plausible bank count
    nvlink_count=12,
    nvlink_speed="25 GB/s",
    fabric=None,
    serial_prefix="1650",
)

A10G = GpuModel(
    name="NVIDIA A10G",
    architecture="Ampere",
    # The capture masks both ids (000000DE); these are the A10G's.
    pci_device_id="223710DE",
    pci_sub_system_id="152F10DE",
    vbios_version="94.02.75.00.01",
    board_part_number="N/A",
    gpu_part_number="000-00000-0000-000",
    inforom={"img": "G133.0210.00.04", "oem": "2.0", "ecc": "6.16"},
    compute_cap="8.6",
    memory_total_mib=23028,
    memory_reserved_mib=435,
    bar1_total_mib=32768,
    power_draw_w=25.58,
    power_default_w=300.0,
    power_min_w=100.0,
    power_max_w=300.0,
    temperature_c=17,
    memory_temperature_c=None,
    performance_state="P8",
    idle=True,
    clocks_mhz={"graphics": 210, "sm": 210, "memory": 405, "video": 555},
    max_clocks_mhz={"graphics": 1710, "sm": 1710, "memory": 6251, "video": 1500},
    default_applications_clocks_mhz={"graphics": 1710, "memory": 6251},
    supported_clocks=(
        SupportedClocks(memory=6251, graphics_max=1710, graphics_min=210),
        SupportedClocks(memory=405, graphics_max=420, graphics_min=210),
    ),
    # An idle A10G trains its link down, as captured.
    pcie_gen=(1, 4),
    pcie_width=(8, 16),
    fan_speed_percent=0,
    mig_profiles=(),
    remapped_rows_histogram_max=192,
    nvlink_count=0,
    nvlink_speed=None,
    fabric=None,
    serial_prefix="1324",
)

# Not captured: the 3.84 TB U.2 data drives of DGX systems and an AWS instance store drive.
SAMSUNG_PM1733_3T84 = NvmeModel(
    model="SAMSUNG MZWLJ3T8HBLS-00007",
    firmware="EPK9CB5Q",
    physical_size=3840755982336,
    sector_size=512,
    serial_prefix="S4YPNE0R",
    serial_length=14,
)
AWS_INSTANCE_STORE_250G = NvmeModel(
    model="Amazon EC2 NVMe Instance Storage",
    firmware="0",
    physical_size=250000000000,
    sector_size=512,
    serial_prefix="AWS",
    serial_length=20,
)

PROFILES: dict[str, HardwareProfile] = {
    "hgx-h100": HardwareProfile(
        description="HGX H100 8-GPU: NVSwitch, 8x 400 Gb/s InfiniBand, 8 NVMe",
        gpu=H100_SXM,
        gpu_bus_ids=tuple(
            f"00000000:{bus}:00.0" for bus in ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
        ),
        gpu_module_ids=(1, 2, 3, 4, 5, 6, 7, 8),
        driver_version="590.48.01",
        cuda_version="13.1",
        smi_xml_template="a100-sxm4-v12.xml",
        smi_generation="r590",
        nvswitch_count=4,
        ibstat_capture="ibstat.47.0.h100.all.active.0",
        infiniband_ca_types=frozenset({"MT4129"}),
        nvme=SAMSUNG_PM1733_3T84,
        nvme_count=8,
    ),
    "a100": HardwareProfile(
        description="HGX A100 8-GPU: NVSwitch, 8x 200 Gb/s InfiniBand + 1 Ethernet, 4 NVMe",
        gpu=A100_SXM4_80GB,
        gpu_bus_ids=tuple(
            f"00000000:{bus}:00.0" for bus in ("07", "0F", "47", "4E", "87", "90", "B7", "BD")
        ),
        gpu_module_ids=(1, 2, 3, 4, 5, 6, 7, 8),
        driver_version="535.54.03",
        cuda_version="12.2",
        smi_xml_template="a100-sxm4-v12.xml",
        smi_generation="r535",
        nvswitch_count=6,
        ibstat_capture="ibstat.47.0.a100.all.active.0",
        infiniband_ca_types=frozenset(),
        nvme=SAMSUNG_PM1733_3T84,
        nvme_count=4,
    ),
    "pcie-a10g": HardwareProfile(
        description="Single PCIe A10G (AWS g5): no NVLink, no InfiniBand, 1 NVMe",
        gpu=A10G,
        gpu_bus_ids=("00000000:00:1E.0",),
        gpu_module_ids=(0,),
        driver_version="515.105.01",
        cuda_version="11.7",
        smi_xml_template="a10g.xml",
        smi_generation="r515",
        nvswitch_count=0,
        ibstat_capture=None,
        infiniband_ca_types=frozenset(),
        nvme=AWS_INSTANCE_STORE_250G,
        nvme_count=1,
    ),
}

ECC_COUNTERS = ("sram_correctable", "sram_uncorrectable", "dram_correctable", "dram_uncorrectable")
CLOCKS_EVENT_REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "display_clocks_setting",
)


def initial_state(profile: str, hostname: str) -> dict[str, Any]:
    """The factory state of a ``profile`` node named ``hostname``, as JSON-ready data.

    Factory: persistence mode off, ECC on, MIG off, power limit at default, every NVLink and
    InfiniBand port up, nothing pending, no errors.

    Top level: ``profile``, ``hostname``, ``driver_loaded`` (false: nvidia-smi exits 9),
    ``driver_version``, ``cuda_version``, ``smi_xml_template`` and ``smi_generation`` (which
    capture and driver generation ``nvidia-smi -q -x`` imitates), ``nvswitch_count``, and:

    - ``gpus``: one dict per GPU slot: ``present`` (false: fell off the bus), ``lost`` (true:
      listed but every value "GPU is lost"), ``recovery_action`` (driver 590's words for the
      driver's recovery action, "None" when healthy), identity (``name``,
      ``uuid``, ``serial``, ``pci_bus_id``, ``minor_number``, ``module_id``, ``vbios_version``...),
      ``persistence_mode``, ``ecc_mode`` and ``mig_mode`` (``current``/``pending``:
      Enabled, Disabled or N/A), ``mig_profiles`` (the GPU instance profiles, see
      ``MigProfile``; empty without MIG), ``gpu_instances`` (``id``, ``profile_id``, ``start``,
      ``size`` and ``compute_instances``: ``id``, ``profile_id``, ``start``, ``size``; gone at a
      reset or reboot), ``compute_processes`` (``pid``, ``name``, ``used_memory_mib``: what
      ``--query-compute-apps`` lists), ``ecc_errors`` (``volatile``/``aggregate`` counts),
      ``remapped_rows``, ``temperature``, ``power`` (``draw``, ``limit``, ``default_limit``,
      ``min_limit``, ``max_limit``, watts), ``clocks``, ``max_clocks``,
      ``applications_clocks`` and ``default_applications_clocks`` (null: deprecated),
      ``supported_clocks``, ``clocks_event_reasons`` (bool per reason), ``pcie``,
      ``fan_speed``, ``fabric``, ``nvlink_speed`` and ``nvlinks`` (``active`` and the
      ``errors`` counters per link);
    - ``ib_ports``: one dict per HCA port, ``ibstat`` fields in snake case (``ca``, ``ca_type``,
      ``firmware_version``, ``state``, ``physical_state``, ``rate``, ``link_layer``...);
    - ``firmware``: the simulated UEFI firmware (``firmware.factory``: ``uefi`` false, a BIOS
      boot, as lab nodes always were; ``secure_boot``, ``setup_mode``, ``shim_validation``);
    - ``nvme``: one dict per drive: ``present``, ``device_path``, ``model``, ``serial``,
      ``firmware``, ``physical_size``, ``sector_size``...
    """
    spec = PROFILES[profile]
    return {
        "profile": profile,
        "hostname": hostname,
        "driver_loaded": True,
        "driver_version": spec.driver_version,
        "cuda_version": spec.cuda_version,
        "smi_xml_template": spec.smi_xml_template,
        "smi_generation": spec.smi_generation,
        "nvswitch_count": spec.nvswitch_count,
        "gpus": [
            _gpu(spec.gpu, bus_id, module_id, position, hostname)
            for position, (bus_id, module_id) in enumerate(
                zip(spec.gpu_bus_ids, spec.gpu_module_ids, strict=True)
            )
        ],
        "ib_ports": _ib_ports(spec, hostname),
        "nvme": [_nvme_drive(spec.nvme, n, hostname) for n in range(spec.nvme_count)]
        if spec.nvme
        else [],
        "firmware": firmware.factory(),
    }


def _digest(hostname: str, *what: object) -> str:
    return hashlib.sha256("/".join(map(str, (hostname, *what))).encode()).hexdigest()


def _gpu(
    model: GpuModel, bus_id: str, module_id: int, position: int, hostname: str
) -> dict[str, Any]:
    digest = _digest(hostname, "gpu", position)
    uuid = "-".join((digest[:8], digest[8:12], digest[12:16], digest[16:20], digest[20:32]))
    serial_digits = 13 - len(model.serial_prefix)
    serial = model.serial_prefix + str(int(digest[32:], 16) % 10**serial_digits).zfill(
        serial_digits
    )
    mig_mode = "Disabled" if model.mig_profiles else "N/A"
    app_clocks = model.default_applications_clocks_mhz
    return {
        "present": True,
        # On the bus but answering no query: nvidia-smi prints "GPU is lost" for its values.
        "lost": False,
        # Driver 590's <gpu_recovery_action> words ("None", "Reset", "Reboot"...).
        "recovery_action": "None",
        "name": model.name,
        "architecture": model.architecture,
        "uuid": f"GPU-{uuid}",
        "serial": serial,
        "pci_bus_id": bus_id,
        "pci_device_id": model.pci_device_id,
        "pci_sub_system_id": model.pci_sub_system_id,
        "minor_number": position,
        "module_id": module_id,
        "vbios_version": model.vbios_version,
        "board_part_number": model.board_part_number,
        "gpu_part_number": model.gpu_part_number,
        "inforom": dict(model.inforom),
        "compute_cap": model.compute_cap,
        "persistence_mode": "Disabled",
        "compute_mode": "Default",
        "ecc_mode": {"current": "Enabled", "pending": "Enabled"},
        "mig_mode": {"current": mig_mode, "pending": mig_mode},
        "mig_profiles": [
            {
                "name": profile.name,
                "id": profile.profile_id,
                "instances": profile.instances,
                "memory_mib": profile.memory_mib,
                "sm": profile.sm,
                "dec": profile.dec,
                "enc": profile.enc,
                "ce": profile.ce,
                "jpeg": profile.jpeg,
                "ofa": profile.ofa,
                "placements": list(profile.placements),
                "size": profile.size,
                "compute_slices": profile.compute_slices,
                "ci_profile_id": DEFAULT_CI_PROFILE_IDS[profile.compute_slices],
            }
            for profile in model.mig_profiles
        ],
        "gpu_instances": [],
        "compute_processes": [],
        "ecc_errors": {
            "volatile": dict.fromkeys(ECC_COUNTERS, 0),
            "aggregate": dict.fromkeys(ECC_COUNTERS, 0),
        },
        "remapped_rows": {
            "correctable": 0,
            "uncorrectable": 0,
            "pending": "No",
            "failure": "No",
            "histogram_max": model.remapped_rows_histogram_max,
        },
        "temperature": {"gpu": model.temperature_c, "memory": model.memory_temperature_c},
        "power": {
            "draw": model.power_draw_w,
            "limit": model.power_default_w,
            "default_limit": model.power_default_w,
            "min_limit": model.power_min_w,
            "max_limit": model.power_max_w,
        },
        "performance_state": model.performance_state,
        "clocks_event_reasons": {
            reason: model.idle and reason == "gpu_idle" for reason in CLOCKS_EVENT_REASONS
        },
        "clocks": dict(model.clocks_mhz),
        "max_clocks": dict(model.max_clocks_mhz),
        "applications_clocks": dict(app_clocks) if app_clocks else None,
        "default_applications_clocks": dict(app_clocks) if app_clocks else None,
        "supported_clocks": [
            {"memory": s.memory, "graphics_max": s.graphics_max, "graphics_min": s.graphics_min}
            for s in model.supported_clocks
        ],
        "memory": {
            "total_mib": model.memory_total_mib,
            "reserved_mib": model.memory_reserved_mib,
            "used_mib": 0,
        },
        "bar1_total_mib": model.bar1_total_mib,
        "pcie": {
            "gen_current": model.pcie_gen[0],
            "gen_max": model.pcie_gen[1],
            "width_current": model.pcie_width[0],
            "width_max": model.pcie_width[1],
        },
        "fan_speed": model.fan_speed_percent,
        "fabric": {"state": model.fabric[0], "status": model.fabric[1]} if model.fabric else None,
        "nvlink_speed": model.nvlink_speed,
        # Each link's error counters (nvidia-smi nvlink -e): zero on a healthy link, as on
        # every link of the real capture (tests/fixtures/nvlink/nvidia-smi.nvlink.errors.*).
        "nvlinks": [
            {"active": True, "errors": {"replay": 0, "recovery": 0, "crc": 0}}
            for _ in range(model.nvlink_count)
        ],
    }


def parse_ibstat(text: str) -> list[dict[str, Any]]:
    """One dict per port of real ``ibstat`` output, CA attributes repeated in each.

    "Number of ports" is left out: ``ibstat`` counts a CA's ports, so it cannot disagree.
    """
    ports: list[dict[str, Any]] = []
    ca: dict[str, Any] = {}
    port: dict[str, Any] | None = None
    for line in text.splitlines():
        if match := re.fullmatch(r"CA '(.+)'", line):
            ca, port = {"ca": match.group(1)}, None
        elif match := re.fullmatch(r"\tPort (\d+):", line):
            port = {**ca, "port": int(match.group(1))}
            ports.append(port)
        elif match := re.fullmatch(r"(\t+)([^:]+): (.*)", line):
            key = match.group(2).lower().replace(" ", "_")
            if key == "number_of_ports":
                continue
            value: str | int = match.group(3)
            if key in ("rate", "base_lid", "lmc", "sm_lid"):
                value = int(value)
            (ca if port is None else port)[key] = value
    return ports


def _ib_ports(spec: HardwareProfile, hostname: str) -> list[dict[str, Any]]:
    if spec.ibstat_capture is None:
        return []
    ports = parse_ibstat((IBSTAT_CAPTURES / spec.ibstat_capture).read_text(encoding="utf-8"))
    for port in ports:
        for key in ("node_guid", "system_image_guid", "port_guid"):
            port[key] = _node_guid(port[key], hostname)
        if port["ca_type"] in spec.infiniband_ca_types:
            # What the same HCA reports on an InfiniBand fabric: LIDs from the subnet
            # manager, the IB capability mask of the A100 capture, port GUID = node GUID.
            port.update(
                link_layer="InfiniBand",
                base_lid=int(_digest(hostname, "lid", port["ca"])[:4], 16) % 0xBFFF + 1,
                sm_lid=1,
                capability_mask="0xa651ec48",
                port_guid=port["node_guid"],
            )
    return ports


def _node_guid(captured: str, hostname: str) -> str:
    """The captured GUID with its low 24 bits (the per-device part) unique to this node.

    The same captured low bits give the same new ones, so GUIDs that share them in the
    capture (node and port GUID) keep doing so.
    """
    value = int(captured, 16)
    if value == 0:  # no GUID (an Ethernet function's port), not an identifier
        return captured
    device_bits = int(_digest(hostname, "guid", value & 0xFFFFFF)[:6], 16)
    return f"0x{(value & ~0xFFFFFF) | device_bits:016x}"


def _nvme_drive(model: NvmeModel, position: int, hostname: str) -> dict[str, Any]:
    digest = _digest(hostname, "nvme", position).upper()
    return {
        "present": True,
        "device_path": f"/dev/nvme{position}n1",
        "generic_path": f"/dev/ng{position}n1",
        "namespace": 1,
        "model": model.model,
        "serial": (model.serial_prefix + digest)[: model.serial_length],
        "firmware": model.firmware,
        "physical_size": model.physical_size,
        "used_bytes": model.physical_size,
        "sector_size": model.sector_size,
    }

"""GPU failure classes as data: what each means, how bad it is, and what fixes it.

Every entry names its source (NVIDIA's own catalogues) and the date it was read. The drift
check's health rules (``gpunode.health.lost``, ``.memory``, ``.xid``, ``.recovery``) judge a
node's GPU report against these; nothing here reads a node.

Sources (read 2026-12-07):

- XIDs: NVIDIA's Xid catalogue for Ampere and newer, "Analyzing Xid Errors with the Xid
  Catalog" (``XID_CATALOGUE_URL``), whose "Resolution Bucket (Immediate Action)" column the
  rows of ``XID_ROWS`` carry, as NVIDIA's own NVSentinel ships that column with a fatal flag
  per XID (``XID_ROWS_URL``, NVIDIA/NVSentinel at commit 6f8b0fcf, Apache-2.0);
- the driver's recovery action (``nvmlDeviceGpuRecoveryAction_t``; nvidia-smi -q's "GPU
  Recovery Action", ``<gpu_recovery_action>`` in its XML): NVIDIA's memory error management
  guide, "Error Recovery and Response Flags" (``RECOVERY_ACTION_URL``), values 5 to 7 from
  the NVML enum as NVIDIA's cuda-python documents it (``RECOVERY_ENUM_URL``);
- memory: the same guide's row-remapping flags, and NVIDIA's dynamic page retirement guide
  (``PAGE_RETIREMENT_URL``);
- a lost GPU: nvidia-smi(1)'s exit status 15 ("the GPU has fallen off the bus or has otherwise
  become inaccessible"), NVML's ``NVML_ERROR_GPU_IS_LOST`` (NVIDIA's nvidia-ml-py,
  ``NVML_ERRORS_URL``), XID 79.

- links, clocks and the fabric (``INTERCONNECT_CLASSES``): nvidia-smi(1) and NVML's PCIe link,
  clocks event reasons and temperature thresholds, the Fabric Manager user guide for SXids and
  fabric registration, ibstat(8) for InfiniBand ports (each URL beside its entry below);
- error counters (``NVLINK_ERROR_LIMITS``, ``IB_COUNTER_LIMITS``): NVIDIA's health checks and
  DCGM for NVLink's replay, recovery and CRC counters, rdma-core's ibqueryerrors(8) and
  NVIDIA's InfiniBand health check for the ports' counters (beside them below).

Thresholds over a window (``XID_REPEAT``, ``SXID_REPEAT``) are gpunode's own policy, not
NVIDIA's: NVIDIA files the XIDs they apply to under "restart the application" or "ignore",
that is one hit is no fault of the node; the same XID again and again on one GPU within the
window is.

Standard library only, no gpunode import.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

READ_ON = "2026-12-07"
XID_CATALOGUE_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
XID_ROWS_URL = (
    "https://github.com/NVIDIA/NVSentinel/blob/6f8b0fcf8e502bdda78fabf96facef729a9285b/"
    "distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv"
)
RECOVERY_ACTION_URL = (
    "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/error-recovery-and-response-flags.html"
)
RECOVERY_ENUM_URL = (
    "https://nvidia.github.io/cuda-python/pr-preview/pr-2903/cuda-bindings/latest/module/"
    "generated/cuda.bindings.nvml.DeviceGpuRecoveryAction.html"
)
PAGE_RETIREMENT_URL = "https://docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html"
NVML_ERRORS_URL = (
    "https://pypi.org/project/nvidia-ml-py/13.615.71/ (pynvml.py: NVML_ERROR_GPU_IS_LOST = 15)"
)
NVIDIA_SMI_MAN = "nvidia-smi(1), RETURN VALUE (driver 590.48.01)"


class Severity(StrEnum):
    """As the drift check ranks findings: critical keeps jobs off the node."""

    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


class Remedy(StrEnum):
    """What an operator does, from the least to the most disruptive."""

    NONE = "none"
    RESTART_APPLICATION = "restart_application"
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    REINSTALL_DRIVER = "reinstall_driver"
    DRAIN = "drain"
    CONTACT_SUPPORT = "contact_support"
    RESEAT_OR_RMA = "reseat_or_rma"


REMEDY_TEXT = {
    Remedy.NONE: "nothing to do",
    Remedy.RESTART_APPLICATION: "restart the application (the node is not at fault)",
    Remedy.RESET_GPU: "drain the node and reset the GPU (nvidia-smi -r, no process on it)",
    Remedy.REBOOT: "drain and reboot the node",
    Remedy.REINSTALL_DRIVER: "drain the node, reinstall the pinned driver, reboot",
    Remedy.DRAIN: "drain the node and look at the kernel log",
    Remedy.CONTACT_SUPPORT: "drain the node and open a ticket with NVIDIA or the vendor",
    Remedy.RESEAT_OR_RMA: "drain the node; reseat the board, RMA it if the fault stays",
}


class Confidence(StrEnum):
    """How sure a finding is: the driver said so, or gpunode inferred it."""

    REPORTED = "reported"  # a flag or counter the driver keeps for exactly this
    INFERRED = "inferred"  # read from how the driver answers (every value lost...)


@dataclass(frozen=True)
class Source:
    url: str
    read: str = READ_ON


@dataclass(frozen=True)
class FailureClass:
    """One kind of failure: its default severity and remedy, and what to do if that fails."""

    name: str
    summary: str
    severity: Severity
    remedy: Remedy
    if_it_persists: Remedy | None
    source: Source


# --- XIDs -------------------------------------------------------------------------------------

# (XID, mnemonic, NVIDIA's resolution bucket (immediate action), fatal) as NVSentinel ships
# NVIDIA's Xid catalogue (XID_ROWS_URL); 154's bucket is NVIDIA's "Follow guidance as it
# applies to another Xid", named FOLLOW_OTHER_XID here.
XID_ROWS: tuple[tuple[int, str, str, bool], ...] = (
    (1, "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (2, "ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (3, "ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (4, "ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (5, "ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (6, "ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (7, "ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "RESTART_APP", False),
    (9, "ROBUST_CHANNEL_GR_ERROR_INSTANCE", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (10, "ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "RESTART_APP", False),
    (12, "ROBUST_CHANNEL_GR_ERROR_SW_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (13, "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY", "RESTART_APP", False),
    (14, "ROBUST_CHANNEL_FAKE_ERROR", "IGNORE", False),
    (15, "ROBUST_CHANNEL_SCANLINE_TIMEOUT", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (16, "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (17, "ROBUST_CHANNEL_PARAMETER_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (18, "ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (19, "ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (20, "ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (21, "ROBUST_CHANNEL_ME_ERROR_SW_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (22, "ROBUST_CHANNEL_VP_ERROR_SW_METHOD", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (23, "ROBUST_CHANNEL_RC_LOGGING_ENABLED", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (24, "ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "RESTART_APP", False),
    (26, "ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (27, "ROBUST_CHANNEL_VP_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (28, "ROBUST_CHANNEL_VP2_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (29, "ROBUST_CHANNEL_BSP_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (30, "ROBUST_CHANNEL_BAD_ADDR_ACCESS", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP", False),
    (32, "ROBUST_CHANNEL_PBDMA_ERROR", "RESTART_APP", False),
    (33, "ROBUST_CHANNEL_SEC_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (34, "ROBUST_CHANNEL_MSVLD_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (35, "ROBUST_CHANNEL_MSPDEC_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (36, "ROBUST_CHANNEL_MSPPP_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (37, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "IGNORE", False),
    (38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "IGNORE", False),
    (39, "ROBUST_CHANNEL_CE0_ERROR", "RESTART_APP", False),
    (40, "ROBUST_CHANNEL_CE1_ERROR", "RESTART_APP", False),
    (41, "ROBUST_CHANNEL_CE2_ERROR", "RESTART_APP", False),
    (42, "ROBUST_CHANNEL_VIC_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE", False),
    (44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "IGNORE", False),
    (45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "WORKFLOW_XID_45", False),
    (46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "RESET_GPU", True),
    (47, "ROBUST_CHANNEL_NVENC0_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (48, "ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48", True),
    (49, "SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (50, "SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (51, "SILENT_RUNNING_STRESS_TEST_FAILURE", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (52, "SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (53, "SILENT_RUNNING_TEMP_REDUCED_CLOCKING", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "CHECK_MECHANICALS", True),
    (55, "SILENT_RUNNING_TEMPERATURE_READ_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (56, "DISPLAY_CHANNEL_EXCEPTION", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (57, "FB_LINK_TRAINING_FAILURE_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (58, "FB_MEMORY_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (59, "PMU_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (60, "ROBUST_CHANNEL_SEC2_ERROR", "RESTART_APP", False),
    (61, "PMU_BREAKPOINT", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (62, "PMU_HALT_ERROR", "RESET_GPU", True),
    (63, "INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE", False),
    (64, "INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU", True),
    (65, "ROBUST_CHANNEL_NVENC1_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "IGNORE", False),
    (67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "IGNORE", False),
    (68, "ROBUST_CHANNEL_NVDEC0_ERROR", "RESTART_APP", False),
    (69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "RESTART_APP", False),
    (70, "ROBUST_CHANNEL_CE3_ERROR", "RESTART_APP", False),
    (71, "ROBUST_CHANNEL_CE4_ERROR", "RESTART_APP", False),
    (72, "ROBUST_CHANNEL_CE5_ERROR", "RESTART_APP", False),
    (73, "ROBUST_CHANNEL_NVENC2_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (74, "NVLINK_ERROR", "WORKFLOW_NVLINK_ERR", True),
    (75, "ROBUST_CHANNEL_CE6_ERROR", "RESTART_APP", False),
    (76, "ROBUST_CHANNEL_CE7_ERROR", "RESTART_APP", False),
    (77, "ROBUST_CHANNEL_CE8_ERROR", "RESTART_APP", False),
    (78, "VGPU_START_ERROR", "UPDATE_SWFW", True),
    (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", True),
    (80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "RESTART_APP", False),
    (81, "ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (82, "ROBUST_CHANNEL_NVJPG0_ERROR", "RESTART_APP", False),
    (83, "ROBUST_CHANNEL_NVDEC1_ERROR", "RESTART_APP", False),
    (84, "ROBUST_CHANNEL_NVDEC2_ERROR", "RESTART_APP", False),
    (85, "ROBUST_CHANNEL_CE9_ERROR", "RESTART_APP", False),
    (86, "ROBUST_CHANNEL_OFA0_ERROR", "RESTART_APP", False),
    (87, "NVTELEMETRY_DRIVER_REPORT", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (88, "ROBUST_CHANNEL_NVDEC3_ERROR", "RESTART_APP", False),
    (89, "ROBUST_CHANNEL_NVDEC4_ERROR", "RESTART_APP", False),
    (90, "LTC_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (91, "RESERVED_XID", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (92, "EXCESSIVE_SBE_INTERRUPTS", "IGNORE", False),
    (93, "INFOROM_ERASE_LIMIT_EXCEEDED", "IGNORE", False),
    (94, "ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP", False),
    (95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU", True),
    (96, "ROBUST_CHANNEL_NVDEC5_ERROR", "RESTART_APP", False),
    (97, "ROBUST_CHANNEL_NVDEC6_ERROR", "RESTART_APP", False),
    (98, "ROBUST_CHANNEL_NVDEC7_ERROR", "RESTART_APP", False),
    (99, "ROBUST_CHANNEL_NVJPG1_ERROR", "RESTART_APP", False),
    (100, "ROBUST_CHANNEL_NVJPG2_ERROR", "RESTART_APP", False),
    (101, "ROBUST_CHANNEL_NVJPG3_ERROR", "RESTART_APP", False),
    (102, "ROBUST_CHANNEL_NVJPG4_ERROR", "RESTART_APP", False),
    (103, "ROBUST_CHANNEL_NVJPG5_ERROR", "RESTART_APP", False),
    (104, "ROBUST_CHANNEL_NVJPG6_ERROR", "RESTART_APP", False),
    (105, "ROBUST_CHANNEL_NVJPG7_ERROR", "RESTART_APP", False),
    (106, "SMBPBI_TEST_MESSAGE", "IGNORE", False),
    (107, "SMBPBI_TEST_MESSAGE_SILENT", "IGNORE", False),
    (108, "DESTINATION_FLA_TRANSLATION_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "RESET_GPU", True),
    (110, "SEC_FAULT_ERROR", "RESET_GPU", True),
    (111, "BUNDLE_ERROR_EVENT", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (112, "DISP_SUPERVISOR_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (113, "DP_LT_FAILURE", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (114, "HEAD_RG_UNDERFLOW", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (115, "CORE_CHANNEL_REGS", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (116, "WINDOW_CHANNEL_REGS", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (117, "CURSOR_CHANNEL_REGS", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (118, "HEAD_REGS", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (119, "GSP_RPC_TIMEOUT", "RESET_GPU", True),
    (120, "GSP_ERROR", "RESET_GPU", True),
    (121, "C2C_ERROR", "IGNORE", False),
    (122, "SPI_PMU_RPC_READ_FAIL", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (123, "SPI_PMU_RPC_WRITE_FAIL", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (124, "SPI_PMU_RPC_ERASE_FAIL", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (125, "INFOROM_FS_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (126, "ROBUST_CHANNEL_CE10_ERROR", "RESTART_APP", False),
    (127, "ROBUST_CHANNEL_CE11_ERROR", "RESTART_APP", False),
    (128, "ROBUST_CHANNEL_CE12_ERROR", "RESTART_APP", False),
    (129, "ROBUST_CHANNEL_CE13_ERROR", "RESTART_APP", False),
    (130, "ROBUST_CHANNEL_CE14_ERROR", "RESTART_APP", False),
    (131, "ROBUST_CHANNEL_CE15_ERROR", "RESTART_APP", False),
    (132, "ROBUST_CHANNEL_CE16_ERROR", "RESTART_APP", False),
    (133, "ROBUST_CHANNEL_CE17_ERROR", "RESTART_APP", False),
    (134, "ROBUST_CHANNEL_CE18_ERROR", "RESTART_APP", False),
    (135, "ROBUST_CHANNEL_CE19_ERROR", "RESTART_APP", False),
    (136, "ALI_TRAINING_FAIL", "RESET_GPU", True),
    (137, "NVLINK_FLA_PRIV_ERR", "IGNORE", False),
    (138, "ROBUST_CHANNEL_DLA_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (139, "ROBUST_CHANNEL_OFA1_ERROR", "RESTART_APP", False),
    (140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU", True),
    (141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "IGNORE", False),
    (142, "ROBUST_CHANNEL_NVENC3_ERROR", "UNEXPECTED_ERR_REPORT_ISSUE", True),
    (143, "GPU_INIT_ERROR", "RESET_GPU", True),
    (144, "NVLINK_SAW_ERROR", "WORKFLOW_NVLINK5_ERR", True),
    (145, "NVLINK_RLW_ERROR", "WORKFLOW_NVLINK5_ERR", True),
    (146, "NVLINK_TLW_ERROR", "WORKFLOW_NVLINK5_ERR", True),
    (147, "NVLINK_TREX_ERROR", "WORKFLOW_NVLINK5_ERR", True),
    (148, "NVLINK_NVLPW_CTRL_ERROR", "WORKFLOW_NVLINK5_ERR", True),
    (149, "NVLINK_NETIR_ERROR", "WORKFLOW_NVLINK5_ERR", True),
    (150, "NVLINK_MSE_ERROR", "WORKFLOW_NVLINK5_ERR", True),
    (151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "RESTART_VM", True),
    (152, "ROBUST_CHANNEL_DLA_SMMU_ERROR", "IGNORE", False),
    (153, "ROBUST_CHANNEL_DLA_TIMEOUT", "IGNORE", False),
    (154, "GPU_RECOVERY_ACTION_CHANGED", "FOLLOW_OTHER_XID", False),
    (155, "NVLINK_SW_DEFINED_ERROR", "RESET_GPU", True),
    (156, "RESOURCE_RETIREMENT_EVENT", "RESET_GPU", True),
    (157, "RESOURCE_RETIREMENT_FAILURE", "IGNORE", False),
    (158, "GPU_FATAL_TIMEOUT", "RESET_GPU", True),
    (159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHECK_UVM", False),
    (160, "CHANNEL_RETIREMENT_EVENT", "RESTART_BM", True),
    (161, "CHANNEL_RETIREMENT_FAILURE", "IGNORE", False),
    (162, "", "RESET_GPU", True),
)

# NVIDIA's buckets -> gpunode's remedy, and what to do when it does not help.
BUCKET_REMEDIES: dict[str, tuple[Remedy, Remedy | None]] = {
    "RESTART_APP": (Remedy.RESTART_APPLICATION, None),
    "IGNORE": (Remedy.NONE, None),
    "RESET_GPU": (Remedy.RESET_GPU, Remedy.REBOOT),
    "RESTART_BM": (Remedy.REBOOT, Remedy.RESEAT_OR_RMA),
    "RESTART_VM": (Remedy.REBOOT, None),
    "WORKFLOW_XID_48": (Remedy.RESET_GPU, Remedy.RESEAT_OR_RMA),
    "WORKFLOW_XID_45": (Remedy.NONE, None),
    "WORKFLOW_NVLINK_ERR": (Remedy.RESET_GPU, Remedy.RESEAT_OR_RMA),
    "WORKFLOW_NVLINK5_ERR": (Remedy.RESET_GPU, Remedy.RESEAT_OR_RMA),
    "CHECK_MECHANICALS": (Remedy.RESEAT_OR_RMA, None),
    "UPDATE_SWFW": (Remedy.REINSTALL_DRIVER, None),
    "CHECK_UVM": (Remedy.RESTART_APPLICATION, None),
    "UNEXPECTED_ERR_REPORT_ISSUE": (Remedy.CONTACT_SUPPORT, None),
    "FOLLOW_OTHER_XID": (Remedy.NONE, None),
}


@dataclass(frozen=True)
class XidRepeat:
    """gpunode's policy: ``count`` hits of one XID on one GPU within ``window_hours``."""

    count: int
    window_hours: int
    remedy: Remedy


# One application fault is the application's; the same one again and again on one GPU is
# the GPU's or the node's. 24 h is the probe's kernel-log window (gpu_probe.XID_WINDOW_HOURS).
XID_REPEAT = {
    "RESTART_APP": XidRepeat(count=5, window_hours=24, remedy=Remedy.DRAIN),
    "IGNORE": XidRepeat(count=10, window_hours=24, remedy=Remedy.CONTACT_SUPPORT),
    "WORKFLOW_XID_45": XidRepeat(count=10, window_hours=24, remedy=Remedy.DRAIN),
    "CHECK_UVM": XidRepeat(count=5, window_hours=24, remedy=Remedy.DRAIN),
}


@dataclass(frozen=True)
class Xid:
    number: int
    mnemonic: str
    bucket: str  # NVIDIA's immediate action
    fatal: bool
    severity: Severity
    remedy: Remedy
    if_it_persists: Remedy | None
    repeat: XidRepeat | None
    source: Source


def _severity(bucket: str, fatal: bool) -> Severity:
    if fatal:
        return Severity.CRITICAL
    return (
        Severity.INFO
        if bucket in ("IGNORE", "WORKFLOW_XID_45", "FOLLOW_OTHER_XID")
        else (Severity.WARNING)
    )


def _xid(number: int, mnemonic: str, bucket: str, fatal: bool) -> Xid:
    remedy, then = BUCKET_REMEDIES[bucket]
    return Xid(number, mnemonic, bucket, fatal, _severity(bucket, fatal), remedy, then,
               None if fatal else XID_REPEAT.get(bucket), Source(XID_CATALOGUE_URL))  # fmt: skip


XID_CATALOGUE: dict[int, Xid] = {row[0]: _xid(*row) for row in XID_ROWS}
# An XID the catalogue does not list yet (a newer driver): a warning, for a person to look up.
UNKNOWN_XID_REMEDY = Remedy.DRAIN


# --- the driver's recovery action -------------------------------------------------------------


@dataclass(frozen=True)
class RecoveryAction:
    value: int
    name: str  # NVML's, without NVML_GPU_RECOVERY_ACTION_
    meaning: str
    severity: Severity
    remedy: Remedy
    source: Source


RECOVERY_ACTIONS: dict[int, RecoveryAction] = {
    action.value: action
    for action in (
        RecoveryAction(0, "NONE", "no recovery action is needed", Severity.INFO, Remedy.NONE,
                       Source(RECOVERY_ACTION_URL)),
        RecoveryAction(1, "GPU_RESET", "the GPU needs a reset to recover", Severity.CRITICAL,
                       Remedy.RESET_GPU, Source(RECOVERY_ACTION_URL)),
        RecoveryAction(2, "NODE_REBOOT", "the fault may have left the OS inconsistent: reboot",
                       Severity.CRITICAL, Remedy.REBOOT, Source(RECOVERY_ACTION_URL)),
        RecoveryAction(3, "DRAIN_P2P", "drain peer-to-peer traffic (NVLink) from the GPU",
                       Severity.CRITICAL, Remedy.DRAIN, Source(RECOVERY_ACTION_URL)),
        RecoveryAction(4, "DRAIN_AND_RESET", "drain peer-to-peer traffic, then reset the GPU",
                       Severity.CRITICAL, Remedy.RESET_GPU, Source(RECOVERY_ACTION_URL)),
        RecoveryAction(5, "RECOVER_IMEX_DOMAIN", "recover the IMEX domain", Severity.CRITICAL,
                       Remedy.DRAIN, Source(RECOVERY_ENUM_URL)),
        RecoveryAction(6, "BUS_RESET", "reset the GPU's PCIe bus", Severity.CRITICAL,
                       Remedy.REBOOT, Source(RECOVERY_ENUM_URL)),
        RecoveryAction(7, "SYSTEM_REBOOT", "reboot the system", Severity.CRITICAL,
                       Remedy.REBOOT, Source(RECOVERY_ENUM_URL)),
    )
}  # fmt: skip

# The driver's words for an action ("None", XID 154's "OS Reboot") are read into these values by
# gpunode.probe.gpu_record.recovery_action_value.


# --- failure classes --------------------------------------------------------------------------

FAILURE_CLASSES: dict[str, FailureClass] = {
    failure.name: failure
    for failure in (
        FailureClass(
            "gpu.lost", "the GPU answers no query: fallen off the bus or otherwise lost",
            Severity.CRITICAL, Remedy.REBOOT, Remedy.RESEAT_OR_RMA,
            Source(
                f"{XID_CATALOGUE_URL} (XID 79, RESTART_BM); {NVIDIA_SMI_MAN}; {NVML_ERRORS_URL}"
            ),
        ),
        FailureClass(
            "memory.uncorrectable_ecc", "uncorrectable ECC errors since the last reset",
            Severity.CRITICAL, Remedy.RESET_GPU, Remedy.RESEAT_OR_RMA,
            Source(RECOVERY_ACTION_URL),
        ),
        FailureClass(
            "memory.sram_threshold_exceeded",
            "uncorrectable SRAM errors past NVIDIA's threshold (SRAM is never remapped)",
            Severity.CRITICAL, Remedy.RESEAT_OR_RMA, None, Source(RECOVERY_ACTION_URL),
        ),
        FailureClass(
            "memory.uncorrectable_ecc_history",
            "uncorrectable ECC errors in the GPU's lifetime, none since the last reset",
            Severity.INFO, Remedy.NONE, Remedy.RESEAT_OR_RMA, Source(RECOVERY_ACTION_URL),
        ),
        FailureClass(
            "memory.row_remap_failure", "a row could not be remapped (NVIDIA's RMA condition)",
            Severity.CRITICAL, Remedy.RESEAT_OR_RMA, None, Source(RECOVERY_ACTION_URL),
        ),
        FailureClass(
            "memory.row_remap_pending",
            "a row remapping waits for the next GPU reset; running work is unaffected",
            Severity.WARNING, Remedy.RESET_GPU, None, Source(RECOVERY_ACTION_URL),
        ),
        FailureClass(
            "memory.page_retirement_pending",
            "a retired page takes effect at the next driver reload (XID 63)",
            Severity.WARNING, Remedy.RESET_GPU, None, Source(PAGE_RETIREMENT_URL),
        ),
        FailureClass(
            "memory.retired_pages", "pages retired for ECC errors",
            Severity.INFO, Remedy.NONE, None, Source(PAGE_RETIREMENT_URL),
        ),
        FailureClass(
            "gpu.recovery_action", "the driver asks for a recovery action",
            Severity.CRITICAL, Remedy.RESET_GPU, Remedy.REBOOT, Source(RECOVERY_ACTION_URL),
        ),
        FailureClass(
            "xid", "an XID error in the kernel log (each XID's own entry in XID_CATALOGUE)",
            Severity.WARNING, Remedy.DRAIN, None, Source(XID_CATALOGUE_URL),
        ),
        FailureClass(
            "xid.repeated", "one XID again and again on one GPU within the window",
            Severity.WARNING, Remedy.DRAIN, Remedy.CONTACT_SUPPORT, Source(XID_CATALOGUE_URL),
        ),
    )
}  # fmt: skip


# --- links, clocks and the fabric -------------------------------------------------------------
# Read 2026-12-07. What each field means and what NVIDIA says to do about it:
# nvidia-smi -q's fields (PCI link width and generation, GPU Slowdown Temp): nvidia-smi(1) of
# driver 610.43, as Arch Linux renders NVIDIA's man page:
NVIDIA_SMI_QUERY_URL = "https://man.archlinux.org/man/nvidia-smi.1.raw"
# NVML's link width and generation: current, and the maximum "possible with this device and
# system" (a x16 board in a x8 slot reports x8):
PCIE_LINK_URL = (
    "https://nvidia.github.io/cuda-python/cuda-core/latest/generated/cuda.core.system.PciInfo.html"
)
# HW slowdown, HW thermal slowdown, HW power brake slowdown, SW thermal slowdown:
CLOCK_REASONS_URL = "https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html"
# NVIDIA's Xid guide: the NVSwitch driver's "Switch Xids" (SXids) and their use are documented
# in the Fabric Manager user guide (its "Runtime NVSwitch and GPU errors"); each SXid line says
# itself whether it is Fatal or Non-fatal (the real lines in tests/fixtures/kernel-log). A
# GPU's fabric state (Not Started / In Progress / Completed) and status; a GPU that fails to
# register with the fabric loses its NVLink peers. Which remedy a fatal SXid gets (reboot:
# the fabric's GPUs and NVSwitches reset together on bare metal) is gpunode's reading of it:
# the guide's section was not read whole on 2026-12-07.
FABRIC_MANAGER_URL = "https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html"
DCGM_NVSWITCH_URL = "https://docs.nvidia.com/datacenter/dcgm/latest/learn/modules/nvswitch.html"
IBSTAT_MAN = (  # the port's State, Physical state and Rate (Gb/s) ibstat prints
    "https://github.com/linux-rdma/rdma-core/blob/93398605dcf92c68239cf7e6e0cffa8097fa7268/"
    "infiniband-diags/man/ibstat.8.in.rst"
)

# NVLink error counters (nvidia-smi nvlink -e; NVML's nvmlDeviceGetNvLinkErrorCounter): NVIDIA's
# health checks cover NVLink "replay counters, link errors" (NVLINK_CHECKS_URL) and DCGM reads
# an error counter as "did an error total increase during an interval? Passive evidence; does
# not identify root cause" (DCGM_NVLINK_URL). Neither page gives a count for nvidia-smi's
# three counters; the counters are zero on a healthy link (every link of the real 8-GPU capture
# in tests/fixtures/nvlink) and cleared by a GPU reset or driver reload, so any count is an
# event since then: NVLINK_ERROR_LIMITS. A recovery is the link retraining, its traffic
# stalled: critical. Remedy as NVIDIA's Xid catalogue gives for an NVLink error (XID 74,
# WORKFLOW_NVLINK_ERR): reset the GPU, then reseat or RMA.
NVLINK_CHECKS_URL = "https://docs.nvidia.com/health-validation/reference/checks/nvlink.md"
DCGM_NVLINK_URL = (
    "https://docs.nvidia.com/datacenter/dcgm/latest/learn/core-services/topology-and-links.html"
)
# ibqueryerrors(8) of rdma-core (infiniband-diags): "The default threshold is zero (0)", and
# its example thresholds file "SymbolErrorCounter=10, LinkErrorRecoveryCounter=10,
# VL15Dropped=100". NVIDIA's InfiniBand health check fails critical on a single link outage
# (rdma_linkflap_fatal, fatal_flap_threshold 1, INFINIBAND_CHECKS_URL); a link_downed count does
# not say how long the outage lasted, so gpunode names it a warning.
IBQUERYERRORS_MAN = (
    "https://github.com/linux-rdma/rdma-core/blob/93398605dcf92c68239cf7e6e0cffa8097fa7268/"
    "infiniband-diags/man/ibqueryerrors.8.in.rst"
)
INFINIBAND_CHECKS_URL = "https://docs.nvidia.com/health-validation/reference/checks/infiniband.md"

INTERCONNECT_CLASSES = (
    FailureClass(
        "pcie.width_degraded",
        "the GPU's PCIe link at fewer lanes than its siblings' (a seating, riser or slot fault)",
        Severity.WARNING, Remedy.RESEAT_OR_RMA, None,
        Source(f"{PCIE_LINK_URL}; {NVIDIA_SMI_QUERY_URL} (PCI: Link Width, Max and Current)"),
    ),
    FailureClass(
        "pcie.generation_degraded",
        "the GPU's PCIe link runs below its maximum generation while the GPU is busy (an idle "
        "GPU lowers its generation to save power, by design)",
        Severity.WARNING, Remedy.RESEAT_OR_RMA, None,
        Source(f"{PCIE_LINK_URL}; {NVIDIA_SMI_QUERY_URL} (PCIe Generation, Max and Current)"),
    ),
    FailureClass(
        "clocks.slowdown",
        "clocks held down by hardware (HW slowdown, thermal, power brake) or the driver's "
        "thermal slowdown, not by idling or the application",
        Severity.WARNING, Remedy.RESEAT_OR_RMA, None, Source(CLOCK_REASONS_URL),
    ),
    FailureClass(
        "temperature.slowdown",
        "the GPU at or over its own slowdown temperature (nvidia-smi's GPU Slowdown Temp)",
        Severity.WARNING, Remedy.DRAIN, Remedy.RESEAT_OR_RMA,
        Source(f"{NVIDIA_SMI_QUERY_URL} (Temperature: GPU Slowdown Temp)"),
    ),
    FailureClass(
        "nvlink.inactive",
        "some of a GPU's NVLinks are down while others are up (a link of the mesh is lost)",
        Severity.CRITICAL, Remedy.RESET_GPU, Remedy.RESEAT_OR_RMA,
        Source(f"{NVIDIA_SMI_QUERY_URL} (nvlink --status); {XID_CATALOGUE_URL} (XID 74)"),
    ),
    FailureClass(
        "fabric.not_registered",
        "the GPU has not finished registering with the NVLink fabric, or registered with an "
        "error: it has no NVLink peers",
        Severity.CRITICAL, Remedy.REBOOT, Remedy.CONTACT_SUPPORT, Source(FABRIC_MANAGER_URL),
    ),
    FailureClass(
        "nvswitch.sxid_fatal",
        "a fatal NVSwitch error (SXid): the fabric's GPUs and NVSwitches need a reset",
        Severity.CRITICAL, Remedy.REBOOT, Remedy.CONTACT_SUPPORT, Source(FABRIC_MANAGER_URL),
    ),
    FailureClass(
        "nvswitch.sxid_non_fatal",
        "a non-fatal NVSwitch error (SXid): informational, jobs go on",
        Severity.INFO, Remedy.NONE, Remedy.CONTACT_SUPPORT, Source(FABRIC_MANAGER_URL),
    ),
    FailureClass(
        "nvswitch.sxid_repeated",
        "one non-fatal SXid again and again on one NVSwitch within the window",
        Severity.WARNING, Remedy.DRAIN, Remedy.CONTACT_SUPPORT, Source(FABRIC_MANAGER_URL),
    ),
    FailureClass(
        "infiniband.port_down",
        "an InfiniBand or RoCE port not Active / LinkUp (Down, Polling, Disabled...)",
        Severity.CRITICAL, Remedy.RESEAT_OR_RMA, None, Source(IBSTAT_MAN),
    ),
    FailureClass(
        "nvlink.errors",
        "NVLink replay or CRC errors counted since the GPU's last reset: a marginal link",
        Severity.WARNING, Remedy.RESET_GPU, Remedy.RESEAT_OR_RMA,
        Source(f"{NVLINK_CHECKS_URL}; {DCGM_NVLINK_URL}; {XID_CATALOGUE_URL} (XID 74)"),
    ),
    FailureClass(
        "nvlink.recovery_errors",
        "NVLink recovery errors since the GPU's last reset: the link went down and retrained",
        Severity.CRITICAL, Remedy.RESET_GPU, Remedy.RESEAT_OR_RMA,
        Source(f"{NVLINK_CHECKS_URL}; {DCGM_NVLINK_URL}; {XID_CATALOGUE_URL} (XID 74)"),
    ),
    FailureClass(
        "infiniband.errors",
        "InfiniBand port error counters over ibqueryerrors' thresholds (symbol errors, link "
        "recoveries, receive errors, integrity errors, buffer overruns, discards)",
        Severity.WARNING, Remedy.RESEAT_OR_RMA, None, Source(IBQUERYERRORS_MAN),
    ),
    FailureClass(
        "infiniband.link_downed",
        "an InfiniBand port's link went down since its counters were cleared (a flap)",
        Severity.WARNING, Remedy.RESEAT_OR_RMA, None,
        Source(f"{INFINIBAND_CHECKS_URL} (rdma_linkflap_fatal); {IBQUERYERRORS_MAN}"),
    ),
    FailureClass(
        "infiniband.rate_degraded",
        "a port up at a lower rate than declared, or than its sibling ports of the same adapter "
        "model",
        Severity.WARNING, Remedy.RESEAT_OR_RMA, None, Source(IBSTAT_MAN),
    ),
)  # fmt: skip
FAILURE_CLASSES.update({failure.name: failure for failure in INTERCONNECT_CLASSES})

# gpunode's policy, as for XIDs: one non-fatal SXid is NVIDIA's "informational"; the same one
# again and again on one NVSwitch within the probe's 24 h kernel-log window is not.
SXID_REPEAT = XidRepeat(count=10, window_hours=24, remedy=Remedy.DRAIN)
# nvidia-smi's clocks event reasons that are no fault: idling, the application's or the
# administrator's settings, the power cap, sync boost, display clocks.
SLOWDOWN_REASONS = (
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
)

# Counts above which a link is reported (see NVLINK_CHECKS_URL above): any count.
NVLINK_ERROR_LIMITS = {"replay": 0, "recovery": 0, "crc": 0}
# /sys/class/infiniband/<ca>/ports/<n>/counters/<name> -> the count above which a port is
# reported: ibqueryerrors' default (0) and its example file's 10 for symbol errors and link
# error recoveries (IBQUERYERRORS_MAN). link_downed is its own class (infiniband.link_downed).
IB_COUNTER_LIMITS = {
    "symbol_error": 10,
    "link_error_recovery": 10,
    "link_downed": 0,
    "port_rcv_errors": 0,
    "port_rcv_remote_physical_errors": 0,
    "local_link_integrity_errors": 0,
    "excessive_buffer_overrun_errors": 0,
    "port_xmit_discards": 0,
}

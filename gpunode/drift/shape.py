"""The shape of a host's facts that the drift rules rely on, checked before any rule reads them.

Facts come from the node: a broken or hostile node can put a string where a rule counts, a
number where it expects an object. Each section that does not fit its shape is replaced by an
unreadable section naming the first value that does not fit, so its rules report it as
unreadable (``gpu.unreadable``, ``ib.unreadable``...) and every other section is still checked.
"""

from __future__ import annotations

from typing import Any

from gpunode.probe.parsers import GPU_REPORT_SHAPE
from gpunode.sanitize import Bool, Int, ListOf, MapOf, Maybe, Num, Record, Shape, Str

_TEXT = Maybe(Str)
_FLAG = Maybe(Bool)
_STATE = {"state": _TEXT, "reason": _TEXT}
_EFFECTIVE = MapOf(ListOf(Str))  # sshd -T: keyword -> values; or {"error": [message]}
_ENGINE = Maybe(
    Record(
        {
            "error": _TEXT,
            "nvidia_runtime": _FLAG,
            "default_runtime": _TEXT,
            "registry_config_path": _TEXT,
        }
    )
)
_CDI_SPEC = Maybe(Record({"present": _FLAG, "uuids": Maybe(ListOf(Str))}))
_MOUNT = Record({"source": _TEXT, "fstype": _TEXT, "options": Maybe(ListOf(Str))})
_ACCOUNT = Record(
    {
        "keys": Maybe(Int),
        "shell_usable": _FLAG,
        "expire_day": Maybe(Int),
        "groups": Maybe(ListOf(Str)),
    }
)

# Section name (a key of facts.node.NodeState.FACTS) -> what its rules read, with the types.
SECTION_SHAPES: dict[str, Shape] = {
    "gpu": GPU_REPORT_SHAPE,
    "infiniband": Record(
        {
            **_STATE,
            "ports": ListOf(
                Record(
                    {
                        "ca": _TEXT,
                        "ca_type": _TEXT,  # the adapter model: sibling ports' rates
                        "port": Maybe(Int),
                        "state": _TEXT,
                        "physical_state": _TEXT,
                        "link_layer": _TEXT,
                        "rate": Maybe(Num),
                    }
                )
            ),
            "problems": Maybe(ListOf(Str)),
        }
    ),
    "ib_counters": Record(
        {
            **_STATE,
            "ports": ListOf(
                Record({"ca": _TEXT, "port": Maybe(Int), "counters": Maybe(MapOf(Maybe(Int)))})
            ),
            "problems": Maybe(ListOf(Str)),
        }
    ),
    "nvme": Record({**_STATE, "devices": ListOf(Record({}))}),
    "os": Record(
        {
            **_STATE,
            "os_release": Maybe(MapOf(Str)),
            "architecture": _TEXT,
            "problems": Maybe(ListOf(Str)),
        }
    ),
    "sshd": Record(
        {
            "effective": Maybe(_EFFECTIVE),
            "effective_error": _TEXT,
            "config_sha1": _TEXT,
            "per_user": Maybe(Record({"users": Maybe(MapOf(_EFFECTIVE))})),
            "accounts": Maybe(
                Record({**_STATE, "today": Maybe(Int), "accounts": Maybe(MapOf(_ACCOUNT))})
            ),
        }
    ),
    "firewall": Record(
        {
            **_STATE,
            "live": _TEXT,
            "file_loads": _TEXT,
            "file_sha256": _TEXT,
            "unit_enabled": _FLAG,
        }
    ),
    "tls": Record({**_STATE, "key": _TEXT, "days_to_expiry": Maybe(Int), "not_after": _TEXT}),
    "packages": Record({**_STATE, "packages": MapOf(Str), "held": ListOf(Str), "kernel": _TEXT}),
    "secure_boot": Record(
        {
            **_STATE,
            "shim_validation": _FLAG,
            "keys": Maybe(MapOf(Str)),
            "problems": Maybe(ListOf(Str)),
        }
    ),
    "container_runtime": Record(
        {
            **_STATE,
            "docker": _ENGINE,
            "containerd": _ENGINE,
            "cdi_spec": _CDI_SPEC,
            "cdi_refresh_spec": _CDI_SPEC,
            "nvidia_ctk_version": _TEXT,
        }
    ),
    "nccl": Record({**_STATE, "conf": Maybe(MapOf(Str)), "profile": Maybe(MapOf(Str))}),
    "slurm": Record(
        {
            **_STATE,
            "gres": ListOf(Record({"name": _TEXT, "type": _TEXT, "file": _TEXT})),
            "problems": Maybe(ListOf(Str)),
        }
    ),
    "file_integrity": Record(
        {
            **_STATE,
            "database": _FLAG,
            "summary": Maybe(
                Record(
                    {
                        "alerts": Maybe(
                            ListOf(Record({"kind": _TEXT, "path": _TEXT, "found": _TEXT}))
                        ),
                        "alert_count": Maybe(Int),
                        "last_check": _TEXT,
                        "last_error": _TEXT,
                    }
                )
            ),
            "problems": Maybe(ListOf(Str)),
        }
    ),
    # Only where gpunode drift --dcgm-diag ran it (facts.dcgm.DcgmDiag).
    "dcgm_diag": Record(
        {
            **_STATE,
            "failed": Maybe(ListOf(Str)),
            "tests": Maybe(
                ListOf(
                    Record(
                        {
                            "name": _TEXT,
                            "status": _TEXT,
                            "detail": Maybe(ListOf(Str)),
                            # Per entity (DCGM 4: "GPU 0" and its serial; DCGM 3: gpu_ids).
                            "results": Maybe(
                                ListOf(
                                    Record(
                                        {
                                            "entity": _TEXT,
                                            "serial": _TEXT,
                                            "status": _TEXT,
                                            "error_ids": Maybe(ListOf(Int)),
                                        }
                                    )
                                )
                            ),
                        }
                    )
                )
            ),
            "problems": Maybe(ListOf(Str)),
        }
    ),
    "malware_scan": Record(
        {
            **_STATE,
            "databases": Maybe(ListOf(Record({"name": _TEXT, "mtime": Maybe(Int)}))),
            "result": Maybe(
                Record(
                    {
                        "finished": _TEXT,
                        "status": _TEXT,
                        "exit_status": Maybe(Int),
                        "infected": Maybe(ListOf(Record({"path": _TEXT, "signature": _TEXT}))),
                        "infected_count": Maybe(Int),
                        "errors": Maybe(ListOf(Str)),
                        "unread": Maybe(ListOf(Str)),
                        "signatures_updated": _TEXT,
                        "signatures_update_output": Maybe(ListOf(Str)),
                    }
                )
            ),
            "problems": Maybe(ListOf(Str)),
        }
    ),
    "auditd": Record(
        {
            **_STATE,
            "kernel_allows": _FLAG,
            "refused_because": _TEXT,
            "installed": _FLAG,
            "active": _FLAG,
            "unit_state": _TEXT,
            "rules_loaded": _FLAG,
            "watches": Maybe(ListOf(Record({"path": _TEXT, "key": _TEXT}))),
            "problems": Maybe(ListOf(Str)),
        }
    ),
    "lynis": Record(
        {
            **_STATE,
            "report": Maybe(
                Record(
                    {
                        "hardening_index": Maybe(Int),
                        "report_end": _TEXT,
                        "lynis_version": _TEXT,
                        "warnings": Maybe(ListOf(Record({"test": _TEXT, "text": _TEXT}))),
                        "suggestions": Maybe(ListOf(Record({"test": _TEXT, "text": _TEXT}))),
                    }
                )
            ),
            "problems": Maybe(ListOf(Str)),
        }
    ),
    # Mount point -> mount; a rule looks up the declared mount point.
    "mounts": Record(_STATE, rest=_MOUNT),
    "kubernetes": Record(
        {
            **_STATE,
            "cgroup": _TEXT,
            "swap_active": Maybe(ListOf(Str)),
            "fstab_swap": Maybe(ListOf(Str)),
            "modules": Maybe(ListOf(Str)),
            "sysctls": Maybe(MapOf(Str)),
            "forward_filtered": _FLAG,
            "packages": Maybe(MapOf(Record({"version": _TEXT, "held": _FLAG}))),
            "problems": Maybe(ListOf(Str)),
        }
    ),
    "network_mounts": Record(
        {**_STATE, "answers": Maybe(MapOf(Str)), "problems": Maybe(ListOf(Str))}
    ),
    "registry_access": Record(
        {**_STATE, "present": _FLAG, "mode": _TEXT, "registries": Maybe(ListOf(Str))}
    ),
    "mps": Record(
        {
            **_STATE,
            "compute_modes": Maybe(MapOf(Str)),
            "nvidia_smi": _FLAG,
            "active": _FLAG,
            "unit_state": _TEXT,
            "control_installed": _FLAG,
            "problems": Maybe(ListOf(Str)),
        }
    ),
}


def unreadable_section(reason: str) -> dict[str, Any]:
    return {"state": "unreadable", "reason": reason}


def checked_facts(facts: dict[str, Any]) -> dict[str, Any]:
    """``facts`` with each section that does not fit its shape replaced by an unreadable one
    whose reason names the value (a missing section stays missing: its rule says so)."""
    checked = dict(facts)
    for name, shape in SECTION_SHAPES.items():
        section = facts.get(name)
        if section is None:
            continue
        if problem := shape.problem(section, name):
            checked[name] = unreadable_section(f"malformed facts: {problem}")
    return checked

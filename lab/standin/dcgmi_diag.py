"""The lab stand-in dcgmi's ``diag -r LEVEL -j``: the simulated GPUs' diagnostic (node side,
stdlib only; ``catalogue._dcgmi_script`` runs this file with the node's python3).

The document has the shape of NVIDIA's real ``dcgmi diag -j`` output in
tests/fixtures/dcgm (DCGM 3.1.0): a "DCGM GPU Diagnostic" object, its Deployment tests with
one result for all GPUs (``gpu_ids`` "0,1,..."), ``null`` between them, and the Custom
"software" test with one result per GPU (integer ``gpu_ids``), then "version". Level 2 adds a
Hardware category (a category DCGM's JSON format names) with a "Memory" test per GPU.

Faults in the simulator (``gpunode-lab-hw set``) make tests fail: a pending or failed row
remap on any GPU fails "Page Retirement/Row Remap"; at level 2, uncorrectable volatile DRAM
ECC errors fail that GPU's "Memory". No real failing document was at hand: a failed result
is a status "FAIL", without the warnings' text (whose keys differ by release).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

DEPLOYMENT_TESTS = (
    "Denylist",
    "NVML Library",
    "CUDA Main Library",
    "Permissions and OS-related Blocks",
    "Persistence Mode",
    "Environmental Variables",
    "Page Retirement/Row Remap",
    "Graphics Processes",
    "Inforom",
)
LEVELS = {"1": 1, "quick": 1, "short": 1, "2": 2, "medium": 2}


def _status(failed: bool) -> str:
    return "FAIL" if failed else "PASS"


def render(gpus: list[dict[str, Any]], level: int, version: str) -> str:
    present = [gpu for gpu in gpus if gpu.get("present", True)]
    ids = ",".join(str(index) for index in range(len(present)))
    remap_fault = any(
        (gpu.get("remapped_rows") or {}).get(key) == "Yes"
        for gpu in present
        for key in ("pending", "failure")
    )
    deployment: list[Any] = []
    for name in DEPLOYMENT_TESTS:
        failed = name == "Page Retirement/Row Remap" and remap_fault
        if deployment:
            deployment.append(None)
        deployment.append({"name": name, "results": [{"gpu_ids": ids, "status": _status(failed)}]})
    categories: list[dict[str, Any]] = [{"category": "Deployment", "tests": deployment}]
    if level >= 2:
        memory = [
            {
                "gpu_ids": index,
                "status": _status(
                    bool(
                        ((gpu.get("ecc_errors") or {}).get("volatile") or {}).get(
                            "dram_uncorrectable"
                        )
                    )
                ),
            }
            for index, gpu in enumerate(present)
        ]
        categories.append(
            {"category": "Hardware", "tests": [{"name": "Memory", "results": memory}]}
        )
    software = [{"gpu_ids": index, "status": "PASS"} for index in range(len(present))]
    categories.append({"category": "Custom", "tests": [{"name": "software", "results": software}]})
    document = {"DCGM GPU Diagnostic": {"test_categories": categories, "version": version}}
    return json.dumps(document, indent="\t") + "\n"


def main(argv: list[str], version: str) -> int:
    level = LEVELS.get(argv[argv.index("-r") + 1]) if "-r" in argv[:-1] else None
    if argv[:1] != ["diag"] or level is None or "-j" not in argv:
        sys.stderr.write("dcgmi: the gpunode lab stand-in answers diag -r 1|2 -j only\n")
        return 1
    shown = subprocess.run(
        ["gpunode-lab-hw", "show", "gpus"], capture_output=True, text=True, check=False
    )
    if shown.returncode != 0:
        sys.stderr.write(f"dcgmi: no simulated GPUs: {shown.stderr.strip()}\n")
        return 1
    sys.stdout.write(render(json.loads(shown.stdout), level, version))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[2:], sys.argv[1]))

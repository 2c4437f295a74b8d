"""pyinfra's own CLI, counting what crosses SSH per host; the counts go to $GPUNODE_BENCH_COUNTS.

    GPUNODE_BENCH_COUNTS=counts.json .venv/bin/python bench/counted_pyinfra.py -y INVENTORY DEPLOY

Counted per host: shell commands (each one SSH round trip: fact reads and operation commands
alike) and file transfers. A measuring tool for bench/, not part of gpunode.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from collections import Counter
from typing import Any

from pyinfra.connectors.ssh import SSHConnector
from pyinfra_cli.main import main

COUNTS: dict[str, Counter[str]] = {}


def counting(kind: str, original: Any) -> Any:
    def wrapper(self: SSHConnector, *args: Any, **kwargs: Any) -> Any:
        COUNTS.setdefault(self.host.name, Counter())[kind] += 1
        return original(self, *args, **kwargs)

    return wrapper


def write_counts() -> None:
    path = os.environ.get("GPUNODE_BENCH_COUNTS")
    if path:
        with open(path, "w") as out:
            json.dump({host: dict(counts) for host, counts in COUNTS.items()}, out)


SSHConnector.run_shell_command = counting("commands", SSHConnector.run_shell_command)  # type: ignore[method-assign]
SSHConnector.put_file = counting("uploads", SSHConnector.put_file)  # type: ignore[method-assign]
SSHConnector.get_file = counting("downloads", SSHConnector.get_file)  # type: ignore[method-assign]
atexit.register(write_counts)

if __name__ == "__main__":
    sys.argv[0] = "pyinfra"
    sys.exit(main())

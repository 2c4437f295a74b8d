"""Drift check wall time and SSH commands per host, for one lab node and for all of them.

    .venv/bin/python bench/drift.py [--inventory inventories/lab.py]

Prints one table; a measurement, not a test.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from pyinfra.connectors.ssh import SSHConnector  # noqa: E402

from gpunode.cli import load_inventory  # noqa: E402
from gpunode.drift import run_drift  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inventory", default="inventories/lab.py")
    args = parser.parse_args()
    commands: dict[str, int] = {}
    original = SSHConnector.run_shell_command

    def counting(self: SSHConnector, *a: Any, **k: Any) -> Any:
        commands[self.host.name] = commands.get(self.host.name, 0) + 1
        return original(self, *a, **k)

    SSHConnector.run_shell_command = counting  # type: ignore[method-assign]
    hosts = [host.name for host in load_inventory(args.inventory)]
    print(f"{'hosts':>5} {'wall s':>7} {'SSH commands per host':>22} {'findings':>9}")
    for limit in (hosts[0], None):
        commands.clear()
        inventory = load_inventory(args.inventory)
        started = time.monotonic()
        result = run_drift(inventory, args.inventory, limit)
        wall = time.monotonic() - started
        per_host = sorted(set(commands.values()))
        print(f"{len(result.checked_hosts):>5} {wall:>7.2f} {per_host!s:>22} "
              f"{len(result.findings):>9}")  # fmt: skip


if __name__ == "__main__":
    main()

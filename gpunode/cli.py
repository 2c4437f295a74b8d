"""gpunode command line: inventory validation, defaults and the drift check.

More sub-commands come from ``gpunode.commands`` entry points (``COMMAND_PLUGINS``): each is a
function given argparse's sub-parsers, adding its own. Test equipment plugs in that way.
"""

from __future__ import annotations

import sys

if sys.argv[1:2] == ["drift"]:
    # pyinfra reaches hosts in parallel through gevent, which must patch sockets and ssl
    # before anything imports them (as the pyinfra CLI itself does first thing).
    from gevent import monkey

    monkey.patch_all()

import argparse
import os
from collections.abc import Sequence
from importlib.metadata import entry_points

from gpunode.inventory import InvalidInventory, fleet_of
from gpunode.model import DesiredState
from gpunode.schema import defaults_table

COMMAND_PLUGINS = "gpunode.commands"


def load_inventory(path: str):  # type: ignore[no-untyped-def]
    """Load an inventory the way the pyinfra CLI does (group_data beside it included)."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    if not os.path.exists(path):
        raise SystemExit(f"gpunode: no inventory file {path}")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    with ctx_state.use(State()):
        return make_inventory(path, cwd=os.getcwd())


def cmd_validate(args: argparse.Namespace) -> int:
    inventory = load_inventory(args.inventory)
    try:
        fleet = fleet_of(inventory, args.inventory)
    except InvalidInventory as error:
        print(str(error), file=sys.stderr)
        return 1
    print(f"{args.inventory}: {len(fleet.hosts)} hosts, desired state valid")
    for name in fleet.hosts:
        for note in fleet.notes.get(name, []):
            print(note)
    return 0


def cmd_defaults(_: argparse.Namespace) -> int:
    rows = defaults_table(DesiredState)
    width = max(len(key) for key, _, _ in rows)
    for key, default, doc in rows:
        print(f"{key:<{width}}  {default}\n{'':<{width}}    {doc}")
    return 0


def cmd_drift(args: argparse.Namespace) -> int:
    from gpunode.drift import run_drift, select_hosts, stderr_progress
    from gpunode.drift.baseline import apply_baseline
    from gpunode.drift.output import (
        render_json,
        render_junit,
        render_prometheus,
        render_table,
        write_atomically,
    )

    inventory = load_inventory(args.inventory)
    try:
        total = len(select_hosts(inventory, args.limit))
        result = run_drift(inventory, args.inventory, args.limit, stderr_progress(total))
    except InvalidInventory as error:
        print(str(error), file=sys.stderr)
        return 2
    if args.baseline:
        apply_baseline(result, args.baseline)
    reports = [
        (args.junit, render_junit),
        (args.prometheus, render_prometheus),
        (args.write_baseline, render_json),
    ]
    unwritten = 0
    for path, render in reports:
        if not path:
            continue
        try:
            write_atomically(path, render(result))
        except OSError as error:  # one report that cannot be written must not cost the others
            print(f"gpunode drift: cannot write {path}: {error}", file=sys.stderr)
            unwritten += 1
    print(render_json(result) if args.json else render_table(result), end="")
    return max(result.exit_code, 2) if unwritten else result.exit_code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpunode", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    validate = commands.add_parser("validate", help="check an inventory's desired state")
    validate.add_argument("inventory")
    validate.set_defaults(func=cmd_validate)

    defaults = commands.add_parser("defaults", help="print every setting with its default")
    defaults.set_defaults(func=cmd_defaults)

    drift = commands.add_parser(
        "drift",
        help="compare every host with the inventory (exit 0 clean, 1 drift, 2 not checked)",
    )
    drift.add_argument("inventory")
    drift.add_argument("--limit", help="hosts or groups, comma-separated")
    drift.add_argument("--json", action="store_true", help="JSON on stdout instead of a table")
    drift.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report")
    drift.add_argument(
        "--prometheus", metavar="FILE", help="also write node_exporter textfile metrics"
    )
    drift.add_argument(
        "--baseline", metavar="FILE", help="mark findings already in this JSON report as known"
    )
    drift.add_argument(
        "--write-baseline", metavar="FILE", help="also write this run's JSON report here"
    )
    drift.set_defaults(func=cmd_drift)

    for plugin in entry_points(group=COMMAND_PLUGINS):
        plugin.load()(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

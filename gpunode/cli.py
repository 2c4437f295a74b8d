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
from pathlib import Path

from gpunode.inventory import Fleet, InvalidInventory, fleet_of
from gpunode.model import DesiredState
from gpunode.sanitize import clean_text
from gpunode.schema import defaults_table

COMMAND_PLUGINS = "gpunode.commands"


def override_data(pairs: list[str] | None) -> dict[str, object]:
    """``--data KEY=VALUE`` arguments as pyinfra's CLI reads its own (``parse_cli_arg``: true,
    false, integers and JSON, else the text): the same overrides a deploy was run with."""
    from pyinfra_cli.util import parse_cli_arg

    data: dict[str, object] = {}
    for pair in pairs or []:
        key, separator, value = pair.partition("=")
        if not separator or not key:
            raise SystemExit(f"gpunode: --data {pair!r}: not KEY=VALUE")
        data[key] = parse_cli_arg(value)
    return data


DATA_HELP = (
    "override a data key on every host, as pyinfra's --data does (JSON values), to check "
    "what a deploy run with the same overrides made; repeatable"
)


def load_inventory(path: str, data: list[str] | None = None):  # type: ignore[no-untyped-def]
    """Load an inventory the way the pyinfra CLI does (group_data beside it included), with
    ``--data`` overrides applied to every host as pyinfra applies them."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    if not os.path.exists(path):
        raise SystemExit(f"gpunode: no inventory file {path}")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    overrides = override_data(data)
    with ctx_state.use(State()):
        return make_inventory(path, cwd=os.getcwd(), override_data=overrides or None)


def cmd_validate(args: argparse.Namespace) -> int:
    inventory = load_inventory(args.inventory, args.data)
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

    inventory = load_inventory(args.inventory, args.data)
    try:
        total = len(select_hosts(inventory, args.limit))
        result = run_drift(
            inventory,
            args.inventory,
            args.limit,
            stderr_progress(total),
            args.dcgm_diag,
            host_timeout_s=args.host_timeout,
        )
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
    if args.drain and not drain_for_drift(args, inventory, result):
        unwritten += 1
    return max(result.exit_code, 2) if unwritten else result.exit_code


def drain_for_drift(args: argparse.Namespace, inventory: object, result: object) -> bool:
    """``--drain critical``: drain the scheduler nodes with critical findings, resume those
    gpunode drained for drift that are clean now; False if the scheduler could not be asked.
    What it did goes to stderr (stdout holds the report)."""
    from gpunode.drift import drain
    from gpunode.drift.findings import DriftResult
    from gpunode.scheduler import SchedulerError

    assert isinstance(result, DriftResult)
    fleet = fleet_of(inventory, args.inventory)
    scheduled = [name for name in result.checked_hosts if fleet.for_host(name).slurm.enabled]
    if not scheduled:
        return True
    try:
        scheduler = scheduler_from(args)
        status = scheduler.status(scheduled)
        for line in drain.apply(scheduler, drain.plan(result, scheduled, status.nodes)):
            print(f"gpunode drift --drain: {line}", file=sys.stderr)
    except SchedulerError as error:
        print(f"gpunode drift --drain: {clean_text(str(error), 1000)}", file=sys.stderr)
        return False
    return True


def scheduler_from(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """Slurm's commands on this machine, or over SSH on the host ``--scheduler-ssh`` names
    (run there with ``sudo -n``: draining takes Slurm's operator rights)."""
    import shlex
    import subprocess

    from gpunode.scheduler import SlurmScheduler, local_runner, shell_runner

    if not args.scheduler_ssh:
        return SlurmScheduler(local_runner())
    ssh = ["ssh", "-o", "BatchMode=yes", *shlex.split(args.scheduler_ssh)]

    def execute(line: str) -> tuple[int, str, str]:
        try:
            done = subprocess.run(
                [*ssh, f"sudo -n {line}"], capture_output=True, text=True, timeout=120
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return 255, "", f"ssh: {error}"
        return done.returncode, done.stdout, done.stderr

    return SlurmScheduler(shell_runner(execute))


def cmd_rollout(args: argparse.Namespace) -> int:
    from gpunode import rollout
    from gpunode.drift import select_hosts

    inventory = load_inventory(args.inventory)
    try:
        fleet = fleet_of(inventory, args.inventory)
        hosts = select_hosts(inventory, args.limit)
    except InvalidInventory as error:
        print(str(error), file=sys.stderr)
        return rollout.EXIT_ERROR
    if not os.path.isfile(args.deploy):
        print(f"gpunode rollout: no deploy file {args.deploy}", file=sys.stderr)
        return rollout.EXIT_ERROR
    path = Path(args.state or rollout.default_state_path(args.inventory, args.deploy, args.limit))
    nodes = [(host.name, fleet.for_host(host.name).slurm.enabled) for host in hosts]
    # Taken before the state is read: a second rollout of this inventory (or of this state
    # file) refuses to start, naming the one running; --dry changes nothing and takes none.
    lock = rollout.RolloutLock([path.with_name(path.name + ".lock"),
                                rollout.inventory_lock_path(args.inventory)])  # fmt: skip
    try:
        if not args.dry:
            lock.acquire()
            for stale in lock.stale:
                print(f"gpunode rollout: {stale}", file=sys.stderr)
        return rollout_under_lock(args, fleet, path, nodes)
    except (rollout.RolloutError, OSError) as error:
        print(f"gpunode rollout: {clean_text(str(error), 1000)}", file=sys.stderr)
        return rollout.EXIT_ERROR
    finally:
        lock.release()


def rollout_under_lock(
    args: argparse.Namespace, fleet: Fleet, path: Path, nodes: list[tuple[str, bool]]
) -> int:
    """The rollout itself, once ``cmd_rollout`` holds its lock (or for ``--dry``)."""
    import signal

    from gpunode import rollout
    from gpunode.drift import dcgm_hosts
    from gpunode.drift.output import write_atomically
    from gpunode.scheduler import SchedulerError

    try:
        state = None
        if path.exists():
            state = rollout.RolloutState.from_json(path.read_text())
            if state.outcome == "complete":
                state = None  # a finished rollout: this is a new one
            elif (state.inventory, state.deploy) != (args.inventory, args.deploy):
                raise rollout.RolloutError(
                    f"{path} holds unfinished rollout {state.id} of {state.inventory} "
                    f"{state.deploy}: finish it, or give another --state"
                )
            else:
                outcome = clean_text(state.outcome, 40)
                print(f"rollout {state.id}: going on from {path} ({outcome})")
        if state is None:
            state = rollout.new_state(args.inventory, args.deploy, nodes, args.batch, args.canary)
        scheduled = any(record.scheduled for record in state.nodes.values())
        scheduler = scheduler_from(args) if scheduled else None
        if args.dry:
            status = jobs = None
            if scheduler is not None:
                names = [name for name, record in state.nodes.items() if record.scheduled]
                status = scheduler.status(names).nodes
                jobs = {name: scheduler.running_jobs(name) for name in names if name in status}
            print(rollout.dry_plan(state, status, jobs or {}), end="")
            return rollout.EXIT_COMPLETE

        def save(current: rollout.RolloutState) -> None:
            write_atomically(path, current.to_json())

        def terminate(signum: int, frame: object) -> None:
            raise rollout.Interrupted(f"signal {signum}")

        signal.signal(signal.SIGTERM, terminate)
        save(state)
        print(f"rollout {state.id}: state in {path}")
        run = rollout.Rollout(
            state,
            scheduler,
            rollout.PyinfraNodes(
                args.inventory,
                args.deploy,
                dcgm_diag_level=args.dcgm_diag,
                dcgm_nodes=frozenset(dcgm_hosts(fleet, list(state.nodes))),
            ),
            save,
            max_failures=args.max_failures,
            job_timeout_s=args.job_timeout,
            return_timeout_s=args.return_timeout,
            poll_s=args.poll,
        )
        code = run.run(has_canary=args.canary > 0)
    except (rollout.RolloutError, SchedulerError, OSError) as error:
        print(f"gpunode rollout: {clean_text(str(error), 1000)}", file=sys.stderr)
        return rollout.EXIT_ERROR
    print(rollout.summary_table(state), end="")
    return code


def dcgm_diag_level(text: str) -> int:
    """``--dcgm-diag``: 1, 2, quick or medium (facts.dcgm.diag_level)."""
    # Parsed before any inventory is loaded: the checkout's facts/ as load_inventory finds it.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    from facts.dcgm import diag_level

    try:
        return diag_level(int(text) if text.strip().isdigit() else text.strip())
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds, more than 0, at most 86400")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpunode", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    validate = commands.add_parser("validate", help="check an inventory's desired state")
    validate.add_argument("inventory")
    validate.add_argument("--data", action="append", metavar="KEY=VALUE", help=DATA_HELP)
    validate.set_defaults(func=cmd_validate)

    defaults = commands.add_parser("defaults", help="print every setting with its default")
    defaults.set_defaults(func=cmd_defaults)

    drift = commands.add_parser(
        "drift",
        help="compare every host with the inventory (exit 0 clean, 1 drift, 2 not checked)",
    )
    drift.add_argument("inventory")
    drift.add_argument("--limit", help="hosts or groups, comma-separated")
    drift.add_argument("--data", action="append", metavar="KEY=VALUE", help=DATA_HELP)
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
    drift.add_argument(
        "--dcgm-diag", type=dcgm_diag_level, metavar="LEVEL",
        help="also run DCGM's diagnostic (dcgmi diag -r LEVEL -j; 1 or quick, 2 or medium) on "
        "the hosts that declare DCGM; a failed test is a critical finding dcgm.diag:<test>",
    )  # fmt: skip
    drift.add_argument(
        "--host-timeout", type=positive_seconds, metavar="S",
        help="the longest a host may take to answer (default 300; --dcgm-diag's own 1200): "
        "one that has not answered by then is not checked, the others are",
    )  # fmt: skip
    drift.add_argument(
        "--drain", choices=["critical"],
        help="drain scheduler nodes with critical findings (reason 'gpunode: drift <ids>') and "
        "resume those gpunode drained for drift once clean; never a drain of anyone else's nor a "
        "DOWN, FAIL or FAILING node",
    )  # fmt: skip
    drift.add_argument(
        "--scheduler-ssh", metavar="SSH_ARGS",
        help="with --drain: Slurm's commands over SSH with these arguments (sudo -n there)",
    )  # fmt: skip
    drift.set_defaults(func=cmd_drift)

    from gpunode.rollout import EXIT_CODES

    roll = commands.add_parser(
        "rollout",
        help="apply a deploy batch by batch: drain, converge, health gate, resume",
        description="Batch by batch (the canary batch first): drain the nodes in the scheduler, "
        "wait for their jobs, converge them, check them with the drift check (no critical "
        "finding), resume those that pass. A node drained by anyone else, or DOWN, FAIL or "
        "FAILING, is left alone; one rollout of an inventory at a time. "
        "Interrupted, the same command goes on where it stopped.",
        epilog="exit status: "
        + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items()),
    )
    roll.add_argument("inventory")
    roll.add_argument("deploy")
    roll.add_argument("--batch", type=int, default=1, help="nodes per batch (default 1)")
    roll.add_argument("--canary", type=int, default=0, help="nodes in a first batch of their own")
    roll.add_argument(
        "--max-failures", type=int, default=0,
        help="stop once more nodes than this failed (default 0: the first failure stops it)",
    )  # fmt: skip
    roll.add_argument(
        "--job-timeout", type=float, default=3600, metavar="S",
        help="seconds to wait for a drained node's jobs; then it is resumed and left out",
    )  # fmt: skip
    roll.add_argument(
        "--return-timeout", type=float, default=900, metavar="S",
        help="seconds a converged (rebooted) node has to answer and be checked",
    )  # fmt: skip
    roll.add_argument("--poll", type=float, default=5, metavar="S", help=argparse.SUPPRESS)
    roll.add_argument(
        "--dcgm-diag", type=dcgm_diag_level, metavar="LEVEL",
        help="the health gate also runs DCGM's diagnostic (1 or quick, 2 or medium) where the "
        "inventory declares DCGM; the others skip it (said in the summary)",
    )  # fmt: skip
    roll.add_argument("--limit", help="hosts or groups, comma-separated")
    roll.add_argument("--dry", action="store_true", help="print the batches and plan only")
    roll.add_argument("--state", metavar="PATH", help="the rollout's state file")
    roll.add_argument(
        "--scheduler-ssh", metavar="SSH_ARGS",
        help="run Slurm's commands over SSH with these arguments (options and the "
        "controller, e.g. 'admin@slurmctl'), with sudo -n; default: on this machine",
    )  # fmt: skip
    roll.set_defaults(func=cmd_rollout)

    for plugin in entry_points(group=COMMAND_PLUGINS):
        plugin.load()(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

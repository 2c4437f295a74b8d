"""gpunode command line: validate an inventory, print its defaults, check drift, roll a deploy
out batch by batch, check the control host (doctor), and triage a support bundle's files.

More sub-commands come from ``gpunode.commands`` entry points (``COMMAND_PLUGINS``): each is a
function given argparse's sub-parsers, adding its own. Test equipment plugs in that way.
"""

from __future__ import annotations

import sys

if sys.argv[1:2] in (["drift"], ["doctor"]):
    # pyinfra reaches hosts in parallel through gevent, which must patch sockets and ssl
    # before anything imports them (as the pyinfra CLI itself does first thing).
    from gevent import monkey

    monkey.patch_all()

import argparse
import json
import os
from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import NoReturn

from gpunode.control.checkout import find_checkout, use_checkout
from gpunode.control.exits import (
    EXIT_CLOSED_PIPE,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    ConfigurationError,
    epilog,
    plural,
    report_error,
    silence_stdout,
)
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
            raise ConfigurationError(f"--data {pair!r}: not KEY=VALUE")
        data[key] = parse_cli_arg(value)
    return data


DATA_HELP = (
    "override a data key on every host, as pyinfra's --data does (JSON values), to check "
    "what a deploy run with the same overrides made; repeatable"
)


def load_inventory(path: str, data: list[str] | None = None):  # type: ignore[no-untyped-def]
    """Load an inventory the way the pyinfra CLI does (group_data beside it included), with
    ``--data`` overrides applied to every host as pyinfra applies them. ``facts`` and
    ``roles`` are imported from the inventory's checkout, wherever gpunode runs from.
    ConfigurationError (exit status 2) for an inventory that is missing, unreadable or
    cannot be loaded."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    if not os.path.exists(path):
        raise ConfigurationError(f"no inventory file {path}")
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise ConfigurationError(f"inventory {path} is not a readable file")
    use_checkout(find_checkout(path))
    overrides = override_data(data)
    try:
        with ctx_state.use(State()):
            return make_inventory(path, cwd=os.getcwd(), override_data=overrides or None)
    except SystemExit as stop:  # an inventory that refuses itself (no nodes to list yet)
        if stop.code in (None, 0):
            raise
        raise ConfigurationError(f"inventory {path}: {stop.code}") from None
    except Exception as error:  # the inventory is Python: any error in it is the operator's
        raise ConfigurationError(
            f"inventory {path} cannot be loaded: {load_error(error)}"
        ) from None


def load_error(error: BaseException) -> str:
    """What went wrong loading an inventory, in one line: the error the inventory's own code
    raised (pyinfra wraps it), with the line of the inventory where it was raised."""
    import traceback

    from pyinfra.api.exceptions import PyinfraError

    if isinstance(error, PyinfraError):
        return str(error)
    inner = getattr(error, "exception", None)  # pyinfra_cli's UnexpectedExternalError
    if isinstance(inner, BaseException):
        frames = traceback.extract_tb(getattr(inner, "_traceback", None) or inner.__traceback__)
        line = f" (line {frames[-1].lineno})" if frames else ""
        return f"{type(inner).__name__}: {inner}{line}"
    message = getattr(error, "message", None)  # click's exceptions: CliError
    return str(message) if isinstance(message, str) else f"{type(error).__name__}: {error}"


def valid_fleet(inventory: object, path: str) -> Fleet:
    """The inventory's validated fleet; its problems are a ConfigurationError (exit 2)."""
    try:
        return fleet_of(inventory, path)
    except InvalidInventory as error:
        raise ConfigurationError(str(error)) from None


def cmd_validate(args: argparse.Namespace) -> int:
    inventory = load_inventory(args.inventory, args.data)
    try:
        fleet = fleet_of(inventory, args.inventory)
    except InvalidInventory as error:
        if args.json:
            document = {"inventory": args.inventory, "valid": False, "problems": error.lines}
            print(json.dumps({**document, "exit_code": EXIT_USAGE}, indent=2))
        print(str(error), file=sys.stderr)
        return EXIT_USAGE
    notes = [note for name in fleet.hosts for note in fleet.notes.get(name, [])]
    if args.json:
        document = {"inventory": args.inventory, "valid": True, "hosts": list(fleet.hosts)}
        print(json.dumps({**document, "notes": notes, "exit_code": 0}, indent=2))
        return 0
    print(f"{args.inventory}: {plural(len(fleet.hosts), 'host')}, desired state valid")
    for note in notes:
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
    level = dcgm_diag_level(args.dcgm_diag)
    try:
        total = len(select_hosts(inventory, args.limit))
        result = run_drift(
            inventory,
            args.inventory,
            args.limit,
            stderr_progress(total),
            level,
            host_timeout_s=args.host_timeout,
        )
    except InvalidInventory as error:
        raise ConfigurationError(str(error)) from None
    if args.baseline:
        apply_baseline(result, args.baseline)
    unwritten = 0
    # Validated once for both: every host's desired state is built from it.
    fleet = valid_fleet(inventory, args.inventory) if args.drain or args.remedy else None
    if fleet is not None and args.drain and not drain_for_drift(args, fleet, result):
        unwritten += 1
    if fleet is not None and args.remedy and not remedy_for_drift(args, fleet, result):
        unwritten += 1
    reports = [
        (args.junit, render_junit),
        (args.prometheus, render_prometheus),
        (args.write_baseline, render_json),
    ]
    for path, render in reports:
        if not path:
            continue
        try:
            write_atomically(path, render(result))
        except OSError as error:  # one report that cannot be written must not cost the others
            print(f"gpunode drift: cannot write {path}: {error}", file=sys.stderr)
            unwritten += 1
    if args.json:
        print(render_json(result))  # one document, ended by a newline as a text file is
    else:
        print(render_table(result), end="")
    return max(result.exit_code, EXIT_USAGE) if unwritten else result.exit_code


def cmd_triage(args: argparse.Namespace) -> int:
    from gpunode.drift.output import render_json, render_table
    from gpunode.triage import Unreadable, triage

    try:
        done = triage(args.files)
    except Unreadable as error:
        raise ConfigurationError(str(error)) from None
    for entry in done.inputs():
        read = "; ".join(entry["read"]) or "nothing triage judges"
        skipped = (
            f" ({entry['not_judged']} other sections not judged)" if entry["not_judged"] else ""
        )
        line = clean_text(f"{entry['file']}: {entry['kind']}: read {read}{skipped}", 2000)
        print(f"gpunode triage: {line}", file=sys.stderr)
    if args.json:
        document = json.loads(render_json(done.result))
        document["inputs"] = done.inputs()
        print(json.dumps(document, indent=2))
    else:
        print(render_table(done.result), end="")
    return done.result.exit_code


def cmd_doctor(args: argparse.Namespace) -> int:
    """What the control host lacks: exit 0 when a deploy can start (warnings allowed), 1 on a
    problem, 2 when the inventory given cannot be loaded or is invalid."""
    from gpunode.control import doctor

    checks = doctor.control_host_checks(Path.cwd())
    if args.inventory:
        try:
            inventory = load_inventory(args.inventory)
            valid_fleet(inventory, args.inventory)
        except ConfigurationError:
            if not args.json:  # what was found so far, then the error (main prints it)
                print("\n".join(check.line() for check in checks))
            raise
        checks += doctor.inventory_checks(inventory, args.inventory, args.timeout, args.limit)
    code = 1 if any(check.status == doctor.PROBLEM for check in checks) else 0
    if args.json:
        document = {"checks": [check.as_dict() for check in checks], "exit_code": code}
        print(json.dumps(document, indent=2))
    else:
        print("\n".join(check.line() for check in checks))
        print(doctor.verdict(checks))
    return code


def drain_for_drift(args: argparse.Namespace, fleet: Fleet, result: object) -> bool:
    """``--drain critical``: drain the scheduler nodes with critical findings, resume those
    gpunode drained for drift that are clean now; False if the scheduler could not be asked.
    What it did goes to stderr (stdout holds the report)."""
    from gpunode.drift import drain
    from gpunode.drift.findings import DriftResult
    from gpunode.scheduler import SchedulerError

    assert isinstance(result, DriftResult)
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


def remedy_for_drift(args: argparse.Namespace, fleet: Fleet, result: object) -> bool:
    """``--remedy``: carry out the health remedies the inventory lets gpunode carry out
    (``health.actions``), on nodes without running jobs, within the rate limit; record each
    in the report and the history. False if the history or the scheduler could not be used
    (nothing is carried out then). What it did goes to stderr (stdout holds the report)."""
    import time

    from gpunode.drift.findings import DriftResult
    from gpunode.fleet import remedies
    from gpunode.scheduler import SchedulerError

    assert isinstance(result, DriftResult)
    path = Path(args.remedy_history or remedies.default_history_path(args.inventory))
    try:
        history = remedies.History.load(path)
    except remedies.HistoryError as error:
        print(f"gpunode drift --remedy: {clean_text(str(error), 1000)}", file=sys.stderr)
        result.remedies = []
        return False
    hosts_to_act = {
        finding.host
        for finding in result.findings
        if remedies.candidates([finding], fleet.for_host(finding.host).health)
    }
    scheduled: dict[str, list[str] | str] = {}
    slurm_hosts = sorted(h for h in hosts_to_act if fleet.for_host(h).slurm.enabled)
    if slurm_hosts:
        try:
            scheduler = scheduler_from(args)
            status = scheduler.status(slurm_hosts).nodes
            for host in slurm_hosts:
                node = status.get(host)
                if node is None:
                    scheduled[host] = "the scheduler does not know the node"
                elif node.held_by_someone_else:
                    scheduled[host] = f"someone else took the node out ({node.state}): theirs"
                elif not node.drained:
                    scheduled[host] = (
                        f"the node takes jobs ({node.state}): it is reset once drained and idle "
                        "(gpunode drift --drain critical drains it; a later check acts)"
                    )
                else:
                    scheduled[host] = scheduler.running_jobs(host)
        except SchedulerError as error:
            for host in slurm_hosts:
                scheduled.setdefault(
                    host, f"the scheduler cannot be asked: {clean_text(str(error), 300)}"
                )
    now = time.time()
    decided = remedies.plan(result, lambda host: fleet.for_host(host).health, scheduled,
                            history, now)  # fmt: skip
    done = []
    for remedy in decided:
        if not remedy.withheld:
            remedy = remedies.carry_out(remedy, args.inventory)
            history.record(remedy, now)
        done.append(remedy)
        print(f"gpunode drift --remedy: {remedy.line()}", file=sys.stderr)
    result.remedies = [remedy.as_dict() for remedy in done]
    longest = max((fleet.for_host(r.host).health.action_window_hours for r in done), default=24)
    try:
        if any(not remedy.withheld for remedy in done):
            history.save(keep_since=now - longest * 3600)
    except remedies.HistoryError as error:
        print(f"gpunode drift --remedy: {clean_text(str(error), 1000)}", file=sys.stderr)
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
    args.dcgm_diag_level = dcgm_diag_level(args.dcgm_diag)
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
                dcgm_diag_level=args.dcgm_diag_level,
                dcgm_nodes=frozenset(dcgm_hosts(fleet, list(state.nodes))),
                config=str(find_checkout(args.deploy) / "config.py"),
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


def dcgm_diag_level(text: str | None) -> int | None:
    """``--dcgm-diag``: 1, 2, quick or medium (facts.dcgm.diag_level), read once the
    inventory's checkout (its facts/) is on the path."""
    if text is None:
        return None
    from facts.dcgm import diag_level

    try:
        return diag_level(int(text) if text.strip().isdigit() else text.strip())
    except ValueError as error:
        raise ConfigurationError(f"--dcgm-diag: {error}") from None


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds, more than 0, at most 86400")
    return value


INVENTORY_HELP = (
    "the pyinfra inventory file (e.g. inventories/prod.py), from any directory: facts and roles "
    "come from the checkout that holds it"
)
JSON_HELP = "one JSON document on stdout instead of text, errors included"


class Parser(argparse.ArgumentParser):
    """argparse, its usage errors kept to the contract: exit status 2, and with ``--json``
    a JSON document on stdout too."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise ConfigurationError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="gpunode",
        description=__doc__.split("\n\n")[0],
        epilog=epilog() + ". Every command's --help says what its own statuses mean.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = commands.add_parser(
        "validate", help="check an inventory's desired state, touch nothing", epilog=epilog()
    )
    validate.add_argument("inventory", help=INVENTORY_HELP)
    validate.add_argument("--data", action="append", metavar="KEY=VALUE", help=DATA_HELP)
    validate.add_argument("--json", action="store_true", help=JSON_HELP)
    validate.set_defaults(func=cmd_validate)

    defaults = commands.add_parser(
        "defaults", help="print every setting with its default", epilog=epilog()
    )
    defaults.set_defaults(func=cmd_defaults)

    drift = commands.add_parser(
        "drift",
        help="compare every host with the inventory (exit 0 clean, 1 drift or hosts not "
        "checked, 2 usage or configuration error)",
        epilog=epilog({0: "no drift", 1: "drift found, or hosts that could not be checked"}),
    )
    drift.add_argument("inventory", help=INVENTORY_HELP)
    drift.add_argument("--limit", help="hosts or groups, comma-separated")
    drift.add_argument("--data", action="append", metavar="KEY=VALUE", help=DATA_HELP)
    drift.add_argument("--json", action="store_true", help=JSON_HELP)
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
        "--dcgm-diag", metavar="LEVEL",
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
        help="with --drain or --remedy: Slurm's commands over SSH with these arguments (sudo -n "
        "there)",
    )  # fmt: skip
    drift.add_argument(
        "--remedy", action="store_true",
        help="carry out the remedies health.actions lets gpunode carry out (a GPU reset), only "
        "on nodes without running jobs (a Slurm node once drained and idle) and at most "
        "health.action_limit per node within health.action_window_hours; each is in the "
        "report ('remedies'), the Prometheus file and on stderr",
    )  # fmt: skip
    drift.add_argument(
        "--remedy-history", metavar="FILE",
        help="with --remedy: the history the rate limit counts in (default: one per inventory "
        "under $XDG_STATE_HOME/gpunode)",
    )  # fmt: skip
    drift.set_defaults(func=cmd_drift)

    triage = commands.add_parser(
        "triage",
        help="judge a support bundle's files offline, as the drift check judges a node: "
        "nvidia-smi -q -x or -q, nvlink -s, ibstat, a kernel log, dcgmi diag -j, "
        "nvidia-bug-report.log.gz (no inventory, no SSH)",
        description="The files of one node, each told by its content; the same failure "
        "classes, evidence and remedies as gpunode drift.",
        epilog=epilog({0: "nothing found", 1: "findings (warning or critical)",
                       2: "a file that cannot be read (named), or a usage error"}),
    )  # fmt: skip
    triage.add_argument("files", nargs="+", metavar="FILE", help="a file of the bundle")
    triage.add_argument("--json", action="store_true", help=JSON_HELP)
    triage.set_defaults(func=cmd_triage)

    doctor = commands.add_parser(
        "doctor",
        help="what this control host lacks before a deploy: Python, pyinfra, the post-quantum "
        "key exchange, PATH, and with an inventory its SSH keys and which hosts answer",
        epilog=epilog({0: "ready (warnings allowed)", 1: "a problem a deploy would fail on"}),
    )
    doctor.add_argument(
        "inventory", nargs="?", help=INVENTORY_HELP + "; without one, the control host alone"
    )
    doctor.add_argument("--limit", help="hosts or groups, comma-separated")
    doctor.add_argument(
        "--timeout", type=positive_seconds, default=3.0, metavar="S",
        help="how long each host has to answer on its SSH port (default 3)",
    )  # fmt: skip
    doctor.add_argument("--json", action="store_true", help=JSON_HELP)
    doctor.set_defaults(func=cmd_doctor)

    from gpunode.rollout import EXIT_CODES

    roll = commands.add_parser(
        "rollout",
        help="apply a deploy batch by batch: drain, converge, health gate, resume",
        description="Batch by batch (the canary batch first): drain the nodes in the scheduler, "
        "wait for their jobs, converge them, check them with the drift check (no critical "
        "finding), resume those that pass. A node drained by anyone else, or DOWN, FAIL or "
        "FAILING, is left alone; one rollout of an inventory at a time. "
        "Interrupted, the same command goes on where it stopped.",
        epilog=epilog(EXIT_CODES),
    )
    roll.add_argument("inventory", help=INVENTORY_HELP)
    roll.add_argument("deploy", help="the deploy file to apply (e.g. deploys/gpu_node.py)")
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
        "--dcgm-diag", metavar="LEVEL",
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


def quiet_hub_interrupts() -> None:
    """Ctrl-C while pyinfra's gevent hub waits is raised in the main greenlet, where ``main``
    reports it in one line; the hub would first print it with a timestamp of its own."""
    from gevent import get_hub

    hub = get_hub()
    if KeyboardInterrupt not in hub.NOT_ERROR:
        hub.NOT_ERROR = (*hub.NOT_ERROR, KeyboardInterrupt)


def commands_of(parser: argparse.ArgumentParser) -> list[list[str]]:
    """Each sub-command's name, as a one-item argument list."""
    return [
        [name]
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status follows the contract (``gpunode.control.exits``)
    whatever happens: a closed pipe and Ctrl-C end it without a traceback, every ``finally``
    (locks) run first."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in arguments
    quiet_hub_interrupts()
    parser = build_parser()
    command = (
        " ".join(["gpunode", *arguments[:1]]) if arguments[:1] in commands_of(parser) else "gpunode"
    )
    try:
        args = parser.parse_args(arguments)
        code = int(args.func(args))
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
        return code
    except ConfigurationError as error:
        return report_error(command, str(error), EXIT_USAGE, as_json)
    except KeyboardInterrupt:
        return report_error(command, "interrupted", EXIT_INTERRUPTED, as_json)
    except BrokenPipeError:
        silence_stdout()
        return EXIT_CLOSED_PIPE


if __name__ == "__main__":
    sys.exit(main())

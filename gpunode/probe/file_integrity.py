"""File integrity on the node: AIDE's checks, each difference explained or kept as an alert.

Installed by ``roles.audit`` on the node and run there as root, with the standard library
alone (like the GPU probe). AIDE's database is always the state after the last check:
every check is ``aide --update``, whose new database replaces the old one, so each change is
reported once. What a change is reported as:

- ``gpunode-run``: made during a gpunode run that changed the node. The run's last step,
  ``adopt --since T`` (T: the node's clock when the run read its facts, before it changed
  anything), takes into the database what changed after T: the run's files, its packages,
  what their maintainer scripts wrote. A file's ctime says when it last changed, and only
  the kernel sets it. A file removed leaves only its directory's ctime, which the run's own
  writes there move past T too: so the run reads, at T, which watched directories had
  changed since the last check (``changed-dirs``), and a removal is the run's only in a
  directory that had not, and has changed since T. What changed before T is classified as
  by a nightly check, so a run never takes in unseen what it did not do.
- ``package``: a file dpkg owns whose contents still match the package's md5sums
  (``dpkg --verify``), or a file gone while dpkg was busy since the last check (an upgrade
  by unattended-upgrades).
- anything else is an **alert**, kept in the summary until an operator accepts it
  (``accept``), so that a later check, or a gpunode run, never hides it.

The summary (JSON, written atomically) is what the drift check reads.

    file_integrity.py --config CONF --state DIR init | check | accept
    file_integrity.py --config CONF --state DIR changed-dirs
    file_integrity.py --config CONF --state DIR adopt --since T [--changed-before-run DIR ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

SUMMARY = "summary.json"
DATABASE = "aide.db"
NEW_DATABASE = "aide.db.new"
# How many alerts the summary keeps (the oldest first): a node rewritten wholesale must not
# fill the disk or the drift report; the count says how many there were.
MAX_ALERTS = 500
# AIDE's exit status is a bit field (aide(1), "DIAGNOSTICS"): 1 added, 2 removed, 4 changed;
# 14 and above are errors.
AIDE_DIFFERENCES = range(0, 8)
NOT_JSON = -1
DPKG_LOG = "/var/log/dpkg.log"
# The rule name gpunode's configuration gives its watched paths (gpunode.expected.audit.RULE).
WATCH_RULE = "GpunodeIntegrity"
# How many directories changed before a run ``changed-dirs`` names; past it, the run cannot
# tell which removals are its own and none is (the adopt step gets no list).
MAX_CHANGED_DIRS = 200


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=False)


def read_summary(state: Path) -> dict[str, Any]:
    try:
        summary = json.loads((state / SUMMARY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"alerts": [], "alert_count": 0}
    return summary if isinstance(summary, dict) else {"alerts": [], "alert_count": 0}


def write_summary(state: Path, summary: dict[str, Any]) -> None:
    temporary = state / f".{SUMMARY}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(temporary, 0o644)
    os.replace(temporary, state / SUMMARY)


def aide(config: str, command: str) -> tuple[int, dict[str, Any], str]:
    """Run ``aide --<command>`` with the JSON report on stdout: exit status, report, errors."""
    # Before the configuration is read: report_format applies to the report_url lines after it.
    completed = run(["aide", f"--config={config}", "-B", "report_format=json", f"--{command}"])
    parsed = parse_report(completed.stdout)
    if parsed["state"] != "ok":
        return NOT_JSON, {}, parsed["reason"]
    return completed.returncode, parsed["report"], completed.stderr


def parse_report(text: str) -> dict[str, Any]:
    """AIDE's JSON report -> ``{"state": "ok", "report": ..., "entries": [(kind, path)]}``,
    or ``{"state": "unreadable", "reason": ...}`` when it is not a JSON object."""
    command = "aide --check (JSON report)"
    try:
        report = json.loads(text)
    except ValueError as error:
        reason = f"AIDE's report is not JSON ({error}): {text[:200]!r}"
        return {"state": "unreadable", "command": command, "reason": reason}
    if not isinstance(report, dict):
        return {"state": "unreadable", "command": command, "reason": "not a JSON object"}
    return {"state": "ok", "command": command, "report": report, "entries": differences(report)}


def differences(report: dict[str, Any]) -> list[tuple[str, str]]:
    """(kind, path) of each entry AIDE's JSON report lists as added, removed or changed."""
    found = []
    for kind in ("added", "removed", "changed"):
        entries = report.get(kind) or {}
        if isinstance(entries, dict):
            found += [(kind, str(path)) for path in entries]
    return sorted(found, key=lambda item: item[1])


def dpkg_busy_since(moment: float) -> bool:
    """Whether dpkg installed, upgraded or removed anything after ``moment`` (epoch)."""
    try:
        return os.stat(DPKG_LOG).st_mtime > moment
    except OSError:
        return False


def package_consistent(path: str, verified: dict[str, set[str]]) -> bool:
    """Whether dpkg owns ``path`` and its package's md5sums still match it.

    ``verified`` caches, per package, the files ``dpkg --verify`` found changed.
    """
    owners = run(["dpkg-query", "-S", path])
    if owners.returncode != 0:
        return False
    packages: set[str] = set()
    for line in owners.stdout.splitlines():
        names, separator, owned = line.partition(": ")
        if separator and owned.strip() == path:
            packages.update(name.strip().split(":")[0] for name in names.split(","))
    if not packages:
        return False  # only a directory diversion or a parent matched
    for package in packages:
        if package not in verified:
            report = run(["dpkg", "--verify", package])
            # "??5??????   /usr/bin/x" or "??5?????? c /etc/x": the path is the last word.
            verified[package] = {line.split()[-1] for line in report.stdout.splitlines() if line}
        if path in verified[package]:
            return False
    return True


def by_package(kind: str, path: str, dpkg_busy: bool, verified: dict[str, set[str]]) -> bool:
    """Whether a package explains the change: a file gone while dpkg was busy (an upgrade
    dropped it), or a file dpkg owns whose md5sum is still the package's."""
    if kind == "removed":
        return dpkg_busy
    return os.path.isfile(path) and package_consistent(path, verified)


def watched_paths(config: str) -> list[str]:
    """The paths gpunode's AIDE configuration watches (``<regex> GpunodeIntegrity`` lines)."""
    paths = []
    with open(config, encoding="utf-8", errors="surrogateescape") as handle:
        for line in handle:
            selection, _, rule = line.strip().rpartition(" ")
            if rule == WATCH_RULE and selection.startswith("/"):
                paths.append(re.sub(r"\\(.)", r"\1", selection))  # gpunode's escaping undone
    return paths


def changed_directories(watched: list[str], database: Path) -> list[str] | None:
    """The watched directories whose ctime is past the database's (the last check): a
    removal there may have happened before now. None when there are more than
    MAX_CHANGED_DIRS, or the database cannot be read."""
    try:
        checked = os.stat(database).st_mtime
    except OSError:
        return None
    changed: list[str] = []
    for top in watched:
        for directory, _, _ in os.walk(top):  # never into a linked directory
            try:
                if os.lstat(directory).st_ctime > checked:
                    changed.append(directory)
            except OSError:
                continue  # gone while walked: its parent changed, and is listed
            if len(changed) > MAX_CHANGED_DIRS:
                return None
    return changed


def changed_since(
    kind: str, path: str, since: float, changed_before_run: frozenset[str] | None
) -> bool:
    """Whether the entry last changed at or after ``since``. A changed or added entry: its
    ctime. A removed one: its directory changed since ``since`` and had not changed between
    the last check and ``since`` (``changed_before_run``; None: unknown, so never the run's),
    so the entry was still there when the run began."""
    if kind == "removed":
        directory = os.path.dirname(path)
        if changed_before_run is None or directory in changed_before_run:
            return False
        target = directory
    else:
        target = path
    try:
        return os.lstat(target).st_ctime >= since
    except OSError:
        return False


def classify(
    found: list[tuple[str, str]],
    database_time: float,
    since: float | None = None,
    changed_before_run: frozenset[str] | None = None,
) -> tuple[list[dict[str, str]], dict[str, int]]:
    """Alerts (changes nothing explains) and the count of each explanation; with ``since``,
    what changed from then on is a gpunode run's (a removal only in a directory that had not
    changed before ``since``: ``changed_before_run``)."""
    verified: dict[str, set[str]] = {}
    alerts = []
    explained = {"package": 0, "gpunode-run": 0}
    dpkg_busy = dpkg_busy_since(database_time)
    for kind, path in found:
        if os.path.isdir(path) and kind == "changed":
            continue  # a directory's times change with its entries, which are listed
        if since is not None and changed_since(kind, path, since, changed_before_run):
            explained["gpunode-run"] += 1
        elif by_package(kind, path, dpkg_busy, verified):
            explained["package"] += 1
        else:
            alerts.append({"kind": kind, "path": path})
    return alerts, explained


def take_new_database(state: Path) -> None:
    os.replace(state / NEW_DATABASE, state / DATABASE)


def initialise(config: str, state: Path) -> int:
    if (state / DATABASE).exists():
        return 0
    status, report, errors = aide(config, "init")
    if status != 0 or not (state / NEW_DATABASE).exists():
        print(f"aide --init failed ({status}): {errors.strip()[:500]}", file=sys.stderr)
        return 1
    take_new_database(state)
    summary = read_summary(state)
    summary.update(initialised=now(), entries=(report.get("number_of_entries") or {}).get("total"))
    write_summary(state, summary)
    return 0


def update(
    config: str,
    state: Path,
    since: float | None,
    changed_before_run: frozenset[str] | None = None,
) -> int:
    """One check: AIDE's differences since the last, explained or added to the alerts."""
    database = state / DATABASE
    if not database.exists():
        return initialise(config, state)
    database_time = database.stat().st_mtime
    status, report, errors = aide(config, "update")
    summary = read_summary(state)
    moment = now()
    if status not in AIDE_DIFFERENCES or not (state / NEW_DATABASE).exists():
        summary.update(last_error=f"{moment} aide --update exited {status}: {errors[:500]}")
        write_summary(state, summary)
        print(f"aide --update failed ({status}): {errors.strip()[:500]}", file=sys.stderr)
        return 1
    alerts, explained = classify(differences(report), database_time, since, changed_before_run)
    for alert in alerts:
        alert["found"] = moment
    kept = list(summary.get("alerts") or []) + alerts
    summary.update(
        alerts=kept[:MAX_ALERTS],
        alert_count=int(summary.get("alert_count") or 0) + len(alerts),
        last_check=moment,
        last_check_kind="check" if since is None else "gpunode-run",
        last_explained=explained,
        entries=(report.get("number_of_entries") or {}).get("total") or summary.get("entries"),
        last_error=None,
    )
    take_new_database(state)
    write_summary(state, summary)
    return 0


def accept(state: Path) -> int:
    """An operator has looked at the alerts: clear them (the database already holds them)."""
    summary = read_summary(state)
    summary.update(alerts=[], alert_count=0, accepted=now())
    write_summary(state, summary)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpunode-file-integrity", description=__doc__)
    parser.add_argument("--config", required=True, help="gpunode's AIDE configuration")
    parser.add_argument("--state", required=True, help="directory of the database and summary")
    parser.add_argument(
        "--since", type=float, help="adopt: epoch seconds the gpunode run started at"
    )
    parser.add_argument(
        "--changed-before-run", nargs="*", metavar="DIR",
        help="adopt: the directories changed-dirs named when the run began; without it, no "
        "removal is the run's",
    )  # fmt: skip
    parser.add_argument("action", choices=("init", "check", "adopt", "accept", "changed-dirs"))
    arguments = parser.parse_args(argv)
    if arguments.action == "adopt" and arguments.since is None:
        parser.error("adopt needs --since")
    state = Path(arguments.state)
    if arguments.action == "changed-dirs":  # read only: run with the run's facts
        changed = changed_directories(watched_paths(arguments.config), state / DATABASE)
        print(json.dumps({"complete": changed is not None, "directories": changed or []}))
        return 0
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    if arguments.action == "init":
        return initialise(arguments.config, state)
    if arguments.action == "accept":
        return accept(state)
    if arguments.action == "check":
        return update(arguments.config, state, None)
    before = arguments.changed_before_run
    return update(
        arguments.config, state, arguments.since, None if before is None else frozenset(before)
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

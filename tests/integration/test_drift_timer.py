"""deploys/drift_timer.py installs the nightly drift check as a sandboxed systemd service run
by its own user, idempotently, and that service really runs `gpunode drift` in its sandbox.

The control host is usually an admin machine; here a lab node stands in for it. This
checkout (with its venv's packages, on the node's own Python) is staged on that node at the
path the deploy runs it from, so the unit the deploy writes runs gpunode from there, against
another lab node. That path is a lasting one, a bind mount of this checkout under /srv: the
deploy rightly refuses a checkout under /tmp (the sandboxed check gets a private /tmp), and
the suite must pass wherever it was cloned, /tmp included.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest

from gpunode.expected.timers import DRIFT_MEMORY_MAX_MIB
from lab import LOGIN_USER, Lab, LabNode

from .conftest import ROOT, PyinfraRun, run_pyinfra, ssh, write_inventory

pytestmark = pytest.mark.lab

DEPLOY = "deploys/drift_timer.py"
SERVICE = "gpunode-drift.service"
OUTPUT_DIR = "/var/lib/gpunode/drift"
TEXTFILE = "/var/lib/prometheus/node-exporter/gpunode_drift.prom"
DRIFT_SSH_DIR = "/var/lib/gpunode-drift/.ssh"
# Directories the deploy may make or change besides its own, deepest first.
TOUCHED = (
    "/var/lib/prometheus/node-exporter",
    "/var/lib/prometheus",
    "/var/lib/gpunode",
)
VENV_PACKAGES = ".venv/lib/python3.11/site-packages"
# Packages the drift check never imports (linters, test tools): left off the node.
UNSTAGED_PACKAGES = re.compile(
    r"(mypy|mypyc|pip|setuptools|hypothesis|pygments|_pytest|pytest|testinfra|ruff)\b"
    r"|.*__mypyc\."
)
# What `systemctl show` must report for the service (the sandbox as systemd applied it).
SANDBOX = {
    "User": "gpunode-drift",
    "Group": "gpunode-drift",
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "tmpfs",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "ProtectClock": "yes",
    "RestrictSUIDSGID": "yes",
    "RestrictRealtime": "yes",
    "LockPersonality": "yes",
    "MemoryDenyWriteExecute": "yes",
    "RestrictNamespaces": "yes",
    "CapabilityBoundingSet": "",
    "AmbientCapabilities": "",
    "UMask": "0077",
    "ReadWritePaths": f"{OUTPUT_DIR} /var/lib/prometheus/node-exporter",
    "MemoryMax": str(DRIFT_MEMORY_MAX_MIB << 20),
}
# systemd-analyze security's scale runs from 0 (locked down) to 10 (UNSAFE); a plain
# root service scores 9.6.
EXPOSURE_CEILING = 2.5


@dataclass
class ControlHost:
    node: LabNode
    checkout: Path  # where the deploy runs from, here and on the node
    target: LabNode
    inventory: str  # x_drift_inventory, relative to the checkout
    data: dict[str, str]


def staged_files(extra: list[str]) -> list[str]:
    """The checkout's files (tracked and not ignored), the venv's packages the check needs
    and its gpunode command, relative to the checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    names = [name for name in listed if (ROOT / name).is_file()]
    for entry in sorted((ROOT / VENV_PACKAGES).iterdir()):
        if not UNSTAGED_PACKAGES.match(entry.name) and entry.name != "__pycache__":
            names.append(f"{VENV_PACKAGES}/{entry.name}")
    return [*names, ".venv/bin/gpunode", *extra]


def first_missing_directory(lab: Lab, node: LabNode, path: PurePosixPath) -> str:
    """The outermost directory of ``path`` the node lacks: staging makes it, cleanup removes
    it, and nothing the node had before is touched (the checkout may live anywhere)."""
    candidates = [*reversed(path.parents), path][1:]  # without "/"
    found = ssh(
        lab, node, "for p in " + " ".join(shlex.quote(str(c)) for c in candidates)
        + '; do [ -e "$p" ] || { echo "$p"; break; }; done',
    ).stdout.strip()  # fmt: skip
    assert found, f"{path} already exists on {node.name}: the checkout cannot be staged there"
    return found


def root_ssh(lab: Lab, node: LabNode, script: str) -> subprocess.CompletedProcess:
    return ssh(lab, node, f"sudo sh -c {shlex.quote(script)}")


@pytest.fixture(scope="module")
def lasting_checkout() -> Iterator[Path]:
    """This checkout at a lasting path (/srv/gpunode-checkout-<random>, a bind mount of it),
    wherever it was cloned; unmounted and removed after the module."""
    path = Path("/srv") / f"gpunode-checkout-{secrets.token_hex(4)}"
    path.mkdir(parents=True)
    mounted = subprocess.run(["mount", "--bind", str(ROOT), str(path)], capture_output=True)
    assert mounted.returncode == 0, mounted.stderr
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)
        path.rmdir()


@pytest.fixture(scope="module")
def control_host(
    lab: Lab, lab_nodes: list[LabNode], lasting_checkout: Path
) -> Iterator[ControlHost]:
    node, target = lab_nodes[0], lab_nodes[-1]
    checkout = lasting_checkout
    top = first_missing_directory(lab, node, PurePosixPath(checkout))  # made here, removed after
    # What the deploy makes or changes, as it was: put back exactly so afterwards.
    ours = (top, OUTPUT_DIR, "/var/lib/gpunode-drift")
    found = root_ssh(
        lab, node, f"for p in {' '.join((*TOUCHED, *ours))}; do [ -e $p ] && "
        "stat -c '%n %U:%G %a' $p; done; true",
    ).stdout  # fmt: skip
    existing = {path: rest for path, rest in (line.split(" ", 1) for line in found.splitlines())}
    for path in ours:
        assert path not in existing, f"{path} already exists on {node.name}"
    inventory_file = lab.state_dir / f"drift-timer-{secrets.token_hex(4)}.py"
    target_data = {"ssh_hostname": target.address, "ssh_user": LOGIN_USER, "_sudo": True}
    inventory_file.write_text(f"lab_nodes = {[(target.name, target_data)]!r}\n")
    inventory = str(inventory_file.relative_to(ROOT))
    try:
        names = "\n".join(staged_files([inventory]))
        tar = subprocess.run(
            ["tar", "-C", str(ROOT), "--exclude=__pycache__", "-czf", "-", "-T", "-"],
            input=names.encode(),
            capture_output=True,
            check=True,
        )
        unpack = subprocess.run(
            [
                "ssh", "-i", str(lab.key_path), "-o", f"UserKnownHostsFile={lab.known_hosts_path}",
                "-o", "BatchMode=yes", f"{LOGIN_USER}@{node.address}",
                f"sudo mkdir -p {checkout} && sudo tar -xzf - -C {checkout}",
            ],
            input=tar.stdout,
            capture_output=True,
            timeout=300,
        )  # fmt: skip
        assert unpack.returncode == 0, unpack.stderr
        # A venv on the node's own Python; the checkout root's, readable by all, as a
        # checkout made with umask 022 is. The gpunode command names its interpreter by the
        # path the venv was made at; on the node, the venv is where the checkout is staged.
        prepare = (
            f"cd {checkout} && ln -sfn /usr/bin/python3 .venv/bin/python3 && "
            "printf 'home = /usr/bin\\ninclude-system-site-packages = false\\n' > .venv/pyvenv.cfg"
            f" && sed -i '1s|^#!{ROOT}/|#!{checkout}/|' .venv/bin/gpunode"
            # ... and its editable install names the checkout it was made from.
            f" && sed -i 's|{ROOT}/|{checkout}/|g' {VENV_PACKAGES}/__editable__*finder.py"
            f" && chown -R root:root {top} && chmod -R u=rwX,go=rX {top} && "
            "chmod 755 .venv/bin/gpunode"
        )
        prepared = root_ssh(lab, node, prepare)
        assert prepared.returncode == 0, prepared.stderr
        data = {
            "x_drift_inventory": inventory,
            "x_drift_schedule": "*-*-* 04:10:00",
            "x_drift_ssh_key": str(lab.key_path),
            "x_drift_known_hosts": str(lab.known_hosts_path),
        }
        yield ControlHost(node, checkout, target, inventory, data)
    finally:
        inventory_file.unlink(missing_ok=True)
        restore = [
            f"chown {rest.split()[0]} {path} && chmod {rest.split()[1]} {path}"
            for path, rest in existing.items()
        ]
        made = [path for path in TOUCHED if path not in existing]  # deepest first
        cleanup = "; ".join(
            [
                "systemctl disable --now gpunode-drift.timer",
                "systemctl stop gpunode-drift.service",
                "rm -f /etc/systemd/system/gpunode-drift.service "
                "/etc/systemd/system/gpunode-drift.timer",
                "systemctl daemon-reload",
                "userdel gpunode-drift",
                "groupdel gpunode-drift",
                f"rm -rf {top} /var/lib/gpunode-drift {OUTPUT_DIR}",
                f"rm -f {TEXTFILE}",
                *[f"rmdir --ignore-fail-on-non-empty {path}" for path in made],
                *restore,
                "true",
            ]
        )
        root_ssh(lab, node, cleanup)


def deploy(lab: Lab, control: ControlHost, tmp_path: Path) -> PyinfraRun:
    inventory = write_inventory(
        tmp_path / "control.py", lab, [control.node], {control.node.name: control.data}
    )
    return run_pyinfra(DEPLOY, inventory=inventory, checkout=control.checkout)


def service_properties(lab: Lab, node: LabNode) -> dict[str, str]:
    shown = ssh(lab, node, f"systemctl show {SERVICE} " + " ".join(f"-p {p}" for p in SANDBOX))
    assert shown.returncode == 0, shown.stderr
    return dict(line.split("=", 1) for line in shown.stdout.splitlines())


def test_timer_installed_enabled_and_idempotent(
    lab: Lab, control_host: ControlHost, tmp_path: Path
) -> None:
    node = control_host.node
    first = deploy(lab, control_host, tmp_path)
    assert first.returncode == 0, first.output
    unit = ssh(lab, node, "systemctl cat gpunode-drift.service gpunode-drift.timer").stdout
    assert f"drift {control_host.inventory} --baseline {OUTPUT_DIR}/latest.json" in unit
    assert f"--prometheus {TEXTFILE}" in unit
    assert "SuccessExitStatus=1" in unit
    assert "OnCalendar=*-*-* 04:10:00" in unit
    assert ssh(lab, node, "systemctl is-enabled gpunode-drift.timer").stdout.strip() == "enabled"
    assert ssh(lab, node, "systemctl is-active gpunode-drift.timer").stdout.strip() == "active"
    second = deploy(lab, control_host, tmp_path)
    assert second.returncode == 0, second.output
    assert second.changed_operations() == {}


def test_the_service_runs_as_its_own_user_in_a_sandbox(
    lab: Lab, control_host: ControlHost, tmp_path: Path
) -> None:
    node = control_host.node
    assert deploy(lab, control_host, tmp_path).returncode == 0
    assert service_properties(lab, node) == SANDBOX
    account = ssh(lab, node, "getent passwd gpunode-drift").stdout.strip().split(":")
    assert account[5:] == ["/var/lib/gpunode-drift", "/usr/sbin/nologin"]
    assert int(account[2]) < 1000, "a system account"
    status = ssh(lab, node, "sudo passwd -S gpunode-drift").stdout.split()
    assert status[1] == "L", "no password it could log in with"
    config = f"{DRIFT_SSH_DIR}/config"
    owners = ssh(lab, node, f"sudo stat -c '%n %U %G %a' {OUTPUT_DIR} {config}")
    assert owners.stdout.splitlines() == [
        f"{OUTPUT_DIR} gpunode-drift gpunode-drift 750",
        f"{config} root gpunode-drift 640",
    ]
    security = ssh(lab, node, f"systemd-analyze security --no-pager {SERVICE}")
    exposure = re.search(
        rf"Overall exposure level for {re.escape(SERVICE)}: (\d+\.\d+)", security.stdout
    )
    assert exposure is not None, security.stdout + security.stderr
    assert float(exposure.group(1)) <= EXPOSURE_CEILING, security.stdout


def test_the_sandboxed_service_checks_a_node(
    lab: Lab, control_host: ControlHost, tmp_path: Path
) -> None:
    node = control_host.node
    assert deploy(lab, control_host, tmp_path).returncode == 0
    started = ssh(lab, node, f"sudo systemctl start {SERVICE}")
    journal = ssh(lab, node, f"sudo journalctl -u {SERVICE} -n 40 --no-pager").stdout
    assert started.returncode == 0, started.stderr + journal
    result = ssh(lab, node, f"systemctl show {SERVICE} -p Result -p ExecMainStatus").stdout
    assert "Result=success" in result, result + journal
    report = json.loads(ssh(lab, node, f"sudo cat {OUTPUT_DIR}/latest.json").stdout)
    assert report["checked_hosts"] == [control_host.target.name], journal
    assert report["unreachable"] in ({}, []), report["unreachable"]
    outputs = ssh(
        lab, node, f"sudo stat -c '%n %U %a' {OUTPUT_DIR}/latest.json {OUTPUT_DIR}/latest.xml "
        f"{TEXTFILE}",
    )  # fmt: skip
    assert outputs.stdout.splitlines() == [
        f"{OUTPUT_DIR}/latest.json gpunode-drift 644",
        f"{OUTPUT_DIR}/latest.xml gpunode-drift 644",
        f"{TEXTFILE} gpunode-drift 644",  # node_exporter reads it
    ]
    # gpunode-drift reads its key, known_hosts and SSH config, and can change none of them.
    for name in ("id_drift", "known_hosts", "config"):
        owner = ssh(lab, node, f"sudo stat -c '%U %G %a' {DRIFT_SSH_DIR}/{name}").stdout
        assert owner.strip() == "root gpunode-drift 640", name
    for path in (
        DRIFT_SSH_DIR,
        f"{DRIFT_SSH_DIR}/id_drift",
        control_host.checkout,
        f"{control_host.checkout}/{control_host.inventory}",
    ):
        assert ssh(lab, node, f"sudo -u gpunode-drift test -w {path}").returncode == 1, path
    # Nothing in the checkout was written (it was staged without byte-code; Python could
    # leave none).
    written = ssh(lab, node, f"sudo find {control_host.checkout} -name '*.pyc' -print -quit")
    assert written.returncode == 0 and written.stdout == ""


def control_host_state(lab: Lab, node: LabNode) -> str:
    """What the deploy would change first: its units, its user, its directories."""
    return ssh(
        lab,
        node,
        "sudo ls -l --time-style=full-iso /etc/systemd/system/gpunode-drift.service "
        "/etc/systemd/system/gpunode-drift.timer /var/lib/gpunode-drift/.ssh "
        f"{OUTPUT_DIR} 2>&1; getent passwd gpunode-drift",
    ).stdout


def test_missing_inventory_is_refused_before_any_change(
    lab: Lab, lab_nodes: list[LabNode], tmp_path: Path
) -> None:
    node = lab_nodes[0]
    before = control_host_state(lab, node)
    data = {"x_drift_inventory": "inventories/nope.py"}
    inventory = write_inventory(tmp_path / "control.py", lab, [node], {node.name: data})
    run = run_pyinfra(DEPLOY, inventory=inventory)
    assert run.returncode != 0
    assert "x_drift_inventory = 'inventories/nope.py': no such file" in run.output
    assert control_host_state(lab, node) == before


@pytest.mark.parametrize(
    ("setting", "value", "problem"),
    [
        ("x_drift_output_dir", "/etc", "must lie under /var/lib/"),
        ("x_drift_output_dir", "/var/lib/../etc", "not normalised"),
        ("x_drift_output_dir", "/var/lib/apt", "the directory would be given to gpunode-drift"),
        ("x_drift_textfile", "/var/lib/node exporter/x.prom", "not an absolute path"),
        (
            "x_drift_textfile",
            "/var/lib/gpunode_drift.prom",
            "its directory /var/lib would be made writable by group gpunode-drift",
        ),
        ("x_drift_ssh_key", "/nonexistent/drift_key", "no such file here"),
        ("x_drift_schedule", "daily\nExecStartPre=/bin/sh", "not a systemd OnCalendar"),
        ("x_drift_drain", "all", "not 'off' or 'critical'"),
        ("x_drift_scheduler_ssh", "-oProxyCommand=sh", "not a [user@]host to reach Slurm on"),
        ("x_drift_scheduler_ssh", "admin@slurmctl", "given, but x_drift_drain is 'off'"),
    ],
)
def test_unsafe_settings_are_refused_before_any_change(
    lab: Lab, lab_nodes: list[LabNode], tmp_path: Path, setting: str, value: str, problem: str
) -> None:
    node = lab_nodes[0]
    before = control_host_state(lab, node)
    data = {"x_drift_inventory": "inventories/prod.py", setting: value}
    inventory = write_inventory(tmp_path / "control.py", lab, [node], {node.name: data})
    run = run_pyinfra(DEPLOY, inventory=inventory)
    assert run.returncode != 0
    assert f"{setting} = {value!r}: {problem}" in run.output
    assert control_host_state(lab, node) == before


def test_the_drain_setting_reaches_the_check_and_is_off_by_default(
    lab: Lab, control_host: ControlHost, tmp_path: Path
) -> None:
    node = control_host.node
    data = {**control_host.data, "x_drift_drain": "critical", "x_drift_scheduler_ssh": "admin@ctl"}
    inventory = write_inventory(tmp_path / "control.py", lab, [node], {node.name: data})
    run = run_pyinfra(DEPLOY, inventory=inventory, checkout=control_host.checkout)
    assert run.returncode == 0, run.output
    unit = ssh(lab, node, "systemctl cat gpunode-drift.service").stdout
    assert f"--prometheus {TEXTFILE} --drain critical --scheduler-ssh admin@ctl\n" in unit
    assert deploy(lab, control_host, tmp_path).returncode == 0
    unit = ssh(lab, node, "systemctl cat gpunode-drift.service").stdout
    assert f"--prometheus {TEXTFILE}\n" in unit and "--drain" not in unit

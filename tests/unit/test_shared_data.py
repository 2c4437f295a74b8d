"""Shared training data: the model's mounts and refusals, the units, the role's decisions,
the facts' parsers (and one fact's shell command run for real) and the drift rule."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from facts.fabric import Mounts
from facts.paths import SymlinkOnPath
from facts.shared_data import (
    ManagedMountUnits,
    MountPointState,
    NetworkMountAnswers,
    parse_managed_units,
    parse_mount_points,
    parse_network_mounts,
)
from gpunode.drift.rules import evaluate
from gpunode.expected import shared_data as expected
from gpunode.model import DesiredState, SharedMount, build_desired_state
from gpunode.refusal import NodeRefused
from roles import shared_data as role

from .fakehost import commands_of, fake_host

NFS = {"mount_point": "/data", "server": "nfs1.example", "export": "/export/datasets"}
LUSTRE = {"kind": "lustre", "mount_point": "/lustre/fs1", "server": "10.0.0.1@tcp:10.0.0.2@tcp",
          "export": "fs1"}  # fmt: skip
LUSTRE_SOURCE = {
    "lustre_repository_url": "https://mirror.example/lustre/",
    "lustre_repository_keyring": "keys/lustre.gpg",
    "lustre_packages": ["lustre-client-utils", "lustre-client-modules-dkms"],
}
CACHE = {"enabled": True, "devices": ["/dev/nvme0n1"], "cachefilesd": True}


def state(*mounts: dict[str, Any], **data: Any) -> DesiredState:
    section = {"mounts": list(mounts), **data.pop("shared_data", {})}
    desired, problems = build_desired_state({"shared_data": section, **data})
    assert problems == [], [p.render("inv", "h") for p in problems]
    return desired


def problems_of(*mounts: dict[str, Any], **data: Any) -> dict[str, str]:
    section = {"mounts": list(mounts), **data.pop("shared_data", {})}
    _, problems = build_desired_state({"shared_data": section, **data})
    return {problem.key: problem.reason for problem in problems}


# --- the model -------------------------------------------------------------------------------


def test_an_nfs_mount_takes_its_version_nconnect_and_allowed_options() -> None:
    (mount,) = state({**NFS, "nconnect": 8, "options": ["hard", "rsize=1048576", "noatime"]}
                     ).shared_data.mounts  # fmt: skip
    assert (mount.kind, mount.nfs_version, mount.nconnect) == ("nfs", "4.2", 8)
    assert expected.options(mount) == [
        "_netdev", "rw", "vers=4.2", "nconnect=8", "hard", "rsize=1048576", "noatime",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("mount", "key", "reason"),
    [
        ({**NFS, "options": ["soft"]}, "options[0]", "silently corrupt"),
        ({**NFS, "options": ["vers=3"]}, "options[0]", "nfs_version"),
        ({**NFS, "options": ["nconnect=4"]}, "options[0]", "nconnect"),
        ({**NFS, "options": ["x-systemd.automount"]}, "options[0]", "units itself"),
        ({**NFS, "options": ["_netdev"]}, "options[0]", "always sets it"),
        ({**NFS, "options": ["exec,suid"]}, "options[0]", "not an option"),
        ({**NFS, "options": ["rsize=big"]}, "options[0]", "rsize takes"),
        ({**NFS, "options": ["hard", "hard"]}, "options", "given twice"),
        ({**NFS, "options": ["flock"]}, "options", "a Lustre option"),
        ({**NFS, "nconnect": 17}, "nconnect", ""),
        ({**NFS, "nfs_version": "3"}, "nfs_version", ""),
        ({**NFS, "mount_point": "/etc/data"}, "mount_point", "inside /etc"),
        ({**NFS, "mount_point": "/mnt"}, "mount_point", "a system directory"),
        ({**NFS, "mount_point": "/data/../etc"}, "mount_point", "'..'"),
        ({**NFS, "server": "nfs1.example;reboot"}, "server", ""),
        ({**NFS, "server": "10.0.0.1@tcp"}, "server", "not a host name"),
        ({**NFS, "export": "datasets"}, "export", "not an exported path"),
        ({**NFS, "server": "nfs1\n.example"}, "server", "control character"),
        ({**NFS, "export": "/export/\x1b[31m"}, "export", "control character"),
        ({**NFS, "options": ["hard\nExecStart=/bin/sh"]}, "options[0]", "control character"),
        ({**LUSTRE, "server": "nfs1.example"}, "server", "not Lustre MGS NIDs"),
        ({**LUSTRE, "export": "/fs1"}, "export", "not a Lustre file system name"),
        ({**LUSTRE, "nconnect": 4}, "nconnect", "an NFS option"),
        ({**LUSTRE, "options": ["rsize=4096"]}, "options", "an NFS option"),
        ({"server": "nfs1.example", "export": "/e"}, "mount_point", ""),
    ],
)
def test_bad_mount_is_refused_naming_its_key(mount: dict[str, Any], key: str, reason: str) -> None:
    found = problems_of(mount, shared_data=LUSTRE_SOURCE)
    where = f"shared_data.mounts[0].{key}"
    assert where in found, found
    assert reason in found[where]


def test_a_lustre_mount_without_a_declared_repository_is_refused_whole() -> None:
    found = problems_of(LUSTRE)
    for key in ("lustre_repository_url", "lustre_repository_keyring", "lustre_packages"):
        assert "only from a declared repository" in found[f"shared_data.{key}"]
    (mount,) = state(LUSTRE, shared_data=LUSTRE_SOURCE).shared_data.mounts
    assert expected.source(mount) == "10.0.0.1@tcp:10.0.0.2@tcp:/fs1"


def test_mount_points_are_unique_do_not_nest_and_stay_off_the_nvme_cache() -> None:
    found = problems_of(NFS, {**NFS, "export": "/other"})
    assert found["shared_data.mounts[1].mount_point"] == "declared twice"
    found = problems_of(NFS, {**NFS, "mount_point": "/data/imagenet"})
    assert found["shared_data.mounts[1].mount_point"] == "inside /data"
    found = problems_of({**NFS, "mount_point": "/raid/data"}, nvme_cache=CACHE)
    assert "overlaps the NVMe cache" in found["shared_data.mounts[0].mount_point"]


def test_fsc_needs_cachefilesd_on_the_nvme_cache() -> None:
    found = problems_of({**NFS, "fsc": True})
    assert "cachefilesd" in found["shared_data.mounts[0].fsc"]
    (mount,) = state({**NFS, "fsc": True}, nvme_cache=CACHE).shared_data.mounts
    unit = expected.render_mount_unit(mount)
    assert "After=network-online.target cachefilesd.service\n" in unit
    assert ",fsc" in unit


# --- the units -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "stem"),
    # What systemd-escape --path (systemd 252) prints for each.
    [("/data", "data"), ("/mnt/my-data", "mnt-my\\x2ddata"), ("/.x/y", "\\x2ex-y"),
     ("/a+b/c@d", "a\\x2bb-c\\x40d"), ("/x/a.b", "x-a.b")],
)  # fmt: skip
def test_unit_names_are_systemds_escaping_of_the_mount_point(path: str, stem: str) -> None:
    assert expected.unit_stem(path) == stem


def test_the_mount_unit_is_a_network_mount_and_the_automount_is_what_boot_wants() -> None:
    (mount,) = state({**NFS, "nconnect": 4, "read_only": True}).shared_data.mounts
    unit = expected.render_mount_unit(mount)
    assert unit.startswith(expected.MARKER)
    assert "What=nfs1.example:/export/datasets\n" in unit
    assert "Where=/data\nType=nfs\nOptions=_netdev,ro,vers=4.2,nconnect=4\n" in unit
    assert "After=network-online.target\n" in unit and "TimeoutSec=90\n" in unit
    assert "[Install]" not in unit  # the mount is started by its automount only
    automount = expected.render_automount_unit(mount)
    assert "[Automount]\nWhere=/data\n" in automount
    assert automount.endswith("[Install]\nWantedBy=remote-fs.target\n")


def test_an_ipv6_server_is_bracketed_in_the_source() -> None:
    (mount,) = state({**NFS, "server": "fd00::5"}).shared_data.mounts
    assert expected.source(mount) == "[fd00::5]:/export/datasets"


def test_a_renderer_refuses_a_control_character_the_model_would_have_refused() -> None:
    mount = SharedMount(mount_point="/data", server="nfs1", export="/e\nExecStart=/bin/sh")
    with pytest.raises(ValueError, match="control character, space"):
        expected.render_mount_unit(mount)


# --- the role ----------------------------------------------------------------------------------


def nfs_mount(**fields: Any) -> SharedMount:
    (mount,) = state({**NFS, **fields}).shared_data.mounts
    return mount


@pytest.mark.parametrize(
    ("mounted", "point", "link", "refusal"),
    [
        (None, {"kind": "absent", "empty": True}, None, None),
        (None, {"kind": "directory", "empty": True}, None, None),
        ({"source": "systemd-1", "fstype": "autofs", "options": ["rw"]}, None, None, None),
        ({"source": "nfs1.example:/export/datasets", "fstype": "nfs4", "options": []}, None,
         None, None),
        (None, {"kind": "directory", "empty": False}, None, "holds files"),
        (None, {"kind": "other", "empty": False}, None, "not a directory"),
        (None, None, None, "not a directory"),
        ({"source": "/dev/sdb1", "fstype": "ext4", "options": []}, None, None,
         "/dev/sdb1 (ext4) mounted"),
        ({"source": "other:/x", "fstype": "nfs4", "options": []}, None, None, "other:/x"),
        (None, {"kind": "absent", "empty": True}, {"path": "/data", "target": "/etc"},
         "symbolic link /data (-> /etc)"),
    ],
)  # fmt: skip
def test_a_mount_point_is_refused_when_it_holds_data_is_taken_or_is_a_link(
    mounted: Any, point: Any, link: Any, refusal: str | None
) -> None:
    reason = role.mount_point_refusal(nfs_mount(), mounted, point, link)
    if refusal is None:
        assert reason is None
    else:
        assert reason is not None and refusal in reason and "/data" in reason


def test_the_refusal_comes_before_anything_changes_and_names_the_node() -> None:
    facts = {
        Mounts: {},
        MountPointState: lambda paths: {p: {"kind": "directory", "empty": False} for p in paths},
        SymlinkOnPath: None,
    }
    with fake_host(facts), pytest.raises(NodeRefused, match="node-1: shared_data: mount point"):
        role.refuse_unsafe_mount_points((nfs_mount(),))
    # A mounted autofs trigger is never listed (listing it would mount the file system).
    asked: list[list[str]] = []
    facts[Mounts] = {"/data": {"source": "systemd-1", "fstype": "autofs", "options": []}}
    facts[MountPointState] = lambda paths: asked.append(paths) or {}
    with fake_host(facts):
        role.refuse_unsafe_mount_points((nfs_mount(),))
    assert asked == []


def automount_facts(enabled: bool, running: bool, mounted: str | None = None) -> dict:
    unit = "data.automount"
    table = {"/data": {"source": "x", "fstype": mounted, "options": []}} if mounted else {}
    return {SystemdEnabled: {unit: enabled}, SystemdStatus: {unit: running}, Mounts: table}


def test_the_automount_is_enabled_and_started_once_then_left_alone() -> None:
    commands, _ = commands_of(role.automount_active, automount_facts(False, False),
                              mount=nfs_mount(), reload=True)  # fmt: skip
    assert commands == ["systemctl daemon-reload", "systemctl enable --now data.automount"]
    commands, noops = commands_of(role.automount_active, automount_facts(True, True),
                                  mount=nfs_mount())  # fmt: skip
    assert commands == [] and noops == ["data.automount enabled and active"]


def test_a_changed_unit_is_not_remounted_under_running_jobs() -> None:
    commands, noops = commands_of(role.automount_active, automount_facts(True, True, "nfs4"),
                                  mount=nfs_mount(), reload=True, changed=True)  # fmt: skip
    assert commands == ["systemctl daemon-reload"]
    assert "applies at the next mount" in noops[0] and "systemctl restart data.mount" in noops[0]


def test_units_of_mounts_no_longer_declared_are_stopped_and_removed() -> None:
    facts = {ManagedMountUnits: ["data.automount", "data.mount", "old.automount", "old.mount"]}
    commands, _ = commands_of(role.undeclared_units_removed, facts,
                              declared=["data.mount", "data.automount"])  # fmt: skip
    assert commands == [
        "systemctl disable --now old.automount",
        "systemctl disable --now old.mount",
        "rm -f /etc/systemd/system/old.automount /etc/systemd/system/old.mount",
        "systemctl daemon-reload",
    ]
    commands, noops = commands_of(role.undeclared_units_removed, facts,
                                  declared=facts[ManagedMountUnits])  # fmt: skip
    assert commands == [] and noops


# --- the facts -------------------------------------------------------------------------------


def test_mount_point_state_reads_a_real_directory_tree(tmp_path: Any) -> None:
    empty, full, plain = tmp_path / "empty", tmp_path / "full", tmp_path / "file"
    empty.mkdir()
    full.mkdir()
    (full / ".hidden").write_text("data")
    plain.write_text("x")
    (tmp_path / "link").symlink_to(empty)
    paths = [str(p) for p in (empty, full, plain, tmp_path / "link", tmp_path / "absent")]
    command = MountPointState().command(paths)
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    found = MountPointState().process(output.stdout.splitlines())
    assert [found[p]["kind"] for p in paths] == ["directory", "directory", "other", "other",
                                                 "absent"]  # fmt: skip
    assert found[str(empty)]["empty"] is True and found[str(full)]["empty"] is False


def test_the_parsers_keep_what_they_can_read() -> None:
    lines = ["/data\tdirectory\t0", "garbage", "/x\tweird\t0", "/y\tdirectory"]
    assert parse_mount_points(lines) == {
        "/data": {"kind": "directory", "empty": True},
        "/x": {"kind": "other", "empty": True},
    }
    units = ["/etc/systemd/system/data.automount", "/etc/systemd/system/data.mount",
             "/lib/systemd/system/tmp.mount", "/etc/systemd/system/x.service", ""]  # fmt: skip
    assert parse_managed_units(units) == ["data.automount", "data.mount"]


# --- drift -----------------------------------------------------------------------------------


def findings(desired: DesiredState, mounts: dict[str, Any]) -> dict[str, Any]:
    return {f.id: f for f in evaluate("node-1", desired, {"mounts": mounts})
            if f.id.startswith("shared_data")}  # fmt: skip


def test_drift_reports_a_missing_foreign_or_differently_mounted_share() -> None:
    desired = state({**NFS, "nconnect": 8})
    assert findings(desired, {})["shared_data.mount:/data"].severity.name == "CRITICAL"
    autofs = {"/data": {"source": "systemd-1", "fstype": "autofs", "options": ["rw"]}}
    assert findings(desired, autofs) == {}
    good = {"source": "nfs1.example:/export/datasets", "fstype": "nfs4",
            "options": ["rw", "vers=4.2", "nconnect=8", "hard"]}  # fmt: skip
    assert findings(desired, {"/data": good}) == {}
    foreign = {"/data": {**good, "source": "other:/x"}}
    assert findings(desired, foreign)["shared_data.mount:/data"].severity.name == "WARNING"
    drifted = {"/data": {**good, "options": ["ro", "vers=4.1"]}}
    found = findings(desired, drifted)["shared_data.options:/data"]
    assert found.expected == "rw,vers=4.2,nconnect=8" and found.severity.name == "WARNING"


def test_no_shared_data_declared_means_no_finding() -> None:
    plain, _ = build_desired_state({})
    assert findings(plain, {}) == {}


@pytest.mark.parametrize("path", ["/data", "/mnt/my-data"])
def test_systemd_reads_both_units_and_names_them_as_it_does(path: str, tmp_path: Any) -> None:
    analyze = subprocess.run(["which", "systemd-analyze"], capture_output=True, check=False)
    if analyze.returncode != 0:
        pytest.skip("systemd-analyze is not installed on this control host")
    mount = nfs_mount(mount_point=path, nconnect=4, options=["hard", "noatime"])
    units = {
        expected.mount_unit(mount): expected.render_mount_unit(mount),
        expected.automount_unit(mount): expected.render_automount_unit(mount),
    }
    files = []
    for name, text in units.items():
        files.append(tmp_path / name)
        files[-1].write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *map(str, files)], capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    # A unit named otherwise than its Where= is refused by systemd ("Where= setting doesn't
    # match unit name"): the escaping is checked here too. mount.nfs is absent on this host.
    complaints = [
        line for line in done.stderr.splitlines()
        if line.strip() and "mount.nfs" not in line and "/sbin/mount" not in line
    ]  # fmt: skip
    assert complaints == [], done.stderr


# --- a share that stopped answering ------------------------------------------------------------


def test_network_mounts_are_asked_with_a_deadline_and_only_they(tmp_path: Any) -> None:
    """The fact's command run by sh over a mount table of its own: the NFS and Lustre lines
    are asked (a real directory answers, a vanished one is an error), the others are not."""
    here = tmp_path / "share"
    here.mkdir()
    table = tmp_path / "mounts"
    table.write_text(
        f"srv:/export {here} nfs4 rw,vers=4.2 0 0\n"
        f"mgs@tcp:/fs1 {tmp_path}/gone lustre rw 0 0\n"
        f"/dev/sda1 {tmp_path} ext4 rw 0 0\n"
        f"systemd-1 {tmp_path}/auto autofs rw 0 0\n"
        "srv:/x /with\\040space nfs4 rw 0 0\n"
    )
    command = NetworkMountAnswers().command().replace("/proc/self/mounts", str(table))
    assert "timeout -s KILL 3 stat -f" in command
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    found = NetworkMountAnswers().process(done.stdout.splitlines())
    assert set(found["answers"]) == {str(here), f"{tmp_path}/gone"}
    assert found["answers"][str(here)] == "ok"
    assert found["answers"][f"{tmp_path}/gone"].startswith("error: ")
    assert found["problems"] == []


def test_the_answers_parser_keeps_what_it_reads_and_names_the_rest() -> None:
    lines = ["/data\tok", "/lustre\tstale\tstat: Stale file handle", "/x\thung",
             "/y\tmaybe", "noise \x1b[31m"]  # fmt: skip
    found = parse_network_mounts(lines)
    assert found["answers"] == {"/data": "ok", "/lustre": "stale: stat: Stale file handle",
                                "/x": "hung"}  # fmt: skip
    assert len(found["problems"]) == 2 and "\x1b" not in "".join(found["problems"])


def test_drift_reports_a_stale_or_hung_share_as_critical() -> None:
    desired = state(NFS)
    mounted = {"/data": {"source": "nfs1.example:/export/datasets", "fstype": "nfs4",
                         "options": ["rw", "vers=4.2"]}}  # fmt: skip
    for answer in ("stale: stat: Stale file handle", "hung"):
        facts = {"mounts": mounted, "network_mounts": {"state": "ok", "reason": "",
                                                       "answers": {"/data": answer}}}  # fmt: skip
        found = {f.id: f for f in evaluate("node-1", desired, facts)}
        assert found["shared_data.answer:/data"].severity.name == "CRITICAL"
        assert found["shared_data.answer:/data"].found == answer
    facts = {"mounts": mounted, "network_mounts": {"answers": {"/data": "ok"}}}
    assert not [f for f in evaluate("node-1", desired, facts) if f.id.startswith("shared")]

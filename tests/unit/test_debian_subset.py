"""The lab's signed subset of Debian's archive (lab/debian_subset.py): what it keeps, that its
stanzas are Debian's byte for byte, and that apt itself accepts what a lab publishes (apt-get
update against the published tree, its signature and every index's hash checked by apt)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpunode import distributions
from lab import debian_subset

BOOKWORM = distributions.BY_CODENAME["bookworm"]

# Stanzas as Debian's Packages files have them (fields trimmed), a multi-line Description
# among them.
MAIN = """\
Package: base-files
Version: 12.4+deb12u9
Essential: yes
Priority: required
Filename: pool/main/b/base-files/base-files_12.4+deb12u9_amd64.deb

Package: nfs-kernel-server
Version: 1:2.6.2-4
Depends: nfs-common (= 1:2.6.2-4), libc6 (>= 2.34) | libc6.1:any, mail-transport-agent
Recommends: python3:any
Priority: optional
Description: support for NFS kernel server
 This package contains the user-space support needed to use the
 NFS kernel server.
Filename: pool/main/n/nfs-utils/nfs-kernel-server_2.6.2-4_amd64.deb

Package: nfs-common
Version: 1:2.6.2-4
Pre-Depends: keyutils
Priority: optional
Filename: pool/main/n/nfs-utils/nfs-common_2.6.2-4_amd64.deb

Package: libc6
Version: 2.36-9+deb12u9
Priority: optional
Filename: pool/main/g/glibc/libc6_2.36-9+deb12u9_amd64.deb

Package: keyutils
Version: 1.6.3-2
Priority: optional
Filename: pool/main/k/keyutils/keyutils_1.6.3-2_amd64.deb

Package: exim4-daemon-light
Version: 4.96-15+deb12u6
Provides: mail-transport-agent
Priority: optional
Filename: pool/main/e/exim4/exim4-daemon-light_4.96-15+deb12u6_amd64.deb

Package: python3
Version: 3.11.2-1+b1
Priority: optional
Filename: pool/main/p/python3-defaults/python3_3.11.2-1+b1_amd64.deb

Package: emacs
Version: 1:28.2+1-15
Depends: emacs-gtk
Priority: optional
Filename: pool/main/e/emacs/emacs_28.2+1-15_all.deb

Package: emacs-gtk
Version: 1:28.2+1-15
Priority: optional
Filename: pool/main/e/emacs/emacs-gtk_28.2+1-15_amd64.deb
"""
SECURITY = """\
Package: libc6
Version: 2.36-9+deb12u10
Priority: optional
Filename: pool/updates/main/g/glibc/libc6_2.36-9+deb12u10_amd64.deb
"""


def test_relation_fields_name_every_alternative_without_versions_or_qualifiers() -> None:
    assert debian_subset.relation_names(
        "nfs-common (= 1:2.6.2-4), libc6 (>= 2.34) | libc6.1:any,  keyutils [amd64] ,"
    ) == ["nfs-common", "libc6", "libc6.1", "keyutils"]
    assert debian_subset.relation_names("") == []


def test_the_subset_is_the_closure_of_the_seeds_and_the_names_code_gives() -> None:
    index = debian_subset.Index.read([MAIN, SECURITY])
    assert index.seeds == {"base-files"}  # required / important / standard, or essential
    wanted = index.closure(index.seeds | {"nfs-kernel-server", "not-a-debian-package"})
    # Depends with every alternative that exists, Pre-Depends, Recommends, and every provider
    # of a virtual name; nothing that nothing needs.
    assert wanted == {
        "base-files", "nfs-kernel-server", "nfs-common", "libc6", "keyutils",
        "exim4-daemon-light", "python3",
    }  # fmt: skip
    assert "mail-transport-agent" not in wanted  # virtual: no stanza of its own


def test_a_cut_keeps_debian_s_stanzas_byte_for_byte_and_only_those_asked_for() -> None:
    kept = debian_subset.cut(MAIN, {"nfs-kernel-server", "keyutils"})
    stanzas = MAIN.split("\n\n")
    assert kept == stanzas[1] + "\n\n" + stanzas[4] + "\n\n"
    assert "NFS kernel server.\nFilename:" in kept  # the multi-line Description whole
    assert debian_subset.cut(MAIN, set()) == ""


def test_release_fields_come_from_the_signed_part_and_the_release_lists_each_file_s_hash() -> None:
    signed = (
        "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA512\n\n"
        "Origin: Debian\nLabel: Debian-Security\nSuite: oldstable-security\nVersion: 12\n"
        "Codename: bookworm-security\nDate: Sun, 06 Dec 2026 02:54:29 UTC\n"
        "Valid-Until: Sun, 13 Dec 2026 02:54:29 UTC\nAcquire-By-Hash: yes\n"
        "Architectures: amd64 arm64\nComponents: updates/main\n"
        "SHA256:\n 0123 1 main/binary-amd64/Packages\n"
        "-----BEGIN PGP SIGNATURE-----\n\nabc\n-----END PGP SIGNATURE-----\n"
    )
    fields = debian_subset.release_fields(signed)
    # What unattended-upgrades' origins match on is kept; by-hash and validity are not.
    assert fields == {
        "Origin": "Debian", "Label": "Debian-Security", "Suite": "oldstable-security",
        "Version": "12", "Codename": "bookworm-security",
        "Date": "Sun, 06 Dec 2026 02:54:29 UTC",
    }  # fmt: skip
    release = debian_subset.render_release(fields, ["main"], {"main/binary-amd64/Packages": b"x"})
    assert "Components: main\nSHA256:\n" in release
    sha = "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"
    assert release.endswith(f" {sha}                1 main/binary-amd64/Packages\n")


@pytest.mark.parametrize(
    ("path", "target"),
    [
        (
            "/debian-subset/debian/pool/main/n/nfs-utils/nfs-common_2.6.2-4_amd64.deb",
            "http://deb.debian.org/debian/pool/main/n/nfs-utils/nfs-common_2.6.2-4_amd64.deb",
        ),
        (
            "/debian-subset/debian-security/pool/updates/main/g/glibc/x.deb?x=1",
            "http://deb.debian.org/debian-security/pool/updates/main/g/glibc/x.deb",
        ),
        ("/debian-subset/debian/dists/bookworm/InRelease", None),  # served, not redirected
        ("/debian-subset/debian/pool/../../../etc/passwd", None),
        ("/debian-subset/debian/pool/", None),
        ("/debian-subset/debian-securityx/pool/a.deb", None),
        ("/cuda/debian12/x86_64/Packages", None),
    ],
)
def test_only_the_subset_s_pool_is_redirected_to_debian_s(path: str, target: str | None) -> None:
    assert debian_subset.pool_redirect(path) == target


def test_names_are_read_from_the_checkout_s_code_and_data(tmp_path: Path) -> None:
    (tmp_path / "roles").mkdir()
    (tmp_path / "roles" / "nfs.py").write_text('apt.packages(packages=["nfs-kernel-server"])\n')
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "world.toml").write_text('depends = ["libxml2 (>= 2.9)"]\n')
    (tmp_path / "lab" / "image.bin").write_text("python3-never-read\n")
    names = debian_subset.code_names(tmp_path)
    assert {"nfs-kernel-server", "libxml2", "apt.packages"} <= names
    assert "python3-never-read" not in names


def test_a_published_subset_is_accepted_by_apt_which_checks_its_signature_and_hashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Debian's indexes stand in as files (no network in unit tests); the cut, the signing and
    apt's check of both are real."""
    lists = tmp_path / "lists"
    lists.mkdir()
    in_release = (
        "Origin: Debian\nLabel: Debian\nSuite: oldstable\nCodename: bookworm\n"
        "Date: Sat, 05 Dec 2026 09:10:11 UTC\n"
    )
    targets = []
    for archive, suite, text in (
        ("debian", "bookworm", MAIN),
        ("debian", "bookworm-updates", ""),  # nothing of the subset's updated
        ("debian-security", "bookworm-security", SECURITY),
    ):
        site = f"deb.debian.org_{archive}"
        (lists / f"{site}_dists_{suite}_InRelease").write_text(
            in_release.replace("bookworm", suite)
        )
        path = lists / f"{site}_dists_{suite}_main_binary-amd64_Packages"
        path.write_text(text)
        targets.append(debian_subset.Target(archive, suite, "main", path))
    monkeypatch.setenv("GPUNODE_LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(debian_subset, "refresh", lambda rows: targets)
    monkeypatch.setattr(debian_subset, "code_names", lambda: {"nfs-kernel-server"})
    served = debian_subset.publish(tmp_path / "repo", ["bookworm"])
    keyring = served / debian_subset.KEYRING
    again = debian_subset.publish(tmp_path / "repo", ["bookworm"])
    assert again == served and keyring.read_bytes() == (served / debian_subset.KEYRING).read_bytes()

    apt_root = tmp_path / "apt"
    for name in ("lists/partial", "parts", "sources", "cache"):
        (apt_root / name).mkdir(parents=True)
    (apt_root / "sources" / "subset.sources").write_text(
        f"Types: deb\nURIs: file:{served}/debian\nSuites: bookworm bookworm-updates\n"
        f"Components: main\nSigned-By: {keyring}\n\n"
        f"Types: deb\nURIs: file:{served}/debian-security\nSuites: bookworm-security\n"
        f"Components: main\nSigned-By: {keyring}\n"
    )
    (apt_root / "apt.conf").write_text(
        f'Dir::Etc::Parts "{apt_root / "parts"}";\nDir::Etc::SourceList "/dev/null";\n'
        f'Dir::Etc::SourceParts "{apt_root / "sources"}";\n'
        f'Dir::State::Lists "{apt_root / "lists"}";\nDir::Cache "{apt_root / "cache"}";\n'
        'Dir::State::status "/dev/null";\nAPT::Architecture "amd64";\n'
        'APT::Sandbox::User "root";\nAcquire::Languages "none";\n'
    )
    env = {**os.environ, "APT_CONFIG": str(apt_root / "apt.conf"), "LC_ALL": "C"}
    update = subprocess.run(
        ["apt-get", "update"], env=env, capture_output=True, text=True, timeout=120
    )
    assert update.returncode == 0, update.stdout + update.stderr
    assert update.stderr == "", update.stderr  # no warning either (no unsigned or stale part)
    policy = subprocess.run(
        ["apt-cache", "policy", "libc6", "nfs-kernel-server", "emacs"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "Candidate: 2.36-9+deb12u10" in policy.stdout  # the security suite's, newer
    assert "Candidate: 1:2.6.2-4" in policy.stdout
    assert "emacs" not in policy.stdout  # nothing needs it: not in the subset
    # A changed Release (one byte) no longer verifies under the lab's key.
    release = served / "debian" / "dists" / "bookworm" / "InRelease"
    release.write_text(release.read_text().replace("Label: Debian", "Label: Debiao"))
    tampered = subprocess.run(
        ["apt-get", "update"], env=env, capture_output=True, text=True, timeout=120
    )
    assert "BADSIG" in tampered.stdout + tampered.stderr, tampered.stdout + tampered.stderr


# Run in a process of its own: an earlier unit test imports pyinfra's CLI, which patches this
# one with gevent, where a thread blocked in flock blocks every other thread.
LOCK_SCENARIO = """\
import json, sys, threading
from pathlib import Path
from gpunode import distributions
from lab import debian_subset

inside = []
first_inside = threading.Event()
let_first_go = threading.Event()

def refresh_standing_in(root, releases):
    inside.append(threading.current_thread().name)
    if len(inside) == 1:
        first_inside.set()
        let_first_go.wait(timeout=30)
    return []

debian_subset._refresh = refresh_standing_in
rows = [distributions.BY_CODENAME["bookworm"]]
first = threading.Thread(target=debian_subset.refresh, args=(rows,), name="first")
second = threading.Thread(target=debian_subset.refresh, args=(rows,), name="second")
first.start()
first_inside.wait(timeout=30)
second.start()
second.join(timeout=0.5)
while_held = {"second_waiting": second.is_alive(), "inside": list(inside)}
let_first_go.set()
first.join(timeout=30)
second.join(timeout=30)
print(json.dumps({"while_held": while_held, "after": inside}))
"""


def test_labs_that_start_together_refresh_debian_s_lists_one_at_a_time(tmp_path: Path) -> None:
    """A second apt on the same lists fails on their lock: on a cold machine, with no lists to
    fall back on, every lab but the first failed to start (seen with three at once)."""
    done = subprocess.run(
        [sys.executable, "-c", LOCK_SCENARIO],
        env={**os.environ, "GPUNODE_LAB_CACHE": str(tmp_path)},
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    # While the first held the lock, the second waited outside.
    assert result["while_held"] == {"second_waiting": True, "inside": ["first"]}
    assert result["after"] == ["first", "second"]

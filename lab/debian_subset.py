"""A signed subset of Debian's archive, which a lab serves its nodes when asked to
(``GPUNODE_LAB_DEBIAN=subset``: the test suite's labs).

Why: apt reads its whole index on every command. With Debian's (about 65,000 packages a
release) ``apt-get install -s`` of one package took 0.41 s of CPU in a lab node, against
0.03-0.06 s with 2,232 packages, and a fresh converge runs apt-get 56 times a node: apt-get
was 44 % of the lab containers' CPU in the suite (measured 2026-12, bench/cpu_profile.py and
process accounting). The suite is CPU-bound on its 2-core machine.

What: for each Debian release a lab converges (``lab.DEBIAN_LAB_RELEASES``), Debian's own index
of the release, its updates and its security suite, as apt on the lab host fetched and
verified it (InRelease signed by a key of ``debian-archive-keyring``, every index checked
against its hash: apt does both, and this module uses only indexes apt marks Trusted), cut to
the packages a lab can need. That is the closure, over Pre-Depends, Depends and Recommends (every
alternative, every provider of a virtual name), of:

- Debian's required, important and standard packages, and the essential ones;
- every Debian package name the checkout's own code and data name (roles, facts, deploys,
  inventories, lab, tests, bench): a role that installs a package names it, and so does a
  test that installs one.

The stanzas are Debian's, byte for byte. Each lab signs a Release of its own over them with a
key made for it (``SUBSET_DIR/keyring.gpg``, the public half; the private half is deleted
with its temporary GNUPGHOME), which the lab's inventory gives as ``apt.debian_keyring``:
the product's setting for a re-signed site mirror (aptly, pulp), tested here for real. The
packages are Debian's pool: the lab's server redirects ``pool/`` to deb.debian.org (nodes
fetch it through the lab's apt-cacher-ng, like every Debian package), and apt checks each
package against the stanza's SHA256.

A package that no code names and nothing needs is not in the subset: a lab inventory that
adds one (``base_packages``) to a test-suite lab gets apt's "Unable to locate package". The
lab of ``gpunode lab up`` serves Debian's whole archive unless asked.

Layout under a lab's repository directory (served at ``/debian-subset/``)::

    debian-subset/keyring.gpg                       # binary public key, for signed-by
    debian-subset/state.json                        # what it was built from
    debian-subset/debian/dists/<suite>/{InRelease,Release,<component>/binary-amd64/Packages}
    debian-subset/debian-security/dists/<suite>-security/...

The lists apt fetched and the cut indexes are kept per machine (``machine_cache_root()``),
keyed by the upstream InRelease files and the names the code gives, so that labs side by side
cut once.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpunode import distributions
from lab import DEBIAN_LAB_RELEASES, DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR, machine_cache_root

REPO_ROOT = Path(__file__).resolve().parents[1]
SUBSET_DIR = "debian-subset"
KEYRING = "keyring.gpg"
STATE_FILE = "state.json"
KEY_UID = "gpunode lab Debian subset <debian-subset@gpunode.invalid>"
# Upstream archives: their path under SUBSET_DIR, and where their pool is.
ARCHIVES = {"debian": DEBIAN_MIRROR, "debian-security": DEBIAN_SECURITY_MIRROR}
# Each subset pool's path on the lab's server -> Debian's pool it stands for.
POOL_REDIRECTS = {
    f"{SUBSET_DIR}/{archive}/pool": f"{url}/pool" for archive, url in ARCHIVES.items()
}
COMPONENTS = ("main", "contrib", "non-free", "non-free-firmware")
ARCHITECTURE = "amd64"
DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
# Where the names of packages the code needs are looked for, and in which files.
CODE_DIRS = ("roles", "facts", "gpunode", "deploys", "inventories", "lab", "tests", "bench")
CODE_SUFFIXES = {".py", ".toml", ".json", ".sh", ".txt", ".yaml", ".yml", ".conf", ".j2"}
SEED_PRIORITIES = {"required", "important", "standard"}
DEPENDENCY_FIELDS = ("Pre-Depends", "Depends", "Recommends")
# The lists apt fetched are fresh enough for a lab that starts within this long of the last
# refresh (the suite's labs start within a minute of each other).
LISTS_FRESH_S = 900
# Release fields copied from Debian's: unattended-upgrades and apt pinning match on them.
RELEASE_FIELDS = ("Origin", "Label", "Suite", "Version", "Codename", "Date", "Description")
# A token that could be a Debian package name (Debian policy 5.6.1: lower case letters,
# digits, + - and ., at least two characters, starting with a letter or digit).
NAME_TOKEN = re.compile(r"[a-z0-9][a-z0-9+.-]+")
FIELD_LINE = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):[ \t]*(.*)$")


class SubsetError(RuntimeError):
    """The subset could not be made (Debian's archive unreachable and nothing built before,
    an index apt did not trust, a tool missing)."""


def pool_redirect(path: str) -> str | None:
    """The Debian URL a request for ``path`` under the subset's pool is answered with, or None
    where ``path`` is not in a subset pool."""
    clean = path.split("?", 1)[0].split("#", 1)[0].lstrip("/")
    if ".." in clean.split("/"):
        return None
    for prefix, target in POOL_REDIRECTS.items():
        if clean.startswith(prefix + "/") and len(clean) > len(prefix) + 1:
            return target + clean[len(prefix) :]
    return None


# --- Debian control data ---------------------------------------------------------------------


def paragraphs(text: str) -> Iterator[str]:
    """The stanzas of a Packages file, each as its text (without the blank line after it)."""
    for block in text.split("\n\n"):
        block = block.strip("\n")
        if block:
            yield block


def control_fields(paragraph: str, wanted: Iterable[str]) -> dict[str, str]:
    """The single-line fields ``wanted`` of one stanza (continuation lines are ignored: none of
    the fields read here has any)."""
    names = set(wanted)
    found = {}
    for line in paragraph.split("\n"):
        if line[:1] in (" ", "\t"):
            continue
        match = FIELD_LINE.match(line)
        if match and match.group(1) in names:
            found[match.group(1)] = match.group(2).strip()
    return found


def relation_names(value: str) -> list[str]:
    """Every package name a relationship field names, alternatives included:
    ``a (>= 1) | b:any, c [amd64]`` -> a, b, c."""
    names = []
    for group in value.split(","):
        for alternative in group.split("|"):
            token = alternative.strip().split(" ", 1)[0].split("(", 1)[0].split("[", 1)[0]
            token = token.split(":", 1)[0].strip()
            if token:
                names.append(token)
    return names


@dataclass
class Index:
    """One release's packages (all its suites and components), by name."""

    depends: dict[str, set[str]]
    providers: dict[str, set[str]]
    seeds: set[str]

    @classmethod
    def read(cls, texts: Iterable[str]) -> Index:
        depends: dict[str, set[str]] = {}
        providers: dict[str, set[str]] = {}
        seeds: set[str] = set()
        wanted = ("Package", "Provides", "Priority", "Essential", *DEPENDENCY_FIELDS)
        for text in texts:
            for paragraph in paragraphs(text):
                fields = control_fields(paragraph, wanted)
                name = fields.get("Package")
                if not name:
                    continue
                needs = depends.setdefault(name, set())
                for field in DEPENDENCY_FIELDS:
                    needs.update(relation_names(fields.get(field, "")))
                for virtual in relation_names(fields.get("Provides", "")):
                    providers.setdefault(virtual, set()).add(name)
                if fields.get("Priority") in SEED_PRIORITIES or fields.get("Essential") == "yes":
                    seeds.add(name)
        return cls(depends, providers, seeds)

    def known(self, name: str) -> bool:
        return name in self.depends or name in self.providers

    def closure(self, names: Iterable[str]) -> set[str]:
        """The real packages ``names`` and everything they may pull in."""
        kept: set[str] = set()
        pending = [name for name in names if self.known(name)]
        seen: set[str] = set()
        while pending:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in self.depends:
                kept.add(name)
                pending.extend(self.depends[name] - seen)
            pending.extend(self.providers.get(name, set()) - seen)
        return kept


def cut(text: str, names: set[str]) -> str:
    """The stanzas of ``text`` whose package is one of ``names``, byte for byte."""
    kept = [
        paragraph
        for paragraph in paragraphs(text)
        if control_fields(paragraph, ("Package",)).get("Package") in names
    ]
    return "".join(paragraph + "\n\n" for paragraph in kept)


def code_names(root: Path = REPO_ROOT) -> set[str]:
    """Every token of the checkout's code and data that could be a package name."""
    tokens: set[str] = set()
    for directory in CODE_DIRS:
        for path in sorted((root / directory).rglob("*")):
            if path.suffix not in CODE_SUFFIXES or not path.is_file():
                continue
            if ".venv" in path.parts or "__pycache__" in path.parts:
                continue
            try:
                tokens.update(NAME_TOKEN.findall(path.read_text(errors="replace")))
            except OSError:
                continue
    return tokens


def release_fields(in_release: str) -> dict[str, str]:
    """The header fields of a (clear-signed) Release that the subset's Release keeps."""
    body = in_release
    if body.startswith("-----BEGIN PGP SIGNED MESSAGE-----"):
        body = body.split("\n\n", 1)[1] if "\n\n" in body else ""
    body = body.split("\n-----BEGIN PGP SIGNATURE-----", 1)[0]
    header = body.split("\nMD5Sum:", 1)[0].split("\nSHA256:", 1)[0]
    return control_fields(header, RELEASE_FIELDS)


def render_release(fields: dict[str, str], components: list[str], files: dict[str, bytes]) -> str:
    """A Release over ``files`` (paths relative to the suite's directory)."""
    lines = [f"{name}: {fields[name]}" for name in RELEASE_FIELDS if fields.get(name)]
    lines += [
        f"Architectures: {ARCHITECTURE}",
        f"Components: {' '.join(components)}",
        "SHA256:",
    ]
    lines += [
        f" {hashlib.sha256(data).hexdigest()} {len(data):>16} {path}"
        for path, data in sorted(files.items())
    ]
    return "\n".join(lines) + "\n"


# --- fetching Debian's indexes with apt ------------------------------------------------------


def _cache_root() -> Path:
    return machine_cache_root() / SUBSET_DIR


def _apt_config(root: Path, releases: list[distributions.Distribution]) -> dict[str, str]:
    """APT_CONFIG of apt's own run on the lab host: its own sources, lists and no cache, none
    of the host's apt configuration (no host setting changes what is fetched)."""
    for name in ("lists/partial", "parts", "sources", "cache"):
        (root / name).mkdir(parents=True, exist_ok=True)
    stanzas = []
    for archive, suites in (
        ("debian", [suite for row in releases for suite in row.suites]),
        ("debian-security", [suite for row in releases for suite in row.security_suites]),
    ):
        stanzas.append(
            f"Types: deb\nURIs: {ARCHIVES[archive]}\nSuites: {' '.join(suites)}\n"
            f"Components: {' '.join(COMPONENTS)}\nSigned-By: {DEBIAN_KEYRING}\n"
        )
    (root / "sources" / "debian.sources").write_text("\n".join(stanzas))
    config = root / "apt.conf"
    config.write_text(
        f'Dir::Etc::Parts "{root / "parts"}";\n'
        'Dir::Etc::SourceList "/dev/null";\n'
        f'Dir::Etc::SourceParts "{root / "sources"}";\n'
        f'Dir::State::Lists "{root / "lists"}";\n'
        f'Dir::Cache "{root / "cache"}";\n'
        'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n'
        f'APT::Architecture "{ARCHITECTURE}";\nAPT::Architectures {{ "{ARCHITECTURE}"; }};\n'
        'Acquire::Languages "none";\nAPT::Sandbox::User "root";\n'
    )
    return {**os.environ, "APT_CONFIG": str(config), "LC_ALL": "C"}


def _apt(env: dict[str, str], *arguments: str) -> str:
    result = subprocess.run(
        ["apt-get", *arguments], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if result.returncode != 0:
        raise SubsetError(f"apt-get {arguments[0]} failed: {result.stdout[-1500:]}{result.stderr}")
    return result.stdout


@dataclass(frozen=True)
class Target:
    archive: str  # debian or debian-security
    suite: str  # bookworm, bookworm-updates, bookworm-security
    component: str
    path: Path  # the list apt keeps (may be missing: an empty component)


def refresh(releases: list[distributions.Distribution]) -> list[Target]:
    """Debian's indexes of ``releases``, fetched and verified by apt (a refresh at most every
    LISTS_FRESH_S); the lists of a refresh that failed are used where they exist."""
    if not DEBIAN_KEYRING.is_file():
        raise SubsetError(f"{DEBIAN_KEYRING} is missing: install debian-archive-keyring")
    root = _cache_root() / "apt"
    root.mkdir(parents=True, exist_ok=True)
    # One refresh at a time on the machine: the suite's labs start together, and a second apt
    # on the same lists fails on their lock (on a cold machine, with no lists to fall back
    # on). The one that waited finds the lists fresh and reads what the first found.
    with open(root.parent / "refresh.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _refresh(root, releases)


def _refresh(root: Path, releases: list[distributions.Distribution]) -> list[Target]:
    env = _apt_config(root, releases)
    stamp = root / "refreshed"
    # What the last refresh found, for the labs that start while its lists are fresh: reading
    # them again (apt-get indextargets) costs each lab's start a second of CPU.
    found = root / f"targets-{'-'.join(row.codename for row in releases)}.json"
    fresh = stamp.exists() and time.time() - stamp.stat().st_mtime < LISTS_FRESH_S
    if fresh:
        try:
            return [
                Target(item["archive"], item["suite"], item["component"], Path(item["path"]))
                for item in json.loads(found.read_text())
            ]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    else:
        try:
            _apt(env, "update", "-q")
            stamp.touch()
        except (SubsetError, subprocess.TimeoutExpired) as error:
            if not any((root / "lists").glob("*_InRelease")):
                raise SubsetError(f"Debian's archive could not be read: {error}") from error
    listing = _apt(
        env,
        "indextargets",
        "--format",
        "$(REPO_URI)\t$(RELEASE)\t$(COMPONENT)\t$(FILENAME)\t$(TRUSTED)",
        "Created-By: Packages",
    )
    targets = []
    archive_of = {url + "/": archive for archive, url in ARCHIVES.items()}
    for line in listing.splitlines():
        parts = line.split("\t")
        if len(parts) != 5 or parts[0] not in archive_of:
            continue
        repo_uri, suite, component, filename, trusted = parts
        if trusted != "yes":
            raise SubsetError(f"apt does not trust {repo_uri} {suite}: not cut from it")
        targets.append(Target(archive_of[repo_uri], suite, component, Path(filename)))
    found.write_text(
        json.dumps(
            [
                {"archive": t.archive, "suite": t.suite, "component": t.component,
                 "path": str(t.path)}
                for t in targets
            ]
        )
    )  # fmt: skip
    return targets


def _in_release(target: Target) -> Path:
    """The InRelease apt keeps beside a target's list."""
    prefix = target.path.name.split("_dists_", 1)[0]
    return target.path.with_name(f"{prefix}_dists_{target.suite}_InRelease")


# --- the cut, per machine --------------------------------------------------------------------


def build_cut(release: distributions.Distribution, targets: list[Target], names: set[str]) -> Path:
    """The unsigned cut of ``release`` (its Packages and Release files), made once per machine
    for the same upstream indexes and names."""
    mine = [
        target for target in targets if target.suite in (*release.suites, *release.security_suites)
    ]
    if not mine:
        raise SubsetError(f"no index of {release.codename} was fetched")
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for target in sorted(mine, key=lambda t: (t.suite, t.component)):
        in_release = _in_release(target)
        digest.update(f"{target.suite}/{target.component}\0".encode())
        if in_release.is_file():
            digest.update(in_release.read_bytes())
    digest.update("\0".join(sorted(names)).encode())
    key = digest.hexdigest()[:24]
    built = _cache_root() / "cut" / f"{release.codename}-{key}"
    lock_path = _cache_root() / f"cut-{release.codename}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (built / "done").is_file():
            return built
        texts = {
            target: (target.path.read_text(errors="replace") if target.path.is_file() else "")
            for target in mine
        }
        index = Index.read(texts.values())
        wanted = index.closure(index.seeds | {name for name in names if index.known(name)})
        built.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".cut-", dir=built.parent))
        try:
            for suite in (*release.suites, *release.security_suites):
                suite_targets = [target for target in mine if target.suite == suite]
                if not suite_targets:
                    continue
                archive = suite_targets[0].archive
                suite_dir = staging / archive / "dists" / suite
                files: dict[str, bytes] = {}
                components = []
                for target in suite_targets:
                    text = cut(texts[target], wanted).encode()
                    relative = f"{target.component}/binary-{ARCHITECTURE}/Packages"
                    files[relative] = text
                    files[relative + ".gz"] = gzip.compress(text, mtime=0)
                    components.append(target.component)
                for relative, data in files.items():
                    (suite_dir / relative).parent.mkdir(parents=True, exist_ok=True)
                    (suite_dir / relative).write_bytes(data)
                in_release = _in_release(suite_targets[0])
                fields = release_fields(in_release.read_text(errors="replace"))
                (suite_dir / "Release").write_text(render_release(fields, components, files))
            (staging / "packages.json").write_text(json.dumps(sorted(wanted)) + "\n")
            (staging / "done").write_text("")
            shutil.rmtree(built, ignore_errors=True)
            staging.rename(built)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        for old in built.parent.glob(f"{release.codename}-*"):
            if old != built:
                shutil.rmtree(old, ignore_errors=True)
    return built


# --- a lab's signed copy ---------------------------------------------------------------------


def publish(repo_dir: Path, releases: Iterable[str] | None = None) -> Path:
    """The lab's signed subset under ``repo_dir/debian-subset`` (re-signed only where the cut
    changed); returns that directory."""
    rows = [distributions.BY_CODENAME[name] for name in (releases or DEBIAN_LAB_RELEASES)]
    targets = refresh(rows)
    names = code_names()
    cuts = [build_cut(row, targets, names) for row in rows]
    served = repo_dir / SUBSET_DIR
    state = {"cuts": sorted(path.name for path in cuts)}
    try:
        if json.loads((served / STATE_FILE).read_text()) == state and (served / KEYRING).is_file():
            return served
    except (OSError, ValueError):
        pass
    repo_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".debian-subset-", dir=repo_dir))
    try:
        for built in cuts:
            shutil.copytree(built, staging, dirs_exist_ok=True, ignore=_not_served)
        _sign(staging)
        (staging / STATE_FILE).write_text(json.dumps(state) + "\n")
        old = repo_dir / f".{SUBSET_DIR}-old"
        shutil.rmtree(old, ignore_errors=True)
        if served.exists():
            served.rename(old)
        staging.rename(served)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return served


def _not_served(directory: str, names: list[str]) -> list[str]:
    return [name for name in names if name in ("done", "packages.json")]


def _sign(root: Path) -> None:
    """Clear-sign every suite's Release with a key made for it; keep only the public half."""
    home = Path(tempfile.mkdtemp(prefix="gpunode-debian-subset-gnupg-"))
    env = {**os.environ, "GNUPGHOME": str(home)}

    def gpg(*arguments: str) -> bytes:
        result = subprocess.run(["gpg", "--batch", *arguments], env=env, capture_output=True)
        if result.returncode != 0:
            raise SubsetError(f"gpg failed: {result.stderr.decode(errors='replace')[-1500:]}")
        return result.stdout

    try:
        gpg("--passphrase", "", "--quick-gen-key", KEY_UID, "ed25519", "sign", "never")
        for release in sorted(root.glob("*/dists/*/Release")):
            gpg(
                "--yes", "--local-user", KEY_UID, "--digest-algo", "SHA512", "--clearsign",
                "-o", str(release.with_name("InRelease")), str(release),
            )  # fmt: skip
        (root / KEYRING).write_bytes(gpg("--export", KEY_UID))
    finally:
        subprocess.run(["gpgconf", "--kill", "all"], env=env, capture_output=True, check=False)
        shutil.rmtree(home, ignore_errors=True)

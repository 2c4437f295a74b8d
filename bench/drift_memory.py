"""Peak memory (RSS) of `gpunode drift` over 64 hosts: what the drift unit's MemoryMax must hold.

    GPUNODE_LAB_DIR=... GPUNODE_LAB_NAME=... GPUNODE_LAB_SUBNET=... \\
        .venv/bin/python bench/drift_memory.py [--hosts 64] [--modes plain,flood,bad-byte]

The lab's nodes (`gpunode lab up --nodes 2`, nothing deployed) each stand in for many hosts:
an inventory of ``--hosts`` names, each reaching one of the nodes (``ssh_hostname``), so the
check opens that many SSH connections and reads that many whole fact sets at once, as over a
fleet, without a container per host. Modes:

- plain: the nodes as they are (a lab node answers about 50 kB, 700 lines);
- flood: every host's ibstat (a stand-in in /usr/local/sbin, first on sudo's PATH) prints
  40 MB, so every host is read up to the cap of gpunode.drift.gather.HOST_LIMITS: the most
  one run can hold;
- bad-byte: ibstat prints a byte that is not UTF-8, then 3.5 MB of lines: every host read
  whole, its answer decoded with a replacement;
- wide: ibstat prints an emoji, then 8 MB of bytes that are not UTF-8: every host's answer
  just under the cap, decoded to the widest text it can be (4 bytes a character).

Prints one line per mode: hosts, checked, not checked (and why), wall seconds, the check's
peak RSS (its process's ru_maxrss, from wait4). A measurement, not a test; the stand-in and
the bench's sshd drop-in (MaxStartups, for dozens of logins per node at once) are removed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab import LOGIN_USER, Lab  # noqa: E402

GPUNODE = str(Path(sys.executable).with_name("gpunode"))
STAND_IN = "/usr/local/sbin/ibstat"
# sshd drops unauthenticated connections past 10 at once (MaxStartups 10:30:100, sshd_config(5)):
# a real fleet has one per node, the bench dozens per node; raised for the bench, then removed.
SSHD_DROP_IN = "/etc/ssh/sshd_config.d/00-gpunode-bench.conf"
STAND_INS = {
    "plain": None,
    "flood": "yes 'a flood of output, line after line' | head -c 40000000",
    "bad-byte": "printf 'hostile \\377 byte\\n'\n"
    "seq -f 'more output after the byte: line %g' 1 90000",
    # One 4-byte character, then 8 000 000 bytes that are not UTF-8 in lines of 1000: the
    # widest text one host's capped answer decodes to (each byte one U+FFFD, 4 bytes a
    # character in Python while the text holds the wide one).
    "wide": "printf '\\360\\237\\230\\200\\n'\n"
    "head -c 8000000 /dev/zero | tr '\\0' '\\377' | fold -w 1000",
}


def on_nodes(lab: Lab, command: str) -> None:
    for node in lab.nodes():
        subprocess.run(
            ["ssh", "-i", str(lab.key_path), "-o", f"UserKnownHostsFile={lab.known_hosts_path}",
             "-o", "BatchMode=yes", f"{LOGIN_USER}@{node.address}",
             f"sudo sh -c {shlex.quote(command)}"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip


def write_inventory(lab: Lab, hosts: int, path: Path) -> None:
    nodes = lab.nodes()
    entries = []
    for index in range(hosts):
        node = nodes[index % len(nodes)]
        entries.append((f"bench-{index:03d}", {
            "ssh_hostname": node.address, "ssh_user": LOGIN_USER,
            "ssh_key": str(lab.key_path), "ssh_known_hosts_file": str(lab.known_hosts_path),
            "ssh_strict_host_key_checking": "yes", "_sudo": True,
        }))  # fmt: skip
    path.write_text(f"bench_hosts = {entries!r}\n")


def peak_rss_mib(inventory: Path) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MiB, the JSON report) of one `gpunode drift --json`."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen(
            [GPUNODE, "drift", str(inventory), "--json"], cwd=ROOT, stdout=out,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _, _, usage = os.wait4(process.pid, 0)
        wall = time.monotonic() - started
        out.seek(0)
        report = out.read().decode()
    return wall, usage.ru_maxrss / 1024, report  # ru_maxrss: KiB on Linux


def main() -> None:
    import json

    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--modes", default=",".join(STAND_INS))
    args = parser.parse_args()
    lab = Lab()
    if not lab.nodes():
        raise SystemExit("no lab nodes: gpunode lab up --nodes 2 first")
    print(f"{'mode':>9} {'hosts':>6} {'checked':>8} {'not chk':>8} {'wall s':>7} {'peak MiB':>9}")
    on_nodes(lab, f"echo 'MaxStartups 200' > {SSHD_DROP_IN} && systemctl reload ssh")
    with tempfile.TemporaryDirectory() as scratch:
        inventory = Path(scratch) / "bench_inventory.py"
        write_inventory(lab, args.hosts, inventory)
        for mode in args.modes.split(","):
            script = STAND_INS[mode]
            try:
                if script is not None:
                    text = shlex.quote("#!/bin/sh\n" + script + "\n")
                    on_nodes(lab, f"printf %s {text} > {STAND_IN} && chmod 755 {STAND_IN}")
                wall, peak, out = peak_rss_mib(inventory)
            finally:
                on_nodes(lab, f"rm -f {STAND_IN}")
            report = json.loads(out)
            checked, unchecked = len(report["checked_hosts"]), len(report["unreachable"])
            print(f"{mode:>9} {args.hosts:>6} {checked:>8} {unchecked:>8} {wall:>7.1f} "
                  f"{peak:>9.0f}")  # fmt: skip
            for reason in sorted(set(report["unreachable"].values())):
                print(f"{'':>9} not checked: {reason[:150]}")
    on_nodes(lab, f"rm -f {SSHD_DROP_IN} && systemctl reload ssh")


if __name__ == "__main__":
    main()

"""The lab's CA data: a generated private passphrase, made once (inventories/group_data/lab.py)."""

from __future__ import annotations

import stat
from pathlib import Path

from gpunode import pki
from lab import Lab


def test_lab_ca_gets_a_generated_private_passphrase_made_once(tmp_path: Path) -> None:
    lab = Lab(state_dir=tmp_path / "lab")
    passphrase_file = lab.ca_passphrase_file()
    assert stat.S_IMODE(passphrase_file.stat().st_mode) == 0o600
    first = pki.ca_passphrase({}, str(passphrase_file))
    assert first is not None and len(first) >= 32
    again = Lab(state_dir=tmp_path / "lab").ca_passphrase_file()
    assert again == passphrase_file
    assert pki.ca_passphrase({}, str(again)) == first, "the passphrase file is made only once"
    assert lab.ca_dir == tmp_path / "lab" / "ca"

"""The verify suite's sshd crypto lists (tests/verify/test_ssh.py, written out from ssh-audit's
policies apart from the product's) cover every release gpunode converges and agree with what
the product renders for it (gpunode/expected/sshd.py): a node of any supported release, Ubuntu
included, is checked against its own release's hardened policy."""

from __future__ import annotations

import pytest

from gpunode.distributions import DISTRIBUTIONS, Distribution
from gpunode.expected.sshd import HOST_KEY_ALGORITHMS, crypto_for
from tests.verify import test_ssh as verify


@pytest.mark.parametrize("row", DISTRIBUTIONS, ids=[row.codename for row in DISTRIBUTIONS])
def test_every_release_has_its_hardened_lists_in_the_verify_suite(row: Distribution) -> None:
    release = (row.os_id, row.version_id)
    assert release in verify.RELEASES
    product = crypto_for(row)
    assert verify.KEX_ALGORITHMS[release] == product.kex
    assert verify.MACS[release] == product.macs
    assert product.ciphers == verify.CIPHERS
    assert verify.HOST_KEY_ALGORITHMS == HOST_KEY_ALGORITHMS

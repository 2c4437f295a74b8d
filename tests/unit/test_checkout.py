"""gpunode and pyinfra from any directory: the inventory's checkout gives facts/ and roles/,
and a deploy that pyinfra started without the checkout's config.py refuses before it reads or
changes a node, saying how to give it."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.api import Config
from pyinfra.context import ctx_config

from gpunode import converge
from gpunode.control import checkout
from gpunode.control.checkout import find_checkout
from gpunode.control.exits import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))


def test_an_inventory_s_checkout_is_its_nearest_ancestor_with_deploys_roles_facts_config(
    tmp_path: Path,
) -> None:
    assert find_checkout(ROOT / "inventories" / "lab.py") == ROOT
    assert find_checkout(ROOT / "inventories" / "group_data" / "all.py") == ROOT
    other = tmp_path / "site"
    for name in ("deploys", "roles", "facts", "inventories"):
        (other / name).mkdir(parents=True)
    (other / "config.py").write_text("")
    assert find_checkout(other / "inventories" / "prod.py") == other


def test_an_inventory_outside_any_checkout_uses_the_running_gpunode_s(tmp_path: Path) -> None:
    assert find_checkout(tmp_path / "fleet.py") == ROOT == checkout.package_checkout()


def test_no_checkout_is_one_line_naming_where_gpunode_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkout, "package_checkout", lambda: tmp_path / "venv")
    (tmp_path / "a" / "deploys").mkdir(parents=True)  # a folder alone is no checkout
    with pytest.raises(ConfigurationError) as refused:
        find_checkout(tmp_path / "a" / "fleet.py")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        "no gpunode checkout (a directory holding deploys, roles, facts, config.py) for "
    )
    assert f"looked in {tmp_path / 'a'}, {tmp_path}, " in message
    assert message.endswith(f", /, {tmp_path / 'venv'}")


def test_the_checkout_s_config_py_is_what_a_deploy_needs() -> None:
    """Without it (pyinfra's defaults): refused, naming the working directory and how to
    give the config; once config.py ran, as pyinfra runs it, nothing is missing."""
    with ctx_config.use(Config()):
        unread = converge.checkout_config_unread()
        assert unread is not None
        assert f"pyinfra did not read {ROOT / 'config.py'}" in unread
        assert f"--chdir {ROOT}" in unread and f"--config {ROOT / 'config.py'}" in unread
        runpy.run_path(str(ROOT / "config.py"))
        assert converge.checkout_config_unread() is None


def test_pyinfra_from_another_directory_refuses_before_reading_a_node(tmp_path: Path) -> None:
    """`pyinfra /abs/inventory.py /abs/deploys/x.py` from elsewhere: pyinfra reads no
    config.py; the deploy stops the run with one line, before any fact is read (--dry)."""
    inventory = tmp_path / "local.py"
    inventory.write_text('hosts = ["@local"]\n')
    done = subprocess.run(
        [PYINFRA, "--dry", str(inventory), str(ROOT / "deploys" / "os_hardening.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert f"pyinfra did not read {ROOT / 'config.py'}" in output
    assert f"working directory ({tmp_path})" in output
    assert "Traceback" not in output


def test_every_inventory_here_speaks_the_hardened_key_exchange_before_any_connection(
    tmp_path: Path,
) -> None:
    """pyinfra started from another directory reads no config.py, yet connects to every host
    before it loads a deploy: loading an inventory of inventories/ (its group data, as
    pyinfra's CLI does, from anywhere) makes paramiko offer mlkem768x25519-sha256, so the run
    reaches a hardened Debian 13 node and the deploy can say what is missing, instead of a
    key-exchange traceback. The import adds no host data."""
    program = (
        "import json, sys, paramiko\n"
        "from pyinfra.api import State\n"
        "from pyinfra.context import ctx_state\n"
        "from pyinfra_cli.inventory import make_inventory\n"
        "before = 'mlkem768x25519-sha256' in paramiko.Transport._preferred_kex\n"
        "with ctx_state.use(State()):\n"
        "    inventory = make_inventory(sys.argv[1], cwd=sys.argv[2])\n"
        "host = next(iter(inventory))\n"
        "print(json.dumps({'before': before,\n"
        "                  'first': paramiko.Transport._preferred_kex[0],\n"
        "                  'keys': sorted(host.data.dict())}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program, str(ROOT / "inventories" / "prod.py"), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert loaded["before"] is False
    assert loaded["first"] == "mlkem768x25519-sha256"
    assert "nvidia_driver" in loaded["keys"]
    assert "ssh_kex" not in loaded["keys"]

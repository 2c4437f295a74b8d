"""The control host's drift timer (deploys/drift_timer.py): the textfile's directory, which
the deploy makes writable by the check's group, is always a directory gpunode owns; the
private key it copies is refused when others may read it (gpunode.secret_files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpunode.expected.timers import (
    NODE_EXPORTER_TEXTFILE_DIR,
    drift_output_dir_problem,
    drift_textfile_problem,
)
from gpunode.secret_files import SecretFileError, SecretFileExposed, read_secret_file


@pytest.mark.parametrize(
    "textfile",
    [
        "/var/lib/gpunode_drift.prom",  # /var/lib itself
        "/var/cache/apt/gpunode_drift.prom",  # a package's directory
        "/srv/gpunode_drift.prom",
        "/var/lib/gpunode/gpunode_drift.prom",  # gpunode's top, shared by everything of its
        "/var/lib/gpunodex/gpunode_drift.prom",  # only named like it
        "/var/lib/prometheus/gpunode_drift.prom",  # above node_exporter's directory
    ],
)
def test_a_textfile_outside_a_directory_gpunode_owns_is_refused_naming_the_directory(
    textfile: str,
) -> None:
    problem = drift_textfile_problem(textfile, "gpunode-drift")
    assert problem is not None
    directory = textfile.rsplit("/", 1)[0]
    assert problem.startswith(
        f"its directory {directory} would be made writable by group gpunode-drift"
    )
    assert NODE_EXPORTER_TEXTFILE_DIR in problem


@pytest.mark.parametrize(
    "textfile",
    [
        f"{NODE_EXPORTER_TEXTFILE_DIR}/gpunode_drift.prom",
        "/var/lib/gpunode/textfile/gpunode_drift.prom",
        "/srv/gpunode/metrics/gpunode_drift.prom",
    ],
)
def test_node_exporter_s_textfile_directory_or_one_of_gpunode_s_is_accepted(
    textfile: str,
) -> None:
    assert drift_textfile_problem(textfile, "gpunode-drift") is None


def test_the_textfile_directory_is_the_one_gpunode_s_node_exporter_reads() -> None:
    from gpunode.model import build_desired_state

    state, problems = build_desired_state({})
    assert problems == []
    assert state.gpu_metrics.textfile_dir == NODE_EXPORTER_TEXTFILE_DIR


def test_a_secret_file_is_read_only_when_private_to_its_owner(tmp_path: Path) -> None:
    key = tmp_path / "id_drift"
    key.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\n")
    key.chmod(0o600)
    assert read_secret_file(str(key), "x_drift_ssh_key", 64).startswith(b"-----BEGIN")
    for mode in (0o640, 0o604, 0o660, 0o610):
        key.chmod(mode)
        with pytest.raises(SecretFileExposed, match=f"mode {mode:04o}"):
            read_secret_file(str(key), "x_drift_ssh_key", 64)
    with pytest.raises(SecretFileError, match="not a regular file"):
        read_secret_file(str(tmp_path), "x_drift_ssh_key", 64)
    with pytest.raises(SecretFileError, match="No such file"):
        read_secret_file(str(tmp_path / "missing"), "x_drift_ssh_key", 64)


@pytest.mark.parametrize(
    "output_dir",
    ["/var/lib/apt", "/var/cache/man", "/var/lib/gpunode", "/srv/gpunode", "/var/lib/gpunodex/x"],
)
def test_an_output_directory_that_is_not_gpunode_s_is_never_given_to_the_check(
    output_dir: str,
) -> None:
    """The deploy makes the output directory the check's own (750): /var/lib/apt named there
    would change hands, and so would gpunode's top directory, which others share."""
    problem = drift_output_dir_problem(output_dir, "gpunode-drift")
    assert problem is not None
    assert problem.startswith("the directory would be given to gpunode-drift")


@pytest.mark.parametrize("output_dir", ["/var/lib/gpunode/drift", "/srv/gpunode/reports/drift"])
def test_an_output_directory_under_one_of_gpunode_s_is_accepted(output_dir: str) -> None:
    assert drift_output_dir_problem(output_dir, "gpunode-drift") is None

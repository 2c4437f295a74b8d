"""converging(): what happens before the first read of a node."""

from __future__ import annotations

from typing import Any

import pytest

from gpunode import converge
from gpunode.distributions import ARCHITECTURES, BY_CODENAME
from gpunode.model import build_desired_state


def test_dead_peer_detection_is_on_before_the_node_is_first_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first read fetches the whole fact batch (GPUs included): a node whose network goes
    # during it must fail the run, so keepalives must already be set (fault drill in
    # tests/integration/test_fault_drills.py cuts the link at exactly that read).
    events: list[str] = []
    desired, problems = build_desired_state({})
    assert problems == []
    architecture = ARCHITECTURES["amd64"]

    def read_node() -> Any:
        events.append("first read")
        return BY_CODENAME["bookworm"], architecture

    monkeypatch.setattr(converge, "checkout_config_unread", lambda: None)
    monkeypatch.setattr(converge.factcache, "install", lambda: None)
    monkeypatch.setattr(converge.pyinfra_patches, "replace_operation_order", lambda: None)
    monkeypatch.setattr(converge.pyinfra_patches, "remember_global_arguments", lambda: None)
    monkeypatch.setattr(converge, "desired_state", lambda: desired)
    monkeypatch.setattr(converge, "detect_dead_peer", lambda host: events.append("keepalive"))
    monkeypatch.setattr(converge, "this_node", read_node)
    monkeypatch.setattr(converge, "node_run_lock", lambda: events.append("lock"))
    with converge.converging() as on_node:
        assert on_node.nvidia_driver == desired.nvidia_driver
    assert events == ["keepalive", "first read", "lock"]

"""Fixtures shared by the integration modules (the session plane and the
per-test namespace come from localplane.pytest_plugin)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from realnode_harness import start_real_node

from localplane.plane import LocalPlane
from localplane.realnode import RealNode


@pytest.fixture(scope="module")
def real_node(plane: LocalPlane) -> Iterator[RealNode]:
    """One real node (kubelet + containerd) on the session plane for the module;
    stopped, and its host state removed, after the module's last test."""
    node = start_real_node(plane)
    yield node
    node.stop()
    print(f"[realnode] stopped in {node.timings['node_stop']:.1f}s")

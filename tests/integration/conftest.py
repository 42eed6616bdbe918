"""Fixtures shared by the integration modules (the session plane and the
per-test namespace come from localplane.pytest_plugin)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_harness import Stack, StackOf
from realnode_harness import start_real_node

from localplane.plane import LocalPlane
from localplane.realnode import RealNode


def _stacks(
    plane: LocalPlane, tmp_path_factory: pytest.TempPathFactory, module: str
) -> Iterator[StackOf]:
    started: list[Stack] = []

    def stack_of(
        nodes: list[Any],
        *,
        agent_extra: list[str] | None = None,
        operator_extra: list[str] | None = None,
    ) -> Stack:
        workdir = Path(tmp_path_factory.mktemp(module))
        s = Stack(plane, workdir, nodes, agent_extra=agent_extra, operator_extra=operator_extra)
        started.append(s.start())
        return s

    try:
        yield stack_of
    finally:
        for s in reversed(started):
            s.close()


@pytest.fixture(scope="module")
def stack_of(
    plane: LocalPlane, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[StackOf]:
    """`stack_of(nodes, agent_extra=..., operator_extra=...)` starts a `Stack` of
    those nodes (in a fresh folder named after the module) and returns it;
    each is closed after the module's last test. A module's `stack` fixture is
    this with its nodes (and whatever else it sets up around them)."""
    yield from _stacks(plane, tmp_path_factory, request.module.__name__.removeprefix("test_"))


@pytest.fixture
def stack_of_test(
    plane: LocalPlane, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[StackOf]:
    """`stack_of` for one test: its stacks are closed when the test ends."""
    yield from _stacks(plane, tmp_path_factory, request.node.name[:30])


@pytest.fixture(scope="module")
def real_node(plane: LocalPlane) -> Iterator[RealNode]:
    """One real node (kubelet + containerd) on the session plane for the module;
    stopped, and its host state removed, after the module's last test."""
    node = start_real_node(plane)
    yield node
    node.stop()
    print(f"[realnode] stopped in {node.timings['node_stop']:.1f}s")

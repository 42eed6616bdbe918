"""The benchmark's kwok nodes are created paced over a node Lease period."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.cluster import BATCH_EVERY_S, Cluster

from localplane import NodeSpec


class Plane:
    """Records when each batch of nodes was created; every node is Ready."""

    def __init__(self) -> None:
        self.batches: list[tuple[float, list[str]]] = []
        self.lock = threading.Lock()

    def add_nodes(self, specs: Sequence[NodeSpec], *, wait: bool = True) -> None:
        assert not wait
        with self.lock:
            self.batches.append((time.monotonic(), [s.name for s in specs]))

    def ready(self) -> list[dict[str, Any]]:
        names = [n for _, batch in self.batches for n in batch]
        cond = [{"type": "Ready", "status": "True"}]
        return [{"metadata": {"name": n}, "status": {"conditions": cond}} for n in names]


def cluster(tmp_path: Path, plane: Plane) -> Cluster:
    c = Cluster(tmp_path, 0, 1)
    c.plane = plane  # type: ignore[assignment]
    c.list = lambda *args: plane.ready()  # type: ignore[method-assign]
    return c


def test_nodes_are_created_in_batches_spread_over_the_period(tmp_path: Path) -> None:
    plane = Plane()
    names = [f"n-{i:03d}" for i in range(40)]
    t0 = time.monotonic()
    cluster(tmp_path, plane).add_nodes(names, spread_s=2.0)
    starts = sorted(t - t0 for t, _ in plane.batches)
    # A batch every half second over 2 s: 4 of 10 nodes, the last 1.5 s in.
    assert len(plane.batches) == round(2.0 / BATCH_EVERY_S)
    assert sorted(n for _, batch in plane.batches for n in batch) == names
    assert starts[-1] >= 1.5 - 0.05
    for a, b in itertools.pairwise(starts):
        assert b - a >= BATCH_EVERY_S - 0.05


def test_without_a_spread_the_nodes_are_created_at_once(tmp_path: Path) -> None:
    plane = Plane()
    t0 = time.monotonic()
    cluster(tmp_path, plane).add_nodes(["bn-base"], spread_s=0)
    assert [batch for _, batch in plane.batches] == [["bn-base"]]
    assert plane.batches[0][0] - t0 < 0.5

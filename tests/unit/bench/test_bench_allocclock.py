"""The clock of allocations that freed->reused capacity is timed with."""

from __future__ import annotations

from typing import Any, cast

from bench.allocclock import AllocationClock, reuse_delays
from kubernetes_asyncio import client


def alloc(name: str, uid: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"podUID": uid}}


class Lister:
    def list_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("not called: no watch is started")


def clock() -> AllocationClock:
    return AllocationClock(cast(client.CustomObjectsApi, Lister()), "bench")


def test_a_pod_is_placed_when_its_last_allocation_appears() -> None:
    c = clock()
    c.stamp("ADDED", alloc("a-0", "u1"), 1.0)
    assert c.all_created("u1", 2) is None
    c.stamp("MODIFIED", alloc("a-0", "u1"), 1.5)  # a later event does not move it
    c.stamp("ADDED", alloc("a-1", "u1"), 2.0)
    assert c.all_created("u1", 2) == 2.0
    assert c.all_created("u2", 1) is None


def test_capacity_is_freed_when_the_last_allocation_is_gone() -> None:
    c = clock()
    c.stamp("ADDED", alloc("a-0", "u1"), 1.0)
    c.stamp("ADDED", alloc("a-1", "u1"), 1.0)
    c.stamp("DELETED", alloc("a-0", "u1"), 5.0)
    assert c.all_gone("u1") is None
    c.stamp("DELETED", alloc("a-1", "u1"), 6.0)
    assert c.all_gone("u1") == 6.0
    assert c.all_gone("unknown") is None
    # An object without a pod UID (made by hand) is not counted.
    c.stamp("ADDED", {"metadata": {"name": "x"}, "spec": {}}, 1.0)
    assert "" not in c.created


def test_reuse_pairs_the_kth_release_with_the_kth_take() -> None:
    assert reuse_delays([3.0, 1.0, None], [1.5, 3.25, 9.0]) == [0.5, 0.25]
    # A take before its release (another capacity) counts as no delay.
    assert reuse_delays([2.0], [1.0]) == [0.0]
    assert reuse_delays([], [1.0]) == []

"""A pod left holding part of its vNPUs (one of its creates failed) whose
node then filled: it gives back what it holds and is placed again from
nothing, rather than holding it for good. Two pods holding half a node
each waited for each other forever in a 1000-node fill at exact capacity
after leader step-downs refused some of their creates."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException
from test_controller import FakeApi, World, pod

from vnpu_common.wire import names
from vnpu_operator.placement import MAX_COUNT
from vnpu_operator.placement.model import allocation_name

TEMPLATE = "vir10_3c_32g"  # two fill a 910B3 chip


class Refusing(FakeApi):
    """Refuses the creates of the allocations named in `refused`."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: set[str] = set()

    async def create_allocation(self, body: dict[str, Any]) -> bool:
        self._record("create_allocation", body)
        if body["metadata"]["name"] in self.refused:
            raise ApiException(status=500, reason="Internal Server Error")
        return True


def _gone(w: World, body: dict[str, Any]) -> None:
    """The watch's terminating update, then the deletion (its agent destroyed the vNPU)."""
    meta = {**body["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}
    w.controller.allocation_seen({**body, "metadata": meta})
    w.controller.allocation_gone({**body, "metadata": meta})


def _of(w: World, uid: str) -> list[dict[str, Any]]:
    return [b for b in w.created() if b["metadata"]["labels"][names.LABEL_POD_UID] == uid]


async def test_a_partial_booking_that_no_longer_fits_is_given_back_and_placed_again() -> None:
    w = World(api := Refusing())
    w.add_node("n1")
    w.controller.mark_synced()
    a = pod("a", "ua", template=TEMPLATE, count=2)
    api.refused = {allocation_name("a", "ua", 0)}
    w.controller.pod_event("ADDED", a)
    await w.settle()
    first, second = _of(w, "ua")[:2]
    # a holds its second vNPU; its first create keeps failing and is retried.
    w.controller.allocation_seen(second)
    w.controller.kick("ua")
    await w.settle()
    assert all(b["metadata"]["name"] == first["metadata"]["name"] for b in _of(w, "ua")[2:])
    # Between two of a's tries, b takes the slot its failed create gave back.
    w.controller.pod_event("ADDED", pod("b", "ub", template=TEMPLATE, count=1))
    await w.settle()
    (b_alloc,) = _of(w, "ub")
    assert b_alloc["spec"]["vnpuId"] == first["spec"]["vnpuId"]
    w.controller.allocation_seen(b_alloc)

    refused, held = first, second
    w.controller.kick("ua")
    await w.settle()
    held_key = f"ns/{held['metadata']['name']}"
    assert w.api.of("delete_allocation") == [held_key]
    (status, reason, message) = w.api.of("set_pod_condition")[-1]
    assert (status, reason) == ("False", names.REASON_WAITING)
    assert message == (
        "1 of its 2 vNPUs were placed on node n1, where the rest no longer fit; "
        "giving them back to place the pod again"
    )
    # Asked again before the deletion lands: no second delete.
    w.controller.kick("ua")
    await w.settle()
    assert w.api.of("delete_allocation") == [held_key]

    _gone(w, held)
    await w.settle()
    tried = len(_of(w, "ua"))
    w.controller.kick("ua")
    await w.settle()
    assert len(_of(w, "ua")) == tried  # nothing fits while b holds half the chip: a waits
    assert w.controller.state("ua").waiting_since is not None
    _gone(w, b_alloc)
    await w.settle()
    again = _of(w, "ua")[tried:]
    assert [b["spec"]["nodeName"] for b in again] == ["n1", "n1"]
    # New names: an agent still finishing the old objects never mistakes the new ones.
    old = {refused["metadata"]["name"], held["metadata"]["name"]}
    assert not old & {b["metadata"]["name"] for b in again}
    assert [b["metadata"]["name"] for b in again] == [
        allocation_name("a", "ua", MAX_COUNT + i) for i in range(2)
    ]


async def test_a_partial_booking_that_still_fits_is_completed_in_place() -> None:
    w = World()
    w.add_node("n1")
    w.controller.mark_synced()
    w.api.fail["create_allocation"] = ApiException(status=500, reason="Internal Server Error")
    w.controller.pod_event("ADDED", pod("a", "ua", template=TEMPLATE, count=2))
    await w.settle()
    refused, held = _of(w, "ua")
    w.controller.allocation_seen(held)
    w.controller.kick("ua")
    await w.settle()
    assert w.api.of("delete_allocation") == []
    assert _of(w, "ua")[2:] == [refused]  # the same object created again

"""A replica that starts reconciling releases what is gone before it places
what is new, namespace by namespace (vnpu_operator.takeover): while no
replica led, a quota that freed for pods whose containers stopped admitted
new pods, and placing those first would hold more real vNPUs than the
quota allows. The same through a real takeover, counted on the nodes, is
tests/integration/test_takeover_quota.py."""

from __future__ import annotations

import asyncio
from typing import Any

from test_controller import World

from localplane.pods import vnpu_pod
from vnpu_common.wire import names

TEMPLATE = "vir05_1c_16g"


def pod(name: str, namespace: str) -> dict[str, Any]:
    return vnpu_pod(
        name, namespace, uid=f"{namespace}-{name}", template=TEMPLATE, containers=["c"],
        finalizers=[names.POD_FINALIZER], scheduling_gates=[names.SCHEDULING_GATE],
        phase="Pending",
    )  # fmt: skip


def deleted(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod deleted with grace 0 (its containers are known stopped: the
    quota stops counting it now)."""
    meta = {**obj["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z",
            "deletionGracePeriodSeconds": 0}  # fmt: skip
    return {**obj, "metadata": meta}


async def running(w: World, *pods: dict[str, Any]) -> list[dict[str, Any]]:
    """`pods` placed, their allocations Ready; returns the allocations."""
    for p in pods:
        w.controller.pod_event("ADDED", p)
    await w.settle()
    w.echo_created(names.PHASE_READY)
    await w.settle()
    return w.created()


async def outage_then_lead(w: World, bound: float | None = None) -> dict[str, Any]:
    """While the replica does not lead, ns/old is deleted and ns/new and
    other/new are created; then it leads. Returns ns/old's allocation."""
    w.add_node("n1", chips=2)
    w.controller.mark_synced()
    (old_alloc,) = await running(w, pod("old", "ns"))
    w.controller.leading = lambda: False
    w.controller.follow()
    w.controller.pod_event("MODIFIED", deleted(pod("old", "ns")))
    w.controller.pod_event("ADDED", pod("new", "ns"))
    w.controller.pod_event("ADDED", pod("new", "other"))
    await w.settle()
    assert w.api.of("delete_allocation") == []  # a standby writes nothing
    w.controller.leading = lambda: True
    if bound is not None:
        w.controller.release_first.bound = bound
    w.controller.lead()
    await w.settle()
    return old_alloc


def placed(w: World) -> list[str]:
    return [f"{b['metadata']['namespace']}/{b['spec']['podName']}" for b in w.created()]


async def test_a_new_leader_places_in_a_namespace_only_once_its_releases_are_done() -> None:
    w = World()
    old_alloc = await outage_then_lead(w)
    old_key = f"ns/{old_alloc['metadata']['name']}"
    assert w.api.of("delete_allocation") == [old_key]
    # Another namespace has nothing to release: it places at once.
    assert placed(w) == ["ns/old", "other/new"]
    # The agent destroys the vNPU and removes the finalizer: the allocation goes.
    gone = {**old_alloc, "metadata": {**old_alloc["metadata"],
            "deletionTimestamp": "2026-01-01T00:00:01Z"}, "status": {"phase": "Ready"}}  # fmt: skip
    w.controller.allocation_gone(gone)
    await w.settle()
    assert placed(w) == ["ns/old", "other/new", "ns/new"]


async def test_a_release_that_does_not_finish_holds_placements_only_for_the_bound() -> None:
    w = World()
    await outage_then_lead(w, bound=0.05)
    assert placed(w) == ["ns/old", "other/new"]
    # The agent defers the destroy (a process holds the device open): after
    # the bound the namespace places anyway.
    await asyncio.sleep(0.1)
    await w.settle()
    assert placed(w) == ["ns/old", "other/new", "ns/new"]


async def test_a_replica_with_nothing_to_release_places_at_once() -> None:
    w = World()
    w.add_node("n1")
    w.controller.leading = lambda: False
    w.controller.mark_synced()
    w.controller.pod_event("ADDED", pod("a", "ns"))
    await w.settle()
    assert placed(w) == []
    w.controller.leading = lambda: True
    w.controller.lead()
    await w.settle()
    assert not w.controller.release_first.active
    assert placed(w) == ["ns/a"]

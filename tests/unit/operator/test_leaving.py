"""A pod placed into the capacity of a pod leaving its node is ungated only
once kube-scheduler's sum on that node fits (vnpu_operator.leaving): the
controller with a fake API, and the sum itself."""

from __future__ import annotations

import asyncio
from typing import Any

from test_controller import World, big, node_obj

from vnpu_common.wire import names
from vnpu_operator.leaving import over_allocatable
from vnpu_operator.steps import pin

VNPUS = names.RES_VNPUS


def charged(p: dict[str, Any], vnpus: int = 2) -> dict[str, Any]:
    """`p` as the webhook charges it: its count in vnpu.io/vnpus."""
    amount = {VNPUS: str(vnpus)}
    p["spec"]["containers"][0]["resources"] = {"requests": amount, "limits": dict(amount)}
    return p


def running(p: dict[str, Any], node: str) -> dict[str, Any]:
    """`p` ungated, bound to `node` and running."""
    p["spec"].pop("schedulingGates", None)
    p["spec"]["nodeName"] = node
    p["status"] = {"phase": "Running"}
    return p


def deleting(p: dict[str, Any]) -> dict[str, Any]:
    p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return p


async def a_leaving_pod(allocatable: int, phase: str | None = None) -> World:
    """Node n1 (allocatable `allocatable` vNPUs in the Node's status) full of
    big0, which is deleted; its vNPUs are gone but its object stays (with
    `phase`, if given); big1, waiting for its room, is placed there and its
    vNPUs are Ready."""
    w = World()
    w.add_node("n1")
    node = node_obj("n1")
    node["status"] = {"allocatable": {VNPUS: str(allocatable)}}
    w.controller.inventories.node_event(None, node)
    w.controller.mark_synced()
    w.controller.pod_event("ADDED", charged(big(0)))
    w.controller.pod_event("ADDED", charged(big(1)))
    await w.settle()
    w.echo_created(names.PHASE_READY)
    await w.settle()
    assert len(w.api.of("patch_pod")) == 1  # big0 pinned; big1 waits
    first = w.created()
    leaving = deleting(running(charged(big(0)), "n1"))
    if phase:
        leaving["status"]["phase"] = phase
    w.controller.pod_event("MODIFIED", leaving)
    await w.settle()
    for body in first:
        w.controller.allocation_gone(body)
    await w.settle()
    assert w.api.of("remove_pod_finalizer") == ["big0"]
    for body in w.created()[len(first) :]:
        w.controller.allocation_seen({**body, "status": {"phase": names.PHASE_READY}})
    await w.settle()
    return w


async def test_a_pod_whose_node_is_full_in_the_schedulers_sum_waits_for_the_leaving_pod() -> None:
    w = await a_leaving_pod(allocatable=2)
    assert len(w.api.of("patch_pod")) == 1, "big1 was ungated while big0 still counts"
    # Told nothing at first: most holds end within moments.
    assert names.REASON_WAITING_FOR_LEAVING not in [r for _, r, _ in w.api.of("set_pod_condition")]
    # Held for TELL_HELD_AFTER: told once, however often it is reconciled.
    pinner = w.controller.pinner
    later = pinner.clock() + pin.TELL_HELD_AFTER
    pinner.clock = lambda: later
    for _ in range(2):
        w.controller.pod_event("MODIFIED", deleting(running(charged(big(0)), "n1")))
        await w.settle()
    assert len(w.api.of("patch_pod")) == 1
    status, reason, message = w.api.of("set_pod_condition")[-1]
    assert (status, reason) == ("False", names.REASON_WAITING_FOR_LEAVING)
    assert message.startswith("vNPU 100,101 ready on node n1; ungated once ns/big0 is gone")
    assert [r for r, _ in w.api.of("event")].count(names.REASON_WAITING_FOR_LEAVING) == 1
    # big0's object goes: big1 is pinned at once, and its condition turned.
    w.controller.pod_event("DELETED", deleting(running(charged(big(0)), "n1")))
    await w.settle()
    assert len(w.api.of("patch_pod")) == 2
    assert w.api.of("set_pod_condition")[-1][:2] == ("True", names.REASON_ALLOCATED)


async def test_a_held_pod_is_reconciled_when_it_is_due_to_be_told() -> None:
    w = await a_leaving_pod(allocatable=2)
    kicked: list[str] = []
    w.controller.pinner.kick = kicked.append
    assert w.controller.pinner.timers.armed("u1")
    w.controller.pinner.timers.arm("u1", 0.01)
    await asyncio.sleep(0.05)
    assert kicked == ["u1"]


async def test_a_node_with_room_in_the_schedulers_sum_pins_at_once() -> None:
    w = await a_leaving_pod(allocatable=4)
    assert len(w.api.of("patch_pod")) == 2
    assert names.REASON_WAITING_FOR_LEAVING not in [r for r, _ in w.api.of("event")]


async def test_a_terminal_pod_is_not_counted_by_the_scheduler_so_holds_nothing() -> None:
    w = await a_leaving_pod(allocatable=2, phase="Succeeded")
    assert len(w.api.of("patch_pod")) == 2


async def test_a_running_pod_without_vnpus_holds_no_pin() -> None:
    """Only pods being deleted hold a pin: a wait on anything else might
    never end."""
    w = World()
    w.add_node("n1")
    node = node_obj("n1")
    node["status"] = {"allocatable": {VNPUS: "2"}}
    w.controller.inventories.node_event(None, node)
    w.controller.mark_synced()
    # A pod bound to n1, charged, holding no allocation (its were taken by hand).
    w.controller.pod_event("ADDED", running(charged(big(7)), "n1"))
    w.controller.pod_event("ADDED", charged(big(1)))
    await w.settle()
    w.echo_created(names.PHASE_READY)
    await w.settle()
    assert [b["spec"]["podUID"] for b in w.created()] == ["u1", "u1"]
    assert len(w.api.of("patch_pod")) == 1


def test_the_sum_judges_only_what_the_node_shows() -> None:
    two = {VNPUS: 2, names.RES_AICORE: 10}
    assert over_allocatable({VNPUS: "4"}, [two, two]) == []
    assert over_allocatable({VNPUS: "3"}, [two, two]) == [VNPUS]
    assert over_allocatable({VNPUS: "4", names.RES_AICORE: "19"}, [two, two]) == [names.RES_AICORE]
    assert over_allocatable({}, [two, two]) == []
    assert over_allocatable({VNPUS: "1"}, []) == []

"""An allocation that goes without its agent's destroy is no destroyed vNPU
(vnpu_operator.controller.Controller._destroyed): a tenant or an admin removing
the finalizer of one whose destroy was deferred (phase Releasing: the vNPU is
open) frees neither its id nor its capacity; they stay booked while the node's
inventory lists the vNPU, and the next pod there gets another id."""

from __future__ import annotations

from typing import Any

from test_controller import World, pod
from tests.unit.placement.placement_helpers import chip

from vnpu_common.wire import names
from vnpu_common.wire.models import VNPUNodeStatus

TEMPLATE = "vir05_1c_16g"


def inventory(listed: list[int], version: int) -> dict[str, Any]:
    status = VNPUNodeStatus(
        driver="sim", chips=[chip("910B3", 0, vnpus=[(i, TEMPLATE) for i in listed])]
    )
    return {
        "metadata": {"name": "n1", "resourceVersion": str(version)},
        "status": status.to_api(),
    }


async def _running(w: World) -> dict[str, Any]:
    """Pod p on n1 with its vNPU Ready and listed by the inventory."""
    w.add_node("n1")
    w.controller.mark_synced()
    w.controller.pod_event("ADDED", pod("p", "u1", template=TEMPLATE))
    await w.settle()
    (body,) = w.created()
    w.echo_created(names.PHASE_READY)
    w.controller.inventories.vnpunode_event(None, inventory([body["spec"]["vnpuId"]], 10))
    await w.settle()
    return body


def _gone(body: dict[str, Any], phase: str) -> dict[str, Any]:
    """The allocation's last stored state, as the DELETED event reports it."""
    meta = {**body["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z",
            "resourceVersion": "20"}  # fmt: skip
    return {**body, "metadata": meta, "status": {"phase": phase}}


async def _next_id(w: World, name: str, uid: str) -> int:
    w.controller.pod_event("ADDED", pod(name, uid, template=TEMPLATE))
    await w.settle()
    body = w.created()[-1]
    assert body["spec"]["podUID"] == uid
    return int(body["spec"]["vnpuId"])


async def test_a_deferred_destroy_keeps_the_id_booked_until_an_inventory_without_it() -> None:
    w = World()
    first = await _running(w)
    held = first["spec"]["vnpuId"]
    # The tenant's attack: owner pointed at nothing, the garbage collector deletes,
    # the agent defers the destroy (open), the finalizer is removed by hand.
    w.controller.allocation_gone(_gone(first, names.PHASE_RELEASING))
    await w.settle()
    (cap,) = w.controller.ledger.capacity("n1")
    assert cap.orphans == 1  # still holds its capacity
    second = await _next_id(w, "q", "u2")
    assert second != held

    # The vNPU is destroyed at last (its container let go, the agent collected
    # it): the next inventory no longer lists it, and its id is free again.
    w.controller.inventories.vnpunode_event(None, inventory([second], 30))
    await w.settle()
    assert w.controller.ledger.capacity("n1")[0].orphans == 0
    assert await _next_id(w, "r", "u3") == held


async def test_a_vanished_allocation_on_a_node_without_a_live_agent_is_not_destroyed() -> None:
    w = World()
    first = await _running(w)
    w.now += 3600  # the agent's Lease expired: nobody there destroyed anything
    w.controller.allocation_gone(_gone(first, names.PHASE_READY))
    await w.settle()
    assert w.controller.ledger.capacity("n1")[0].orphans == 1


async def test_the_agents_own_release_frees_the_id_at_once() -> None:
    w = World()
    first = await _running(w)
    w.controller.allocation_gone(_gone(first, names.PHASE_READY))
    await w.settle()
    # The inventory, published seconds apart, still lists the destroyed vNPU.
    assert w.controller.ledger.capacity("n1")[0].orphans == 0
    assert await _next_id(w, "q", "u2") == first["spec"]["vnpuId"]

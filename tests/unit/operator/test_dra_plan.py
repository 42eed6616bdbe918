"""The DRA front-end's decisions (vnpu_operator.dra.plan): which allocations a
ResourceClaim gets, which go, and what its devices' binding conditions say."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tests.unit.placement.placement_helpers import chip, node

from vnpu_common.wire import names
from vnpu_operator.dra.plan import (
    CLAIM_DELETING,
    AllocInfo,
    ClaimDevice,
    Refusal,
    alloc_info,
    claim_view,
    pick_vnpu_id,
    plan,
)
from vnpu_operator.placement import Allocation, Ledger, NodeInventory

DEV0 = names.dra_device_name(0, "vir05_1c_16g", 0)
DEV1 = names.dra_device_name(0, "vir05_1c_16g", 1)


def claim(
    *devices: str,
    uid: str = "c-uid",
    statuses: list[dict[str, Any]] | None = None,
    deleting: bool = False,
    other_driver: bool = False,
) -> dict[str, Any]:
    results = [
        {"request": "npu", "driver": names.DRA_DRIVER, "pool": "n1", "device": d} for d in devices
    ]
    if other_driver:
        results.append(
            {"request": "gpu", "driver": "gpu.example.com", "pool": "n1", "device": "g0"}
        )
    meta: dict[str, Any] = {"name": "c", "namespace": "ns", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "p-uid"}],
        "devices": statuses or [],
    }
    if results:
        status["allocation"] = {"devices": {"results": results}}
    return {"metadata": meta, "status": status}


def alloc(device: str, phase: str | None = None, *, uid: str = "c-uid", deleting: bool = False,
          message: str = "") -> AllocInfo:  # fmt: skip
    return AllocInfo(
        key=f"ns/{names.dra_allocation_name(uid, device)}",
        claim_uid=uid,
        device=device,
        phase=phase,
        message=message,
        deleting=deleting,
    )


def conditions(statuses: list[dict[str, Any]] | None, device: str) -> dict[str, str]:
    entry = next(e for e in statuses or [] if e["device"] == device)
    return {c["type"]: c["status"] for c in entry["conditions"]}


def test_every_allocated_device_of_ours_gets_one_allocation() -> None:
    todo = plan(claim_view(claim(DEV0, DEV1, other_driver=True)), [])
    assert todo.create == [ClaimDevice("npu", "n1", DEV0), ClaimDevice("npu", "n1", DEV1)]
    assert todo.release == []
    assert todo.statuses is None  # nothing to say until a vNPU is ready or failed


def test_pending_allocations_leave_the_claim_alone() -> None:
    todo = plan(claim_view(claim(DEV0)), [alloc(DEV0, names.PHASE_PENDING)])
    assert (todo.create, todo.release, todo.statuses) == ([], [], None)


def test_a_ready_vnpu_sets_the_binding_condition_once() -> None:
    todo = plan(claim_view(claim(DEV0)), [alloc(DEV0, names.PHASE_READY)])
    assert todo.statuses is not None
    assert conditions(todo.statuses, DEV0) == {names.DRA_COND_READY: "True"}
    again = plan(claim_view(claim(DEV0, statuses=todo.statuses)), [alloc(DEV0, names.PHASE_READY)])
    assert again.statuses is None


def test_a_failed_vnpu_fails_the_binding_with_the_agents_message() -> None:
    failed = alloc(DEV0, names.PHASE_FAILED, message="driver: no room on chip 0")
    todo = plan(claim_view(claim(DEV0)), [failed])
    assert conditions(todo.statuses, DEV0) == {
        names.DRA_COND_FAILED: "True",
        names.DRA_COND_READY: "False",
    }
    (entry,) = todo.statuses or []
    assert any("no room on chip 0" in c["message"] for c in entry["conditions"])
    assert todo.create == []  # the failed one stays until the scheduler gives the claim back


def test_a_deallocated_claim_releases_and_clears_its_conditions() -> None:
    ready = plan(claim_view(claim(DEV0)), [alloc(DEV0, names.PHASE_READY)]).statuses
    deallocated = claim(statuses=ready)
    todo = plan(claim_view(deallocated), [alloc(DEV0, names.PHASE_READY)])
    assert todo.release == [alloc(DEV0).key]
    assert todo.statuses == []  # our entries removed: a new allocation starts unbound
    assert todo.create == []


def test_a_gone_claim_releases_everything() -> None:
    allocs = [alloc(DEV0, names.PHASE_READY), alloc(DEV1, names.PHASE_PENDING)]
    assert sorted(plan(None, allocs).release) == sorted(a.key for a in allocs)


def test_a_deleting_claim_still_allocated_keeps_its_allocations_and_statuses() -> None:
    """Issue 54 item 2: the claim stays allocated and reserved for its pod while
    it is being deleted, and the kubelet may still prepare it: its vNPUs stay."""
    allocs = [alloc(DEV0, names.PHASE_READY), alloc(DEV1, names.PHASE_PENDING)]
    ready = plan(claim_view(claim(DEV0, DEV1)), allocs).statuses
    deleting = plan(claim_view(claim(DEV0, DEV1, deleting=True, statuses=ready)), allocs)
    assert deleting.release == []
    assert deleting.create == []
    assert deleting.statuses is None  # nothing to change: the ready condition stays
    # The pending one turning Ready still sets its condition.
    both = [alloc(DEV0, names.PHASE_READY), alloc(DEV1, names.PHASE_READY)]
    later = plan(claim_view(claim(DEV0, DEV1, deleting=True, statuses=ready)), both)
    assert later.release == []
    assert conditions(later.statuses, DEV1) == {names.DRA_COND_READY: "True"}
    assert conditions(later.statuses, DEV0) == {names.DRA_COND_READY: "True"}


def test_a_deleting_claim_gets_no_new_allocation_its_device_fails_instead() -> None:
    kept = alloc(DEV0, names.PHASE_READY)
    todo = plan(claim_view(claim(DEV0, DEV1, deleting=True)), [kept])
    assert todo.create == []
    assert todo.release == []
    assert conditions(todo.statuses, DEV1)[names.DRA_COND_FAILED] == "True"
    assert conditions(todo.statuses, DEV0) == {names.DRA_COND_READY: "True"}
    assert {d: r.reason for d, r in todo.refused.items()} == {DEV1: CLAIM_DELETING}


def test_a_deleting_claim_that_was_deallocated_releases() -> None:
    allocs = [alloc(DEV0, names.PHASE_READY)]
    todo = plan(claim_view(claim(deleting=True)), allocs)
    assert todo.release == [allocs[0].key]


def test_a_refusal_is_reported_once_for_the_metric() -> None:
    refusal = Refusal("NoCapacity", "chip 0 of node n1 has no room")
    first = plan(claim_view(claim(DEV0)), [], {DEV0: refusal})
    assert first.refused == {DEV0: refusal}
    again = plan(claim_view(claim(DEV0, statuses=first.statuses)), [], {DEV0: refusal})
    assert again.statuses is None
    assert again.refused == {}


def test_a_claim_recreated_under_its_name_gets_new_allocations() -> None:
    old = alloc(DEV0, names.PHASE_READY, uid="old-uid")
    todo = plan(claim_view(claim(DEV0, uid="new-uid")), [old])
    assert todo.release == [old.key]
    assert todo.create == [ClaimDevice("npu", "n1", DEV0)]


def test_a_device_whose_old_allocation_still_goes_waits_for_it() -> None:
    going = alloc(DEV0, names.PHASE_RELEASING, deleting=True)
    todo = plan(claim_view(claim(DEV0)), [going])
    assert (todo.create, todo.release, todo.blocked) == ([], [], [DEV0])


def test_a_device_that_cannot_be_served_fails_its_binding() -> None:
    todo = plan(claim_view(claim(DEV0, DEV1)), [], {DEV1: "no free vNPU id on chip 0"})
    assert todo.create == [ClaimDevice("npu", "n1", DEV0)]
    assert conditions(todo.statuses, DEV1)[names.DRA_COND_FAILED] == "True"


def test_only_claim_allocations_are_read() -> None:
    assert (
        alloc_info({"metadata": {"name": "a", "namespace": "ns"}, "spec": {"podUID": "x"}}) is None
    )
    body = {
        "metadata": {"name": "a", "namespace": "ns", "deletionTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"claim": {"uid": "u", "device": DEV0, "name": "c", "request": "npu"}},
        "status": {"phase": "Releasing"},
    }
    assert alloc_info(body) == AllocInfo("ns/a", "u", DEV0, "Releasing", "", True)


def dra(inventory: NodeInventory) -> NodeInventory:
    return replace(inventory, status=inventory.status.model_copy(update={"dra": True}))


def test_the_vnpu_id_is_the_lowest_free_on_the_node() -> None:
    ledger = Ledger()
    # 100 is listed by the node with no allocation (a foreign vNPU): taken too.
    ledger.upsert_node(
        dra(node("n1", [chip("910B3", 0, id_range=(100, 103), vnpus=[(100, "vir05_1c_16g")])]))
    )
    ledger.add_allocation(Allocation("ns/x", "n1", 0, "vir05_1c_16g", 101, "p", "p"))
    assert pick_vnpu_id(ledger.node_state("n1"), DEV0) == 102


def test_no_vnpu_id_without_a_node_a_chip_a_template_or_a_free_id() -> None:
    ledger = Ledger()
    ledger.upsert_node(
        dra(node("n1", [chip("910B3", 0, id_range=(100, 100), vnpus=[(100, "vir05_1c_16g")])]))
    )
    state = ledger.node_state("n1")
    assert "no VNPUNode" in str(pick_vnpu_id(None, DEV0, "n1"))
    assert "not one the agent publishes" in str(pick_vnpu_id(state, "gpu-0"))
    assert "no chip 3" in str(pick_vnpu_id(state, names.dra_device_name(3, "vir05_1c_16g", 0)))
    assert "does not offer" in str(pick_vnpu_id(state, names.dra_device_name(0, "vir99_9c", 0)))
    assert "no free vNPU id" in str(pick_vnpu_id(state, DEV0))


def test_device_names_round_trip() -> None:
    for template in ("vir05_1c_16g", "vir01", "vir10_4c_16g_m"):
        name = names.dra_device_name(7, template, 12)
        assert names.parse_dra_device_name(name) == (7, template, 12)
    assert names.parse_dra_device_name("npu-x-vir01-1") is None

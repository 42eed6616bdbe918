"""Ledger behaviour: filters, policies, NoFit reporting and bookkeeping."""

from __future__ import annotations

import re

import pytest
from placement_helpers import affinity, chip, expr, node, nofit, placed, request

from vnpu_common.wire import names
from vnpu_common.wire.models import ObjectMeta, VNPUAllocation
from vnpu_operator.placement import (
    Allocation,
    AllocationConflictError,
    InvalidAllocationError,
    InvalidInventoryError,
    Ledger,
    NodeInventory,
    NoFit,
    Placement,
    PodRequest,
    Policy,
    Reason,
    allocation_name,
)


def ledger_with(*inventories: NodeInventory) -> Ledger:
    return Ledger.rebuild(inventories, ())


def slots(p: Placement) -> list[tuple[str, int]]:
    return [(a.node, a.chip) for a in p.allocations]


# ------------------------------------------------------------------ filters

NOSCHED = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("inventory", "req", "reason"),
    [
        (node("n", live=False), request(), Reason.NODE_NOT_LIVE),
        (
            node("n", labels={"pool": "x"}),
            request(node_selector={"pool": "y"}),
            Reason.NODE_SELECTOR,
        ),
        (
            node("n", labels={"pool": "x"}),
            request(affinity=affinity([expr("pool", "NotIn", "x")])),
            Reason.NODE_AFFINITY,
        ),
        (node("n", taints=[NOSCHED]), request(), Reason.TAINT),
        (
            node("n", taints=[{"key": "evict", "effect": "NoExecute"}]),
            request(tolerations=[{"key": "evict", "operator": "Exists", "effect": "NoSchedule"}]),
            Reason.TAINT,
        ),
        (node("n", []), request(), Reason.NO_CHIPS),
        (node("n"), request(chip_model="910B4"), Reason.CHIP_MODEL),
        (node("n", [chip(health="Unhealthy")]), request(), Reason.UNHEALTHY),
        (node("n", [chip(health="Unknown")]), request(), Reason.UNHEALTHY),
        (node("n"), request(template="vir01"), Reason.TEMPLATE_NOT_OFFERED),
    ],
)
def test_each_filter_rejects(inventory: NodeInventory, req: PodRequest, reason: Reason) -> None:
    result = nofit(ledger_with(inventory).place(req))
    assert result.node_reasons == {"n": reason}
    assert result.primary_reason is reason


@pytest.mark.parametrize(
    ("inventory", "req"),
    [
        (node("n", labels={"pool": "x"}), request(node_selector={"pool": "x"})),
        (node("n", labels={"gen": "5"}), request(affinity=affinity([expr("gen", "Gt", "4")]))),
        (node("n", taints=[NOSCHED]), request(tolerations=[{"key": "dedicated", "value": "ml"}])),
        (node("n", taints=[NOSCHED]), request(tolerations=[{"operator": "Exists"}])),
        (node("n", taints=[{"key": "soft", "effect": "PreferNoSchedule"}]), request()),
        (node("n"), request(chip_model="910B3")),
    ],
)
def test_each_filter_admits(inventory: NodeInventory, req: PodRequest) -> None:
    assert placed(ledger_with(inventory).place(req)).node == "n"


def test_affinity_match_fields_pins_a_node() -> None:
    pin = {"nodeSelectorTerms": [{"matchFields": [expr("metadata.name", "In", "b")]}]}
    ledger = ledger_with(node("a"), node("b"), node("c"))
    assert placed(ledger.place(request(affinity=pin))).node == "b"


def test_chip_model_picks_matching_chip_on_mixed_node() -> None:
    mixed = node("n", [chip("910B3", 0), chip("910B4", 1)])
    p = placed(ledger_with(mixed).place(request(template="vir05_1c_8g", chip_model="910B4")))
    assert [(a.chip, a.vnpu_id) for a in p.allocations] == [(1, 116)]


def test_unhealthy_chip_is_skipped_for_a_healthy_one() -> None:
    n = node("n", [chip("910B3", 0, health="Unhealthy"), chip("910B3", 1)])
    assert slots(placed(ledger_with(n).place(request()))) == [("n", 1)]


# ----------------------------------------------------------------- policies


def test_count_three_lands_on_one_node_across_chips() -> None:
    # Each chip has room for two vir10; a pod of three needs both chips.
    ledger = ledger_with(node("a", "910B3"), node("b", "910B3", n_chips=2))
    p = placed(ledger.place(request("big", "vir10_3c_32g", count=3)))
    assert slots(p) == [("b", 0), ("b", 0), ("b", 1)]
    assert p.vnpu_ids == (100, 101, 116)


def test_count_never_splits_across_nodes() -> None:
    ledger = ledger_with(node("a", "910B3"), node("b", "910B3"))
    result = nofit(ledger.place(request("big", "vir10_3c_32g", count=3)))
    assert result.reasons == {Reason.INSUFFICIENT_AICORE: 2}
    assert ledger.allocations() == []


def test_binpack_fills_a_chip_before_the_next() -> None:
    ledger = ledger_with(node("n", "910B3", n_chips=2))
    assert slots(placed(ledger.place(request("a", count=2)))) == [("n", 0), ("n", 0)]
    assert slots(placed(ledger.place(request("b")))) == [("n", 0)]


def test_spread_uses_the_least_used_chip() -> None:
    ledger = ledger_with(node("n", "910B3", n_chips=2))
    assert slots(placed(ledger.place(request("a", count=2), Policy.SPREAD))) == [
        ("n", 0),
        ("n", 1),
    ]
    assert slots(placed(ledger.place(request("b", count=3), Policy.SPREAD))) == [
        ("n", 0),
        ("n", 1),
        ("n", 0),
    ]


def test_binpack_keeps_a_whole_chip_free_for_a_large_template() -> None:
    ledger = ledger_with(node("n", "910B3", n_chips=2))
    placed(ledger.place(request("small")))
    placed(ledger.place(request("mid", "vir10_3c_32g")))
    # Chip 1 is still whole: two vir10 fit there.
    assert slots(placed(ledger.place(request("big", "vir10_3c_32g", count=2)))) == [
        ("n", 1),
        ("n", 1),
    ]


def test_binpack_prefers_the_busier_node_spread_the_idler() -> None:
    ledger = ledger_with(node("a", "910B3"), node("b", "910B3"), node("c", "910B3"))
    ledger.add_allocation(Allocation("ns/x-0", "b", 0, "vir05_1c_16g", 100, "uid-x", "x"))
    assert placed(ledger.place(request("p"))).node == "b"
    assert placed(ledger.place(request("q"), Policy.SPREAD)).node == "a"
    assert placed(ledger.place(request("r"), Policy.SPREAD)).node == "c"


def test_ties_break_by_node_name_whatever_the_insertion_order() -> None:
    for policy in Policy:
        ledger = ledger_with(node("z"), node("m"), node("a"))
        assert placed(ledger.place(request(), policy)).node == "a"


# ------------------------------------------------------------------- NoFit

POOL = {"pool": "train"}


def test_nofit_tally_and_message_in_scheduler_style() -> None:
    half_full = chip("910B3", 0, vnpus=[(100, "vir10_3c_32g")])
    inventories = [node(f"full-{i}", [half_full], labels=POOL) for i in range(5)]
    inventories += [node(f"other-{i}") for i in range(4)]
    inventories += [node(f"tainted-{i}", labels=POOL, taints=[NOSCHED]) for i in range(3)]
    result = nofit(
        ledger_with(*inventories).place(
            request(template="vir10_3c_32g", count=2, node_selector=POOL)
        )
    )
    assert result.total_nodes == 12
    assert result.reasons == {
        Reason.INSUFFICIENT_AICORE: 5,
        Reason.NODE_SELECTOR: 4,
        Reason.TAINT: 3,
    }
    assert list(result.reasons) == [
        Reason.INSUFFICIENT_AICORE,
        Reason.NODE_SELECTOR,
        Reason.TAINT,
    ]
    assert result.primary_reason == "insufficient-aicore"
    assert result.message == (
        "0/12 nodes can host 2 x vir10_3c_32g: 5 insufficient AICore, "
        "4 node selector mismatch, 3 taint not tolerated"
    )
    assert str(result) == result.message


def test_nofit_ties_are_ordered_by_reason() -> None:
    result = nofit(ledger_with(node("b", live=False), node("a", [])).place(request()))
    assert list(result.reasons) == [Reason.NODE_NOT_LIVE, Reason.NO_CHIPS]
    assert result.primary_reason is Reason.NODE_NOT_LIVE


def test_nofit_without_nodes() -> None:
    result = nofit(Ledger().place(request(template="vir01", count=3)))
    assert result.primary_reason is Reason.NO_NODES
    assert result.message == "0/0 nodes can host 3 x vir01: no vNPU nodes known"


def test_node_reports_the_chip_that_got_furthest() -> None:
    n = node("n", [chip("910B3", 0, health="Unhealthy"), chip("910B3", 1, aicpu_total=0)])
    assert nofit(ledger_with(n).place(request())).node_reasons == {"n": Reason.INSUFFICIENT_AICPU}


def test_reason_codes_are_metric_safe() -> None:
    for reason in Reason:
        assert re.fullmatch(r"[a-z]+(-[a-z]+)*", reason.value)
        assert reason.label


# ------------------------------------------------------------- bookkeeping


def test_place_records_allocations_with_deterministic_keys() -> None:
    ledger = ledger_with(node("n"))
    p = placed(ledger.place(request("train", count=2, namespace="ml", uid="u-1")))
    keys = [a.key for a in p.allocations]
    assert keys == [f"ml/{allocation_name('train', 'u-1', i)}" for i in range(2)]
    assert ledger.allocations_for("u-1") == list(p.allocations)
    assert ledger.allocations_on("n") == list(p.allocations)
    assert all(
        (a.pod_uid, a.pod_name, a.namespace, a.template) == ("u-1", "train", "ml", "vir05_1c_16g")
        for a in p.allocations
    )


def test_placing_the_same_pod_again_returns_its_booking() -> None:
    ledger = ledger_with(node("a"), node("b"))
    first = placed(ledger.place(request("p", count=2)))
    assert placed(ledger.place(request("p", count=2), Policy.SPREAD)) == first
    assert len(ledger.allocations()) == 2


def test_partial_booking_is_completed_on_the_same_node() -> None:
    ledger = ledger_with(node("a"), node("b"))
    ledger.add_allocation(
        Allocation(
            f"default/{allocation_name('p', 'uid-p', 0)}", "b", 0, "vir05_1c_16g", 100, "uid-p", "p"
        )
    )
    p = placed(ledger.place(request("p", count=3)))
    assert p.node == "b"
    assert p.vnpu_ids == (100, 101, 102)
    assert [a.name for a in p.allocations] == [allocation_name("p", "uid-p", i) for i in range(3)]


def test_partial_booking_on_a_vanished_node_does_not_fit() -> None:
    ledger = ledger_with(node("a"))
    ledger.add_allocation(Allocation("default/p-0", "gone", 0, "vir05_1c_16g", 100, "uid-p", "p"))
    assert nofit(ledger.place(request("p", count=2))).node_reasons == {"gone": Reason.NODE_NOT_LIVE}


@pytest.mark.parametrize(
    "existing",
    [
        [("a", "vir10_3c_32g")],
        [("a", "vir05_1c_16g"), ("b", "vir05_1c_16g")],
        [("a", "vir05_1c_16g")] * 3,
    ],
)
def test_contradicting_booking_raises(existing: list[tuple[str, str]]) -> None:
    ledger = ledger_with(node("a"), node("b"))
    for i, (n, template) in enumerate(existing):
        ledger.add_allocation(Allocation(f"default/p-{i}", n, 0, template, 100 + i, "uid-p", "p"))
    with pytest.raises(AllocationConflictError, match="already holds"):
        ledger.place(request("p", count=2))


def test_add_allocation_is_idempotent_and_replaces() -> None:
    ledger = Ledger()
    alloc = Allocation("ns/a-0", "n", 0, "vir01", 100, "uid-a", "a")
    assert ledger.add_allocation(alloc)
    assert not ledger.add_allocation(alloc)
    moved = Allocation("ns/a-0", "m", 1, "vir01", 117, "uid-b", "a")
    assert ledger.add_allocation(moved)
    assert ledger.allocations() == [moved]
    assert ledger.allocations_for("uid-a") == []
    assert ledger.allocations_on("n") == []
    assert ledger.allocations_for("uid-b") == [moved]


def test_release_frees_capacity_and_ids() -> None:
    ledger = ledger_with(node("n"))
    p = placed(ledger.place(request("a", "vir10_3c_32g", count=2)))
    nofit(ledger.place(request("b")))
    assert ledger.release("uid-a") == p.allocations
    assert ledger.release("uid-a") == ()
    assert placed(ledger.place(request("b"))).vnpu_ids == (100,)


def test_remove_allocation_and_node() -> None:
    ledger = ledger_with(node("n"))
    p = placed(ledger.place(request("a")))
    assert ledger.remove_allocation(p.allocations[0].key) == p.allocations[0]
    assert ledger.remove_allocation(p.allocations[0].key) is None
    placed(ledger.place(request("b")))
    removed = ledger.remove_node("n")
    assert removed is not None
    assert ledger.node_names() == []
    assert len(ledger.allocations()) == 1  # bookings outlive the inventory
    assert nofit(ledger.place(request("c"))).primary_reason is Reason.NO_NODES


def test_set_live_toggles_candidacy() -> None:
    ledger = ledger_with(node("n"))
    assert ledger.set_live("n", False)
    assert nofit(ledger.place(request("a"))).primary_reason is Reason.NODE_NOT_LIVE
    assert ledger.set_live("n", True)
    placed(ledger.place(request("a")))
    assert not ledger.set_live("unknown", True)


def test_allocation_name_is_a_valid_unique_object_name() -> None:
    long = "x" * 239 + "." + "y" * 20
    for pod_name in ("train-0", long, "Weird_Name", "..."):
        name = allocation_name(pod_name, "uid", 7)
        assert len(name) <= 253
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name), name
        assert ".-" not in name
        assert "-." not in name
    assert allocation_name("p", "uid-1", 0) != allocation_name("p", "uid-2", 0)
    assert allocation_name("p", "uid-1", 0) == allocation_name("p", "uid-1", 0)


# ------------------------------------------------------- API objects in/out


def test_allocation_round_trips_through_the_api_object() -> None:
    alloc = Allocation("ml/train-abc-0", "n1", 2, "vir05_1c_16g", 132, "u-1", "train")
    obj = VNPUAllocation(
        metadata=ObjectMeta(name=alloc.name, namespace=alloc.namespace), spec=alloc.to_spec()
    ).to_api()
    assert obj["spec"]["vnpuId"] == 132
    assert Allocation.from_api(obj) == alloc


@pytest.mark.parametrize(
    "obj",
    [
        {},
        {"metadata": {"name": "a", "namespace": "ns"}, "spec": {"podName": "p"}},
        {
            "metadata": {"name": "a"},
            "spec": {
                "podName": "p",
                "podUID": "u",
                "nodeName": "n",
                "chip": 0,
                "template": "vir01",
                "vnpuId": 100,
            },
        },
    ],
)
def test_unreadable_allocation_objects_raise(obj: dict[str, object]) -> None:
    with pytest.raises(InvalidAllocationError):
        Allocation.from_api(obj)


def test_inventory_from_objects() -> None:
    status = node("n1", "910B3").status.to_api()
    vnpu_node = {"metadata": {"name": "n1"}, "status": status}
    k8s_node = {
        "metadata": {"name": "n1", "labels": {names.LABEL_NPU_NODE: "true"}},
        "spec": {"taints": [NOSCHED]},
    }
    inv = NodeInventory.from_objects(vnpu_node, k8s_node, lease_valid=True)
    assert inv.live
    assert inv.labels == {names.LABEL_NPU_NODE: "true"}
    assert inv.compiled_taints[0].key == "dedicated"
    assert inv.chip(0) is not None
    assert inv.chip(5) is None
    assert not NodeInventory.from_objects(vnpu_node, None, lease_valid=True).live
    assert not NodeInventory.from_objects(vnpu_node, k8s_node, lease_valid=False).live


@pytest.mark.parametrize(
    ("vnpu_node", "k8s_node"),
    [
        ({"metadata": {}}, {}),
        ({"metadata": {"name": "n"}, "status": {"chips": [{"index": "x"}]}}, {}),
        ({"metadata": {"name": "n"}}, {"spec": {"taints": [{"key": "a"}]}}),
        ({"metadata": {"name": "n"}}, {"metadata": {"labels": {"a": 1}}}),
        ({"metadata": "n"}, {}),
    ],
)
def test_unreadable_inventories_raise(
    vnpu_node: dict[str, object], k8s_node: dict[str, object]
) -> None:
    with pytest.raises(InvalidInventoryError):
        NodeInventory.from_objects(vnpu_node, k8s_node, lease_valid=True)


def test_duplicate_chip_index_is_rejected() -> None:
    with pytest.raises(InvalidInventoryError, match="duplicate chip index"):
        node("n", [chip("910B3", 0), chip("910B3", 0)])


def test_avoided_nodes_are_skipped_with_their_own_reason() -> None:
    ledger = ledger_with(node("a"), node("b"))
    first = placed(ledger.place(request("p1"), avoid={"a"}))
    assert first.node == "b"
    result = nofit(ledger.place(request("p2"), avoid={"a", "b"}))
    assert result.node_reasons == {"a": Reason.FAILED_BEFORE, "b": Reason.FAILED_BEFORE}
    assert "failed there before" in result.message


def _full_chip_and_its_inventory() -> tuple[Ledger, list[Allocation], NodeInventory]:
    """One 910B3 chip holding four vir05 vNPUs (all it takes), and the
    inventory its agent publishes once they exist."""
    ledger = ledger_with(node("n1"))
    allocs = [
        a
        for i in range(4)
        for a in placed(ledger.place(request(f"p{i}"), Policy.BINPACK)).allocations
    ]
    listed = chip("910B3", 0, vnpus=[(a.vnpu_id, a.template) for a in allocs])
    inventory = node("n1", [listed])
    ledger.upsert_node(inventory, version=40)
    assert isinstance(ledger.place(request("late"), Policy.BINPACK), NoFit)
    return ledger, allocs, inventory


def test_capacity_of_a_destroyed_vnpu_is_free_before_the_inventory_says_so() -> None:
    ledger, allocs, inventory = _full_chip_and_its_inventory()
    # The agent destroyed it and removed the finalizer; its next inventory is
    # seconds away and the current one still lists the vNPU.
    ledger.remove_allocation(allocs[0].key, destroyed=True, version=50)
    again = placed(ledger.place(request("late"), Policy.BINPACK))
    assert again.allocations[0].vnpu_id == allocs[0].vnpu_id  # its id is free too
    # An inventory published before the destroy changes nothing.
    ledger.upsert_node(inventory, version=45)
    assert ledger.capacity("n1")[0].orphans == 0


def test_a_destroyed_vnpu_listed_by_a_newer_inventory_exists_after_all() -> None:
    ledger, allocs, inventory = _full_chip_and_its_inventory()
    ledger.remove_allocation(allocs[0].key, destroyed=True, version=50)
    ledger.upsert_node(inventory, version=60)  # published after the destroy, still listed
    assert isinstance(ledger.place(request("late"), Policy.BINPACK), NoFit)
    assert ledger.capacity("n1")[0].orphans == 1


def test_a_newer_inventory_listing_it_under_its_gone_allocation_is_a_stale_status() -> None:
    """The agent's VNPUNode write in flight while it destroyed the vNPU lists it
    under its allocation and lands after the allocation's deletion; the agent
    lists a vNPU under an allocation only while that allocation stands, so
    the vNPU stays destroyed. Listed as nobody's later, it exists after all."""
    ledger, allocs, _ = _full_chip_and_its_inventory()
    owners = [a.key for a in allocs]
    ledger.remove_allocation(allocs[0].key, destroyed=True, version=50)
    stale = chip("910B3", 0, vnpus=[(a.vnpu_id, a.template) for a in allocs], owners=owners)
    ledger.upsert_node(node("n1", [stale]), version=60)
    assert ledger.capacity("n1")[0].orphans == 0
    again = placed(ledger.place(request("late"), Policy.BINPACK))
    assert again.allocations[0].vnpu_id == allocs[0].vnpu_id
    ledger.remove_allocation(again.allocations[0].key)
    # Its finalizer was removed before any destroy after all: the agent lists it as nobody's.
    nobodys = chip(
        "910B3", 0, vnpus=[(a.vnpu_id, a.template) for a in allocs], owners=["", *owners[1:]]
    )
    ledger.upsert_node(node("n1", [nobodys]), version=70)
    assert ledger.capacity("n1")[0].orphans == 1
    assert isinstance(ledger.place(request("late"), Policy.BINPACK), NoFit)


def test_a_restarted_ledger_takes_a_vnpu_listed_as_a_gone_allocations_as_destroyed() -> None:
    """The agent writes the node's status at leisure after a release: a ledger without
    memory of the deletion (a restart, kubectl vnpu) reads the name the inventory gives
    the owner. Once an inventory lists the vNPU as nobody's, it exists after all."""
    _, allocs, _ = _full_chip_and_its_inventory()
    owned = chip(
        "910B3", 0, vnpus=[(a.vnpu_id, a.template) for a in allocs], owners=[a.key for a in allocs]
    )
    kept = allocs[1:]
    rebuilt = Ledger.rebuild([node("n1", [owned])], kept)
    assert rebuilt.capacity("n1")[0].orphans == 0
    again = placed(rebuilt.place(request("late"), Policy.BINPACK))
    assert again.allocations[0].vnpu_id == allocs[0].vnpu_id
    rebuilt.remove_allocation(again.allocations[0].key)
    # The operator's way: inventories and allocations fed one by one, then synced.
    synced = Ledger()
    synced.upsert_node(node("n1", [owned]), version=60)
    for a in kept:
        synced.add_allocation(a)
    assert isinstance(synced.place(request("late"), Policy.BINPACK), NoFit)
    synced.seed_released()
    assert synced.capacity("n1")[0].orphans == 0
    # The agent lists it as nobody's now: it was never destroyed (finalizer removed by hand).
    orphaned = chip(
        "910B3", 0, vnpus=[(a.vnpu_id, a.template) for a in allocs],
        owners=["", *(a.key for a in kept)],
    )  # fmt: skip
    for led in (rebuilt, synced):
        led.upsert_node(node("n1", [orphaned]), version=70)
        assert led.capacity("n1")[0].orphans == 1
        assert isinstance(led.place(request("late"), Policy.BINPACK), NoFit)


def test_an_allocation_gone_without_its_agent_keeps_its_vnpu_counted() -> None:
    ledger, allocs, _ = _full_chip_and_its_inventory()
    # Finalizer removed by someone else: the vNPU may well exist.
    ledger.remove_allocation(allocs[0].key)
    assert isinstance(ledger.place(request("late"), Policy.BINPACK), NoFit)


def test_peek_answers_the_nofit_place_would_and_books_nothing() -> None:
    ledger = ledger_with(node("a"), node("b", "310P3"))
    big = request("big", "vir10_3c_32g", 2, uid="u-big")
    assert ledger.peek(big) is None  # it fits on a
    assert ledger.allocations_for("u-big") == []
    first = ledger.place(big)
    assert isinstance(first, Placement)
    other = request("other", "vir10_3c_32g", 2, uid="u-other")
    peeked = ledger.peek(other)
    assert isinstance(peeked, NoFit)
    assert peeked.node_reasons == {
        "a": Reason.INSUFFICIENT_AICORE,
        "b": Reason.TEMPLATE_NOT_OFFERED,
    }
    placed_answer = ledger.place(other)
    assert isinstance(placed_answer, NoFit)
    assert placed_answer.message == peeked.message
    # A pod holding part of its booking: only `place` can tell.
    assert ledger.peek(request("big", "vir10_3c_32g", 3, uid="u-big")) is None

"""The defrag advisor's plan, checked against the real ledger: what it
promises is what re-placing the pods with Ledger.place gives."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from placement_helpers import node, placed, request

from vnpu_common.wire.models import VNPUInfo
from vnpu_operator.placement import Ledger, NodeInventory, Placement, PodRequest, Policy
from vnpu_operator.placement.defrag import CORDON_REASON, Plan, plan

TOLERATE = ({"key": "team", "operator": "Equal", "value": "a", "effect": "NoSchedule"},)


def _spread(ledger: Ledger, *reqs: PodRequest) -> dict[str, PodRequest]:
    for r in reqs:
        placed(ledger.place(r, policy=Policy.SPREAD))
    return {r.uid: r for r in reqs}


def _fits(ledger: Ledger) -> int:
    return sum(f.largest_fits for f in ledger.fragmentation().values())


def _apply(ledger: Ledger, result: Plan, policy: Policy) -> None:
    """Applies the plan as an admin would, on the real ledger: cordon the
    chip a step empties, release its pods and place them again in the order
    given; at the end uncordon. Each pod must land where the plan said."""
    for step in result.steps:
        inventory = ledger.node(step.node)
        assert inventory is not None
        cordons = {**inventory.cordoned, step.chip: CORDON_REASON}
        ledger.upsert_node(replace(inventory, cordoned=cordons))
        for move in step.moves:
            # The pod goes once its agent destroyed its vNPUs.
            for allocation in ledger.allocations_for(move.pod.uid):
                ledger.remove_allocation(allocation.key, destroyed=True)
        for move in step.moves:
            got = placed(ledger.place(move.pod, policy))
            assert (got.node, tuple(sorted({a.chip for a in got.allocations}))) == (
                move.to_node,
                move.to_chips,
            )
    for name in {s.node for s in result.steps}:
        inventory = ledger.node(name)
        assert inventory is not None
        kept = {c: r for c, r in inventory.cordoned.items() if r != CORDON_REASON}
        ledger.upsert_node(replace(inventory, cordoned=kept))


def _published(ledger: Ledger) -> list[NodeInventory]:
    """The inventories as the agents publish them: every vNPU listed."""
    out = []
    for name in ledger.node_names():
        inventory = ledger.node(name)
        assert inventory is not None
        chips = [
            c.model_copy(
                update={
                    "vnpus": [
                        VNPUInfo(id=a.vnpu_id, template=a.template)
                        for a in ledger.allocations_on(name)
                        if a.chip == c.index
                    ]
                }
            )
            for c in inventory.status.chips
        ]
        status = inventory.status.model_copy(update={"chips": chips})
        out.append(replace(inventory, status=status))
    return out


def test_scattered_small_vnpus_are_gathered_onto_one_chip() -> None:
    ledger = Ledger.rebuild([node("a", n_chips=2)], [])
    requests = _spread(ledger, request("p0"), request("p1"))
    # One 5-core vNPU per chip: one 10-core vNPU fits on each, three would
    # fit if both small ones shared a chip.
    result = plan(ledger, requests)
    assert (result.before, result.after, result.limit) == (
        {"910B3": 2}, {"910B3": 3}, {"910B3": 3},
    )  # fmt: skip
    assert result.largest == {"910B3": "vir10_3c_32g"}
    [step] = result.steps
    [move] = step.moves
    assert move.node == move.to_node == "a"
    assert move.chips == (step.chip,)
    assert step.chip not in move.to_chips
    assert step.whole == (("a", step.chip),)
    assert (step.before, step.after) == ({"910B3": 2}, {"910B3": 3})


def test_the_plan_changes_nothing_in_the_ledger_it_reads() -> None:
    ledger = Ledger.rebuild([node("a", n_chips=2)], [])
    requests = _spread(ledger, request("p0"), request("p1"))
    before = ledger.allocations()
    assert plan(ledger, requests).steps
    assert ledger.allocations() == before
    assert _fits(ledger) == 2


@pytest.mark.parametrize("policy", list(Policy))
@pytest.mark.parametrize("seed", range(6))
def test_the_promised_count_is_what_placing_again_gives(policy: Policy, seed: int) -> None:
    """Churn scatters a cluster; applying the plan with the real ledger
    lands each pod where it said, frees the chips it named and fits
    exactly the count it promised."""
    rng = random.Random(seed)
    inventories = [node(f"n{i}", n_chips=4) for i in range(4)]
    ledger = Ledger.rebuild(inventories, [])
    alive: dict[str, PodRequest] = {}
    for i in range(60):
        r = request(f"p{i}", rng.choice(["vir05_1c_16g", "vir05_1c_16g", "vir10_3c_32g"]))
        if isinstance(ledger.place(r, policy=Policy.SPREAD), Placement):
            alive[r.uid] = r
        if alive and rng.random() < 0.45:
            gone = rng.choice(sorted(alive))
            ledger.release(gone)
            del alive[gone]
    # As the operator sees it: the agents list every vNPU they made.
    ledger = Ledger.rebuild(_published(ledger), ledger.allocations())
    result = plan(ledger, alive, policy, max_moves=8)
    assert result.pods_moved <= 8
    assert sum(result.after.values()) >= sum(result.before.values())
    assert sum(result.before.values()) == _fits(ledger)
    copy = Ledger.rebuild(_published(ledger), ledger.allocations())
    _apply(copy, result, policy)
    assert _fits(copy) == sum(result.after.values())
    for step in result.steps:
        for name, chip in step.whole:
            assert not [a for a in copy.allocations_on(name) if a.chip == chip]


def test_churn_finds_something_to_gain() -> None:
    """The seeds above are not all trivially compact: spread leaves gain."""
    ledger = Ledger.rebuild([node(f"n{i}", n_chips=4) for i in range(3)], [])
    requests = _spread(ledger, *(request(f"p{i}") for i in range(12)))
    result = plan(ledger, requests, Policy.BINPACK, max_moves=12)
    assert sum(result.after.values()) > sum(result.before.values())
    assert result.pods_moved <= 12


def test_a_pod_pinned_by_node_selector_is_never_suggested() -> None:
    ledger = Ledger.rebuild([node("a", labels={"zone": "a"}), node("b", labels={"zone": "b"})], [])
    free = request("free")
    pinned = request("pinned", node_selector={"zone": "b"})
    placed(ledger.place(free, policy=Policy.SPREAD))
    placed(ledger.place(pinned, policy=Policy.SPREAD))
    assert {a.node for a in ledger.allocations_for(pinned.uid)} == {"b"}
    requests = {r.uid: r for r in (free, pinned)}
    result = plan(ledger, requests)
    [step] = result.steps
    assert [(m.pod.key, m.node, m.to_node) for m in step.moves] == [("default/free", "a", "b")]
    assert step.whole == (("a", 0),)
    # Both pinned: no move is possible although scattered capacity is there.
    stuck = request("stuck", uid=free.uid, node_selector={"zone": "a"})
    result = plan(ledger, {free.uid: stuck, pinned.uid: pinned})
    assert result.steps == ()
    assert result.before == result.after == {"910B3": 2}
    assert result.limit == {"910B3": 3}
    assert result.tried == 2


def test_a_pod_that_fits_nowhere_else_stays() -> None:
    taint = {"key": "team", "value": "a", "effect": "NoSchedule"}
    ledger = Ledger.rebuild([node("a", taints=[taint]), node("b")], [])
    # Only p0 tolerates a's taint; b has room for it, but a has none for p1
    # and p0 is the one on the chip worth emptying.
    p0 = request("p0", tolerations=TOLERATE)
    p1 = request("p1")
    placed(ledger.place(p0, policy=Policy.SPREAD))
    placed(ledger.place(p1, policy=Policy.SPREAD))
    result = plan(ledger, {p0.uid: p0, p1.uid: p1})
    [step] = result.steps
    assert [m.pod.key for m in step.moves] == ["default/p0"]
    assert step.moves[0].to_node == "b"
    # Without the toleration p0 could go nowhere but a: nothing to suggest.
    p0_here = replace(p0, node_selector={"kubernetes.io/hostname": "a"})
    ledger2 = Ledger.rebuild(
        [node("a", taints=[taint], labels={"kubernetes.io/hostname": "a"}), node("b")],
        ledger.allocations(),
    )
    result = plan(ledger2, {p0.uid: p0_here, p1.uid: p1})
    assert result.steps == ()


def test_a_compact_cluster_has_nothing_to_gain() -> None:
    ledger = Ledger.rebuild([node("a", n_chips=4), node("b", n_chips=4)], [])
    requests = {}
    for i in range(6):
        r = request(f"p{i}")
        placed(ledger.place(r))  # binpack keeps whole chips whole
        requests[r.uid] = r
    result = plan(ledger, requests)
    assert result.steps == ()
    assert result.before == result.after == result.limit
    assert result.tried == 0


def test_pods_the_plan_does_not_know_are_not_moved() -> None:
    ledger = Ledger.rebuild([node("a", n_chips=2)], [])
    _spread(ledger, request("p0"), request("p1"))
    result = plan(ledger, {})
    assert result.steps == ()
    assert result.before == {"910B3": 2}


def test_a_multi_vnpu_pod_moves_whole() -> None:
    ledger = Ledger.rebuild([node("a", n_chips=3)], [])
    pair = request("pair", count=2)
    single = request("single")
    requests = _spread(ledger, pair, single)
    chips = {a.chip for a in ledger.allocations_for(pair.uid)}
    assert len(chips) == 2  # spread put its two vNPUs on two chips
    result = plan(ledger, requests, max_moves=3)
    assert sum(result.after.values()) > sum(result.before.values())
    for step in result.steps:
        for move in step.moves:
            assert len(move.to_chips) >= 1
            if move.pod.uid == pair.uid:
                assert move.chips == tuple(sorted(chips))
    _apply(copy := Ledger.rebuild([node("a", n_chips=3)], ledger.allocations()), result,
           Policy.BINPACK)  # fmt: skip
    assert _fits(copy) == sum(result.after.values())


def test_max_moves_caps_the_pods_rescheduled() -> None:
    ledger = Ledger.rebuild([node(f"n{i}", n_chips=2) for i in range(4)], [])
    requests = _spread(ledger, *(request(f"p{i}") for i in range(8)))
    # Spread keeps each node's pair on the node: one move per node gains.
    assert plan(ledger, requests, Policy.SPREAD, max_moves=8).pods_moved == 4
    assert plan(ledger, requests, Policy.SPREAD, max_moves=1).pods_moved == 1
    with pytest.raises(ValueError, match="max_moves must be at least 1"):
        plan(ledger, requests, max_moves=0)


def test_node_limits_which_chips_are_emptied() -> None:
    ledger = Ledger.rebuild([node("a", n_chips=2), node("b", n_chips=2)], [])
    requests = _spread(ledger, *(request(f"p{i}") for i in range(4)))
    result = plan(ledger, requests, node="b")
    assert result.steps
    assert {step.node for step in result.steps} == {"b"}
    assert plan(ledger, requests, node="nowhere").steps == ()


def test_an_admin_cordon_is_never_lifted_or_emptied() -> None:
    ledger = Ledger.rebuild([node("a", n_chips=2, cordoned={1: "repair"})], [])
    r = request("p0")
    placed(ledger.place(r))
    inventory = ledger.node("a")
    assert inventory is not None
    # Put a vNPU on the cordoned chip as if placed before the cordon.
    ledger.upsert_node(replace(inventory, cordoned={}))
    other = request("p1")
    placed(ledger.place(other, policy=Policy.SPREAD))
    ledger.upsert_node(inventory)
    result = plan(ledger, {r.uid: r, other.uid: other})
    assert all(step.chip != 1 for step in result.steps)
    assert all(1 not in m.to_chips for step in result.steps for m in step.moves)

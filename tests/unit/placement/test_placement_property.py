"""Randomized placing, releasing and restarting: the ledger never
oversubscribes a chip or reuses an id, and never says NoFit when some node
had room. Invariants are checked against a model computed here from the
template tables, not with the ledger's own arithmetic."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, replace

from placement_helpers import MODELS, chip, node, request

from vnpu_common.wire.models import ChipStatus, ObjectMeta, VNPUAllocation
from vnpu_operator.placement import (
    Allocation,
    Ledger,
    NodeInventory,
    NoFit,
    Placement,
    PodRequest,
    Policy,
    Resources,
)

TAINT = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
TOLERATE = [{"key": "dedicated", "operator": "Exists"}]


def cluster() -> list[NodeInventory]:
    return [
        node("n0", [chip("910B3", 0, vnpus=[(100, "vir05_1c_16g")]), chip("910B3", 1)]),
        node("n1", "910B4"),
        node("n2", [chip("310P3", 0), chip("310P3", 1, vnpus=[(117, "vir02")])]),
        node("n3", [chip("910B3", 0), chip("910B4", 1)]),
        node("n4", [chip("310P3", 0, id_range=(100, 103))]),
        node("n5", "910B3", taints=[TAINT]),
    ]


def need(model: str, template: str) -> Resources:
    return Resources(*MODELS[model][5][template])


def totals(c: ChipStatus) -> Resources:
    aicore, memory, aicpu, media, *_ = MODELS[c.model]
    return Resources(aicore, memory, aicpu, media)


def fits(free: Resources, n: Resources) -> bool:
    return all(
        f >= x
        for f, x in zip(
            (free.aicore, free.memory_mb, free.aicpu, free.media),
            (n.aicore, n.memory_mb, n.aicpu, n.media),
            strict=True,
        )
    )


@dataclass
class Model:
    """Independent bookkeeping: used resources and ids per chip."""

    used: dict[tuple[str, int], Resources]
    vnpus: Counter[tuple[str, int]]
    ids: dict[str, list[int]]


def model_of(ledger: Ledger, inventories: dict[str, NodeInventory]) -> Model:
    used: dict[tuple[str, int], Resources] = {}
    vnpus: Counter[tuple[str, int]] = Counter()
    ids: dict[str, list[int]] = {}
    for name, inv in inventories.items():
        for c in inv.status.chips:
            key = (name, c.index)
            used[key] = Resources()
            for v in c.vnpus:  # every present vNPU here is an orphan
                used[key] = used[key] + need(c.model, v.template)
                vnpus[key] += 1
                ids.setdefault(name, []).append(v.id)
    for a in ledger.allocations():
        home = inventories[a.node].chip(a.chip)
        assert home is not None
        key = (a.node, a.chip)
        used[key] = used[key] + need(home.model, a.template)
        vnpus[key] += 1
        ids.setdefault(a.node, []).append(a.vnpu_id)
        assert home.vnpu_id_min <= a.vnpu_id <= home.vnpu_id_max
    return Model(used, vnpus, ids)


def check_invariants(ledger: Ledger, inventories: dict[str, NodeInventory]) -> Model:
    m = model_of(ledger, inventories)
    for node_name, ids in m.ids.items():
        assert len(ids) == len(set(ids)), f"duplicate vNPU id on {node_name}: {sorted(ids)}"
    for (name, index), used in m.used.items():
        c = inventories[name].chip(index)
        assert c is not None
        assert fits(totals(c) - used, Resources()), f"{name}/{index} oversubscribed: {used}"
        assert m.vnpus[(name, index)] <= c.vnpu_id_max - c.vnpu_id_min + 1
    reported = {(c.node, c.chip): (c.used, c.allocated + c.orphans) for c in ledger.capacity()}
    assert reported == {k: (m.used[k], m.vnpus[k]) for k in m.used}
    return m


def room_on(inv: NodeInventory, m: Model, req: PodRequest) -> int:
    """How many vNPUs of the request the node could still take."""
    taken = set(m.ids.get(inv.name, ()))
    total = 0
    for c in inv.status.chips:
        offered = {t.name for t in c.templates}
        if c.health != "Healthy" or req.template not in offered:
            continue
        if req.chip_model is not None and c.model != req.chip_model:
            continue
        n, free = need(c.model, req.template), totals(c) - m.used[(inv.name, c.index)]
        by_resource = min(
            f // x
            for f, x in zip(
                (free.aicore, free.memory_mb, free.aicpu, free.media),
                (n.aicore, n.memory_mb, n.aicpu, n.media),
                strict=True,
            )
            if x
        )
        ids = sum(1 for i in range(c.vnpu_id_min, c.vnpu_id_max + 1) if i not in taken)
        limit = c.vnpu_id_max - c.vnpu_id_min + 1 - m.vnpus[(inv.name, c.index)]
        total += max(min(by_resource, ids, limit), 0)
    return total


def eligible(inv: NodeInventory, req: PodRequest) -> bool:
    return inv.live and (not inv.taints or bool(req.tolerations))


def restart(ledger: Ledger, inventories: dict[str, NodeInventory]) -> Ledger:
    """What a restarted operator does: list the objects, rebuild."""
    objects = [
        VNPUAllocation(
            metadata=ObjectMeta(name=a.name, namespace=a.namespace), spec=a.to_spec()
        ).to_api()
        for a in ledger.allocations()
    ]
    rebuilt = Ledger.rebuild(inventories.values(), (Allocation.from_api(o) for o in objects))
    assert rebuilt.allocations() == ledger.allocations()
    assert rebuilt.capacity() == ledger.capacity()
    return rebuilt


def test_random_place_release_restart_never_oversubscribes() -> None:
    rng = random.Random(20240611)
    pristine = {inv.name: inv for inv in cluster()}
    inventories = dict(pristine)
    ledger = Ledger.rebuild(inventories.values(), ())
    pods: dict[str, PodRequest] = {}
    outcomes: Counter[str] = Counter()

    for step in range(800):
        roll = rng.random()
        if roll < 0.6 or not pods:
            model = rng.choice(sorted(MODELS))
            req = request(
                f"pod-{step}",
                rng.choice(sorted(MODELS[model][5])),
                count=rng.choice([1, 1, 1, 2, 3]),
                namespace=rng.choice(["a", "b"]),
                chip_model=rng.choice([None, model]),
                tolerations=TOLERATE if rng.random() < 0.3 else (),
            )
            before = model_of(ledger, inventories)
            result = ledger.place(req, rng.choice(list(Policy)))
            if isinstance(result, Placement):
                outcomes["placed"] += 1
                pods[req.uid] = req
                inv = inventories[result.node]
                assert eligible(inv, req)
                assert len(result.allocations) == req.count
                assert {a.node for a in result.allocations} == {result.node}
                for a in result.allocations:
                    c = inv.chip(a.chip)
                    assert c is not None
                    assert c.health == "Healthy"
                    assert req.chip_model in (None, c.model)
            else:
                assert isinstance(result, NoFit)
                outcomes.update(result.node_reasons.values())
                for inv in inventories.values():
                    if eligible(inv, req):
                        assert room_on(inv, before, req) < req.count, (inv.name, req, result)
        elif roll < 0.88:
            uid = rng.choice(sorted(pods))
            assert len(ledger.release(uid)) == pods.pop(uid).count
        elif roll < 0.93:
            # Nodes degrade and recover: a dead or unhealthy cluster would
            # only test the filters, not the capacity arithmetic.
            name = rng.choice(sorted(inventories))
            inv = inventories[name]
            dice = rng.random()
            if dice < 0.7:
                inventories[name] = pristine[name]
            elif dice < 0.85:
                inventories[name] = replace(inv, live=False)
            else:
                chips = [c.model_copy() for c in inv.status.chips]
                chips[rng.randrange(len(chips))].health = "Unhealthy"
                inventories[name] = replace(
                    inv, status=inv.status.model_copy(update={"chips": chips})
                )
            ledger.upsert_node(inventories[name])
        else:
            ledger = restart(ledger, inventories)
        check_invariants(ledger, inventories)
        assert {a.pod_uid for a in ledger.allocations()} == set(pods)

    # The run must have exercised both sides, or it proves little.
    capacity_denials = sum(
        n for reason, n in outcomes.items() if reason.startswith("insufficient") or "id" in reason
    )
    assert outcomes["placed"] > 150
    assert capacity_denials > 100


def test_restarted_ledger_books_the_same_and_never_double_books() -> None:
    inventories = {inv.name: inv for inv in cluster()}
    original = Ledger.rebuild(inventories.values(), ())
    for i in range(5):
        assert isinstance(original.place(request(f"old-{i}", "vir05_1c_16g", count=2)), Placement)
    rebuilt = restart(original, inventories)

    # Same request, same decision: the bookkeeping really is the same.
    probe = request("probe", "vir01", count=2)
    assert original.place(probe) == rebuilt.place(probe)

    # Fill the restarted ledger to the brim: nothing it books collides with
    # what the old operator booked.
    for i in range(200):
        if isinstance(rebuilt.place(request(f"new-{i}", "vir05_1c_16g")), NoFit):
            break
    else:
        raise AssertionError("cluster never filled up")
    check_invariants(rebuilt, inventories)
    old = {(a.node, a.vnpu_id) for a in original.allocations()}
    new = {(a.node, a.vnpu_id) for a in rebuilt.allocations() if a.pod_name.startswith("new-")}
    assert old.isdisjoint(new)
    assert all(a in rebuilt.allocations() for a in original.allocations())

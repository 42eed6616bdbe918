"""Nodes alike in what fitting reads share one fit (capacity.fingerprint):
a request shape's first placement asks every node, and at thousands of
nodes most of them are alike. Sharing must never give a node another
node's answer where the two differ in anything placement reads: checked
against a reference that fits every node afresh, with no kept answers, over
random placements and releases on nodes that differ in one thing each."""

from __future__ import annotations

import random

import pytest
from placement_helpers import MODELS, chip, node, request

from vnpu_operator.placement import Ledger, NodeInventory, NoFit, Placement, PodRequest, Policy
from vnpu_operator.placement import ledger as ledger_module
from vnpu_operator.placement.fitting import fit_node, node_filter

ORPHAN = (100, "vir05_1c_16g")


def cluster() -> list[NodeInventory]:
    """Groups of alike nodes, and nodes each unlike the rest in one thing,
    named to come first: ties go to the first name, so a wrong shared answer
    on one of them is chosen rather than hidden."""
    nodes = [node(f"x{i:02d}", "910B3", n_chips=2) for i in range(12)]
    nodes += [node(f"y{i:02d}", "310P3", n_chips=2) for i in range(6)]
    nodes += [
        # Orphans of the same size and id, owned by other names: alike.
        node("c0", [chip("910B3", 0, vnpus=[ORPHAN], owners=["x"]), chip("910B3", 1)]),
        node("c1", [chip("910B3", 0, vnpus=[ORPHAN], owners=["y"]), chip("910B3", 1)]),
        # The same orphan on another id: other ids free.
        node("c2", [chip("910B3", 0, vnpus=[(101, "vir05_1c_16g")]), chip("910B3", 1)]),
        node("d0", [chip("910B3", 0, health="Unhealthy"), chip("910B3", 1)]),
        node("d1", "910B3", n_chips=2, cordoned={0: "maintenance"}),
        node("d2", [chip("910B3", 0, id_range=(100, 101)), chip("910B3", 1)]),
        node("d2b", [chip("910B3", 0, id_range=(100, 100)), chip("910B3", 1)]),
        node("d2c", [chip("910B3", 0, id_range=(110, 125)), chip("910B3", 1)]),
        node("d3", [chip("910B3", 0, templates=["vir05_1c_16g"]), chip("910B3", 1)]),
        node("d4", [chip("910B3", 0, aicore_total=10), chip("910B3", 1)]),
        node("d5", "910B3", n_chips=2, labels={"pool": "x"}),
        node("d6", "910B3", n_chips=2, live=False),
        node("d7", "910B3", n_chips=3),
    ]  # fmt: skip
    return nodes


def reference(
    ledger: Ledger, r: PodRequest, policy: Policy
) -> tuple[str, list[tuple[int, int]]] | None:
    """The best (node, slots) from every node fitted afresh: no kept answer."""
    best = None
    for name in ledger.node_names():
        inventory = ledger.node(name)
        assert inventory is not None
        if node_filter(inventory, r) is not None:
            continue
        state = ledger.node_state(name)
        assert state is not None
        outcome = fit_node(state, r, r.count, policy, ledger.largest_templates())
        if isinstance(outcome, tuple) and (best is None or (outcome[1], name) < best[0]):
            best = ((outcome[1], name), outcome[0])
    return None if best is None else (best[0][1], best[1])


@pytest.mark.parametrize("policy", [Policy.BINPACK, Policy.SPREAD, Policy.BESTFIT])
@pytest.mark.parametrize("seed", range(4))
def test_placement_with_shared_fits_is_the_reference(policy: Policy, seed: int) -> None:
    rng = random.Random(seed)
    ledger = Ledger.rebuild(cluster(), [])
    shapes = [
        (model, template, count)
        for model in ("910B3", "310P3")
        for template in MODELS[model][5]
        for count in (1, 2, 3)
    ]
    alive: list[Placement] = []
    checked = 0
    for i in range(300):
        if alive and rng.random() < 0.4:
            gone = alive.pop(rng.randrange(len(alive)))
            for alloc in gone.allocations:
                ledger.remove_allocation(alloc.key, destroyed=rng.random() < 0.8)
            continue
        model, template, count = rng.choice(shapes)
        r = request(f"p{i}", template, count, chip_model=model if rng.random() < 0.5 else None)
        expected = reference(ledger, r, policy)
        got = ledger.place(r, policy)
        if expected is None:
            assert isinstance(got, NoFit), (i, r, got)
            continue
        assert isinstance(got, Placement), (i, r, got)
        assert (got.node, [(a.chip, a.vnpu_id) for a in got.allocations]) == expected, (i, r)
        alive.append(got)
        checked += 1
    assert checked > 100


def test_alike_nodes_are_fitted_once_per_request_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = fit_node

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(args[0])
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ledger_module, "fit_node", counted)
    nodes = [node(f"n{i:03d}", "910B3", n_chips=4) for i in range(200)]
    ledger = Ledger.rebuild(nodes, [])
    first = ledger.place(request("p0", "vir05_1c_16g"))
    assert isinstance(first, Placement)
    assert len(calls) == 1  # 200 alike nodes, one fit
    # The booked node is unlike the rest now: the next placement fits it
    # alone, and binpack goes there.
    second = ledger.place(request("p1", "vir05_1c_16g"))
    assert isinstance(second, Placement)
    assert second.node == first.node
    assert len(calls) == 2
    # Its slot is its own: the first pod's id is not handed out again.
    assert second.allocations[0].vnpu_id != first.allocations[0].vnpu_id


UNLIKE = {
    "unhealthy chip": [chip("910B3", 0, health="Unhealthy"), chip("910B3", 1)],
    "id range moved": [chip("910B3", 0, id_range=(110, 125)), chip("910B3", 1)],
    "one id": [chip("910B3", 0, id_range=(100, 100)), chip("910B3", 1)],
    "fewer templates": [chip("910B3", 0, templates=["vir10_3c_32g"]), chip("910B3", 1)],
    "smaller chip": [chip("910B3", 0, aicore_total=6), chip("910B3", 1)],
    "an orphan": [chip("910B3", 0, vnpus=[(101, "vir05_1c_16g")]), chip("910B3", 1)],
    "a third chip": [chip("910B3", 0), chip("910B3", 1), chip("910B3", 2)],
}


@pytest.mark.parametrize("unlike", [*UNLIKE, "cordoned chip"])
@pytest.mark.parametrize("policy", [Policy.BINPACK, Policy.SPREAD, Policy.BESTFIT])
def test_a_node_unlike_in_one_thing_gets_its_own_fit(unlike: str, policy: Policy) -> None:
    # The plain node is fitted first, so its answer is kept when the unlike
    # one (the only one the second pod's selector admits) is asked.
    chips = UNLIKE.get(unlike, [chip("910B3", 0), chip("910B3", 1)])
    cordoned = {0: "maintenance"} if unlike == "cordoned chip" else None
    ledger = Ledger.rebuild(
        [
            node("a", "910B3", n_chips=2),
            node("b", chips, labels={"pool": "x"}, cordoned=cordoned),
        ],
        [],
    )
    for r in (
        request("first", "vir05_1c_16g", 2),
        request("second", "vir05_1c_16g", 2, node_selector={"pool": "x"}),
    ):
        # The reference without the pod's own earlier fit on "a": the empty
        # plain node's answer is what a wrong print would hand "b".
        expected = reference(ledger, r, policy)
        got = ledger.place(r, policy)
        assert isinstance(got, Placement), (unlike, got)
        assert (got.node, [(a.chip, a.vnpu_id) for a in got.allocations]) == expected, unlike

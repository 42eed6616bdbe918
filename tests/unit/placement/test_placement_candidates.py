"""The ranked candidates per request shape (placement.candidates) choose what
the full loop over every node chooses, whatever happens between placements."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from placement_helpers import chip, expr, node, request

from vnpu_operator.placement import Ledger, NodeInventory, NoFit, Placement, Policy
from vnpu_operator.placement.candidates import CandidateIndex

TEMPLATES = ("vir05_1c_16g", "vir10_3c_32g", "vir01", "vir02", "vir04")
TAINT = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
TOLERATE = ({"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},)


def inventories(count: int) -> list[NodeInventory]:
    out = []
    for i in range(count):
        chips = [chip("910B3", j) for j in range(2)] + [chip("310P3", 2 + j) for j in range(2)]
        out.append(
            node(
                f"n{i:02d}",
                chips,
                labels={"zone": "a" if i % 3 else "b"},
                taints=(TAINT,) if i % 5 == 0 else (),
            )
        )
    return out


def full_loop(ledger: Ledger) -> Ledger:
    """The same ledger with the ranked candidates switched off."""
    ledger._best_candidate = lambda *_args, **_kw: None  # type: ignore[method-assign]
    return ledger


def outcome(result: Placement | NoFit) -> object:
    if isinstance(result, Placement):
        return (result.node, [(a.chip, a.vnpu_id, a.key) for a in result.allocations])
    # The whole answer a waiting pod's message is made of: every node's reason.
    return ("nofit", dict(result.node_reasons), result.message)


@pytest.mark.parametrize("policy", [Policy.BINPACK, Policy.SPREAD, Policy.BESTFIT])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_same_choice_as_the_full_loop_through_churn(policy: Policy, seed: int) -> None:
    rng = random.Random(seed)
    invs = inventories(12)
    fast, slow = Ledger.rebuild(invs, []), full_loop(Ledger.rebuild(invs, []))
    held: list[str] = []
    used_fast = nofit_fast = 0
    for step in range(600):
        dice = rng.random()
        if dice < 0.35 and held:
            uid = held.pop(rng.randrange(len(held)))
            destroyed = rng.random() < 0.5
            for ledger in (fast, slow):
                for alloc in ledger.allocations_for(uid):
                    ledger.remove_allocation(alloc.key, destroyed=destroyed)
            continue
        if dice < 0.40:
            # A node goes away or comes back, or loses its Lease.
            name = f"n{rng.randrange(12):02d}"
            live = rng.random() < 0.5
            for ledger in (fast, slow):
                ledger.set_live(name, live)
            continue
        if dice < 0.43:
            name = f"n{rng.randrange(12):02d}"
            inv = next(i for i in invs if i.name == name)
            gone = rng.random() < 0.5
            for ledger in (fast, slow):
                if gone:
                    ledger.remove_node(name)
                else:
                    ledger.upsert_node(replace(inv, cordoned={0: "test"}))
            continue
        kwargs: dict[str, object] = {}
        if rng.random() < 0.2:
            kwargs["node_selector"] = {"zone": "b"}
        if rng.random() < 0.1:
            kwargs["affinity"] = {
                "nodeSelectorTerms": [{"matchExpressions": [expr("zone", "In", "a")]}]
            }
        if rng.random() < 0.3:
            kwargs["tolerations"] = TOLERATE
        req = request(
            f"p{step}",
            rng.choice(TEMPLATES),
            rng.choice((1, 1, 1, 2)),
            **kwargs,  # type: ignore[arg-type]
        )
        avoid = frozenset({f"n{rng.randrange(12):02d}"}) if rng.random() < 0.1 else frozenset()
        chosen = fast._best_candidate(req, req.count, policy, avoid)
        got = outcome(fast.place(req, policy, avoid=avoid))
        want = outcome(slow.place(req, policy, avoid=avoid))
        assert got == want, f"step {step}: {req.template} x{req.count} {kwargs} avoid {avoid}"
        if isinstance(chosen, NoFit):
            nofit_fast += 1
        elif chosen is not None:
            used_fast += 1
        if isinstance(got, tuple) and got[0] != "nofit":
            held.append(req.uid)
    # The stream exercised the ranked path, not only the fallback, both ways.
    assert used_fast > 100
    assert nofit_fast > 20


def test_a_stale_node_is_asked_again_and_a_gone_one_dropped() -> None:
    index: CandidateIndex[str] = CandidateIndex()
    ranks = {"a": (1.0,), "b": (2.0,)}
    asked: list[str] = []

    def ask(name: str) -> tuple[tuple[float, ...], str] | None:
        asked.append(name)
        rank = ranks.get(name)
        return None if rank is None else (rank, f"slots-{name}")

    assert index.best("shape", ["a", "b"], ask) == ("a", "slots-a")
    assert sorted(asked) == ["a", "b"]
    asked.clear()
    # Nothing changed: nobody is asked.
    assert index.best("shape", ["a", "b"], ask) == ("a", "slots-a")
    assert asked == []
    # "a" got worse: only it is asked, and "b" wins.
    ranks["a"] = (3.0,)
    index.changed("a")
    assert index.best("shape", ["a", "b"], ask) == ("b", "slots-b")
    assert asked == ["a"]
    # "b" is gone, "a" avoided: nothing; the avoided one stays for later.
    del ranks["b"]
    index.changed("b")
    assert index.best("shape", ["a"], ask, avoid={"a"}) is None
    assert index.best("shape", ["a"], ask) == ("a", "slots-a")
    # Ties go to the name, as in the full loop.
    ranks["b"] = (3.0,)
    index.changed("b")
    assert index.best("shape", ["a", "b"], ask) == ("a", "slots-a")


def test_nodes_of_one_group_are_asked_once_and_a_changed_one_alone() -> None:
    index: CandidateIndex[str] = CandidateIndex()
    groups = {"a": "big", "b": "big", "c": "small", "d": None}
    ranks = {"big": (2.0,), "small": (1.0,)}
    asked: list[str] = []

    def ask(name: str) -> tuple[tuple[float, ...], str]:
        asked.append(name)
        group = groups[name]
        return (ranks[group] if group else (5.0,), f"slots-{group or name}")

    assert index.best("shape", list(groups), ask, group=groups.get) == ("c", "slots-small")
    # One ask per group, each ungrouped node its own.
    assert len(asked) == 3
    assert {groups[n] for n in asked} == {"big", "small", None}
    asked.clear()
    # "c" is taken: of the two alike, the name breaks the tie, as in the full loop.
    ranks["small"] = (9.0,)
    index.changed("c")
    assert index.best("shape", list(groups), ask, group=groups.get) == ("a", "slots-big")
    assert asked == ["c"]


def test_a_first_placement_asks_alike_bare_nodes_once() -> None:
    ledger = Ledger.rebuild(
        [node(f"n{i:03d}", [chip("910B3", 0)], labels={"zone": "a"}) for i in range(200)], []
    )
    fits: list[str] = []
    real = ledger._fit

    def counted(inventory: NodeInventory, *args: object) -> object:
        fits.append(inventory.name)
        return real(inventory, *args)  # type: ignore[arg-type]

    ledger._fit = counted  # type: ignore[assignment,method-assign]
    placed = ledger.place(request("p", "vir05_1c_16g"), Policy.BINPACK)
    assert isinstance(placed, Placement)
    assert placed.node == "n000"
    assert len(fits) == 1, fits
    # A selector reads labels: then every node is its own.
    fits.clear()
    selective = request("q", "vir05_1c_16g", node_selector={"zone": "a"})
    ledger.place(selective, Policy.BINPACK)
    assert len(fits) == 200


def test_heap_stays_bounded_under_churn() -> None:
    index: CandidateIndex[int] = CandidateIndex()
    rank = {"n": 0.0}
    for i in range(5000):
        rank["n"] = float(i % 7)
        index.changed("n")
        assert index.best("s", ["n"], lambda _n, i=i: ((rank["n"],), i)) == ("n", i)
    shape = index._shapes["s"]
    assert len(shape.heap) <= 5

"""Placement reads a VNPUNode that lists each model's templates once
(status.models, chips unlike their model with lists of their own) as it reads
one whose every chip lists its own (what agents wrote before, and what an
agent not yet upgraded still writes): the same offers, the same print, the
same placements."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from placement_helpers import MODELS, chip, node, request

from vnpu_operator.placement import Ledger, NodeInventory, Placement, Policy

LEASE_VALID = True


def inventories() -> list[NodeInventory]:
    return [
        node("a", "910B3", n_chips=2),
        node("b", [chip("310P3", 0), chip("910B3", 1), chip("910B3", 2)]),
        node("c", [chip("910B3", 0, templates=["vir10_3c_32g"]), chip("910B3", 1)]),
        node("d", [chip("910B3", 0), chip("910B3", 1, templates=[])]),
    ]


def _raw(inventory: NodeInventory, per_model: bool) -> dict[str, Any]:
    status = copy.deepcopy(inventory.status.to_api())
    if per_model:
        models: dict[str, Any] = {}
        for c in status["chips"]:
            listed = c.pop("templates")
            if c["model"] not in models:
                models[c["model"]] = listed
            elif listed != models[c["model"]]:
                c["templates"] = listed
        status["models"] = [{"model": m, "templates": t} for m, t in models.items()]
    return {"metadata": {"name": inventory.name}, "status": status}


def _node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {}}, "spec": {}}


def _both(inventory: NodeInventory) -> tuple[NodeInventory, NodeInventory]:
    old, new = (
        NodeInventory.from_objects(_raw(inventory, per_model), _node(inventory.name), LEASE_VALID)
        for per_model in (False, True)
    )
    return old, new


@pytest.mark.parametrize("name", ["a", "b", "c", "d"])
def test_both_shapes_offer_alike(name: str) -> None:
    inventory = next(i for i in inventories() if i.name == name)
    old, new = _both(inventory)
    assert "models" in _raw(inventory, True)["status"]
    assert new.offers == old.offers == inventory.offers
    assert new.chips_print == old.chips_print
    for a, b in zip(old.status.chips, new.status.chips, strict=True):
        assert a.templates == b.templates


def test_a_chip_offering_nothing_is_not_given_its_models_list() -> None:
    _, new = _both(next(i for i in inventories() if i.name == "d"))
    assert new.offers[1] == {}
    assert set(new.offers[0]) == set(MODELS["910B3"][5])


@pytest.mark.parametrize("policy", [Policy.BINPACK, Policy.SPREAD, Policy.BESTFIT])
def test_both_shapes_place_alike(policy: Policy) -> None:
    ledgers = [Ledger.rebuild([_both(i)[shape] for i in inventories()], []) for shape in (0, 1)]
    shapes = [("vir05_1c_16g", 1), ("vir10_3c_32g", 2), ("vir02", 1), ("vir10_3c_32g", 1)]
    placed = 0
    for n in range(24):
        template, count = shapes[n % len(shapes)]
        got = [ledger.place(request(f"p{n}", template, count), policy) for ledger in ledgers]
        outcomes = [
            (g.node, [(a.chip, a.vnpu_id) for a in g.allocations])
            if isinstance(g, Placement) else type(g).__name__
            for g in got
        ]  # fmt: skip
        assert outcomes[0] == outcomes[1], (n, template, count)
        placed += isinstance(got[0], Placement)
    assert placed >= 10

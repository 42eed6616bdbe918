"""Ledger.rebuild, the bulk path (kubectl vnpu builds a ledger per call),
books exactly as a ledger fed the same objects one by one."""

from __future__ import annotations

import time

from placement_helpers import chip, node, request

from vnpu_operator.placement import Allocation, Ledger, NodeInventory, Placement


def _inventories() -> list[NodeInventory]:
    return [
        node("a", [chip("910B3", 0, vnpus=[(100, "vir05_1c_16g")]), chip("910B4", 1)]),
        node("b", "310P3", n_chips=2),
        node("c", [chip("910B3", 0, templates=["vir10_3c_32g"])], live=False),
    ]


def _allocations() -> list[Allocation]:
    return [
        Allocation("ns/x-0", "a", 0, "vir05_1c_16g", 100, "uid-x", "x"),
        Allocation("ns/y-0", "b", 1, "vir04", 120, "uid-y", "y"),
    ]


def test_rebuild_equals_upserting_one_by_one() -> None:
    bulk = Ledger.rebuild(_inventories(), _allocations())
    stepwise = Ledger()
    for inventory in _inventories():
        stepwise.upsert_node(inventory)
    for allocation in _allocations():
        stepwise.add_allocation(allocation)
    assert bulk.offered() == stepwise.offered()
    assert bulk.node_names() == stepwise.node_names()
    assert bulk.capacity() == stepwise.capacity()
    for template in ("vir05_1c_16g", "vir10_3c_32g", "vir04", "vir10_3c_16g"):
        for count in (1, 2, 5):
            wanted = request(f"p-{template}-{count}", template, count)
            assert bulk.place(wanted) == stepwise.place(wanted)
    assert bulk.allocations() == stepwise.allocations()


def test_rebuild_of_a_thousand_nodes_builds_the_catalog_once() -> None:
    inventories = [node(f"n{i:04d}", "910B3", n_chips=8) for i in range(1000)]
    started = time.perf_counter()
    ledger = Ledger.rebuild(inventories, ())
    took = time.perf_counter() - started
    assert ledger.catalog_epoch == 1
    assert isinstance(ledger.place(request()), Placement)
    # One catalog pass is milliseconds; one per node was ~7 s here.
    assert took < 2.0, f"rebuild took {took:.2f} s"

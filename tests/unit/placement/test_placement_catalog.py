"""The catalog is kept as nodes come and go, never rebuilt from every node:
the same catalog in any arrival order, and a new node that offers what the
others do leaves every kept placement answer standing."""

from __future__ import annotations

import random

from placement_helpers import chip, node, placed, request

from vnpu_common.wire.models import TemplateResources
from vnpu_operator.placement import Ledger, NodeInventory, Placement
from vnpu_operator.placement.catalog import CatalogIndex


def _odd(name: str, aicore: int) -> NodeInventory:
    """A hand-made VNPUNode whose vir05_1c_16g takes `aicore` AI Cores."""
    c = chip("910B3", 0)
    c.templates = [
        t if t.name != "vir05_1c_16g" else TemplateResources(
            name=t.name, aicore=aicore, memory_mb=t.memory_mb, aicpu=t.aicpu, media=t.media
        )
        for t in c.templates
    ]  # fmt: skip
    return node(name, [c])


def _nodes() -> list[NodeInventory]:
    return [
        node("n-03", "910B3", n_chips=2),
        _odd("n-01", 6),
        node("n-05", "310P3"),
        _odd("n-02", 7),
        node("n-04", [chip("910B4", 0), chip("910B3", 1)]),
    ]


def test_any_arrival_order_gives_the_catalog_of_a_rebuild() -> None:
    whole = Ledger.rebuild(_nodes(), ())
    assert whole._catalog.templates[("910B3", "vir05_1c_16g")].aicore == 6  # n-01's, first by name
    rng = random.Random(7)
    for _ in range(20):
        order = _nodes()
        rng.shuffle(order)
        stepwise = Ledger()
        for inventory in order:
            stepwise.upsert_node(inventory)
        assert dict(stepwise._catalog.templates) == dict(whole._catalog.templates), order
        assert stepwise.largest_templates() == whole.largest_templates()
        assert stepwise.offered() == whole.offered()
        assert stepwise.node_names() == sorted(i.name for i in order)


def test_removing_the_node_shown_shows_the_next_one_by_name() -> None:
    catalog = CatalogIndex()
    for inventory in _nodes():
        catalog.set_node(inventory.name, [(c.model, c.templates) for c in inventory.status.chips])
    key = ("910B3", "vir05_1c_16g")
    assert catalog.templates[key].aicore == 6
    assert catalog.remove_node("n-01") is True
    assert catalog.templates[key].aicore == 7  # n-02's
    assert catalog.remove_node("n-02") is True
    assert catalog.templates[key].aicore == 5  # the stock figure of n-03 and n-04
    assert catalog.remove_node("n-03") is False  # n-04 still offers the same
    assert catalog.remove_node("n-04") is True  # the 910B4 and the 910B3 pairs go
    assert {model for model, _ in catalog.templates} == {"310P3"}
    assert catalog.largest == {"310P3": "vir04"}
    assert catalog.remove_node("n-05") is True
    assert dict(catalog.templates) == {}
    assert dict(catalog.largest) == {}
    assert catalog.remove_node("n-05") is False


def test_a_thousand_alike_nodes_move_the_catalog_once() -> None:
    ledger = Ledger()
    for i in reversed(range(1000)):
        ledger.upsert_node(node(f"n{i:04d}", "910B3", n_chips=8))
    assert ledger.catalog_epoch == 1
    assert ledger.node_names() == [f"n{i:04d}" for i in range(1000)]
    placed(ledger.place(request("first")))
    # A node with a model nobody offered moves it; one more alike node does not.
    ledger.upsert_node(node("z-310", "310P3"))
    assert ledger.catalog_epoch == 2
    ledger.upsert_node(node("z-910", "910B3", n_chips=8))
    assert ledger.catalog_epoch == 2
    # Removing the only node of a model moves it again; its name leaves the order.
    assert ledger.remove_node("z-310") is not None
    assert ledger.catalog_epoch == 3
    assert "z-310" not in ledger.node_names()


def test_a_node_added_after_placements_began_is_placed_on() -> None:
    ledger = Ledger()
    ledger.upsert_node(node("b", "910B3"))
    booked = 0
    while isinstance(ledger.place(request(f"p{booked}", "vir10_3c_32g")), Placement):
        booked += 1
    assert booked >= 1  # b is full now
    epoch = ledger.catalog_epoch
    ledger.upsert_node(node("a", "910B3"))
    assert ledger.catalog_epoch == epoch  # nothing new offered: the kept answers stand
    assert placed(ledger.place(request("late", "vir10_3c_32g"))).node == "a"
    assert ledger.node_names() == ["a", "b"]

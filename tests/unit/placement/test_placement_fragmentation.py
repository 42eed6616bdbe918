"""The fragmentation figure: how much free AICore the largest template can use."""

from __future__ import annotations

from placement_helpers import chip, node, placed, request

from vnpu_operator.placement import Ledger, Policy
from vnpu_operator.placement.fragmentation import Fragmentation, largest_templates


def test_largest_template_is_the_one_with_most_aicore_then_memory() -> None:
    ledger = Ledger.rebuild([node("a", "910B4"), node("b", "310P3"), node("c", "910B3")], [])
    # 910B4 has three 10-core templates; 16 GB ties, aicpu does not rank, name decides.
    assert ledger.largest_templates() == {
        "910B3": "vir10_3c_32g",
        "910B4": "vir10_3c_16g",
        "310P3": "vir04",
    }
    # The choice does not depend on the order the catalog lists them in.
    reversed_catalog = dict(reversed(ledger._catalog.templates.items()))
    assert largest_templates(reversed_catalog) == ledger.largest_templates()


def test_empty_chips_are_wholly_usable() -> None:
    ledger = Ledger.rebuild([node("a", n_chips=2)], [])
    figure = ledger.fragmentation()["a"]
    assert figure == Fragmentation(free_aicore=40, usable_aicore=40, largest_fits=4, ideal_fits=4)
    assert figure.ratio == 0.0


def test_scattered_small_vnpus_make_free_cores_unusable() -> None:
    ledger = Ledger.rebuild([node("a", n_chips=2)], [])
    # Spread puts one 5-core vNPU on each chip: 15 free cores per chip, one
    # 10-core vNPU per chip fits, 5 cores per chip are stranded.
    for i in range(2):
        placed(ledger.place(request(f"p{i}"), policy=Policy.SPREAD))
    figure = ledger.fragmentation()["a"]
    # Gathered, the 30 free cores would be one and a half chips: three.
    assert figure == Fragmentation(free_aicore=30, usable_aicore=20, largest_fits=2, ideal_fits=3)
    assert abs(figure.ratio - 1 / 3) < 1e-9
    # Binpack keeps the second chip whole: nothing is lost.
    packed = Ledger.rebuild([node("a", n_chips=2)], [])
    for i in range(2):
        placed(packed.place(request(f"p{i}")))
    assert packed.fragmentation()["a"].ratio == 0.0


def test_unhealthy_and_cordoned_chips_are_not_placeable_capacity() -> None:
    chips = [chip(index=0, health="Unhealthy"), chip(index=1), chip(index=2)]
    inv = node("a", chips, cordoned={1: "repair"})
    figure = Ledger.rebuild([inv], []).fragmentation()["a"]
    assert figure == Fragmentation(free_aicore=20, usable_aicore=20, largest_fits=2, ideal_fits=2)


def test_a_template_that_cannot_fill_a_chip_is_not_fragmentation() -> None:
    # vir04 takes 4 of the 310P3's 7 AI CPUs: one per chip, 4 cores idle.
    figure = Ledger.rebuild([node("a", "310P3")], []).fragmentation()["a"]
    assert figure == Fragmentation(free_aicore=8, usable_aicore=4, largest_fits=1, ideal_fits=1)
    assert figure.ratio == 0.0


def test_id_exhaustion_limits_what_fits() -> None:
    # One id left on the chip: one more vNPU at most, whatever the cores say.
    inv = node("a", [chip(index=0, id_range=(100, 100))])
    figure = Ledger.rebuild([inv], []).fragmentation()["a"]
    assert figure.largest_fits == 1
    assert figure.usable_aicore == 10


def test_cluster_figure_is_the_sum_of_nodes() -> None:
    ledger = Ledger.rebuild([node("a"), node("b", "310P3")], [])
    per_node = ledger.fragmentation()
    summed = per_node["a"] + per_node["b"]
    assert summed == Fragmentation(free_aicore=28, usable_aicore=24, largest_fits=3, ideal_fits=3)
    assert ledger.fragmentation("b") == {"b": per_node["b"]}
    assert ledger.fragmentation("missing") == {}

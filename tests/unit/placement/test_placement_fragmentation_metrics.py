"""The fragmentation gauges carry Ledger.fragmentation's figures, per node
and for the cluster, on a ledger whose numbers are worked out by hand."""

from __future__ import annotations

from placement_helpers import chip, node

from vnpu_operator.metrics import OperatorMetrics, StateView
from vnpu_operator.placement import Ledger

VIR05 = "vir05_1c_16g"


def scrape(ledger: Ledger) -> OperatorMetrics:
    metrics = OperatorMetrics()
    metrics.watch(
        StateView(
            allocations=list,
            capacity=ledger.capacity,
            waiting=list,
            live_nodes=dict,
            fragmentation=ledger.fragmentation,
        )
    )
    return metrics


def test_node_and_cluster_figures() -> None:
    # a: two 910B3 chips with one vir05 each (15 of 20 AICore free on each):
    # one vir10_3c_32g fits per chip, 2 in all, while the 30 free AICore
    # gathered would take 3. b: an empty 910B3 takes 2 of 2. c: a cordoned
    # chip is not placeable, so it is neither free nor fragmented.
    ledger = Ledger.rebuild(
        [
            node(
                "a",
                [chip("910B3", 0, vnpus=[(100, VIR05)]), chip("910B3", 1, vnpus=[(116, VIR05)])],
            ),
            node("b", "910B3"),
            node("c", "910B3", cordoned={0: "maintenance"}),
        ],
        (),
    )
    registry = scrape(ledger).registry

    def value(name: str, node_name: str | None = None) -> float | None:
        labels = {} if node_name is None else {"node": node_name}
        return registry.get_sample_value(f"vnpu_operator_{name}", labels)

    assert value("largest_template_fits", "a") == 2
    assert value("largest_template_fits_gathered", "a") == 3
    assert value("node_fragmentation_ratio", "a") == round(1 - 2 / 3, 4)
    assert value("node_free_aicore", "a") == 30
    assert value("node_largest_template_aicore", "a") == 20
    assert value("largest_template_fits", "b") == 2
    assert value("node_fragmentation_ratio", "b") == 0
    assert value("node_free_aicore", "c") == 0
    assert value("largest_template_fits_gathered", "c") == 0
    # 4 of the 5 the cluster would take gathered node by node.
    assert value("cluster_fragmentation_ratio") == 0.2


def test_no_nodes_exports_a_zero_cluster_ratio_and_no_node_series() -> None:
    registry = scrape(Ledger()).registry
    assert registry.get_sample_value("vnpu_operator_cluster_fragmentation_ratio") == 0
    ours = [
        s
        for f in registry.collect()
        if f.name.startswith("vnpu_operator_largest_template")
        for s in f.samples
    ]
    assert ours == []

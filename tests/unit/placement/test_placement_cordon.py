"""Cordoned and unhealthy chips: nothing new goes there, what is there stays
booked, and the operator's inventories see a cordon come and go."""

from __future__ import annotations

from typing import Any

from placement_helpers import chip, node, nofit, placed, request
from prometheus_client import CollectorRegistry

from vnpu_operator.config import OperatorSettings
from vnpu_operator.inventories import Inventories
from vnpu_operator.metrics import OperatorMetrics, StateView
from vnpu_operator.placement import (
    Allocation,
    Ledger,
    NodeInventory,
    Reason,
)


def booked_on(node_name: str, chip_index: int, vnpu_id: int, name: str) -> Allocation:
    return Allocation(
        key=f"default/{name}",
        node=node_name,
        chip=chip_index,
        template="vir05_1c_16g",
        vnpu_id=vnpu_id,
        pod_uid=f"uid-{name}",
        pod_name=name,
    )


def test_cordoned_chip_gets_nothing_new_while_the_other_chip_does() -> None:
    ledger = Ledger.rebuild([node("n", n_chips=2, cordoned={0: "fan noise"})], ())
    # Four vir05 fill one 910B3 chip: all four land on chip 1, none on chip 0.
    chips = [placed(ledger.place(request(f"p{i}"))).allocations[0].chip for i in range(4)]
    assert chips == [1, 1, 1, 1]
    # The empty cordoned chip would take it: uncordoning is what would help.
    result = nofit(ledger.place(request("p4")))
    assert result.node_reasons == {"n": Reason.CORDONED}
    assert result.message == "0/1 nodes can host 1 x vir05_1c_16g: 1 chip cordoned"


def test_a_cordoned_chip_that_would_not_fit_anyway_names_the_real_blocker() -> None:
    full = chip(index=0, vnpus=[(100 + i, "vir05_1c_16g") for i in range(4)])
    ledger = Ledger.rebuild([node("n", [full], cordoned={0: "x"})], ())
    assert nofit(ledger.place(request())).primary_reason is Reason.INSUFFICIENT_AICORE


def test_a_node_whose_only_chip_is_cordoned_says_so() -> None:
    ledger = Ledger.rebuild([node("a", cordoned={0: "x"}), node("b", cordoned={0: "y"})], ())
    result = nofit(ledger.place(request()))
    assert result.reasons == {Reason.CORDONED: 2}
    assert result.message == "0/2 nodes can host 1 x vir05_1c_16g: 2 chip cordoned"


def test_a_cordon_of_a_chip_the_node_does_not_have_blocks_nothing() -> None:
    ledger = Ledger.rebuild([node("n", cordoned={7: "not installed yet"})], ())
    assert placed(ledger.place(request())).allocations[0].chip == 0


def test_existing_vnpus_on_a_cordoned_chip_stay_booked() -> None:
    # A vNPU on chip 0 (booked before the cordon) keeps its capacity and its id.
    ledger = Ledger.rebuild(
        [node("n", [chip(index=0, vnpus=[(100, "vir05_1c_16g")]), chip(index=1)])],
        [booked_on("n", 0, 100, "old")],
    )
    ledger.upsert_node(
        node(
            "n",
            [chip(index=0, vnpus=[(100, "vir05_1c_16g")]), chip(index=1)],
            cordoned={0: "drain"},
        )
    )
    assert ledger.allocation("default/old") is not None
    by_chip = {c.chip: c for c in ledger.capacity("n")}
    assert by_chip[0].cordoned == "drain"
    assert by_chip[0].allocated == 1
    assert by_chip[0].used.aicore == 5
    assert by_chip[1].cordoned is None
    p = placed(ledger.place(request("new")))
    assert [(a.chip, a.vnpu_id) for a in p.allocations] == [(1, 116)]


def test_uncordon_makes_the_chip_placeable_again() -> None:
    ledger = Ledger.rebuild([node("n", cordoned={0: "x"})], ())
    assert nofit(ledger.place(request("a"))).primary_reason is Reason.CORDONED
    ledger.upsert_node(node("n"))
    assert placed(ledger.place(request("a"))).allocations[0].chip == 0


def test_cordoned_and_unhealthy_chips_both_refuse_and_a_healthy_one_takes_it() -> None:
    n = node(
        "n",
        [chip(index=0, health="Unhealthy"), chip(index=1), chip(index=2)],
        cordoned={1: "x"},
    )
    assert placed(Ledger.rebuild([n], ()).place(request())).allocations[0].chip == 2
    both = node("m", [chip(index=0, health="Unhealthy"), chip(index=1)], cordoned={1: "x"})
    # The chip that got furthest names the node: the cordoned one, which would fit.
    assert nofit(Ledger.rebuild([both], ()).place(request())).primary_reason is Reason.CORDONED


def test_inventory_reads_the_cordon_from_the_vnpunode_spec() -> None:
    vnpu_node = {
        "metadata": {"name": "n"},
        "spec": {"cordonedChips": [{"chip": 1, "reason": "ECC errors"}]},
        "status": {},
    }
    inventory = NodeInventory.from_objects(vnpu_node, {"metadata": {"name": "n"}}, True)
    assert inventory.cordoned == {1: "ECC errors"}
    assert NodeInventory.from_objects({"metadata": {"name": "n"}}, None, True).cordoned == {}


def _vnpunode(cordoned: list[dict[str, Any]], version: str) -> dict[str, Any]:
    status = node("n", n_chips=2).status.to_api()
    return {
        "metadata": {"name": "n", "resourceVersion": version},
        "spec": {"cordonedChips": cordoned},
        "status": status,
    }


def test_cordon_and_uncordon_reach_the_ledger_and_uncordon_wakes_waiting_pods() -> None:
    ledger = Ledger()
    woken: list[str] = []
    inventories = Inventories(
        ledger, OperatorSettings(), grown=lambda: woken.append("grown"), lost=lambda *_: None
    )
    inventories.vnpunode_event(None, _vnpunode([], "1"))
    assert woken == ["grown"]
    inventories.vnpunode_event(None, _vnpunode([{"chip": 0, "reason": "x"}], "2"))
    inventory = ledger.node("n")
    assert inventory is not None
    assert inventory.cordoned == {0: "x"}
    woken.clear()
    # The same object again (a resync) changes nothing and wakes nobody.
    inventories.vnpunode_event(None, _vnpunode([{"chip": 0, "reason": "x"}], "2"))
    assert woken == []
    inventories.vnpunode_event(None, _vnpunode([], "3"))
    inventory = ledger.node("n")
    assert inventory is not None
    assert inventory.cordoned == {}
    assert woken == ["grown"]


def test_unavailable_chips_are_a_metric() -> None:
    ledger = Ledger.rebuild(
        [node("n", [chip(index=0, health="Unhealthy"), chip(index=1), chip(index=2)],
              cordoned={1: "x", 0: "y"})],
        (),
    )  # fmt: skip
    metrics = OperatorMetrics(CollectorRegistry())
    metrics.watch(
        StateView(
            allocations=list,
            capacity=ledger.capacity,
            waiting=list,
            live_nodes=dict,
        )
    )
    samples = {
        (s.labels["chip"], s.labels["reason"]): s.value
        for family in metrics.registry.collect()
        if family.name == "vnpu_operator_chip_unavailable"
        for s in family.samples
    }
    assert samples == {("0", "cordoned"): 1, ("0", "unhealthy"): 1, ("1", "cordoned"): 1}

"""One ledger, two front-ends: a node whose agent publishes a DRA pool
(status.dra) is closed to annotated pods, so the scheduler's allocations and
the operator's placements never book the same chip (docs/DRA.md)."""

from __future__ import annotations

from dataclasses import replace

from placement_helpers import node, nofit, placed, request

from vnpu_operator.placement import Ledger, NodeInventory, Reason


def dra(inventory: NodeInventory) -> NodeInventory:
    return replace(inventory, status=inventory.status.model_copy(update={"dra": True}))


def test_an_annotated_pod_never_lands_on_a_dra_node() -> None:
    ledger = Ledger()
    ledger.upsert_node(dra(node("dra-1", n_chips=8)))
    ledger.upsert_node(node("plain-1", n_chips=1))
    # binpack would rather fill one node; the DRA node is not a candidate at all
    for i in range(4):
        assert placed(ledger.place(request(f"p{i}"))).node == "plain-1"
    result = nofit(ledger.place(request("p-next", "vir10_3c_32g", 2)))
    assert result.node_reasons["dra-1"] is Reason.DRA_NODE


def test_only_dra_nodes_leave_annotated_pods_nowhere_and_say_why() -> None:
    ledger = Ledger()
    ledger.upsert_node(dra(node("dra-1")))
    result = nofit(ledger.place(request("p")))
    assert result.node_reasons == {"dra-1": Reason.DRA_NODE}
    assert "DRA" in Reason.DRA_NODE.label

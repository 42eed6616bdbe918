"""The agent refuses to switch a node between front-ends while it holds live
allocations of the other kind (vnpu_agent/modes.py)."""

from __future__ import annotations

from typing import Any

from agent_helpers import allocation

from vnpu_agent.modes import conflict


def claim_alloc(name: str, vnpu_id: int) -> dict[str, Any]:
    obj = allocation(name, vnpu_id)
    obj["spec"]["claim"] = {"name": "c", "uid": "u", "request": "npu", "device": "d"}
    return obj


def test_annotated_pods_keep_a_node_off_dra() -> None:
    why = conflict("n1", True, [allocation("a", 100), claim_alloc("b", 101)])
    assert why is not None
    assert "1 live allocation(s) of annotated pods (team-a/a)" in why
    assert "without --dra" in why


def test_claims_keep_a_node_on_dra() -> None:
    why = conflict("n1", False, [allocation("a", 100), claim_alloc("b", 101)])
    assert why is not None
    assert "of ResourceClaims (team-a/b)" in why
    assert "with --dra" in why


def test_allocations_being_released_or_of_other_nodes_do_not_count() -> None:
    leaving = allocation("a", 100)
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    elsewhere = allocation("b", 101)
    elsewhere["spec"]["nodeName"] = "n2"
    assert conflict("n1", True, [leaving, elsewhere, claim_alloc("c", 102)]) is None
    assert conflict("n1", False, [allocation("d", 103)]) is None


def test_a_long_list_is_named_in_part() -> None:
    why = conflict("n1", True, [allocation(f"p{i}", 100 + i) for i in range(8)])
    assert why is not None
    assert "8 live allocation(s)" in why
    assert "and 3 more" in why

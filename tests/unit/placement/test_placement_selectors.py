"""Node affinity, nodeSelector and toleration semantics, edge cases included."""

from __future__ import annotations

from typing import Any

import pytest
from placement_helpers import affinity, expr

from vnpu_operator.placement.selectors import (
    SelectorError,
    Taint,
    compile_node_selector,
    compile_taints,
    compile_tolerations,
    node_selector_matches,
    node_selector_terms_match,
    tolerates,
    untolerated_taints,
)

LABELS = {"zone": "a", "gen": "3", "npu": ""}


def matches(raw: dict[str, Any], labels: dict[str, str] = LABELS, name: str = "n1") -> bool:
    return node_selector_terms_match(compile_node_selector(raw), name, labels)


@pytest.mark.parametrize(
    ("requirement", "expected"),
    [
        (expr("zone", "In", "a", "b"), True),
        (expr("zone", "In", "b"), False),
        (expr("absent", "In", "a"), False),
        (expr("zone", "NotIn", "b"), True),
        (expr("zone", "NotIn", "a"), False),
        (expr("absent", "NotIn", "a"), True),  # absent label satisfies NotIn
        (expr("npu", "Exists"), True),  # an empty value still exists
        (expr("absent", "Exists"), False),
        (expr("absent", "DoesNotExist"), True),
        (expr("zone", "DoesNotExist"), False),
        (expr("gen", "Gt", "2"), True),
        (expr("gen", "Gt", "3"), False),  # strictly greater
        (expr("gen", "Lt", "4"), True),
        (expr("gen", "Lt", "-3"), False),
        (expr("gen", "Gt", "+2"), True),
        (expr("zone", "Gt", "1"), False),  # non-integer label never matches
        (expr("absent", "Lt", "10"), False),
    ],
)
def test_operator(requirement: dict[str, Any], expected: bool) -> None:
    assert matches(affinity([requirement])) is expected


def test_expressions_in_a_term_are_anded() -> None:
    both = affinity([expr("zone", "In", "a"), expr("gen", "In", "4")])
    assert not matches(both)


def test_terms_are_ored() -> None:
    either = affinity([expr("zone", "In", "b")], [expr("gen", "In", "3")])
    assert matches(either)


def test_empty_term_and_empty_list_match_nothing() -> None:
    assert not matches({"nodeSelectorTerms": [{}]})
    assert not matches({"nodeSelectorTerms": [None]})
    assert not matches({"nodeSelectorTerms": []})
    # An empty term beside a matching one does not spoil it.
    assert matches({"nodeSelectorTerms": [{}, {"matchExpressions": [expr("zone", "Exists")]}]})


def test_match_fields_on_node_name() -> None:
    def term(op: str, value: str) -> dict[str, Any]:
        return {"nodeSelectorTerms": [{"matchFields": [expr("metadata.name", op, value)]}]}

    assert matches(term("In", "n1"))
    assert not matches(term("In", "n2"))
    assert matches(term("NotIn", "n2"))
    assert not matches(term("NotIn", "n1"))
    combined = {
        "nodeSelectorTerms": [
            {
                "matchFields": [expr("metadata.name", "In", "n1")],
                "matchExpressions": [expr("zone", "In", "b")],
            }
        ]
    }
    assert not matches(combined)


@pytest.mark.parametrize(
    "raw",
    [
        "terms",
        {"nodeSelectorTerms": "x"},
        {"nodeSelectorTerms": ["x"]},
        {"nodeSelectorTerms": [{"matchExpressions": {"key": "a"}}]},
        affinity([{"operator": "Exists"}]),
        affinity([expr("a", "In")]),
        affinity([expr("a", "Exists", "v")]),
        affinity([expr("a", "Gt", "x")]),
        affinity([expr("a", "Gt", "1", "2")]),
        affinity([expr("a", "Lt", str(2**63))]),
        affinity([{"key": "a", "operator": "In", "values": [1]}]),
        {"nodeSelectorTerms": [{"matchFields": [expr("metadata.labels", "In", "x")]}]},
        {"nodeSelectorTerms": [{"matchFields": [expr("metadata.name", "Exists")]}]},
        {"nodeSelectorTerms": [{"matchFields": [expr("metadata.name", "In", "a", "b")]}]},
    ],
)
def test_malformed_selectors_raise(raw: Any) -> None:
    with pytest.raises(SelectorError):
        compile_node_selector(raw)


def test_node_selector_needs_every_pair_equal() -> None:
    assert node_selector_matches({}, {})
    assert node_selector_matches({"zone": "a"}, LABELS)
    assert not node_selector_matches({"zone": "a", "gen": "4"}, LABELS)
    assert not node_selector_matches({"missing": ""}, LABELS)
    assert node_selector_matches({"npu": ""}, LABELS)


# -------------------------------------------------------------- tolerations


def tol(**fields: str) -> Any:
    return compile_tolerations([fields])[0]


TAINT = Taint(key="npu", value="busy", effect="NoSchedule")


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        ({"key": "npu", "operator": "Equal", "value": "busy", "effect": "NoSchedule"}, True),
        ({"key": "npu", "value": "busy"}, True),  # operator defaults to Equal
        ({"key": "npu", "value": "idle"}, False),
        ({"key": "npu"}, False),  # Equal with empty value vs. non-empty taint value
        ({"key": "npu", "operator": "Exists"}, True),  # empty effect matches all
        ({"key": "npu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "gpu", "operator": "Exists"}, False),
        ({"operator": "Exists"}, True),  # empty key + Exists tolerates everything
        ({"operator": "Exists", "effect": "NoExecute"}, False),
    ],
)
def test_toleration_semantics(toleration: dict[str, str], expected: bool) -> None:
    assert tolerates(tol(**toleration), TAINT) is expected


def test_equal_with_empty_value_tolerates_empty_taint_value() -> None:
    assert tolerates(tol(key="npu"), Taint("npu", "", "NoExecute"))


def test_only_blocking_effects_must_be_tolerated() -> None:
    taints = compile_taints(
        [
            {"key": "soft", "effect": "PreferNoSchedule"},
            {"key": "hard", "effect": "NoSchedule"},
            {"key": "evict", "value": "x", "effect": "NoExecute"},
        ]
    )
    assert [t.key for t in untolerated_taints(taints, ())] == ["hard", "evict"]
    only_hard = compile_tolerations([{"key": "hard", "operator": "Exists"}])
    assert [t.key for t in untolerated_taints(taints, only_hard)] == ["evict"]
    everything = compile_tolerations([{"operator": "Exists"}])
    assert untolerated_taints(taints, everything) == ()


@pytest.mark.parametrize(
    "raw",
    [
        "x",
        ["x"],
        [{"effect": "NoSchedule"}],
        [{"key": "a"}],
        [{"key": "a", "effect": "Never"}],
        [{"key": 1, "effect": "NoSchedule"}],
    ],
)
def test_malformed_taints_raise(raw: Any) -> None:
    with pytest.raises(SelectorError):
        compile_taints(raw)

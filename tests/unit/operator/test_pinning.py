"""The pinning patch keeps what the pod asked for and only narrows it."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from localplane.pods import vnpu_pod
from vnpu_common.wire import names
from vnpu_operator.pinning import PinningError, pin_patch

LABELS = {"kubernetes.io/hostname": "node-a"}


def _pod(**spec: Any) -> dict[str, Any]:
    """A gated pod; `spec` adds fields such as affinity."""
    return vnpu_pod(
        "p", "ns", template="vir01", containers=["c"],
        scheduling_gates=[names.SCHEDULING_GATE], spec=spec,
    )  # fmt: skip


def _apply(pod: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = jsonpatch.apply_patch(pod, pin_patch(pod, "node-a", LABELS, [100, 101]))
    return out


def test_pod_without_affinity_gets_an_exact_node_pin() -> None:
    out = _apply(_pod())
    assert "schedulingGates" not in out["spec"]
    assert out["metadata"]["annotations"][names.ANN_VISIBLE_DEVICES] == "100,101"
    terms = out["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]  # fmt: skip
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
    ]


def test_existing_terms_are_each_narrowed_not_replaced() -> None:
    user_terms = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
    ]
    pod = _pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": user_terms}}})  # fmt: skip
    out = _apply(pod)
    terms = out["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]  # fmt: skip
    assert len(terms) == 2
    for term, original in zip(terms, user_terms, strict=True):
        assert term["matchExpressions"][0] == original["matchExpressions"][0]
        assert term["matchExpressions"][1] == {
            "key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]
        }  # fmt: skip


def test_other_gates_and_affinity_kinds_are_kept() -> None:
    pod = _pod(affinity={"podAntiAffinity": {"x": 1}})
    pod["spec"]["schedulingGates"].append({"name": "example.com/other"})
    out = _apply(pod)
    assert out["spec"]["schedulingGates"] == [{"name": "example.com/other"}]
    assert out["spec"]["affinity"]["podAntiAffinity"] == {"x": 1}
    assert "nodeAffinity" in out["spec"]["affinity"]


def test_pod_without_annotations_map_gets_one() -> None:
    pod = _pod()
    del pod["metadata"]["annotations"]
    assert _apply(pod)["metadata"]["annotations"] == {names.ANN_VISIBLE_DEVICES: "100,101"}


def test_narrowing_needs_the_hostname_label() -> None:
    pod = _pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "zone", "operator": "Exists"}]}]}}})  # fmt: skip
    with pytest.raises(PinningError, match=r"kubernetes\.io/hostname"):
        pin_patch(pod, "node-a", {}, [100])


def test_a_concurrent_gate_change_fails_the_patch() -> None:
    pod = _pod()
    ops = pin_patch(pod, "node-a", LABELS, [100])
    pod["spec"]["schedulingGates"].append({"name": "late/gate"})
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(pod, ops)

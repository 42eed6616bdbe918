"""metrics_pod_names=false: no series names a tenant's pod or allocation, and the
waiting alert's series still says how long each namespace has waited."""

from __future__ import annotations

from typing import Any, cast

from prometheus_client import CollectorRegistry
from test_metric_names import ALLOCATION, fake_agent

from vnpu_agent.metrics import AgentMetrics
from vnpu_operator.metrics import OperatorMetrics, StateView, WaitingPod

WAITING = [
    WaitingPod("ml", "first", "insufficient-aicore", 300.0),
    WaitingPod("ml", "second", "insufficient-aicore", 30.0),
    WaitingPod("ml", "third", "cordoned", 10.0),
    WaitingPod("web", "alone", "insufficient-aicore", 60.0),
]


def samples(registry: CollectorRegistry, name: str) -> list[dict[str, Any]]:
    return [
        {**s.labels, "value": s.value}
        for f in registry.collect()
        for s in f.samples
        if s.name == name
    ]


def operator_registry(pod_names: bool) -> CollectorRegistry:
    metrics = OperatorMetrics()
    metrics.watch(
        StateView(
            allocations=lambda: [ALLOCATION],
            capacity=list,
            waiting=lambda: WAITING,
            live_nodes=dict,
        ),
        pod_names=pod_names,
    )
    return metrics.registry


def test_waiting_pods_are_named_by_default() -> None:
    found = samples(operator_registry(True), "vnpu_operator_pod_waiting_since_timestamp_seconds")
    assert sorted(s["pod"] for s in found) == ["alone", "first", "second", "third"]


def test_without_pod_names_each_namespace_keeps_its_longest_wait_per_reason() -> None:
    found = samples(operator_registry(False), "vnpu_operator_pod_waiting_since_timestamp_seconds")
    assert {s["pod"] for s in found} == {""}
    by_key = {(s["namespace"], s["reason"]): s["value"] for s in found}
    assert set(by_key) == {
        ("ml", "insufficient-aicore"),
        ("ml", "cordoned"),
        ("web", "insufficient-aicore"),
    }
    # The oldest start of the two ml pods waiting for AI Cores: 300 s ago, not 30.
    assert by_key[("web", "insufficient-aicore")] - by_key[("ml", "insufficient-aicore")] == 240
    # No pod name anywhere in the scrape.
    text = "\n".join(str(s) for f in operator_registry(False).collect() for s in f.samples)
    for pod in ("first", "second", "third", "alone"):
        assert f"'{pod}'" not in text


def test_without_pod_names_the_agent_names_no_pod_or_allocation() -> None:
    agent = fake_agent()
    agent.allocs["ml/train-abc-1"] = {
        **ALLOCATION,
        "metadata": {"namespace": "ml", "name": "train-abc-1"},
        "spec": {**ALLOCATION["spec"], "vnpuId": 181},
    }
    for pod_names, pods in ((True, {"train"}), (False, {""})):
        metrics = AgentMetrics()
        metrics.watch(lambda: [cast(Any, agent)], pod_names=pod_names)
        found = samples(metrics.registry, "vnpu_agent_allocation_info")
        assert {s["pod"] for s in found} == pods
        assert len(found) == 2, found
        # Two allocations of one pod stay two series: their vNPU ids differ.
        assert {s["v_dev_id"] for s in found} == {"180", "181"}
        assert {s["namespace"] for s in found} == {"ml"}
        if not pod_names:
            assert {s["allocation"] for s in found} == {""}

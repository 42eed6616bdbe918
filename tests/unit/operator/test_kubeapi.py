"""Failed operator writes are counted even when no API server answers: a
loopback port nothing listens on refuses the connection for real. The
HTTP statuses are counted against the real API server in
tests/integration/test_operator_api.py."""

from __future__ import annotations

import aiohttp
import pytest
from kubernetes_asyncio import client

from vnpu_common.kube.apiwrites import NO_RESPONSE
from vnpu_operator.kubeapi import OperatorApi
from vnpu_operator.metrics import OperatorMetrics

METRIC = "vnpu_operator_api_errors_total"


@pytest.fixture
def unreachable(unreachable_client: client.ApiClient) -> tuple[OperatorApi, OperatorMetrics]:
    metrics = OperatorMetrics()
    return OperatorApi(unreachable_client, metrics.api_errors), metrics


def _count(metrics: OperatorMetrics, operation: str, status: str) -> float | None:
    return metrics.registry.get_sample_value(METRIC, {"operation": operation, "status": status})


async def test_a_write_without_an_answer_is_counted_and_raised(
    unreachable: tuple[OperatorApi, OperatorMetrics],
) -> None:
    api, metrics = unreachable
    with pytest.raises(aiohttp.ClientConnectionError):
        await api.patch_pod("ns", "p", [{"op": "remove", "path": "/spec/schedulingGates"}])
    with pytest.raises(aiohttp.ClientConnectionError):
        await api.delete_allocation("ns/a")
    assert _count(metrics, "patch_pod", NO_RESPONSE) == 1
    assert _count(metrics, "delete_allocation", NO_RESPONSE) == 1


async def test_a_lost_event_is_counted_but_not_raised(
    unreachable: tuple[OperatorApi, OperatorMetrics],
) -> None:
    api, metrics = unreachable
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}}
    await api.event(pod, reason="VNPUsReady", message="ready")
    assert _count(metrics, "create_event", NO_RESPONSE) == 1

"""The agent's failed writes are counted in vnpu_agent_api_errors_total, as
the operator's are: a loopback port nothing listens on refuses the
connection for real. The HTTP statuses are counted against the real API
server in tests/integration/test_api_writes.py."""

from __future__ import annotations

import aiohttp
import pytest
from kubernetes_asyncio import client

from vnpu_agent.kubeapi import AgentApi
from vnpu_agent.metrics import AgentMetrics
from vnpu_common.kube.apiwrites import NO_RESPONSE

METRIC = "vnpu_agent_api_errors_total"


@pytest.fixture
def unreachable(unreachable_client: client.ApiClient) -> tuple[AgentApi, AgentMetrics]:
    metrics = AgentMetrics()
    return AgentApi(unreachable_client, "vnpu-system", metrics.api_errors), metrics


def _count(metrics: AgentMetrics, operation: str, status: str) -> float | None:
    return metrics.registry.get_sample_value(METRIC, {"operation": operation, "status": status})


async def test_a_write_without_an_answer_is_counted_and_raised(
    unreachable: tuple[AgentApi, AgentMetrics],
) -> None:
    api, metrics = unreachable
    with pytest.raises(aiohttp.ClientConnectionError):
        await api.renew_lease("n1", 40)
    with pytest.raises(aiohttp.ClientConnectionError):
        await api.publish_node_status("n1", {})
    alloc = {"metadata": {"name": "a", "namespace": "ns", "uid": "u"}}
    with pytest.raises(aiohttp.ClientConnectionError):
        await api.patch_allocation_status(alloc, {"phase": "Ready"})
    assert _count(metrics, "patch_lease", NO_RESPONSE) == 1
    assert _count(metrics, "patch_vnpunode_status", NO_RESPONSE) == 1
    assert _count(metrics, "patch_allocation_status", NO_RESPONSE) == 1

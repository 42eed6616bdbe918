"""The agent's failed writes are counted in vnpu_agent_api_errors_total, as
the operator's are: a loopback port nothing listens on refuses the
connection for real. The HTTP statuses are counted against the real API
server in tests/integration/test_api_writes.py."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from kubernetes_asyncio import client

from vnpu_agent.kubeapi import AgentApi
from vnpu_agent.metrics import AgentMetrics
from vnpu_common.apiwrites import NO_RESPONSE

METRIC = "vnpu_agent_api_errors_total"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
async def unreachable() -> AsyncIterator[tuple[AgentApi, AgentMetrics]]:
    configuration = client.Configuration(host=f"http://127.0.0.1:{_closed_port()}")
    api_client = client.ApiClient(configuration)
    metrics = AgentMetrics()
    try:
        yield AgentApi(api_client, "vnpu-system", metrics.api_errors), metrics
    finally:
        await api_client.close()


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

"""The operator's writes against the real API server: a write the server
refuses is raised and counted in vnpu_operator_api_errors_total by operation
and HTTP status; answers that mean the work is done (AlreadyExists on a
retried create, NotFound on a delete) are neither."""

from __future__ import annotations

import pytest
from agent_harness import allocation
from kubernetes_asyncio import config
from kubernetes_asyncio.client.exceptions import ApiException

from localplane import LocalPlane
from vnpu_operator.kubeapi import OperatorApi
from vnpu_operator.metrics import OperatorMetrics

pytestmark = pytest.mark.plane

METRIC = "vnpu_operator_api_errors_total"


async def test_refused_writes_are_counted_by_operation_and_status(
    plane: LocalPlane, namespace: str
) -> None:
    # The operator's identity: nobody else may create allocations.
    api_client = await config.new_client_from_config(config_file=str(plane.operator_kubeconfig))
    metrics = OperatorMetrics()
    api = OperatorApi(api_client, metrics.api_errors)

    def count(operation: str, status: str) -> float | None:
        labels = {"operation": operation, "status": status}
        return metrics.registry.get_sample_value(METRIC, labels)

    body = allocation("counted", node="api-node", vnpu_id=100)
    body["metadata"]["namespace"] = namespace
    # No finalizer: nothing here destroys a vNPU, and the namespace must go.
    body["metadata"]["finalizers"] = []
    try:
        assert await api.create_allocation(body) is True
        assert await api.create_allocation(body) is False
        await api.delete_allocation(f"{namespace}/absent")

        bad = allocation("bad", node="api-node", vnpu_id=5)
        bad["metadata"]["namespace"] = namespace
        with pytest.raises(ApiException) as invalid:
            await api.create_allocation(bad)
        assert invalid.value.status == 422
        with pytest.raises(ApiException) as missing:
            await api.patch_pod(namespace, "absent", [{"op": "remove", "path": "/metadata/x"}])
        assert missing.value.status == 404
        # Events are best effort: logged and counted, never raised.
        pod = {"metadata": {"name": "p", "namespace": f"{namespace}-absent", "uid": "u"}}
        await api.event(pod, reason="VNPUsReady", message="ready")

        assert count("create_allocation", "422") == 1
        assert count("patch_pod", "404") == 1
        assert count("create_event", "404") == 1
        assert count("create_allocation", "409") is None
        assert count("delete_allocation", "404") is None
    finally:
        await api.delete_allocation(f"{namespace}/counted")
        await api_client.close()

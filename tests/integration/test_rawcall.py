"""`rawcall` against the real API server: statuses and bodies come back as
the server sent them, and errors raise the same ApiException the client's
own path raises, so callers' `exc.status` checks keep working."""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from localplane import LocalPlane
from vnpu_common.kube.rawcall import call, call_json

pytestmark = pytest.mark.plane


async def test_success_error_and_json_bodies(plane: LocalPlane, namespace: str) -> None:
    api_client = await config.new_client_from_config(config_file=str(plane.kubeconfig))
    core = client.CoreV1Api(api_client)
    try:
        body = {"metadata": {"name": "raw"}, "data": {"k": "v"}}
        assert await call(core.create_namespaced_config_map, namespace, body) == 201

        with pytest.raises(ApiException) as conflict:
            await call(core.create_namespaced_config_map, namespace, body)
        assert conflict.value.status == 409
        assert json.loads(conflict.value.body)["reason"] == "AlreadyExists"

        ops = [{"op": "test", "path": "/data/k", "value": "other"}]
        with pytest.raises(ApiException) as failed_test:
            await call(
                core.patch_namespaced_config_map,
                "raw",
                namespace,
                ops,
                _content_type="application/json-patch+json",
            )
        assert failed_test.value.status == 422

        ops = [{"op": "replace", "path": "/data/k", "value": "w"}]
        await call(
            core.patch_namespaced_config_map,
            "raw",
            namespace,
            ops,
            _content_type="application/json-patch+json",
        )
        listed = await call_json(core.list_namespaced_config_map, namespace)
        by_name = {item["metadata"]["name"]: item for item in listed["items"]}
        assert by_name["raw"]["data"] == {"k": "w"}

        with pytest.raises(ApiException) as missing:
            await call(core.delete_namespaced_config_map, "absent", namespace)
        assert missing.value.status == 404
        # The connection went back to the pool after each error: more calls work.
        assert await call(core.delete_namespaced_config_map, "raw", namespace) == 200
    finally:
        await api_client.close()

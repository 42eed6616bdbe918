"""The agent's allocation watch against the real API server: a stale
resourceVersion gets a real 410 Gone, and the watcher re-lists."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import yaml
from agent_harness import allocation
from kubernetes_asyncio import client, config

from localplane import LocalPlane
from vnpu_agent.watcher import AllocationWatcher

pytestmark = pytest.mark.plane


async def _until(check: Any) -> None:
    async with asyncio.timeout(20):
        while not check():  # noqa: ASYNC110 - polls state another task owns
            await asyncio.sleep(0.1)


async def test_stale_resource_version_gets_410_and_a_relist(
    plane: LocalPlane, namespace: str
) -> None:
    plane.kubectl(
        "create", "-n", namespace, "-f", "-",
        input=yaml.safe_dump(allocation("before", node="watch-node", vnpu_id=100)),
        kubeconfig=plane.operator_kubeconfig,
    )  # fmt: skip
    api_client = await config.new_client_from_config(config_file=str(plane.kubeconfig))
    events: list[tuple[str, str]] = []

    async def handler(kind: str, obj: dict[str, Any]) -> None:
        events.append((kind, obj["metadata"]["name"]))

    watcher = AllocationWatcher(
        client.CustomObjectsApi(api_client), ["watch-node"], handler, timeout_seconds=10
    )
    # As after a long disconnect: resume from a version the server no longer has.
    watcher.resource_version = "1"
    task = asyncio.create_task(watcher.run())
    try:
        await _until(watcher.synced.is_set)
        assert watcher.relists == 1  # the 410 forced a full list
        assert ("SYNC", "before") in events
        assert f"{namespace}/before" in watcher.cache
        plane.kubectl(
            "create", "-n", namespace, "-f", "-",
            input=yaml.safe_dump(allocation("after", node="watch-node", vnpu_id=101)),
            kubeconfig=plane.operator_kubeconfig,
        )  # fmt: skip
        plane.kubectl(
            "create", "-n", namespace, "-f", "-",
            input=yaml.safe_dump(allocation("elsewhere", node="other-node", vnpu_id=102)),
            kubeconfig=plane.operator_kubeconfig,
        )  # fmt: skip
        await _until(lambda: ("ADDED", "after") in events)
        assert all(name != "elsewhere" for _, name in events)
        assert watcher.errors == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api_client.close()

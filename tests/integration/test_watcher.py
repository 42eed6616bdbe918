"""The watches against the real API server: the agent's allocation watch
(a stale resourceVersion gets a real 410 Gone, and the watcher re-lists) and
the informer both components build their watches on."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import pytest
import yaml
from agent_harness import allocation
from kubernetes_asyncio import client, config

from localplane import LocalPlane
from vnpu_agent.watcher import ListWatcher
from vnpu_common.kube.informer import Informer
from vnpu_common.wire import names

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

    watcher = ListWatcher(
        client.CustomObjectsApi(api_client),
        names.ALLOCATION_PLURAL,
        ["watch-node"],
        handler,
        timeout_seconds=10,
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


def _configmap(name: str, keep: str) -> str:
    meta = {"name": name, "labels": {"informer-test": keep}}
    return yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta})


async def test_the_informer_pages_keeps_only_what_it_is_told_and_reports_what_a_gap_deleted(
    plane: LocalPlane, namespace: str
) -> None:
    """The shared informer (both components' watches): a list in pages of two,
    objects `keep` refuses never reach the handler, one that stops being kept
    gets its last event, and an object deleted while the watch was down is
    reported DELETED by the re-list."""
    for i in range(5):
        plane.kubectl("create", "-n", namespace, "-f", "-",
                      input=_configmap(f"cm-{i}", "yes" if i % 2 == 0 else "no"))  # fmt: skip
    api_client = await config.new_client_from_config(config_file=str(plane.kubeconfig))
    core = client.CoreV1Api(api_client)
    events: list[tuple[str, str]] = []

    async def handler(kind: str, obj: dict[str, Any]) -> None:
        events.append((kind, obj["metadata"]["name"]))

    def keep(obj: dict[str, Any]) -> dict[str, Any] | None:
        labels = obj["metadata"].get("labels") or {}
        return {"metadata": obj["metadata"]} if labels.get("informer-test") == "yes" else None

    informer = Informer(
        "configmaps",
        partial(core.list_namespaced_config_map, namespace),
        handler,
        keep=keep,
        timeout_seconds=10,
        page_size=2,
    )
    task = asyncio.create_task(informer.run())
    try:
        await _until(informer.synced.is_set)
        assert sorted(events) == [("SYNC", "cm-0"), ("SYNC", "cm-2"), ("SYNC", "cm-4")]
        assert sorted(informer.cache) == [f"{namespace}/cm-{i}" for i in (0, 2, 4)]
        events.clear()
        plane.kubectl("label", "-n", namespace, "configmap", "cm-1", "informer-test=maybe",
                      "--overwrite")  # fmt: skip
        plane.kubectl("label", "-n", namespace, "configmap", "cm-2", "informer-test=no",
                      "--overwrite")  # fmt: skip
        plane.kubectl("label", "-n", namespace, "configmap", "cm-2", "informer-test=never",
                      "--overwrite")  # fmt: skip
        plane.kubectl("create", "-n", namespace, "-f", "-", input=_configmap("cm-5", "yes"))
        await _until(lambda: ("ADDED", "cm-5") in events)
        # cm-1 was never kept; cm-2 got the event that dropped it, then nothing.
        assert events == [("MODIFIED", "cm-2"), ("ADDED", "cm-5")], events
        assert f"{namespace}/cm-2" not in informer.cache
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    events.clear()
    plane.kubectl("delete", "-n", namespace, "configmap", "cm-0")
    informer.resource_version = None  # as after a broken watch (410: the test above)
    relists = informer.relists
    task = asyncio.create_task(informer.run())
    try:
        await _until(lambda: informer.relists > relists)
        assert ("DELETED", "cm-0") in events
        assert sorted(e for e in events if e[0] == "SYNC") == [("SYNC", "cm-4"), ("SYNC", "cm-5")]
        assert informer.errors == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api_client.close()

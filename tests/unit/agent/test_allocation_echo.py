"""The watch event that echoes the agent's own Ready write is not reconciled
again; any other change of the allocation is, and its vNPU is then released
as usual (vnpu_agent.serving.AllocationServer.on_event)."""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest

from vnpu_agent.node import NodeAgent
from vnpu_common.wire import names

KEY = "team-a/p1-0"


class ServerApi:
    """Holds the allocation as a server would: every write bumps its
    resourceVersion and answers with it."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.status_writes = 0
        self.finalizers_removed = 0

    def _bump(self) -> str:
        meta = self.obj["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return str(meta["resourceVersion"])

    async def patch_allocation_status(
        self, obj: dict[str, Any], status: dict[str, Any]
    ) -> str | None:
        self.status_writes += 1
        self.obj.setdefault("status", {}).update(copy.deepcopy(status))
        return self._bump()

    async def remove_finalizer(self, obj: dict[str, Any]) -> None:
        self.finalizers_removed += 1
        self.obj["metadata"]["finalizers"] = []
        self._bump()

    async def publish_node_status(self, node: str, status: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": node, "labels": {names.LABEL_NODE: node}}, "status": status}

    async def event(self, involved: dict[str, Any], **_: Any) -> None:
        return None


def allocation() -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.ALLOCATION_KIND,
        "metadata": {
            "name": "p1-0",
            "namespace": "team-a",
            "uid": "alloc-uid",
            "resourceVersion": "10",
            "generation": 1,
            "labels": {names.LABEL_NODE: "n1"},
            "finalizers": [names.ALLOCATION_FINALIZER],
        },
        "spec": {
            "podName": "p1",
            "podUID": "pod-uid",
            "nodeName": "n1",
            "chip": 0,
            "template": "vir05_1c_16g",
            "vnpuId": 100,
        },
    }


@pytest.fixture
async def agent(new_agent: Callable[..., Awaitable[NodeAgent]]) -> NodeAgent:
    agent = await new_agent(ServerApi(allocation()), chips="910B3=1", interval=3600)
    agent.serving.start()  # no allocation yet: only marks it started
    return agent


async def test_the_echo_of_the_ready_write_is_not_reconciled(agent: NodeAgent) -> None:
    server = cast(ServerApi, agent.api)
    await agent.on_event("ADDED", copy.deepcopy(server.obj))
    await agent.serving.queue.idle()
    assert server.status_writes == 1
    assert server.obj["status"]["phase"] == names.PHASE_READY
    assert [v.id for v in agent.view.driver.list_vnpus(0)] == [100]

    await agent.on_event("MODIFIED", copy.deepcopy(server.obj))  # the echo
    assert not agent.serving.queue.busy(KEY)
    assert agent.allocs[KEY]["status"]["phase"] == names.PHASE_READY


async def test_a_change_after_the_write_is_reconciled(agent: NodeAgent) -> None:
    server = cast(ServerApi, agent.api)
    await agent.on_event("ADDED", copy.deepcopy(server.obj))
    await agent.serving.queue.idle()

    # Not the echo: the object was deleted right after our write, so the
    # first event the agent sees carries a newer version than it wrote.
    server.obj["metadata"]["deletionTimestamp"] = "2026-11-23T00:00:00Z"
    server._bump()
    await agent.on_event("MODIFIED", copy.deepcopy(server.obj))
    assert agent.serving.queue.busy(KEY)
    await agent.serving.queue.idle()
    assert server.finalizers_removed == 1
    assert agent.view.driver.list_vnpus(0) == []


async def test_a_hand_edited_status_after_the_echo_is_put_back(agent: NodeAgent) -> None:
    server = cast(ServerApi, agent.api)
    await agent.on_event("ADDED", copy.deepcopy(server.obj))
    await agent.serving.queue.idle()
    await agent.on_event("MODIFIED", copy.deepcopy(server.obj))  # the echo

    # An edit of the status by someone else is a new version: reconciled,
    # and the agent writes Ready back.
    server.obj["status"]["devicePath"] = "/dev/vdavinci999"
    server._bump()
    await agent.on_event("MODIFIED", copy.deepcopy(server.obj))
    await agent.serving.queue.idle()
    assert server.status_writes == 2
    assert server.obj["status"]["devicePath"] == names.device_path(100)

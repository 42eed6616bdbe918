"""On one node the agent's allocations share the driver one at a time, but
not their API writes: a pod's second vNPU is made while the first one's
Ready write is still on its way, and a create does not wait for a release's
finalizer removal. The decisions stay one allocation at a time: two
allocations naming one vNPU id never both get it
(vnpu_agent.serving.AllocationServer.reconcile)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from typing import Any

from agent_helpers import AllocationApi, allocation

from vnpu_agent.node import NodeAgent
from vnpu_common.wire import names

NewAgent = Callable[..., Awaitable[NodeAgent]]


class SlowApi(AllocationApi):
    """An API server whose allocation writes wait until `go` is set, as
    they do behind a loaded server; records what it was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.started: list[str] = []

    async def patch_allocation_status(
        self, obj: dict[str, Any], status: dict[str, Any]
    ) -> str | None:
        self.started.append(f"status {obj['metadata']['name']}")
        await self.go.wait()
        return await super().patch_allocation_status(obj, status)

    async def remove_finalizer(self, obj: dict[str, Any]) -> None:
        self.started.append(f"finalizer {obj['metadata']['name']}")
        await self.go.wait()
        await super().remove_finalizer(obj)


async def until(cond: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def ids(agent: NodeAgent) -> list[int]:
    return sorted(v.id for v in agent.view.driver.list_vnpus(0))


async def test_a_pods_second_vnpu_is_made_while_the_first_ones_write_is_pending(
    new_agent: NewAgent,
) -> None:
    api = SlowApi()
    agent = await new_agent(api, chips="910B3=1", interval=3600)
    agent.serving.start()
    for i in range(2):
        await agent.on_event("ADDED", allocation(f"p1-{i}", 100 + i))
    # Both vNPUs exist and both Ready writes are out, though neither answered.
    await until(lambda: ids(agent) == [100, 101], "both vNPUs created")
    await until(lambda: len(api.started) == 2, "both Ready writes sent")
    assert sorted(api.started) == ["status p1-0", "status p1-1"]
    assert api.status == {}
    api.go.set()
    await until(lambda: len(api.status) == 2, "both Ready writes answered")
    assert {s["phase"] for s in api.status.values()} == {names.PHASE_READY}
    agent.serving.queue.close()


async def test_a_create_does_not_wait_for_a_release_finalizer_removal(
    new_agent: NewAgent,
) -> None:
    api = SlowApi()
    api.go.set()
    agent = await new_agent(api, chips="910B3=1", interval=3600)
    agent.serving.start()
    old = allocation("old", 100)
    await agent.on_event("ADDED", old)
    await until(lambda: "old" in api.status, "the old allocation Ready")
    api.go.clear()
    gone = copy.deepcopy(old)
    gone["metadata"]["deletionTimestamp"] = "2026-11-28T00:00:00Z"
    gone["metadata"]["resourceVersion"] = "2"
    await agent.on_event("MODIFIED", gone)
    await until(lambda: "finalizer old" in api.started, "the finalizer removal sent")
    # The release's vNPU is gone before its finalizer's removal answered, and
    # a new allocation's vNPU is made meanwhile.
    assert ids(agent) == []
    await agent.on_event("ADDED", allocation("new", 101))
    await until(lambda: ids(agent) == [101], "the new vNPU created")
    assert api.finalizers_removed == []
    api.go.set()
    await until(lambda: api.finalizers_removed == ["old"], "the finalizer removed")
    await until(lambda: "new" in api.status, "the new allocation Ready")
    agent.serving.queue.close()


async def test_two_allocations_naming_one_vnpu_never_both_get_it(new_agent: NewAgent) -> None:
    # Their trips run at once; their decisions do not. The first makes vNPU
    # 100, the second finds it held by the first and is refused (retried,
    # then Failed), never handed the first one's vNPU.
    api = SlowApi()
    api.go.set()
    agent = await new_agent(api, chips="910B3=1", interval=3600)
    agent.serving.start()
    for name in ("first", "second"):
        await agent.on_event("ADDED", allocation(name, 100))
    await until(lambda: "first" in api.status, "the first allocation's write")
    await until(lambda: agent.serving.queue.failures("team-a/second") >= 1, "second refused")
    assert api.status["first"]["phase"] == names.PHASE_READY
    assert api.status.get("second", {}).get("phase") != names.PHASE_READY
    assert ids(agent) == [100]
    agent.serving.queue.close()

"""A new allocation is never handed a vNPU that is open, that another
allocation still names (live, or being deleted with its destroy deferred), or
that an allocation left behind when it went without its destroy
(vnpu_agent.serving.AllocationServer._held_elsewhere): the agent retries, then fails the
allocation with VNPUHeld so that the operator places the pod anew. Adopting a
vNPU nothing holds (the agent crashed after creating it for this very
allocation) still works."""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from agent_helpers import allocation

from vnpu_agent.drivers.sim import SimDriver
from vnpu_agent.node import MAX_CREATE_ATTEMPTS, NodeAgent
from vnpu_common.kube.workqueue import RetryLater
from vnpu_common.wire import names


class Api:
    def __init__(self) -> None:
        self.status: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[str, str]] = []
        self.finalizers_removed: list[str] = []

    async def patch_allocation_status(
        self, obj: dict[str, Any], status: dict[str, Any]
    ) -> str | None:
        self.status[obj["metadata"]["name"]] = copy.deepcopy(status)
        return "200"

    async def remove_finalizer(self, obj: dict[str, Any]) -> None:
        self.finalizers_removed.append(obj["metadata"]["name"])

    async def publish_node_status(self, node: str, status: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": node, "labels": {names.LABEL_NODE: node}}, "status": status}

    async def event(self, involved: dict[str, Any], *, reason: str, **_: Any) -> None:
        self.events.append((involved["metadata"]["name"], reason))


NewAgent = Callable[..., Awaitable[NodeAgent]]


async def _served(new_agent: NewAgent, name: str = "a", vnpu_id: int = 100) -> NodeAgent:
    agent = await new_agent(Api(), interval=3600)
    agent.allocs[f"team-a/{name}"] = allocation(name, vnpu_id)
    await agent.serving.reconcile(f"team-a/{name}")
    api = agent.api
    assert isinstance(api, Api)
    assert api.status[name]["phase"] == names.PHASE_READY
    return agent


async def _refused_then_failed(agent: NodeAgent, key: str, why: str) -> dict[str, Any]:
    """Reconciles `key` as the queue would: RetryLater until the last attempt,
    then Failed with VNPUHeld. Returns the Failed status."""
    api = agent.api
    assert isinstance(api, Api)
    name = key.split("/")[1]
    for _ in range(MAX_CREATE_ATTEMPTS - 1):
        with pytest.raises(RetryLater, match=why):
            await agent.serving.reconcile(key)
        assert name not in api.status  # nothing written while it retries
        agent.serving.queue._failures[key] = agent.serving.queue.failures(key) + 1
    await agent.serving.reconcile(key)
    status = api.status[name]
    assert status["phase"] == names.PHASE_FAILED
    assert why in status["message"]
    (ready,) = [c for c in status["conditions"] if c["type"] == names.COND_READY]
    assert ready["reason"] == names.REASON_VNPU_HELD
    assert (name, names.REASON_VNPU_HELD) in api.events
    return status


async def test_an_open_vnpu_left_by_a_vanished_allocation_is_not_adopted(
    new_agent: NewAgent,
) -> None:
    agent = await _served(new_agent)
    driver = agent.view.driver
    assert isinstance(driver, SimDriver)
    driver.open_vnpu(100)
    # Its finalizer removed by someone else while the destroy was deferred: the
    # object goes, the vNPU stays (and stays open).
    gone = agent.allocs["team-a/a"]
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    await agent.on_event("DELETED", gone)
    agent.allocs["team-a/b"] = allocation("b", 100)
    await agent.view.refresh()
    await _refused_then_failed(agent, "team-a/b", "open in a container")
    assert [v.id for v in driver.list_vnpus(0)] == [100]  # untouched, still open


async def test_a_closed_vnpu_left_by_a_vanished_allocation_is_not_adopted(
    new_agent: NewAgent,
) -> None:
    agent = await _served(new_agent)
    await agent.on_event("DELETED", agent.allocs["team-a/a"])
    agent.allocs["team-a/b"] = allocation("b", 100)
    await _refused_then_failed(agent, "team-a/b", "left behind by an allocation")


async def test_a_vnpu_whose_destroy_is_deferred_is_waited_for_then_created_afresh(
    new_agent: NewAgent,
) -> None:
    agent = await _served(new_agent)
    api = agent.api
    assert isinstance(api, Api)
    driver = agent.view.driver
    assert isinstance(driver, SimDriver)
    driver.open_vnpu(100)
    agent.allocs["team-a/a"]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    with pytest.raises(RetryLater, match="deferred"):
        await agent.serving.reconcile("team-a/a")
    agent.allocs["team-a/b"] = allocation("b", 100)
    await agent.view.refresh()
    with pytest.raises(RetryLater, match="held by allocation team-a/a"):
        await agent.serving.reconcile("team-a/b")
    assert "b" not in api.status

    # The container lets go: the deferred destroy finishes (the new allocation,
    # never served, does not hold the vNPU), and it gets a vNPU of its own.
    driver.release_vnpu(100)
    await agent.serving.reconcile("team-a/a")
    assert api.finalizers_removed == ["a"]
    assert driver.list_vnpus(0) == []
    await agent.on_event("DELETED", agent.allocs["team-a/a"])
    await agent.serving.reconcile("team-a/b")
    (ready,) = [c for c in api.status["b"]["conditions"] if c["type"] == names.COND_READY]
    assert ready["reason"] == names.REASON_CREATED


async def test_a_vnpu_another_live_allocation_names_is_not_shared(new_agent: NewAgent) -> None:
    agent = await _served(new_agent)
    agent.allocs["team-a/b"] = allocation("b", 100)
    await _refused_then_failed(agent, "team-a/b", "held by allocation team-a/a")


async def test_a_vnpu_made_for_this_allocation_before_a_crash_is_adopted(
    new_agent: NewAgent,
) -> None:
    agent = await new_agent(Api(), interval=3600)
    driver = agent.view.driver
    assert isinstance(driver, SimDriver)
    driver.create_vnpu(0, "vir05_1c_16g", 100)  # created, then the agent died
    await agent.view.refresh()
    agent.allocs["team-a/a"] = allocation("a", 100)
    await agent.serving.reconcile("team-a/a")
    api = agent.api
    assert isinstance(api, Api)
    assert api.status["a"]["phase"] == names.PHASE_READY
    (ready,) = [c for c in api.status["a"]["conditions"] if c["type"] == names.COND_READY]
    assert ready["reason"] == names.REASON_ADOPTED


async def test_a_served_allocation_whose_vnpu_is_open_stays_ready(new_agent: NewAgent) -> None:
    # Its own pod has it open: a resync of the Ready allocation is no adoption.
    agent = await _served(new_agent)
    api = agent.api
    assert isinstance(api, Api)
    driver = agent.view.driver
    assert isinstance(driver, SimDriver)
    driver.open_vnpu(100)
    agent.allocs["team-a/a"] = {**agent.allocs["team-a/a"], "status": api.status["a"]}
    await agent.view.refresh()
    await agent.serving.reconcile("team-a/a")
    assert api.status["a"]["phase"] == names.PHASE_READY

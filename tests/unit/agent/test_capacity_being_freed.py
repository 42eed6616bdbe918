"""A create refused for capacity that one of the agent's own vNPUs is about to
free is retried, not failed: after a gap in the watch the agent can hear of a
new allocation before it has released the one whose room it takes
(vnpu_agent.serving.AllocationServer._after_failed_create). Its notion of a live vNPU is
the release's, which leaves a vNPU a live allocation names."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from agent_helpers import AllocationApi, allocation

from vnpu_agent.node import NodeAgent
from vnpu_common.kube.workqueue import RetryLater
from vnpu_common.wire import names


@pytest.fixture
async def full_chip(new_agent: Callable[..., Awaitable[NodeAgent]]) -> NodeAgent:
    """An agent whose one chip holds four Ready vNPUs, 100 to 103."""
    agent = await new_agent(AllocationApi(), chips="910B3=1", interval=3600)
    for i in range(4):
        obj = allocation(f"a{i}", 100 + i)
        agent.allocs[f"team-a/a{i}"] = obj
        await agent.serving.reconcile(f"team-a/a{i}")
    assert sorted(v.id for v in agent.view.driver.list_vnpus(0)) == [100, 101, 102, 103]
    return agent


async def test_capacity_held_by_an_allocation_being_deleted_is_waited_for(
    full_chip: NodeAgent,
) -> None:
    agent, api = full_chip, full_chip.api
    assert isinstance(api, AllocationApi)
    agent.allocs["team-a/a0"]["metadata"]["deletionTimestamp"] = "2026-11-24T00:00:00Z"
    agent.allocs["team-a/new"] = allocation("new", 104)

    with pytest.raises(RetryLater, match="being released"):
        await agent.serving.reconcile("team-a/new")
    assert "new" not in api.status  # not Failed: the pod keeps its place

    await agent.serving.reconcile("team-a/a0")  # the release the watch gap delayed
    assert api.finalizers_removed == ["a0"]
    await agent.serving.reconcile("team-a/new")
    assert api.status["new"]["phase"] == names.PHASE_READY
    assert sorted(v.id for v in agent.view.driver.list_vnpus(0)) == [101, 102, 103, 104]


async def test_an_orphan_of_ours_counts_as_being_freed(full_chip: NodeAgent) -> None:
    # a0's object went without its release (finalizer removed by hand): its
    # vNPU is the garbage collector's, so its room comes back too.
    del full_chip.allocs["team-a/a0"]
    full_chip.allocs["team-a/new"] = allocation("new", 104)
    with pytest.raises(RetryLater):
        await full_chip.serving.reconcile("team-a/new")


async def test_a_chip_full_of_live_vnpus_fails_the_allocation(full_chip: NodeAgent) -> None:
    api = full_chip.api
    assert isinstance(api, AllocationApi)
    full_chip.allocs["team-a/new"] = allocation("new", 104)
    await full_chip.serving.reconcile("team-a/new")  # no RetryLater: nothing will free room
    assert api.status["new"]["phase"] == names.PHASE_FAILED
    assert "not enough AICore" in api.status["new"]["message"]


async def test_a_vnpu_a_live_allocation_also_names_is_not_destroyed(
    full_chip: NodeAgent,
) -> None:
    # The live-allocation check that _being_freed shares with the release: a
    # deleted allocation whose vNPU id a live one names as well releases only
    # its finalizer (one not served yet does not hold it: test_adoption_refused).
    api = full_chip.api
    assert isinstance(api, AllocationApi)
    twin = {**allocation("twin", 100), "status": {"phase": names.PHASE_READY}}
    full_chip.allocs["team-a/twin"] = twin
    full_chip.allocs["team-a/a0"]["metadata"]["deletionTimestamp"] = "2026-11-24T00:00:00Z"
    await full_chip.serving.reconcile("team-a/a0")
    assert api.finalizers_removed == ["a0"]
    assert 100 in {v.id for v in full_chip.view.driver.list_vnpus(0)}
    assert not full_chip.serving._being_freed(0)  # vNPU 100 is twin's now

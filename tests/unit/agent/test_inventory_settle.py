"""A busy node's VNPUNode is written once per settle interval while what
changed is only what the allocations already say (vNPUs they own added,
vNPUs of deleted allocations destroyed, the free figures those move); anything
else (a vNPU gone under a standing allocation, one nobody owns, health), or a
node that wrote nothing for that long, is written at the minimum interval as
before (publisher.NodePublisher._only_restated, inventory.only_restates)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import pytest
from agent_helpers import RecordingApi, allocation

from vnpu_agent.drivers.base import VNPU, ChipInfo
from vnpu_agent.drivers.sim import SimDriver
from vnpu_agent.inventory import build_status, news, only_restates
from vnpu_agent.node import NodeAgent
from vnpu_common.wire import names
from vnpu_common.wire.models import Condition

SETTLE = 30.0


class Api(RecordingApi):
    """Records VNPUNode writes; answers allocation writes as a server would."""

    def __init__(self) -> None:
        super().__init__()
        self.version = 10

    async def patch_allocation_status(
        self, obj: dict[str, Any], status: dict[str, Any]
    ) -> str | None:
        self.version += 1
        return str(self.version)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def sim(tmp_path: Path) -> SimDriver:
    return SimDriver(tmp_path / "sim.json", "910B3=1")


@pytest.fixture
async def agent(new_agent: Callable[..., Awaitable[NodeAgent]], sim: SimDriver) -> NodeAgent:
    agent = await new_agent(Api(), driver=sim, interval=0, settle=SETTLE)
    agent.clock = Clock()
    agent.serving.start()  # no allocation yet: only marks it started
    await agent.publisher.publish()
    assert cast(Api, agent.api).writes == 1
    return agent


def listed(api: Api) -> list[tuple[int, str | None]]:
    return [(v["id"], v.get("allocation")) for v in api.status["chips"][0]["vnpus"]]


async def until(cond: Callable[[], bool]) -> None:
    # The publish runs in a task after a timer, its driver calls in threads.
    async with asyncio.timeout(5):
        while not cond():  # noqa: ASYNC110 - polls what the publish task writes
            await asyncio.sleep(0.01)


def put_off(agent: NodeAgent) -> bool:
    """A write is scheduled, and not before 10 s from now."""
    pending = agent.publisher._pending
    return pending is not None and pending.when() - asyncio.get_running_loop().time() > 10


@pytest.mark.parametrize("since_last_write", [2.0, SETTLE + 1], ids=["busy", "quiet"])
async def test_a_nodes_own_vnpus_are_written_once_the_settle_interval_passed(
    agent: NodeAgent, since_last_write: float
) -> None:
    """Counted from the first change not written, on a quiet node too: a
    burst of placements writes each node once, after it (a quiet node wrote
    its first vNPU at once and the rest 30 s later; placement reads the
    allocations, not this)."""
    api, clock = cast(Api, agent.api), cast(Clock, agent.clock)
    clock.now += since_last_write
    await agent.on_event("ADDED", allocation("p1-0", 100))
    await agent.serving.queue.idle()
    await until(lambda: put_off(agent))
    assert [v.id for v in agent.view.driver.list_vnpus(0)] == [100]
    assert api.writes == 1
    pending = agent.publisher._pending
    assert pending is not None
    assert pending.when() - asyncio.get_running_loop().time() == pytest.approx(SETTLE, abs=1)

    await agent.on_event("ADDED", allocation("p2-0", 101))
    await agent.serving.queue.idle()
    await asyncio.sleep(0.2)
    assert agent.publisher._pending is pending
    assert api.writes == 1

    await write_put_off(agent, clock)
    # One write tells both.
    assert api.writes == 2
    assert listed(api) == [(100, "team-a/p1-0"), (101, "team-a/p2-0")]


async def write_put_off(agent: NodeAgent, clock: Clock) -> None:
    """The pending settled write made now, as if its time had come."""
    pending = agent.publisher._pending
    assert pending is not None
    pending.cancel()
    agent.publisher._pending = None
    clock.now += SETTLE
    await agent.publisher.publish()


async def one_vnpu_written(agent: NodeAgent) -> tuple[Api, Clock, dict[str, Any]]:
    """A quiet node's first allocation, its vNPU made and written once the
    settle interval passed; returns the API, the clock and (a copy of) the
    allocation."""
    api, clock = cast(Api, agent.api), cast(Clock, agent.clock)
    clock.now += SETTLE + 1
    obj = allocation("p1-0", 100)
    await agent.on_event("ADDED", copy.deepcopy(obj))
    await agent.serving.queue.idle()
    await until(lambda: put_off(agent))
    assert api.writes == 1
    await write_put_off(agent, clock)
    assert api.writes == 2
    return api, clock, obj


async def test_a_vnpu_destroyed_for_its_deleted_allocation_waits_for_the_settle_interval(
    agent: NodeAgent,
) -> None:
    """The destroy restates the deletion: the operator frees the capacity on it, and a
    reader of the VNPUNode alone (kubectl vnpu status, a restarted operator) takes a
    listed vNPU whose allocation is gone as destroyed (Ledger.seed_released)."""
    api, clock, obj = await one_vnpu_written(agent)

    clock.now += 1
    obj["metadata"]["deletionTimestamp"] = "2026-11-24T00:00:00Z"
    obj["metadata"]["resourceVersion"] = "20"
    await agent.on_event("MODIFIED", obj)
    await agent.serving.queue.idle()
    assert agent.view.driver.list_vnpus(0) == []
    await until(lambda: put_off(agent))
    assert api.writes == 2
    assert listed(api) == [(100, "team-a/p1-0")]

    pending = agent.publisher._pending
    assert pending is not None
    pending.cancel()
    agent.publisher._pending = None
    clock.now += SETTLE
    await agent.publisher.publish()
    assert api.writes == 3
    assert listed(api) == []


async def test_a_quiet_nodes_release_waits_too_and_the_next_vnpu_rides_along(
    agent: NodeAgent,
) -> None:
    """A node quiet for longer than the settle interval does not write a release at
    once: the vNPU placed on the freed room next goes out in the same write, the
    settle interval after the release."""
    api, clock, obj = await one_vnpu_written(agent)

    clock.now += SETTLE + 5
    obj["metadata"]["deletionTimestamp"] = "2026-11-24T00:00:00Z"
    obj["metadata"]["resourceVersion"] = "20"
    await agent.on_event("MODIFIED", obj)
    await agent.serving.queue.idle()
    await until(lambda: put_off(agent))
    assert api.writes == 2
    pending = agent.publisher._pending
    assert pending is not None
    assert pending.when() - asyncio.get_running_loop().time() == pytest.approx(SETTLE, abs=1)
    await agent.on_event("DELETED", obj)

    clock.now += 2
    await agent.on_event("ADDED", allocation("p2-0", 101))
    await agent.serving.queue.idle()
    await asyncio.sleep(0.2)
    assert [v.id for v in agent.view.driver.list_vnpus(0)] == [101]
    assert api.writes == 2
    pending = agent.publisher._pending
    assert pending is not None
    # Still due the settle interval after the release, not pushed on by the create.
    assert pending.when() - asyncio.get_running_loop().time() == pytest.approx(SETTLE - 2, abs=1)

    pending.cancel()
    agent.publisher._pending = None
    clock.now += SETTLE
    await agent.publisher.publish()
    assert api.writes == 3
    assert listed(api) == [(101, "team-a/p2-0")]


async def test_news_moves_a_put_off_write_earlier(agent: NodeAgent, sim: SimDriver) -> None:
    """A settled write pending (put off to the settle interval's end) does not
    hold back the write news wants at the minimum interval (a vNPU nobody owns)."""
    api, clock, _ = await one_vnpu_written(agent)

    clock.now += 1
    await agent.on_event("ADDED", allocation("p2-0", 101))
    await agent.serving.queue.idle()
    await until(lambda: put_off(agent))
    assert api.writes == 2

    sim.create_vnpu(0, "vir05_1c_16g", 107)
    await agent.resync()
    # Written within the minimum interval (0 here), not at the settled
    # write's time: the one write tells both.
    await until(lambda: api.writes == 3)
    assert listed(api) == [(100, "team-a/p1-0"), (101, "team-a/p2-0"), (107, None)]
    assert agent.publisher._pending is None


async def test_a_vnpu_no_allocation_owns_is_written_without_waiting(
    agent: NodeAgent, sim: SimDriver
) -> None:
    api, clock = cast(Api, agent.api), cast(Clock, agent.clock)
    clock.now += 1
    foreign = sim.create_vnpu(0, "vir05_1c_16g", 107)
    await agent.resync()
    await until(lambda: api.writes == 2)
    assert agent.vnpus[107] == foreign
    assert listed(api) == [(107, None)]


def _chip(healthy: bool = True, aicore_free: int = 20) -> ChipInfo:
    return ChipInfo(
        index=0, physical_id=0, card_id=0, device_id=0, model="910B3", healthy=healthy,
        aicore_total=20, aicore_free=aicore_free, memory_total_mb=65536, memory_free_mb=65536,
        aicpu_total=7, aicpu_free=7, media_total=0, media_free=0,
        vnpu_id_min=100, vnpu_id_max=115,
    )  # fmt: skip


def _status(
    *,
    chip: ChipInfo | None = None,
    vnpus: dict[int, VNPU] | None = None,
    owned: tuple[int, ...] = (),
    conditions: list[Condition] | None = None,
) -> dict[str, Any]:
    allocs = [
        {"metadata": {"namespace": "ns", "name": f"a{i}"}, "spec": {"vnpuId": i, "podUID": "u"}}
        for i in owned
    ]
    return build_status(
        driver="sim", chips=[chip or _chip()], templates={}, vnpus=vnpus or {},
        allocations=allocs, conditions=conditions or [],
    )  # fmt: skip


def test_news_leaves_out_what_the_allocations_say_and_keeps_the_rest() -> None:
    empty = _status()
    ours = {100: VNPU(100, 0, "vir05_1c_16g", False)}
    # Our vNPU created (and the free figures it moves), or later in use: no news.
    with_ours = _status(chip=_chip(aicore_free=15), vnpus=ours, owned=(100,))
    assert with_ours != empty
    assert news(with_ours) == news(empty)
    in_use = _status(
        chip=_chip(aicore_free=15), vnpus={100: VNPU(100, 0, "vir05_1c_16g", True)}, owned=(100,)
    )
    assert news(in_use) == news(empty)
    # The same vNPU with no allocation owning it is news: placement counts it.
    assert news(_status(chip=_chip(aicore_free=15), vnpus=ours)) != news(empty)
    # So are health and conditions.
    assert news(_status(chip=_chip(healthy=False))) != news(empty)
    cond = Condition(
        type=names.COND_CHIPS_HEALTHY, status="False", reason="ChipUnhealthy", message="chip 0",
        lastTransitionTime="2026-11-24T00:00:00Z",
    )  # fmt: skip
    assert news(_status(conditions=[cond])) != news(empty)


def test_only_additions_of_owned_vnpus_restate_the_allocations() -> None:
    empty = _status()
    one = _status(chip=_chip(aicore_free=15), vnpus={100: VNPU(100, 0, "vir05_1c_16g", False)},
                  owned=(100,))  # fmt: skip
    assert only_restates(empty, one)
    assert only_restates(one, one)
    # Gone from the list while its allocation stands (lost, not released): news.
    assert not only_restates(one, empty, live=["ns/a100"])
    # Gone with its allocation deleted or being deleted: the deletion restated.
    assert only_restates(one, empty, live=[])
    assert only_restates(one, empty, live=["ns/a101"])
    unowned = _status(chip=_chip(aicore_free=15), vnpus={100: VNPU(100, 0, "vir05_1c_16g", False)})
    assert not only_restates(empty, unowned)
    # A vNPU nobody owned, gone: news (placement counted it as an orphan).
    assert not only_restates(unowned, empty, live=[])


class SlowApi(Api):
    """VNPUNode writes wait for `gate` once `blocking`; records the order in
    which writes land and finalizers go."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.blocking = False
        self.order: list[Any] = []

    async def publish_node_status(self, node: str, status: dict[str, Any]) -> dict[str, Any]:
        if self.blocking:
            self.order.append("write started")
            await self.gate.wait()
        answer = await super().publish_node_status(node, status)
        self.order.append(("write landed", [v["id"] for v in status["chips"][0]["vnpus"]]))
        return answer

    async def remove_finalizer(self, obj: dict[str, Any]) -> None:
        self.order.append("finalizer removed")


async def test_the_finalizer_does_not_wait_for_a_write_that_began_before_the_destroy(
    new_agent: Callable[..., Awaitable[NodeAgent]], sim: SimDriver
) -> None:
    """The write in flight lists vNPU 100 under its allocation and lands after
    the finalizer went; the operator reads it as destroyed all the same
    (test_placement_ledger: a stale listing under the gone allocation's name)."""
    api = SlowApi()
    agent = await new_agent(api, driver=sim, interval=0, settle=0)
    agent.serving.start()  # no allocation yet: only marks it started
    obj = allocation("p1-0", 100)
    await agent.on_event("ADDED", copy.deepcopy(obj))
    await agent.serving.queue.idle()
    await until(lambda: api.writes == 1)

    # A write begins while the vNPU exists, and is slow to land.
    api.blocking = True
    api.order.clear()
    agent.publisher._force = True
    write = asyncio.create_task(agent.publisher.publish())
    await until(lambda: api.order == ["write started"])
    obj["metadata"]["deletionTimestamp"] = "2026-11-24T00:00:00Z"
    obj["metadata"]["resourceVersion"] = "20"
    await agent.on_event("MODIFIED", obj)
    await until(lambda: "finalizer removed" in api.order)
    assert agent.view.driver.list_vnpus(0) == []
    assert api.order == ["write started", "finalizer removed"]

    api.gate.set()
    await write
    await agent.serving.queue.idle()
    assert api.order[:3] == ["write started", "finalizer removed", ("write landed", [100])]
    pending = agent.publisher._pending
    if pending is not None:
        pending.cancel()

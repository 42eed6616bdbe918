"""What the DRA alerts read from the agent (issue 56, item 3): every failed
Prepare or Unprepare counted in vnpu_agent_dra_prepare_errors_total, the
lock-timeout of an Unprepare too (it returned before it was counted), the
error series there at 0 once the plugin serves (a series born at 1 shows no
increase to rate()), and vnpu_agent_dra_pool_published following the pool:
0 before it is written and after a failed write or a wipe, 1 once written or
adopted as it stands. Against the fakes of test_dra_plugin and test_dra_pool."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

from prometheus_client import CollectorRegistry
from test_dra_plugin import NODE, Reader
from test_dra_pool import FakeSlices, dra_agent, pool_of

from vnpu_agent.dra.checkpoint import ClaimId
from vnpu_agent.dra.prepare import Preparer
from vnpu_agent.metrics import AgentMetrics
from vnpu_agent.node import NodeAgent


def errors(registry: CollectorRegistry) -> dict[str, float]:
    return {
        s.labels["op"]: s.value
        for f in registry.collect()
        if f.name == "vnpu_agent_dra_prepare_errors"
        for s in f.samples
        if s.name.endswith("_total")
    }


async def watched(tmp_path: Path, fake: FakeSlices) -> NodeAgent:
    """A DRA agent whose metrics collect its state, as main.Agent wires it."""
    agent = await dra_agent(tmp_path, fake)
    agent.metrics.watch(lambda: [agent])
    return agent


def published(agent: NodeAgent) -> list[tuple[str, float]]:
    return [
        (s.labels["node"], s.value)
        for f in agent.metrics.registry.collect()
        if f.name == "vnpu_agent_dra_pool_published"
        for s in f.samples
    ]


async def test_failed_calls_are_counted_the_unprepare_timeout_too(tmp_path: Path) -> None:
    metrics = AgentMetrics(CollectorRegistry())
    metrics.dra_serving()
    assert errors(metrics.registry) == {"prepare": 0.0, "unprepare": 0.0}
    preparer = Preparer(
        NODE, Reader(), tmp_path / "checkpoint.json", tmp_path / "cdi", Path("/dev"),
        budget=0.1, observe=metrics.dra_call,
    )  # fmt: skip
    claims = [ClaimId("ml", "uid-1", "c1"), ClaimId("ml", "uid-2", "c2")]
    # Another call holds the plugin past the kubelet's budget.
    await preparer.lock.acquire()
    try:
        prepared = await preparer.prepare(claims)
        unprepared = await preparer.unprepare(claims)
    finally:
        preparer.lock.release()
    assert all(r.error for r in prepared.values())
    assert all(unprepared.values())
    assert errors(metrics.registry) == {"prepare": 2.0, "unprepare": 2.0}
    # A claim the reader does not know fails on its own, with the lock free.
    await preparer.prepare([ClaimId("ml", "uid-3", "gone")])
    assert errors(metrics.registry)["prepare"] == 3.0


async def test_the_pool_published_gauge_follows_the_pool(tmp_path: Path) -> None:
    fake = FakeSlices()
    agent = await watched(tmp_path, fake)
    pool = pool_of(agent)
    assert published(agent) == [("n1", 0.0)]  # chips not told yet

    fake.fail = 1
    task = asyncio.create_task(pool.run())
    try:
        await agent.publisher.publish()
        for _ in range(200):
            if pool.published:
                break
            await asyncio.sleep(0.02)
        assert published(agent) == [("n1", 1.0)]
        assert fake.writes, "published without a write"

        # The kubelet wipes the slices: 0 until the watch's repair is written.
        for obj in fake.objects.values():
            await pool.on_slice_event("ADDED", copy.deepcopy(obj))
        fake.fail = 10**6  # the API server refuses the repair
        for name in list(fake.objects):
            await pool.on_slice_event("DELETED", fake.objects.pop(name))
        for _ in range(200):
            if not pool.published:
                break
            await asyncio.sleep(0.02)
        assert published(agent) == [("n1", 0.0)]
        fake.fail = 0
        for _ in range(200):
            if pool.published:
                break
            await asyncio.sleep(0.02)
        assert published(agent) == [("n1", 1.0)]
        assert len(fake.objects) == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_pool_adopted_as_it_stands_is_published_and_no_dra_no_series(
    tmp_path: Path,
) -> None:
    fake = FakeSlices()
    first = await dra_agent(tmp_path, fake)
    await first.publisher.publish()
    await pool_of(first).sync()
    writes = len(fake.writes)
    # An agent restart: the pool is in the API already.
    (tmp_path / "again").mkdir()
    again = await watched(tmp_path / "again", fake)
    again.publisher.feed_pool()
    await again.publisher.publish()
    await pool_of(again).sync()
    assert len(fake.writes) == writes
    assert published(again) == [("n1", 1.0)]

    again.pool = None  # an agent without --dra
    assert published(again) == []

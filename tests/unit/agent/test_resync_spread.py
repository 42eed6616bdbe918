"""The nodes of one agent process resync spread over the period, node i of
N at i/N of it, on a fixed schedule (node.NodeAgent._resync_loop): on one
beat, 200 nodes' driver reads and statuses came in one go every period and
the allocations served meanwhile waited behind them (issue 38)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from agent_helpers import RecordingApi

from vnpu_agent.node import NodeAgent

PERIOD = 0.4


async def _times(agent: NodeAgent, count: int, work: Callable[[int], float]) -> list[float]:
    """Loop times of the first `count` resyncs, from the loop's start; the
    n-th resync takes `work(n)` seconds."""
    loop = asyncio.get_running_loop()
    seen: list[float] = []
    done = asyncio.Event()

    async def resync() -> None:
        seen.append(loop.time())
        if len(seen) == count:
            done.set()
        await asyncio.sleep(work(len(seen)))

    agent.resync = resync  # type: ignore[method-assign]
    agent.settings = agent.settings.model_copy(update={"resync_seconds": PERIOD})
    start = loop.time()
    task = asyncio.create_task(agent._resync_loop())
    try:
        async with asyncio.timeout(5):
            await done.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return [t - start for t in seen]


@pytest.mark.parametrize("phase", [0.0, 0.75])
async def test_a_node_resyncs_at_once_then_at_its_phase_of_each_period(
    new_agent: Callable[..., Awaitable[NodeAgent]], phase: float
) -> None:
    agent = await new_agent(RecordingApi())
    agent.resync_phase = phase
    times = await _times(agent, 4, lambda n: 0.0)
    first = PERIOD * (1 - phase)
    assert times == pytest.approx([0.0, first, first + PERIOD, first + 2 * PERIOD], abs=0.05)


async def test_a_resync_that_overran_is_followed_at_once_and_not_caught_up(
    new_agent: Callable[..., Awaitable[NodeAgent]],
) -> None:
    agent = await new_agent(RecordingApi())
    # The second resync takes 2.5 periods: the third comes at once, the
    # fourth a period after it (not two back to back to catch up).
    times = await _times(agent, 4, lambda n: 2.5 * PERIOD if n == 2 else 0.0)
    assert times == pytest.approx([0.0, PERIOD, 3.5 * PERIOD, 4.5 * PERIOD], abs=0.05)

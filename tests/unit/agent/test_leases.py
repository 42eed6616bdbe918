"""The agent's Lease schedule: spread over the period, no node starved by a
slow or failing one, and nothing left running when it stops."""

from __future__ import annotations

import asyncio
import itertools

from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_agent.leases import LeaseRenewer


async def run_for(renewer: LeaseRenewer, seconds: float) -> None:
    task = asyncio.create_task(renewer.run())
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_renewals_are_spread_over_the_period() -> None:
    loop = asyncio.get_running_loop()
    stamps: list[tuple[str, float]] = []

    async def renew(node: str) -> None:
        stamps.append((node, loop.time()))

    nodes = [f"n{i}" for i in range(10)]
    renewer = LeaseRenewer(lambda: nodes, renew, period=1.0)
    await run_for(renewer, 2.45)
    # At start every node at once: a node without a Lease takes no pods.
    first_round = stamps[:10]
    assert [n for n, _ in first_round] == nodes
    assert first_round[-1][1] - first_round[0][1] < 0.05
    # Then in order, one every 0.1 s: never all at once.
    later = stamps[10:]
    assert [n for n, _ in later[:10]] == nodes
    gaps = sorted(b - a for (_, a), (_, b) in itertools.pairwise(later))
    # The median, not the minimum: a loop stalled by a busy machine catches up.
    assert gaps[len(gaps) // 2] > 0.05, gaps
    # The burst, then about 1.45 periods: every node renewed twice or three times.
    per_node = {n: sum(1 for m, _ in stamps if m == n) for n in nodes}
    assert set(per_node.values()) <= {2, 3}, per_node
    assert renewer.skipped == 0
    assert renewer.failures == 0


async def test_slow_and_failing_renewals_delay_no_other_node() -> None:
    calls: dict[str, int] = {}
    stuck = asyncio.Event()

    async def renew(node: str) -> None:
        calls[node] = calls.get(node, 0) + 1
        if node == "slow":
            await stuck.wait()  # never answers
        if node == "bad":
            raise ApiException(status=500, reason="Internal Server Error")
        if node == "broken":
            raise OSError("connection reset")

    nodes = ["slow", "bad", "broken", "good"]
    renewer = LeaseRenewer(lambda: nodes, renew, period=0.2)
    await run_for(renewer, 1.0)
    # The stuck renewal is not stacked up behind itself...
    assert calls["slow"] == 1
    assert renewer.skipped >= 3
    # ...and nobody else waited for it; errors were counted, not raised.
    assert calls["good"] >= 4
    assert calls["bad"] >= 4
    assert calls["broken"] >= 4
    assert renewer.failures == calls["bad"] + calls["broken"]
    assert renewer.renewals == calls["good"]


async def test_stopping_cancels_renewals_in_flight() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def renew(node: str) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    renewer = LeaseRenewer(lambda: ["n"], renew, period=10)
    task = asyncio.create_task(renewer.run())
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert cancelled.is_set()


async def test_nodes_added_later_are_renewed() -> None:
    nodes: list[str] = []
    calls: list[str] = []

    async def renew(node: str) -> None:
        calls.append(node)

    renewer = LeaseRenewer(lambda: list(nodes), renew, period=0.1)
    task = asyncio.create_task(renewer.run())
    await asyncio.sleep(0.25)
    assert calls == []
    nodes.append("late")
    await asyncio.sleep(0.35)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert calls.count("late") >= 2

"""The churn waits for the pods the API server accepted, not for refused ones."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from bench.load import Driver, PodTimes, churn
from tests.unit.bench.bench_helpers import bare_tracker


class RefusingDriver(Driver):
    """Refuses the create of every pod named in `refuse`; an accepted pod is
    gone as soon as it is deleted (the tracker's watch stands in)."""

    refuse: frozenset[str] = frozenset()

    async def create(self, pod: PodTimes) -> None:
        self.tracker.add(pod)
        if pod.name in self.refuse:
            self.errors.append(f"create {pod.name}: 500 webhook EOF")
            return
        pod.created = time.monotonic()

    async def delete(self, pod: PodTimes) -> None:
        if pod.created is None:
            return
        pod.delete_called = time.monotonic()
        self.tracker.stamp("DELETED", {"metadata": {"name": pod.name}}, time.monotonic())


async def test_a_refused_create_does_not_hold_the_churn_to_its_timeout() -> None:
    pods = [PodTimes(f"c-{i}", "t", 1) for i in range(6)]
    d = RefusingDriver(
        core=cast(Any, None), namespace="ns", tracker=bare_tracker(), limit=asyncio.Semaphore(8)
    )
    d.refuse = frozenset({"c-2"})
    said: list[str] = []
    took = await churn(d, pods, rate=100.0, hold=0.01, settle_timeout=30.0, say=said.append)
    assert took < 5.0, f"the churn waited {took:.1f}s for a pod that was never created"
    assert [p.name for p in pods if p.gone is None] == ["c-2"]
    assert d.errors == ["create c-2: 500 webhook EOF"]


async def test_the_churn_still_waits_for_an_accepted_pod_that_is_not_gone() -> None:
    pods = [PodTimes(f"c-{i}", "t", 1) for i in range(3)]

    class Stuck(RefusingDriver):
        async def delete(self, pod: PodTimes) -> None:
            pod.delete_called = time.monotonic()  # never gone: a finalizer stays

    d = Stuck(
        core=cast(Any, None), namespace="ns", tracker=bare_tracker(), limit=asyncio.Semaphore(8)
    )
    took = await churn(d, pods, rate=100.0, hold=0.01, settle_timeout=1.5)
    assert took >= 1.5
    assert all(p.gone is None for p in pods)

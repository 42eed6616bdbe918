"""The floor releases a deleted pod only once the watch shows its containers
stopped, as the operator must; a kubelet that never says so costs the floor
its timeout and an error, not the run."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from bench.load import Driver, FloorWriter, PodTimes, Tracker
from tests.unit.bench.bench_helpers import bare_tracker


class Response:
    status = 200

    async def read(self) -> bytes:
        return b"{}"

    def release(self) -> None:
        pass


class Core:
    async def delete_namespaced_pod(self, *_: Any, **__: Any) -> Response:
        return Response()


class Floor:
    def __init__(self) -> None:
        self.released: list[tuple[str, float]] = []

    async def release(self, pod: PodTimes) -> None:
        self.released.append((pod.name, time.monotonic()))


def driver(t: Tracker, floor: Floor, stop_timeout: float = 30.0) -> Driver:
    return Driver(
        core=cast(Any, Core()),
        namespace="ns",
        tracker=t,
        limit=asyncio.Semaphore(4),
        floor=cast(FloorWriter, floor),
        stop_timeout=stop_timeout,
    )


def deleting(name: str, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "deletionTimestamp": "2026-11-28T00:00:00Z", **meta},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running"},
    }


async def test_the_floor_releases_only_after_the_kubelet_stopped_the_containers() -> None:
    t, floor = bare_tracker(), Floor()
    pod = PodTimes("f-1", "t", 1)
    t.add(pod)
    d = driver(t, floor)
    task = asyncio.ensure_future(d.delete(pod))
    await asyncio.sleep(0.05)
    # Deleting, but its containers still run their grace period.
    t.stamp("MODIFIED", deleting("f-1"), time.monotonic())
    await asyncio.sleep(0.05)
    assert floor.released == [], "released while the containers could still run"
    stopped_at = time.monotonic()
    t.stamp("MODIFIED", deleting("f-1", deletionGracePeriodSeconds=0), stopped_at)
    await asyncio.wait_for(task, 5)
    assert [name for name, _ in floor.released] == ["f-1"]
    assert floor.released[0][1] >= stopped_at
    assert d.errors == []


async def test_a_pod_already_shown_stopped_or_gone_is_released_at_once() -> None:
    t, floor = bare_tracker(), Floor()
    stopped, gone = PodTimes("f-1", "t", 1), PodTimes("f-2", "t", 1)
    t.add(stopped)
    t.add(gone)
    t.stamp("MODIFIED", deleting("f-1", deletionGracePeriodSeconds=0), time.monotonic())
    t.stamp("DELETED", deleting("f-2"), time.monotonic())
    d = driver(t, floor)
    await asyncio.wait_for(asyncio.gather(d.delete(stopped), d.delete(gone)), 1)
    assert sorted(name for name, _ in floor.released) == ["f-1", "f-2"]


async def test_a_kubelet_that_never_answers_costs_the_timeout_and_an_error() -> None:
    t, floor = bare_tracker(), Floor()
    pod = PodTimes("f-1", "t", 1)
    t.add(pod)
    d = driver(t, floor, stop_timeout=0.2)
    began = time.monotonic()
    await d.delete(pod)
    assert time.monotonic() - began >= 0.2
    assert [name for name, _ in floor.released] == ["f-1"]
    assert d.errors == ["delete f-1: containers not stopped in 0.2s; released anyway"]
    assert t.stop_waiters == {}

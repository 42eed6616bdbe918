import asyncio

import pytest

from vnpu_common.kube.backoff import Backoff
from vnpu_common.kube.workqueue import RetryLater, WorkQueue

FAST = Backoff(base=0.01, cap=0.04, jitter=0.0)


async def test_one_key_never_runs_twice_at_once_and_an_add_while_busy_runs_it_again() -> None:
    running: set[str] = set()
    overlaps = 0
    runs: list[str] = []
    release = asyncio.Event()

    async def handler(key: str) -> None:
        nonlocal overlaps
        if key in running:
            overlaps += 1
        running.add(key)
        runs.append(key)
        await release.wait()
        running.discard(key)

    q = WorkQueue(handler, name="t", backoff=FAST)
    q.add("a")
    await asyncio.sleep(0)
    for _ in range(5):  # five events while "a" is being handled
        q.add("a")
    release.set()
    await q.idle()
    assert overlaps == 0
    assert runs == ["a", "a"]  # the busy-time adds collapse into one more run


async def test_adds_of_a_waiting_key_collapse() -> None:
    runs: list[str] = []

    async def handler(key: str) -> None:
        runs.append(key)

    q = WorkQueue(handler, name="t", backoff=FAST, workers=1)
    q.add("x")
    q.add("y")
    q.add("y")
    q.add("x")  # x's handler has not started: it will read the newest state anyway
    await q.idle()
    assert runs == ["x", "y"]


async def test_workers_bound_concurrency() -> None:
    active = 0
    peak = 0

    async def handler(key: str) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.01)
        active -= 1

    q = WorkQueue(handler, name="t", backoff=FAST, workers=2)
    for k in "abcdef":
        q.add(k)
    await q.idle()
    assert peak == 2


async def test_failures_retry_with_backoff_and_success_forgets_them() -> None:
    outcomes = [ValueError("boom"), RetryLater("busy"), None]
    seen_failures: list[int] = []
    done = asyncio.Event()
    q: WorkQueue

    async def handler(key: str) -> None:
        seen_failures.append(q.failures(key))
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        done.set()

    q = WorkQueue(handler, name="t", backoff=FAST)
    q.add("k")
    await asyncio.wait_for(done.wait(), 2)
    await q.idle()
    assert seen_failures == [0, 1, 2]
    assert q.failures("k") == 0


async def test_forget_cancels_a_pending_retry() -> None:
    calls = 0

    async def handler(key: str) -> None:
        nonlocal calls
        calls += 1
        raise RetryLater("again")

    q = WorkQueue(handler, name="t", backoff=Backoff(base=0.05, cap=0.05, jitter=0.0))
    q.add("k")
    await q.idle()
    assert q.failures("k") == 1
    q.forget("k")
    await asyncio.sleep(0.15)
    assert calls == 1
    assert q.failures("k") == 0


async def test_an_earlier_retry_wins_over_a_later_one() -> None:
    fired: list[float] = []
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def handler(key: str) -> None:
        fired.append(loop.time() - start)

    q = WorkQueue(handler, name="t", backoff=FAST)
    q.add_after("k", 0.02)
    q.add_after("k", 5.0)
    await asyncio.sleep(0.1)
    await q.idle()
    assert len(fired) == 1
    assert fired[0] < 1.0


def test_workers_must_be_positive() -> None:
    async def handler(key: str) -> None:
        return None

    with pytest.raises(ValueError, match="workers"):
        WorkQueue(handler, name="t", backoff=FAST, workers=0)


def test_add_without_a_loop_waits_for_the_next_add_inside_one() -> None:
    runs: list[str] = []

    async def handler(key: str) -> None:
        runs.append(key)

    q = WorkQueue(handler, name="t", backoff=FAST)
    q.add("early")  # no running loop: kept, not lost

    async def later() -> None:
        q.add("late")
        await q.idle()

    asyncio.run(later())
    assert runs == ["early", "late"]

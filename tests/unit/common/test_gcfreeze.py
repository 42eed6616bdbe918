"""The heap freeze: long-lived objects leave the collector's full passes,
and cyclic garbage among them is still collected at the next round."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable, Iterator

import pytest

from vnpu_common.process.gcfreeze import Freezer


class Node:
    """A container object that can sit in a reference cycle."""

    def __init__(self) -> None:
        self.other: Node | None = None


def done() -> asyncio.Event:
    ready = asyncio.Event()
    ready.set()
    return ready


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_objects_alive_at_a_round_are_frozen_and_skipped_by_full_passes() -> None:
    cache = [{"pod": [i]} for i in range(1000)]
    assert all(gc.is_tracked(o) for o in cache)
    tracked = {id(o) for o in gc.get_objects()}
    assert all(id(o) in tracked for o in cache)
    Freezer(done()).refreeze()
    frozen = gc.get_freeze_count()
    assert frozen >= len(cache)
    # A full pass walks the generations only: what it can see excludes them.
    tracked = {id(o) for o in gc.get_objects()}
    assert not any(id(o) in tracked for o in cache)
    # Made after the round: collected as before.
    fresh = [{"pod": [-1]}]
    assert any(o is fresh for o in gc.get_objects())


def test_a_frozen_cycle_that_becomes_garbage_is_collected_at_the_next_round() -> None:
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    freezer = Freezer(done())
    freezer.refreeze()
    del a, b
    gc.collect()  # a full pass skips the frozen: the cycle stays
    assert gone() is not None
    freezer.refreeze()
    assert gone() is None


def test_survivors_made_since_are_frozen_without_a_full_pass() -> None:
    freezer = Freezer(done())
    freezer.refreeze()
    before = gc.get_freeze_count()
    full: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    later = [{"pod": [i]} for i in range(500)]
    gc.callbacks.append(seen)
    try:
        freezer.freeze()
    finally:
        gc.callbacks.remove(seen)
    assert full == []
    assert gc.get_freeze_count() >= before + len(later)


async def until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(30):
        while not check():  # noqa: ASYNC110 - counters the freezer does not signal
            await asyncio.sleep(0.01)


async def test_nothing_is_frozen_before_ready_then_rounds_repeat() -> None:
    ready = asyncio.Event()
    freezer = Freezer(ready, every=0.02, full_every=0.1)
    task = asyncio.create_task(freezer.run())
    try:
        await asyncio.sleep(0.05)
        assert freezer.rounds == 0
        assert gc.get_freeze_count() == 0
        ready.set()
        # Each full round collects this whole test process (late in a suite,
        # a large heap): waited for, not timed.
        await until(lambda: freezer.rounds >= 2 and freezer.freezes > freezer.rounds)
        assert gc.get_freeze_count() > 0
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_failed_round_is_logged_and_the_loop_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = 0

    def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")

    monkeypatch.setattr(gc, "freeze", flaky)
    freezer = Freezer(done(), every=0.02, full_every=0.02)
    task = asyncio.create_task(freezer.run())
    try:
        await until(lambda: calls >= 2)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert "heap freeze failed" in caplog.text

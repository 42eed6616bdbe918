"""The fill's freed pods deleted at a pace, or all at once."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from bench.load import Driver, PodTimes, paced_delete


class RecordingDriver(Driver):
    """A driver whose deletions only record when they were sent."""

    async def delete(self, pod: PodTimes) -> None:
        pod.delete_sent = time.monotonic()


def driver() -> RecordingDriver:
    none = cast(Any, None)
    return RecordingDriver(core=none, namespace="ns", tracker=none, limit=asyncio.Semaphore(8))


async def test_deletions_are_sent_at_the_rate() -> None:
    pods = [PodTimes(f"f-{i}", "t", 1) for i in range(5)]
    t0 = await paced_delete(driver(), pods, rate=20.0)
    sent = [p.delete_sent for p in pods]
    assert all(s is not None for s in sent)
    offsets = [cast(float, s) - t0 for s in sent]
    # The i-th no earlier than i / rate after the first (a busy machine may
    # send it later, never sooner).
    for i, offset in enumerate(offsets):
        assert offset >= i / 20.0 - 0.001, offsets
    assert offsets == sorted(offsets)


async def test_rate_zero_sends_every_deletion_at_once() -> None:
    pods = [PodTimes(f"f-{i}", "t", 1) for i in range(50)]
    t0 = await paced_delete(driver(), pods, rate=0.0)
    assert all(p.delete_sent is not None for p in pods)
    # Paced at even 20/s, the last would go 2.45 s after the first.
    assert max(cast(float, p.delete_sent) for p in pods) - t0 < 1.0

"""Pauses of a component's event loop and of Python's garbage collector, as
log lines: what the benchmark lines up with its slowest pods (bench/timeline.py).

Off unless `VNPU_DEBUG_PAUSES_MS` is set to a threshold in milliseconds.
Then `eventloop.run` also runs `watch`: a task that wakes every
`TICK_SECONDS` and logs each wake later than the threshold (the loop was
busy, or the process was not scheduled: `cpu_ms` tells them apart), and
`gc.callbacks` time every collection, logging those over the threshold.
One line per pause, at INFO, logger `vnpu_common.process.pauses`:

    pause kind=loop start=<epoch seconds> ms=<length> cpu_ms=<main thread CPU>
    pause kind=gc start=<epoch seconds> ms=<length> gen=<generation> collected=<objects>
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections import deque
from typing import Any, Final

ENV: Final = "VNPU_DEBUG_PAUSES_MS"
TICK_SECONDS: Final = 0.05

log = logging.getLogger(__name__)


def threshold_ms() -> float:
    """The threshold from the environment; 0: off (unset, empty or not a number)."""
    try:
        return max(0.0, float(os.environ.get(ENV) or 0))
    except ValueError:
        return 0.0


class GcTimer:
    """A `gc.callbacks` entry: collections over the threshold, kept until
    `drain` (nothing is logged from inside the collector)."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.found: deque[tuple[float, float, int, int]] = deque(maxlen=10000)
        self._start = 0.0
        self._wall = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start, self._wall = time.perf_counter(), time.time()
            return
        ms = 1000 * (time.perf_counter() - self._start)
        if ms >= self.threshold:
            self.found.append(
                (self._wall, ms, int(info.get("generation", -1)), int(info.get("collected", 0)))
            )

    def drain(self) -> None:
        while self.found:
            start, ms, gen, collected = self.found.popleft()
            log.info(
                "pause kind=gc start=%.6f ms=%.1f gen=%d collected=%d", start, ms, gen, collected
            )


async def watch(threshold: float) -> None:
    """Logs the loop's late wakes and the collector's long collections until
    cancelled."""
    timer = GcTimer(threshold)
    gc.callbacks.append(timer)
    try:
        while True:
            due, cpu = time.time() + TICK_SECONDS, time.thread_time()
            await asyncio.sleep(TICK_SECONDS)
            late = 1000 * (time.time() - due)
            if late >= threshold:
                log.info(
                    "pause kind=loop start=%.6f ms=%.1f cpu_ms=%.1f",
                    due, late, 1000 * (time.thread_time() - cpu),
                )  # fmt: skip
            timer.drain()
    finally:
        gc.callbacks.remove(timer)

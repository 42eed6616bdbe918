"""The event loop both components run on: uvloop's.

Both processes spend most of their CPU moving bytes between TLS sockets and
JSON: the API server's watch streams, their writes, the webhook's requests.
asyncio's own loop does the TLS framing in Python (asyncio.sslproto); uvloop
does it, and the loop itself, in C over libuv. Measured on the scale
benchmark (docs/DECISIONS.md) it was the largest single cut in CPU per pod.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

from vnpu_common.process import pauses

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on a uvloop loop; with `VNPU_DEBUG_PAUSES_MS` set, the
    loop's and the garbage collector's pauses logged (pauses.py)."""
    threshold = pauses.threshold_ms()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_watched(main, threshold) if threshold else main)


async def _watched(main: Coroutine[Any, Any, T], threshold: float) -> T:
    watcher = asyncio.create_task(pauses.watch(threshold), name="pauses")
    try:
        return await main
    finally:
        watcher.cancel()

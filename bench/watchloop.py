"""The benchmark's watches: the project's own informer (list, then watch
from that resourceVersion, re-list on 410, back off on errors) over one
namespace, every event stamped with the time it arrived."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from vnpu_common.kube.informer import Informer, ListCall


class StampedWatch:
    """Subclasses say what an event means in `stamp`."""

    def __init__(self, name: str, list_call: ListCall) -> None:
        # Errors retried within a second: the benchmark times what it sees.
        self.informer = Informer(name, list_call, self._handle, retry_max_seconds=1.0)
        self.synced = self.informer.synced
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.informer.run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def _handle(self, kind: str, obj: dict[str, Any]) -> None:
        self.stamp(kind, obj, time.monotonic())

    def stamp(self, kind: str, obj: dict[str, Any], now: float) -> None:
        """`kind`: ADDED, MODIFIED, DELETED, or SYNC (listed)."""
        raise NotImplementedError

"""Lease renewals for every node of this process, spread over the period.

Renewing all nodes back to back and then sleeping a period has two faults
at 200 nodes: the writes arrive as one burst every period (200 patches
queued in front of everybody's allocation writes), and the real period is
the sleep plus 200 round trips, which under load approaches the Lease
duration itself, so nodes flap to not-live. Here node i of N is renewed at
i/N of each period on a fixed schedule, each renewal in its own task (a
slow one delays no other), at most `concurrency` in flight, and a node
whose previous renewal is still running is not asked again. The first
round is the exception: a node without a Lease takes no placements, so at
start every Lease is written at once (still `concurrency` at a time).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)

Renew = Callable[[str], Awaitable[None]]


class LeaseRenewer:
    def __init__(
        self,
        nodes: Callable[[], list[str]],
        renew: Renew,
        period: float,
        *,
        concurrency: int = 8,
    ) -> None:
        self.nodes = nodes
        self.renew = renew
        self.period = period
        self.limit = asyncio.Semaphore(concurrency)
        self.renewals = 0
        self.failures = 0
        self.skipped = 0
        self._inflight: dict[str, asyncio.Task[None]] = {}

    async def _one(self, node: str) -> None:
        async with self.limit:
            try:
                await self.renew(node)
                self.renewals += 1
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                self.failures += 1
                log.warning("lease renewal for %s failed: %s %s", node, exc.status, exc.reason)
            except Exception as exc:
                self.failures += 1
                log.warning("lease renewal for %s failed: %s", node, exc)

    def _start(self, node: str) -> None:
        task = self._inflight.get(node)
        if task is not None and not task.done():
            self.skipped += 1
            return
        self._inflight[node] = asyncio.create_task(self._one(node), name=f"lease-{node}")

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        first = True
        try:
            while True:
                nodes = self.nodes()
                if first and nodes:
                    first = False
                    for node in nodes:
                        self._start(node)
                    due += self.period
                    await asyncio.sleep(max(0.0, due - loop.time()))
                    continue
                step = self.period / max(1, len(nodes))
                for node in nodes:
                    self._start(node)
                    due += step
                    # Behind schedule (a stalled loop): go on at once rather
                    # than sleep, so no Lease waits a whole extra period.
                    await asyncio.sleep(max(0.0, due - loop.time()))
                if not nodes:
                    due += self.period
                    await asyncio.sleep(max(0.0, due - loop.time()))
        finally:
            for task in self._inflight.values():
                task.cancel()
            await asyncio.gather(*self._inflight.values(), return_exceptions=True)

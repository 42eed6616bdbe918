"""Keeping the garbage collector's full passes short.

CPython's full collection (generation 2) walks every container object the
process holds. The operator's caches (nodes, VNPUNodes, pods, allocations)
and the ledger are most of them and live as long as the process: at 1000
nodes each full pass stopped the event loop for 200 to 320 ms, seven times
in a two-minute churn on 2 cores, and in the benchmark's attribution one
overlapped most of the slowest 1% of pods (docs/DECISIONS.md, 'Cost per pod
and per event').

`gc.freeze()` moves every object alive at that moment into a permanent
generation that collections skip; the ones created afterwards are
collected as before. So once the caches hold their first full listing, and
every `every` seconds after that, what survived the young collections is
frozen: a full pass then walks at most that long's survivors. Frozen
objects that become garbage are freed by reference counting as any other
(almost all of it: a cached object is a tree of dicts and lists); only
cycles among them would stay, so every `full_every` seconds the heap is
thawed, collected whole (one full pause, where there were several a
minute) and frozen again: the frozen part holds no garbage older than that.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

log = logging.getLogger(__name__)

EVERY_SECONDS = 30.0
FULL_EVERY_SECONDS = 600.0


class Freezer:
    def __init__(
        self,
        ready: asyncio.Event,
        *,
        every: float = EVERY_SECONDS,
        full_every: float = FULL_EVERY_SECONDS,
    ) -> None:
        """`ready`: set once the long-lived state is loaded (the caches synced)."""
        self.ready = ready
        self.every = every
        self.full_every = full_every
        self.rounds = 0
        self.freezes = 0

    def freeze(self) -> None:
        """Freezes what survived: the young generations are collected first
        (milliseconds), so their garbage cycles are not frozen."""
        gc.collect(1)
        gc.freeze()
        self.freezes += 1

    def refreeze(self) -> float:
        """Thaws, collects everything, freezes what is left; returns the
        seconds it took (the pause the loop saw)."""
        started = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.rounds += 1
        took = time.perf_counter() - started
        log.debug("heap collected and frozen in %.0f ms: %d objects", took * 1000,
                  gc.get_freeze_count())  # fmt: skip
        return took

    async def run(self) -> None:
        """Waits for `ready`, then refreezes at once and every `full_every`
        seconds, and freezes every `every` seconds in between, until
        cancelled; a failure is logged and never ends the loop."""
        await self.ready.wait()
        loop = asyncio.get_running_loop()
        full_due = loop.time()
        while True:
            try:
                if loop.time() >= full_due:
                    self.refreeze()
                    # Counted from the round's end: a round longer than the
                    # interval must still leave room for the light freezes.
                    full_due = loop.time() + self.full_every
                else:
                    self.freeze()
            except Exception:  # never a reason to stop the component
                log.exception("heap freeze failed")
            await asyncio.sleep(self.every)

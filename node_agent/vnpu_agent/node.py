"""One node's agent: makes the driver match the node's allocations.

Composes three parts, one idea each:
- driverview.py, the view of the driver: chips, templates, the vNPUs
  present, which the agent made, chip health; every driver call;
- serving.py, the node's allocations: their vNPUs created or adopted,
  reported, destroyed, from a work queue (decided one at a time);
- publisher.py, the node's VNPUNode: its status published, coalesced, and
  put back when someone else deletes, unlabels or edits it.

Here: the wiring of watch events, and the periodic resync that re-reads the
driver, recreates missing vNPUs of live allocations (reboots, vanished
devices), re-checks allocations on chips whose health changed, collects
orphans (see gc.py) and publishes the VNPUNode inventory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from vnpu_agent import cdi
from vnpu_agent.config import AgentSettings
from vnpu_agent.dra.publisher import PoolPublisher, SliceApi
from vnpu_agent.drivers.base import VNPU, ChipInfo, Driver, DriverError, NotFoundError
from vnpu_agent.driverview import DriverView
from vnpu_agent.kubeapi import AgentApi
from vnpu_agent.metrics import AgentMetrics
from vnpu_agent.owned import OwnedIds
from vnpu_agent.publisher import NodePublisher
from vnpu_agent.serving import MAX_CREATE_ATTEMPTS, AllocationServer
from vnpu_common.kube.faults import log_retry
from vnpu_common.wire.types import Raw

__all__ = ["MAX_CREATE_ATTEMPTS", "NodeAgent"]

log = logging.getLogger(__name__)


class NodeAgent:
    def __init__(
        self,
        node: str,
        driver: Driver,
        api: AgentApi,
        settings: AgentSettings,
        metrics: AgentMetrics,
        *,
        synced: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
        slice_api: SliceApi | None = None,
        resync_phase: float = 0.0,
    ) -> None:
        """`slice_api`: with --dra, the node's chips are published as a DRA
        pool through it (dra/publisher.py). `resync_phase`: where in each
        resync period, a fraction in [0, 1), this node resyncs (node i of
        the process's N at i/N: _resync_loop)."""
        self.node = node
        self.resync_phase = resync_phase
        self.api = api
        self.settings = settings
        self.metrics = metrics
        self.synced = synced
        self.clock = clock
        # The node's allocations as the watch last delivered them, by key:
        # what serving works on and what the VNPUNode's status counts.
        self.allocs: dict[str, Raw] = {}
        self.view = DriverView(node, driver, settings, metrics)
        self.pool = (
            None
            if slice_api is None
            else PoolPublisher(
                node,
                slice_api,
                retry_max_seconds=settings.retry_max_seconds,
                verify_seconds=settings.dra_verify_seconds,
                clock=lambda: self.clock(),
                written=metrics.dra_pool_write,
            )
        )
        # self.clock is read at each call: it may be replaced (tests do).
        self.publisher = NodePublisher(
            node,
            self.view,
            self.allocs,
            api,
            settings,
            metrics,
            clock=lambda: self.clock(),
            pool=self.pool,
        )
        self.serving = AllocationServer(
            node, self.view, self.publisher, self.allocs, api, settings, metrics
        )
        self._tasks: list[asyncio.Task[None]] = []

    # -- what the metrics collector reads (metrics.NodeState) and main.Agent.ready --

    @property
    def vnpus(self) -> dict[int, VNPU]:
        return self.view.vnpus

    @property
    def chips(self) -> list[ChipInfo]:
        return self.view.chips

    @property
    def owned(self) -> OwnedIds:
        return self.view.owned

    @property
    def driver_ok(self) -> bool:
        return self.view.ok

    @property
    def dra_pool_published(self) -> bool | None:
        return None if self.pool is None else self.pool.published

    def referenced_ids(self) -> set[int]:
        return self.serving.referenced_ids()

    # -- wiring ------------------------------------------------------------

    async def on_event(self, kind: str, obj: Raw) -> None:
        """An event of the watch of the node's allocations."""
        await self.serving.on_event(kind, obj)
        # What the node's vNPUs hold outside the scheduler's view moves with
        # the allocations (one gone, a destroy deferred): the DRA pool's counters.
        self.publisher.feed_pool()

    async def on_node_event(self, kind: str, obj: Raw) -> None:
        """An event of the VNPUNode watch for this node."""
        await self.publisher.on_node_event(kind, obj)

    async def run(self) -> None:
        await self.view.refresh()
        self.serving.start()
        self._tasks = [asyncio.create_task(self._resync_loop(), name=f"resync-{self.node}")]
        if self.pool is not None:
            self._tasks.append(asyncio.create_task(self.pool.run(), name=f"pool-{self.node}"))
        try:
            await asyncio.gather(*self._tasks)
        finally:
            for task in self._tasks:
                task.cancel()
            self.serving.queue.close()

    async def _resync_loop(self) -> None:
        """The first resync at once (the VNPUNode written at start), then
        one per period at this node's phase of it, on a fixed schedule.

        Every node of a process resynced on the same beat: all of them
        start together and each slept a period after its resync, so at 200
        nodes per process each period brought some 2000 driver calls (in
        the threads every create and destroy also waits for) and 200
        statuses built in one go, and the allocations served meanwhile
        waited behind them: the agent step's tail (issue 38). Spread, each
        node's resync comes alone. A resync that overran its period is
        followed by the next at once, and the schedule starts again from
        there rather than catching up."""
        loop = asyncio.get_running_loop()
        period = self.settings.resync_seconds
        due = loop.time() + period * (1.0 - self.resync_phase)
        while True:
            failed: Exception | None = None
            try:
                await self.resync()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failed = exc
            now = loop.time()
            due = max(due, now)
            if failed is not None:
                log_retry(log, f"resync of {self.node}", failed, due - now)
            await asyncio.sleep(due - now)
            due += period

    # -- periodic work -----------------------------------------------------

    async def resync(self) -> None:
        await self.view.refresh()
        if not self.view.ok:
            self.publisher.mark_dirty()
            return
        self.serving.requeue(self.view.health_changes())
        await self._collect_orphans()
        self.publisher.mark_dirty()

    async def _collect_orphans(self) -> None:
        view = self.view
        decision = view.gc.evaluate(
            list(view.vnpus.values()),
            self.serving.referenced_ids(),
            view.owned.snapshot(),
            now=self.clock(),
            synced=self.synced(),
        )
        for _vnpu in decision.kept_foreign:
            self.metrics.gc_action(self.node, "kept-foreign")
        for vnpu in decision.destroy:
            reason = "orphan" if vnpu.id in view.owned else "foreign"
            try:
                await view.call("destroy", view.driver.destroy_vnpu, vnpu.chip, vnpu.id)
            except NotFoundError:
                pass
            except DriverError as exc:
                log.warning("GC of vNPU %s on %s failed: %s", vnpu.id, self.node, exc)
                self.metrics.gc_action(self.node, f"{reason}-failed")
                continue
            log.info("collected %s vNPU %s (%s) on %s", reason, vnpu.id, vnpu.template, self.node)
            self.metrics.gc_action(self.node, reason)
            view.removed(vnpu.id)
            view.disowned(vnpu.id)
            cdi.remove(self.settings.cdi_dir, self.node, vnpu.id)

"""The node's VNPUNode: its status published from the driver's view and the
allocations, and the object put back when someone else deletes, unlabels or
edits it.

Writes are coalesced (at most one per minimum interval), put off while they
would only restate what the allocations already say (the settle interval),
and made one at a time: the answer of the last one is what the watch's
events are compared with (mirror.py). No API write happens when nothing
changed: our own writes echoing back cause none.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from vnpu_agent.config import AgentSettings
from vnpu_agent.dra import slices
from vnpu_agent.dra.publisher import PoolPublisher
from vnpu_agent.driverview import DriverView
from vnpu_agent.inventory import build_status, cordoned_chips, only_restates
from vnpu_agent.kubeapi import AgentApi
from vnpu_agent.metrics import AgentMetrics
from vnpu_agent.mirror import NodeMirror
from vnpu_common.kube.backoff import Backoff
from vnpu_common.kube.faults import log_retry
from vnpu_common.wire import names
from vnpu_common.wire.models import ChipStatus, VNPUNodeStatus
from vnpu_common.wire.types import Raw

# The node agent's log, as before it was split in modules (its lines unchanged).
log = logging.getLogger(__name__)

# How often a VNPUNode that differs from our last write is looked at again
# before it is restored: until the watch has delivered the echo of that write
# (mirror.py), or while a write is in flight, the difference may only be the
# watch running behind.
RESTORE_SETTLE_SECONDS = 1.0


class NodePublisher:
    def __init__(
        self,
        node: str,
        view: DriverView,
        allocs: Mapping[str, Raw],
        api: AgentApi,
        settings: AgentSettings,
        metrics: AgentMetrics,
        *,
        clock: Callable[[], float],
        pool: PoolPublisher | None = None,
    ) -> None:
        """`pool`: the node's DRA pool (--dra), told the chips, cordons and
        held capacity each time the status is built (feed_pool)."""
        self.node = node
        self.pool = pool
        self.view = view
        self.allocs = allocs
        self.api = api
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.mirror = NodeMirror(node)
        self._lock = asyncio.Lock()
        self._last_status: dict[str, Any] | None = None
        self._last_publish = -1e9
        # When the status first differed from the last write by what the
        # allocations say alone (vNPUs they own added, those of deleted ones
        # gone); None while it does not.
        self._restated_since: float | None = None
        self._pending: asyncio.Handle | None = None
        self._pending_due = 0.0
        self._backoff = Backoff(base=1.0, cap=settings.retry_max_seconds)
        self._restore_pending: asyncio.TimerHandle | None = None
        self._force = False
        # Chip health as the VNPUNode's condition and Events last told it.
        self._health_told: dict[int, bool] = {}
        # The chips and cordons of the last status built, for the pool.
        self._pool_chips: list[ChipStatus] | None = None
        self._pool_cordoned: list[int] = []

    def mark_dirty(self, at_least: float = 0.0, *, restates: bool = False) -> None:
        """Publishes soon, at most once per min interval (coalescing bursts).

        A write already pending stays, unless this call wants one earlier:
        then the pending one moves earlier (never later), so a change that
        wants a prompt write (a vNPU gone) does not wait behind a settled
        write put off to the settle interval's end. `restates`: the change
        only restates what the allocations say (a vNPU made for one), which
        a pending write carries however late (inventory.only_restates)."""
        pending = self._pending
        if pending is not None and restates:
            return
        wait = max(
            at_least,
            self._last_publish + self.settings.inventory_min_interval_seconds - self.clock(),
        )
        loop = asyncio.get_running_loop()
        due = loop.time() + max(wait, 0.0)
        if pending is not None:
            # Our own record of when it is due: uvloop answers call_later(0)
            # with a plain Handle, which has no when().
            if self._pending_due <= due:
                return
            pending.cancel()
        self._pending = loop.call_later(wait, self._spawn_publish)
        self._pending_due = due

    def _spawn_publish(self) -> None:
        self._pending = None
        task = asyncio.get_running_loop().create_task(self.publish(), name=self.node)
        task.add_done_callback(self._log_publish_error)

    def _log_publish_error(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or (exc := task.exception()) is None:
            return
        # A failed write scheduled its retry (mark_dirty); a failure before it
        # (the driver) waits for the next change or resync.
        retry_in = None
        if self._pending is not None:
            retry_in = max(self._pending_due - asyncio.get_running_loop().time(), 0.0)
        log_retry(log, f"VNPUNode {self.node}: status write", exc, retry_in)

    async def publish(self) -> None:
        # One write at a time: its answer is what later events compare with.
        async with self._lock:
            await self._publish()

    async def _publish(self) -> None:
        view = self.view
        if view.ok:
            await view.reread_chips()
        if view.ok:
            await self._tell_chip_health()
        cordoned = cordoned_chips(self.mirror.observed)
        status = build_status(
            driver=view.driver.name,
            chips=view.chips,
            templates=view.templates,
            vnpus=view.vnpus,
            allocations=self.allocs.values(),
            conditions=view.conditions,
            cordoned=cordoned,
            dra=self.pool is not None,
        )
        if self.pool is not None and view.ok:
            # The pool changes only with the chips' identity, health, totals
            # and templates, the cordons and the held capacity; it compares
            # and wakes its task.
            parsed = VNPUNodeStatus.model_validate(status)
            parsed.resolve_templates()
            self._pool_chips, self._pool_cordoned = parsed.chips, cordoned
            self.feed_pool()
        if status == self._last_status and not self._force:
            self._restated_since = None
            return
        restore, missing = self.mirror.needs_restore_write(), self.mirror.missing()
        if not (self._force or restore) and self._only_restated(status):
            return
        self._last_publish = self.clock()
        self.mirror.write_started()
        try:
            if restore:
                obj = await self.api.restore_node(self.node, status, exists=not missing)
            else:
                obj = await self.api.publish_node_status(self.node, status)
        except BaseException as exc:
            self.mirror.write_failed()
            if isinstance(exc, Exception):
                # Its outcome is unknown (a 504 may have been applied): write
                # the status again, whatever the server holds, after a backoff
                # rather than at the next resync.
                self._force = True
                self.mark_dirty(self._backoff.delay(self.mirror.failures))
            raise
        self._last_status = status
        self._restated_since = None
        self._force = False
        self.mirror.write_answered(obj, self.clock())
        if restore:
            # Counted here, whichever write found the object gone or
            # unlabelled: the settle check's or one due anyway (a release,
            # a retry), which would leave that check nothing to count.
            self._restored("deleted" if missing else "unlabelled")

    def feed_pool(self) -> None:
        """Tells the DRA pool what the node's vNPUs hold that no allocated
        device accounts for (slices.held_capacity), with the chips of the
        last status built. Cheap, and a no-op when nothing it publishes
        changed: called on every status built and every allocation event
        (an allocation gone, or its destroy deferred, moves what is held
        without a status write)."""
        if self.pool is None or self._pool_chips is None:
            return
        present = (slices.Present(v.id, v.chip, v.template) for v in self.view.vnpus.values())
        held = slices.held_capacity(self._pool_chips, present, self.allocs.values(), self.node)
        self.pool.update(self._pool_chips, self._pool_cordoned, held)

    def _only_restated(self, status: dict[str, Any]) -> bool:
        """True, and the write put off, when `status` differs from the last
        one written only in what the allocations already say (inventory.
        only_restates: vNPUs they own added, vNPUs of deleted allocations gone)
        and the settle interval has not passed since the first such change not
        written yet, on a quiet node as on a busy one. A release's reader takes
        a vNPU listed under a gone allocation as destroyed, and the vNPU placed
        on the freed room next rides along. A node filling up writes once per
        interval instead of once per vNPU; a burst of placements writes each
        node once, after it, not once at its first vNPU and again 30 s later.
        A VNPUNode status write costs the API server about three times an
        allocation's (a 3 KB object validated whole on every write)."""
        last = self._last_status
        if last is None:
            return False
        live = {
            k for k, obj in self.allocs.items()
            if not (obj.get("metadata") or {}).get("deletionTimestamp")
        }  # fmt: skip
        if not only_restates(last, status, live):
            self._restated_since = None
            return False
        now = self.clock()
        if self._restated_since is None:
            self._restated_since = now
        since = max(self._last_publish, self._restated_since)
        wait = since + self.settings.inventory_settle_seconds - now
        if wait <= 0:
            return False
        self.mark_dirty(at_least=wait)
        return True

    async def _tell_chip_health(self) -> None:
        """The VNPUNode's ChipsHealthy condition, and an Event on the VNPUNode
        when a chip turns unhealthy or healthy again. The operator places
        nothing new on an unhealthy chip; vNPUs there stay (their allocations
        carry a Healthy condition of their own). Only transitions write."""
        self.view.note_chip_health()
        health = {c.index: c.healthy for c in self.view.chips}
        observed_meta = (self.mirror.observed or {}).get("metadata") or {}
        involved = {
            "apiVersion": names.API_VERSION,
            "kind": names.NODE_KIND,
            "metadata": {"name": self.node, "uid": observed_meta.get("uid")},
        }
        for index, healthy in sorted(health.items()):
            if self._health_told.get(index, True) == healthy:
                continue
            await self.api.event(
                involved,
                type_="Normal" if healthy else "Warning",
                reason=names.REASON_CHIP_HEALTHY if healthy else names.REASON_CHIP_UNHEALTHY,
                message=f"chip {index} of {self.node} is healthy again: it takes new vNPUs"
                if healthy
                else f"chip {index} of {self.node} is unhealthy: no new vNPU is placed on it; "
                "its vNPUs stay until their pods end",
                node=self.node,
            )
        self._health_told = health

    # -- own VNPUNode ------------------------------------------------------

    async def on_node_event(self, kind: str, obj: Raw) -> None:
        """An event of the VNPUNode watch for this node (DELETED also when
        the object lost the label the watch selects on)."""
        self.mirror.on_event(kind, obj)
        published = self.mirror.published
        if published is not None and _echo_of(published) != cordoned_chips(self.mirror.observed):
            # An admin changed spec.cordonedChips: the status echoes it.
            self.mark_dirty()
        if self.mirror.differs() and self._restore_pending is None:
            self._restore_pending = asyncio.get_running_loop().call_later(
                RESTORE_SETTLE_SECONDS, self._check_restore
            )

    def _check_restore(self) -> None:
        self._restore_pending = None
        loop = asyncio.get_running_loop()
        if self.mirror.failures:
            # Our last write failed and its retry is due: the difference may
            # be that write, applied after all, and the retry writes anyway.
            return
        if self._lock.locked() or self.mirror.echo_pending(self.clock()):
            # A write of ours is in flight, or the watch has not caught up
            # with our last one: what it shows may be older; look again.
            self._restore_pending = loop.call_later(RESTORE_SETTLE_SECONDS, self._check_restore)
            return
        what = self.mirror.differs()
        if what is None:
            return
        if what == "status":
            # A deleted or unlabelled object is counted by the write that
            # puts it back (_publish).
            self._restored(what)
        self._force = True
        self.mark_dirty()

    def _restored(self, what: str) -> None:
        log.warning(
            "VNPUNode %s changed by someone else (%s); restoring it "
            "(resourceVersion %s, our last write %s)",
            self.node,
            what,
            self.mirror.last_rv,
            self.mirror.written_rv,
        )
        self.metrics.node_restored(self.node, what)


def _echo_of(status: dict[str, Any]) -> list[int]:
    """The cordoned chips a published status echoes."""
    text = status.get("cordoned") or ""
    return [int(i) for i in text.split(",") if i.isdigit()]

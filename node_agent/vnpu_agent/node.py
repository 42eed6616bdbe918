"""One node's agent: makes the driver match the node's allocations.

Driven by watch events (one allocation at a time, per node, in a queue) and
by a periodic resync that re-reads the driver, recreates missing vNPUs of
live allocations (reboots, vanished devices), checks chip health, collects
orphans (see gc.py) and publishes the VNPUNode inventory. A watch of the
node's own VNPUNode puts it back when someone else deletes, unlabels or
edits it.

Invariants kept here:
- a vNPU whose allocation exists and is not being deleted is never
  destroyed (the release path also refuses when another live allocation
  references the id);
- the allocation finalizer is removed only after the vNPU is gone;
- no API write happens when nothing changed (the VNPUNode watch compares
  what the server holds with what it answered our last write, so our own
  writes echoing back cause none).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from vnpu_agent import cdi
from vnpu_agent.config import AgentSettings
from vnpu_agent.drivers.base import (
    VNPU,
    CapacityError,
    ChipInfo,
    Driver,
    DriverError,
    DriverFailure,
    InUseError,
    InvalidIdError,
    NotFoundError,
    TemplateSpec,
)
from vnpu_agent.failpoints import failpoint
from vnpu_agent.gc import OrphanTracker
from vnpu_agent.inventory import build_status, cordoned_chips, only_restates
from vnpu_agent.kubeapi import AgentApi
from vnpu_agent.metrics import AgentMetrics
from vnpu_agent.mirror import NodeMirror
from vnpu_agent.owned import OwnedIds
from vnpu_common import names
from vnpu_common.api.models import (
    Condition,
    VNPUAllocation,
    find_condition,
    set_condition,
)
from vnpu_common.backoff import Backoff
from vnpu_common.informer import key_of
from vnpu_common.rawcall import describe
from vnpu_common.workqueue import RetryLater, WorkQueue

log = logging.getLogger(__name__)
T = TypeVar("T")

# Transient driver failures are retried this many times before the
# allocation stays Failed (the operator then places the pod elsewhere).
MAX_CREATE_ATTEMPTS = 5

# How often a VNPUNode that differs from our last write is looked at again
# before it is restored: until the watch has delivered the echo of that write
# (mirror.py), or while a write is in flight, the difference may only be the
# watch running behind.
RESTORE_SETTLE_SECONDS = 1.0


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
    ) -> None:
        self.node = node
        self.driver = driver
        self.api = api
        self.settings = settings
        self.metrics = metrics
        self.synced = synced
        self.clock = clock
        self.allocs: dict[str, dict[str, Any]] = {}
        self.vnpus: dict[int, VNPU] = {}
        self.chips: list[ChipInfo] = []
        self.templates: dict[int, list[TemplateSpec]] = {}
        self.owned = OwnedIds(settings.state_dir / node / "owned.json")
        self.gc = OrphanTracker(settings.gc_grace_seconds, settings.foreign_vnpu_policy)
        # One worker: the node's driver takes one call at a time anyway. A
        # key's consecutive failures (queue.failures) count create attempts
        # and say whether a Failed status is final or a retry is pending.
        self.queue = WorkQueue(
            self.reconcile,
            name=f"allocation@{node}",
            backoff=Backoff(base=1.0, cap=settings.retry_max_seconds),
            workers=1,
            expected=(ApiException,),
        )
        self._started = False
        self._deferred_noted: set[str] = set()
        # Ids of vNPUs whose allocation went while they still existed: until
        # they are destroyed, no new allocation gets them (_held_elsewhere).
        self._abandoned: set[int] = set()
        self._driver_lock = asyncio.Lock()
        self._last_status: dict[str, Any] | None = None
        self._last_publish = -1e9
        self._publish_pending: asyncio.TimerHandle | None = None
        self._publish_lock = asyncio.Lock()
        self._mirror = NodeMirror(node)
        self._publish_backoff = Backoff(base=1.0, cap=settings.retry_max_seconds)
        self._restore_pending: asyncio.TimerHandle | None = None
        self._force_publish = False
        self._node_conditions: list[Condition] = []
        self.driver_ok = False
        self._health_seen: dict[int, bool] = {}
        # Chip health as the VNPUNode's condition and Events last told it.
        self._node_health_told: dict[int, bool] = {}
        self._tasks: list[asyncio.Task[None]] = []
        # Per allocation, the resourceVersion our last Ready write made: its
        # watch event is the echo of a state already reconciled, and queueing
        # it again would only find nothing to do (a quarter of the events).
        self._echoes: dict[str, str] = {}

    # -- wiring ------------------------------------------------------------

    async def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        key = key_of(obj)
        echo = self._echoes.pop(key, None)
        if kind == "DELETED":
            gone = self.allocs.pop(key, None) or obj
            vnpu_id = (gone.get("spec") or {}).get("vnpuId")
            if vnpu_id in self.vnpus and vnpu_id not in self.referenced_ids():
                # Gone while its vNPU exists (its finalizer removed by someone
                # else, or before the destroy): never handed to a new allocation.
                self._abandoned.add(vnpu_id)
            self.queue.forget(key)
            self._deferred_noted.discard(key)
            self._mark_dirty()
            return
        self.allocs[key] = obj
        if echo is not None and echo == (obj.get("metadata") or {}).get("resourceVersion"):
            return
        if self._started:
            self.queue.add(key)

    async def run(self) -> None:
        await self.refresh_driver()
        # Allocations seen before the driver was read wait until now.
        self._started = True
        for key in list(self.allocs):
            self.queue.add(key)
        self._tasks = [asyncio.create_task(self._resync_loop(), name=f"resync-{self.node}")]
        try:
            await asyncio.gather(*self._tasks)
        finally:
            for task in self._tasks:
                task.cancel()
            self.queue.close()

    async def _resync_loop(self) -> None:
        while True:
            try:
                await self.resync()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("resync of %s failed", self.node)
            await asyncio.sleep(self.settings.resync_seconds)

    # -- driver ------------------------------------------------------------

    async def _drv(self, op: str, fn: Callable[..., T], *args: Any) -> T:
        """One driver call at a time per node, in a thread, timed and counted."""
        async with self._driver_lock:
            start = time.perf_counter()
            try:
                result = await asyncio.wait_for(
                    asyncio.to_thread(fn, *args), timeout=self.settings.driver_timeout_seconds
                )
            except TimeoutError as exc:
                self.metrics.driver_op(self.node, op, "timeout", time.perf_counter() - start)
                raise DriverFailure(
                    f"driver {op} timed out after {self.settings.driver_timeout_seconds:g}s"
                ) from exc
            except DriverError as exc:
                self.metrics.driver_op(self.node, op, exc.reason, time.perf_counter() - start)
                raise
            self.metrics.driver_op(self.node, op, "ok", time.perf_counter() - start)
            return result

    async def refresh_driver(self) -> None:
        """Re-reads chips, templates and vNPUs; on failure keeps the old view
        (of the chips whose vNPUs it had not re-read yet)."""
        try:
            chips = await self._drv("list_chips", self.driver.list_chips)
            templates: dict[int, list[TemplateSpec]] = {}
            for chip in chips:
                known = self.templates.get(chip.index)
                if known is None:
                    known = await self._drv(
                        "list_templates", self.driver.list_templates, chip.index
                    )
                templates[chip.index] = known
                found = await self._drv("list_vnpus", self.driver.list_vnpus, chip.index)
                # Each chip's listing replaces that chip's vNPUs at once: a
                # create or destroy by another task between two of these calls
                # (the driver lock is free in between) is newer than this
                # listing. Applied at the end, the listing brought destroyed
                # vNPUs back into the inventory until the next resync.
                self._replace_vnpus(chip.index, found)
        except DriverError as exc:
            if self.driver_ok:
                log.error("driver query on %s failed: %s", self.node, exc)
            self.driver_ok = False
            self._set_node_condition("False", exc.reason, str(exc))
            return
        present = {chip.index for chip in chips}
        self.vnpus = {i: v for i, v in self.vnpus.items() if v.chip in present}
        self.chips, self.templates = chips, templates
        self.driver_ok = True
        self._set_node_condition("True", names.REASON_DRIVER_READY, f"{len(chips)} chips")

    def _replace_vnpus(self, chip: int, found: list[VNPU]) -> None:
        kept = {i: v for i, v in self.vnpus.items() if v.chip != chip}
        self.vnpus = kept | {v.id: v for v in found}
        self._abandoned &= set(self.vnpus)

    def _set_node_condition(self, status: Any, reason: str, message: str) -> None:
        self._node_conditions = set_condition(
            self._node_conditions, names.COND_READY, status, reason, message
        )

    def chip_healthy(self, index: int) -> bool:
        return any(c.index == index and c.healthy for c in self.chips)

    # -- reconcile one allocation -------------------------------------------

    async def reconcile(self, key: str) -> None:
        obj = self.allocs.get(key)
        if obj is None:
            return
        try:
            alloc = VNPUAllocation.model_validate(obj)
        except ValidationError as exc:
            # The CRD schema should make this impossible; never crash on it.
            log.error("allocation %s is malformed: %s", key, exc)
            return
        if alloc.spec.node_name != self.node:
            return
        if alloc.metadata.deletion_timestamp is not None:
            await self._release(obj, alloc)
        else:
            await self._ensure(obj, alloc)

    async def _ensure(self, obj: dict[str, Any], alloc: VNPUAllocation) -> None:
        key = key_of(obj)
        spec, status = alloc.spec, alloc.status
        if status.phase == names.PHASE_FAILED and not self.queue.failures(key):
            return  # a final verdict on an immutable spec; the operator re-places
        existing = self.vnpus.get(spec.vnpu_id)
        if existing is not None and (existing.template, existing.chip) != (
            spec.template,
            spec.chip,
        ):
            await self._fail(
                obj,
                alloc,
                names.REASON_MISMATCH,
                f"vNPU {spec.vnpu_id} already exists on chip {existing.chip} with template "
                f"{existing.template}; this allocation wants chip {spec.chip}, template "
                f"{spec.template}",
            )
            return
        if existing is not None and status.phase != names.PHASE_READY:
            held = self._held_elsewhere(key, existing)
            if held is not None:
                await self._refuse_held(obj, alloc, held)
                return
        reason = names.REASON_ADOPTED if existing is not None else names.REASON_CREATED
        if existing is None:
            self.owned.add(spec.vnpu_id)
            try:
                vnpu = await self._drv(
                    "create", self.driver.create_vnpu, spec.chip, spec.template, spec.vnpu_id
                )
            except DriverError as exc:
                await self._after_failed_create(obj, alloc, exc)
                return
            self.vnpus[vnpu.id] = vnpu
            self.gc.forget(vnpu.id)
            self._mark_dirty()
            await failpoint("after-create")
            if status.phase == names.PHASE_READY:
                reason = names.REASON_RECREATED
                await self.api.event(
                    obj,
                    type_="Normal",
                    reason=names.REASON_RECREATED,
                    node=self.node,
                    message=f"vNPU {spec.vnpu_id} was missing on {self.node}; recreated",
                )
        cdi.write(
            self.settings.cdi_dir,
            self.node,
            spec.vnpu_id,
            spec.template,
            self.settings.cdi_host_device_dir,
        )
        await self._write_ready(obj, alloc, reason)

    def _held_elsewhere(self, key: str, vnpu: VNPU) -> str | None:
        """Why the existing `vnpu` may not be handed to allocation `key`, which
        has not been served yet; None when adopting it is safe (the agent made
        it for this allocation and crashed before saying Ready, or a reboot
        replayed it: no container has it open, nothing else names it)."""
        others = sorted(
            k
            for k, o in self.allocs.items()
            if k != key
            and (o.get("spec") or {}).get("vnpuId") == vnpu.id
            and (o.get("spec") or {}).get("nodeName") == self.node
        )
        if others:
            return f"vNPU {vnpu.id} is still held by allocation {', '.join(others)}"
        if vnpu.in_use:
            return f"vNPU {vnpu.id} exists and is open in a container"
        if vnpu.id in self._abandoned:
            return f"vNPU {vnpu.id} was left behind by an allocation that went without its destroy"
        return None

    async def _refuse_held(self, obj: dict[str, Any], alloc: VNPUAllocation, why: str) -> None:
        """Retries while the holder may let go (a deferred destroy finishing),
        then fails the allocation: the operator places the pod anew."""
        attempt = self.queue.failures(key_of(obj)) + 1
        msg = f"{why}; not handed to a new allocation"
        if attempt < MAX_CREATE_ATTEMPTS:
            raise RetryLater(f"{msg} (attempt {attempt} of {MAX_CREATE_ATTEMPTS})")
        log.warning("allocation %s: %s", key_of(obj), msg)
        await self._fail(obj, alloc, names.REASON_VNPU_HELD, msg)

    async def _after_failed_create(
        self, obj: dict[str, Any], alloc: VNPUAllocation, exc: DriverError
    ) -> None:
        key = key_of(obj)
        spec = alloc.spec
        # A create that failed mid-way may have left the vNPU behind; keep it
        # marked as ours (so GC may collect it) only if it exists.
        with contextlib.suppress(DriverError):
            for v in await self._drv("list_vnpus", self.driver.list_vnpus, spec.chip):
                self.vnpus[v.id] = v
        if spec.vnpu_id not in self.vnpus:
            self.owned.discard(spec.vnpu_id)
        elif isinstance(exc, InvalidIdError):
            # The id appeared since our last look (made by hand, or by a
            # create that failed mid-way): adopt it or report the mismatch.
            await self._ensure(obj, alloc)
            return
        msg = f"creating vNPU {spec.vnpu_id} failed: {exc}"
        attempt = self.queue.failures(key) + 1
        if (
            isinstance(exc, CapacityError)
            and attempt < MAX_CREATE_ATTEMPTS
            and self._being_freed(spec.chip)
        ):
            # After a gap in the watch (an API server restart) the agent may hear of a new
            # allocation before it has released the one whose room it takes: not Failed,
            # which would send the pod elsewhere for capacity gone in a moment.
            raise RetryLater(
                f"{msg}; a vNPU on chip {spec.chip} is being released "
                f"(attempt {attempt} of {MAX_CREATE_ATTEMPTS})"
            )
        await self._fail(obj, alloc, exc.reason, msg)
        if type(exc) is DriverFailure and attempt < MAX_CREATE_ATTEMPTS:
            raise RetryLater(f"{msg} (attempt {attempt} of {MAX_CREATE_ATTEMPTS})")

    async def _fail(
        self, obj: dict[str, Any], alloc: VNPUAllocation, reason: str, msg: str
    ) -> None:
        status = alloc.status
        conds = set_condition(
            status.conditions, names.COND_READY, "False", reason, msg, alloc.metadata.generation
        )
        if status.phase == names.PHASE_FAILED and status.message == msg:
            return
        await self.api.patch_allocation_status(
            obj,
            {
                "phase": names.PHASE_FAILED,
                "message": msg,
                "observedGeneration": alloc.metadata.generation,
                "conditions": [c.to_api() for c in conds],
            },
        )
        await self.api.event(obj, type_="Warning", reason=reason, message=msg, node=self.node)

    async def _write_ready(self, obj: dict[str, Any], alloc: VNPUAllocation, reason: str) -> None:
        spec, status = alloc.spec, alloc.status
        healthy = self.chip_healthy(spec.chip)
        conds = set_condition(
            status.conditions,
            names.COND_READY,
            "True",
            reason,
            f"vNPU {spec.vnpu_id} ({spec.template}) on chip {spec.chip}",
            alloc.metadata.generation,
        )
        old_ready = find_condition(status.conditions, names.COND_READY)
        if old_ready is not None and old_ready.status == "True":
            # Keep the first reason (Created/Adopted): rewriting it on every
            # resync would be a write for nothing.
            conds = [c if c.type != names.COND_READY else old_ready for c in conds]
        conds = set_condition(
            conds,
            names.COND_HEALTHY,
            "True" if healthy else "False",
            names.REASON_CHIP_HEALTHY if healthy else names.REASON_CHIP_UNHEALTHY,
            "" if healthy else f"chip {spec.chip} of {self.node} reports unhealthy",
            alloc.metadata.generation,
        )
        desired = {
            "phase": names.PHASE_READY,
            "devicePath": names.device_path(spec.vnpu_id),
            "observedGeneration": alloc.metadata.generation,
            "message": "" if healthy else f"chip {spec.chip} unhealthy",
            "conditions": [c.to_api() for c in conds],
        }
        current = {
            "phase": status.phase,
            "devicePath": status.device_path,
            "observedGeneration": status.observed_generation,
            "message": status.message or "",
            "conditions": [c.to_api() for c in status.conditions],
        }
        if desired != current:
            written = await self.api.patch_allocation_status(obj, desired)
            if written:
                self._echoes[key_of(obj)] = written
        old_health = find_condition(status.conditions, names.COND_HEALTHY)
        if old_health is not None and (old_health.status == "True") != healthy:
            await self.api.event(
                obj,
                type_="Normal" if healthy else "Warning",
                reason=names.REASON_CHIP_HEALTHY if healthy else names.REASON_CHIP_UNHEALTHY,
                message=f"chip {spec.chip} of {self.node} is "
                f"{'healthy again' if healthy else 'unhealthy'}; vNPU {spec.vnpu_id} "
                f"{'usable' if healthy else 'may not work'}",
                node=self.node,
            )

    async def _release(self, obj: dict[str, Any], alloc: VNPUAllocation) -> None:
        key = key_of(obj)
        spec = alloc.spec
        if names.ALLOCATION_FINALIZER not in alloc.metadata.finalizers:
            return
        with contextlib.suppress(DriverError):
            for v in await self._drv("list_vnpus", self.driver.list_vnpus, spec.chip):
                self.vnpus[v.id] = v
        vnpu = self.vnpus.get(spec.vnpu_id)
        ours = vnpu is not None and (vnpu.template, vnpu.chip) == (spec.template, spec.chip)
        # Only a live allocation the agent has served holds the vNPU: one not
        # yet served that names it too is never handed it (_held_elsewhere)
        # and gets a vNPU of its own once this one is destroyed.
        if ours and spec.vnpu_id in self._live_vnpu_ids(exclude=key, served=True):
            log.error(
                "vNPU %s of %s is also held by a live allocation; not destroying", spec.vnpu_id, key
            )
            ours = False
        if ours:
            try:
                await self._drv("destroy", self.driver.destroy_vnpu, spec.chip, spec.vnpu_id)
            except NotFoundError:
                pass
            except DriverError as exc:
                await self._note_deferred(obj, alloc, exc)
                raise RetryLater(f"destroying vNPU {spec.vnpu_id} deferred: {exc}") from exc
            self.vnpus.pop(spec.vnpu_id, None)
            self._abandoned.discard(spec.vnpu_id)
            self._mark_dirty()
            # A VNPUNode write in flight may carry a status built before this
            # destroy. Landing after the finalizer's removal it would list the
            # vNPU as present after its allocation went, and the operator would
            # count it again until our next write. So the finalizer goes once
            # any write begun before the destroy has landed.
            async with self._publish_lock:
                pass
        self.owned.discard(spec.vnpu_id)
        self.gc.forget(spec.vnpu_id)
        cdi.remove(self.settings.cdi_dir, self.node, spec.vnpu_id)
        await failpoint("before-finalizer")
        await self.api.remove_finalizer(obj)
        self._deferred_noted.discard(key)
        self.metrics.released(self.node)

    async def _note_deferred(
        self, obj: dict[str, Any], alloc: VNPUAllocation, exc: DriverError
    ) -> None:
        """Once per allocation: phase Releasing and an Event saying why."""
        key = key_of(obj)
        if key in self._deferred_noted:
            return
        self._deferred_noted.add(key)
        in_use = isinstance(exc, InUseError)
        msg = (
            f"vNPU {alloc.spec.vnpu_id} is still open in a container; destroy retried until "
            "it is released"
            if in_use
            else f"destroying vNPU {alloc.spec.vnpu_id} failed, retrying: {exc}"
        )
        await self.api.patch_allocation_status(
            obj,
            {"phase": names.PHASE_RELEASING, "message": msg},
        )
        await self.api.event(
            obj,
            type_="Normal" if in_use else "Warning",
            reason=names.REASON_DESTROY_DEFERRED if in_use else exc.reason,
            message=msg,
            node=self.node,
        )

    def _being_freed(self, chip: int) -> bool:
        """Whether one of our vNPUs on `chip` is on its way out: its allocation is
        being deleted, or it has none left (the garbage collector's)."""
        live = self._live_vnpu_ids()
        return any(
            v.chip == chip and v.id in self.owned and v.id not in live for v in self.vnpus.values()
        )

    def _live_vnpu_ids(self, *, exclude: str | None = None, served: bool = False) -> set[int]:
        """The vNPU ids of the allocations not being deleted, but `exclude`'s;
        `served`: only those the agent said Ready."""
        return {
            obj.get("spec", {}).get("vnpuId")
            for key, obj in self.allocs.items()
            if key != exclude
            and not obj.get("metadata", {}).get("deletionTimestamp")
            and (not served or (obj.get("status") or {}).get("phase") == names.PHASE_READY)
        }

    # -- periodic work -----------------------------------------------------

    async def resync(self) -> None:
        await self.refresh_driver()
        if not self.driver_ok:
            self._mark_dirty()
            return
        # Compared with what the last resync acted on, not with self.chips,
        # which publish() refreshes in between.
        health_changed = {
            c.index for c in self.chips if self._health_seen.get(c.index, True) != c.healthy
        }
        self._health_seen = {c.index: c.healthy for c in self.chips}
        for key, obj in list(self.allocs.items()):
            spec = obj.get("spec", {})
            if obj.get("metadata", {}).get("deletionTimestamp"):
                continue
            missing = spec.get("vnpuId") not in self.vnpus
            phase = obj.get("status", {}).get("phase")
            if (missing and phase != names.PHASE_FAILED) or spec.get("chip") in health_changed:
                self.queue.add(key)
        await self._collect_orphans()
        self._mark_dirty()

    def referenced_ids(self) -> set[int]:
        ids = set()
        for obj in self.allocs.values():
            vnpu_id = obj.get("spec", {}).get("vnpuId")
            if isinstance(vnpu_id, int):
                ids.add(vnpu_id)
        return ids

    async def _collect_orphans(self) -> None:
        decision = self.gc.evaluate(
            list(self.vnpus.values()),
            self.referenced_ids(),
            self.owned.snapshot(),
            now=self.clock(),
            synced=self.synced(),
        )
        for _vnpu in decision.kept_foreign:
            self.metrics.gc_action(self.node, "kept-foreign")
        for vnpu in decision.destroy:
            reason = "orphan" if vnpu.id in self.owned else "foreign"
            try:
                await self._drv("destroy", self.driver.destroy_vnpu, vnpu.chip, vnpu.id)
            except NotFoundError:
                pass
            except DriverError as exc:
                log.warning("GC of vNPU %s on %s failed: %s", vnpu.id, self.node, exc)
                self.metrics.gc_action(self.node, f"{reason}-failed")
                continue
            log.info("collected %s vNPU %s (%s) on %s", reason, vnpu.id, vnpu.template, self.node)
            self.metrics.gc_action(self.node, reason)
            self.vnpus.pop(vnpu.id, None)
            self._abandoned.discard(vnpu.id)
            self.owned.discard(vnpu.id)
            self.gc.forget(vnpu.id)
            cdi.remove(self.settings.cdi_dir, self.node, vnpu.id)

    # -- inventory ---------------------------------------------------------

    def _mark_dirty(self, at_least: float = 0.0) -> None:
        """Publishes soon, at most once per min interval (coalescing bursts)."""
        if self._publish_pending is not None:
            return
        wait = max(
            at_least,
            self._last_publish + self.settings.inventory_min_interval_seconds - self.clock(),
        )
        loop = asyncio.get_running_loop()
        self._publish_pending = loop.call_later(wait, self._spawn_publish)

    def _spawn_publish(self) -> None:
        self._publish_pending = None
        task = asyncio.get_running_loop().create_task(self.publish(), name=self.node)
        task.add_done_callback(_log_publish_error)

    async def publish(self) -> None:
        # One write at a time: its answer is what later events compare with.
        async with self._publish_lock:
            await self._publish()

    async def _publish(self) -> None:
        if self.driver_ok:
            with contextlib.suppress(DriverError):
                self.chips = await self._drv("list_chips", self.driver.list_chips)
        if self.driver_ok:
            await self._tell_chip_health()
        status = build_status(
            driver=self.driver.name,
            chips=self.chips,
            templates=self.templates,
            vnpus=self.vnpus,
            allocations=self.allocs.values(),
            conditions=self._node_conditions,
            cordoned=cordoned_chips(self._mirror.observed),
        )
        if status == self._last_status and not self._force_publish:
            return
        restore, missing = self._mirror.needs_restore_write(), self._mirror.missing()
        if not (self._force_publish or restore) and self._only_restated(status):
            return
        self._last_publish = self.clock()
        self._mirror.write_started()
        try:
            if restore:
                obj = await self.api.restore_node(self.node, status, exists=not missing)
            else:
                obj = await self.api.publish_node_status(self.node, status)
        except BaseException as exc:
            self._mirror.write_failed()
            if isinstance(exc, Exception):
                # Its outcome is unknown (a 504 may have been applied): write
                # the status again, whatever the server holds, after a backoff
                # rather than at the next resync.
                self._force_publish = True
                self._mark_dirty(self._publish_backoff.delay(self._mirror.failures))
            raise
        self._last_status = status
        self._force_publish = False
        self._mirror.write_answered(obj, self.clock())

    def _only_restated(self, status: dict[str, Any]) -> bool:
        """True, and the write put off, when `status` differs from the last
        one written only in what the allocations already say (inventory.
        only_restates: vNPUs they own added) and the last write is younger
        than the settle interval. A node filling up then writes once per
        interval instead of once per vNPU; a quiet one at once. A VNPUNode
        status write costs the API server about four times an allocation's
        (a 5 KB object validated whole on every write)."""
        if self._last_status is None or not only_restates(self._last_status, status):
            return False
        due = self._last_publish + self.settings.inventory_settle_seconds - self.clock()
        if due <= 0:
            return False
        self._mark_dirty(at_least=due)
        return True

    async def _tell_chip_health(self) -> None:
        """The VNPUNode's ChipsHealthy condition, and an Event on the VNPUNode
        when a chip turns unhealthy or healthy again. The operator places
        nothing new on an unhealthy chip; vNPUs there stay (their allocations
        carry a Healthy condition of their own). Only transitions write."""
        sick = [c.index for c in sorted(self.chips, key=lambda c: c.index) if not c.healthy]
        self._node_conditions = set_condition(
            self._node_conditions,
            names.COND_CHIPS_HEALTHY,
            "False" if sick else "True",
            names.REASON_CHIP_UNHEALTHY if sick else names.REASON_CHIP_HEALTHY,
            f"unhealthy chips: {', '.join(map(str, sick))}; no new vNPU is placed there"
            if sick
            else "every chip reports healthy",
        )
        health = {c.index: c.healthy for c in self.chips}
        observed_meta = (self._mirror.observed or {}).get("metadata") or {}
        involved = {
            "apiVersion": names.API_VERSION,
            "kind": names.NODE_KIND,
            "metadata": {"name": self.node, "uid": observed_meta.get("uid")},
        }
        for index, healthy in sorted(health.items()):
            if self._node_health_told.get(index, True) == healthy:
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
        self._node_health_told = health

    # -- own VNPUNode ------------------------------------------------------

    async def on_node_event(self, kind: str, obj: dict[str, Any]) -> None:
        """An event of the VNPUNode watch for this node (DELETED also when
        the object lost the label the watch selects on)."""
        self._mirror.on_event(kind, obj)
        published = self._mirror.published
        if published is not None and _echo_of(published) != cordoned_chips(self._mirror.observed):
            # An admin changed spec.cordonedChips: the status echoes it.
            self._mark_dirty()
        if self._mirror.differs() and self._restore_pending is None:
            self._restore_pending = asyncio.get_running_loop().call_later(
                RESTORE_SETTLE_SECONDS, self._check_restore
            )

    def _check_restore(self) -> None:
        self._restore_pending = None
        loop = asyncio.get_running_loop()
        if self._mirror.failures:
            # Our last write failed and its retry is due: the difference may
            # be that write, applied after all, and the retry writes anyway.
            return
        if self._publish_lock.locked() or self._mirror.echo_pending(self.clock()):
            # A write of ours is in flight, or the watch has not caught up
            # with our last one: what it shows may be older; look again.
            self._restore_pending = loop.call_later(RESTORE_SETTLE_SECONDS, self._check_restore)
            return
        what = self._mirror.differs()
        if what is None:
            return
        log.warning(
            "VNPUNode %s changed by someone else (%s); restoring it "
            "(resourceVersion %s, our last write %s)",
            self.node,
            what,
            self._mirror.last_rv,
            self._mirror.written_rv,
        )
        self.metrics.node_restored(self.node, what)
        self._force_publish = True
        self._mark_dirty()


def _echo_of(status: dict[str, Any]) -> list[int]:
    """The cordoned chips a published status echoes."""
    text = status.get("cordoned") or ""
    return [int(i) for i in text.split(",") if i.isdigit()]


def _log_publish_error(task: asyncio.Task[None]) -> None:
    if task.cancelled() or (exc := task.exception()) is None:
        return
    # describe: an ApiException's text carries every response header.
    why = describe(exc)
    log.error("VNPUNode %s: status write failed (%s); written again shortly", task.get_name(), why)

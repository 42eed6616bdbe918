"""Serving the node's allocations: each one's vNPU created (or adopted),
reported Ready or Failed, and destroyed before its finalizer goes.

Driven by watch events through a queue. On one node the decisions and
driver calls of one allocation at a time (`_serial`); the write each trip
ends with (its Ready status, or its finalizer's removal) goes out after the
node is let go. Held, a pod's second vNPU waited for its first one's status
write, and a create for a release's finalizer removal: one API round trip
each, which under load is most of the step. Each trip through the helpers
starts from one `AllocationRecord`: the key, the raw object (what patches and
Events name) and the parsed model, read once.

Invariants kept here:
- a vNPU whose allocation exists and is not being deleted is never
  destroyed (the release path also refuses when another live allocation
  references the id);
- a DRA allocation's vNPU is not destroyed while its claim is still
  prepared on the node (the kubelet has not unprepared it: its containers
  may still run); the kubelet plugin's Unprepare queues it again;
- the allocation finalizer is removed only after the vNPU is gone;
- no allocation write happens when nothing changed (the echo of our own
  Ready write is not reconciled again).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from vnpu_agent import cdi
from vnpu_agent.allocation import AllocationView, chip_of, is_deleting, phase_of, vnpu_id_of
from vnpu_agent.config import AgentSettings
from vnpu_agent.drivers.base import (
    VNPU,
    CapacityError,
    DriverError,
    DriverFailure,
    InUseError,
    InvalidIdError,
    NotFoundError,
)
from vnpu_agent.driverview import DriverView
from vnpu_agent.failpoints import failpoint
from vnpu_agent.kubeapi import AgentApi
from vnpu_agent.metrics import AgentMetrics
from vnpu_agent.publisher import NodePublisher
from vnpu_common.kube.backoff import Backoff
from vnpu_common.kube.informer import key_of
from vnpu_common.kube.workqueue import RetryLater, WorkQueue
from vnpu_common.wire import names
from vnpu_common.wire.models import VNPUAllocation, find_condition, set_condition
from vnpu_common.wire.types import Raw

# The node agent's log, as before it was split in modules (its lines unchanged).
log = logging.getLogger(__name__)

# Transient driver failures are retried this many times before the
# allocation stays Failed (the operator then places the pod elsewhere).
MAX_CREATE_ATTEMPTS = 5

# The write a trip ends with, made once the node's other allocations may go on.
Report = Callable[[], Awaitable[None]]


class PreparedClaims(Protocol):
    """The kubelet plugin's prepared claims (vnpu_agent/dra/prepare.py)."""

    def holds(self, claim_uid: str) -> str | None: ...

    def prepared_ids(self) -> set[int]: ...

    def on_unprepared(self, callback: Callable[[str], None]) -> None: ...


@dataclass(frozen=True, slots=True)
class AllocationRecord:
    """One allocation on one trip through the helpers."""

    key: str  # namespace/name, the work queue's key
    obj: Raw  # as the watch delivered it: what patches and Events name
    model: VNPUAllocation  # obj, parsed


class AllocationServer:
    def __init__(
        self,
        node: str,
        view: DriverView,
        publisher: NodePublisher,
        allocs: dict[str, Raw],
        api: AgentApi,
        settings: AgentSettings,
        metrics: AgentMetrics,
    ) -> None:
        self.node = node
        self.view = view
        self.publisher = publisher
        self.allocs = allocs
        self.api = api
        self.settings = settings
        self.metrics = metrics
        # The queue keeps one allocation's trips apart; `_serial` keeps the
        # node's decisions and driver calls one allocation at a time. A key's
        # consecutive failures (queue.failures) count create attempts and say
        # whether a Failed status is final or a retry is pending.
        self.queue = WorkQueue(
            self.reconcile,
            name=f"allocation@{node}",
            backoff=Backoff(base=1.0, cap=settings.retry_max_seconds),
            expected=(ApiException,),
        )
        self._serial = asyncio.Lock()
        self._started = False
        self._deferred_noted: set[str] = set()
        # Per allocation, the resourceVersion our last Ready write made: its
        # watch event is the echo of a state already reconciled, and queueing
        # it again would only find nothing to do (a quarter of the events).
        self._echoes: dict[str, str] = {}
        # On a DRA node, the claims the kubelet has prepared (use_prepared_claims).
        self.prepared: PreparedClaims | None = None

    def use_prepared_claims(self, prepared: PreparedClaims) -> None:
        """Defers the destroy of a claim's vNPU while `prepared` says the claim
        is prepared, and re-checks when it is unprepared."""
        self.prepared = prepared
        prepared.on_unprepared(self._claim_unprepared)

    def _claim_unprepared(self, claim_uid: str) -> None:
        for key, obj in list(self.allocs.items()):
            a = AllocationView.of(obj)
            if a.claim_uid == claim_uid and a.deleting:
                self.queue.add(key)

    # -- watch events --------------------------------------------------------

    async def on_event(self, kind: str, obj: Raw) -> None:
        key = key_of(obj)
        echo = self._echoes.pop(key, None)
        if kind == "DELETED":
            gone = self.allocs.pop(key, None) or obj
            vnpu_id = AllocationView.of(gone).id
            if (
                vnpu_id is not None
                and vnpu_id in self.view.vnpus
                and vnpu_id not in self.referenced_ids()
            ):
                # Gone while its vNPU exists (its finalizer removed by someone
                # else, or before the destroy): never handed to a new allocation.
                self.view.abandoned.add(vnpu_id)
            self.queue.forget(key)
            self._deferred_noted.discard(key)
            self.publisher.mark_dirty()
            return
        self.allocs[key] = obj
        if echo is not None and echo == (obj.get("metadata") or {}).get("resourceVersion"):
            return
        if self._started:
            self.queue.add(key)

    def start(self) -> None:
        """Allocations seen before the driver was read wait until now."""
        self._started = True
        for key in list(self.allocs):
            self.queue.add(key)

    def requeue(self, health_changed: Iterable[int]) -> None:
        """Queues the live allocations whose vNPU is missing (reboots,
        vanished devices) and those on a chip whose health changed."""
        changed = set(health_changed)
        for key, obj in list(self.allocs.items()):
            if is_deleting(obj):
                continue
            missing = vnpu_id_of(obj) not in self.view.vnpus
            if (missing and phase_of(obj) != names.PHASE_FAILED) or chip_of(obj) in changed:
                self.queue.add(key)

    def referenced_ids(self) -> set[int]:
        """The ids the orphan collector must leave: those an allocation names,
        and on a DRA node those a prepared claim names (its containers may
        run after its allocation went, a force-deleted pod's for example)."""
        ids = {i for obj in self.allocs.values() if (i := vnpu_id_of(obj)) is not None}
        if self.prepared is not None:
            ids |= self.prepared.prepared_ids()
        return ids

    # -- what the kubelet plugin asks before a Prepare (dra/prepare.DeviceGuard) --

    def holders(self, vnpu_id: int, claim_uid: str) -> list[str]:
        """The node's allocations other than `claim_uid`'s that name `vnpu_id`,
        live or being released (until its finalizer goes, a released
        allocation's vNPU may still be in a container)."""
        return sorted(key for key, a in self._naming(vnpu_id) if a.claim_uid != claim_uid)

    def _naming(self, vnpu_id: int) -> Iterator[tuple[str, AllocationView]]:
        """This node's allocations that name `vnpu_id`, whatever their state."""
        for key, obj in self.allocs.items():
            a = AllocationView.of(obj)
            if a.id == vnpu_id and a.node == self.node:
                yield key, a

    async def present(self, vnpu_id: int, chip: int, template: str) -> bool:
        """Whether the driver has the vNPU as that chip and template; the chip
        is read again before saying no (the view may lag a reboot's replay)."""
        vnpu = self.view.vnpus.get(vnpu_id)
        if vnpu is None:
            await self.view.reread_chip(chip)
            vnpu = self.view.vnpus.get(vnpu_id)
        return vnpu is not None and (vnpu.chip, vnpu.template) == (chip, template)

    # -- reconcile one allocation -------------------------------------------

    async def reconcile(self, key: str) -> None:
        obj = self.allocs.get(key)
        if obj is None:
            return
        try:
            model = VNPUAllocation.model_validate(obj)
        except ValidationError as exc:
            # The CRD schema should make this impossible; never crash on it.
            log.error("allocation %s is malformed: %s", key, exc)
            return
        if model.spec.node_name != self.node:
            return
        rec = AllocationRecord(key, obj, model)
        async with self._serial:
            if model.metadata.deletion_timestamp is not None:
                report = await self._release(rec)
            else:
                report = await self._ensure(rec)
        if report is not None:
            await report()

    async def _ensure(self, rec: AllocationRecord) -> Report | None:
        """The allocation's vNPU made or adopted; returns its Ready write."""
        spec, status = rec.model.spec, rec.model.status
        if status.phase == names.PHASE_FAILED and not self.queue.failures(rec.key):
            return None  # a final verdict on an immutable spec; the operator re-places
        existing = self.view.vnpus.get(spec.vnpu_id)
        if existing is not None and (existing.template, existing.chip) != (
            spec.template,
            spec.chip,
        ):
            await self._fail(
                rec,
                names.REASON_MISMATCH,
                f"vNPU {spec.vnpu_id} already exists on chip {existing.chip} with template "
                f"{existing.template}; this allocation wants chip {spec.chip}, template "
                f"{spec.template}",
            )
            return None
        if existing is not None and status.phase != names.PHASE_READY:
            held = self._held_elsewhere(rec.key, existing)
            if held is not None:
                await self._refuse_held(rec, held)
                return None
        reason = names.REASON_ADOPTED if existing is not None else names.REASON_CREATED
        if existing is None:
            self.view.owned.add(spec.vnpu_id)
            try:
                vnpu = await self.view.call(
                    "create", self.view.driver.create_vnpu, spec.chip, spec.template, spec.vnpu_id
                )
            except DriverError as exc:
                return await self._after_failed_create(rec, exc)
            self.view.added(vnpu)
            # Owned by this allocation: a write put off by the settle
            # interval carries it, however late.
            self.publisher.mark_dirty(restates=True)
            await failpoint("after-create")
            if status.phase == names.PHASE_READY:
                reason = names.REASON_RECREATED
                await self.api.event(
                    rec.obj,
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
        return functools.partial(self._write_ready, rec, reason)

    def _held_elsewhere(self, key: str, vnpu: VNPU) -> str | None:
        """Why the existing `vnpu` may not be handed to allocation `key`, which
        has not been served yet; None when adopting it is safe (the agent made
        it for this allocation and crashed before saying Ready, or a reboot
        replayed it: no container has it open, nothing else names it)."""
        others = sorted(k for k, _ in self._naming(vnpu.id) if k != key)
        if others:
            return f"vNPU {vnpu.id} is still held by allocation {', '.join(others)}"
        if vnpu.in_use:
            return f"vNPU {vnpu.id} exists and is open in a container"
        if vnpu.id in self.view.abandoned:
            return f"vNPU {vnpu.id} was left behind by an allocation that went without its destroy"
        return None

    async def _refuse_held(self, rec: AllocationRecord, why: str) -> None:
        """Retries while the holder may let go (a deferred destroy finishing),
        then fails the allocation: the operator places the pod anew."""
        attempt = self.queue.failures(rec.key) + 1
        msg = f"{why}; not handed to a new allocation"
        if attempt < MAX_CREATE_ATTEMPTS:
            raise RetryLater(f"{msg} (attempt {attempt} of {MAX_CREATE_ATTEMPTS})")
        log.warning("allocation %s: %s", rec.key, msg)
        await self._fail(rec, names.REASON_VNPU_HELD, msg)

    async def _after_failed_create(self, rec: AllocationRecord, exc: DriverError) -> Report | None:
        spec = rec.model.spec
        # A create that failed mid-way may have left the vNPU behind; keep it
        # marked as ours (so GC may collect it) only if it exists.
        await self.view.reread_chip(spec.chip)
        if spec.vnpu_id not in self.view.vnpus:
            self.view.owned.discard(spec.vnpu_id)
        elif isinstance(exc, InvalidIdError):
            # The id appeared since our last look (made by hand, or by a
            # create that failed mid-way): adopt it or report the mismatch.
            return await self._ensure(rec)
        msg = f"creating vNPU {spec.vnpu_id} failed: {exc}"
        attempt = self.queue.failures(rec.key) + 1
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
        await self._fail(rec, exc.reason, msg)
        if type(exc) is DriverFailure and attempt < MAX_CREATE_ATTEMPTS:
            raise RetryLater(f"{msg} (attempt {attempt} of {MAX_CREATE_ATTEMPTS})")
        return None

    async def _fail(self, rec: AllocationRecord, reason: str, msg: str) -> None:
        status, generation = rec.model.status, rec.model.metadata.generation
        conds = set_condition(status.conditions, names.COND_READY, "False", reason, msg, generation)
        if status.phase == names.PHASE_FAILED and status.message == msg:
            return
        await self.api.patch_allocation_status(
            rec.obj,
            {
                "phase": names.PHASE_FAILED,
                "message": msg,
                "observedGeneration": generation,
                "conditions": [c.to_api() for c in conds],
            },
        )
        await self.api.event(rec.obj, type_="Warning", reason=reason, message=msg, node=self.node)

    async def _write_ready(self, rec: AllocationRecord, reason: str) -> None:
        spec, status = rec.model.spec, rec.model.status
        generation = rec.model.metadata.generation
        healthy = self.view.chip_healthy(spec.chip)
        conds = set_condition(
            status.conditions,
            names.COND_READY,
            "True",
            reason,
            f"vNPU {spec.vnpu_id} ({spec.template}) on chip {spec.chip}",
            generation,
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
            generation,
        )
        desired = {
            "phase": names.PHASE_READY,
            "devicePath": names.device_path(spec.vnpu_id),
            "observedGeneration": generation,
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
            written = await self.api.patch_allocation_status(rec.obj, desired)
            if written:
                self._echoes[rec.key] = written
        old_health = find_condition(status.conditions, names.COND_HEALTHY)
        if old_health is not None and (old_health.status == "True") != healthy:
            await self.api.event(
                rec.obj,
                type_="Normal" if healthy else "Warning",
                reason=names.REASON_CHIP_HEALTHY if healthy else names.REASON_CHIP_UNHEALTHY,
                message=f"chip {spec.chip} of {self.node} is "
                f"{'healthy again' if healthy else 'unhealthy'}; vNPU {spec.vnpu_id} "
                f"{'usable' if healthy else 'may not work'}",
                node=self.node,
            )

    # -- release one allocation ---------------------------------------------

    async def _release(self, rec: AllocationRecord) -> Report | None:
        """The allocation's vNPU destroyed; returns its finalizer's removal."""
        spec = rec.model.spec
        if names.ALLOCATION_FINALIZER not in rec.model.metadata.finalizers:
            return None
        claim = spec.claim
        held = (
            self.prepared.holds(claim.uid)
            if claim is not None and self.prepared is not None
            else None
        )
        if claim is not None and held is not None:
            msg = (
                f"claim {rec.model.metadata.namespace}/{claim.name} is still prepared on "
                f"{self.node} ({held}; its containers may still run); vNPU {spec.vnpu_id} is "
                "destroyed once the kubelet unprepares it"
            )
            await self._note_deferred_msg(rec, msg, names.REASON_DESTROY_DEFERRED, "Normal")
            raise RetryLater(msg)
        await self.view.reread_chip(spec.chip)
        vnpu = self.view.vnpus.get(spec.vnpu_id)
        ours = vnpu is not None and (vnpu.template, vnpu.chip) == (spec.template, spec.chip)
        # Only a live allocation the agent has served holds the vNPU: one not
        # yet served that names it too is never handed it (_held_elsewhere)
        # and gets a vNPU of its own once this one is destroyed.
        if ours and spec.vnpu_id in self._live_vnpu_ids(exclude=rec.key, served=True):
            log.error(
                "vNPU %s of %s is also held by a live allocation; not destroying",
                spec.vnpu_id,
                rec.key,
            )
            ours = False
        if ours:
            try:
                await self.view.call(
                    "destroy", self.view.driver.destroy_vnpu, spec.chip, spec.vnpu_id
                )
            except NotFoundError:
                pass
            except DriverError as exc:
                await self._note_deferred(rec, exc)
                raise RetryLater(f"destroying vNPU {spec.vnpu_id} deferred: {exc}") from exc
            self.view.removed(spec.vnpu_id)
            self.publisher.mark_dirty()
        self.view.disowned(spec.vnpu_id)
        cdi.remove(self.settings.cdi_dir, self.node, spec.vnpu_id)
        return functools.partial(self._remove_finalizer, rec)

    async def _remove_finalizer(self, rec: AllocationRecord) -> None:
        # A VNPUNode write in flight may still list the vNPU under this
        # allocation and land after the finalizer's removal: the operator reads
        # a vNPU listed under a gone allocation's name as destroyed, so the
        # removal need not wait for it (DECISIONS, "Node agent").
        await failpoint("before-finalizer")
        await self.api.remove_finalizer(rec.obj)
        self._deferred_noted.discard(rec.key)
        self.metrics.released(self.node)

    async def _note_deferred(self, rec: AllocationRecord, exc: DriverError) -> None:
        vnpu_id = rec.model.spec.vnpu_id
        in_use = isinstance(exc, InUseError)
        msg = (
            f"vNPU {vnpu_id} is still open in a container; destroy retried until it is released"
            if in_use
            else f"destroying vNPU {vnpu_id} failed, retrying: {exc}"
        )
        reason = names.REASON_DESTROY_DEFERRED if in_use else exc.reason
        await self._note_deferred_msg(rec, msg, reason, "Normal" if in_use else "Warning")

    async def _note_deferred_msg(
        self, rec: AllocationRecord, msg: str, reason: str, type_: str
    ) -> None:
        """Once per allocation: phase Releasing and an Event saying why."""
        if rec.key in self._deferred_noted:
            return
        self._deferred_noted.add(rec.key)
        await self.api.patch_allocation_status(
            rec.obj,
            {"phase": names.PHASE_RELEASING, "message": msg},
        )
        await self.api.event(rec.obj, type_=type_, reason=reason, message=msg, node=self.node)

    def _being_freed(self, chip: int) -> bool:
        """Whether one of our vNPUs on `chip` is on its way out: its allocation is
        being deleted, or it has none left (the garbage collector's)."""
        live = self._live_vnpu_ids()
        return any(
            v.chip == chip and v.id in self.view.owned and v.id not in live
            for v in self.view.vnpus.values()
        )

    def _live_vnpu_ids(self, *, exclude: str | None = None, served: bool = False) -> set[int]:
        """The vNPU ids of the allocations not being deleted, but `exclude`'s;
        `served`: only those the agent said Ready."""
        return {
            vnpu_id
            for key, obj in self.allocs.items()
            if key != exclude
            and not is_deleting(obj)
            and (not served or phase_of(obj) == names.PHASE_READY)
            and (vnpu_id := vnpu_id_of(obj)) is not None
        }

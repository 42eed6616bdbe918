"""The controller: caches fed by the watch handlers, and the reconcile that
drives each pod through `lifecycle.decide`.

Handlers only record objects and `kick` pods into one keyed work queue
(vnpu_common.kube.workqueue): one reconcile per pod at a time, so steps for one
pod never interleave. Placement decides and books in one synchronous ledger
call, so pods placed concurrently never share capacity. Nothing polls: pods
are reconciled when their pod or allocation objects change, waiting pods
when capacity may have grown, and after an API error with backoff.

What the operator remembers of a pod beyond the objects is one `PodState`
record; writes it sent and has not seen come back are `Expectations`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common.kube.backoff import Backoff
from vnpu_common.kube.informer import key_of
from vnpu_common.kube.rawcall import describe
from vnpu_common.kube.workqueue import WorkQueue
from vnpu_common.wire import names
from vnpu_common.wire.types import Raw
from vnpu_operator.admission import OfferedTemplates
from vnpu_operator.advertise import Advertiser
from vnpu_operator.config import OperatorSettings
from vnpu_operator.inventories import Inventories
from vnpu_operator.kubeapi import OperatorApi
from vnpu_operator.leaving import Leaving
from vnpu_operator.lifecycle import (
    AllocView,
    Step,
    StepKind,
    containers_stopped,
    decide,
    hand_edits,
    has_finalizer,
    is_deleting,
    is_gated,
    is_terminal,
    requested_count,
    unservable,
)
from vnpu_operator.metrics import OperatorMetrics
from vnpu_operator.notices import Notices
from vnpu_operator.placement import (
    Allocation,
    InvalidAllocationError,
    Ledger,
)
from vnpu_operator.podstate import Expectations, PodState, Write
from vnpu_operator.slim import allocation_pod_uid, phase_of, resource_version, slim_pod, uid_of
from vnpu_operator.steps.pin import Pinner
from vnpu_operator.steps.place import Placer
from vnpu_operator.steps.preempt import Preemption
from vnpu_operator.takeover import ReleaseFirst
from vnpu_operator.waiting import WaitingLine

log = logging.getLogger(__name__)

# What fills the caches: the informers of VNPUNodes, Nodes, pods and
# allocations (watches.py). Nothing is placed or released before all of them
# have listed once.
SOURCES = ("vnpunodes", "nodes", "pods", "allocations")


class Controller:
    def __init__(
        self,
        api: OperatorApi,
        settings: OperatorSettings,
        metrics: OperatorMetrics,
        *,
        ledger: Ledger,
        notices: Notices,
        expect: Expectations,
        inventories: Inventories,
        advertiser: Advertiser,
        waiting_line: WaitingLine,
        preemption: Preemption,
        placer: Placer,
        pinner: Pinner,
        leaving: Leaving,
        pods: dict[str, Raw],
        allocs: dict[str, Raw],
        states: dict[str, PodState],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Built by wiring.build_pods, with only the parts it drives. `pods`,
        `allocs`: the caches, slim copies of what the watches deliver (by UID,
        by key); `states`: what the operator remembers of each pod."""
        self.api = api
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.ledger = ledger
        self.notices = notices
        self.expect = expect
        self.inventories = inventories
        self.advertiser = advertiser
        self.waiting_line = waiting_line
        self.preemption = preemption
        self.placer = placer
        self.pinner = pinner
        self.leaving = leaving
        self.pods = pods
        self.allocs = allocs
        self.states = states
        self.allocs_by_pod: dict[str, set[str]] = {}
        self.queue = WorkQueue(
            self.reconcile,
            name="pod",
            backoff=Backoff(base=0.25, cap=settings.retry_max_seconds),
            describe=describe,
            expected=(ApiException,),
        )
        self.synced = False
        # Set with `synced` (the leader election waits for it).
        self.synced_event = asyncio.Event()
        # Whether this replica leads (leader.Leadership.leading, set by the
        # wiring): only the leader reconciles; every replica keeps the caches.
        self.leading: Callable[[], bool] = lambda: True
        self._listed: set[str] = set()
        self.release_first = ReleaseFirst(clock)
        # Pods that left the pod watch with our finalizer on: someone took
        # their label off (watches.py); the leader puts it back.
        self.unlabelled: set[str] = set()
        self._release_first_timer: asyncio.TimerHandle | None = None
        self._offered: tuple[int, OfferedTemplates] | None = None
        self._side_tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------ reading

    def state(self, uid: str) -> PodState:
        state = self.states.get(uid)
        if state is None:
            state = self.states[uid] = PodState(seen_at=self.clock())
        return state

    def waiting(self) -> list[str]:
        """Pods waiting for capacity, oldest first."""
        return self.waiting_line.order()

    def is_synced(self) -> bool:
        return self.synced

    def is_active(self) -> bool:
        """Synced and leading: this replica reconciles and writes."""
        return self.synced and self.leading()

    def offered_templates(self) -> OfferedTemplates | None:
        """What the webhook checks requests against; None until synced (it
        then skips the cluster checks rather than refuse on a partial view)."""
        if not self.synced:
            return None
        epoch = self.ledger.catalog_epoch
        if self._offered is None or self._offered[0] != epoch:
            self._offered = (
                epoch,
                OfferedTemplates(
                    self.ledger.offered(),
                    self.ledger.template_sizes(),
                    self.ledger.dra_templates(),
                ),
            )
        return self._offered[1]

    # ------------------------------------------------------------ feeding

    def listed(self, source: str) -> None:
        """`source` (one of SOURCES) has listed every object of its kinds; the
        caches are complete once all have."""
        self._listed.add(source)
        if self._listed.issuperset(SOURCES):
            self.mark_synced()

    def mark_synced(self) -> None:
        """Every cache holds a full listing: start reconciling everything
        seen so far (kicks before this point were no-ops)."""
        if not self.synced:
            self.synced = True
            # A restart forgot the deletions whose vNPUs the nodes still list.
            self.ledger.seed_released()
            self.synced_event.set()
            self._kick_all()
            log.info(
                "synced: %d node(s), %d allocation(s), %d pod(s)",
                len(self.inventories.vnpunodes),
                len(self.allocs),
                len(self.pods),
            )

    def _kick_all(self) -> None:
        if not self.is_active():
            return
        self._release_first()
        # Pods that wait on us first (to be placed, released or finished),
        # then the rest: at 10000 live pods, a takeover queued the pods
        # created during the outage behind every running pod's reconcile
        # (bench-shared, 2 cores: 1.5 s from the takeover to their placement).
        # sorted() is stable: each group stays in uid order.
        uids = sorted(set(self.pods) | set(self.allocs_by_pod))
        for uid in sorted(uids, key=lambda uid: not self._waits_on_us(uid)):
            self.kick(uid)
        self.advertiser.all()

    def _waits_on_us(self, uid: str) -> bool:
        pod = self.pods.get(uid)
        return pod is None or is_gated(pod) or is_deleting(pod) or is_terminal(pod)

    def _release_first(self) -> None:
        """Reconciling begins: placements in a namespace wait for the
        releases due there now (takeover.py)."""
        due = [key for key, obj in self.allocs.items() if self._due(obj)]
        self.release_first.start(due)
        if self._release_first_timer is not None:
            self._release_first_timer.cancel()
            self._release_first_timer = None
        if not self.release_first.active:
            return
        log.info("releasing %d allocation(s) before placing in their namespace(s)", len(due))
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._release_first_timer = loop.call_later(
            self.release_first.bound, self._release_first_expired
        )

    def _release_first_expired(self) -> None:
        self._release_first_timer = None
        for uid in sorted(self.release_first.expire()):
            self.kick(uid)

    def _due(self, obj: Raw) -> bool:
        """Whether the allocation's release is due or under way, by an agent
        that will do it: being deleted, or its pod gone or ended with its
        containers stopped. On a node no agent serves, nothing destroys it."""
        node = str((obj.get("spec") or {}).get("nodeName") or "")
        if not self._node_served(node):
            return False
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            return True
        pod = self.pods.get(allocation_pod_uid(obj))
        if pod is None:
            return True
        return (is_deleting(pod) or is_terminal(pod)) and containers_stopped(
            pod, node_gone=self._node_gone(pod)
        )

    def lead(self) -> None:
        """This replica became the leader: its caches are warm (synced as a
        standby), so it reconciles everything seen so far, as a restarted
        operator does once synced."""
        if self.synced:
            log.info(
                "leading: reconciling %d pod(s), %d allocation(s)",
                len(self.pods), len(self.allocs),
            )  # fmt: skip
        self._kick_all()

    def follow(self) -> None:
        """This replica stopped leading: nothing more is reconciled (queued
        keys run and return at once; writes in flight are fenced)."""
        self.placer.capacity_grew()
        self.release_first.stop()

    def pod_event(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        """`obj` may be the watch's own object: only a slim copy is kept."""
        uid = uid_of(obj)
        if not uid:
            return
        if event_type == "DELETED":
            self.pods.pop(uid, None)
            self.unlabelled.discard(uid)
            self.expect.seen(Write.UNGATE, uid)
            self.expect.seen(Write.UNFINALIZE, uid)
            self.preemption.forget(uid)
            freed = self.leaving.pod_event(uid, None)
        else:
            pod = slim_pod(obj)
            if uid not in self.pods:
                # First sight (after a restart, the listing): a claim an
                # earlier run wrote is booked before anything is placed.
                self.preemption.restore(pod)
            self.pods[uid] = pod
            if not is_gated(pod):
                self.expect.seen(Write.UNGATE, uid)
            if not has_finalizer(pod):
                self.expect.seen(Write.UNFINALIZE, uid)
            freed = self.leaving.pod_event(uid, pod)
        for held in sorted(freed):
            self.kick(held)
        self.kick(uid)

    def pod_unlabelled(self, uid: str) -> None:
        """The pod watch dropped a pod that cannot be gone: it still carries
        our finalizer, which only the operator removes. Its label went, so
        the watch no longer shows it; it stays cached and is relabelled."""
        if uid in self.pods:
            self.unlabelled.add(uid)
            self.kick(uid)

    def allocation_seen(self, obj: Raw) -> None:
        key, pod_uid = key_of(obj), allocation_pod_uid(obj)
        old = self.allocs.get(key)
        self.allocs[key] = obj
        self.expect.seen(Write.CREATE, key)
        if pod_uid:
            self.allocs_by_pod.setdefault(pod_uid, set()).add(key)
        # The spec is immutable (the CRD refuses changes to it), so a status
        # or metadata change of an allocation the ledger has read needs no
        # second reading: that validation was most of an event's cost.
        if old is None or old.get("spec") != obj.get("spec") or uid_of(old) != uid_of(obj):
            try:
                self.ledger.add_allocation(Allocation.from_api(obj))
            except InvalidAllocationError as exc:
                log.warning("allocation %s is unreadable, not booked: %s", key, exc)
        if phase_of(obj) == names.PHASE_FAILED and phase_of(old) != names.PHASE_FAILED:
            node = (obj.get("spec") or {}).get("nodeName", "")
            self.metrics.allocation_failures.labels(node).inc()
        if pod_uid:
            self.kick(pod_uid)

    def allocation_gone(self, obj: Raw) -> None:
        key, pod_uid = key_of(obj), allocation_pod_uid(obj)
        cached = self.allocs.pop(key, None)
        state = self.states.get(pod_uid)
        if cached is not None and state is not None and not self.expect.pending(Write.DELETE, key):
            # Not our release. Whether the pod must hear of it is decide's
            # call: the reconcile that would have seen the object terminating
            # may not have run before it went.
            booked = self.ledger.allocation(key)
            state.vanished[key] = (
                f"vNPU {booked.vnpu_id} on node {booked.node}" if booked is not None else key
            )
        keys = self.allocs_by_pod.get(pod_uid)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.allocs_by_pod[pod_uid]
        self.ledger.remove_allocation(
            key, destroyed=self._destroyed(obj), version=resource_version(obj)
        )
        self.expect.seen(Write.CREATE, key)
        self.expect.seen(Write.DELETE, key)
        self.expect.seen(Write.UNFINALIZE, key)
        if pod_uid:
            self.kick(pod_uid)
        for held in sorted(self.release_first.gone(key)):
            self.kick(held)
        self.kick_waiting()

    def _destroyed(self, obj: Raw) -> bool:
        """Whether an allocation that went took its vNPU with it, so that its
        capacity and id are free now rather than at the node's next inventory.
        Only its agent removes the finalizer of an allocation being deleted,
        after destroying the vNPU or proving it gone; the protection policy
        lets nobody else but the operator (for one no agent serves: the vNPU,
        if any, is its agent's orphan) and exempt admins remove it. What the
        watch reports of a deleted object is its last stored state, before the
        finalizer's removal, so that removal cannot carry a mark: the mark is
        the other way round. An allocation whose agent deferred the destroy
        (phase Releasing: the vNPU is open) went without it, as did one on a
        node no live agent serves; neither counts, and the vNPU keeps its id
        and capacity while the node's inventory lists it."""
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        return (
            bool(meta.get("deletionTimestamp"))
            and not self.expect.pending(Write.UNFINALIZE, key_of(obj))
            and phase_of(obj) != names.PHASE_RELEASING
            and self.inventories.leases.live(str(spec.get("nodeName") or ""))
        )

    def node_lost(self, node: str, why: str) -> None:
        """Allocations on a node that is gone or whose agent stopped renewing
        its Lease stay booked (their vNPUs may still exist); their pods hear
        about it."""
        allocs = self.ledger.allocations_on(node)
        log.warning("node %s is not live (%s); %d allocation(s) kept", node, why, len(allocs))
        for pod_uid in sorted({a.pod_uid for a in allocs}):
            pod = self.pods.get(pod_uid)
            if pod is not None and self.is_active():
                self._spawn(self.notices.node_not_live(pod, node, why))
                # A deleted pod there waits for its containers to stop, which
                # a node that is gone settles (lifecycle.containers_stopped).
                self.kick(pod_uid)

    # ------------------------------------------------------------ scheduling

    def kick(self, uid: str) -> None:
        if self.synced and self.leading():
            self.queue.add(uid)

    def kick_waiting(self) -> None:
        """Capacity may have grown: retry waiting pods (the waiting line's
        turn), placements that found no fit forgotten."""
        self.placer.capacity_grew()
        self.waiting_line.retry()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:
            coro.close()
            return
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    async def idle(self) -> None:
        """Waits until no reconcile or side task is running (tests)."""
        while (
            len(self.queue)
            or len(self.advertiser.queue)
            or self._side_tasks
            or self.waiting_line.pending
        ):
            await self.queue.idle()
            await self.advertiser.queue.idle()
            await asyncio.gather(*self._side_tasks, return_exceptions=True)
            await asyncio.sleep(0)

    # ------------------------------------------------------------ reconcile

    def views(self, uid: str) -> list[AllocView]:
        """The pod's allocations as `decide` reads them. One we asked to
        delete counts as deleting before the watch says so: a late status
        update (say, Ready) of a released allocation must not start the pod."""
        keys = sorted(self.allocs_by_pod.get(uid, ()))
        views = [AllocView.from_api(self.allocs[k]) for k in keys if k in self.allocs]
        return [
            replace(v, deleting=True)
            if not v.deleting and self.expect.pending(Write.DELETE, v.key)
            else v
            for v in views
        ]

    async def reconcile(self, uid: str) -> None:
        if not self.leading():
            return  # a standby: the leader reconciles (and kicks all on taking over)
        pod = self.pods.get(uid)
        if pod is not None and uid in self.unlabelled:
            relabelled = await self.api.relabel_pod(pod)
            self.unlabelled.discard(uid)
            if not relabelled:
                self.pod_event("DELETED", pod)
                return
            log.warning("pod %s lost its %s label; put back", key_of(pod), names.LABEL_MANAGED)
        views = self.views(uid)
        state = self.state(uid)
        await self._unservable(state, views)
        if pod is None:
            await self._pod_gone(uid, views)
            return
        # A nomination someone else wrote on a gated pod: the scheduler would
        # keep room on that node for it, and refuse pods placed there.
        await self.preemption.clear_foreign(pod)
        node_gone = self._node_gone(pod)
        if (
            state.releasing_since is None
            and (is_deleting(pod) or is_terminal(pod))
            and containers_stopped(pod, node_gone=node_gone)
        ):
            state.releasing_since = self.clock()
        step = decide(
            pod,
            views,
            attempts=state.attempts,
            max_attempts=self.settings.max_attempts,
            released_by_us=self.expect.keys(Write.DELETE),
            vanished=state.vanished,
            lost_told=state.lost_told,
            node_gone=node_gone,
        )
        log.debug("pod %s (%s): %s %s", key_of(pod), uid, step.kind, step.message)
        for edit in hand_edits(pod, views):
            if edit not in state.hand_edits:
                state.hand_edits.add(edit)
                await self.notices.hand_edit(pod, edit)
        if step.kind is not StepKind.PLACE:
            if state.waiting_since is not None:
                self.waiting_line.stop(state)
            await self.preemption.release_claim(pod, state)
        match step.kind:
            case StepKind.RELEASE:
                await self._release(step.keys)
            case StepKind.REMOVE_FINALIZER:
                await self._finish(uid, pod, state)
            case StepKind.PLACE:
                if self._creating(uid, pod):
                    pass  # placed; the created objects are on their way to the cache
                elif self.release_first.holds(key_of(pod).partition("/")[0], uid):
                    log.debug("pod %s waits for its namespace's releases", key_of(pod))
                elif await self._still_there(pod, state):
                    await self.placer.place(
                        pod, state, existing=self.allocs_by_pod.get(uid, set()), cached=self.allocs
                    )
            case StepKind.PIN:
                await self.pinner.pin(uid, pod, state, step)
            case StepKind.RETRY:
                await self._retry(pod, state, step)
            case StepKind.GIVE_UP:
                await self.notices.tell(
                    pod, state, names.REASON_ALLOCATION_FAILED,
                    f"gave up after {state.attempts} failed placement(s); "
                    "delete the pod or fix the node and recreate it",
                    condition=True, warning=True,
                )  # fmt: skip
            case StepKind.LOST:
                await self._lost(pod, state, step.keys)
            case StepKind.WAIT | StepKind.NOTHING:
                pass

    def _creating(self, uid: str, pod: Raw) -> bool:
        """Whether the pod's whole placement is booked and every allocation
        of it is in the cache or created and not seen yet. A pod event that
        arrives in between (the scheduler, the webhook's echo) would run the
        placement again only to find the same booking and nothing to write:
        during a fill that was two or three placements per pod."""
        booked = self.ledger.allocations_for(uid)
        if not booked or len(booked) < requested_count(pod):
            return False
        pending = [a.key for a in booked if self.expect.pending(Write.CREATE, a.key)]
        return bool(pending) and all(a.key in self.allocs or a.key in pending for a in booked)

    async def _pod_gone(self, uid: str, views: list[AllocView]) -> None:
        # The pod object vanished (finalizer removed by hand, or a forced
        # delete): whatever still names it is released.
        await self._release(tuple(v.key for v in views if not v.deleting))
        if not views:
            state = self.states.pop(uid, None)
            self.queue.forget(uid)
            if state is not None and state.waiting_since is not None:
                self.waiting_line.stop(state)

    def _node_gone(self, pod: Raw) -> bool:
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        return bool(node) and not self._node_served(node)

    def _node_served(self, node: str) -> bool:
        # A Lease still renewed counts: the Node may be missing from the
        # cache for a moment, but an agent that renews is there.
        return node in self.inventories.nodes or self.inventories.leases.live(node)

    async def _unservable(self, state: PodState, views: list[AllocView]) -> None:
        """Allocations no agent will ever serve: reported once; once deleted,
        the operator removes the finalizer their agent never will (a vNPU
        that exists after all is an orphan to its agent's garbage collector)."""
        for view in views:
            obj = self.allocs.get(view.key)
            if obj is None:
                continue
            why = unservable(obj, node_exists=self._node_served(view.node))
            if why is None:
                continue
            if not (obj.get("metadata") or {}).get("deletionTimestamp"):
                if view.key not in state.unservable:
                    state.unservable.add(view.key)
                    await self.notices.unservable(obj, why)
            elif not self.expect.pending(Write.UNFINALIZE, view.key):
                await self.notices.unservable(obj, why, released=True)
                await self.expect.sending(
                    Write.UNFINALIZE, view.key, partial(self.api.remove_allocation_finalizer, obj)
                )

    async def _release(self, keys: tuple[str, ...]) -> None:
        # Asked already: the deletionTimestamp is on its way to the cache.
        await self.expect.send_unsent(Write.DELETE, keys, self.api.delete_allocation)

    async def _finish(self, uid: str, pod: Raw, state: PodState) -> None:
        if self.expect.pending(Write.UNFINALIZE, uid):
            return
        if not is_deleting(pod) and is_terminal(pod):
            await self.notices.released(pod)
        remove = partial(self.api.remove_pod_finalizer, pod)
        await self.expect.sending(Write.UNFINALIZE, uid, remove)
        if state.releasing_since is not None:
            self.metrics.release_latency.observe(self.clock() - state.releasing_since)
            state.releasing_since = None

    async def _still_there(self, pod: Raw, state: PodState) -> bool:
        """Before placing a gated pod one of whose allocations went without
        us deleting it (the garbage collector does that when the owner pod is
        gone): if the pod's deletion never reached the cache, placing it
        again would loop (create, collected, create) for a pod that is gone."""
        if not state.vanished:
            return True
        if await self.api.pod_gone(pod):
            log.warning("pod %s is gone without a watch event; forgetting it", key_of(pod))
            self.pod_event("DELETED", pod)
            return False
        state.vanished.clear()
        return True

    async def _retry(self, pod: Raw, state: PodState, step: Step) -> None:
        state.attempts += 1
        if step.node:
            state.avoid.add(step.node)
        left = self.settings.max_attempts - state.attempts
        await self.notices.placement_failed(pod, step.node, step.message, left)
        await self._release(step.keys)

    async def _lost(self, pod: Raw, state: PodState, keys: tuple[str, ...]) -> None:
        for key in keys:
            state.lost_told.add(key)
            alloc = self.ledger.allocation(key)
            what = f"vNPU {alloc.vnpu_id} on node {alloc.node}" if alloc else key
            await self.notices.lost(pod, key, state.vanished.get(key, what))

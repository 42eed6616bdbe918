"""The controller: caches fed by the watch handlers, the ledger, and the
reconcile loop that drives each pod through `lifecycle.decide`.

Handlers only record objects and `kick` pods; all work happens in one task
per pod at a time (`kick` while it runs marks the pod dirty and the task
runs again), so steps for one pod never interleave. Placement decides and
books in one synchronous ledger call, so pods placed concurrently never
share capacity. Nothing polls: pods are reconciled when their pod or
allocation objects change, waiting pods when capacity may have grown, and
after an API error with backoff.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_operator import names
from vnpu_operator.admission import OfferedTemplates
from vnpu_operator.config import OperatorSettings
from vnpu_operator.kubeapi import OperatorApi, allocation_body
from vnpu_operator.lifecycle import (
    AllocView,
    Step,
    StepKind,
    decide,
    has_finalizer,
    is_deleting,
    is_gated,
    is_terminal,
    slim_pod,
)
from vnpu_operator.metrics import OperatorMetrics, StateView
from vnpu_operator.pinning import PinningError, pin_patch
from vnpu_operator.placement import (
    MAX_COUNT,
    Allocation,
    InvalidAllocationError,
    InvalidInventoryError,
    InvalidRequestError,
    Ledger,
    NodeInventory,
    NoFit,
    Placement,
    PlacementError,
    PodRequest,
)

log = logging.getLogger(__name__)

Raw = dict[str, Any]


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


def _alloc_pod_uid(obj: Mapping[str, Any]) -> str:
    spec_uid = (obj.get("spec") or {}).get("podUID")
    label_uid = ((obj.get("metadata") or {}).get("labels") or {}).get(names.LABEL_POD_UID)
    return str(spec_uid or label_uid or "")


def parse_time(value: Any) -> float | None:
    """Epoch seconds of a Kubernetes timestamp (Time or MicroTime)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _signature(request: PodRequest, avoid: frozenset[str]) -> tuple[Any, ...]:
    """What placement reads of a request, minus who asks."""
    return (
        request.template,
        request.count,
        request.chip_model,
        json.dumps(dict(request.node_selector), sort_keys=True),
        json.dumps(request.required_affinity, sort_keys=True),
        json.dumps(list(request.tolerations), sort_keys=True),
        avoid,
    )


class Controller:
    def __init__(
        self,
        api: OperatorApi,
        settings: OperatorSettings,
        metrics: OperatorMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.wall = wall
        self.ledger = Ledger()

        self.pods: dict[str, Raw] = {}
        self.allocs: dict[str, Raw] = {}
        self.allocs_by_pod: dict[str, set[str]] = {}
        self.vnpunodes: dict[str, Raw] = {}
        self.nodes: dict[str, Raw] = {}
        self.lease_expiry: dict[str, float] = {}
        self.live: dict[str, bool] = {}
        self.offered: OfferedTemplates | None = None
        self._offer_by_node: dict[str, frozenset[tuple[str, str]]] = {}
        self.synced = False

        # Per pod bookkeeping, dropped when the pod is gone.
        self.waiting: dict[str, float] = {}
        self.attempts: dict[str, int] = {}
        self.avoid: dict[str, set[str]] = {}
        self.told: dict[str, tuple[str, str]] = {}
        self.seen_at: dict[str, float] = {}
        self.releasing_since: dict[str, float] = {}
        self.released_by_us: set[str] = set()
        # Allocations created by us and not yet seen by the watch.
        self.created: set[str] = set()
        # Pods ungated by us whose ungated version the cache has not seen.
        self.pinned: set[str] = set()
        # Pods whose finalizer removal was sent and whose cached copy still
        # shows the finalizer: the pod's other events in that window (kwok or
        # a kubelet finishing it) must not send the removal again.
        self.finished: set[str] = set()
        self.lost_told: set[str] = set()
        self.failed_seen: set[str] = set()

        self._running: dict[str, asyncio.Task[None]] = {}
        self._dirty: set[str] = set()
        self._errors: dict[str, int] = {}
        self._waiting_kick: asyncio.Handle | None = None
        self._lease_timers: dict[str, asyncio.TimerHandle] = {}
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._capacity_epoch = 0
        self._nofits: dict[tuple[Any, ...], tuple[int, NoFit]] = {}

        metrics.watch(
            StateView(
                allocations=lambda: list(self.allocs.values()),
                capacity=self.ledger.capacity,
                waiting=lambda: len(self.waiting),
                live_nodes=lambda: dict(self.live),
            )
        )

    # ------------------------------------------------------------ feeding

    def mark_synced(self) -> None:
        """Every cache holds a full listing: start reconciling everything
        seen so far (kicks before this point were no-ops)."""
        if not self.synced:
            self.synced = True
            self._refresh_offered()
            for uid in sorted(set(self.pods) | set(self.allocs_by_pod)):
                self.kick(uid)
            log.info(
                "synced: %d node(s), %d allocation(s), %d pod(s)",
                len(self.vnpunodes),
                len(self.allocs),
                len(self.pods),
            )

    def pod_event(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        """`obj` may be the watch's own object: only a slim copy is kept."""
        uid = _uid(obj)
        if not uid:
            return
        if event_type == "DELETED":
            self.pods.pop(uid, None)
            self.pinned.discard(uid)
            self.finished.discard(uid)
        else:
            pod = slim_pod(obj)
            self.pods[uid] = pod
            if not is_gated(pod):
                self.pinned.discard(uid)
            if not has_finalizer(pod):
                self.finished.discard(uid)
            now = self.clock()
            self.seen_at.setdefault(uid, now)
            if is_deleting(pod) or is_terminal(pod):
                self.releasing_since.setdefault(uid, now)
        self.kick(uid)

    def allocation_seen(self, obj: Raw) -> None:
        key, pod_uid = _key(obj), _alloc_pod_uid(obj)
        self.allocs[key] = obj
        self.created.discard(key)
        if pod_uid:
            self.allocs_by_pod.setdefault(pod_uid, set()).add(key)
        try:
            self.ledger.add_allocation(Allocation.from_api(obj))
        except InvalidAllocationError as exc:
            log.warning("allocation %s is unreadable, not booked: %s", key, exc)
        phase = (obj.get("status") or {}).get("phase")
        if phase == names.PHASE_FAILED and key not in self.failed_seen:
            self.failed_seen.add(key)
            self.metrics.allocation_failures.labels(
                (obj.get("spec") or {}).get("nodeName", "")
            ).inc()
        if pod_uid:
            self.kick(pod_uid)

    def allocation_gone(self, obj: Raw) -> None:
        key, pod_uid = _key(obj), _alloc_pod_uid(obj)
        pod = self.pods.get(pod_uid)
        if (
            pod is not None
            and key not in self.released_by_us
            and key not in self.lost_told
            and key in self.allocs
            and not is_gated(pod)
            and not is_deleting(pod)
            and not is_terminal(pod)
        ):
            # The deletion was not ours and the reconcile that would have seen
            # it terminating may not have run before the object went.
            self._spawn(self._announce_lost(pod, key, self.ledger.allocation(key)))
        self.allocs.pop(key, None)
        keys = self.allocs_by_pod.get(pod_uid)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.allocs_by_pod[pod_uid]
        self.ledger.remove_allocation(key)
        self.failed_seen.discard(key)
        self.created.discard(key)
        self.released_by_us.discard(key)
        self.lost_told.discard(key)
        if pod_uid:
            self.kick(pod_uid)
        self.kick_waiting()

    def vnpunode_event(self, event_type: str | None, obj: Raw) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if event_type == "DELETED":
            self.vnpunodes.pop(name, None)
        else:
            self.vnpunodes[name] = obj
        self._refresh_node(name)
        inventory = self.ledger.node(name)
        offer = (
            frozenset((c.model, t.name) for c in inventory.status.chips for t in c.templates)
            if inventory is not None
            else frozenset()
        )
        # Most VNPUNode updates change free capacity or vNPUs, not what is
        # offered; only a change of the offer rebuilds it from every node.
        if self._offer_by_node.get(name) != offer or self.offered is None:
            self._offer_by_node[name] = offer
            self._refresh_offered()

    def node_event(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if event_type == "DELETED":
            self.nodes.pop(name, None)
        else:
            meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
            # Only what placement and pinning read: a node's status churns
            # (heartbeats) and must not cost memory or work here.
            slim = {
                "metadata": {"name": name, "labels": dict(meta.get("labels") or {})},
                "spec": {"taints": list(spec.get("taints") or [])},
            }
            if self.nodes.get(name) == slim:
                return
            self.nodes[name] = slim
        self._refresh_node(name)

    def lease_event(self, event_type: str | None, obj: Raw) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        if meta.get("namespace") != self.settings.agent_namespace or not name.startswith(
            names.LEASE_PREFIX
        ):
            return
        node = name[len(names.LEASE_PREFIX) :]
        if event_type == "DELETED":
            self.lease_expiry.pop(node, None)
        else:
            spec = obj.get("spec") or {}
            renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
            duration = spec.get("leaseDurationSeconds") or 0
            if renewed is None or not isinstance(duration, int):
                self.lease_expiry.pop(node, None)
            else:
                expiry = renewed + duration + self.settings.lease_grace_seconds
                self.lease_expiry[node] = expiry
                self._arm_lease_timer(node, expiry)
        # A renewal that leaves the node as live as it was changes nothing
        # placement reads; at hundreds of nodes these are most events.
        if self.live.get(node) != self.lease_valid(node) or node not in self.live:
            self._refresh_node(node)

    def _arm_lease_timer(self, node: str, expiry: float) -> None:
        old = self._lease_timers.pop(node, None)
        if old is not None:
            old.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        delay = max(expiry - self.wall(), 0) + 0.1
        self._lease_timers[node] = loop.call_later(delay, self._refresh_node, node)

    def lease_valid(self, node: str) -> bool:
        return self.lease_expiry.get(node, 0.0) > self.wall()

    def _refresh_node(self, name: str) -> None:
        vnpu_node = self.vnpunodes.get(name)
        was_live = self.live.get(name)
        if vnpu_node is None:
            self.ledger.remove_node(name)
            self.live.pop(name, None)
            return
        try:
            inventory = NodeInventory.from_objects(
                vnpu_node, self.nodes.get(name), self.lease_valid(name)
            )
        except InvalidInventoryError as exc:
            log.warning("inventory of %s is unreadable, keeping the last one: %s", name, exc)
            return
        old = self.ledger.node(name)
        self.ledger.upsert_node(inventory)
        self.live[name] = inventory.live
        if was_live and not inventory.live:
            self._node_lost(name)
        if old is None or old != inventory:
            self.kick_waiting()

    def _node_lost(self, node: str) -> None:
        """Allocations on a node that is gone or whose agent stopped renewing
        its Lease stay booked (their vNPUs may still exist); their pods hear
        about it."""
        why = "Node object is gone" if node not in self.nodes else "agent Lease expired"
        allocs = self.ledger.allocations_on(node)
        log.warning("node %s is not live (%s); %d allocation(s) kept", node, why, len(allocs))
        for pod_uid in sorted({a.pod_uid for a in allocs}):
            pod = self.pods.get(pod_uid)
            if pod is not None:
                self._spawn(
                    self.api.event(
                        pod,
                        reason="NodeNotLive",
                        warning=True,
                        message=f"node {node} is not live ({why}); its vNPUs are kept and "
                        "released once the agent is back",
                    )
                )

    def _refresh_offered(self) -> None:
        # From the ledger's parsed inventories: no re-parsing of every
        # VNPUNode on every VNPUNode event.
        if not self.synced:
            return
        inventories = (self.ledger.node(n) for n in self.ledger.node_names())
        self.offered = OfferedTemplates.from_node_statuses(
            inv.status for inv in inventories if inv is not None
        )

    def offered_templates(self) -> OfferedTemplates | None:
        return self.offered

    # ------------------------------------------------------------ scheduling

    def kick(self, uid: str) -> None:
        if uid in self._running:
            self._dirty.add(uid)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._running[uid] = loop.create_task(self._run(uid), name=f"pod-{uid}")

    def kick_waiting(self) -> None:
        """Capacity may have grown: retry waiting pods, oldest first, once
        per burst of changes."""
        self._capacity_epoch += 1
        self._nofits.clear()
        if not self.waiting or self._waiting_kick is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return

        def go() -> None:
            self._waiting_kick = None
            for uid in sorted(self.waiting, key=lambda u: self.waiting[u]):
                self.kick(uid)

        self._waiting_kick = loop.call_soon(go)

    async def _run(self, uid: str) -> None:
        try:
            while True:
                self._dirty.discard(uid)
                try:
                    await self.reconcile(uid)
                    self._errors.pop(uid, None)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self._retry_later(uid, exc)
                if uid not in self._dirty:
                    break
        finally:
            self._running.pop(uid, None)

    def _retry_later(self, uid: str, exc: Exception) -> None:
        n = self._errors.get(uid, 0) + 1
        self._errors[uid] = n
        delay = min(0.25 * 2 ** (n - 1), self.settings.retry_max_seconds)
        what = f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else repr(exc)
        log.warning("pod %s: reconcile failed (%s); retry %d in %.1fs", uid, what, n, delay)
        loop = asyncio.get_running_loop()
        loop.call_later(delay, self.kick, uid)

    def _spawn(self, coro: Any) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:
            coro.close()
            return
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    async def idle(self) -> None:
        """Waits until no reconcile or side task is running (tests)."""
        while self._running or self._side_tasks or self._waiting_kick is not None:
            pending = [*self._running.values(), *self._side_tasks]
            await asyncio.gather(*pending, return_exceptions=True)
            await asyncio.sleep(0)

    # ------------------------------------------------------------ reconcile

    def views(self, uid: str) -> list[AllocView]:
        """The pod's allocations as `decide` reads them. One we asked to
        delete counts as deleting before the watch says so: a late status
        update (say, Ready) of a released allocation must not start the pod."""
        keys = sorted(self.allocs_by_pod.get(uid, ()))
        views = [AllocView.from_api(self.allocs[k]) for k in keys if k in self.allocs]
        return [
            replace(v, deleting=True) if v.key in self.released_by_us and not v.deleting else v
            for v in views
        ]

    async def reconcile(self, uid: str) -> None:
        if not self.synced:
            return
        pod = self.pods.get(uid)
        views = self.views(uid)
        if pod is None:
            await self._pod_gone(uid, views)
            return
        step = decide(
            pod,
            views,
            attempts=self.attempts.get(uid, 0),
            max_attempts=self.settings.max_attempts,
            released_by_us=self.released_by_us,
        )
        log.debug("pod %s (%s): %s %s", _key(pod), uid, step.kind, step.message)
        if step.kind is not StepKind.PLACE:
            self.waiting.pop(uid, None)
        match step.kind:
            case StepKind.RELEASE:
                await self._release(step.keys)
            case StepKind.REMOVE_FINALIZER:
                await self._finish(uid, pod)
            case StepKind.PLACE:
                await self._place(uid, pod)
            case StepKind.PIN:
                await self._pin(uid, pod, step)
            case StepKind.RETRY:
                await self._retry(uid, pod, step)
            case StepKind.GIVE_UP:
                await self._tell(
                    uid, pod, "AllocationFailed",
                    f"gave up after {self.attempts.get(uid, 0)} failed placement(s); "
                    "delete the pod or fix the node and recreate it",
                    condition=True, warning=True,
                )  # fmt: skip
            case StepKind.LOST:
                await self._lost(pod, step.keys)
            case StepKind.WAIT | StepKind.NOTHING:
                pass

    async def _pod_gone(self, uid: str, views: list[AllocView]) -> None:
        # The pod object vanished (finalizer removed by hand, or a forced
        # delete): whatever still names it is released.
        await self._release(tuple(v.key for v in views if not v.deleting))
        if not views:
            for table in (
                self.waiting, self.attempts, self.avoid, self.told,
                self.seen_at, self.releasing_since, self._errors,
            ):  # fmt: skip
                table.pop(uid, None)

    async def _release(self, keys: tuple[str, ...]) -> None:
        for key in keys:
            # Asked already: the deletionTimestamp is on its way to the cache.
            if key in self.released_by_us:
                continue
            await self.api.delete_allocation(key)
            self.released_by_us.add(key)

    async def _finish(self, uid: str, pod: Raw) -> None:
        if uid in self.finished:
            return
        deleted = is_deleting(pod)
        if not deleted and is_terminal(pod):
            # The pod stays visible, so the Event is worth its write; for a
            # deleted pod it would describe an object about to vanish.
            await self.api.event(
                pod,
                reason="VNPUsReleased",
                message=f"pod is {pod.get('status', {}).get('phase')}; its vNPUs are destroyed",
            )
        await self.api.remove_pod_finalizer(pod)
        self.finished.add(uid)
        since = self.releasing_since.pop(uid, None)
        if since is not None:
            self.metrics.release_latency.observe(self.clock() - since)

    def _place_or_cached_nofit(
        self, request: PodRequest, avoid: frozenset[str]
    ) -> Placement | NoFit:
        """Bookings only ever shrink free capacity, so a request that did not
        fit still does not until capacity grows (the epoch moves): hundreds
        of alike waiting pods cost one placement per capacity change, not one
        each. Pods holding part of their booking are always placed afresh."""
        signature = None
        if not self.ledger.allocations_for(request.uid):
            signature = _signature(request, avoid)
            cached = self._nofits.get(signature)
            if cached is not None and cached[0] == self._capacity_epoch:
                return cached[1]
        # A new placement after a failure gets new object names: an agent
        # still releasing the old objects must never mistake the new ones.
        first_index = self.attempts.get(request.uid, 0) * MAX_COUNT
        result = self.ledger.place(
            request, self.settings.policy, avoid=avoid, first_index=first_index
        )
        if signature is not None and isinstance(result, NoFit):
            self._nofits[signature] = (self._capacity_epoch, result)
        return result

    async def _place(self, uid: str, pod: Raw) -> None:
        try:
            request = PodRequest.from_pod(pod)
            avoid = frozenset(self.avoid.get(uid, ()))
            result = self._place_or_cached_nofit(request, avoid)
        except InvalidRequestError as exc:
            self.metrics.placement_failures.labels("invalid-request").inc()
            await self._tell(uid, pod, "InvalidRequest", str(exc), condition=True, warning=True)
            return
        except PlacementError as exc:
            log.error("pod %s: placement refused: %s", _key(pod), exc)
            await self._tell(uid, pod, "PlacementConflict", str(exc), condition=True, warning=True)
            return
        if isinstance(result, NoFit):
            self.waiting.setdefault(uid, self.seen_at.get(uid, self.clock()))
            self.metrics.placement_failures.labels(result.primary_reason.value).inc()
            await self._tell(
                uid, pod, "WaitingForCapacity", result.message, condition=True,
                event_key=result.primary_reason.value,
            )  # fmt: skip
            return
        self.waiting.pop(uid, None)
        existing = self.allocs_by_pod.get(uid, set())
        for alloc in result.allocations:
            # In the cache, or created and on its way there: nothing to write.
            if alloc.key in existing or alloc.key in self.created:
                continue
            try:
                await self.api.create_allocation(allocation_body(alloc, pod))
            except Exception:
                # The bookings whose objects do not exist must not outlive
                # the failed write; the ones created stay booked.
                for other in result.allocations:
                    if other.key not in self.allocs and other.key not in self.created:
                        self.ledger.remove_allocation(other.key)
                raise
            self.created.add(alloc.key)
        log.info("pod %s placed on %s: vNPU %s", _key(pod), result.node, result.visible_devices)

    async def _pin(self, uid: str, pod: Raw, step: Step) -> None:
        if uid in self.pinned:
            # Patched already; the cache has not seen the ungated pod yet.
            return
        allocs = [self.ledger.allocation(k) for k in step.keys]
        ids = [a.vnpu_id for a in allocs if a is not None]
        node = step.node
        labels = (self.nodes.get(node, {}).get("metadata") or {}).get("labels") or {}
        try:
            ops = pin_patch(pod, node, labels, ids)
        except PinningError as exc:
            await self._tell(uid, pod, "PinningFailed", str(exc), condition=True, warning=True)
            return
        meta = pod["metadata"]
        try:
            await self.api.patch_pod(meta["namespace"], meta["name"], ops)
        except ApiException as exc:
            if exc.status in (404, 409, 422):
                # The pod changed under us (a newer version is on its way to
                # the cache) or is gone; the next event reconciles again.
                log.info(
                    "pod %s: pin patch refused (%s); waiting for a newer pod", _key(pod), exc.status
                )
                return
            raise
        self.pinned.add(uid)
        since = self.seen_at.get(uid)
        if since is not None:
            self.metrics.allocation_latency.observe(self.clock() - since)
        devices = ",".join(str(i) for i in ids)
        templates = sorted({a.template for a in allocs if a is not None})
        if uid in self.told:
            await self.api.set_pod_condition(
                pod, "True", "Allocated", f"vNPU {devices} on node {node}"
            )
            self.told.pop(uid, None)
        await self.api.event(
            pod,
            reason="VNPUsReady",
            message=f"vNPU {devices} ({', '.join(templates)}) ready on node {node}; "
            "pod pinned there and ungated",
        )

    async def _retry(self, uid: str, pod: Raw, step: Step) -> None:
        attempts = self.attempts.get(uid, 0) + 1
        self.attempts[uid] = attempts
        if step.node:
            self.avoid.setdefault(uid, set()).add(step.node)
        left = self.settings.max_attempts - attempts
        then = f"placing elsewhere ({left} attempt(s) left)" if left > 0 else "no attempts left"
        await self.api.event(
            pod,
            reason="AllocationFailed",
            warning=True,
            message=f"vNPU on node {step.node} failed: {step.message}; {then}",
        )
        await self._release(step.keys)

    async def _lost(self, pod: Raw, keys: tuple[str, ...]) -> None:
        for key in keys:
            if key in self.lost_told:
                continue
            self.lost_told.add(key)
            await self._announce_lost(pod, key, self.ledger.allocation(key))

    async def _announce_lost(self, pod: Raw, key: str, alloc: Allocation | None) -> None:
        what = f"vNPU {alloc.vnpu_id} on node {alloc.node}" if alloc else key
        await self.api.event(
            pod,
            reason="VNPUReleasedExternally",
            warning=True,
            message=f"allocation {key} ({what}) was deleted while the pod runs; the vNPU "
            "is destroyed and the pod keeps no device there",
        )

    async def _tell(
        self,
        uid: str,
        pod: Raw,
        reason: str,
        message: str,
        *,
        condition: bool = False,
        warning: bool = False,
        event_key: str | None = None,
    ) -> None:
        """A pod condition when the message changes, an Event when the
        reason (or `event_key`) changes: a pod waiting through changing
        capacity is not re-announced for every count that moves."""
        announced, shown = self.told.get(uid, ("", ""))
        event_id = f"{reason}/{event_key or message}"
        if condition and shown != message:
            await self.api.set_pod_condition(pod, "False", reason, message)
        if announced != event_id:
            await self.api.event(pod, reason=reason, message=message, warning=warning)
        self.told[uid] = (event_id, message if condition else shown)

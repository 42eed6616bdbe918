"""The DRA front-end's controller: one reconcile per ResourceClaim at a time,
from caches of the claims of our driver and the allocations that name them.

It writes through the same services as the pod controller (allocations by
`OperatorApi`, ids from the same `Ledger`), so a claim's vNPU is declared,
booked and released exactly as an annotated pod's; what to do is
`plan.plan`'s call, which vNPU id (or why none) `plan.pick_vnpu_id`'s.

Each device's id is chosen and booked in the ledger in one synchronous step,
so the claim's next device, and every other claim or pod, sees the booking.
A create whose outcome is unknown (no answer, a timeout, a 5xx) keeps its
booking, as an expected create (podstate.Expectations, the pod controller's
record of writes the watch has yet to show): the allocation may exist, and
its id must not be handed out twice. The watch delivering it settles it;
otherwise the claim's next reconcile reads it, and only a NotFound gives the
booking back. A definite refusal (a 4xx, or a write the leader fence kept
unsent) gives it back at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common.kube.apiwrites import FencedWrite
from vnpu_common.kube.backoff import Backoff
from vnpu_common.kube.informer import key_of
from vnpu_common.kube.workqueue import RetryLater, WorkQueue
from vnpu_common.wire import names
from vnpu_common.wire.types import Raw
from vnpu_operator.dra.claimapi import ClaimApi
from vnpu_operator.dra.plan import (
    AGENT_DOWN,
    AllocInfo,
    ClaimDevice,
    ClaimView,
    Refusal,
    alloc_info,
    claim_view,
    pick_vnpu_id,
    plan,
    route_refusal,
)
from vnpu_operator.dra.pools import DeadPools
from vnpu_operator.kubeapi import OperatorApi
from vnpu_operator.metrics import OperatorMetrics
from vnpu_operator.placement import Allocation, Ledger
from vnpu_operator.podstate import Expectations, Write

log = logging.getLogger(__name__)


def slim_claim(claim: Mapping[str, Any]) -> Raw:
    """What the controller keeps of a claim: identity, our allocation
    results, reservedFor and our status.devices entries."""
    meta = claim.get("metadata") or {}
    status = claim.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    slim_meta = {k: meta[k] for k in ("name", "namespace", "uid", "deletionTimestamp") if k in meta}
    marker = (meta.get("annotations") or {}).get(names.DRA_EXTENDED_RESOURCE_CLAIM_ANNOTATION)
    spec: Raw = {}
    if marker is not None:
        slim_meta["annotations"] = {names.DRA_EXTENDED_RESOURCE_CLAIM_ANNOTATION: marker}
        # The scheduler's claim: which class each request names decides whether
        # it is served (plan.route_refusal); other claims never need it.
        requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
        spec = {
            "devices": {
                "requests": [
                    {
                        "name": r.get("name"),
                        "exactly": {
                            "deviceClassName": (r.get("exactly") or {}).get("deviceClassName")
                        },
                    }
                    for r in requests
                    if isinstance(r, Mapping)
                ]
            }
        }
    return {
        "metadata": slim_meta,
        "spec": spec,
        "status": {
            "allocation": {
                "devices": {"results": [r for r in results if r.get("driver") == names.DRA_DRIVER]}
            },
            "reservedFor": list(status.get("reservedFor") or [])[:1],
            "devices": [
                d for d in status.get("devices") or [] if d.get("driver") == names.DRA_DRIVER
            ],
        },
    }


def is_ours(claim: Mapping[str, Any]) -> bool:
    """A claim with a device of our driver allocated, or an entry of ours in
    its status (which must be cleared)."""
    slim = slim_claim(claim)
    status = slim["status"]
    return bool(status["allocation"]["devices"]["results"] or status["devices"])


def never_written(exc: BaseException) -> bool:
    """Whether a failed create certainly left nothing behind: the API server
    refused it (a 4xx: 403 by a policy, 422 invalid, 404 namespace gone, 429
    throttled before any work), or the leader fence kept it unsent. Anything
    else (no answer, a reset, a timeout, a 5xx) may have stored it."""
    if isinstance(exc, FencedWrite):
        return True
    return isinstance(exc, ApiException) and 400 <= exc.status < 500


def allocation_body(view: ClaimView, device: ClaimDevice, vnpu_id: int) -> Raw:
    """The VNPUAllocation of one allocated device: owned by the claim (the
    garbage collector deletes it with the claim), labelled for the node's
    agent, held by the agent's finalizer."""
    parsed = names.parse_dra_device_name(device.device)
    if parsed is None:  # pick_vnpu_id refused it already
        raise ValueError(f"device {device.device} is not one the agent publishes")
    chip, template, _ = parsed
    pod_name, pod_uid = view.reserved_pod or (view.name, view.uid)
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.ALLOCATION_KIND,
        "metadata": {
            "name": names.dra_allocation_name(view.uid, device.device),
            "namespace": view.namespace,
            "labels": {names.LABEL_NODE: device.pool, names.LABEL_CLAIM_UID: view.uid},
            "finalizers": [names.ALLOCATION_FINALIZER],
            "ownerReferences": [
                {
                    "apiVersion": names.RESOURCE_API,
                    "kind": "ResourceClaim",
                    "name": view.name,
                    "uid": view.uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "podName": pod_name,
            "podUID": pod_uid,
            "nodeName": device.pool,
            "chip": chip,
            "template": template,
            "vnpuId": vnpu_id,
            "claim": {
                "name": view.name,
                "uid": view.uid,
                "request": device.request,
                "device": device.device,
            },
        },
    }


class ClaimController:
    def __init__(
        self,
        api: OperatorApi,
        claims_api: ClaimApi,
        ledger: Ledger,
        *,
        ready: Callable[[], bool],
        retry_max_seconds: float,
        leading: Callable[[], bool] = lambda: True,
        expect: Expectations | None = None,
        metrics: OperatorMetrics | None = None,
        pools: DeadPools | None = None,
    ) -> None:
        """`ready()`: the pod controller's caches are synced, so the ledger
        holds every allocation and node (no id is chosen before);
        `leading()`: this replica leads (leader.Leadership): a standby keeps
        its caches and reconciles nothing; `expect`: the pod controller's
        record of writes whose effect the watch has yet to show (shared, so
        both see one create in flight); `metrics`: where refusals are counted;
        `pools`: deletes the pools of DRA nodes whose agent is not live."""
        self.api = api
        self.claims_api = claims_api
        self.ledger = ledger
        self.ready = ready
        self.leading = leading
        self.expect = expect if expect is not None else Expectations()
        self.metrics = metrics
        self.pools = pools
        if pools is not None:
            pools.leading = lambda: self.leading()
        self.claims: dict[str, Raw] = {}
        # Claim key -> allocation key -> what the plan reads of it.
        self.allocs: dict[str, dict[str, AllocInfo]] = {}
        self.listed = False
        self.queue = WorkQueue(
            self.reconcile,
            name="claim",
            backoff=Backoff(base=0.25, cap=retry_max_seconds),
            expected=(ApiException,),
        )

    # ------------------------------------------------------------ feeding

    def keep(self, claim: Raw) -> Raw | None:
        """The informer's filter: our claims, and any claim an allocation
        still names (its last event, say a deallocation, must arrive)."""
        if is_ours(claim) or key_of(claim) in self.allocs:
            return slim_claim(claim)
        return None

    def claim_event(self, deleted: bool, claim: Raw) -> None:
        key = key_of(claim)
        if deleted or not is_ours(claim):
            self.claims.pop(key, None)
        else:
            self.claims[key] = slim_claim(claim)
        self.kick(key)

    def claims_listed(self) -> None:
        self.listed = True
        self.lead()

    def lead(self) -> None:
        """Every claim and allocation seen so far reconciled (once listed,
        and on becoming the leader)."""
        for key in sorted(set(self.claims) | set(self.allocs)):
            self.kick(key)
        if self.pools is not None and self.listed and self.leading():
            self.pools.sweep()

    def node_lost(self, node: str) -> None:
        """The node's agent stopped being live (or its Node went): its pool
        goes (DeadPools), and its claims whose vNPUs are not ready yet are
        given back (reconcile)."""
        if self.pools is not None and self.leading():
            self.pools.node_lost(node)
        for key, claim in sorted(self.claims.items()):
            results = claim["status"]["allocation"]["devices"]["results"]
            if any(r.get("pool") == node for r in results):
                self.kick(key)

    def allocation_event(self, deleted: bool, obj: Raw) -> None:
        info = alloc_info(obj)
        if info is None:
            return
        meta = obj.get("metadata") or {}
        claim = (obj.get("spec") or {}).get("claim") or {}
        key = f"{meta.get('namespace', '')}/{claim.get('name', '')}"
        # What the watch shows settles a create in flight, whatever its answer said.
        self.expect.seen(Write.CREATE, info.key)
        bucket = self.allocs.setdefault(key, {})
        if deleted:
            bucket.pop(info.key, None)
            if not bucket:
                del self.allocs[key]
        else:
            bucket[info.key] = info
        self.kick(key)

    def kick(self, key: str) -> None:
        if self.listed and self.leading():
            self.queue.add(key)

    # ------------------------------------------------------------ reconcile

    async def reconcile(self, key: str) -> None:
        if not self.leading():
            return  # a standby: the leader reconciles (and kicks all on taking over)
        if not self.ready():
            raise RetryLater("the operator's caches are not synced yet")
        await self._settle(key)
        infos = list(self.allocs.get(key, {}).values())
        claim = self.claims.get(key)
        if claim is None and infos:
            # Not one of ours in the cache (deallocated, or the informer
            # dropped it): the server says whether it still exists.
            namespace, _, name = key.partition("/")
            claim = await self.claims_api.get(namespace, name)
        view = claim_view(claim) if claim is not None else None
        refusals = self._unservable(view, infos)
        booked = self._book(view, infos, refusals)
        todo = plan(view, infos, refusals)
        sent: set[str] = set()
        try:
            for alloc_key in todo.release:
                log.info("claim %s: releasing allocation %s", key, alloc_key)
                await self.api.delete_allocation(alloc_key)
                # Seen as deleting until the watch says so: a reconcile in
                # between would send the same delete again (1.8 deletes per
                # claim pod in bench-dra before).
                bucket = self.allocs.get(key, {})
                if alloc_key in bucket:
                    bucket[alloc_key] = replace(bucket[alloc_key], deleting=True)
            if view is not None:
                creating = [d for d in todo.create if d.device in booked]
                await self._create_all(view, creating, booked, sent)
        finally:
            # Booked but never sent (a failed release first, a cancelled
            # reconcile): nothing was written, so nothing is held.
            for device, allocation in booked.items():
                if device not in sent:
                    self._unbook(key, allocation.key)
        if todo.statuses is not None and view is not None:
            await self.claims_api.set_device_statuses(view.namespace, view.name, todo.statuses)
            for device, refusal in sorted(todo.refused.items()):
                log.info("claim %s: device %s refused (%s): %s",
                         key, device, refusal.reason, refusal.message)  # fmt: skip
                if self.metrics is not None:
                    self.metrics.dra_claims_refused.labels(refusal.reason).inc()

    async def _settle(self, key: str) -> None:
        """Reads each allocation of the claim whose create had no clear
        answer and that the watch has not shown yet (an expected create):
        one that is absent was never created, and its booking goes; one that
        exists stays booked, and the watch brings it."""
        for alloc_key in sorted(self.allocs.get(key, {})):
            if not self.expect.pending(Write.CREATE, alloc_key):
                continue
            found = await self.claims_api.get_allocation(alloc_key)
            if not self.expect.pending(Write.CREATE, alloc_key):
                continue  # the watch told meanwhile
            self.expect.seen(Write.CREATE, alloc_key)
            if found is None:
                log.info("claim %s: allocation %s was never created; its booking goes",
                         key, alloc_key)  # fmt: skip
                self._unbook(key, alloc_key)

    def _unbook(self, key: str, alloc_key: str) -> None:
        self.ledger.remove_allocation(alloc_key)
        self.expect.seen(Write.CREATE, alloc_key)
        bucket = self.allocs.get(key)
        if bucket is not None:
            bucket.pop(alloc_key, None)
            if not bucket:
                del self.allocs[key]

    def _unservable(self, view: ClaimView | None, infos: list[AllocInfo]) -> dict[str, Refusal]:
        """Devices whose allocation will not be ready: pending on a node whose
        agent is not live. Left waiting, the pod would sit in the scheduler's
        PreBind until its timeout (10 minutes); failed, the claim goes back
        at once (a ready one is never failed: its pod may run)."""
        refusals: dict[str, Refusal] = {}
        if view is None:
            return refusals
        mine = {i.device: i for i in infos if i.claim_uid == view.uid and not i.deleting}
        for device in view.devices:
            info = mine.get(device.device)
            if info is None or info.phase in (names.PHASE_READY, names.PHASE_FAILED):
                continue
            inventory = self.ledger.node(device.pool)
            if inventory is not None and not inventory.live:
                refusals[device.device] = Refusal(
                    AGENT_DOWN,
                    f"the vnpu-agent of node {device.pool} is not live (its Lease "
                    f"{names.lease_name(device.pool)} expired, or the Node is gone) before "
                    f"allocation {info.key} was ready; check the vnpu-agent pod on {device.pool}",
                )
        return refusals

    def _book(
        self, view: ClaimView | None, infos: list[AllocInfo], refusals: dict[str, Refusal]
    ) -> dict[str, Allocation]:
        """Chooses and books, one device at a time, a vNPU id for each
        allocated device that has no allocation yet; records in `refusals`
        why a device can have none. Each choice reads the node's capacity
        after the previous booking, so two devices of one claim (or any two
        writers) never get one id."""
        booked: dict[str, Allocation] = {}
        if view is None or view.deleting:
            return booked  # a deleting claim gets no new vNPU (plan refuses its devices)
        have = {i.device for i in infos if i.claim_uid == view.uid}
        for device in view.devices:
            if device.device in have or device.device in refusals:
                continue
            refused = route_refusal(view, device)
            if refused is not None:
                refusals[device.device] = refused
                continue
            chosen = pick_vnpu_id(self.ledger.node_state(device.pool), device.device, device.pool)
            if isinstance(chosen, Refusal):
                refusals[device.device] = chosen
                continue
            allocation = Allocation.from_api(allocation_body(view, device, chosen))
            self.ledger.add_allocation(allocation)
            booked[device.device] = allocation
        return booked

    async def _create_all(
        self,
        view: ClaimView,
        devices: list[ClaimDevice],
        booked: dict[str, Allocation],
        sent: set[str],
    ) -> None:
        """Creates the booked devices' allocations, each on its own: one that
        fails neither undoes nor stops another, so a two-device claim never
        loses the first device's booking to the second's failure. `sent`
        gets each device tried. The first failure is raised once all were
        tried (the claim is reconciled again)."""
        failure: Exception | None = None
        for device in devices:
            sent.add(device.device)
            try:
                await self._create(view, device, booked[device.device])
            except Exception as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    async def _create(self, view: ClaimView, device: ClaimDevice, booked: Allocation) -> None:
        body = allocation_body(view, device, booked.vnpu_id)
        # Seen as created until the watch delivers it: a reconcile in between
        # must not create it again under another id.
        self.allocs.setdefault(view.key, {})[booked.key] = AllocInfo(
            key=booked.key, claim_uid=view.uid, device=device.device,
            phase=None, message="", deleting=False,
        )  # fmt: skip
        try:
            await self.api.create_allocation(body)
        except BaseException as exc:
            if isinstance(exc, Exception) and never_written(exc):
                self._unbook(view.key, booked.key)
            else:
                # It may exist: the id stays booked until the watch or a read says.
                self.expect.sent(Write.CREATE, booked.key)
                log.warning(
                    "claim %s: creating allocation %s (vNPU %d on node %s) had no clear "
                    "answer (%s); its booking is kept until it is seen or found absent",
                    view.key, booked.key, booked.vnpu_id, device.pool, type(exc).__name__,
                )  # fmt: skip
            raise
        log.info(
            "claim %s: device %s -> allocation %s (vNPU %d on node %s)",
            view.key, device.device, booked.key, booked.vnpu_id, device.pool,
        )  # fmt: skip

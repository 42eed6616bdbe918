"""The DRA front-end's controller: one reconcile per ResourceClaim at a time,
from caches of the claims of our driver and the allocations that name them.

It writes through the same services as the pod controller (allocations by
`OperatorApi`, ids from the same `Ledger`), so a claim's vNPU is declared,
booked and released exactly as an annotated pod's; what to do is
`plan.plan`'s call, which vNPU id `plan.pick_vnpu_id`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common import names
from vnpu_common.backoff import Backoff
from vnpu_common.informer import key_of
from vnpu_common.types import Raw
from vnpu_common.workqueue import RetryLater, WorkQueue
from vnpu_operator.dra.claimapi import ClaimApi
from vnpu_operator.dra.plan import (
    AllocInfo,
    ClaimDevice,
    ClaimView,
    alloc_info,
    claim_view,
    pick_vnpu_id,
    plan,
)
from vnpu_operator.kubeapi import OperatorApi
from vnpu_operator.placement import Allocation, Ledger
from vnpu_operator.placement.capacity import NodeState

log = logging.getLogger(__name__)


def slim_claim(claim: Mapping[str, Any]) -> Raw:
    """What the controller keeps of a claim: identity, our allocation
    results, reservedFor and our status.devices entries."""
    meta = claim.get("metadata") or {}
    status = claim.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    return {
        "metadata": {
            k: meta[k] for k in ("name", "namespace", "uid", "deletionTimestamp") if k in meta
        },
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
    ) -> None:
        """`ready()`: the pod controller's caches are synced, so the ledger
        holds every allocation and node (no id is chosen before);
        `leading()`: this replica leads (leader.Leadership): a standby keeps
        its caches and reconciles nothing."""
        self.api = api
        self.claims_api = claims_api
        self.ledger = ledger
        self.ready = ready
        self.leading = leading
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

    def allocation_event(self, deleted: bool, obj: Raw) -> None:
        info = alloc_info(obj)
        if info is None:
            return
        meta = obj.get("metadata") or {}
        claim = (obj.get("spec") or {}).get("claim") or {}
        key = f"{meta.get('namespace', '')}/{claim.get('name', '')}"
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
        infos = list(self.allocs.get(key, {}).values())
        claim = self.claims.get(key)
        if claim is None and infos:
            # Not one of ours in the cache (deallocated, or the informer
            # dropped it): the server says whether it still exists.
            namespace, _, name = key.partition("/")
            claim = await self.claims_api.get(namespace, name)
        view = claim_view(claim) if claim is not None else None
        ids, refusals = self._choose(view, infos)
        todo = plan(view, infos, refusals)
        for alloc_key in todo.release:
            log.info("claim %s: releasing allocation %s", key, alloc_key)
            await self.api.delete_allocation(alloc_key)
        for device in todo.create:
            assert view is not None  # plan creates only for a claim that exists
            await self._create(view, device, ids[device.device])
        if todo.statuses is not None and view is not None:
            await self.claims_api.set_device_statuses(view.namespace, view.name, todo.statuses)

    def _choose(
        self, view: ClaimView | None, infos: list[AllocInfo]
    ) -> tuple[dict[str, int], dict[str, str]]:
        """A vNPU id for each allocated device that has no allocation yet, or
        why it can have none."""
        ids: dict[str, int] = {}
        refusals: dict[str, str] = {}
        if view is None or view.deleting:
            return ids, refusals
        have = {i.device for i in infos if i.claim_uid == view.uid}
        states: dict[str, NodeState | None] = {}
        for device in view.devices:
            if device.device in have:
                continue
            if device.pool not in states:
                states[device.pool] = self.ledger.node_state(device.pool)
            state = states[device.pool]
            if state is not None and not state.inventory.status.dra:
                refusals[device.device] = f"node {device.pool} does not serve DRA (agent --dra)"
                continue
            chosen = pick_vnpu_id(state, device.device)
            if isinstance(chosen, str):
                refusals[device.device] = chosen
            else:
                ids[device.device] = chosen
                if state is not None:
                    state.used_ids.add(chosen)
        return ids, refusals

    async def _create(self, view: ClaimView, device: ClaimDevice, vnpu_id: int) -> None:
        body = allocation_body(view, device, vnpu_id)
        booked = Allocation.from_api(body)
        # Booked before the write, as placement books: a second claim on the
        # node must not get the same id while this one is on its way.
        self.ledger.add_allocation(booked)
        try:
            await self.api.create_allocation(body)
        except BaseException:
            self.ledger.remove_allocation(booked.key)
            raise
        # Seen as created until the watch delivers it: a reconcile in between
        # must not create it again under another id.
        self.allocs.setdefault(view.key, {})[booked.key] = AllocInfo(
            key=booked.key, claim_uid=view.uid, device=device.device,
            phase=None, message="", deleting=False,
        )  # fmt: skip
        log.info(
            "claim %s: device %s -> allocation %s (vNPU %d on node %s)",
            view.key, device.device, booked.key, vnpu_id, device.pool,
        )  # fmt: skip

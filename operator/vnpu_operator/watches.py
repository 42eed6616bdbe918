"""The operator's watches of pods, allocations, VNPUNodes and Nodes: every
kind placement and the lifecycle read (pods and allocations are nearly every
event it handles, about 11 per pod at 200 nodes).

They are informers (vnpu_common.kube.informer), not Kopf handlers: Kopf's
per-event machinery cost more CPU than everything the operator does with
the event (docs/DECISIONS.md, 'Watches without Kopf's per-event cost'), and
Kopf lists a kind in one unpaged request (1000 Nodes and 1000 VNPUNodes at
once). ResourceQuotas (the webhook's view of quota) are watched the same
way: Kopf's watcher ended the process on a fault it did not class as
retryable, the informer retries every fault. Kopf only runs the process.
The controller counts as synced once every informer has listed
(`Controller.listed`); they start after the agents' Leases are listed
(handlers.py), so a node is never judged before its Lease is known.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from kubernetes_asyncio import client

from vnpu_common.kube.informer import DELETED, Handler, Informer, ListCall, key_of
from vnpu_common.wire import names
from vnpu_common.wire.types import Raw
from vnpu_operator.admission.quotas import QuotaBook
from vnpu_operator.config import OperatorSettings
from vnpu_operator.controller import SOURCES, Controller
from vnpu_operator.dra.claims import ClaimController
from vnpu_operator.inventories import Inventories
from vnpu_operator.podstate import Write
from vnpu_operator.slim import identity, slim_allocation, slim_object, uid_of

SOURCE_VNPUNODES, SOURCE_NODES, SOURCE_PODS, SOURCE_ALLOCATIONS = SOURCES


def managed_pod(pod: Mapping[str, Any]) -> bool:
    """A pod the operator manages: one that asks for vNPUs, or that it
    admitted (our label, gate or finalizer) whatever its annotations say now.
    Filtering on the template annotation alone lost every later event of a
    pod whose annotation someone removed, its deletion included: the pod
    stayed Terminating, or was placed again and again after it was gone."""
    meta = pod.get("metadata") or {}
    if names.ANN_TEMPLATE in (meta.get("annotations") or {}):
        return True
    if names.POD_FINALIZER in (meta.get("finalizers") or []):
        return True
    if (meta.get("labels") or {}).get(names.LABEL_MANAGED) == "true":
        return True
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(isinstance(g, Mapping) and g.get("name") == names.SCHEDULING_GATE for g in gates)


def _pod_identity(pod: Raw) -> Raw | None:
    """What the informer remembers of a managed pod (the controller keeps its
    own slim copy): enough to tell the controller it is gone."""
    return identity(pod) if managed_pod(pod) else None


def _informer(
    source: str,
    list_call: ListCall,
    handle: Handler,
    keep: Callable[[Raw], Raw | None],
    controller: Controller,
    settings: OperatorSettings,
) -> Informer:
    """Keyed by uid: an object deleted and re-created under its name while
    the watch was down is reported gone."""
    return Informer(
        source,
        list_call,
        handle,
        keep=keep,
        key=uid_of,
        timeout_seconds=settings.watch_timeout_seconds,
        retry_max_seconds=settings.retry_max_seconds,
        listed=partial(controller.listed, source),
        # The controller acts on nothing before every informer has listed.
        stream_first_list=True,
    )


def _event_type(kind: str) -> str | None:
    """The controller's event type: DELETED, or None for anything it holds now."""
    return "DELETED" if kind == DELETED else None


def still_ours(controller: Controller, obj: Raw) -> bool:
    """Whether a pod the selected watch reports DELETED may still exist: the
    operator has not removed our finalizer, and the event's content (or, for
    a re-list that reports the pod by identity only, the cached copy) still
    carries it. Only the operator removes it and the API server removes no
    object before its finalizers, so then only the label went. A pod already
    deleted with grace 0 goes in the very update that removes our finalizer,
    and the watch reports the content before that update: the finalizer is
    still in it, so our removal must be asked first."""
    uid = uid_of(obj)
    if controller.expect.pending(Write.UNFINALIZE, uid):
        return False
    meta = obj.get("metadata") or {}
    if "finalizers" not in meta:
        meta = (controller.pods.get(uid) or {}).get("metadata") or {}
    return names.POD_FINALIZER in (meta.get("finalizers") or [])


def pod_informer(
    api_client: client.ApiClient, controller: Controller, settings: OperatorSettings
) -> Informer:
    """Only pods labelled `vnpu.io/managed=true`: the webhook labels every pod
    it admits for vNPUs, so ordinary pods cost the operator no event and no
    memory. A pod that loses the label reaches the watch as DELETED; one
    `still_ours` is relabelled by the leader instead of forgotten
    (docs/DECISIONS.md, "Watches")."""
    core = client.CoreV1Api(api_client)

    async def handle(kind: str, obj: Raw) -> None:
        if kind == DELETED and still_ours(controller, obj):
            controller.pod_unlabelled(uid_of(obj))
            return
        controller.pod_event(_event_type(kind), obj)

    return Informer(
        SOURCE_PODS,
        core.list_pod_for_all_namespaces,
        handle,
        label_selector=f"{names.LABEL_MANAGED}=true",
        keep=_pod_identity,
        key=uid_of,
        timeout_seconds=settings.watch_timeout_seconds,
        retry_max_seconds=settings.retry_max_seconds,
        listed=partial(controller.listed, SOURCE_PODS),
        stream_first_list=True,
    )


def last_known_allocation(controller: Controller, obj: Raw) -> Raw:
    """The allocation a DELETED event is about. After a re-list the informer
    reports a vanished object by what it kept of it, its identity: the
    controller's copy has the rest (its pod, whether it was being deleted)."""
    if "spec" in obj:
        return slim_allocation(obj)
    cached = controller.allocs.get(key_of(obj))
    if cached is not None and uid_of(cached) == uid_of(obj):
        return cached
    return slim_allocation(obj)


def _list_ours(api_client: client.ApiClient, plural: str) -> ListCall:
    """The list call of one of our kinds, cluster-wide."""
    custom = client.CustomObjectsApi(api_client)
    return partial(custom.list_cluster_custom_object, names.GROUP, names.VERSION, plural)


def allocation_informer(
    api_client: client.ApiClient,
    controller: Controller,
    settings: OperatorSettings,
    claims: ClaimController | None = None,
) -> Informer:
    """`claims`: the DRA front-end, told of the allocations that serve a claim."""

    async def handle(kind: str, obj: Raw) -> None:
        if kind == DELETED:
            last = last_known_allocation(controller, obj)
            controller.allocation_gone(last)
            if claims is not None:
                claims.allocation_event(True, last)
        else:
            slim = slim_allocation(obj)
            controller.allocation_seen(slim)
            if claims is not None:
                claims.allocation_event(False, slim)

    list_call = _list_ours(api_client, names.ALLOCATION_PLURAL)
    return _informer(SOURCE_ALLOCATIONS, list_call, handle, identity, controller, settings)


def vnpunode_informer(
    api_client: client.ApiClient,
    controller: Controller,
    inventories: Inventories,
    settings: OperatorSettings,
) -> Informer:
    async def handle(kind: str, obj: Raw) -> None:
        inventories.vnpunode_event(_event_type(kind), slim_object(obj))

    list_call = _list_ours(api_client, names.NODE_PLURAL)
    return _informer(SOURCE_VNPUNODES, list_call, handle, identity, controller, settings)


def node_informer(
    api_client: client.ApiClient,
    controller: Controller,
    inventories: Inventories,
    settings: OperatorSettings,
) -> Informer:
    """The inventories keep their own slim copy of a Node (labels, taints,
    our extended resources); a status heartbeat changes none of it."""
    core = client.CoreV1Api(api_client)

    async def handle(kind: str, obj: Raw) -> None:
        inventories.node_event(_event_type(kind), obj)

    return _informer(SOURCE_NODES, core.list_node, handle, identity, controller, settings)


def claim_informer(
    api_client: client.ApiClient, claims: ClaimController, settings: OperatorSettings
) -> Informer:
    """ResourceClaims of every namespace; only ours are kept (ClaimController.keep)."""
    resource = client.ResourceV1Api(api_client)

    async def handle(kind: str, obj: Raw) -> None:
        claims.claim_event(kind == DELETED, obj)

    return Informer(
        "resourceclaims",
        resource.list_resource_claim_for_all_namespaces,
        handle,
        keep=claims.keep,
        timeout_seconds=settings.watch_timeout_seconds,
        retry_max_seconds=settings.retry_max_seconds,
        listed=claims.claims_listed,
    )


def quota_informer(
    api_client: client.ApiClient, quotas: QuotaBook, settings: OperatorSettings
) -> Informer:
    """ResourceQuotas of every namespace, for the webhook's refusals. Not one
    of the controller's sources: placement never reads them."""
    core = client.CoreV1Api(api_client)

    async def handle(kind: str, obj: Raw) -> None:
        quotas.seen(obj, deleted=kind == DELETED)

    return Informer(
        "resourcequotas",
        core.list_resource_quota_for_all_namespaces,
        handle,
        keep=identity,
        timeout_seconds=settings.watch_timeout_seconds,
        retry_max_seconds=settings.retry_max_seconds,
    )

"""The operator's writes to the API server, each one request.

Kept in one place so the API economy (writes per pod lifecycle) is easy to
audit: create and delete allocations, the one pinning patch, the pod
finalizer removal, the waiting condition, and Events a user should see.
Every write that fails is counted, by operation and HTTP status, in
`vnpu_operator_api_errors_total` (through `vnpu_common.kube.apiwrites`, as the
agent's are).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Counter

from vnpu_common.kube.apiwrites import Writes, remove_allocation_finalizer
from vnpu_common.kube.rawcall import call_json
from vnpu_common.wire import names
from vnpu_common.wire.events import event_body, now_rfc3339
from vnpu_common.wire.patches import JSON_PATCH, MERGE, STRATEGIC, finalizer_removal
from vnpu_operator.placement import Allocation

log = logging.getLogger(__name__)

COMPONENT = "vnpu-operator"


def allocation_body(alloc: Allocation, pod: Mapping[str, Any]) -> dict[str, Any]:
    """A VNPUAllocation object as the operator creates it: owned by the pod,
    labelled for the agent's watch, held by the agent's finalizer."""
    meta = pod.get("metadata") or {}
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.ALLOCATION_KIND,
        "metadata": {
            "name": alloc.name,
            "namespace": alloc.namespace,
            "labels": {names.LABEL_NODE: alloc.node, names.LABEL_POD_UID: alloc.pod_uid},
            "finalizers": [names.ALLOCATION_FINALIZER],
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta.get("name", alloc.pod_name),
                    "uid": alloc.pod_uid,
                    "controller": True,
                }
            ],
        },
        "spec": alloc.to_spec().to_api(),
    }


def budget_refusal(exc: ApiException) -> str | None:
    """The message of an eviction a PodDisruptionBudget refused (429 with a
    DisruptionBudget cause), else None: a 429 without one is the API
    server's own throttling, an error to retry."""
    if exc.status != 429:
        return None
    try:
        status = json.loads(exc.body or b"{}")
    except (TypeError, ValueError):
        return None
    if not isinstance(status, dict):
        return None
    causes = (status.get("details") or {}).get("causes") or []
    budget = [str(c.get("message", "")) for c in causes if c.get("reason") == "DisruptionBudget"]
    if not budget:
        return None
    return "; ".join([str(status.get("message", "")).rstrip("."), *budget]).strip("; ")


# An eviction's answers that are not failures: the pod gone, or replaced by a
# pod of the same name (the uid precondition), or a PodDisruptionBudget's refusal.
_EVICTION_GONE = (404, 409)


def _eviction_answered(exc: ApiException) -> bool:
    return exc.status in _EVICTION_GONE or budget_refusal(exc) is not None


class OperatorApi:
    def __init__(
        self,
        api_client: client.ApiClient,
        errors: Counter,
        fence: Callable[[str], None] | None = None,
    ) -> None:
        """`errors`: the counter of failed writes, labelled (operation, status);
        `fence(operation)`: raises to keep a write unsent (the leader
        election's `Leadership.check`: only the leader writes)."""
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.host = os.environ.get("HOSTNAME", "")
        self._writes = Writes(errors, fence)

    async def _write(
        self,
        operation: str,
        fn: Callable[..., Awaitable[Any]],
        *args: Any,
        done: tuple[int, ...] = (),
        **kwargs: Any,
    ) -> bool:
        """One request: True if it succeeded, False if it answered a status in
        `done` (an outcome that leaves nothing to do, such as NotFound for a
        delete). Any other failure is counted and raised."""
        try:
            await self._writes.call(operation, fn, *args, expected=done, **kwargs)
        except ApiException as exc:
            if exc.status in done:
                return False
            raise
        return True

    async def create_allocation(self, body: dict[str, Any]) -> bool:
        """True if created, False if it already existed (a retried create)."""
        return await self._write(
            "create_allocation",
            self.custom.create_namespaced_custom_object,
            names.GROUP,
            names.VERSION,
            body["metadata"]["namespace"],
            names.ALLOCATION_PLURAL,
            body,
            done=(409,),
        )

    async def delete_allocation(self, key: str) -> None:
        namespace, _, name = key.partition("/")
        await self._write(
            "delete_allocation",
            self.custom.delete_namespaced_custom_object,
            names.GROUP,
            names.VERSION,
            namespace,
            names.ALLOCATION_PLURAL,
            name,
            done=(404,),
        )

    async def patch_pod(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> None:
        await self._write(
            "patch_pod", self.core.patch_namespaced_pod, name, namespace, ops,
            _content_type=JSON_PATCH,
        )  # fmt: skip

    async def remove_pod_finalizer(self, pod: Mapping[str, Any]) -> bool:
        """True once the finalizer is off (or the pod gone)."""
        ops = finalizer_removal(pod.get("metadata") or {}, names.POD_FINALIZER)
        if ops is None:
            return True
        meta = pod["metadata"]
        await self._write(
            "patch_pod", self.core.patch_namespaced_pod, meta["name"], meta["namespace"], ops,
            _content_type=JSON_PATCH, done=(404,),
        )  # fmt: skip
        return True

    async def remove_allocation_finalizer(self, obj: Mapping[str, Any]) -> None:
        """Only for an allocation no agent will ever serve (see
        lifecycle.unservable): normally its node's agent removes it after
        destroying the vNPU. A 422 (the object was replaced, or the list
        changed) is left to the next event."""
        await remove_allocation_finalizer(self._writes, self.custom, obj.get("metadata") or {})

    async def patch_node_status(self, name: str, patch: dict[str, Any]) -> None:
        """A merge patch of a Node's status (our extended resources); a node
        gone meanwhile needs nothing."""
        await self._write(
            "patch_node_status", self.core.patch_node_status, name, patch,
            _content_type=MERGE, done=(404,),
        )  # fmt: skip

    async def relabel_pod(self, pod: Mapping[str, Any]) -> bool:
        """Puts `vnpu.io/managed` back on a pod someone took it from (the pod
        watch selects on it). False when that pod is gone: a 404, or a 409
        for the uid precondition (another pod now has its name)."""
        meta = pod.get("metadata") or {}
        body = {"metadata": {"uid": meta.get("uid"), "labels": {names.LABEL_MANAGED: "true"}}}
        return await self._write(
            "patch_pod", self.core.patch_namespaced_pod, meta.get("name"), meta.get("namespace"),
            body, _content_type=MERGE, done=(404, 409),
        )  # fmt: skip

    async def pod_gone(self, pod: Mapping[str, Any]) -> bool:
        """A read, not a write: True when the pod, or at least the one with
        this uid, no longer exists. For the rare moments the cache may hold a
        pod whose deletion no event reported."""
        meta = pod.get("metadata") or {}
        try:
            current = await call_json(
                self.core.read_namespaced_pod, meta.get("name"), meta.get("namespace")
            )
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return bool((current.get("metadata") or {}).get("uid") != meta.get("uid"))

    async def set_pod_condition(
        self, pod: Mapping[str, Any], status: str, reason: str, message: str
    ) -> None:
        meta = pod["metadata"]
        condition = {
            "type": names.POD_COND_ALLOCATED,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now_rfc3339(),
        }
        await self._write(
            "patch_pod_status",
            self.core.patch_namespaced_pod_status,
            meta["name"],
            meta["namespace"],
            {"status": {"conditions": [condition]}},
            _content_type=STRATEGIC,
            done=(404,),
        )

    async def set_nominated_node(self, pod: Mapping[str, Any], node: str | None) -> bool:
        """status.nominatedNodeName: the node a preempting pod's claim is on
        (None clears it), which `kubectl get pod -o wide` shows, and the
        vnpu.io/nominated-node annotation, the operator's own record of it,
        in the same write (a status write may change metadata): a restarted
        operator rebuilds the claim only where both agree. False: the pod is
        gone."""
        meta = pod["metadata"]
        return await self._write(
            "patch_pod_status",
            self.core.patch_namespaced_pod_status,
            meta["name"],
            meta["namespace"],
            {
                "metadata": {"annotations": {names.ANN_NOMINATED_NODE: node}},
                "status": {"nominatedNodeName": node},
            },
            _content_type=MERGE,
            done=(404,),
        )

    async def evict_pod(self, pod: Mapping[str, Any], *, dry_run: bool = False) -> str | None:
        """A policy/v1 Eviction of the pod (this very pod: its uid is a
        precondition). None when it is evicted, or gone already; the API
        server's words when a PodDisruptionBudget refuses it. A dry run asks
        the same question and evicts nothing."""
        meta = pod.get("metadata") or {}
        options: dict[str, Any] = {"preconditions": {"uid": meta.get("uid")}}
        if dry_run:
            options["dryRun"] = ["All"]
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
            "deleteOptions": options,
        }
        try:
            await self._writes.call(
                "evict_pod",
                self.core.create_namespaced_pod_eviction,
                meta.get("name"),
                meta.get("namespace"),
                body,
                expected=_eviction_answered,
            )
        except ApiException as exc:
            if exc.status in _EVICTION_GONE:
                return None
            refusal = budget_refusal(exc)
            if refusal is not None:
                return refusal
            raise
        return None

    async def event(
        self,
        obj: Mapping[str, Any],
        *,
        reason: str,
        message: str,
        warning: bool = False,
    ) -> None:
        """A core/v1 Event about `obj`. Losing one is not worth failing a
        reconcile for, so errors are logged, not raised."""
        body = event_body(
            obj,
            reason=reason,
            message=message,
            warning=warning,
            component=COMPONENT,
            host=self.host,
        )
        namespace = body["metadata"]["namespace"]
        try:
            await self._write("create_event", self.core.create_namespaced_event, namespace, body)
        except Exception as exc:
            log.warning("event %s on %s/%s lost: %s", reason, namespace,
                        (obj.get("metadata") or {}).get("name"), exc)  # fmt: skip

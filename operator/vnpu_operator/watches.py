"""The operator's watches of pods and allocations: nearly every event it
handles (about 11 per pod at 200 nodes) is one of these two kinds.

They are informers (vnpu_common.informer), not Kopf handlers: Kopf's
per-event machinery cost more CPU than everything the operator does with
the event (docs/DECISIONS.md, 'Watches without Kopf's per-event cost').
Kopf still watches the low-rate kinds (VNPUNodes, Nodes, ResourceQuotas) and
runs the process. The controller counts as synced only once Kopf's kinds and
both informers have listed (`Controller.listed`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from kubernetes_asyncio import client

from vnpu_common import names
from vnpu_common.informer import DELETED, Informer, Raw
from vnpu_operator.config import OperatorSettings
from vnpu_operator.controller import SOURCES, Controller
from vnpu_operator.slim import slim_object

SOURCE_PODS, SOURCE_ALLOCATIONS = SOURCES[1:]


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


def _uid(obj: Raw) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


def _pod_identity(pod: Raw) -> Raw | None:
    """What the informer remembers of a managed pod (the controller keeps its
    own slim copy): enough to tell the controller it is gone."""
    if not managed_pod(pod):
        return None
    meta = pod.get("metadata") or {}
    return {"metadata": {k: meta.get(k) for k in ("uid", "name", "namespace")}}


def pod_informer(
    api_client: client.ApiClient, controller: Controller, settings: OperatorSettings
) -> Informer:
    core = client.CoreV1Api(api_client)

    async def handle(kind: str, obj: Raw) -> None:
        controller.pod_event("DELETED" if kind == DELETED else None, obj)

    return Informer(
        SOURCE_PODS,
        core.list_pod_for_all_namespaces,
        handle,
        keep=_pod_identity,
        key=_uid,
        timeout_seconds=settings.watch_timeout_seconds,
        retry_max_seconds=settings.retry_max_seconds,
        listed=partial(controller.listed, SOURCE_PODS),
    )


def allocation_informer(
    api_client: client.ApiClient, controller: Controller, settings: OperatorSettings
) -> Informer:
    custom = client.CustomObjectsApi(api_client)

    async def handle(kind: str, obj: Raw) -> None:
        if kind == DELETED:
            controller.allocation_gone(slim_object(obj))
        else:
            controller.allocation_seen(slim_object(obj))

    return Informer(
        SOURCE_ALLOCATIONS,
        partial(
            custom.list_cluster_custom_object, names.GROUP, names.VERSION, names.ALLOCATION_PLURAL
        ),
        handle,
        keep=slim_object,
        key=_uid,
        timeout_seconds=settings.watch_timeout_seconds,
        retry_max_seconds=settings.retry_max_seconds,
        listed=partial(controller.listed, SOURCE_ALLOCATIONS),
    )

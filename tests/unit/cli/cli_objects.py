"""Raw API objects, as the plugin lists them, for the plugin's unit tests."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from vnpu_common.wire import names
from vnpu_common.wire.models import ChipStatus, Health, TemplateResources, VNPUInfo, VNPUNodeStatus

GB = 1024
NOW = 1_800_000_000.0
AGENT_NS = "vnpu-system"

# 910B3 as the driver describes it (docs/ASCEND.md): 20 AICore, 64 GB, 7 AICPU.
TEMPLATES_910B3 = {"vir05_1c_16g": (5, 16 * GB, 1), "vir10_3c_32g": (10, 32 * GB, 3)}


def chip(
    index: int = 0, *, health: Health = "Healthy", vnpus: Sequence[tuple[int, str]] = ()
) -> ChipStatus:
    return ChipStatus(
        index=index,
        physical_id=index,
        card_id=index,
        device_id=0,
        model="910B3",
        health=health,
        aicore_total=20,
        aicore_free=20,
        memory_total_mb=64 * GB,
        memory_free_mb=64 * GB,
        aicpu_total=7,
        aicpu_free=7,
        vnpu_id_min=100 + 16 * index,
        vnpu_id_max=115 + 16 * index,
        templates=[
            TemplateResources(name=n, aicore=c, memory_mb=m, aicpu=p)
            for n, (c, m, p) in TEMPLATES_910B3.items()
        ],
        vnpus=[VNPUInfo(id=i, template=t) for i, t in vnpus],
    )


def vnpunode(name: str, *chips: ChipStatus, dra: bool = False) -> dict[str, Any]:
    status = VNPUNodeStatus(driver="sim", chips=list(chips), chip_count=len(chips), dra=dra)
    return {"metadata": {"name": name}, "status": status.to_api()}


def node(
    name: str, *, labels: Mapping[str, str] | None = None, taints: Sequence[dict[str, str]] = ()
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {"taints": list(taints)},
    }


def lease(node_name: str, *, renewed_ago: float = 1.0, duration: int = 40) -> dict[str, Any]:
    renewed = dt.datetime.fromtimestamp(NOW - renewed_ago, dt.UTC)
    return {
        "metadata": {"name": names.lease_name(node_name), "namespace": AGENT_NS},
        "spec": {
            "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "leaseDurationSeconds": duration,
        },
    }


def allocation(
    namespace: str,
    pod: str,
    uid: str,
    node_name: str,
    chip_index: int,
    vnpu_id: int,
    template: str = "vir05_1c_16g",
    *,
    phase: str | None = "Ready",
    index: int = 0,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": names.API_VERSION,
        "kind": names.ALLOCATION_KIND,
        "metadata": {"name": f"{pod}-{index}", "namespace": namespace},
        "spec": {
            "podName": pod,
            "podUID": uid,
            "nodeName": node_name,
            "chip": chip_index,
            "template": template,
            "vnpuId": vnpu_id,
        },
        "status": {} if phase is None else {"phase": phase},
    }
    return obj


def pod(
    namespace: str,
    name: str,
    *,
    template: str | None = "vir05_1c_16g",
    count: int | None = None,
    phase: str = "Pending",
    node_name: str | None = None,
    condition: tuple[str, str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if template is not None:
        annotations[names.ANN_TEMPLATE] = template
    if count is not None:
        annotations[names.ANN_COUNT] = str(count)
    status: dict[str, Any] = {"phase": phase}
    if condition is not None:
        state, reason, message = condition
        status["conditions"] = [
            {
                "type": names.POD_COND_ALLOCATED,
                "status": state,
                "reason": reason,
                "message": message,
                "lastTransitionTime": "2027-01-15T08:00:00Z",
            }
        ]
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node_name:
        spec["nodeName"] = node_name
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "annotations": annotations,
            "labels": {names.LABEL_MANAGED: "true"},
        },
        "spec": spec,
        "status": status,
    }


def limits_pod(
    namespace: str,
    name: str,
    asks: Mapping[str, Mapping[str, int]],
    *,
    annotations: Mapping[str, str] | None = None,
    phase: str = "Pending",
    node_name: str | None = None,
    claim_name: str | None = None,
    unschedulable: str | None = None,
) -> dict[str, Any]:
    """A pod asking `resources.limits: {vnpu.io/<template>: N}`: container ->
    template -> N. `annotations`: what the webhook wrote on the annotation
    path; `claim_name`: the scheduler's claim, as it records it in the pod's
    status (requests named container-<i>-request-<j>, as KEP-5004 names them)."""
    containers = [
        {
            "name": container,
            "image": "busybox",
            "resources": {"limits": {names.template_resource(t): str(n) for t, n in asks.items()}},
        }
        for container, asks in asks.items()
    ]
    status: dict[str, Any] = {"phase": phase}
    if claim_name is not None:
        status["extendedResourceClaimStatus"] = {
            "resourceClaimName": claim_name,
            "requestMappings": [
                {
                    "containerName": c["name"],
                    "resourceName": resource,
                    "requestName": f"container-{i}-request-{j}",
                }
                for i, c in enumerate(containers)
                for j, resource in enumerate(c["resources"]["limits"])
            ],
        }
    if unschedulable is not None:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": unschedulable,
                "lastTransitionTime": "2027-01-15T08:00:00Z",
            }
        ]
    spec: dict[str, Any] = {"containers": containers}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": status,
    }


def binding(ready: bool, message: str) -> list[dict[str, str]]:
    """A device's binding conditions as the operator writes them (dra.plan)."""
    if ready:
        return [
            {"type": names.DRA_COND_READY, "status": "True", "reason": "VNPUReady",
             "message": message},
        ]  # fmt: skip
    return [
        {"type": names.DRA_COND_FAILED, "status": "True", "reason": "AllocationFailed",
         "message": message},
        {"type": names.DRA_COND_READY, "status": "False", "reason": "AllocationFailed",
         "message": message},
    ]  # fmt: skip


def dra_claim(
    namespace: str,
    name: str,
    pod_name: str,
    devices: Sequence[tuple[str, str, str]],
    *,
    template: str = "vir05_1c_16g",
    conditions: Mapping[str, list[dict[str, str]]] | None = None,
) -> dict[str, Any]:
    """The scheduler's claim for pod `pod_name`: devices (request, node, device)
    allocated, `conditions` the binding conditions per device."""
    requests = sorted({r for r, _, _ in devices})
    claim: dict[str, Any] = {
        "apiVersion": names.RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "annotations": {names.DRA_EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
            "ownerReferences": [{"kind": "Pod", "name": pod_name, "uid": f"uid-{pod_name}"}],
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": r,
                        "exactly": {"deviceClassName": names.template_device_class(template)},
                    }
                    for r in requests
                ]
            }
        },
        "status": {},
    }
    if devices:
        claim["status"]["allocation"] = {
            "devices": {
                "results": [
                    {"request": r, "driver": names.DRA_DRIVER, "pool": n, "device": d}
                    for r, n, d in devices
                ]
            }
        }
        claim["status"]["reservedFor"] = [
            {"resource": "pods", "name": pod_name, "uid": f"uid-{pod_name}"}
        ]
    if conditions:
        claim["status"]["devices"] = [
            {"driver": names.DRA_DRIVER, "pool": n, "device": d, "conditions": conditions[d]}
            for _, n, d in devices
            if d in conditions
        ]
    return claim


def dra_allocation(
    claim: Mapping[str, Any], request: str, device: str, vnpu_id: int, *, phase: str = "Ready"
) -> dict[str, Any]:
    """The VNPUAllocation the operator writes for one device of `claim`."""
    meta = claim["metadata"]
    parsed = names.parse_dra_device_name(device)
    assert parsed is not None
    chip_index, template, _ = parsed
    node_name = next(
        r["pool"] for r in claim["status"]["allocation"]["devices"]["results"]
        if r["device"] == device
    )  # fmt: skip
    pod_name = meta["ownerReferences"][0]["name"]
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.ALLOCATION_KIND,
        "metadata": {
            "name": names.dra_allocation_name(meta["uid"], device),
            "namespace": meta["namespace"],
        },
        "spec": {
            "podName": pod_name,
            "podUID": f"uid-{pod_name}",
            "nodeName": node_name,
            "chip": chip_index,
            "template": template,
            "vnpuId": vnpu_id,
            "claim": {
                "name": meta["name"],
                "uid": meta["uid"],
                "request": request,
                "device": device,
            },
        },
        "status": {"phase": phase},
    }

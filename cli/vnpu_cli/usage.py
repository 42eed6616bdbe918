"""`kubectl vnpu usage`: per namespace, what its pods' vNPUs take (count,
AICore, device memory), how many of its vNPU pods wait for capacity, and its
vNPU quota.

Use is summed over VNPUAllocations, the placement ledger's own records, with
each template's size from the catalog the nodes publish, so it can never
disagree with what placement books. A terminating allocation still counts:
its vNPU holds the chip until the agent destroys it.

The quota columns are the API server's own count, used/hard, from the
namespace's ResourceQuotas (requests.vnpu.io/vnpus, aicore, memory-mb; the
tightest where several set one): a pod is charged from its creation, so a
waiting pod counts there and not in VNPUS. '-' where no quota caps it.
"""

from __future__ import annotations

from typing import Any

from vnpu_cli.snapshot import Snapshot, allocation_resources, catalog
from vnpu_cli.table import table
from vnpu_common.wire import names
from vnpu_common.wire.types import Raw
from vnpu_operator.admission.quotas import VNPUQuota


def build(snapshot: Snapshot, namespace: str | None = None) -> dict[str, Any]:
    """`snapshot.pods`: the vNPU pods (label vnpu.io/managed) of the
    namespaces shown; `namespace` None shows every namespace that has any."""
    inventories = {i.name: i for i in snapshot.inventories()}
    known = catalog(inventories.values())
    rows: dict[str, dict[str, Any]] = {}

    def row(ns: str) -> dict[str, Any]:
        return rows.setdefault(
            ns,
            {
                "namespace": ns,
                "pods": set(),
                "vnpus": 0,
                "aicore": 0,
                "memoryMB": 0,
                "unsized": 0,
                "waiting": 0,
                "quota": None,
            },
        )

    held: set[str] = set()
    for allocation, _ in snapshot.parsed_allocations():
        if namespace is not None and allocation.namespace != namespace:
            continue
        r = row(allocation.namespace)
        r["pods"].add(allocation.pod_uid)
        r["vnpus"] += 1
        held.add(allocation.pod_uid)
        need = allocation_resources(allocation, inventories, known)
        if need is None:
            r["unsized"] += 1  # nobody offers its template any more
        else:
            r["aicore"] += need.aicore
            r["memoryMB"] += need.memory_mb
    for raw in snapshot.quotas:
        quota = VNPUQuota.from_api(raw)
        if quota is None or (namespace is not None and quota.namespace != namespace):
            continue
        caps = row(quota.namespace)["quota"] = row(quota.namespace)["quota"] or {}
        for resource, hard in quota.hard.items():
            if resource not in caps or hard < caps[resource]["hard"]:
                caps[resource] = {
                    "hard": hard, "used": quota.used.get(resource, 0), "quota": quota.name
                }  # fmt: skip
    for pod in snapshot.pods:
        meta = pod.get("metadata") or {}
        ns = str(meta.get("namespace", ""))
        if (namespace is not None and ns != namespace) or not _waits(pod, held):
            continue
        row(ns)["waiting"] += 1
    out = []
    for ns in sorted(rows):
        r = rows[ns]
        out.append({**r, "pods": len(r["pods"])})
    return {"namespaces": out}


def _waits(pod: Raw, held: set[str]) -> bool:
    """A vNPU pod with no allocation yet that has not ended or been deleted."""
    meta = pod.get("metadata") or {}
    if names.ANN_TEMPLATE not in (meta.get("annotations") or {}):
        return False
    if meta.get("uid") in held or meta.get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def text(report: dict[str, Any]) -> str:
    if not report["namespaces"]:
        return "No vNPUs in use and no vNPU pod waiting.\n"
    return table(
        [
            "NAMESPACE",
            "PODS",
            "VNPUS",
            "AICORE",
            "MEMORY-MB",
            "WAITING",
            "VNPU-QUOTA",
            "AICORE-QUOTA",
            "MEMORY-QUOTA",
        ],
        [
            [
                r["namespace"],
                r["pods"],
                r["vnpus"],
                r["aicore"],
                r["memoryMB"],
                r["waiting"],
                *(_quota_cell(r["quota"], res) for res in QUOTA_COLUMNS),
            ]
            for r in report["namespaces"]
        ],
    )


QUOTA_COLUMNS = (names.RES_VNPUS, names.RES_AICORE, names.RES_MEMORY_MB)


def _quota_cell(caps: dict[str, dict[str, Any]] | None, resource: str) -> str | None:
    cap = (caps or {}).get(resource)
    return None if cap is None else f"{cap['used']}/{cap['hard']}"

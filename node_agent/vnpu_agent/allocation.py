"""One VNPUAllocation as the agent reads it: the fields its loops, the
VNPUNode, the metrics and the DRA plugin use, read from the raw watch object
in one place.

Lenient on purpose: the cache holds the raw objects (a full model per
allocation costs what the agent spends at 250 nodes per process), and a
field of the wrong type reads as absent, as each reader did on its own.
Serving validates the full model (vnpu_common.wire.models) before it acts on one.

The loops that pass over every allocation of the node on each resync or
status built (serving's requeue and referenced ids, inventory's owners) read
the one or two fields they use with the functions below, which the view
reads through too: a whole view costs some 2 us (most of it the frozen
dataclass's init), a field a tenth of that, and at a full node those loops
were the agent's largest cost per vNPU (bench/agentnode.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) else None


def vnpu_id_of(obj: Mapping[str, Any]) -> int | None:
    """spec.vnpuId (AllocationView.id)."""
    return _int((obj.get("spec") or {}).get("vnpuId"))


def chip_of(obj: Mapping[str, Any]) -> int | None:
    """spec.chip (AllocationView.chip)."""
    return _int((obj.get("spec") or {}).get("chip"))


def phase_of(obj: Mapping[str, Any]) -> str | None:
    """status.phase (AllocationView.phase)."""
    return (obj.get("status") or {}).get("phase")


def is_deleting(obj: Mapping[str, Any]) -> bool:
    """metadata.deletionTimestamp is set (AllocationView.deleting)."""
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def owner_of(obj: Mapping[str, Any]) -> tuple[int, str, str | None] | None:
    """(spec.vnpuId, namespace/name, spec.podUID) (AllocationView.id, key,
    pod_uid); None without a vNPU id."""
    vnpu_id = vnpu_id_of(obj)
    if vnpu_id is None:
        return None
    meta = obj.get("metadata") or {}
    pod_uid = (obj.get("spec") or {}).get("podUID")
    return vnpu_id, f"{meta.get('namespace')}/{meta.get('name')}", pod_uid


@dataclass(frozen=True, slots=True)
class AllocationView:
    namespace: str | None
    name: str | None
    node: str | None  # spec.nodeName
    id: int | None  # spec.vnpuId
    chip: int | None
    template: str  # "" when absent
    pod: str  # spec.podName, "" when absent
    pod_uid: str | None
    claim_uid: str | None  # spec.claim.uid
    dra: bool  # it has a spec.claim: a DRA claim's, not an annotated pod's
    phase: str | None  # status.phase, None before the agent's first
    deleting: bool  # metadata.deletionTimestamp is set

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> AllocationView:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        claim = spec.get("claim") or {}
        return cls(
            namespace=meta.get("namespace"),
            name=meta.get("name"),
            node=spec.get("nodeName"),
            id=vnpu_id_of(obj),
            chip=chip_of(obj),
            template=str(spec.get("template", "")),
            pod=str(spec.get("podName", "")),
            pod_uid=spec.get("podUID"),
            claim_uid=claim.get("uid"),
            dra=bool(claim),
            phase=phase_of(obj),
            deleting=is_deleting(obj),
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

"""One VNPUAllocation as the agent reads it: the fields its loops, the
VNPUNode, the metrics and the DRA plugin use, read from the raw watch object
in one place.

Lenient on purpose: the cache holds the raw objects (a full model per
allocation costs what the agent spends at 250 nodes per process), and a
field of the wrong type reads as absent, as each reader did on its own.
Serving validates the full model (vnpu_common.wire.models) before it acts on one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) else None


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
            id=_int(spec.get("vnpuId")),
            chip=_int(spec.get("chip")),
            template=str(spec.get("template", "")),
            pod=str(spec.get("podName", "")),
            pod_uid=spec.get("podUID"),
            claim_uid=claim.get("uid"),
            dra=bool(claim),
            phase=(obj.get("status") or {}).get("phase"),
            deleting=bool(meta.get("deletionTimestamp")),
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

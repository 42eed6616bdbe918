"""Placement engine: which node, chip and vNPU id each pod's vNPUs get.

Pure Python over an in-memory ledger; no Kubernetes client, no asyncio.

- `ledger`: allocations and inventories, and `Ledger.place`, which decides and
  books in one synchronous call.
- `model`: the plain data it keeps: inventories, allocations, placements.
- `request`: what a pod asks for, read as the webhook admitted it.
- `candidates`: per request shape, the ranked nodes kept, so a placement
  re-asks only the nodes that changed.
- `fitting`: whether and how one request fits one node.
- `capacity`: a chip's capacity from declarations, never its lagging `*_free`.
- `scoring`: how each policy ranks chips and nodes; ties broken so a decision
  is reproducible.
- `selectors`: nodeSelector, required node affinity, taints, as kube-scheduler
  reads them.
- `catalog`: the (chip model, template) pairs the nodes offer, kept node by node.
- `fragmentation`: how much free capacity the largest template can still use.
- `defrag`: the defragmentation advice, planned on a private copy.
- `preemption`: which lower-priority pods a waiting one may evict, and where
  (DefaultPreemption over vNPUs).
- `nominations`: preempting pods' claims on a node, booked first.
- `nofit_memo`: alike waiting pods cost one placement per capacity change.
- `reasons`: why a pod did not fit: codes, tally, the user's message.
- `errors`: typed errors that are ValueErrors too.
"""

from __future__ import annotations

# The most vNPUs of one pod, under the name the controller knows it by.
from vnpu_operator.annotations import COUNT_MAX as MAX_COUNT
from vnpu_operator.placement.capacity import ChipCapacity
from vnpu_operator.placement.errors import (
    AllocationConflictError,
    InvalidAllocationError,
    InvalidInventoryError,
    InvalidRequestError,
    PlacementError,
)
from vnpu_operator.placement.ledger import Ledger
from vnpu_operator.placement.model import (
    Allocation,
    NodeInventory,
    Placement,
    Policy,
    Resources,
    allocation_name,
)
from vnpu_operator.placement.reasons import NoFit, Reason
from vnpu_operator.placement.request import PodRequest

__all__ = [
    "MAX_COUNT",
    "Allocation",
    "AllocationConflictError",
    "ChipCapacity",
    "InvalidAllocationError",
    "InvalidInventoryError",
    "InvalidRequestError",
    "Ledger",
    "NoFit",
    "NodeInventory",
    "Placement",
    "PlacementError",
    "PodRequest",
    "Policy",
    "Reason",
    "Resources",
    "allocation_name",
]

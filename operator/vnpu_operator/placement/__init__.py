"""Placement engine: which node, chip and vNPU id each pod's vNPUs get.

Pure Python over an in-memory ledger; no Kubernetes client, no asyncio.
"""

from __future__ import annotations

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
from vnpu_operator.placement.request import (
    MAX_COUNT,
    MIN_COUNT,
    PodRequest,
    VNPURequest,
    parse_annotations,
)

__all__ = [
    "MAX_COUNT",
    "MIN_COUNT",
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
    "VNPURequest",
    "allocation_name",
    "parse_annotations",
]

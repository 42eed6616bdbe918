"""Placement engine: which node, chip and vNPU id each pod's vNPUs get.

Pure Python over an in-memory ledger; no Kubernetes client, no asyncio.
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

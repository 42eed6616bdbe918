"""Typed errors of the placement engine.

Each subclasses ValueError as well, so callers that only know "the input was
bad" can catch that; callers that care (webhook vs. handler) catch the
specific type and report `field` to the user.
"""

from __future__ import annotations


class PlacementError(Exception):
    """Base of every error the placement package raises."""


class InvalidRequestError(PlacementError, ValueError):
    """A pod's vNPU request (annotations or scheduling directives) is malformed.

    `named`: the message names the field already (the annotation parser's
    messages, the webhook's words), so it is not prefixed with it again."""

    def __init__(self, field: str, message: str, *, named: bool = False) -> None:
        super().__init__(message if named else f"{field}: {message}")
        self.field = field
        self.reason = message


class InvalidInventoryError(PlacementError, ValueError):
    """A node inventory (VNPUNode status, Node labels or taints) is malformed."""


class InvalidAllocationError(PlacementError, ValueError):
    """A VNPUAllocation object cannot be read into the ledger."""


class AllocationConflictError(PlacementError):
    """The ledger already holds allocations of the pod that contradict the
    request (other template, more vNPUs, several nodes): placing again would
    either double-book or silently drop declared ownership."""

"""Waiting pods that ask alike cost one placement per capacity change.

Bookings only ever shrink free capacity, so a request that did not fit still
does not until capacity grows: hundreds of alike waiting pods retried after
each release would otherwise each run a placement over every node.
"""

from __future__ import annotations

from typing import Any

from vnpu_operator.placement.ledger import Ledger
from vnpu_operator.placement.model import Placement, Policy
from vnpu_operator.placement.reasons import NoFit
from vnpu_operator.placement.request import PodRequest


def _signature(request: PodRequest, avoid: frozenset[str]) -> tuple[Any, ...]:
    """What placement reads of a request, minus who asks."""
    return (
        request.template,
        request.count,
        request.chip_model,
        request.charged,
        request.where,
        avoid,
        # A preempting pod's claim closes a node to its priority and lower only.
        request.priority,
    )


class NoFitMemo:
    def __init__(self) -> None:
        self._nofits: dict[tuple[Any, ...], NoFit] = {}

    def capacity_grew(self) -> None:
        """Something freed capacity, added a node or dropped a preempting
        pod's claim: every answer is stale."""
        self._nofits.clear()

    @staticmethod
    def signature(
        ledger: Ledger, request: PodRequest, avoid: frozenset[str]
    ) -> tuple[Any, ...] | None:
        """What placement reads of the request, alike for requests that fit
        or not alike; None for a pod always placed afresh: one holding part
        of its booking, or a claim as a preempting pod (its own bookings
        change what fits, and the claim closes nodes to others only)."""
        if ledger.allocations_for(request.uid) or ledger.nomination(request.uid) is not None:
            return None
        return _signature(request, avoid)

    def peek(
        self, ledger: Ledger, request: PodRequest, policy: Policy, *, avoid: frozenset[str]
    ) -> NoFit | None:
        """`ledger.peek`, remembered as `place` remembers its NoFits."""
        signature = self.signature(ledger, request, avoid)
        if signature is None:
            return None
        cached = self._nofits.get(signature)
        if cached is not None:
            return cached
        result = ledger.peek(request, policy, avoid)
        if result is not None:
            self._nofits[signature] = result
        return result

    def place(
        self,
        ledger: Ledger,
        request: PodRequest,
        policy: Policy,
        *,
        avoid: frozenset[str],
        first_index: int,
    ) -> Placement | NoFit:
        """`ledger.place`, answered from memory for a request like one that
        did not fit since the last growth."""
        signature = self.signature(ledger, request, avoid)
        if signature is not None:
            cached = self._nofits.get(signature)
            if cached is not None:
                return cached
        result = ledger.place(request, policy, avoid=avoid, first_index=first_index)
        if signature is not None and isinstance(result, NoFit):
            self._nofits[signature] = result
        return result

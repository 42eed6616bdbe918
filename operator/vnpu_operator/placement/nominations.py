"""Preempting pods' claims (nominations): the node where a pod's victims
release capacity for it (placement.preemption). The ledger keeps them here
and books them first: pods of the claim's priority or lower book around it,
higher ones do not see it, as with kube-scheduler's nominatedNodeName."""

from __future__ import annotations

from dataclasses import dataclass

from vnpu_operator.placement.request import PodRequest


@dataclass(frozen=True)
class Nomination:
    node: str
    request: PodRequest
    victims: frozenset[str] = frozenset()


class Claims:
    """The nominations by pod uid, and the uids claiming each node."""

    def __init__(self) -> None:
        self._by_pod: dict[str, Nomination] = {}
        self._on: dict[str, set[str]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_pod)

    def add(self, nomination: Nomination) -> None:
        uid = nomination.request.uid
        self._by_pod[uid] = nomination
        self._on.setdefault(nomination.node, set()).add(uid)

    def remove(self, uid: str) -> Nomination | None:
        old = self._by_pod.pop(uid, None)
        if old is not None:
            uids = self._on.get(old.node)
            if uids is not None:
                uids.discard(uid)
                if not uids:
                    del self._on[old.node]
        return old

    def get(self, uid: str) -> Nomination | None:
        return self._by_pod.get(uid)

    def all(self) -> dict[str, Nomination]:
        return dict(self._by_pod)

    def held_for(self, node: str, request: PodRequest) -> list[PodRequest]:
        """The nominees `request` must leave room for on `node`: those of
        equal or higher priority but itself, highest first."""
        uids = self._on.get(node)
        if not uids:
            return []
        held = [self._by_pod[u].request for u in uids if u != request.uid]
        held = [r for r in held if r.priority >= request.priority]
        return sorted(held, key=lambda r: (-r.priority, r.uid))

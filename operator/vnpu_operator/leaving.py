"""Pods kube-scheduler still counts on a node after the ledger freed them.

kube-scheduler sums the requests of every pod bound to a node that is neither
gone nor terminal (Succeeded, Failed) against the node's allocatable. The
ledger frees a deleted pod's capacity once its vNPUs are destroyed, which can
come before its object goes: our finalizer's removal is still in flight, or
another finalizer or the kubelet holds the object. A pod ungated onto the node
in that window finds it full in the scheduler's sum and is refused there; one
of higher priority makes kube-scheduler preempt on its own, which may evict a
second pod and leaves a nominatedNodeName behind (on Kubernetes 1.34 it
outlives the binding). So the PIN step holds a pod while the node's sum does
not fit and some of it is pods on their way out (`Leaving.blocking`); any
change to a pod bound there retries it (`Leaving.pod_event`).

Only pods being deleted hold a pin back, so that the wait ends: a running
pod that lost its vNPUs is the scheduler's to judge, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from vnpu_common.wire.quantity import quantity_value
from vnpu_common.wire.types import Raw
from vnpu_operator.lifecycle import is_deleting, is_terminal
from vnpu_operator.placement import Ledger
from vnpu_operator.slim import charged_requests


def over_allocatable(
    allocatable: Mapping[str, object], requests: Iterable[Mapping[str, int]]
) -> list[str]:
    """The resources whose summed `requests` exceed the node's `allocatable`
    (quantities as the Node shows them); a resource the Node does not show is
    not judged (the advertiser has not written it yet: the scheduler refuses
    such a pod whatever we wait for)."""
    total: dict[str, int] = {}
    for each in requests:
        for resource, amount in each.items():
            total[resource] = total.get(resource, 0) + amount
    over = []
    for resource, amount in sorted(total.items()):
        limit = quantity_value(allocatable.get(resource))
        if limit is not None and amount > limit:
            over.append(resource)
    return over


def _counted(pod: Raw, node: str) -> bool:
    """Whether kube-scheduler counts `pod` on `node` once every pinned pod
    there is bound: bound there or on its way (unbound), and not terminal."""
    bound = str((pod.get("spec") or {}).get("nodeName") or "")
    return bound in ("", node) and not is_terminal(pod)


class Leaving:
    """The cached pods by the node they are bound to, and the pins held back
    for pods leaving a node."""

    def __init__(self, pods: Mapping[str, Raw], ledger: Ledger, nodes: Mapping[str, Raw]) -> None:
        """`pods`: the controller's slim pod copies by UID; `nodes`: the slim
        Node copies (slim_node keeps our resources' allocatable)."""
        self.pods = pods
        self.ledger = ledger
        self.nodes = nodes
        self._by_node: dict[str, set[str]] = {}
        self._node_of: dict[str, str] = {}
        # UID of each pod whose pin waits for pods leaving its node -> (that node,
        # since when). Few at any time: a scan of it is cheaper than a second index.
        self._held: dict[str, tuple[str, float]] = {}

    def pod_event(self, uid: str, pod: Raw | None) -> set[str]:
        """Records where the pod is bound (None: it is gone). Returns the pods
        whose pin waits on that node: this pod's change may have freed it."""
        old = self._node_of.pop(uid, "")
        if old:
            self._by_node[old].discard(uid)
            if not self._by_node[old]:
                del self._by_node[old]
        node = str(((pod or {}).get("spec") or {}).get("nodeName") or "")
        if node:
            self._node_of[uid] = node
            self._by_node.setdefault(node, set()).add(uid)
        if pod is None:
            self.release(uid)
        touched = old or node
        if not touched:
            return set()
        return {held for held, (at, _) in self._held.items() if at == touched and held != uid}

    def blocking(self, uid: str, node: str, now: float) -> list[Raw]:
        """The pods leaving `node` that keep pod `uid`, placed there, from
        being ungated: [] when the node's sum fits or nothing is leaving.
        A held pod is remembered, with the time `now` of its first hold,
        until it is pinned (`release`) or gone."""
        on_node = self._by_node.get(node, set())
        leaving = [
            pod
            for other in sorted(on_node)
            if (pod := self.pods.get(other)) is not None
            and is_deleting(pod)
            and not is_terminal(pod)
            and charged_requests(pod)
            and not self.ledger.allocations_for(other)
        ]
        if not leaving:
            self.release(uid)
            return []
        uids = on_node | {a.pod_uid for a in self.ledger.allocations_on(node)} | {uid}
        counted = [
            charged_requests(pod)
            for other in sorted(uids)
            if (pod := self.pods.get(other)) is not None and _counted(pod, node)
        ]
        allocatable = (self.nodes.get(node, {}).get("status") or {}).get("allocatable") or {}
        if not over_allocatable(allocatable, counted):
            self.release(uid)
            return []
        if self._held.get(uid, ("", 0.0))[0] != node:
            self._held[uid] = (node, now)
        return leaving

    def held_for(self, uid: str, now: float) -> float:
        """Seconds pod `uid` has been held back at its node (0 if it is not)."""
        held = self._held.get(uid)
        return 0.0 if held is None else now - held[1]

    def release(self, uid: str) -> None:
        """Pod `uid` no longer waits to be pinned anywhere."""
        self._held.pop(uid, None)

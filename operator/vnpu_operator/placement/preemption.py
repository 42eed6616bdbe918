"""Which running vNPU pods a waiting pod of higher priority may evict, and where.

kube-scheduler preempts for CPU and memory but cannot see chips, so a vNPU
pod of high priority would wait behind best-effort pods forever. This is the
scheduler's algorithm (DefaultPreemption) over vNPU capacity, as a pure
function: the ledger, the request and what the controller knows of the pods
holding vNPUs go in, a plan comes out; nothing is booked or changed.

Per node that passes the pod's own filters (liveness, selector, affinity,
taints): remove every pod of strictly lower priority; if the request still
does not fit, the node is out. Otherwise put them back one by one, highest
priority first (then the one holding least), keeping each that still lets
the request fit: what remains is the smallest set this order finds. Among
the nodes, the plan whose most important victim is least important wins,
then the smallest sum of priorities, the fewest victims, the node's name.
A pod of equal or higher priority is never a victim.

Pods already terminating release their capacity by themselves: they count
as gone on every node, and never as victims. Where they alone make room,
nobody is evicted. Nominees (other preempting pods' claims, Ledger.held_for)
are booked before the request, as placement books them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from vnpu_operator.placement.capacity import template_resources
from vnpu_operator.placement.fitting import fit_node, hold, node_filter
from vnpu_operator.placement.ledger import Ledger
from vnpu_operator.placement.model import Policy
from vnpu_operator.placement.reasons import NoFit, Reason
from vnpu_operator.placement.request import PodRequest

# The per-node reasons that evicting pods can cure: everything about a chip
# being full, and a claim of a preempting pod that a higher priority ignores.
CAPACITY_REASONS = frozenset(
    {
        Reason.INSUFFICIENT_AICORE,
        Reason.INSUFFICIENT_MEMORY,
        Reason.INSUFFICIENT_AICPU,
        Reason.INSUFFICIENT_MEDIA,
        Reason.NO_FREE_VNPU_ID,
        Reason.NOMINATED,
    }
)


@dataclass(frozen=True)
class Candidate:
    """A pod holding vNPUs, as preemption weighs it."""

    uid: str
    # namespace/name, for Events and messages.
    key: str
    priority: int
    # Deleted or ended: its vNPUs are on their way out without an eviction.
    terminating: bool = False


@dataclass(frozen=True)
class Plan:
    node: str
    # The pods to evict, highest priority first.
    victims: tuple[Candidate, ...]

    @property
    def rank(self) -> tuple[int, int, int, str]:
        """How kube-scheduler orders candidate nodes: smaller is better."""
        priorities = [v.priority for v in self.victims]
        return (max(priorities), sum(priorities), len(priorities), self.node)


def worth_trying(nofit: NoFit) -> bool:
    """Whether some node turned the pod away for capacity, the only thing
    evicting pods can change (not a template nobody offers, not a selector)."""
    return any(reason in CAPACITY_REASONS for reason in nofit.node_reasons.values())


def plan(
    ledger: Ledger,
    request: PodRequest,
    pods: Mapping[str, Candidate],
    policy: Policy = Policy.BINPACK,
    *,
    protected: Collection[str] = (),
    avoid: Collection[str] = (),
) -> Plan | None:
    """The best plan, or None: no node can be freed for the request by
    evicting lower-priority pods, or terminating pods already free enough
    somewhere (then waiting is enough). `pods`: uid -> every pod known to
    hold vNPUs (one the map lacks is never a victim); `protected`: uids a
    PodDisruptionBudget refused to let go; `avoid`: nodes where this pod's
    vNPUs failed before."""
    best: Plan | None = None
    for name in ledger.node_names():
        if name in avoid:
            continue
        found = _node_plan(ledger, name, request, pods, policy, protected)
        if found is _ENOUGH:
            return None
        if isinstance(found, Plan) and (best is None or found.rank < best.rank):
            best = found
    return best


class _Enough:
    """Terminating pods alone make room on a node."""


_ENOUGH = _Enough()


def _node_plan(
    ledger: Ledger,
    name: str,
    request: PodRequest,
    pods: Mapping[str, Candidate],
    policy: Policy,
    protected: Collection[str],
) -> Plan | _Enough | None:
    inventory = ledger.node(name)
    if inventory is None or node_filter(inventory, request) is not None:
        return None
    held = ledger.held_for(name, request)

    def fits(gone: Collection[str]) -> bool:
        state = ledger.state_without(name, gone)
        if state is None or hold(state, held, policy) is not None:
            return False
        return not isinstance(fit_node(state, request, request.count, policy), Reason)

    on_node = {a.pod_uid for a in ledger.allocations_on(name)} - {request.uid}
    known = [pods[uid] for uid in sorted(on_node) if uid in pods]
    leaving = {c.uid for c in known if c.terminating}
    if fits(leaving):
        return _ENOUGH
    lower = [
        c
        for c in known
        if not c.terminating and c.priority < request.priority and c.uid not in protected
    ]
    if not lower or not fits(leaving | {c.uid for c in lower}):
        return None
    sizes = _holdings(ledger, name)
    victims = list(lower)
    for reprieved in sorted(lower, key=lambda c: (-c.priority, sizes.get(c.uid, (0, 0)), c.uid)):
        rest = [c for c in victims if c is not reprieved]
        if fits(leaving | {c.uid for c in rest}):
            victims = rest
    # Never empty: putting every one back would be fits(leaving), which failed.
    return Plan(name, tuple(sorted(victims, key=lambda c: (-c.priority, c.uid))))


def _holdings(ledger: Ledger, name: str) -> dict[str, tuple[int, int]]:
    """Pod uid -> (AICore, memory MB) its vNPUs take on the node: what
    orders pods of one priority by what they hold."""
    inventory = ledger.node(name)
    chips = {} if inventory is None else {c.index: c for c in inventory.status.chips}
    out: dict[str, tuple[int, int]] = {}
    for alloc in ledger.allocations_on(name):
        chip = chips.get(alloc.chip)
        need = None if chip is None else template_resources(chip, alloc.template, {})
        aicore, memory = out.get(alloc.pod_uid, (0, 0))
        if need is not None:
            aicore, memory = aicore + need.aicore, memory + need.memory_mb
        out[alloc.pod_uid] = (aicore, memory)
    return out

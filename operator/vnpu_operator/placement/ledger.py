"""The ledger: allocations and node inventories, and placement over them.

`place` decides and books in one synchronous call. The operator runs every
reconcile on one asyncio event loop and no ledger method awaits, so nothing
else can touch the ledger between a decision and its booking: two placements
never take the same capacity or vNPU id. That, not a lock, is the guarantee,
so the ledger must only ever be called from that loop's thread.

The ledger holds declarations only; it can be rebuilt from the API objects
after a restart and then books exactly what the old one would have.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass, replace

from vnpu_common.wire.models import TemplateResources
from vnpu_operator.placement.candidates import CandidateIndex
from vnpu_operator.placement.capacity import (
    ChipCapacity,
    Fingerprint,
    NodeState,
    build_node_state,
    fingerprint,
)
from vnpu_operator.placement.catalog import CatalogIndex
from vnpu_operator.placement.errors import AllocationConflictError
from vnpu_operator.placement.fitting import Fit, fit_node, hold, node_filter
from vnpu_operator.placement.fragmentation import (
    Fragmentation,
    node_fragmentation,
)
from vnpu_operator.placement.model import (
    Allocation,
    ChargedSize,
    NodeInventory,
    Placement,
    Policy,
    allocation_name,
)
from vnpu_operator.placement.nominations import Claims, Nomination
from vnpu_operator.placement.reasons import NoFit, Reason
from vnpu_operator.placement.request import PodRequest
from vnpu_operator.placement.scoring import Rank

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Destroyed:
    """A vNPU taken as destroyed while its node's inventory may still list it.
    `owner`: its allocation's key, the name an inventory built before the
    destroy gives it. `version`: the deletion's resourceVersion; None when
    taken from the gone owner an inventory named (Ledger.seed_released)."""

    owner: str
    version: int | None
    seeded: bool = False


class Ledger:
    def __init__(self) -> None:
        self._nodes: dict[str, NodeInventory] = {}
        # The node names in order: a NoFit lists every node.
        self._names: list[str] = []
        self._allocs: dict[str, Allocation] = {}
        self._by_pod: dict[str, set[str]] = {}
        self._by_node: dict[str, set[str]] = {}
        self._catalog = CatalogIndex()
        # node -> (chip, id, template) -> vNPUs destroyed since the node's
        # inventory last showed them.
        self._destroyed: dict[str, dict[tuple[int, int, str], _Destroyed]] = {}
        # Moves whenever the offered (chip model, template) pairs or what
        # they take change; most inventory updates change capacity, not the
        # offer, and most new nodes offer what others do.
        self.catalog_epoch = 0
        # node -> the templates it offers as a DRA node (the webhook's route for
        # vnpu.io/<template>); moves catalog_epoch too, not the kept answers.
        self._dra_offer: dict[str, frozenset[str]] = {}
        # node -> (template, chip model, charge, count, policy) -> what fitting.fit_node said.
        # A node's answer only changes when the node does (inventory,
        # liveness, an allocation on it) or the catalog does, so a stream of
        # placements re-evaluates one node each instead of every node.
        # The key ends with the nominees booked first (see nominations below).
        self._fits: dict[str, dict[_FitKey, Fit]] = {}
        # node -> its capacity as built from the inventory and the allocations,
        # dropped with its fits. Building it sums every vNPU on the node; a
        # placement asks a changed node once per request shape, each from a copy.
        self._states: dict[str, NodeState] = {}
        # Fits by what a node holds rather than by its name (capacity.fingerprint):
        # a request shape's first placement asks every node, and most nodes
        # of a cluster look alike then (empty, or holding the same few
        # vNPUs), so one fit answers for all of them. Node -> its print, and
        # (print, fit key) -> the fit.
        self._prints: dict[str, Fingerprint] = {}
        self._classes: dict[str, Hashable] = {}
        self._shared_fits: dict[tuple[Fingerprint, _FitKey], Fit] = {}
        # The nodes each request shape fits on, ranked (placement.candidates).
        self._candidates: CandidateIndex[list[tuple[int, int]], Reason] = CandidateIndex()
        # Preempting pods' claims: pod uid -> its nomination; node -> uids.
        self._claims = Claims()

    @classmethod
    def rebuild(
        cls, inventories: Iterable[NodeInventory], allocations: Iterable[Allocation]
    ) -> Ledger:
        """A ledger from what the API server holds, e.g. after a restart."""
        ledger = cls()
        # Nothing was destroyed or fitted yet, so the rest of what
        # upsert_node does has nothing to do; the names are sorted once.
        for inventory in inventories:
            ledger._nodes[inventory.name] = inventory
            ledger._catalog.set_node(inventory.name, _offer(inventory))
            ledger._set_dra_offer(inventory.name, inventory)
        ledger._names = sorted(ledger._nodes)
        ledger._catalog_moved()
        for allocation in allocations:
            ledger.add_allocation(allocation)
        ledger.seed_released()
        return ledger

    def seed_released(self) -> None:
        """Takes as destroyed every listed vNPU whose owning allocation (as the
        inventory names it) is gone, once every allocation is known: the agent
        removes an allocation's finalizer only after destroying its vNPU and
        writes the node's status at leisure after that (it restates the
        deletion). A ledger without memory of the deletions (a restarted
        operator, `kubectl vnpu`) would count it as an orphan until then."""
        for name, inventory in self._nodes.items():
            released = {
                (chip.index, vnpu.id, vnpu.template): _Destroyed(vnpu.allocation, None, seeded=True)
                for chip in inventory.status.chips
                for vnpu in chip.vnpus
                if vnpu.allocation and vnpu.allocation not in self._allocs
            }
            if released:
                self._destroyed.setdefault(name, {}).update(released)
                self._node_changed(name)

    # ---------------------------------------------------------------- nodes

    def upsert_node(self, inventory: NodeInventory, *, version: int | None = None) -> None:
        """`version`: the VNPUNode's resourceVersion, which tells whether the
        inventory was published after a vNPU was destroyed."""
        self._forget_destroyed(inventory, version)
        old = self._nodes.get(inventory.name)
        self._nodes[inventory.name] = inventory
        if old is None:
            bisect.insort(self._names, inventory.name)
        self._node_changed(inventory.name)
        # Most updates change capacity, not the offer: comparing the chips'
        # shared template lists is cheaper than the catalog's own comparison.
        offer = _offer(inventory)
        if (old is None or _offer(old) != offer) and self._catalog.set_node(inventory.name, offer):
            self._catalog_moved()
        if self._set_dra_offer(inventory.name, inventory):
            self.catalog_epoch += 1

    def remove_node(self, name: str) -> NodeInventory | None:
        """Forgets the inventory; allocations on the node stay booked until
        their objects are gone."""
        removed = self._nodes.pop(name, None)
        self._node_changed(name)
        if removed is not None:
            del self._names[bisect.bisect_left(self._names, name)]
            if self._catalog.remove_node(name):
                self._catalog_moved()
            if self._set_dra_offer(name, None):
                self.catalog_epoch += 1
        return removed

    def _set_dra_offer(self, name: str, inventory: NodeInventory | None) -> bool:
        """True if what `name` offers as a DRA node changed."""
        status = inventory.status if inventory is not None else None
        offer = (
            frozenset(t.name for c in status.chips for t in status.chip_templates(c))
            if status is not None and status.dra
            else frozenset()
        )
        if self._dra_offer.get(name, frozenset()) == offer:
            return False
        if offer:
            self._dra_offer[name] = offer
        else:
            self._dra_offer.pop(name, None)
        return True

    def dra_templates(self) -> frozenset[str]:
        """The templates some DRA node offers; changes move catalog_epoch."""
        return frozenset().union(*self._dra_offer.values())

    def set_live(self, name: str, live: bool) -> bool:
        """Lease changes arrive apart from inventories; True if known."""
        inventory = self._nodes.get(name)
        if inventory is None:
            return False
        if inventory.live != live:
            self._nodes[name] = replace(inventory, live=live)
            self._node_changed(name)
        return True

    def node(self, name: str) -> NodeInventory | None:
        return self._nodes.get(name)

    def node_names(self) -> list[str]:
        return list(self._names)

    def _node_changed(self, name: str) -> None:
        """What placement knows of the node moved: its cached answers go."""
        self._fits.pop(name, None)
        self._states.pop(name, None)
        self._prints.pop(name, None)
        self._classes.pop(name, None)
        self._candidates.changed(name)

    def _catalog_moved(self) -> None:
        """A template appeared, went or takes other resources: every kept
        answer may differ."""
        self._fits.clear()
        self._states.clear()
        self._prints.clear()
        self._classes.clear()
        self._shared_fits.clear()
        self._candidates.clear()
        self.catalog_epoch += 1

    def offered(self) -> dict[str, frozenset[str]]:
        """Chip model -> the template names some node offers for it: what
        the admission webhook checks requests against. It changes only when
        `catalog_epoch` moves, so callers can keep what they built from it."""
        offered: dict[str, set[str]] = {}
        for model, template in self._catalog.templates:
            offered.setdefault(model, set()).add(template)
        return {model: frozenset(templates) for model, templates in offered.items()}

    def template_sizes(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(chip model, template) -> (AICore, memory MB) a vNPU of it takes:
        what the webhook charges a pod (vnpu_operator.charges)."""
        return {key: (t.aicore, t.memory_mb) for key, t in self._catalog.templates.items()}

    # ---------------------------------------------------------- allocations

    def add_allocation(self, allocation: Allocation) -> bool:
        """Records an allocation; True if the ledger changed. The same data
        twice is a no-op, other data under the same key replaces it."""
        old = self._allocs.get(allocation.key)
        if old == allocation:
            return False
        if old is not None:
            self._unindex(old)
        clash = [
            k
            for k in self._by_node.get(allocation.node, set())
            if self._allocs[k].vnpu_id == allocation.vnpu_id
        ]
        if clash:
            # Declared objects are the truth: record it anyway (its
            # capacity counts twice, so nothing more is placed there).
            log.warning(
                "allocation %s reuses vNPU id %d on node %s, also held by %s",
                allocation.key,
                allocation.vnpu_id,
                allocation.node,
                ", ".join(sorted(clash)),
            )
        self._allocs[allocation.key] = allocation
        self._node_changed(allocation.node)
        self._by_pod.setdefault(allocation.pod_uid, set()).add(allocation.key)
        self._by_node.setdefault(allocation.node, set()).add(allocation.key)
        return True

    def remove_allocation(
        self, key: str, *, destroyed: bool = False, version: int | None = None
    ) -> Allocation | None:
        """Call once the object is gone, not when it is merely marked for
        deletion: until then the id must stay taken. `destroyed`: its agent
        removed the finalizer, which it does only after destroying the vNPU,
        so the vNPU no longer holds capacity even while the node's inventory,
        published seconds apart, still lists it; `version` is the deletion's
        resourceVersion."""
        old = self._allocs.pop(key, None)
        if old is not None:
            self._unindex(old)
            if destroyed:
                vnpu = (old.chip, old.vnpu_id, old.template)
                self._destroyed.setdefault(old.node, {})[vnpu] = _Destroyed(key, version)
        return old

    def _forget_destroyed(self, inventory: NodeInventory, version: int | None) -> None:
        """A destroyed vNPU is forgotten once an inventory no longer lists it,
        or lists it as nobody's (or another's) although published after the
        destroy: then it exists after all (its finalizer removed by hand before
        the destroy, or made again by hand) and holds capacity again. Listed
        under its gone allocation's name, it is a status built before the
        destroy that landed after it (the agent lists a vNPU under an
        allocation only while that allocation stands), so it stays destroyed:
        the agent need not hold the finalizer's removal until its node's
        writes in flight have landed. One taken as destroyed from its gone
        owner's name (seed_released) is forgotten once listed as nobody's."""
        destroyed = self._destroyed.get(inventory.name)
        if not destroyed:
            return
        # (chip, id, template) -> the owning allocation the inventory names, "" for none.
        listed = {
            (c.index, v.id, v.template): v.allocation or ""
            for c in inventory.status.chips
            for v in c.vnpus
        }
        for vnpu, record in list(destroyed.items()):
            owner = listed.get(vnpu)
            if owner is None:
                gone = True
            elif record.seeded:
                # Listed as nobody's now: the agent saw it after its allocation
                # went (a finalizer removed by hand before the destroy): it exists.
                gone = not owner
            else:
                newer = (
                    version is not None and record.version is not None and version > record.version
                )
                gone = newer and owner != record.owner
            if gone:
                del destroyed[vnpu]
        if not destroyed:
            del self._destroyed[inventory.name]

    def release(self, pod_uid: str) -> tuple[Allocation, ...]:
        """Drops every allocation of a pod; returns what was dropped."""
        keys = sorted(self._by_pod.get(pod_uid, ()))
        return tuple(a for a in (self.remove_allocation(k) for k in keys) if a is not None)

    def _unindex(self, alloc: Allocation) -> None:
        self._node_changed(alloc.node)
        for index, bucket in ((self._by_pod, alloc.pod_uid), (self._by_node, alloc.node)):
            keys = index.get(bucket)
            if keys is not None:
                keys.discard(alloc.key)
                if not keys:
                    del index[bucket]

    def allocation(self, key: str) -> Allocation | None:
        return self._allocs.get(key)

    def allocations(self) -> list[Allocation]:
        return [self._allocs[k] for k in sorted(self._allocs)]

    def allocations_for(self, pod_uid: str) -> list[Allocation]:
        return [self._allocs[k] for k in sorted(self._by_pod.get(pod_uid, ()))]

    def allocations_on(self, node: str) -> list[Allocation]:
        return [self._allocs[k] for k in sorted(self._by_node.get(node, ()))]

    # ------------------------------------------------------------- capacity

    def _state(self, inventory: NodeInventory) -> NodeState:
        """A working copy of the node's capacity, to book into."""
        return self._built_state(inventory).copy()

    def _built_state(self, inventory: NodeInventory) -> NodeState:
        """The node's capacity as the ledger holds it; read it, never book into it."""
        state = self._states.get(inventory.name)
        if state is None or state.inventory is not inventory:
            allocs = (self._allocs[k] for k in self._by_node.get(inventory.name, ()))
            destroyed = self._destroyed.get(inventory.name, {})
            state = build_node_state(inventory, allocs, self._catalog.templates, destroyed)
            self._states[inventory.name] = state
        return state

    def node_state(self, name: str) -> NodeState | None:
        """A fresh working copy of one node's capacity, as placement sees it;
        changing it changes nothing here (the defrag advisor measures with it)."""
        inventory = self._nodes.get(name)
        return None if inventory is None else self._state(inventory)

    def capacity(self, node: str | None = None) -> list[ChipCapacity]:
        """Per-chip total/used/free, for metrics; one node or all."""
        names = [node] if node is not None else sorted(self._nodes)
        out: list[ChipCapacity] = []
        for name in names:
            inventory = self._nodes.get(name)
            if inventory is None:
                continue
            state = self._built_state(inventory)
            out.extend(ChipCapacity.of(name, state.chips[i]) for i in sorted(state.chips))
        return out

    def largest_templates(self) -> dict[str, str]:
        """Chip model -> the largest template offered for it."""
        return dict(self._catalog.largest)

    def fragmentation(self, node: str | None = None) -> dict[str, Fragmentation]:
        """Node -> free AICore and how much of it the largest template of
        each chip's model can use (placement.fragmentation); one node or all."""
        names = [node] if node is not None else sorted(self._nodes)
        return {
            name: node_fragmentation(self._built_state(self._nodes[name]), self._catalog.largest)
            for name in names
            if name in self._nodes
        }

    # ------------------------------------------------------------ placement

    def place(
        self,
        request: PodRequest,
        policy: Policy = Policy.BINPACK,
        avoid: Collection[str] = (),
        first_index: int = 0,
    ) -> Placement | NoFit:
        """Chooses a node, chips and vNPU ids for the whole request and books
        them before returning. Placing a pod that already holds allocations
        returns them (completing a partial booking on the same node).
        Nodes in `avoid` (where this pod's vNPUs failed) are not chosen; new
        allocation names count from `first_index`."""
        existing = self.allocations_for(request.uid)
        if existing:
            nodes = {a.node for a in existing}
            if (
                len(nodes) > 1
                or len(existing) > request.count
                or any(a.template != request.template for a in existing)
            ):
                raise AllocationConflictError(
                    f"pod {request.key} ({request.uid}) already holds "
                    f"{', '.join(a.key for a in existing)}, which do not match "
                    f"{request.count} x {request.template} on one node"
                )
            if len(existing) == request.count:
                return Placement(node=existing[0].node, allocations=tuple(existing))
            candidates: Sequence[str] = (existing[0].node,)
        else:
            candidates = self._names
            if not self._claims:
                fast = self._best_candidate(request, request.count, policy, avoid)
                if isinstance(fast, NoFit):
                    return fast
                if fast is not None:
                    return self._book(request, fast[0], fast[1], first_index)

        need = request.count - len(existing)
        reasons: dict[str, Reason] = {}
        best: tuple[Rank, str, list[tuple[int, int]]] | None = None
        for name in candidates:
            inventory = self._nodes.get(name)
            if inventory is None:
                reasons[name] = Reason.NODE_NOT_LIVE
                continue
            if name in avoid:
                reasons[name] = Reason.FAILED_BEFORE
                continue
            blocked = node_filter(inventory, request)
            if blocked is not None:
                reasons[name] = blocked
                continue
            outcome = self._fit(inventory, request, need, policy)
            if isinstance(outcome, Reason):
                reasons[name] = outcome
                continue
            # The policy's rank (placement.scoring); the name breaks ties so
            # results are reproducible.
            slots, rank = outcome
            if best is None or (rank, name) < (best[0], best[1]):
                best = (rank, name, slots)
        if best is None:
            return _no_fit(request, reasons)
        return self._book(request, best[1], best[2], first_index)

    def peek(
        self, request: PodRequest, policy: Policy = Policy.BINPACK, avoid: Collection[str] = ()
    ) -> NoFit | None:
        """The NoFit `place` would answer now, booking nothing; None where
        the request may fit, or where only `place` can tell (the pod holds
        part of its booking, a preempting pod's claim is in force, or the
        kept answers do not cover every node)."""
        if self.allocations_for(request.uid) or self._claims:
            return None
        found = self._best_candidate(request, request.count, policy, avoid)
        return found if isinstance(found, NoFit) else None

    def _best_candidate(
        self, request: PodRequest, need: int, policy: Policy, avoid: Collection[str]
    ) -> tuple[str, list[tuple[int, int]]] | NoFit | None:
        """What the loop in `place` would answer for a request holding
        nothing, from the answers kept per request shape: the node it would
        choose and its slots, or the same NoFit (None: ask the loop). Only
        while nobody holds a claim: claims make a node's answer depend on
        the asking pod's priority and uid."""

        def ask(name: str) -> tuple[Rank, list[tuple[int, int]]] | Reason | None:
            inventory = self._nodes.get(name)
            if inventory is None:
                return None
            blocked = node_filter(inventory, request)
            if blocked is not None:
                return blocked
            outcome = self._fit(inventory, request, need, policy)
            return outcome if isinstance(outcome, Reason) else (outcome[1], outcome[0])

        labels_read = bool(request.node_selector) or request.affinity_terms is not None
        alike = None if labels_read else self._node_class

        shape = (
            request.template,
            request.chip_model,
            request.charged,
            need,
            policy,
            request.where,
        )
        found = self._candidates.best(shape, self._nodes, ask, avoid, alike)
        if found is not None:
            # Nodes alike share one answer's slot list: each booking its own.
            return found[0], list(found[1])
        # Nothing fits outside `avoid`: the loop's reasons, in its order.
        misses = self._candidates.misses(shape)
        reasons: dict[str, Reason] = {}
        for name in self._names:
            reason = Reason.FAILED_BEFORE if name in avoid else misses.get(name)
            if reason is None:
                return None
            reasons[name] = reason
        return _no_fit(request, reasons)

    def _node_class(self, name: str) -> Hashable | None:
        """What node_filter and _fit read of a node for a pod whose filter
        reads no label (capacity fingerprint, liveness, DRA, taints): nodes of
        one class answer such a pod alike. None until its fingerprint is
        known without building its capacity. Kept until the node changes."""
        known = self._classes.get(name)
        if known is not None:
            return known
        inventory = self._nodes.get(name)
        if inventory is None:
            return None
        if inventory.bare and not self._by_node.get(name):
            printed: Fingerprint | None = (inventory.chips_print,)
        else:
            printed = self._prints.get(name)
        if printed is None:
            return None
        known = self._classes[name] = (
            printed, inventory.live, inventory.status.dra, inventory.compiled_taints
        )  # fmt: skip
        return known

    def _fit(self, inventory: NodeInventory, request: PodRequest, need: int, policy: Policy) -> Fit:
        fits = self._fits.setdefault(inventory.name, {})
        held = self.held_for(inventory.name, request)
        key = (
            request.template,
            request.chip_model,
            request.charged,
            need,
            policy,
            tuple(r.uid for r in held),
        )
        outcome = fits.get(key)
        if outcome is not None:
            return outcome
        if held:
            # Nominees are pods, not capacity: their fit is this node's own.
            state = self._state(inventory)
            outcome = fits[key] = hold(state, held, policy, self._catalog.largest) or fit_node(
                state, request, need, policy, self._catalog.largest
            )
            return outcome
        printed = self._prints.get(inventory.name)
        if printed is None:
            if inventory.bare and not self._by_node.get(inventory.name):
                # Nothing on it: its chips say it all, and its capacity need
                # not be built to be told apart (a first placement at
                # thousands of nodes mostly asks such nodes).
                printed = (inventory.chips_print,)
            else:
                printed = fingerprint(self._built_state(inventory))
            self._prints[inventory.name] = printed
        outcome = self._shared_fits.get((printed, key))
        if outcome is None:
            outcome = fit_node(self._state(inventory), request, need, policy, self._catalog.largest)
            if len(self._shared_fits) >= _SHARED_FITS_MAX:
                self._shared_fits.clear()
            self._shared_fits[(printed, key)] = outcome
        if not isinstance(outcome, Reason):
            # Each node its own slot list: callers may hold on to it.
            outcome = (list(outcome[0]), outcome[1])
        fits[key] = outcome
        return outcome

    def _book(
        self,
        request: PodRequest,
        node: str,
        slots: list[tuple[int, int]],
        first_index: int = 0,
    ) -> Placement:
        # Indexes already used by this pod, or (however unlikely) by another
        # pod's key, are skipped: booking must never overwrite a booking.
        keys = (
            f"{request.namespace}/{allocation_name(request.name, request.uid, i)}"
            for i in itertools.count(first_index)
        )
        free_keys = (k for k in keys if k not in self._allocs)
        # Placed: what it was nominated for is its own now.
        self.clear_nomination(request.uid)
        # free_keys is endless; slots decides how many are booked.
        for key, (chip, vnpu_id) in zip(free_keys, slots, strict=False):
            self.add_allocation(
                Allocation(
                    key=key,
                    node=node,
                    chip=chip,
                    template=request.template,
                    vnpu_id=vnpu_id,
                    pod_uid=request.uid,
                    pod_name=request.name,
                )
            )
        return Placement(node=node, allocations=tuple(self.allocations_for(request.uid)))

    # ---------------------------------------------------------- nominations
    # A preempting pod's claim on the node where its victims release capacity
    # (placement.preemption): pods of its priority or lower book around it,
    # higher ones do not see it, as with kube-scheduler's nominatedNodeName.

    def nominate(self, request: PodRequest, node: str, victims: Collection[str] = ()) -> None:
        """`victims`: uids of the pods evicted for it, whose allocations it waits on."""
        self.clear_nomination(request.uid)
        self._claims.add(Nomination(node, request, frozenset(victims)))
        self._node_changed(node)

    def clear_nomination(self, uid: str) -> Nomination | None:
        old = self._claims.remove(uid)
        if old is not None:
            self._node_changed(old.node)
        return old

    def nomination(self, uid: str) -> Nomination | None:
        return self._claims.get(uid)

    def nominations(self) -> dict[str, Nomination]:
        return self._claims.all()

    def held_for(self, node: str, request: PodRequest) -> list[PodRequest]:
        """The nominees `request` must leave room for on `node`: those of
        equal or higher priority but itself, highest first."""
        return self._claims.held_for(node, request)

    def state_without(self, node: str, pods: Collection[str]) -> NodeState | None:
        """A working copy of the node's capacity as if `pods` had released
        everything: their allocations and the vNPUs those declare are left
        out (the inventory would list the vNPUs until their destroy)."""
        inventory = self._nodes.get(node)
        if inventory is None:
            return None
        allocs = [self._allocs[k] for k in self._by_node.get(node, ())]
        gone = {(a.chip, a.vnpu_id, a.template) for a in allocs if a.pod_uid in pods}
        destroyed = gone.union(self._destroyed.get(node, {}))
        kept = (a for a in allocs if a.pod_uid not in pods)
        return build_node_state(inventory, kept, self._catalog.templates, destroyed)


# Fits kept by print at most; alike nodes share a handful, and a cluster
# of unlike nodes simply starts over.
_SHARED_FITS_MAX = 8192

_FitKey = tuple[str, str | None, ChargedSize | None, int, Policy, tuple[str, ...]]


def _no_fit(request: PodRequest, reasons: dict[str, Reason]) -> NoFit:
    charged = request.charged.describe() if request.charged is not None else ""
    return NoFit(request.template, request.count, reasons, charged)


def _offer(inventory: NodeInventory) -> list[tuple[str, list[TemplateResources]]]:
    """What a node contributes to the catalog."""
    status = inventory.status
    return [(chip.model, status.chip_templates(chip)) for chip in status.chips]

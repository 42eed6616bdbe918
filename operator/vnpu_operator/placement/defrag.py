"""The defragmentation advisor: which running pods, rescheduled, would gather
scattered free capacity onto whole chips, and how many more vNPUs of the
largest template would then fit. Advice only: it plans on a private copy of
the ledger and evicts, moves and books nothing.

One step empties one chip. Its pods are released and placed again with the
operator's own `Ledger.place` and policy, the chip cordoned meanwhile (the
way an admin applies the step: cordon, delete and recreate the pods,
uncordon at the end), so the simulation says where each pod would land and
never lands it on the chip being freed. A step is kept only when the
cluster's count of the largest template that fits (placement.fragmentation)
grows and no chip model's count shrinks. Candidates are the chips with the
least used capacity first: they are the cheapest to empty. The search is one
pass, greedy, so it can miss a better combination; it never promises what
the placer would not do.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, replace

from vnpu_operator.placement.capacity import HEALTHY, NodeState, free_id_count, offered
from vnpu_operator.placement.fragmentation import chip_fits, node_fragmentation, whole_chip_fits
from vnpu_operator.placement.ledger import Ledger
from vnpu_operator.placement.model import Allocation, Placement, Policy, Resources
from vnpu_operator.placement.request import PodRequest

# The cordon reason the simulation puts on a chip it empties, and the one
# the plugin tells an admin to use when applying a step.
CORDON_REASON = "defrag"
DEFAULT_MAX_MOVES = 10
# Chips tried at most (each trial places its pods on the whole cluster).
MAX_TRIALS = 300


@dataclass(frozen=True)
class Move:
    """One pod rescheduled: where its vNPUs are, where they would go."""

    pod: PodRequest
    node: str
    chips: tuple[int, ...]
    to_node: str
    to_chips: tuple[int, ...]


@dataclass(frozen=True)
class Step:
    """Emptying one chip: the pods to reschedule, in the order to place them
    again, the chips that become whole-free, and the cluster's count of the
    largest template per chip model before and after."""

    node: str
    chip: int
    moves: tuple[Move, ...]
    whole: tuple[tuple[str, int], ...]
    before: Mapping[str, int]
    after: Mapping[str, int]


@dataclass(frozen=True)
class Plan:
    policy: Policy
    # Chip model -> its largest template (the figure counts vNPUs of it).
    largest: Mapping[str, str]
    # Chip model -> how many more of its largest template fit now, after
    # every step, and at most (all free capacity of the model gathered).
    before: Mapping[str, int]
    after: Mapping[str, int]
    limit: Mapping[str, int]
    steps: tuple[Step, ...]
    # Chips worth emptying, and how many of them were tried (the search
    # stops at max_moves, at the limit, or after MAX_TRIALS tries).
    candidates: int = 0
    tried: int = 0

    @property
    def pods_moved(self) -> int:
        return sum(len(step.moves) for step in self.steps)


def plan(
    ledger: Ledger,
    requests: Mapping[str, PodRequest],
    policy: Policy = Policy.BINPACK,
    *,
    max_moves: int = DEFAULT_MAX_MOVES,
    node: str | None = None,
) -> Plan:
    """`requests`: pod UID -> the pod's own request (selectors, affinity,
    tolerations, chip model; without the operator's pin to its node). A pod
    missing from it is never moved. `node`: empty only chips of this node
    (its pods may still go anywhere their request allows). `ledger` is not
    changed."""
    if max_moves < 1:
        raise ValueError(f"max_moves must be at least 1, not {max_moves}")
    return _Planner(ledger, requests, policy).run(max_moves, node)


class _Skipped:
    """A chip that could not be tried at all (as opposed to a failed trial)."""


SKIPPED = _Skipped()


class _Planner:
    def __init__(self, ledger: Ledger, requests: Mapping[str, PodRequest], policy: Policy) -> None:
        inventories = [inv for inv in map(ledger.node, ledger.node_names()) if inv is not None]
        # The working copy every trial books into and every rejection undoes.
        self.work = Ledger.rebuild(inventories, ledger.allocations())
        self.requests = requests
        self.policy = policy
        self.largest = self.work.largest_templates()
        # Chips this plan emptied: cordoned in `work` so nothing lands there
        # again, counted as in service when measuring (the admin uncordons).
        self.emptied: dict[str, set[int]] = {}
        # Chip model -> what one vNPU of its largest template takes.
        self.needs: dict[str, Resources] = {}
        # node -> what it adds to the figures, kept current as steps land.
        self.measures = {name: self._measure(name) for name in self.work.node_names()}
        self.total = _sum(m.fits for m in self.measures.values())
        # node -> its capacity as `work` holds it; read-only, dropped when a
        # step changes the node (a rejected trial leaves it as it was).
        self.states: dict[str, NodeState | None] = {}
        # Chips filled and pods moved by this plan: none is touched twice.
        self.filled: set[tuple[str, int]] = set()
        self.moved: set[str] = set()
        # Shapes of trials that gained nothing since the last step.
        self.failed: set[Hashable] = set()

    def run(self, max_moves: int, only: str | None) -> Plan:
        before = dict(self.total)
        limit = self._limit()
        steps: list[Step] = []
        budget = max_moves
        candidates = self._candidates(only)
        tried = 0
        for name, index in candidates:
            if budget <= 0 or tried >= MAX_TRIALS or _reached(self.total, limit):
                break
            if (name, index) in self.filled:
                continue
            step = self._try(name, index, budget)
            if step is SKIPPED:
                continue
            tried += 1
            if not isinstance(step, Step):
                continue
            steps.append(step)
            self.failed.clear()
            budget -= len(step.moves)
            self.moved.update(m.pod.uid for m in step.moves)
            self.filled.update((m.to_node, c) for m in step.moves for c in m.to_chips)
            # A pod whose template several models offer may have changed
            # model, and with it each model's free capacity.
            limit = self._limit()
        return Plan(
            policy=self.policy,
            largest=self.largest,
            before=before,
            after=dict(self.total),
            limit=limit,
            steps=tuple(steps),
            candidates=len(candidates),
            tried=tried,
        )

    def _try(self, name: str, index: int, budget: int) -> Step | _Skipped | None:
        """Empties chip `index` of node `name` in `work` and keeps the
        result when it gains; otherwise puts everything back and returns
        None. SKIPPED: the chip could not be tried."""
        work = self.work
        uids = sorted({a.pod_uid for a in work.allocations_on(name) if a.chip == index})
        if not uids or len(uids) > budget or any(u in self.moved for u in uids):
            return SKIPPED
        held = {uid: work.allocations_for(uid) for uid in uids}
        if not all(_movable(self.requests.get(uid), held[uid]) for uid in uids):
            return SKIPPED
        state, inventory = self._cached_state(name), work.node(name)
        if state is None or inventory is None or state.chips[index].orphans:
            return SKIPPED
        requests = [self.requests[u] for u in uids]
        # A chip shaped like one that just failed (same node shape, same
        # pods) fails alike: at 1000 similar nodes that is most of them.
        shape = _shape(state, index, requests, held)
        if shape in self.failed:
            return SKIPPED
        # Biggest requests first: they have the fewest places to go.
        order = sorted(uids, key=lambda u: (-_size(state, held[u]), self.requests[u].key, u))
        wholes_before = self._whole_chips(name)
        # Destroyed, as the agent does before the pod object goes: the
        # node's inventory, which still lists the vNPU, no longer counts it.
        for allocation in (a for uid in uids for a in held[uid]):
            work.remove_allocation(allocation.key, destroyed=True)
        work.upsert_node(replace(inventory, cordoned={**inventory.cordoned, index: CORDON_REASON}))
        self.emptied.setdefault(name, set()).add(index)
        placed: list[tuple[str, Placement]] = []
        for uid in order:
            outcome = work.place(self.requests[uid], self.policy)
            if not isinstance(outcome, Placement):
                break
            placed.append((uid, outcome))
        trial: dict[str, _Measure] = {}
        if len(placed) == len(order):
            touched = {name} | {p.node for _, p in placed}
            trial = {n: self._measure(n) for n in touched}
        if not trial or not _gains(self.measures, trial):
            for uid, _ in placed:
                work.release(uid)
            for allocations in held.values():
                for allocation in allocations:
                    work.add_allocation(allocation)
            work.upsert_node(inventory)
            self.emptied[name].discard(index)
            self.failed.add(shape)
            return None
        was = dict(self.total)
        for n, measure in trial.items():
            self.total = _sum([self.total, measure.fits, _negated(self.measures[n].fits)])
            self.measures[n] = measure
            self.states.pop(n, None)
        moves = tuple(
            Move(
                pod=self.requests[uid],
                node=name,
                chips=tuple(sorted({a.chip for a in held[uid]})),
                to_node=placement.node,
                to_chips=tuple(sorted({a.chip for a in placement.allocations})),
            )
            for uid, placement in placed
        )
        # Only the source node's chips can turn whole: the others only receive.
        whole = self._whole_chips(name) - wholes_before
        return Step(
            node=name,
            chip=index,
            moves=moves,
            whole=tuple(sorted((name, chip) for chip in whole)),
            before=was,
            after=dict(self.total),
        )

    def _candidates(self, only: str | None) -> list[tuple[str, int]]:
        """Chips worth emptying, cheapest first: in service, holding vNPUs
        of pods, on a live node, and able to take more of the largest
        template empty than they take now."""
        ranked: list[tuple[int, int, str, int]] = []
        for name in [only] if only is not None else self.work.node_names():
            state = self.work.node_state(name)
            if state is None or not state.inventory.live:
                continue
            for index, chip in state.chips.items():
                if chip.allocated == 0 or chip.orphans or chip.cordoned is not None:
                    continue
                template = self.largest.get(chip.chip.model)
                if template is None:
                    continue
                now = chip_fits(chip, template, free_id_count(chip.chip, state.used_ids))
                if whole_chip_fits(chip, template) <= now:
                    continue
                ranked.append((chip.used.aicore, chip.allocated, name, index))
        return [(name, index) for _, _, name, index in sorted(ranked)]

    def _state(self, name: str) -> NodeState | None:
        """The node's capacity, the chips this plan emptied in service."""
        state = self.work.node_state(name)
        if state is not None:
            for index in self.emptied.get(name, ()):
                state.chips[index].cordoned = None
        return state

    def _cached_state(self, name: str) -> NodeState | None:
        if name not in self.states:
            self.states[name] = self.work.node_state(name)
        return self.states[name]

    def _measure(self, name: str) -> _Measure:
        """Per chip model: more of its largest template that fit on the
        node, and the free capacity and empty-chip count that bound it."""
        out = _Measure({}, {}, {})
        state = self._state(name)
        if state is None:
            return out
        for chip in state.chips.values():
            model = chip.chip.model
            template = self.largest.get(model)
            offer = offered(chip.chip, template)
            if offer is None or chip.cordoned is not None or chip.chip.health != HEALTHY:
                continue
            self.needs.setdefault(model, Resources.of_template(offer))
            out.free[model] = out.free.get(model, Resources()) + chip.free
            out.whole[model] = out.whole.get(model, 0) + whole_chip_fits(chip, offer.name)
        for model in sorted(out.whole):
            out.fits[model] = node_fragmentation(state, {model: self.largest[model]}).largest_fits
        return out

    def _whole_chips(self, name: str) -> set[int]:
        """The node's healthy chips in service that hold no vNPU at all."""
        state = self._state(name)
        if state is None:
            return set()
        return {
            index
            for index, chip in state.chips.items()
            if chip.vnpus == 0 and chip.chip.health == HEALTHY and chip.cordoned is None
        }

    def _limit(self) -> dict[str, int]:
        """Chip model -> the most of its largest template that could fit
        were pods moved at will: no more than the model's free capacity
        divided by the template, resource by resource, nor than its chips
        take empty. When the count reaches it there is nothing to gain."""
        free: dict[str, Resources] = {}
        whole = _sum(m.whole for m in self.measures.values())
        for measure in self.measures.values():
            for model, have in measure.free.items():
                free[model] = free.get(model, Resources()) + have
        out = {}
        for model, have in free.items():
            want = self.needs[model]
            pairs = (
                (have.aicore, want.aicore),
                (have.memory_mb, want.memory_mb),
                (have.aicpu, want.aicpu),
                (have.media, want.media),
            )
            out[model] = min([whole[model], *(h // w for h, w in pairs if w > 0)])
        return out


def _movable(request: PodRequest | None, held: list[Allocation]) -> bool:
    """Only a pod whose request we know and whose allocations are exactly
    that request (a partial or edited booking is left alone)."""
    return (
        request is not None
        and len(held) == request.count
        and all(a.template == request.template for a in held)
    )


def _shape(
    state: NodeState, index: int, requests: list[PodRequest], held: Mapping[str, list[Allocation]]
) -> Hashable:
    """What decides a trial's outcome, short of the node's name: the node's
    chips, the chip emptied, and the pods and where their vNPUs are."""
    chips = tuple(
        (c.chip.model, c.chip.health, c.cordoned, c.used, c.allocated, c.orphans)
        for _, c in sorted(state.chips.items())
    )
    pods = tuple(
        sorted(
            (r.template, r.count, r.chip_model, tuple(sorted(a.chip for a in held[r.uid])))
            for r in requests
        )
    )
    # The node's name and labels matter only to a pod that selects nodes;
    # its taints decide what else may land there.
    directed = any(r.node_selector or r.required_affinity or r.tolerations for r in requests)
    where = state.inventory.name if directed else state.inventory.compiled_taints
    return (index, chips, pods, where)


def _size(state: NodeState, held: list[Allocation]) -> int:
    """AICore a pod's vNPUs take."""
    total = 0
    for allocation in held:
        chip = state.chips.get(allocation.chip)
        offer = offered(chip.chip, allocation.template) if chip is not None else None
        total += offer.aicore if offer is not None else 0
    return total


@dataclass
class _Measure:
    """What one node adds to the figures, per chip model."""

    fits: dict[str, int]
    free: dict[str, Resources]
    whole: dict[str, int]


def _sum(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for per_model in counts:
        for model, count in per_model.items():
            out[model] = out.get(model, 0) + count
    return out


def _negated(counts: Mapping[str, int]) -> dict[str, int]:
    return {model: -count for model, count in counts.items()}


def _reached(now: Mapping[str, int], limit: Mapping[str, int]) -> bool:
    return all(now.get(model, 0) >= most for model, most in limit.items())


def _gains(measures: Mapping[str, _Measure], trial: Mapping[str, _Measure]) -> bool:
    """More of the largest template fit in the cluster, and no model has fewer."""
    delta = _sum(
        count
        for name, measure in trial.items()
        for count in (measure.fits, _negated(measures[name].fits))
    )
    return sum(delta.values()) > 0 and all(d >= 0 for d in delta.values())

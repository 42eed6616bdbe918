"""Whether and how one request fits one node: the node's filters (liveness,
selectors, affinity, taints), the booking of its vNPUs one at a time into a
working copy of the node's capacity, and the nominees booked first. The
ledger asks it for each candidate node; preemption planning asks it of a
node as if its victims had gone."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from vnpu_operator.placement.capacity import ChipState, NodeState, chip_obstacle, free_vnpu_id
from vnpu_operator.placement.model import NodeInventory, Policy, Resources
from vnpu_operator.placement.reasons import Reason
from vnpu_operator.placement.request import PodRequest
from vnpu_operator.placement.scoring import Rank, Scorer
from vnpu_operator.placement.selectors import (
    node_selector_matches,
    node_selector_terms_match,
    untolerated_taints,
)

# (chip, vNPU id) slots and the node's rank afterwards, or why it does not fit.
Fit = tuple[list[tuple[int, int]], Rank] | Reason


def hold(
    state: NodeState,
    held: Iterable[PodRequest],
    policy: Policy,
    largest: Mapping[str, str] | None = None,
) -> Reason | None:
    """Books the nominees into the working copy first, as the policy would
    (`largest`: what bestfit ranks by); NOMINATED when one of them does not
    fit yet (its victims are still releasing): the node is then closed to
    whoever asked."""
    for nominee in held:
        if isinstance(fit_node(state, nominee, nominee.count, policy, largest), Reason):
            return Reason.NOMINATED
    return None


def node_filter(inventory: NodeInventory, request: PodRequest) -> Reason | None:
    if not inventory.live:
        return Reason.NODE_NOT_LIVE
    if inventory.status.dra:
        return Reason.DRA_NODE
    if not node_selector_matches(request.node_selector, inventory.labels):
        return Reason.NODE_SELECTOR
    if request.affinity_terms is not None and not node_selector_terms_match(
        request.affinity_terms, inventory.name, inventory.labels
    ):
        return Reason.NODE_AFFINITY
    if untolerated_taints(inventory.compiled_taints, request.compiled_tolerations):
        return Reason.TAINT
    if not inventory.status.chips:
        return Reason.NO_CHIPS
    return None


def fit_node(
    state: NodeState,
    request: PodRequest,
    need: int,
    policy: Policy,
    largest: Mapping[str, str] | None = None,
) -> Fit:
    """Books `need` vNPUs into the working copy `state`, one at a time so
    that each choice sees the previous ones; returns (chip, id) slots and
    the node's rank under `policy` afterwards, or why the next vNPU did not
    fit. `largest`: chip model -> largest template, which bestfit keeps room for."""

    def obstacle(index: int) -> Reason | None:
        return chip_obstacle(
            state.chips[index],
            request.template,
            request.chip_model,
            state.used_ids,
            request.charged,
        )

    obstacles = {index: obstacle(index) for index in sorted(state.chips)}
    scorer = Scorer(policy, state, largest or {})
    slots: list[tuple[int, int]] = []
    for _ in range(need):
        fits = [index for index, reason in obstacles.items() if reason is None]
        if not fits:
            return max((r for r in obstacles.values() if r is not None), key=lambda r: r.rank)
        size = {i: size_of(state.chips[i], request.template) for i in fits}
        index = min(fits, key=lambda i: scorer.chip_rank(i, size[i]))
        chip = state.chips[index]
        vnpu_id = free_vnpu_id(chip.chip, state.used_ids)
        assert vnpu_id is not None  # chip_obstacle checked it
        scorer.booking(index, size[index])
        chip.book(size[index])
        state.used_ids.add(vnpu_id)
        slots.append((index, vnpu_id))
        # Only the booked chip changed, and any chip whose id range holds the
        # id just taken (ids are unique per node, ranges may overlap).
        for other, other_state in state.chips.items():
            lo, hi = other_state.chip.vnpu_id_min, other_state.chip.vnpu_id_max
            if other == index or lo <= vnpu_id <= hi:
                obstacles[other] = obstacle(other)
    return slots, scorer.node_rank()


def size_of(chip: ChipState, template: str) -> Resources:
    """What a vNPU of `template` takes on a chip that offers it."""
    need = chip.offer(template)
    assert need is not None  # chip_obstacle checked it
    return need

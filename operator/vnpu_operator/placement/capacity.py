"""Chip capacity as the ledger sees it, and whether one more vNPU fits.

Capacity is computed from declarations, never from the chip's `*_free`
fields, which lag behind creates and destroys: used = templates of ledger
allocations on the chip + templates of vNPUs present on it that no ledger
allocation covers (orphans hold capacity until the agent collects them).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass, field

from vnpu_common.wire.models import ChipStatus, TemplateResources
from vnpu_operator.placement.model import Allocation, ChargedSize, NodeInventory, Resources
from vnpu_operator.placement.reasons import Reason

# (chip model, template name) -> resources, gathered from every inventory.
Catalog = Mapping[tuple[str, str], TemplateResources]

HEALTHY = "Healthy"


def offered(chip: ChipStatus, template: str | None) -> TemplateResources | None:
    """The chip's own offer of `template`, or None."""
    return next((t for t in chip.templates or () if t.name == template), None)


def template_resources(chip: ChipStatus, template: str, catalog: Catalog) -> Resources | None:
    """What a vNPU of `template` takes on `chip`: the chip's own offer first,
    then any chip of the same model; None when nobody knows the template."""
    own = offered(chip, template)
    if own is not None:
        return Resources.of_template(own)
    known = catalog.get((chip.model, template))
    return None if known is None else Resources.of_template(known)


@dataclass
class ChipState:
    chip: ChipStatus
    # Template -> its size on this chip (NodeInventory.offers).
    offers: Mapping[str, Resources]
    # The admin's reason when the chip is cordoned: nothing new goes there,
    # what is there stays booked.
    cordoned: str | None = None
    used: Resources = field(default_factory=Resources)
    allocated: int = 0
    orphans: int = 0
    total: Resources = field(init=False)

    def __post_init__(self) -> None:
        # Read once: placement asks for it for every chip of every node.
        self.total = Resources.totals(self.chip)

    @property
    def free(self) -> Resources:
        return (self.total - self.used).clamped()

    @property
    def vnpus(self) -> int:
        return self.allocated + self.orphans

    @property
    def vnpu_limit(self) -> int:
        return max(self.chip.vnpu_id_max - self.chip.vnpu_id_min + 1, 0)

    def usage(self) -> float:
        return usage_score(self.used, self.total)

    def offer(self, template: str | None) -> Resources | None:
        """What a vNPU of `template` takes on this chip; None when the chip
        does not offer it."""
        return self.offers.get(template) if template is not None else None

    def book(self, need: Resources) -> None:
        self.used = self.used + need
        self.allocated += 1

    def copy(self) -> ChipState:
        """Another chip to book into; `used` and `total` are immutable values,
        shared until one side books."""
        # Not dataclasses.replace: it would re-run __post_init__ (the totals)
        # for every chip of every fit.
        twin = object.__new__(ChipState)
        twin.__dict__.update(self.__dict__)
        return twin


def usage_score(used: Resources, total: Resources) -> float:
    """Share of AICore and memory in use: the two a template is sized by."""
    parts = [
        u / t for u, t in ((used.aicore, total.aicore), (used.memory_mb, total.memory_mb)) if t
    ]
    return sum(parts) / len(parts) if parts else 0.0


@dataclass
class NodeState:
    """Working copy of one node's capacity; placement books into it."""

    inventory: NodeInventory
    chips: dict[int, ChipState]
    used_ids: set[int]

    def copy(self) -> NodeState:
        """A working copy to book into, leaving this one as it was."""
        chips = {index: chip.copy() for index, chip in self.chips.items()}
        return NodeState(inventory=self.inventory, chips=chips, used_ids=set(self.used_ids))

    def usage(self) -> float:
        # Resources.sum: every fit ranks its node, and a value per chip added
        # was most of that.
        chips = self.chips.values()
        return usage_score(
            Resources.sum(c.used for c in chips), Resources.sum(c.total for c in chips)
        )


# What fitting reads of a node, with no name (see `fingerprint`).
Fingerprint = tuple[Hashable, ...]


def fingerprint(state: NodeState) -> Fingerprint:
    """Everything of a node's capacity that fitting one request reads
    (fitting.fit_node, scoring.Scorer): what no allocation moves
    (NodeInventory.chips_print: per chip its model, health, id range, offer,
    cordon and totals), then per chip what is used and how many vNPUs, and
    the ids the node holds. Two nodes with equal prints give every request
    the same slots and rank, whatever else differs (names, allocation
    names, serial numbers)."""
    chips = state.chips
    return (
        state.inventory.chips_print,
        tuple(
            (i, c.used.aicore, c.used.memory_mb, c.used.aicpu, c.used.media, c.vnpus)
            for i, c in sorted(chips.items())
        ),
        frozenset(state.used_ids),
    )


def build_node_state(
    inventory: NodeInventory,
    allocations: Iterable[Allocation],
    catalog: Catalog,
    destroyed: Collection[tuple[int, int, str]] = (),
) -> NodeState:
    """`destroyed`: (chip, id, template) of vNPUs the inventory may still
    list although their agent destroyed them (it removes an allocation's
    finalizer only after the destroy, and publishes inventories seconds
    apart): they hold neither capacity nor their id."""
    chips = {
        chip.index: ChipState(
            chip, inventory.offers[chip.index], cordoned=inventory.cordoned.get(chip.index)
        )
        for chip in inventory.status.chips
    }
    used_ids: set[int] = set()
    covered: set[tuple[int, int, str]] = set()
    # Each chip's needs, summed once at the end: a Resources per vNPU added
    # was half of building a node, which placement does after every change.
    needs: dict[int, list[Resources]] = {index: [] for index in chips}
    for alloc in allocations:
        # Ids are unique per server, so every id on the node is taken,
        # whatever chip (known to the inventory or not) it sits on.
        used_ids.add(alloc.vnpu_id)
        covered.add((alloc.chip, alloc.vnpu_id, alloc.template))
        state = chips.get(alloc.chip)
        if state is not None:
            needs[alloc.chip].append(_need_or_whole_chip(state, alloc.template, catalog))
            state.allocated += 1
    for index, state in chips.items():
        for vnpu in state.chip.vnpus:
            if (index, vnpu.id, vnpu.template) in destroyed:
                continue
            used_ids.add(vnpu.id)
            if (index, vnpu.id, vnpu.template) not in covered:
                needs[index].append(_need_or_whole_chip(state, vnpu.template, catalog))
                state.orphans += 1
        if needs[index]:
            state.used = Resources.sum(needs[index])
    return NodeState(inventory=inventory, chips=chips, used_ids=used_ids)


def _need_or_whole_chip(state: ChipState, template: str, catalog: Catalog) -> Resources:
    # A vNPU of a template nobody describes could be any size: assume it
    # fills the chip rather than risk oversubscribing it.
    need = state.offer(template) or template_resources(state.chip, template, catalog)
    return state.total if need is None else need


def chip_obstacle(
    state: ChipState,
    template: str,
    chip_model: str | None,
    used_ids: set[int],
    charged: ChargedSize | None = None,
) -> Reason | None:
    """Why one more vNPU of `template` does not fit on this chip, or None.
    `charged`: what one vNPU of the pod was charged; a chip whose vNPU of
    `template` takes another size is not for it."""
    chip = state.chip
    if chip_model is not None and chip.model != chip_model:
        return Reason.CHIP_MODEL
    need = state.offer(template)
    if charged is not None and need is not None and not charged.matches(need):
        return Reason.CHARGED_SIZE
    if chip.health != HEALTHY:
        return Reason.UNHEALTHY
    if need is None:
        return Reason.TEMPLATE_NOT_OFFERED
    # Field by field, without a Resources for what is free: this runs for every
    # chip of every node placement asks, and building values was a tenth of it.
    total, used = state.total, state.used
    if need.aicore > total.aicore - used.aicore:
        return Reason.INSUFFICIENT_AICORE
    if need.memory_mb > total.memory_mb - used.memory_mb:
        return Reason.INSUFFICIENT_MEMORY
    if need.aicpu > total.aicpu - used.aicpu:
        return Reason.INSUFFICIENT_AICPU
    if need.media > total.media - used.media:
        return Reason.INSUFFICIENT_MEDIA
    if state.vnpus >= state.vnpu_limit or free_vnpu_id(chip, used_ids) is None:
        return Reason.NO_FREE_VNPU_ID
    if state.cordoned is not None:
        return Reason.CORDONED
    return None


def free_id_count(chip: ChipStatus, used_ids: Collection[int]) -> int:
    """Ids of the chip's range that nothing on the node holds."""
    return sum(1 for i in range(chip.vnpu_id_min, chip.vnpu_id_max + 1) if i not in used_ids)


def free_vnpu_id(chip: ChipStatus, used_ids: set[int]) -> int | None:
    """Lowest id of the chip's range that nothing on the node holds."""
    return next(
        (i for i in range(chip.vnpu_id_min, chip.vnpu_id_max + 1) if i not in used_ids), None
    )


@dataclass(frozen=True)
class ChipCapacity:
    """A chip's capacity for metrics and status; `free` is clamped at zero."""

    node: str
    chip: int
    # The driver's physical id: what Ascend's npu-exporter labels a chip `id` with.
    physical_id: int
    model: str
    health: str
    cordoned: str | None
    total: Resources
    used: Resources
    free: Resources
    allocated: int
    orphans: int
    vnpu_limit: int

    @classmethod
    def of(cls, node: str, state: ChipState) -> ChipCapacity:
        return cls(
            node=node,
            chip=state.chip.index,
            physical_id=state.chip.physical_id,
            model=state.chip.model,
            health=state.chip.health,
            cordoned=state.cordoned,
            total=state.total,
            used=state.used,
            free=state.free,
            allocated=state.allocated,
            orphans=state.orphans,
            vnpu_limit=state.vnpu_limit,
        )

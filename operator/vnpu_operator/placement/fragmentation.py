"""How much of the free capacity the largest template can still use.

After hours of churn, free AICore may be scattered over many chips so that
no chip holds one more vNPU of the biggest template offered, although the
sum would hold several. The figure here says how much of what is free is
usable by that template: per chip, how many more vNPUs of the largest
template of its model fit (the same rule placement uses: health, cordon,
free ids and every resource), and the AICore they would take.

The ratio compares that count with how many would fit were the same free
capacity gathered on whole chips of the node: 0 when nothing is lost to
scattering, 1 when the scattered capacity takes none although gathered it
would take some. A template that cannot fill a chip (a 310P3's vir04 takes
4 of its 7 AI CPUs, so one per chip) is not counted as fragmentation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vnpu_common.wire.fits import largest
from vnpu_common.wire.models import TemplateResources
from vnpu_operator.placement.capacity import HEALTHY, ChipState, NodeState, free_id_count, offered
from vnpu_operator.placement.model import Resources


def largest_templates(catalog: Mapping[tuple[str, str], TemplateResources]) -> dict[str, str]:
    """Chip model -> its largest offered template: most AICore, then most
    memory, then the name (so every reader picks the same one)."""
    by_model: dict[str, list[TemplateResources]] = {}
    for (model, _), template in catalog.items():
        by_model.setdefault(model, []).append(template)
    out: dict[str, str] = {}
    for model, templates in by_model.items():
        found = largest(templates)
        if found is not None:
            out[model] = found.name
    return out


def _fits(free: Resources, need: Resources) -> int:
    """How many vNPUs of `need` fit in `free`, resources alone."""
    pairs = zip(free.amounts(), need.amounts(), strict=True)
    counts = [have // want for have, want in pairs if want > 0]
    return min(counts) if counts else 0


def chip_fits(state: ChipState, template: str, free_ids: int) -> int:
    """More vNPUs of `template` this chip could take now; 0 when it does not
    offer it, is unhealthy or cordoned. `free_ids`: ids of the chip's range
    nothing on the node holds."""
    chip = state.chip
    if chip.health != HEALTHY or state.cordoned is not None:
        return 0
    need = state.offer(template)
    if need is None:
        return 0
    slots = max(state.vnpu_limit - state.vnpus, 0)
    return min(_fits(state.free, need), slots, free_ids)


def whole_chip_fits(state: ChipState, template: str) -> int:
    """How many vNPUs of `template` the chip takes when empty (0 when it is
    unhealthy, cordoned or does not offer it)."""
    empty = ChipState(state.chip, state.offers, cordoned=state.cordoned)
    return chip_fits(empty, template, empty.vnpu_limit)


@dataclass(frozen=True)
class Fragmentation:
    """Free capacity and how much of it the largest template can use, for a
    node or (summed) for the cluster."""

    # AICore free on healthy, uncordoned chips: what placement could use.
    free_aicore: int
    # What the vNPUs of `largest_fits` would take of it.
    usable_aicore: int
    # More vNPUs of the largest template of each chip's model that fit now.
    largest_fits: int
    # How many would fit if the same free capacity were gathered on whole
    # chips of the node (a pod never spans nodes, so that is the limit).
    ideal_fits: int

    @property
    def ratio(self) -> float:
        """0: the free capacity takes as many of the largest template as it
        could gathered; 1: it takes none although it could take some."""
        if self.ideal_fits <= 0:
            return 0.0
        return max(0.0, 1.0 - self.largest_fits / self.ideal_fits)

    def __add__(self, other: Fragmentation) -> Fragmentation:
        return Fragmentation(
            self.free_aicore + other.free_aicore,
            self.usable_aicore + other.usable_aicore,
            self.largest_fits + other.largest_fits,
            self.ideal_fits + other.ideal_fits,
        )


NONE = Fragmentation(0, 0, 0, 0)


def node_fragmentation(state: NodeState, largest: Mapping[str, str]) -> Fragmentation:
    """The node's figure. Unhealthy and cordoned chips are left out: their
    capacity is not placeable, which is not fragmentation."""
    free_aicore = usable = fits = 0
    # Chip model -> whole chips' worth of free capacity, in vNPUs of its
    # largest template (fractional until summed over the node's chips).
    ideal: dict[str, float] = {}
    for index in sorted(state.chips):
        chip_state = state.chips[index]
        chip = chip_state.chip
        if chip.health != HEALTHY or chip_state.cordoned is not None:
            continue
        free_aicore += chip_state.free.aicore
        offer = offered(chip, largest.get(chip.model))
        if offer is None:
            continue
        count = chip_fits(chip_state, offer.name, free_id_count(chip, state.used_ids))
        fits += count
        usable += count * offer.aicore
        whole = whole_chip_fits(chip_state, offer.name)
        if chip_state.total.aicore > 0:
            share = chip_state.free.aicore / chip_state.total.aicore
            ideal[chip.model] = ideal.get(chip.model, 0.0) + share * whole
    # The small epsilon keeps 2.9999999 (float sums of shares) from flooring to 2.
    ideal_fits = sum(int(v + 1e-9) for v in ideal.values())
    return Fragmentation(free_aicore, usable, fits, max(ideal_fits, fits))


def total(figures: Iterable[Fragmentation]) -> Fragmentation:
    out = NONE
    for figure in figures:
        out = out + figure
    return out

"""How each placement policy ranks the chips one vNPU fits on, and the nodes
a whole request fits on. Lower ranks win; ties go to the lower chip index,
then the node name, so a decision is reproducible.

binpack: the fullest chip and node (by AICore and memory) after booking.
spread: the emptiest.
bestfit: the choice that costs the fewest vNPUs of the largest template
  each chip model offers (fragmentation.chip_fits counts them), then one that
  leaves a wholly free chip whole, then the tightest fit over every resource
  the chip has (AICore, memory, AICPU, media, each as a share of the chip),
  then the fullest node. So small vNPUs go where a big one would not fit
  anyway, and the big ones keep finding room.
firstfit: the first node by name and its first chip by index that fit; the
  baseline of the placement-quality benchmark (bench/placement), not offered
  to admins.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from vnpu_operator.placement.capacity import ChipState, NodeState, free_id_count
from vnpu_operator.placement.fragmentation import chip_fits
from vnpu_operator.placement.model import Policy, Resources

Rank = tuple[float, ...]


def _leftover(free: Resources, total: Resources) -> float:
    """What stays free, as shares of the chip summed over its resources."""
    return sum(f / t for f, t in zip(free.amounts(), total.amounts(), strict=True) if t > 0)


@dataclass
class Scorer:
    """Ranks for one node's placement of one request. `largest`: chip model
    -> its largest offered template (Ledger.largest_templates)."""

    policy: Policy
    state: NodeState
    largest: Mapping[str, str]
    # bestfit's running totals over the vNPUs booked so far.
    lost: int = 0
    broken: int = 0
    booked: set[int] = field(default_factory=set)

    def chip_rank(self, index: int, need: Resources) -> Rank:
        """Rank of booking one vNPU of `need` on chip `index` (which fits)."""
        chip = self.state.chips[index]
        if self.policy is Policy.BINPACK:
            return (-chip.usage(), index)
        if self.policy is Policy.SPREAD:
            return (chip.usage(), index)
        if self.policy is Policy.FIRSTFIT:
            return (index,)
        lost, whole = self._cost(chip, need)
        return (lost, whole, _leftover(chip.free - need, chip.total), index)

    def _cost(self, chip: ChipState, need: Resources) -> tuple[int, int]:
        """(vNPUs of the chip model's largest template lost, 1 if the chip
        is wholly free now) for booking `need` on it."""
        whole = 1 if chip.vnpus == 0 and chip.used == Resources() else 0
        template = self.largest.get(chip.chip.model)
        if template is None:
            return 0, whole
        ids = free_id_count(chip.chip, self.state.used_ids)
        before = chip_fits(chip, template, ids)
        after = chip_fits(
            replace(chip, used=chip.used + need, allocated=chip.allocated + 1), template, ids - 1
        )
        return before - after, whole

    def booking(self, index: int, need: Resources) -> None:
        """Call before booking `need` on chip `index` of the working state."""
        if self.policy is Policy.BESTFIT:
            lost, whole = self._cost(self.state.chips[index], need)
            self.lost += lost
            self.broken += whole
            self.booked.add(index)

    def node_rank(self) -> Rank:
        """Rank of the node once every vNPU of the request is booked."""
        usage = self.state.usage()
        if self.policy is Policy.BINPACK:
            return (-usage,)
        if self.policy is Policy.SPREAD:
            return (usage,)
        if self.policy is Policy.FIRSTFIT:
            return ()
        chips = (self.state.chips[i] for i in sorted(self.booked))
        leftover = sum(_leftover(c.free, c.total) for c in chips)
        return (self.lost, self.broken, leftover, -usage)

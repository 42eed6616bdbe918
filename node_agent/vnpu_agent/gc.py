"""Orphan collection: which vNPUs may be destroyed, decided conservatively.

A vNPU is destroyed only when ALL hold (docs/ARCHITECTURE.md, 'Invariants', 4):
- the allocation view is synced (a fresh list, an unbroken watch);
- no allocation of this node references its id, live or being deleted;
- the driver says it is not in use;
- both have held, without a break, for the grace period;
- the agent created it, or the policy for foreign vNPUs says collect.
Any break (referenced again, opened, view lost) restarts the clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from vnpu_agent.config import ForeignPolicy
from vnpu_agent.drivers.base import VNPU


@dataclass
class GcDecision:
    destroy: list[VNPU] = field(default_factory=list)
    waiting: list[VNPU] = field(default_factory=list)  # orphan, grace not over
    in_use: list[VNPU] = field(default_factory=list)  # orphan but opened: never collected
    kept_foreign: list[VNPU] = field(default_factory=list)  # policy keep


class OrphanTracker:
    def __init__(self, grace_seconds: float, policy: ForeignPolicy) -> None:
        self.grace = grace_seconds
        self.policy = policy
        self._since: dict[int, float] = {}

    def forget(self, vnpu_id: int) -> None:
        self._since.pop(vnpu_id, None)

    def reset(self) -> None:
        """The view was lost: every clock starts again once it is back."""
        self._since.clear()

    def evaluate(
        self,
        vnpus: Iterable[VNPU],
        referenced: set[int],
        owned: set[int],
        *,
        now: float,
        synced: bool,
    ) -> GcDecision:
        decision = GcDecision()
        if not synced:
            self.reset()
            return decision
        present = set()
        for vnpu in vnpus:
            present.add(vnpu.id)
            if vnpu.id in referenced:
                self._since.pop(vnpu.id, None)
                continue
            if vnpu.in_use:
                self._since.pop(vnpu.id, None)
                decision.in_use.append(vnpu)
                continue
            since = self._since.setdefault(vnpu.id, now)
            if now - since < self.grace:
                decision.waiting.append(vnpu)
            elif vnpu.id in owned or self.policy == "collect":
                decision.destroy.append(vnpu)
            else:
                decision.kept_foreign.append(vnpu)
        for gone in set(self._since) - present:
            del self._since[gone]
        return decision

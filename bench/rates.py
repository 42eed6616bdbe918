"""The sustainable-rate search: the highest pod creation rate at which the
p99 latency of a step stays within a limit, found by doubling the rate until
a step fails and then bisecting (geometrically) between the best passing and
the lowest failing rate. Pure: the benchmark runs the steps (bench/floors.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """One step of the search: pods created at `rate`/s; `p99` of the
    measured latency over the pods that got there (None: none did);
    `missing`: pods that never got there within the step's timeout."""

    rate: float
    p99: float | None
    missing: int = 0

    def ok(self, limit_s: float) -> bool:
        return self.missing == 0 and self.p99 is not None and self.p99 <= limit_s


@dataclass(frozen=True)
class Search:
    start: float  # first rate tried
    limit_s: float = 1.0  # p99 must stay within this
    factor: float = 2.0  # ramp up (and down) by this factor until the bracket exists
    resolution: float = 1.25  # done once failing / passing rate <= this
    min_rate: float = 0.5  # below this the search gives up: nothing passes
    max_rate: float = 400.0  # above this the search stops: everything passes

    def best(self, steps: list[Step]) -> float | None:
        """The highest passing rate below the lowest failing one (a pass
        above a failure is noise of a loaded machine, not capacity)."""
        fail = self._lowest_fail(steps)
        passing = [s.rate for s in steps if s.ok(self.limit_s) and (fail is None or s.rate < fail)]
        return max(passing, default=None)

    def _lowest_fail(self, steps: list[Step]) -> float | None:
        return min((s.rate for s in steps if not s.ok(self.limit_s)), default=None)

    def next_rate(self, steps: list[Step]) -> float | None:
        """The rate to try next, or None when the search is done."""
        if not steps:
            return self.start
        lo = self.best(steps)
        hi = self._lowest_fail(steps)
        if hi is None:  # everything passed so far: ramp up
            assert lo is not None
            up = lo * self.factor
            return up if up <= self.max_rate else None
        if lo is None:  # nothing passed: ramp down
            down = hi / self.factor
            return down if down >= self.min_rate else None
        if hi / lo <= self.resolution:
            return None
        return round(math.sqrt(lo * hi), 2)

    def done_reason(self, steps: list[Step]) -> str:
        """Why `next_rate` returned None (for the report)."""
        lo, hi = self.best(steps), self._lowest_fail(steps)
        if hi is None:
            return f"every rate up to {self.max_rate:g}/s passed"
        if lo is None:
            return f"no rate down to {self.min_rate:g}/s passed"
        return f"bracketed: {lo:g}/s passes, {hi:g}/s fails"

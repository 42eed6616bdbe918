"""The one retry delay of the project: exponential, capped, with jitter.

Every retry loop (reconciles of the operator and the agent, the agent's
allocation watch, the operator's Lease listing) uses it, so a flaky API
server sees the same shape of retries from every component. The jitter only
ever shortens a delay, so the cap is a real ceiling; it spreads retries of
many keys (or many agents) that failed at the same moment.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

# Past this many doublings every base in use is far beyond any cap.
_MAX_DOUBLINGS = 30


@dataclass(frozen=True)
class Backoff:
    """`delay(n)` for the n-th consecutive failure: base * 2**(n-1), at most
    `cap` (which may be below `base`: a tight retry ceiling wins), then scaled
    by a random factor in [1 - jitter, 1]."""

    base: float = 0.25
    cap: float = 30.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.base <= 0 or self.cap <= 0 or not 0 <= self.jitter < 1:
            raise ValueError(f"invalid backoff {self}")

    def delay(self, failures: int, rand: Callable[[], float] = random.random) -> float:
        exponent = min(max(failures, 1) - 1, _MAX_DOUBLINGS)
        raw = min(self.cap, self.base * float(2**exponent))
        return raw * (1 - self.jitter * rand())

"""One placement path over one stream: a policy through the operator's own
Ledger, or the DRA scheduler's allocator.

A request that does not fit on arrival waits, as a gated pod does, and is
retried, oldest first, whenever a vNPU is released; a waiting request is
placed when it fits and lives its full lifetime from then. Requests go
through the operator's NoFitMemo, as the operator's do: one placement per
shape that did not fit until capacity grows again. With
`waiting=False` it is dropped instead: the loss model the offline best is
computed for (bench.placement.offline).

The loop is one for every placement path (`Placer`): the operator's Ledger
under a policy (`LedgerPlacer`), and the scheduler's allocator over the DRA
pool (bench.placement.dra)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

from bench.placement.workload import Arrival
from vnpu_operator.placement import Ledger, NodeInventory, Placement, Policy
from vnpu_operator.placement.nofit_memo import NoFitMemo


@dataclass(frozen=True)
class Outcome:
    policy: str
    requests: int  # counted: those after the warm-up
    placed_now: int  # placed on arrival
    large_requests: int
    large_placed_now: int
    # AICore in use over the chips of its model when a largest-template
    # request first did not fit on arrival (from an empty cluster); None:
    # every one fitted.
    utilisation_at_first_large_miss: float | None
    waited_at_end: int  # still waiting when the stream ended

    @property
    def placed_now_fraction(self) -> float:
        return self.placed_now / self.requests if self.requests else 1.0

    @property
    def large_placed_now_fraction(self) -> float:
        return self.large_placed_now / self.large_requests if self.large_requests else 1.0

    @staticmethod
    def pooled(runs: Sequence[Outcome]) -> Outcome:
        """Runs of one path over one stream (tie-break seeds) as one: their
        counts summed, the earliest first miss."""
        misses = [r.utilisation_at_first_large_miss for r in runs]
        return Outcome(
            policy=runs[0].policy,
            requests=sum(r.requests for r in runs),
            placed_now=sum(r.placed_now for r in runs),
            large_requests=sum(r.large_requests for r in runs),
            large_placed_now=sum(r.large_placed_now for r in runs),
            utilisation_at_first_large_miss=min((m for m in misses if m is not None), default=None),
            waited_at_end=sum(r.waited_at_end for r in runs),
        )

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = asdict(self)
        out["placed_now_fraction"] = round(self.placed_now_fraction, 4)
        out["large_placed_now_fraction"] = round(self.large_placed_now_fraction, 4)
        return out


class Placer(Protocol):
    """What the replay asks of a placement path: place an arrival now (False:
    it does not fit) and release one placed before."""

    name: str

    def place(self, arrival: Arrival) -> bool: ...

    def release(self, arrival: Arrival) -> None: ...


class LedgerPlacer:
    """The annotation path: the operator's Ledger under one policy, through
    its NoFitMemo."""

    def __init__(self, policy: Policy, inventories: Sequence[NodeInventory]) -> None:
        self.name = policy.value
        self.policy = policy
        self.ledger = Ledger.rebuild(inventories, ())
        self.memo = NoFitMemo()

    def place(self, arrival: Arrival) -> bool:
        placed = self.memo.place(
            self.ledger, arrival.request(), self.policy, avoid=frozenset(), first_index=0
        )
        return isinstance(placed, Placement)

    def release(self, arrival: Arrival) -> None:
        self.ledger.release(arrival.request().uid)
        self.memo.capacity_grew()


def run(
    policy: Policy,
    inventories: Iterable[NodeInventory],
    arrivals: Sequence[Arrival],
    *,
    warmup: int = 0,
    waiting: bool = True,
) -> Outcome:
    """`policy` over `arrivals` (replay)."""
    inventories = list(inventories)
    return replay(
        LedgerPlacer(policy, inventories), inventories, arrivals, warmup=warmup, waiting=waiting
    )


def replay(
    placer: Placer,
    inventories: Iterable[NodeInventory],
    arrivals: Sequence[Arrival],
    *,
    warmup: int = 0,
    waiting: bool = True,
) -> Outcome:
    """`arrivals` through `placer` over the chips of `inventories`. `warmup`:
    the first arrivals fill the empty cluster and are not counted."""
    aicore_total: dict[str, int] = {}
    for inv in inventories:
        for chip in inv.status.chips:
            aicore_total[chip.model] = aicore_total.get(chip.model, 0) + chip.aicore_total
    used: dict[str, int] = dict.fromkeys(aicore_total, 0)
    departures: list[tuple[float, int]] = []  # (time, seq)
    live: dict[int, Arrival] = {}
    queue: list[Arrival] = []
    counted = placed_now = large = large_now = 0
    first_miss: float | None = None

    def place(arrival: Arrival, now: float) -> bool:
        if not placer.place(arrival):
            return False
        live[arrival.seq] = arrival
        used[arrival.model] += arrival.aicore
        heapq.heappush(departures, (now + arrival.life, arrival.seq))
        return True

    def depart_until(now: float) -> None:
        while departures and departures[0][0] <= now:
            at, seq = heapq.heappop(departures)
            gone = live.pop(seq)
            placer.release(gone)
            used[gone.model] -= gone.aicore
            if queue:
                retry(at)

    def retry(now: float) -> None:
        queue[:] = [w for w in queue if not place(w, now)]

    for arrival in arrivals:
        depart_until(arrival.at)
        fitted = place(arrival, arrival.at)
        if not fitted and arrival.large and first_miss is None:
            first_miss = used[arrival.model] / aicore_total[arrival.model]
        if not fitted and waiting:
            queue.append(arrival)
        if arrival.seq >= warmup:
            counted += 1
            placed_now += fitted
            large += arrival.large
            large_now += fitted and arrival.large
    return Outcome(
        policy=placer.name,
        requests=counted,
        placed_now=placed_now,
        large_requests=large,
        large_placed_now=large_now,
        utilisation_at_first_large_miss=None if first_miss is None else round(first_miss, 4),
        waited_at_end=len(queue),
    )

"""The DRA path, replayed: kube-scheduler's allocator over the ResourceSlices
the agent publishes (vnpu_agent.dra.slices.pool_slices), no control plane.

The model, and where it is kinder or harsher than the real scheduler:

- Within a node, first fit: the allocator walks the pool's slices in order
  of their names and each slice's devices in their listed order, and takes
  the first device of the request's template (the claim's CEL selector) that
  is not allocated and whose consumesCounters still fit its counter set, net
  of the devices allocated before and those this claim took already; a
  request of count n repeats that n times. The allocator's backtracking
  never changes the outcome here: a chip lists as many devices of a template
  that consume its own counters only as those counters could ever hold, so
  one of them is free wherever the counters fit, whichever devices the
  claim took before it.
- Across nodes, a uniform random choice among the nodes where the whole
  request fits (seeded). DRA scores nothing, and the model takes the
  scheduler's other score plugins as tied (alike pods): its tie-break is
  random. The real one scores a sample of the feasible nodes
  (percentageOfNodesToScore: 100 of 200 here), still a random pick. Not
  modelled: NodeResourcesFit's default LeastAllocated score, which counts a
  pod without requests as 100m CPU and 200 MiB and so leans to the nodes with
  fewer pods, in steps of whole points.
- A request that fits nowhere waits and is retried on every release, as the
  annotation path's replay does (simulate.replay): the scheduler's queue
  retries an unschedulable claim pod when a claim is deallocated.
- Nothing else books the chips: no held capacity, no cordons, no unhealthy
  chip, so every counter set is its chip's totals.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.placement.simulate import Outcome, replay
from bench.placement.workload import Arrival
from vnpu_agent.dra.slices import pool_slices
from vnpu_common.wire import names
from vnpu_operator.placement import NodeInventory

NAME = "dra"
Shape = tuple[str, int]  # (template, count): what a claim asks for


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    template: str
    consumes: tuple[tuple[str, str, int], ...]  # (counter set, counter, amount)


def _devices(pool: Iterable[Mapping[str, Any]]) -> list[Device]:
    """The pool's devices in the allocator's walk order."""
    out = []
    for s in sorted(pool, key=lambda s: str(s["metadata"]["name"])):
        for d in s["spec"].get("devices") or ():
            consumes = tuple(
                (use["counterSet"], k, int(v["value"]))
                for use in d.get("consumesCounters") or ()
                for k, v in use["counters"].items()
            )
            template = d["attributes"][names.DRA_ATTR_TEMPLATE]["string"]
            out.append(Device(name=d["name"], template=template, consumes=consumes))
    return out


class NodePool:
    """One node's pool as the allocator sees it: the devices in walk order,
    the counters left in each set, and the devices allocated."""

    def __init__(self, pool: Iterable[Mapping[str, Any]]) -> None:
        pool = list(pool)
        self.left: dict[str, dict[str, int]] = {
            cs["name"]: {k: int(v["value"]) for k, v in cs["counters"].items()}
            for s in pool
            for cs in s["spec"].get("sharedCounters") or ()
        }
        self.order = _devices(pool)
        # A claim sees only its template's devices (its selector), in walk order.
        self._by_template: dict[str, list[Device]] = {}
        for d in self.order:
            self._by_template.setdefault(d.template, []).append(d)
        self.taken: set[str] = set()

    def first_fit(self, template: str, count: int) -> list[Device] | None:
        """The devices the allocator would give a claim of `count` x
        `template` now; None: it does not fit on this node."""
        chosen: list[Device] = []
        # What this claim's devices took so far, by (set, counter).
        took: dict[tuple[str, str], int] = {}
        for d in self._by_template.get(template, ()):
            if d.name in self.taken:
                continue
            if all(self.left[s].get(k, 0) - took.get((s, k), 0) >= n for s, k, n in d.consumes):
                for s, k, n in d.consumes:
                    took[s, k] = took.get((s, k), 0) + n
                chosen.append(d)
                if len(chosen) == count:
                    return chosen
        return None

    def allocate(self, devices: Sequence[Device]) -> None:
        for d in devices:
            self.taken.add(d.name)
            for s, k, n in d.consumes:
                self.left[s][k] -= n

    def deallocate(self, devices: Sequence[Device]) -> None:
        for d in devices:
            self.taken.remove(d.name)
            for s, k, n in d.consumes:
                self.left[s][k] += n


class DraPlacer:
    """The scheduler over every node's pool (simulate.Placer). Which nodes
    fit a shape is kept per shape and refreshed on the node a claim changed,
    so a request that fits nowhere costs nothing to ask again."""

    name = NAME

    def __init__(self, inventories: Iterable[NodeInventory], seed: int) -> None:
        self.nodes = [
            NodePool(pool_slices(inv.status.chips, (), inv.name, 1)) for inv in inventories
        ]
        self.rng = random.Random(seed)
        self.fits: dict[Shape, set[int]] = {}
        self.live: dict[int, tuple[int, list[Device]]] = {}

    def _fitting(self, shape: Shape) -> set[int]:
        found = self.fits.get(shape)
        if found is None:
            found = self.fits[shape] = {
                i for i, n in enumerate(self.nodes) if n.first_fit(*shape) is not None
            }
        return found

    def _refresh(self, index: int) -> None:
        node = self.nodes[index]
        for shape, fitting in self.fits.items():
            if node.first_fit(*shape) is None:
                fitting.discard(index)
            else:
                fitting.add(index)

    def place(self, arrival: Arrival) -> bool:
        fitting = self._fitting((arrival.template, arrival.count))
        if not fitting:
            return False
        index = self.rng.choice(sorted(fitting))
        devices = self.nodes[index].first_fit(arrival.template, arrival.count)
        assert devices is not None
        self.nodes[index].allocate(devices)
        self.live[arrival.seq] = (index, devices)
        self._refresh(index)
        return True

    def release(self, arrival: Arrival) -> None:
        index, devices = self.live.pop(arrival.seq)
        self.nodes[index].deallocate(devices)
        self._refresh(index)


def run(
    inventories: Iterable[NodeInventory],
    arrivals: Sequence[Arrival],
    *,
    seed: int,
    warmup: int = 0,
    waiting: bool = True,
) -> Outcome:
    """`arrivals` through the DRA scheduler over the nodes' published pools;
    `seed`: the node tie-break's."""
    inventories = list(inventories)
    return replay(
        DraPlacer(inventories, seed), inventories, arrivals, warmup=warmup, waiting=waiting
    )

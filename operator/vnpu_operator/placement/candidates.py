"""Which node a request of a given shape goes to, without asking every node.

Placement ranks every node a request fits on and takes the best. At 1000
nodes that loop was 7 ms of Python per placement although, between two
placements, only the node just booked (and any whose inventory, liveness or
allocations moved) can answer differently. So for each request *shape*
(what decides a node's answer: template, chip model, count, policy and the
pod's selector, affinity and tolerations) the ranks of the nodes it fits on
are kept in a heap; a change to a node marks it stale in every shape, and
the next placement of that shape re-asks only the stale nodes.

A shape seen for the first time asks every node, but nodes alike in all
that the answer reads (the caller's `group`: capacity fingerprint, liveness,
taints, for a pod with no selector) are asked once per group: at 2000
nodes a short churn's first placements of each shape asked 40 nodes per
pod, and placement CPU per pod grew with the node count.

The answer is the one the full loop gives: the lowest (rank, node name)
among the nodes that pass the filter and fit, `avoid` left out. The nodes a
shape does not fit on are kept with their reason, so a shape that fits
nowhere answers the waiting pod's message without the full loop too: at
1000 nodes, 100 alike pods waiting through the release of 400 allocations
ran that loop once per allocation, 1.6 ms each.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Slots = TypeVar("Slots")
Why = TypeVar("Why")
Rank = tuple[float, ...]


@dataclass
class _Shape(Generic[Slots, Why]):
    # node -> (rank, slots) of the nodes the shape fits on now.
    fits: dict[str, tuple[Rank, Slots]] = field(default_factory=dict)
    # node -> why not, of the nodes it does not fit on.
    misses: dict[str, Why] = field(default_factory=dict)
    # (rank, node, version): entries whose version is not the node's current
    # one are stale and skipped when they surface.
    heap: list[tuple[Rank, str, int]] = field(default_factory=list)
    version: dict[str, int] = field(default_factory=dict)
    stale: set[str] = field(default_factory=set)


# A shape's heap is rebuilt once stale entries outnumber live ones this much.
_COMPACT_FACTOR = 4
# Shapes kept at most: pods with their own selectors each make one; past
# this many the oldest go (they are rebuilt on demand, never wrong).
_SHAPES_MAX = 256


class CandidateIndex(Generic[Slots, Why]):
    def __init__(self) -> None:
        self._shapes: dict[Hashable, _Shape[Slots, Why]] = {}

    def changed(self, node: str) -> None:
        """The node's answer may differ now (inventory, liveness, its
        allocations or claims on it moved)."""
        for shape in self._shapes.values():
            shape.stale.add(node)

    def clear(self) -> None:
        """Every answer may differ (the catalog moved)."""
        self._shapes.clear()

    def best(
        self,
        key: Hashable,
        nodes: Iterable[str],
        ask: Callable[[str], tuple[Rank, Slots] | Why | None],
        avoid: Collection[str] = (),
        group: Callable[[str], Hashable | None] | None = None,
    ) -> tuple[str, Slots] | None:
        """The best node for requests of shape `key` and its slots, or None
        when none fits (`misses(key)` then says why of each other node).
        `nodes`: every node the ledger knows, read only when the shape is
        new; `ask(node)`: the node's (rank, slots) when it fits, why not
        (anything but a tuple) when it does not, None when the node is gone.
        `group(node)`: nodes with the same non-None group have the same
        answer, so one `ask` answers them all (their slots then share one
        object: the caller copies what it keeps)."""
        shape = self._shapes.get(key)
        if shape is None:
            if len(self._shapes) >= _SHAPES_MAX:
                del self._shapes[next(iter(self._shapes))]
            shape = self._shapes[key] = _Shape()
            shape.stale.update(nodes)
        answered: dict[Hashable, tuple[Rank, Slots] | Why | None] = {}
        fresh: list[tuple[Rank, str, int]] = []
        for node in shape.stale:
            version = shape.version.get(node, 0) + 1
            shape.version[node] = version
            alike = group(node) if group is not None else None
            if alike is None:
                answer = ask(node)
            elif alike in answered:
                answer = answered[alike]
            else:
                answer = answered[alike] = ask(node)
            if not isinstance(answer, tuple):
                shape.fits.pop(node, None)
                if answer is None:
                    shape.misses.pop(node, None)
                else:
                    shape.misses[node] = answer
                continue
            shape.misses.pop(node, None)
            shape.fits[node] = answer
            fresh.append((answer[0], node, version))
        shape.stale.clear()
        if len(fresh) > len(shape.heap):
            # A new shape, or most nodes changed: one heapify, not N pushes.
            shape.heap.extend(fresh)
            heapq.heapify(shape.heap)
        else:
            for entry in fresh:
                heapq.heappush(shape.heap, entry)
        if len(shape.heap) > _COMPACT_FACTOR * (len(shape.fits) + 1):
            shape.heap = [(r, n, shape.version[n]) for n, (r, _) in shape.fits.items()]
            heapq.heapify(shape.heap)
        skipped: list[tuple[Rank, str, int]] = []
        found: tuple[str, Slots] | None = None
        while shape.heap:
            _rank, node, version = shape.heap[0]
            if shape.version.get(node) != version or node not in shape.fits:
                heapq.heappop(shape.heap)
                continue
            if node in avoid:
                skipped.append(heapq.heappop(shape.heap))
                continue
            found = (node, shape.fits[node][1])
            break
        for entry in skipped:
            heapq.heappush(shape.heap, entry)
        return found

    def misses(self, key: Hashable) -> Mapping[str, Why]:
        """Why each node the shape does not fit on, as of its last `best`
        (the nodes it fits on are in none of them)."""
        shape = self._shapes.get(key)
        return shape.misses if shape is not None else {}

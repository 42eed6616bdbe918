"""The offline best on a small instance: knowing the whole stream, which
placements (or refusals) place the most requests on arrival.

Exhaustive search over every choice of chips for every request, with the
choice to refuse one that fits (to keep room for a later, bigger one), by
dynamic programming over states made canonical: chips of one model on a
node are interchangeable, and so are nodes (all alike here). No waiting:
a request that is not placed on arrival is lost, and the online policies
are compared with it in the same loss model (simulate.run, waiting=False).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from functools import cache

from bench.placement.workload import Arrival
from vnpu_agent.drivers.catalog import CATALOG, ChipModel

# One chip: the (departure time, template) of each vNPU on it, sorted.
Chip = tuple[tuple[float, str], ...]
Node = tuple[Chip, ...]
State = tuple[Node, ...]


def best(arrivals: Sequence[Arrival], nodes: int, chips: Mapping[str, int]) -> int:
    """The most requests of `arrivals` any placement places on arrival."""
    models: list[ChipModel] = [CATALOG[m] for m, n in chips.items() for _ in range(n)]
    groups = [list(g) for _, g in itertools.groupby(range(len(models)), lambda i: models[i].name)]

    def fits(chip: Chip, model: ChipModel, extra: Sequence[str]) -> bool:
        specs = [model.template(t) for _, t in chip] + [model.template(t) for t in extra]
        if any(s is None for s in specs) or len(specs) > model.ids_per_chip:
            return False
        return all(
            sum(getattr(s, r) for s in specs if s is not None) <= getattr(model, r)
            for r in ("aicore", "memory_mb", "aicpu", "media")
        )

    def canon_node(node: Node) -> Node:
        out: list[Chip] = []
        for group in groups:
            out.extend(sorted(node[i] for i in group))
        return tuple(out)

    def canon(state: State) -> State:
        return tuple(sorted(canon_node(n) for n in state))

    def expire(state: State, now: float) -> State:
        return canon(tuple(tuple(tuple(v for v in c if v[0] > now) for c in n) for n in state))

    def options(state: State, a: Arrival) -> set[State]:
        out: set[State] = set()
        for n, node in enumerate(state):
            offering = [i for i, m in enumerate(models) if m.template(a.template) is not None]
            for combo in itertools.combinations_with_replacement(offering, a.count):
                new = list(node)
                ok = True
                for i in set(combo):
                    extra = [a.template] * combo.count(i)
                    if not fits(node[i], models[i], extra):
                        ok = False
                        break
                    new[i] = tuple(sorted(node[i] + tuple((a.at + a.life, t) for t in extra)))
                if ok:
                    out.add(canon((*state[:n], tuple(new), *state[n + 1 :])))
        return out

    @cache
    def most(index: int, state: State) -> int:
        if index == len(arrivals):
            return 0
        a = arrivals[index]
        state = expire(state, a.at)
        value = most(index + 1, state)  # refuse it
        for placed in options(state, a):
            value = max(value, 1 + most(index + 1, placed))
        return value

    empty: State = tuple(tuple(() for _ in models) for _ in range(nodes))
    try:
        return most(0, canon(empty))
    finally:
        most.cache_clear()

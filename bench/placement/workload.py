"""The benchmark's cluster and request streams.

Nodes are those of the scale benchmark (bench.cluster.CHIPS: 4 x 910B3 and
4 x 310P3 chips each), with the simulator's catalog (docs/ASCEND.md), and
requests follow its churn mix (bench.load.MIX). A request's size is its
dominant share: count x the largest share of a chip any of its resources
takes (a vir04 takes 4 of a 310P3's 7 AICPU: 4/7). Offered load is the mean
size alive over the pool's chips, per chip model, so each pool sees the
same load: arrival rate = load x chips / (mean lifetime x mean size).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.cluster import CHIPS
from bench.load import MIX
from vnpu_agent.drivers.catalog import CATALOG, ChipModel, id_range
from vnpu_common.wire.models import ChipStatus, TemplateResources, VNPUNodeStatus
from vnpu_operator.placement import NodeInventory, PodRequest
from vnpu_operator.placement.fragmentation import largest_templates

Mix = Sequence[tuple[str, int, int]]  # (template, count, weight)


def chip_status(model: str, index: int) -> ChipStatus:
    """A fresh chip of `model` at `index`, as the simulator reports it."""
    m = CATALOG[model]
    lo, hi = id_range(index, m.ids_per_chip)
    return ChipStatus(
        index=index, physical_id=index, card_id=index, device_id=0, model=model,
        health="Healthy", aicore_total=m.aicore, aicore_free=m.aicore,
        memory_total_mb=m.memory_mb, memory_free_mb=m.memory_mb,
        aicpu_total=m.aicpu, aicpu_free=m.aicpu, media_total=m.media, media_free=m.media,
        vnpu_id_min=lo, vnpu_id_max=hi,
        templates=[
            TemplateResources(
                name=t.name, aicore=t.aicore, memory_mb=t.memory_mb, aicpu=t.aicpu, media=t.media
            )
            for t in m.templates
        ],
    )  # fmt: skip


def inventories(nodes: int, chips: Mapping[str, int] = CHIPS) -> list[NodeInventory]:
    out = []
    for n in range(nodes):
        built, index = [], 0
        for model, count in chips.items():
            for _ in range(count):
                built.append(chip_status(model, index))
                index += 1
        status = VNPUNodeStatus(chips=built, chip_count=len(built))
        out.append(NodeInventory(name=f"pq-{n:04d}", status=status))
    return out


def model_of(template: str, chips: Mapping[str, int]) -> ChipModel:
    """The cluster's chip model that offers `template`."""
    for model in chips:
        if CATALOG[model].template(template) is not None:
            return CATALOG[model]
    raise ValueError(f"no chip model of {sorted(chips)} offers {template}")


def size(model: ChipModel, template: str, count: int) -> float:
    """count x the dominant share of one vNPU: what the load is counted in."""
    t = model.template(template)
    assert t is not None
    shares = [
        need / have
        for need, have in (
            (t.aicore, model.aicore),
            (t.memory_mb, model.memory_mb),
            (t.aicpu, model.aicpu),
            (t.media, model.media),
        )
        if have > 0
    ]
    return count * max(shares)


def largest(chips: Mapping[str, int]) -> dict[str, str]:
    """Chip model -> its largest template, as placement and the metrics pick it."""
    catalog = {
        (model, t.name): TemplateResources(
            name=t.name, aicore=t.aicore, memory_mb=t.memory_mb, aicpu=t.aicpu, media=t.media
        )
        for model in chips
        for t in CATALOG[model].templates
    }
    return largest_templates(catalog)


@dataclass(frozen=True)
class Arrival:
    seq: int
    at: float
    life: float
    template: str
    count: int
    model: str
    # Its template is the largest its chip model offers.
    large: bool
    aicore: int  # AICore the whole request takes

    def request(self) -> PodRequest:
        return PodRequest(
            namespace="bench", name=f"r{self.seq}", uid=f"u{self.seq}",
            template=self.template, count=self.count,
        )  # fmt: skip


def stream(
    load: float,
    nodes: int,
    arrivals: int,
    seed: int,
    *,
    chips: Mapping[str, int] = CHIPS,
    mix: Mix = MIX,
    life: float = 1.0,
) -> list[Arrival]:
    """Poisson arrivals, exponential lifetimes (mean `life`), fixed seed."""
    if load <= 0:
        raise ValueError(f"offered load must be positive, not {load}")
    rng = random.Random(seed)
    big = largest(chips)
    pools: dict[str, list[tuple[str, int, int]]] = {}
    for template, count, weight in mix:
        pools.setdefault(model_of(template, chips).name, []).append((template, count, weight))
    rates: dict[str, float] = {}
    for model, entries in pools.items():
        weights = sum(w for _, _, w in entries)
        mean = sum(w * size(CATALOG[model], t, c) for t, c, w in entries) / weights
        rates[model] = load * nodes * chips[model] / (life * mean)
    total = sum(rates.values())
    order = sorted(rates)
    out: list[Arrival] = []
    at = 0.0
    for seq in range(arrivals):
        at += rng.expovariate(total)
        model = rng.choices(order, weights=[rates[m] for m in order])[0]
        entries = pools[model]
        template, count, _ = rng.choices(entries, weights=[w for *_, w in entries])[0]
        spec = CATALOG[model].template(template)
        assert spec is not None
        out.append(
            Arrival(
                seq=seq,
                at=at,
                life=rng.expovariate(1 / life),
                template=template,
                count=count,
                model=model,
                large=template == big[model],
                aicore=count * spec.aicore,
            )
        )
    return out

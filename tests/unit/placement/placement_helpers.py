"""Builders for placement tests: chips as docs/ASCEND.md, 'Templates', describes them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vnpu_common.wire.models import ChipStatus, TemplateResources, VNPUInfo, VNPUNodeStatus
from vnpu_operator.placement import NodeInventory, NoFit, Placement, PodRequest

GB = 1024

# model -> (aicore, memory MB, aicpu, media units, ids per chip, templates)
# templates: name -> (aicore, memory MB, aicpu, media)
MODELS: dict[str, tuple[int, int, int, int, int, dict[str, tuple[int, int, int, int]]]] = {
    "910B3": (
        20,
        64 * GB,
        7,
        0,
        16,
        {"vir05_1c_16g": (5, 16 * GB, 1, 0), "vir10_3c_32g": (10, 32 * GB, 3, 0)},
    ),
    "910B4": (
        20,
        32 * GB,
        7,
        1,
        16,
        {
            "vir05_1c_8g": (5, 8 * GB, 1, 0),
            "vir10_3c_16g": (10, 16 * GB, 3, 0),
            "vir10_4c_16g_m": (10, 16 * GB, 4, 1),
            "vir10_3c_16g_nm": (10, 16 * GB, 3, 0),
        },
    ),
    "310P3": (
        8,
        24 * GB,
        7,
        1,
        8,
        {
            "vir01": (1, 3 * GB, 1, 0),
            "vir02": (2, 6 * GB, 2, 0),
            "vir02_1c": (2, 6 * GB, 1, 0),
            "vir04": (4, 12 * GB, 4, 0),
            "vir04_3c": (4, 12 * GB, 3, 0),
            "vir04_3c_ndvpp": (4, 12 * GB, 3, 0),
            "vir04_4c_dvpp": (4, 12 * GB, 4, 1),
        },
    ),
}


def chip(
    model: str = "910B3",
    index: int = 0,
    *,
    health: str = "Healthy",
    vnpus: Sequence[tuple[int, str]] = (),
    templates: Sequence[str] | None = None,
    id_range: tuple[int, int] | None = None,
    owners: Sequence[str] = (),
    **overrides: Any,
) -> ChipStatus:
    """`owners`: the allocation each of `vnpus` is listed as owned by ("" or absent:
    nobody's), as an agent publishes them."""
    aicore, memory, aicpu, media, ids, catalog = MODELS[model]
    lo = 100 + 16 * index
    lo, hi = id_range if id_range is not None else (lo, lo + ids - 1)
    offered = catalog if templates is None else {t: catalog[t] for t in templates}
    fields: dict[str, Any] = {
        "index": index,
        "physical_id": index,
        "card_id": index,
        "device_id": 0,
        "model": model,
        "health": health,
        "aicore_total": aicore,
        "aicore_free": aicore,
        "memory_total_mb": memory,
        "memory_free_mb": memory,
        "aicpu_total": aicpu,
        "aicpu_free": aicpu,
        "media_total": media,
        "media_free": media,
        "vnpu_id_min": lo,
        "vnpu_id_max": hi,
        "templates": [
            TemplateResources(name=n, aicore=c, memory_mb=m, aicpu=p, media=d)
            for n, (c, m, p, d) in offered.items()
        ],
        "vnpus": [
            VNPUInfo(id=i, template=t, allocation=(owners[n] if n < len(owners) else "") or None)
            for n, (i, t) in enumerate(vnpus)
        ],
    }
    fields.update(overrides)
    return ChipStatus(**fields)


def node(
    name: str,
    chips: Sequence[ChipStatus] | str = "910B3",
    *,
    n_chips: int = 1,
    live: bool = True,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, Any]] = (),
    cordoned: Mapping[int, str] | None = None,
) -> NodeInventory:
    """`chips` is either a model name (n_chips fresh chips of it) or a list;
    `cordoned`: chip index -> the admin's reason."""
    built = [chip(chips, i) for i in range(n_chips)] if isinstance(chips, str) else list(chips)
    return NodeInventory(
        name=name,
        status=VNPUNodeStatus(chips=built, chip_count=len(built)),
        live=live,
        labels=dict(labels or {}),
        taints=tuple(taints),
        cordoned=dict(cordoned or {}),
    )


def request(
    name: str = "pod",
    template: str = "vir05_1c_16g",
    count: int = 1,
    *,
    uid: str | None = None,
    namespace: str = "default",
    chip_model: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    affinity: Mapping[str, Any] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
) -> PodRequest:
    return PodRequest(
        namespace=namespace,
        name=name,
        uid=uid or f"uid-{name}",
        template=template,
        count=count,
        chip_model=chip_model,
        node_selector=dict(node_selector or {}),
        required_affinity=affinity,
        tolerations=tuple(tolerations),
    )


def affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    """Required node affinity with one term per argument (matchExpressions)."""
    return {"nodeSelectorTerms": [{"matchExpressions": list(t)} for t in terms]}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


def placed(result: Placement | NoFit) -> Placement:
    assert isinstance(result, Placement), str(result)
    return result


def nofit(result: Placement | NoFit) -> NoFit:
    assert isinstance(result, NoFit), result
    return result

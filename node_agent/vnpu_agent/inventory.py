"""The VNPUNode status an agent publishes: chips, offered templates, free
capacity and every vNPU present with the allocation that owns it (by
declaration) or none."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from vnpu_agent.allocation import owner_of
from vnpu_agent.drivers.base import VNPU, ChipInfo, TemplateSpec
from vnpu_common.wire.models import (
    ChipStatus,
    Condition,
    ModelTemplates,
    TemplateResources,
    VNPUInfo,
    VNPUNodeStatus,
)


def owners(allocations: Iterable[Mapping[str, Any]]) -> dict[int, tuple[str, str | None]]:
    """vNPU id -> (namespace/name, pod UID) of the allocation declaring it."""
    out: dict[int, tuple[str, str | None]] = {}
    for obj in allocations:
        owner = owner_of(obj)
        if owner is not None:
            out[owner[0]] = owner[1:]
    return out


def build_status(
    *,
    driver: str,
    chips: list[ChipInfo],
    templates: Mapping[int, list[TemplateSpec]],
    vnpus: Mapping[int, VNPU],
    allocations: Iterable[Mapping[str, Any]],
    conditions: list[Condition],
    cordoned: Iterable[int] = (),
    dra: bool = False,
) -> dict[str, Any]:
    """`cordoned`: the chip indexes of the VNPUNode's spec.cordonedChips, echoed
    in the status for `kubectl get` (placement reads the spec itself). `dra`:
    the node's chips are a DRA pool (--dra)."""
    owned_by = owners(allocations)
    models, own = _offers(chips, templates)
    # Grouped in one pass: a pass per chip over every vNPU grew with chips x vNPUs.
    on_chip: dict[int, list[VNPU]] = {}
    for v in vnpus.values():
        on_chip.setdefault(v.chip, []).append(v)
    chip_statuses = []
    for chip in sorted(chips, key=lambda c: c.index):
        present = sorted(on_chip.get(chip.index, ()), key=lambda v: v.id)
        chip_statuses.append(
            ChipStatus(
                index=chip.index,
                physical_id=chip.physical_id,
                card_id=chip.card_id,
                device_id=chip.device_id,
                model=chip.model,
                health="Healthy" if chip.healthy else "Unhealthy",
                aicore_total=chip.aicore_total,
                aicore_free=chip.aicore_free,
                memory_total_mb=chip.memory_total_mb,
                memory_free_mb=chip.memory_free_mb,
                aicpu_total=chip.aicpu_total,
                aicpu_free=chip.aicpu_free,
                media_total=chip.media_total,
                media_free=chip.media_free,
                vnpu_id_min=chip.vnpu_id_min,
                vnpu_id_max=chip.vnpu_id_max,
                templates=own.get(chip.index),
                vnpus=[
                    VNPUInfo(
                        id=v.id,
                        template=v.template,
                        in_use=v.in_use,
                        allocation=owned_by.get(v.id, (None, None))[0],
                        pod_uid=owned_by.get(v.id, (None, None))[1],
                    )
                    for v in present
                ],
            )
        )
    status = VNPUNodeStatus(
        driver=driver,
        dra=dra,
        chip_count=len(chip_statuses),
        vnpu_count=sum(len(c.vnpus) for c in chip_statuses),
        free_aicore=sum(c.aicore_free for c in chip_statuses if c.health == "Healthy"),
        models=models,
        chips=chip_statuses,
        conditions=conditions,
        cordoned=_indexes(cordoned),
        unhealthy=_indexes(c.index for c in chip_statuses if c.health != "Healthy"),
    )
    return status.to_api()


def _offers(
    chips: list[ChipInfo], templates: Mapping[int, list[TemplateSpec]]
) -> tuple[list[ModelTemplates], dict[int, list[TemplateResources]]]:
    """Each model's list (its lowest-index chip's) and the chips that offer
    otherwise, with their own lists."""
    models: dict[str, list[TemplateResources]] = {}
    own: dict[int, list[TemplateResources]] = {}
    for chip in sorted(chips, key=lambda c: c.index):
        offered = [
            TemplateResources(
                name=t.name, aicore=t.aicore, memory_mb=t.memory_mb, aicpu=t.aicpu, media=t.media
            )
            for t in templates.get(chip.index, [])
        ]
        if chip.model not in models:
            models[chip.model] = offered
        elif offered != models[chip.model]:
            own[chip.index] = offered
    listed = [ModelTemplates(model=m, templates=t) for m, t in sorted(models.items())]
    return listed, own


# What the allocations already tell whoever reads the VNPUNode: the vNPUs
# they own, and the counts and free figures those vNPUs move.
_RESTATED_TOP = ("vnpuCount", "freeAICore")
_RESTATED_CHIP = ("aicoreFree", "memoryFreeMb", "aicpuFree", "mediaFree", "vnpus")


def news(status: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a published status the allocations do not already tell:
    chips' identity, health, totals and templates, vNPUs no allocation owns,
    conditions, the cordon echo. Placement books our own vNPUs from the
    allocations, so a status that differs from the last one only outside
    this part can wait (AgentSettings.inventory_settle_seconds)."""
    chips = []
    for chip in status.get("chips") or []:
        kept = {k: v for k, v in chip.items() if k not in _RESTATED_CHIP}
        kept["unowned"] = [v for v in chip.get("vnpus") or [] if not v.get("allocation")]
        chips.append(kept)
    top = {k: v for k, v in status.items() if k not in _RESTATED_TOP and k != "chips"}
    return {**top, "chips": chips}


def only_restates(
    old: Mapping[str, Any], new: Mapping[str, Any], live: Collection[str] = ()
) -> bool:
    """True when `new` differs from `old` (the status last written) only in
    what the allocations already say: vNPUs they own added or in use, vNPUs
    gone whose allocation is deleted or being deleted (not in `live`, the
    keys of those that are not), and the counts and free figures those move.

    A vNPU gone whose allocation still stands, or that none owned, is news.
    One gone with its allocation is the deletion restated: the agent removes
    the finalizer only after the destroy, the operator frees the capacity on
    the deletion, and whoever reads the VNPUNode without its memory of
    deletions (`kubectl vnpu status`, a restarted operator) takes a listed
    vNPU whose named allocation is gone as destroyed (Ledger.seed_released)."""
    if news(old) != news(new):
        return False
    listed = set(_owners_listed(new))
    for (chip, vnpu_id), owner in _owners_listed(old).items():
        if (chip, vnpu_id) not in listed and (not owner or owner in live):
            return False
    return True


def _owners_listed(status: Mapping[str, Any]) -> dict[tuple[Any, Any], str]:
    """(chip index, vNPU id) -> the owning allocation's key ("" for none)."""
    return {
        (chip.get("index"), v.get("id")): str(v.get("allocation") or "")
        for chip in status.get("chips") or []
        for v in chip.get("vnpus") or []
    }


def _indexes(chips: Iterable[int]) -> str:
    return ",".join(str(i) for i in sorted(set(chips)))


def cordoned_chips(vnpu_node: Mapping[str, Any] | None) -> list[int]:
    """Chip indexes of a VNPUNode's spec.cordonedChips; malformed entries
    (the CRD schema refuses them) are skipped."""
    entries = ((vnpu_node or {}).get("spec") or {}).get("cordonedChips") or []
    return sorted(
        {e["chip"] for e in entries if isinstance(e, dict) and type(e.get("chip")) is int}
    )

"""How many vNPUs of a template an empty chip holds, and which template is a
chip's largest: the rules the agent's DRA pool (one device per instance, room
beside the largest) and the operator (node capacity for vnpu.io/<template>,
bestfit's largest templates) both go by."""

from __future__ import annotations

from collections.abc import Iterable

from vnpu_common.wire.models import ChipStatus, TemplateResources


def id_range_size(chip: ChipStatus) -> int:
    """The chip's vNPU ids: no chip holds more vNPUs than it has ids."""
    return max(chip.vnpu_id_max - chip.vnpu_id_min + 1, 0)


def instances(chip: ChipStatus, template: TemplateResources) -> int:
    """How many vNPUs of `template` fit on `chip` when it is empty: the
    smallest total / size over the resources the template takes, at most the
    chip's id range (a template that takes nothing is bounded by it alone)."""
    fits = [id_range_size(chip)]
    for size, total in (
        (template.aicore, chip.aicore_total),
        (template.memory_mb, chip.memory_total_mb),
        (template.aicpu, chip.aicpu_total),
        (template.media, chip.media_total),
    ):
        if size > 0:
            fits.append(total // size)
    return max(min(fits), 0)


def largest(templates: Iterable[TemplateResources]) -> TemplateResources | None:
    """The largest template: most AICore, then most memory, then the first
    name (so every reader picks the same one)."""
    return min(templates, key=lambda t: (-t.aicore, -t.memory_mb, t.name), default=None)

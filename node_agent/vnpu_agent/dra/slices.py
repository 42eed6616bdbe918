"""A DRA node's chips as the ResourceSlices of its pool (docs/DRA.md, "What
the agent publishes"): a pure function of the chips the VNPUNode status
lists, the node's cordoned chips, the node and the pool generation.

- One counter set per chip (`names.dra_counter_set`): its AICore, memory,
  AICPU and media totals and `vnpus`, the size of its vNPU id range (no
  chip can hold more vNPUs than it has ids).
- One device per template instance that fits on the EMPTY chip:
  floor(min over the template's non-zero sizes of total / size) instances
  of each template, at most the id range; each consumes its template's sizes
  and one `vnpus` from its chip's set. Devices describe empty chips, so a
  vNPU created or destroyed changes no slice: the scheduler subtracts what
  allocated devices consume from the counters.
- Counter sets and devices never share a slice (resource.k8s.io/v1): at most
  8 sets per counter slice, at most 64 devices per device slice (the limit
  when devices consume counters or carry taints).

Every slice carries the same pool generation and resourceSliceCount, the
node's name in spec.nodeName, and an ownerReference to the Node, so the
garbage collector deletes the pool with the node.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any, Final

from vnpu_common import names
from vnpu_common.api.models import ChipStatus, TemplateResources

# resource.k8s.io/v1 limits (staging/src/k8s.io/api/resource/v1/types.go).
MAX_COUNTER_SETS_PER_SLICE: Final = 8  # ResourceSliceMaxCounterSets
MAX_DEVICES_PER_SLICE: Final = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures
MAX_ATTRIBUTES_AND_CAPACITIES: Final = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
MAX_NAME_LENGTH: Final = 253  # an object name: a DNS subdomain
MAX_LABEL_LENGTH: Final = 63  # a device or counter set name: a DNS label

KIND: Final = "ResourceSlice"
PLURAL: Final = "resourceslices"
TAINT_UNHEALTHY: Final = f"{names.GROUP}/unhealthy"
TAINT_CORDONED: Final = f"{names.GROUP}/cordoned"

# The slices' object names: <node>-vnpu-counters-<i> and <node>-vnpu-devices-<i>.
_COUNTERS: Final = "counters"
_DEVICES: Final = "devices"


def slice_name(node: str, kind: str, index: int) -> str:
    """`<node>-vnpu-<kind>-<index>`, within the 253 characters of an object
    name: a node name too long for the suffix is cut and a hash of the whole
    name keeps it unique."""
    suffix = f"-vnpu-{kind}-{index}"
    if len(node) + len(suffix) <= MAX_NAME_LENGTH:
        return node + suffix
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    head = node[: MAX_NAME_LENGTH - len(suffix) - len(digest) - 1].rstrip(".-")
    return f"{head}-{digest}{suffix}"


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


def id_range_size(chip: ChipStatus) -> int:
    return max(chip.vnpu_id_max - chip.vnpu_id_min + 1, 0)


def _quantity(value: int) -> dict[str, str]:
    # A counter's value is a Quantity; a plain integer is its canonical form.
    return {"value": str(value)}


def counter_set(chip: ChipStatus) -> dict[str, Any]:
    return {
        "name": names.dra_counter_set(chip.index),
        "counters": {
            names.DRA_COUNTER_AICORE: _quantity(chip.aicore_total),
            names.DRA_COUNTER_MEMORY: _quantity(chip.memory_total_mb),
            names.DRA_COUNTER_AICPU: _quantity(chip.aicpu_total),
            names.DRA_COUNTER_MEDIA: _quantity(chip.media_total),
            names.DRA_COUNTER_VNPUS: _quantity(id_range_size(chip)),
        },
    }


def _consumption(template: TemplateResources) -> dict[str, dict[str, str]]:
    sizes = {
        names.DRA_COUNTER_AICORE: template.aicore,
        names.DRA_COUNTER_MEMORY: template.memory_mb,
        names.DRA_COUNTER_AICPU: template.aicpu,
        names.DRA_COUNTER_MEDIA: template.media,
    }
    consumed = {k: _quantity(v) for k, v in sizes.items() if v > 0}
    consumed[names.DRA_COUNTER_VNPUS] = _quantity(1)
    return consumed


def chip_devices(chip: ChipStatus, *, cordoned: bool) -> list[dict[str, Any]]:
    """The devices of one chip: every template instance that fits on it empty."""
    taints = []
    if chip.health != "Healthy":
        taints.append({"key": TAINT_UNHEALTHY, "effect": "NoSchedule"})
    if cordoned:
        taints.append({"key": TAINT_CORDONED, "effect": "NoSchedule"})
    devices = []
    for template in chip.templates or ():
        for n in range(instances(chip, template)):
            device: dict[str, Any] = {
                "name": names.dra_device_name(chip.index, template.name, n),
                "attributes": {
                    names.DRA_ATTR_TEMPLATE: {"string": template.name},
                    names.DRA_ATTR_MODEL: {"string": chip.model},
                    names.DRA_ATTR_CHIP: {"int": chip.index},
                    names.DRA_ATTR_AICORE: {"int": template.aicore},
                    names.DRA_ATTR_MEMORY_MB: {"int": template.memory_mb},
                },
                "consumesCounters": [
                    {
                        "counterSet": names.dra_counter_set(chip.index),
                        "counters": _consumption(template),
                    }
                ],
                "bindsToNode": True,
                "bindingConditions": [names.DRA_COND_READY],
                "bindingFailureConditions": [names.DRA_COND_FAILED],
            }
            if taints:
                device["taints"] = [dict(t) for t in taints]
            devices.append(device)
    return devices


def _pack_devices(per_chip: Iterable[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """Devices in slices of at most MAX_DEVICES_PER_SLICE, a chip's devices
    kept in one slice whenever they fit in one (so a change on one chip
    rewrites few slices' devices)."""
    slices: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    for devices in per_chip:
        if current and len(current) + len(devices) > MAX_DEVICES_PER_SLICE:
            slices.append(current)
            current = []
        for device in devices:
            if len(current) == MAX_DEVICES_PER_SLICE:
                slices.append(current)
                current = []
            current.append(device)
    if current:
        slices.append(current)
    return slices


def pool_slices(
    chips: Sequence[ChipStatus],
    cordoned: Iterable[int],
    node: str,
    generation: int,
    *,
    node_uid: str | None = None,
) -> list[dict[str, Any]]:
    """The ResourceSlices of `node`'s pool at `generation`: counter slices
    first, then device slices, each named slice_name(node, ...). `node_uid`:
    the Node object's uid, for the ownerReference (none without it). No chips:
    no slices (a pool of none has nothing to count)."""
    ordered = sorted(chips, key=lambda c: c.index)
    off = set(cordoned)
    counter_groups = [
        [counter_set(c) for c in ordered[i : i + MAX_COUNTER_SETS_PER_SLICE]]
        for i in range(0, len(ordered), MAX_COUNTER_SETS_PER_SLICE)
    ]
    device_groups = _pack_devices(chip_devices(c, cordoned=c.index in off) for c in ordered)
    count = len(counter_groups) + len(device_groups)
    pool = {"name": node, "generation": generation, "resourceSliceCount": count}
    meta_extra: dict[str, Any] = {}
    if node_uid:
        meta_extra["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
        ]

    def make(kind: str, index: int, field: str, items: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "apiVersion": names.RESOURCE_API,
            "kind": KIND,
            "metadata": {"name": slice_name(node, kind, index), **meta_extra},
            "spec": {
                "driver": names.DRA_DRIVER,
                "nodeName": node,
                "pool": dict(pool),
                field: items,
            },
        }

    return [make(_COUNTERS, i, "sharedCounters", g) for i, g in enumerate(counter_groups)] + [
        make(_DEVICES, i, "devices", g) for i, g in enumerate(device_groups)
    ]

"""Plain data the ledger keeps: node inventories, allocations, placements."""

from __future__ import annotations

import functools
import hashlib
import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from vnpu_common.wire import names
from vnpu_common.wire.models import (
    ChipStatus,
    TemplateResources,
    VNPUAllocation,
    VNPUAllocationSpec,
    VNPUNodeSpec,
    VNPUNodeStatus,
)
from vnpu_operator.placement.errors import InvalidAllocationError, InvalidInventoryError
from vnpu_operator.placement.selectors import SelectorError, Taint, compile_taints


class Policy(StrEnum):
    """How placement ranks the chips and nodes a request fits on
    (placement.scoring says how each does)."""

    BINPACK = "binpack"
    SPREAD = "spread"
    BESTFIT = "bestfit"
    # The placement-quality benchmark's baseline; --policy does not offer it.
    FIRSTFIT = "firstfit"


@dataclass(frozen=True)
class Resources:
    aicore: int = 0
    memory_mb: int = 0
    aicpu: int = 0
    media: int = 0

    @classmethod
    def of_template(cls, t: TemplateResources) -> Resources:
        return cls(t.aicore, t.memory_mb, t.aicpu, t.media)

    @classmethod
    def totals(cls, chip: ChipStatus) -> Resources:
        return cls(chip.aicore_total, chip.memory_total_mb, chip.aicpu_total, chip.media_total)

    @classmethod
    def sum(cls, values: Iterable[Resources]) -> Resources:
        """All of `values` added, building one value rather than one per addition."""
        aicore = memory_mb = aicpu = media = 0
        for v in values:
            aicore += v.aicore
            memory_mb += v.memory_mb
            aicpu += v.aicpu
            media += v.media
        return cls(aicore, memory_mb, aicpu, media)

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.aicore + other.aicore,
            self.memory_mb + other.memory_mb,
            self.aicpu + other.aicpu,
            self.media + other.media,
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.aicore - other.aicore,
            self.memory_mb - other.memory_mb,
            self.aicpu - other.aicpu,
            self.media - other.media,
        )

    def amounts(self) -> tuple[int, int, int, int]:
        """AICore, memory, AICPU and media, in that order, to pair with another's."""
        return (self.aicore, self.memory_mb, self.aicpu, self.media)

    def clamped(self) -> Resources:
        """Free capacity never reads negative, even when stale inventories or
        orphans make a chip look oversubscribed."""
        return Resources(
            max(self.aicore, 0), max(self.memory_mb, 0), max(self.aicpu, 0), max(self.media, 0)
        )


@dataclass(frozen=True)
class ChargedSize:
    """What one vNPU of a pod was charged at admission: the webhook's
    vnpu.io/aicore and vnpu.io/memory-mb requests over its count. The pod
    books only vNPUs of exactly this size, so its namespace's quota counts
    what it holds: a template may take other resources on another chip model
    (vir04: 4096 MB on a 910, 12288 MB on a 310P3), and a pod admitted
    without vnpu.io/chip-model is charged the size of the models offering it
    then. None in a field: not charged for that resource."""

    aicore: int | None = None
    memory_mb: int | None = None

    def matches(self, need: Resources) -> bool:
        return (self.aicore is None or self.aicore == need.aicore) and (
            self.memory_mb is None or self.memory_mb == need.memory_mb
        )

    def describe(self) -> str:
        """e.g. "4 AICore, 4096 MB"."""
        parts = [
            f"{value} {unit}"
            for value, unit in ((self.aicore, "AICore"), (self.memory_mb, "MB"))
            if value is not None
        ]
        return ", ".join(parts)


@dataclass(frozen=True)
class NodeInventory:
    """Everything placement knows about one node: Node labels and taints,
    liveness (agent Lease valid and Node present), the VNPUNode status and
    the chips an admin cordoned (index -> reason, from the VNPUNode spec)."""

    name: str
    status: VNPUNodeStatus
    live: bool = True
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, Any], ...] = ()
    cordoned: Mapping[int, str] = field(default_factory=dict)
    compiled_taints: tuple[Taint, ...] = field(default=(), init=False, repr=False, compare=False)
    # Chip index -> template -> what a vNPU of it takes there: placement asks
    # for every chip of a node on each fit, and the status lists the offer.
    offers: Mapping[int, Mapping[str, Resources]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    # No chip lists a vNPU: with no allocations either, the node's capacity
    # is its chips_print alone.
    bare: bool = field(default=True, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidInventoryError("node name must be a non-empty string")
        if not isinstance(self.labels, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.labels.items()
        ):
            raise InvalidInventoryError(f"node {self.name}: labels must be a map of strings")
        indexes = [chip.index for chip in self.status.chips]
        if len(set(indexes)) != len(indexes):
            raise InvalidInventoryError(f"node {self.name}: duplicate chip index")
        try:
            taints = compile_taints(list(self.taints), f"node {self.name} spec.taints")
        except SelectorError as err:
            raise InvalidInventoryError(str(err)) from err
        object.__setattr__(self, "compiled_taints", taints)
        # Every chip with its own list, so that a chip read alone tells what
        # it offers (an inventory built from a VNPUNode has them already).
        self.status.resolve_templates()
        offers = {
            chip.index: {t.name: Resources.of_template(t) for t in reversed(chip.templates or ())}
            for chip in self.status.chips
        }
        object.__setattr__(self, "offers", offers)
        object.__setattr__(self, "bare", not any(chip.vnpus for chip in self.status.chips))

    @functools.cached_property
    def chips_print(self) -> int:
        """What fitting reads of the chips that no allocation moves (model,
        health, id range, offer, cordon, totals), as a number: inventories
        alike in it share one (capacity.fingerprint). Worked out on the first
        fit, not on each build: a Lease or Node change rebuilds inventories
        that placement may never ask."""
        return _chips_print(self.status.chips, self.cordoned)

    def chip(self, index: int) -> ChipStatus | None:
        return next((c for c in self.status.chips if c.index == index), None)

    @classmethod
    def from_objects(
        cls, vnpu_node: Mapping[str, Any], node: Mapping[str, Any] | None, lease_valid: bool
    ) -> NodeInventory:
        """Builds from a raw VNPUNode and its raw Node (None when the Node is
        gone, which makes the inventory not live)."""
        return cls.from_report(NodeReport.parse(vnpu_node), node, lease_valid)

    @classmethod
    def from_report(
        cls, report: NodeReport, node: Mapping[str, Any] | None, lease_valid: bool
    ) -> NodeInventory:
        """As from_objects, from a VNPUNode parsed before."""
        try:
            node_meta = (node or {}).get("metadata") or {}
            node_spec = (node or {}).get("spec") or {}
            return cls(
                name=report.name,
                status=report.status,
                live=lease_valid and node is not None,
                labels=node_meta.get("labels") or {},
                taints=tuple(node_spec.get("taints") or ()),
                cordoned=dict(report.cordoned),
            )
        except (AttributeError, TypeError) as err:
            raise InvalidInventoryError(f"unreadable Node of {report.name}: {err}") from err


@dataclass(frozen=True)
class NodeReport:
    """What placement reads of a VNPUNode, parsed once: the operator keeps
    this, not the raw object, and builds inventories from it whenever the
    Node or the Lease changes."""

    name: str
    status: VNPUNodeStatus
    # Chip index -> the admin's reason, from spec.cordonedChips.
    cordoned: Mapping[int, str]

    @classmethod
    def parse(cls, vnpu_node: Mapping[str, Any]) -> NodeReport:
        try:
            meta = vnpu_node.get("metadata") or {}
            status = VNPUNodeStatus.model_validate(vnpu_node.get("status") or {})
            spec = VNPUNodeSpec.model_validate(vnpu_node.get("spec") or {})
            name = meta.get("name", "")
        except (ValidationError, AttributeError, TypeError) as err:
            raise InvalidInventoryError(f"unreadable VNPUNode: {err}") from err
        _share_templates(status)
        return cls(
            name=name if isinstance(name, str) else "",
            status=status,
            cordoned={c.chip: c.reason for c in spec.cordoned_chips},
        )


# Template lists by content. Every chip of a model offers the same list, and
# at 1000 nodes x 8 chips the lists were 36 MB of the operator's 49 MB of
# parsed inventories; shared, they are a few KB. Nothing mutates them.
_TemplatesKey = tuple[tuple[str, int, int, int, int], ...]
_TEMPLATE_LISTS: dict[_TemplatesKey, list[TemplateResources]] = {}
# Distinct lists a cluster offers are a handful; past this many, a hand-made
# VNPUNode is inventing them and they are not kept.
_TEMPLATE_LISTS_MAX = 256


def _templates_key(templates: Iterable[TemplateResources]) -> _TemplatesKey:
    """A chip's template list by content: equal for lists that offer alike."""
    return tuple((t.name, t.aicore, t.memory_mb, t.aicpu, t.media) for t in templates)


def _share_templates(status: VNPUNodeStatus) -> None:
    for chip in status.chips:
        offered = status.chip_templates(chip)
        key = _templates_key(offered)
        shared = _TEMPLATE_LISTS.get(key)
        if shared is None:
            if len(_TEMPLATE_LISTS) >= _TEMPLATE_LISTS_MAX:
                continue
            shared = _TEMPLATE_LISTS[key] = offered
        chip.templates = shared


# Chips content -> its number (NodeInventory.chips_print). A cluster has a
# handful of node kinds; past this many, hand-made VNPUNodes are inventing
# them, and each new one gets a number of its own, equal to no other.
_CHIPS_PRINTS: dict[tuple[object, ...], int] = {}
_CHIPS_PRINTS_MAX = 4096
_unshared_prints = itertools.count(-1, -1)


def _chips_print(chips: Iterable[ChipStatus], cordoned: Mapping[int, str]) -> int:
    key = tuple(
        (
            c.index,
            c.model,
            c.health,
            c.vnpu_id_min,
            c.vnpu_id_max,
            c.index in cordoned,
            c.aicore_total,
            c.memory_total_mb,
            c.aicpu_total,
            c.media_total,
            _templates_key(c.templates or ()),
        )
        for c in sorted(chips, key=lambda c: c.index)
    )
    number = _CHIPS_PRINTS.get(key)
    if number is None:
        if len(_CHIPS_PRINTS) >= _CHIPS_PRINTS_MAX:
            return next(_unshared_prints)
        number = _CHIPS_PRINTS[key] = len(_CHIPS_PRINTS) + 1
    return number


_NAME_CHARS = re.compile(r"[^a-z0-9.-]")
# DNS subdomain (253) minus "-<10 hex>-<index>".
_POD_PART_MAX = 253 - 1 - 10 - 1 - 1


def allocation_name(pod_name: str, pod_uid: str, index: int) -> str:
    """Deterministic object name of a pod's index-th allocation.

    It embeds a digest of the pod UID, so a new pod reusing a name never
    collides with the allocations of its predecessor still being released,
    and a retried create after an operator crash hits AlreadyExists instead
    of booking twice.
    """
    digest = hashlib.sha256(pod_uid.encode()).hexdigest()[:10]
    stem = _NAME_CHARS.sub("-", pod_name.lower())[:_POD_PART_MAX].strip("-.") or "pod"
    return f"{stem}-{digest}-{index}"


@dataclass(frozen=True)
class Allocation:
    """One declared vNPU: the ledger's unit of bookkeeping."""

    key: str  # namespace/name of the VNPUAllocation object
    node: str
    chip: int
    template: str
    vnpu_id: int
    pod_uid: str
    pod_name: str

    @property
    def namespace(self) -> str:
        return self.key.partition("/")[0]

    @property
    def name(self) -> str:
        return self.key.partition("/")[2]

    def to_spec(self) -> VNPUAllocationSpec:
        return VNPUAllocationSpec(
            pod_name=self.pod_name,
            pod_uid=self.pod_uid,
            node_name=self.node,
            chip=self.chip,
            template=self.template,
            vnpu_id=self.vnpu_id,
        )

    @classmethod
    def from_api(cls, obj: Mapping[str, Any] | VNPUAllocation) -> Allocation:
        """Reads a VNPUAllocation object; a terminating one still holds its
        capacity, since its vNPU exists until the agent destroys it."""
        try:
            alloc = obj if isinstance(obj, VNPUAllocation) else VNPUAllocation.model_validate(obj)
        except ValidationError as err:
            raise InvalidAllocationError(f"unreadable VNPUAllocation: {err}") from err
        meta, spec = alloc.metadata, alloc.spec
        if not meta.name or not meta.namespace:
            raise InvalidAllocationError("VNPUAllocation without namespace/name")
        return cls(
            key=f"{meta.namespace}/{meta.name}",
            node=spec.node_name,
            chip=spec.chip,
            template=spec.template,
            vnpu_id=spec.vnpu_id,
            pod_uid=spec.pod_uid,
            pod_name=spec.pod_name,
        )


@dataclass(frozen=True)
class Placement:
    """All vNPUs of one pod, on one node, booked in the ledger."""

    node: str
    allocations: tuple[Allocation, ...]

    @property
    def vnpu_ids(self) -> tuple[int, ...]:
        return tuple(a.vnpu_id for a in self.allocations)

    @property
    def visible_devices(self) -> str:
        """Value of the pod's visible-devices annotation, e.g. "100,101"."""
        return ",".join(str(i) for i in self.vnpu_ids)

    @property
    def device_paths(self) -> tuple[str, ...]:
        return tuple(names.device_path(i) for i in self.vnpu_ids)

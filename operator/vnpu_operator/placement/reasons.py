"""Why a pod did not fit: reason codes, their tally and the user message."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property


class Reason(StrEnum):
    """Stable codes, used as metric label values; never rename one.

    Definition order matters: node-level reasons first, then chip-level ones
    in the order a chip is checked. When every chip of a node fails, the node
    is reported with the reason of the chip that got furthest, which is the
    obstacle closest to being the one the user can act on.
    """

    NO_NODES = "no-nodes"
    NODE_NOT_LIVE = "node-not-live"
    # The node hands out vNPUs through DRA only (its agent runs with --dra).
    DRA_NODE = "dra-node"
    FAILED_BEFORE = "failed-before"
    NODE_SELECTOR = "node-selector"
    NODE_AFFINITY = "node-affinity"
    TAINT = "taint"
    NO_CHIPS = "no-chips"
    # Capacity held for a preempting pod of equal or higher priority whose
    # victims are still releasing it (placement.preemption).
    NOMINATED = "nominated"
    CHIP_MODEL = "chip-model"
    # The chip offers the template at another size than the pod was charged
    # at admission (model.ChargedSize): booking it would escape its quota.
    CHARGED_SIZE = "charged-size"
    UNHEALTHY = "unhealthy"
    TEMPLATE_NOT_OFFERED = "template-not-offered"
    INSUFFICIENT_AICORE = "insufficient-aicore"
    INSUFFICIENT_MEMORY = "insufficient-memory"
    INSUFFICIENT_AICPU = "insufficient-aicpu"
    INSUFFICIENT_MEDIA = "insufficient-media"
    NO_FREE_VNPU_ID = "no-free-vnpu-id"
    # Checked last: a cordoned chip is named only where it is the one obstacle,
    # i.e. where uncordoning it would let the pod in.
    CORDONED = "cordoned"

    @property
    def rank(self) -> int:
        return _ORDER[self]

    @property
    def label(self) -> str:
        return _LABELS[self]


_ORDER = {reason: i for i, reason in enumerate(Reason)}
_LABELS = {
    Reason.NO_NODES: "no vNPU nodes known",
    Reason.NODE_NOT_LIVE: "node agent not live",
    Reason.DRA_NODE: "node serves ResourceClaims only (DRA)",
    Reason.FAILED_BEFORE: "vNPU creation failed there before",
    Reason.NODE_SELECTOR: "node selector mismatch",
    Reason.NODE_AFFINITY: "node affinity mismatch",
    Reason.TAINT: "taint not tolerated",
    Reason.NO_CHIPS: "no NPU chips",
    Reason.NOMINATED: "capacity held for a preempting pod",
    Reason.CHIP_MODEL: "chip model mismatch",
    Reason.CHARGED_SIZE: "template size differs from the pod's quota charge",
    Reason.UNHEALTHY: "chip unhealthy",
    Reason.TEMPLATE_NOT_OFFERED: "template not offered",
    Reason.INSUFFICIENT_AICORE: "insufficient AICore",
    Reason.INSUFFICIENT_MEMORY: "insufficient memory",
    Reason.INSUFFICIENT_AICPU: "insufficient AICPU",
    Reason.INSUFFICIENT_MEDIA: "insufficient media",
    Reason.NO_FREE_VNPU_ID: "no free vNPU id",
    Reason.CORDONED: "chip cordoned",
}


@dataclass(frozen=True)
class NoFit:
    """No node can host the whole request; one reason per candidate node."""

    template: str
    count: int
    node_reasons: Mapping[str, Reason] = field(default_factory=dict)
    # What one vNPU of the pod was charged (ChargedSize.describe()), for the
    # message of a pod that nodes were closed to by its charge.
    charged: str = ""

    @property
    def total_nodes(self) -> int:
        return len(self.node_reasons)

    # Worked out once per answer: a pod that does not fit reads the tally
    # four times (its reason, metric, event key, message), and alike waiting
    # pods share one answer (NoFitMemo). Counted afresh on each read, it was
    # a fifth of the operator's CPU while a release at 1000 nodes retried
    # the waiting pods. `node_reasons` is never changed after construction.
    @cached_property
    def reasons(self) -> dict[Reason, int]:
        """Tally, most frequent first, ties in reason order."""
        tally = Counter(self.node_reasons.values())
        return dict(sorted(tally.items(), key=lambda kv: (-kv[1], kv[0].rank)))

    @property
    def primary_reason(self) -> Reason:
        return next(iter(self.reasons), Reason.NO_NODES)

    @cached_property
    def message(self) -> str:
        head = f"0/{self.total_nodes} nodes can host {self.count} x {self.template}"
        if not self.node_reasons:
            return f"{head}: {Reason.NO_NODES.label}"
        parts = ", ".join(f"{n} {reason.label}" for reason, n in self.reasons.items())
        if self.charged and Reason.CHARGED_SIZE in self.reasons:
            parts += (
                f" (it was charged {self.charged} a vNPU at admission and books only vNPUs "
                "of that size; to run on another chip model, delete it and create it anew "
                "naming that model in vnpu.io/chip-model, so that it is charged that size)"
            )
        return f"{head}: {parts}"

    def __str__(self) -> str:
        return self.message

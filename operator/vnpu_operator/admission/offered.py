"""Which templates the cluster offers, per chip model, as the webhook checks them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from vnpu_common.wire.models import VNPUNodeStatus


@dataclass(frozen=True)
class OfferedTemplates:
    """Chip model -> template names some chip of that model offers.

    Chips of every health count: a template of a chip that is down for now is
    still a real template, and placement (not admission) decides where a pod fits.
    """

    by_model: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # (model, template) -> (AICore, memory MB) of one vNPU: what a pod is charged.
    sizes: Mapping[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    # Templates some DRA node offers (its VNPUNode says status.dra): where a
    # vnpu.io/<template> request is served by a claim (admission.limits).
    dra: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        # Frozen for real: the operator swaps in a new value on inventory change
        # while the webhook may still read the old one.
        frozen = {model: frozenset(templates) for model, templates in self.by_model.items()}
        object.__setattr__(self, "by_model", MappingProxyType(frozen))
        object.__setattr__(self, "sizes", MappingProxyType(dict(self.sizes)))

    @classmethod
    def from_node_statuses(cls, statuses: Iterable[VNPUNodeStatus]) -> OfferedTemplates:
        offered: dict[str, set[str]] = {}
        sizes: dict[tuple[str, str], tuple[int, int]] = {}
        dra: set[str] = set()
        for status in statuses:
            for chip in status.chips:
                templates = status.chip_templates(chip)
                offered.setdefault(chip.model, set()).update(t.name for t in templates)
                if status.dra:
                    dra.update(t.name for t in templates)
                for t in templates:
                    sizes.setdefault((chip.model, t.name), (t.aicore, t.memory_mb))
        by_model = {model: frozenset(names) for model, names in offered.items() if names}
        return cls(by_model, sizes, frozenset(dra))

    @classmethod
    def of_sizes(cls, sizes: Mapping[str, Mapping[str, tuple[int, int]]]) -> OfferedTemplates:
        """From model -> template -> (AICore, memory MB)."""
        by_model = {model: frozenset(templates) for model, templates in sizes.items()}
        flat = {(m, t): size for m, templates in sizes.items() for t, size in templates.items()}
        return cls(by_model, flat)

    @property
    def empty(self) -> bool:
        return not self.by_model

    def on_dra(self, template: str) -> bool:
        return template in self.dra

    def models(self) -> list[str]:
        return sorted(self.by_model)

    def offers(self, template: str, model: str | None = None) -> bool:
        if model is None:
            return any(template in templates for templates in self.by_model.values())
        return template in self.by_model.get(model, frozenset())

    def models_offering(self, template: str) -> list[str]:
        return sorted(model for model, templates in self.by_model.items() if template in templates)

    def describe(self, model: str | None = None) -> str:
        """e.g. "310P3: vir01, vir02; 910B3: vir05_1c_16g, vir10_3c_32g"."""
        models = self.models() if model is None else [model]
        return "; ".join(
            f"{m}: {', '.join(sorted(self.by_model.get(m, frozenset())))}" for m in models
        )

    def size(self, template: str, model: str | None = None) -> tuple[int, int] | None:
        """(AICore, memory MB) of one vNPU of `template`; None when no offering
        model knows it or the offering models size it differently (the pod
        must then name its chip model: a charge must equal what it takes)."""
        models = [model] if model is not None else self.models_offering(template)
        found = {self.sizes[(m, template)] for m in models if (m, template) in self.sizes}
        return next(iter(found)) if len(found) == 1 else None

    def sizes_by_model(self, template: str) -> dict[str, tuple[int, int]]:
        return {m: self.sizes[(m, template)] for m in self.models_offering(template)
                if (m, template) in self.sizes}  # fmt: skip

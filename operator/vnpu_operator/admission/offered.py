"""Which templates the cluster offers, per chip model, as the webhook checks them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from vnpu_common.api.models import VNPUNodeStatus


@dataclass(frozen=True)
class OfferedTemplates:
    """Chip model -> template names some chip of that model offers.

    Chips of every health count: a template of a chip that is down for now is
    still a real template, and placement (not admission) decides where a pod fits.
    """

    by_model: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Frozen for real: the operator swaps in a new value on inventory change
        # while the webhook may still read the old one.
        frozen = {model: frozenset(templates) for model, templates in self.by_model.items()}
        object.__setattr__(self, "by_model", MappingProxyType(frozen))

    @classmethod
    def from_node_statuses(cls, statuses: Iterable[VNPUNodeStatus]) -> OfferedTemplates:
        offered: dict[str, set[str]] = {}
        for status in statuses:
            for chip in status.chips:
                offered.setdefault(chip.model, set()).update(t.name for t in chip.templates)
        return cls({model: frozenset(names) for model, names in offered.items() if names})

    @property
    def empty(self) -> bool:
        return not self.by_model

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

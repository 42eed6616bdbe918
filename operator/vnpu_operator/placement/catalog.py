"""The (chip model, template) pairs the nodes offer, kept as nodes come and go.

Placement and the webhook read the catalog: which templates exist, what a
vNPU of each takes, each model's largest template. It used to be rebuilt
from every node whenever a node was added, so an operator starting against
N nodes did N rebuilds of N nodes: 29 s of CPU for 2000 nodes, 7.8 s for
1000 (2 cores Intel Xeon 2.1 GHz). Here a node adds or drops only its own pairs, and
the catalog is "changed" only when a pair appears, goes, or takes other
resources, which is what makes placement drop every answer it kept.

Nodes normally agree on what a template takes. Where they do not (a
hand-made VNPUNode), the catalog shows the one of the first node by name,
its first chip offering it: the same answer in whatever order the nodes
arrived, so a restarted operator and `kubectl vnpu` see the same catalog.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from vnpu_common.wire.models import TemplateResources
from vnpu_operator.placement.fragmentation import largest_templates

Key = tuple[str, str]  # (chip model, template name)
Offer = Iterable[tuple[str, Iterable[TemplateResources]]]  # (chip model, its templates) per chip


class CatalogIndex:
    def __init__(self) -> None:
        self._templates: dict[Key, TemplateResources] = {}
        self._largest: dict[str, str] = {}
        # key -> node -> what that node says a vNPU of it takes.
        self._offered_by: dict[Key, dict[str, TemplateResources]] = {}
        # key -> the node whose figures the catalog shows (the first by name).
        self._shown_from: dict[Key, str] = {}
        # node -> its pairs, as last set.
        self._by_node: dict[str, dict[Key, TemplateResources]] = {}

    @property
    def templates(self) -> Mapping[Key, TemplateResources]:
        return self._templates

    @property
    def largest(self) -> Mapping[str, str]:
        """Chip model -> its largest offered template."""
        return self._largest

    def set_node(self, node: str, offer: Offer) -> bool:
        """Records what `node` offers now; True if the catalog changed."""
        pairs: dict[Key, TemplateResources] = {}
        for model, templates in offer:
            for template in templates:
                pairs.setdefault((model, template.name), template)
        return self._replace(node, pairs)

    def remove_node(self, node: str) -> bool:
        """Forgets `node`'s pairs; True if the catalog changed."""
        return self._replace(node, {})

    def _replace(self, node: str, pairs: dict[Key, TemplateResources]) -> bool:
        old = self._by_node.pop(node, {})
        if pairs:
            self._by_node[node] = pairs
        if pairs == old:
            return False
        changed = False
        for key in old.keys() | pairs.keys():
            changed |= self._update(key, node, pairs.get(key))
        if changed:
            self._largest = largest_templates(self._templates)
        return changed

    def _update(self, key: Key, node: str, template: TemplateResources | None) -> bool:
        """`node` now offers `template` under `key` (None: not at all); True
        if what the catalog shows for `key` changed."""
        offered = self._offered_by.setdefault(key, {})
        if template is None:
            offered.pop(node, None)
        else:
            offered[node] = template
        if not offered:
            del self._offered_by[key]
            self._shown_from.pop(key, None)
            return self._templates.pop(key, None) is not None
        shown_from = self._shown_from.get(key)
        # Only a node that is, or goes before, the one shown can move it;
        # nodes arriving in name order never scan.
        if shown_from is None or node <= shown_from:
            shown_from = self._shown_from[key] = min(offered)
        shown = offered[shown_from]
        if self._templates.get(key) == shown:
            return False
        self._templates[key] = shown
        return True

"""What the plugin reads from the cluster, once per command (one LIST per
kind, whatever the number of nodes), and the placement ledger the operator
would build from the same objects.

The ledger, the liveness rule and the template catalog are the operator's
own code (`vnpu_operator.placement`, `vnpu_operator.leases`), imported as a
library, so what the plugin says about capacity and fit is what the placer
decides, not a second reading of the rules.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from vnpu_common.wire import names
from vnpu_common.wire.models import ChipStatus, TemplateResources
from vnpu_common.wire.types import Raw
from vnpu_operator.config import OperatorSettings
from vnpu_operator.leases import LeaseLiveness
from vnpu_operator.placement import (
    Allocation,
    InvalidAllocationError,
    InvalidInventoryError,
    Ledger,
    NodeInventory,
    Resources,
)
from vnpu_operator.placement.capacity import Catalog, template_resources

log = logging.getLogger(__name__)

# The operator's default slack past a Lease's expiry; the plugin has no
# access to the operator's flags, and the default is what the chart runs.
LEASE_GRACE_SECONDS: float = OperatorSettings.model_fields["lease_grace_seconds"].default


@dataclass
class Snapshot:
    """Raw objects as listed. `pods` and `quotas` hold only what the command
    listed (vNPU pods and ResourceQuotas for `usage`, nothing for `status`);
    `claims` only for `why` on a pod that asks by resources.limits and has no
    vnpu.io/template annotation (the DRA path), the ResourceClaims of its
    namespace."""

    vnpunodes: list[Raw] = field(default_factory=list)
    nodes: list[Raw] = field(default_factory=list)
    leases: list[Raw] = field(default_factory=list)
    allocations: list[Raw] = field(default_factory=list)
    pods: list[Raw] = field(default_factory=list)
    quotas: list[Raw] = field(default_factory=list)  # ResourceQuotas, for `usage`
    claims: list[Raw] = field(default_factory=list)  # ResourceClaims, for `why`
    # Why `claims` could not be listed (no RBAC, no resource.k8s.io/v1): `why`
    # says so and shows what the VNPUAllocations alone tell of the claim.
    claims_problem: str | None = None
    agent_namespace: str = "vnpu-system"
    # Wall-clock time of the reads, for Lease expiry.
    now: float = field(default_factory=time.time)
    # Parsed once: status and why both read them, and at tens of thousands
    # of allocations parsing is most of a command's time.
    _parsed: list[tuple[Allocation, Raw]] | None = field(default=None, init=False, repr=False)

    def live_nodes(self) -> dict[str, bool]:
        """Node -> whether its agent's Lease is valid, by the operator's rule."""
        liveness = LeaseLiveness(
            self.agent_namespace, LEASE_GRACE_SECONDS, lambda _: None, wall=lambda: self.now
        )
        try:
            for lease in self.leases:
                liveness.lease_event("ADDED", lease)
            return {name: liveness.live(name) for name in self.vnpunode_names()}
        finally:
            liveness.close()  # timers it armed when called inside an event loop

    def vnpunode_names(self) -> list[str]:
        return sorted(_name(v) for v in self.vnpunodes)

    def inventories(self) -> list[NodeInventory]:
        """One inventory per readable VNPUNode; an unreadable one is left out
        with a warning, as the operator leaves it out of placement."""
        nodes = {_name(n): n for n in self.nodes}
        live = self.live_nodes()
        out = []
        for vnpu_node in sorted(self.vnpunodes, key=_name):
            name = _name(vnpu_node)
            try:
                out.append(NodeInventory.from_objects(vnpu_node, nodes.get(name), live[name]))
            except InvalidInventoryError as exc:
                log.warning("VNPUNode %s is unreadable, left out: %s", name, exc)
        return out

    def parsed_allocations(self) -> list[tuple[Allocation, Raw]]:
        """Readable allocations in key order, with their raw objects; read
        once, so `allocations` must not change after the first call."""
        if self._parsed is None:
            self._parsed = self._parse_allocations()
        return self._parsed

    def _parse_allocations(self) -> list[tuple[Allocation, Raw]]:
        out = []
        for raw in self.allocations:
            try:
                out.append((Allocation.from_api(raw), raw))
            except InvalidAllocationError as exc:
                log.warning("an allocation is unreadable, left out: %s", exc)
        return sorted(out, key=lambda pair: pair[0].key)

    def ledger(self) -> Ledger:
        return Ledger.rebuild(self.inventories(), (a for a, _ in self.parsed_allocations()))


def catalog(inventories: Iterable[NodeInventory]) -> Catalog:
    """(chip model, template) -> resources, built as the ledger builds its
    own: nodes in name order, the first offer of a pair wins."""
    out: dict[tuple[str, str], TemplateResources] = {}
    for inventory in sorted(inventories, key=lambda i: i.name):
        for chip in inventory.status.chips:
            for template in inventory.status.chip_templates(chip):
                out.setdefault((chip.model, template.name), template)
    return out


def allocation_resources(
    allocation: Allocation, inventories: Mapping[str, NodeInventory], known: Catalog
) -> Resources | None:
    """What one allocation's vNPU takes: its chip's offer, else the offer of
    any chip of that model, else of any model; None when nobody offers it."""
    inventory = inventories.get(allocation.node)
    chip: ChipStatus | None = None if inventory is None else inventory.chip(allocation.chip)
    if chip is not None:
        need = template_resources(chip, allocation.template, known)
        if need is not None:
            return need
    offers = sorted((model, t) for (model, name), t in known.items() if name == allocation.template)
    return Resources.of_template(offers[0][1]) if offers else None


def allocation_phase(raw: Raw) -> str:
    """The allocation's phase, Releasing once it is being deleted (the agent
    may not have written that yet), Pending before the agent reports."""
    if (raw.get("metadata") or {}).get("deletionTimestamp"):
        return names.PHASE_RELEASING
    return str((raw.get("status") or {}).get("phase") or names.PHASE_PENDING)


def _name(obj: Raw) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))

"""Each node's inventory as the ledger books against it, made from three
objects that change apart: the VNPUNode (the agent's report of chips and
vNPUs), the Node (labels and taints placement reads) and the agent's Lease
(whether anyone serves the node now).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from vnpu_common.wire.types import Raw
from vnpu_operator.config import OperatorSettings
from vnpu_operator.leases import LeaseLiveness
from vnpu_operator.placement import InvalidInventoryError, Ledger, NodeInventory
from vnpu_operator.placement.model import NodeReport
from vnpu_operator.slim import resource_version, slim_node

log = logging.getLogger(__name__)


class Inventories:
    def __init__(
        self,
        ledger: Ledger,
        settings: OperatorSettings,
        *,
        grown: Callable[[], None] = lambda: None,
        lost: Callable[[str, str], None] = lambda _node, _why: None,
        refreshed: Callable[[str], None] = lambda _name: None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """`grown()` when a node's inventory changed (capacity may have
        grown); `lost(node, why)` when a live node stops being live;
        `refreshed(node)` after any change to a node's VNPUNode or Node."""
        self.ledger = ledger
        self.grown = grown
        self.lost = lost
        self.refreshed = refreshed
        self.leases = LeaseLiveness(
            settings.agent_namespace, settings.lease_grace_seconds, self.refresh, wall=wall
        )
        # VNPUNodes by name, metadata only (the cache convergence compares
        # with a listing), and what placement reads of each, parsed once.
        self.vnpunodes: dict[str, Raw] = {}
        self.reports: dict[str, NodeReport] = {}
        self.nodes: dict[str, Raw] = {}

    def labels(self, node: str) -> Mapping[str, str]:
        labels: Mapping[str, str] = (self.nodes.get(node, {}).get("metadata") or {}).get(
            "labels"
        ) or {}
        return labels

    def live(self) -> dict[str, bool]:
        inventories = (self.ledger.node(n) for n in self.ledger.node_names())
        return {inv.name: inv.live for inv in inventories if inv is not None}

    def vnpunode_event(self, event_type: str | None, obj: Raw) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        if event_type == "DELETED":
            self.vnpunodes.pop(name, None)
            self.reports.pop(name, None)
        else:
            try:
                self.reports[name] = NodeReport.parse(obj)
            except InvalidInventoryError as exc:
                log.warning("inventory of %s is unreadable, keeping the last one: %s", name, exc)
                return
            # The raw status (most of the object) is not kept: the report has it.
            self.vnpunodes[name] = {"metadata": meta}
        self.refresh(name)

    def node_event(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if event_type == "DELETED":
            self.nodes.pop(name, None)
        else:
            slim = slim_node(obj)
            if self.nodes.get(name) == slim:
                return  # a status heartbeat: nothing placement reads
            self.nodes[name] = slim
        self.refresh(name)

    def refresh(self, name: str) -> None:
        self._refresh(name)
        self.refreshed(name)

    def _refresh(self, name: str) -> None:
        report = self.reports.get(name)
        old = self.ledger.node(name)
        if report is None:
            self.ledger.remove_node(name)
            return
        try:
            inventory = NodeInventory.from_report(
                report, self.nodes.get(name), self.leases.live(name)
            )
        except InvalidInventoryError as exc:
            log.warning("inventory of %s is unreadable, keeping the last one: %s", name, exc)
            return
        self.ledger.upsert_node(inventory, version=resource_version(self.vnpunodes[name]))
        if old is not None and old.live and not inventory.live:
            why = "Node object is gone" if name not in self.nodes else "agent Lease expired"
            self.lost(name, why)
        if old is None or old != inventory:
            self.grown()

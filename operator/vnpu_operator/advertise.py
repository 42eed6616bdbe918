"""Each node's vNPU totals as Node extended resources.

The webhook charges a pod its vNPUs in container requests (admission.charges),
so the scheduler and the kubelet admit that pod only onto a node that
advertises those resources. The operator advertises a node's totals in its
status (capacity and allocatable), from the chips its VNPUNode reports: what
the ledger books against, so that a pod the ledger placed always fits the
scheduler's sum too. Writes happen only when a node's totals change (chips
added or gone) or someone else changed them (a kubelet re-registering after a
reboot zeroes extended resources): never on a pod's path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from vnpu_common.kube.backoff import Backoff
from vnpu_common.kube.rawcall import describe
from vnpu_common.kube.workqueue import WorkQueue
from vnpu_common.wire import names
from vnpu_common.wire.fits import id_range_size, instances
from vnpu_common.wire.quantity import quantity_value
from vnpu_operator.kubeapi import OperatorApi
from vnpu_operator.placement import Ledger, NodeInventory
from vnpu_operator.slim import extended_resources

log = logging.getLogger(__name__)


def node_totals(inventory: NodeInventory | None) -> dict[str, int]:
    """What a node offers in our extended resources; {} without a VNPUNode.

    vnpus is the number of vNPU ids the chips accept, the ledger's own limit
    on the number of vNPUs a chip holds. On an annotation node, also
    vnpu.io/<template> for every template a chip offers: how many vNPUs of it
    the empty chips hold, never less than the ledger can place there, so the
    scheduler admits every pod the ledger pinned (docs/USAGE.md, "One request").
    A DRA node lists none of them (see below)."""
    if inventory is None:
        return {}
    status = inventory.status
    chips = status.chips
    totals = {
        names.RES_AICORE: sum(c.aicore_total for c in chips),
        names.RES_MEMORY_MB: sum(c.memory_total_mb for c in chips),
        names.RES_VNPUS: sum(id_range_size(c) for c in chips),
    }
    if status.dra:
        # The scheduler serves vnpu.io/<template> from this node's ResourceSlices
        # only while the node does not list the name (KEP-5004): one name is never
        # offered both ways.
        return totals
    for chip in chips:
        for template in status.chip_templates(chip):
            key = names.template_resource(template.name)
            totals[key] = totals.get(key, 0) + instances(chip, template)
    return totals


def status_patch(want: Mapping[str, int], node: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that makes the Node show `want` (null removes a key),
    or None when it already does."""
    patch: dict[str, dict[str, str | None]] = {}
    for section, have in extended_resources(node.get("status") or {}).items():
        diff: dict[str, str | None] = {}
        for key in sorted(set(have) | set(want)):
            wanted = want.get(key)
            if quantity_value(have.get(key)) != wanted:
                diff[key] = None if wanted is None else str(wanted)
        if diff:
            patch[section] = diff
    return {"status": patch} if patch else None


class Advertiser:
    """Keeps every Node's extended resources equal to its chips' totals."""

    def __init__(
        self,
        api: OperatorApi,
        ledger: Ledger,
        nodes: Mapping[str, Mapping[str, Any]],
        *,
        ready: Callable[[], bool] = lambda: False,
        retry_max_seconds: float,
    ) -> None:
        """`nodes`: the operator's slim Node copies (slim_node keeps our
        resources); `ready()`: the caches hold full listings, so a node
        without a VNPUNode really has none (and loses our resources)."""
        self.api = api
        self.ledger = ledger
        self.nodes = nodes
        self.ready = ready
        self.queue = WorkQueue(
            self._sync,
            name="node-resources",
            backoff=Backoff(base=0.5, cap=retry_max_seconds),
            describe=describe,
            expected=(ApiException,),
        )

    def changed(self, name: str) -> None:
        if self.ready():
            self.queue.add(name)

    def all(self) -> None:
        for name in sorted(self.nodes):
            self.queue.add(name)

    async def _sync(self, name: str) -> None:
        if not self.ready():
            return  # not synced, or a standby: the leader advertises
        node = self.nodes.get(name)
        if node is None:
            return
        patch = status_patch(node_totals(self.ledger.node(name)), node)
        if patch is None:
            return
        log.info("node %s: advertising %s", name, patch["status"].get("capacity", patch))
        await self.api.patch_node_status(name, patch)
